"""rigup on a real NVIDIA machine with no network: facts, the role's build, the role's server
flags, and measurements against llama-server started by hand.

Runs from the repository root with python3 (PyYAML, Jinja2 and NumPy; no pyinfra needed) and
ONLY READS GPU settings: it never changes power limits, clocks, persistence or ECC, never resets
a GPU; it prints the settings before and after to prove it.

    python3 tests/gpu/check.py build  --archive .gpu/llama.cpp.tar.gz --work /root/rigup-gpu
    python3 tests/gpu/check.py model  --work /root/rigup-gpu
    python3 tests/gpu/check.py serve  --work /root/rigup-gpu --out DIR
    python3 tests/gpu/check.py bench  --work /root/rigup-gpu --out DIR   # rigup/throughput.py vs check.py

`build` runs llama_cpp's own build script (the same render as the role) for the archs of the
plan; `model` writes a random-weight llama-shaped GGUF of a realistic size (tokens/s depend on
shape, not on weight values); `serve` runs llama-bench, then llama-server three ways: with the
flags that roles/llama_server renders into its unit's ExecStart, with llama.cpp's defaults, and
with the seeds' hand flags, each under 1, 4 and 8 concurrent chat requests of 400 tokens.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
try:
    import pyinfra.api  # noqa: F401  (a controller has it; a bare GPU machine need not)
except ImportError:  # the facts module defines pyinfra facts next to its parsers: stand it in
    _api = types.ModuleType("pyinfra.api")
    _api.FactBase = type("FactBase", (), {})
    _api.exceptions = types.ModuleType("pyinfra.api.exceptions")
    _api.exceptions.PyinfraError = type("PyinfraError", (Exception,), {})
    sys.modules.update({"pyinfra": types.ModuleType("pyinfra"), "pyinfra.api": _api,
                        "pyinfra.api.exceptions": _api.exceptions})

from rigup.config import role_defaults  # noqa: E402
from rigup.gpu.facts import hardware_command, parse_hardware  # noqa: E402
from rigup.gpu.plan import format_plan, hardware_plan  # noqa: E402


def load(path: str):
    """A pure module of a role by its path: the role package's __init__ is its pyinfra deploy."""
    spec = importlib.util.spec_from_file_location("rigup_" + Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = load("roles/llama_cpp/script.py")
build_id, cmake_options, render_build_script = script.build_id, script.cmake_options, script.render_build_script
dropin_text = load("roles/llama_server/command.py").dropin_text

SETTINGS = ("power.limit,power.default_limit,persistence_mode,ecc.mode.current,compute_mode,"
            "clocks.applications.graphics,clocks.applications.memory")
RECIPE = {"model": "bench", "port": 8181, "host": "127.0.0.1", "ctx": 65536, "parallel": 8,
          "ngl": 99, "flash_attn": "on", "split_mode": "layer", "tensor_split": None, "jinja": True,
          "metrics": True, "api_key": False, "extra_args": []}
# Llama 3 8B's shape, with a 32k SPM vocabulary from the llama.cpp tree: 7.5 B parameters, F16.
SHAPE = {"n_embd": 4096, "n_layer": 32, "n_head": 32, "n_head_kv": 8, "n_ff": 14336, "ctx": 8192}


def sh(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout


def gpu_settings() -> str:
    return sh(f"nvidia-smi --query-gpu={SETTINGS} --format=csv,noheader").strip()


def facts_and_plan() -> tuple[dict, dict]:
    facts = parse_hardware(sh(hardware_command(["/root"])).splitlines())
    plan = hardware_plan(facts["gpus"], facts["driver"], facts["cuda_toolkits"])
    return facts, plan


def build_data(archive: Path, work: Path) -> dict:
    data = {**role_defaults("llama_cpp"), **role_defaults("cuda_toolkit")}
    data.update(llama_cpp_dir=str(work / "llama.cpp"), llama_cpp_backend="cuda", cuda_source="present",
                llama_cpp_prebuilt_ui=False, llama_cpp_ccache=False, llama_cpp_archive=str(archive),
                llama_cpp_ref="vendored", gpu_enabled=True,
                llama_cpp_targets=["llama-server", "llama-bench", "llama-gguf-split", "ggml-rpc-server"])
    return data


def cmd_build(args) -> None:
    facts, plan = facts_and_plan()
    print(format_plan(plan))
    data = build_data(args.archive.resolve(), args.work)
    options = cmake_options(plan, data)
    ident = build_id(data, options)
    script = render_build_script(data, options, str(args.archive.resolve()))
    path = args.work / f"build-{ident}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    print("cmake " + " ".join(f"-D{o}" for o in options), flush=True)
    start = time.monotonic()
    result = subprocess.run(["bash", str(path)])
    seconds = time.monotonic() - start
    log = Path(data["llama_cpp_dir"]) / "builds" / f"{ident}.log"
    if result.returncode:
        print(log.read_text()[-4000:])
        sys.exit(f"build failed after {seconds:.0f} s")
    (args.work / "build.json").write_text(json.dumps(
        {"id": ident, "seconds": round(seconds, 1), "archs": plan["cuda_archs"], "options": options}))
    print(f"built {ident} for archs {plan['cuda_archs']} in {seconds:.0f} s")


def cmd_model(args) -> None:
    """A random-weight llama GGUF in F16, written with gguf-py from the llama.cpp tree."""
    import numpy as np

    src = args.work / "llama.cpp" / "src"
    sys.path.insert(0, str(src / "gguf-py"))
    import gguf

    target = args.work / "llama-8b-shape-f16.gguf"
    if target.exists():
        print(f"{target} exists")
        return
    vocab = gguf.GGUFReader(str(src / "models" / "ggml-vocab-llama-spm.gguf"))
    writer = gguf.GGUFWriter(str(target) + ".partial", "llama")
    s = SHAPE
    n_vocab = 32000
    writer.add_context_length(s["ctx"])
    writer.add_embedding_length(s["n_embd"])
    writer.add_block_count(s["n_layer"])
    writer.add_feed_forward_length(s["n_ff"])
    writer.add_head_count(s["n_head"])
    writer.add_head_count_kv(s["n_head_kv"])
    writer.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for field in vocab.fields.values():
        if field.name.startswith("tokenizer."):
            value = field.contents()
            writer.add_key_value(field.name, value, field.types[0],
                                 sub_type=field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16)

    def tensor(*shape):  # tiles one random block: fast, and a realistic value range
        n = int(np.prod(shape))
        return np.resize(block, n).reshape(shape)

    kv = s["n_embd"] // s["n_head"] * s["n_head_kv"]
    writer.add_tensor("token_embd.weight", tensor(n_vocab, s["n_embd"]))
    writer.add_tensor("output_norm.weight", np.ones(s["n_embd"], dtype=np.float32))
    writer.add_tensor("output.weight", tensor(n_vocab, s["n_embd"]))
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(s["n_embd"], dtype=np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(s["n_embd"], dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", tensor(s["n_embd"], s["n_embd"]))
        writer.add_tensor(p + "attn_k.weight", tensor(kv, s["n_embd"]))
        writer.add_tensor(p + "attn_v.weight", tensor(kv, s["n_embd"]))
        writer.add_tensor(p + "attn_output.weight", tensor(s["n_embd"], s["n_embd"]))
        writer.add_tensor(p + "ffn_gate.weight", tensor(s["n_ff"], s["n_embd"]))
        writer.add_tensor(p + "ffn_up.weight", tensor(s["n_ff"], s["n_embd"]))
        writer.add_tensor(p + "ffn_down.weight", tensor(s["n_embd"], s["n_ff"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.rename(str(target) + ".partial", target)
    print(f"wrote {target} ({target.stat().st_size / 2**30:.1f} GiB)")


def chat(port: int, tokens: int) -> dict:
    body = json.dumps({"model": "bench", "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8,
                       "messages": [{"role": "user", "content": "Write a long story about a GPU."}]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def concurrency(port: int, n: int, tokens: int = 400) -> dict:
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda _: chat(port, tokens), range(n)))
    wall = time.monotonic() - start
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    per_request = [r["timings"]["predicted_per_second"] for r in replies]
    return {"concurrent": n, "tokens": generated, "seconds": round(wall, 2),
            "total_tps": round(generated / wall, 1),
            "per_request_tps": round(sum(per_request) / len(per_request), 1)}


def serve_and_measure(label: str, argv: list[str], port: int, log: Path, measure=None) -> dict:
    """Start ``argv``, wait for /health, measure (``measure(port)``, default: check.py's 1, 4 and 8
    concurrent chats), stop it."""
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        start = time.monotonic()
        while time.monotonic() - start < 600:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"{label}: no /health 200 in 600 s:\n{log.read_text()[-3000:]}")
        ready = time.monotonic() - start
        used = sh("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits").split()
        vram = sum(int(v) for v in used if v.isdigit())  # every GPU of the machine, however many
        chat(port, 16)  # warm-up
        runs = measure(port) if measure else [concurrency(port, n) for n in (1, 4, 8)]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    text = log.read_text()
    offload = [line.strip() for line in text.splitlines() if "offloaded" in line]
    model = Path(argv[argv.index("-m") + 1])
    return {"label": label, "argv": argv[1:], "ready_s": round(ready, 1), "vram_used_mib": vram,
            "offload": offload[-1] if offload else None, "no_gpu": "no usable GPU found" in text,
            # llama-server's default log level no longer prints "offloaded N/N layers": VRAM tells
            "weights_in_vram": vram * 2**20 > model.stat().st_size, "runs": runs}


def role_argv(bindir: Path, model: Path, build: dict) -> list[str]:
    """The flags of roles/llama_server, through the drop-in it installs: its ExecStart, run as is."""
    unit = dropin_text("bench", RECIPE, str(bindir / "llama-server"), str(model), build=build["id"],
                       unit_sha="-", model_revision="-")
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=") and line != "ExecStart="][0]
    return shlex.split(exec_start[len("ExecStart="):])


REPEATS = 4


def cmd_bench(args) -> None:
    """bench.py's measuring (rigup/throughput.py) against check.py's own, on one llama-server
    started from the role's ExecStart: at 1, 4 and 8 concurrent requests of 400 tokens, each
    REPEATS times in turn (check.py first, then throughput.py first, ...); fails beyond 5%."""
    from rigup import throughput

    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / "llama-8b-shape-f16.gguf"
    args.out.mkdir(parents=True, exist_ok=True)

    def both(port: int) -> list[dict]:
        rows = []
        for n in (1, 4, 8):
            mine, theirs = [], []
            for i in range(REPEATS):   # alternated: the server's own drift (about 5% at 8) hits both alike
                pair = [lambda: mine.append(concurrency(port, n)),
                        lambda: theirs.append(throughput.level(f"http://127.0.0.1:{port}", n, max_tokens=400,
                                                               rounds=1, timeout=600))]
                for measure in pair if i % 2 == 0 else pair[::-1]:
                    measure()
            check_tps = sum(r["total_tps"] for r in mine) / REPEATS
            bench_tps = sum(r["total_tps"] for r in theirs) / REPEATS
            rows.append({"concurrent": n, "check_total_tps": round(check_tps, 1), "bench_total_tps": round(bench_tps, 1),
                         "check_per_request_tps": round(sum(r["per_request_tps"] for r in mine) / REPEATS, 1),
                         "bench_per_request_tps": round(sum(r["per_request_tps"] for r in theirs) / REPEATS, 1),
                         "ratio": round(bench_tps / check_tps, 4), "failed": sum(r["failed"] for r in theirs)})
            print(f"{n} concurrent: {rows[-1]}", flush=True)
        return rows

    result = serve_and_measure("rigup (roles/llama_server)", role_argv(bindir, model, build), RECIPE["port"],
                               args.out / "bench-server.log", measure=both)
    lines = ["| concurrent | check.py total tok/s | throughput.py total tok/s | ratio | check.py per request | "
             "throughput.py per request |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['concurrent']} | {r['check_total_tps']} | {r['bench_total_tps']} | {r['ratio']:.3f} | "
              f"{r['check_per_request_tps']} | {r['bench_per_request_tps']} |" for r in result["runs"]]
    (args.out / "bench-compare.json").write_text(json.dumps(result, indent=2))
    (args.out / "bench-compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    off = [r for r in result["runs"] if abs(r["ratio"] - 1) > 0.05 or r["failed"]]
    if off:
        sys.exit(f"throughput.py differs from check.py by more than 5%: {off}")


def cmd_serve(args) -> None:
    before = gpu_settings()
    print(f"GPU settings before: {before}")
    facts, plan = facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / "llama-8b-shape-f16.gguf"
    args.out.mkdir(parents=True, exist_ok=True)
    bench = subprocess.run([str(bindir / "llama-bench"), "-m", str(model), "-ngl", "99", "-fa", "1",
                            "-p", "512,4096", "-n", "128", "-r", "3", "-o", "json"],
                           capture_output=True, text=True, check=True)
    bench_json = json.loads(bench.stdout)
    rigup = role_argv(bindir, model, build)
    server = str(bindir / "llama-server")
    configs = [
        ("rigup (roles/llama_server)", rigup, RECIPE["port"]),
        ("by hand, llama.cpp defaults", [server, "-m", str(model), "--port", "8182"], 8182),
        ("by hand, the seeds' flags", [server, "-m", str(model), "-ngl", "99", "-fa", "on", "-c", "65536",
                                       "--parallel", "8", "--host", "127.0.0.1", "--port", "8183", "--jinja"], 8183),
    ]
    servers = [serve_and_measure(label, argv, port, args.out / f"server-{port}.log") for label, argv, port in configs]
    after = gpu_settings()
    results = {
        "date": time.strftime("%Y-%m-%d"), "gpu": plan["cards"][0]["class"] if plan["cards"] else None,
        "gpu_name": facts["gpus"][0]["name"] if facts["gpus"] else None,
        "driver": facts["driver"].get("version"), "build": build,
        "llama_cpp_version": sh(f"{server} --version 2>&1").strip(), "source": source_note(args.archive),
        "model": {"file": model.name, "bytes": model.stat().st_size, **SHAPE},
        "llama_bench": [{k: r[k] for k in ("n_prompt", "n_gen", "avg_ts", "stddev_ts")} for r in bench_json],
        "servers": servers, "gpu_settings_before": before, "gpu_settings_after": after,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))
    print(f"GPU settings after:  {after}")
    if before != after:
        sys.exit("GPU settings changed")


def source_note(archive: Path) -> str:
    """What the archive holds, from SOURCE beside it (the build of a tree without .git reports
    "commit unknown")."""
    note = archive.with_name("SOURCE")
    return note.read_text().strip() if note.exists() else str(archive.name)


def markdown(r: dict) -> str:
    lines = [f"# rigup on {r['gpu_name']} ({r['date']})", "",
             f"Source: {r.get('source', '?')}.", "",
             f"Driver {r['driver']}; {r['llama_cpp_version'].splitlines()[0]}; build for archs "
             f"{';'.join(r['build']['archs'])} took {r['build']['seconds']:.0f} s. Model: random-weight "
             f"llama, {r['model']['n_layer']} layers x {r['model']['n_embd']}, F16 (tokens/s depend on shape).",
             "", "| llama-bench (-ngl 99 -fa 1) | tok/s |", "| --- | --- |"]
    for b in r["llama_bench"]:
        test = f"pp{b['n_prompt']}" if b["n_prompt"] else f"tg{b['n_gen']}"
        lines.append(f"| {test} | {b['avg_ts']:.1f} ± {b['stddev_ts']:.1f} |")
    lines += ["", "| server | ready s | VRAM MiB | weights in VRAM | 1: total tok/s | 4: total | 8: total | 8: per request |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in r["servers"]:
        t = {run["concurrent"]: run for run in s["runs"]}
        lines.append(f"| {s['label']} | {s['ready_s']} | {s['vram_used_mib']} | "
                     f"{'yes' if s.get('weights_in_vram') else 'no'} | {t[1]['total_tps']} | "
                     f"{t[4]['total_tps']} | {t[8]['total_tps']} | {t[8]['per_request_tps']} |")
    rigup, hand = r["servers"][0], r["servers"][1:]
    for n in (1, 8):
        best = max(s["runs"][[1, 4, 8].index(n)]["total_tps"] for s in hand)
        lines.append(f"\nrigup / best by hand at {n} concurrent: "
                     f"{rigup['runs'][[1, 4, 8].index(n)]['total_tps'] / best:.3f}")
    lines += ["", f"GPU settings before: `{r['gpu_settings_before']}`",
              f"GPU settings after:  `{r['gpu_settings_after']}`"]
    return "\n".join(lines) + "\n"


def cmd_plan(args) -> None:
    """The plan, the cmake line and the serving drop-in, built and run nowhere (no GPU needed)."""
    facts, plan = facts_and_plan()
    print(format_plan(plan))
    print("cmake " + " ".join(f"-D{o}" for o in cmake_options(plan, build_data(args.archive, args.work))))
    print(dropin_text("bench", RECIPE, "/opt/llama-server", "/srv/model.gguf", build="plan", unit_sha="-",
                      model_revision="-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("plan", "build", "model", "serve", "bench"))
    parser.add_argument("--archive", type=Path, default=ROOT / ".gpu" / "llama.cpp.tar.gz")
    parser.add_argument("--work", type=Path, default=Path("/root/rigup-gpu"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/rigup-gpu-out")))
    args = parser.parse_args()
    {"plan": cmd_plan, "build": cmd_build, "model": cmd_model, "serve": cmd_serve, "bench": cmd_bench}[args.step](args)


if __name__ == "__main__":
    main()
