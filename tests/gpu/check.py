"""rigup on a real NVIDIA machine with no network: facts, the role's build, the role's server
flags, and measurements against llama-server started by hand.

Runs from the repository root with python3 (PyYAML, Jinja2 and NumPy; no pyinfra needed) and
ONLY READS GPU settings: it never changes power limits, clocks, persistence or ECC, never resets
a GPU; it prints the settings before and after to prove it.

    python3 tests/gpu/check.py build  --archive .gpu/llama.cpp.tar.gz --work /root/rigup-gpu
    python3 tests/gpu/check.py model  --work /root/rigup-gpu
    python3 tests/gpu/check.py serve  --work /root/rigup-gpu --out DIR
    python3 tests/gpu/check.py bench  --work /root/rigup-gpu --out DIR   # shipped/throughput.py vs check.py
    python3 tests/gpu/check.py smoke  --work /root/rigup-gpu --out DIR   # roles/llama_cpp/shipped/smoke.py, 5 runs
    python3 tests/gpu/check.py health --out DIR    # PCIe links and the kernel log's Xid events, read only
    python3 tests/gpu/check.py tune   --work /root/rigup-gpu --out DIR   # plays/shipped/tune.py from rigup's defaults
    python3 tests/gpu/check.py compare --work /root/rigup-gpu --out DIR  # tuned vs the others, issue 28's goals
    python3 tests/gpu/check.py slower --work /root/rigup-gpu --out DIR   # a new build no slower (issue 51)

`build` runs llama_cpp's own build script (the same render as the role) for the archs of the
plan; `model` writes a random-weight llama-shaped GGUF of a realistic size (tokens/s depend on
shape, not on weight values); `serve` runs llama-bench, then llama-server three ways: with the
flags that roles/llama_server renders into its unit's ExecStart, with llama.cpp's defaults, and
with the seeds' hand flags, each under 1, 4 and 8 concurrent chat requests of 400 tokens.

`smoke` runs the role's smoke inference (roles/llama_cpp/shipped/smoke.py, as a python3 subprocess, one
spec per run, the remedies of roles/llama_cpp/traps.yml that the CPU's flags admit, as the role
gives them) with the built binaries: the tiny smoke model (roles/llama_cpp/smoke.gguf, Q4_0) with
``-ngl 99`` on the GPU; the tiny model on the CPU alone (``-ngl 0``, ``CUDA_VISIBLE_DEVICES=``:
llama.cpp's CPU backend with its AMX/repack buffers), with repacking and with ``--no-repack``; the
8B-shaped model (``model``'s file, made first when missing; or ``--model PATH``) with the role's
flags for a GPU instance (roles/llama_server's defaults: ``-ngl 99 -fa auto -sm layer --jinja``)
on the GPU, and with those flags at ``-ngl 0`` on the CPU alone when it weighs at most 20 GB. It
prints the CPU facts (rigup.gpu.facts.parse_cpu), a table (seconds, tokens, the model buffers
llama.cpp's log names: CPU_REPACK / AMX / CUDA0, whether a trap's remedy was needed) and writes
``OUT/<date>-smoke.json``, ``.md`` and ``.log`` (every run's server log); OUT defaults to
tests/gpu/results. ``--bin DIR`` takes binaries from DIR instead of build.json; ``--cpu-only``
(or no nvidia-smi) skips the GPU runs; ``--only a,b`` picks runs by name. Exit status 1 when a run
failed (or GPU settings changed).

On the lent H200 (one call of the device tool; the machine is bare each call), with
``carry: [".gpu"]`` after making the archive here (from the repository root)::

    mkdir -p .gpu && git -C /var/lib/rigup-lab/srv/llama.cpp.git archive --prefix=llama.cpp/ lab-base \\
      | gzip >.gpu/llama.cpp.tar.gz
    echo "llama.cpp as vendored by llama-cpp-python 0.3.36 from PyPI (upstream commit 0c1e570),"\\
      "tag lab-base of tests/lab/sources.py's mirror" >.gpu/SOURCE

    export PYTHONUNBUFFERED=1 W=/root/rigup-gpu c=tests/gpu/check.py; python3 $c model --work $W \\
      >$OUT/model.log 2>&1 & python3 $c build --work $W && { wait $!; python3 $c smoke --work $W --out $OUT; }

(``model`` takes gguf-py and the vocabulary from the archive when the build has not unpacked it
yet, so the 15 GB model is written while llama.cpp compiles; the build took 325 s there.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.standalone import ROOT, load  # noqa: E402  (pyinfra stood in where it is missing)

from rigup.config import role_defaults  # noqa: E402
from rigup.contract.llama_server import SWEPT, spellings  # noqa: E402
from rigup.entries import normalise  # noqa: E402
from rigup.gpu.facts import hardware_command, parse_hardware  # noqa: E402
from rigup.gpu.plan import format_plan, hardware_plan  # noqa: E402


script = load("roles/llama_cpp/script.py")
build_id, cmake_options, render_build_script = script.build_id, script.cmake_options, script.render_build_script
server_command = load("roles/llama_server/command.py")
smoke = load("roles/llama_cpp/shipped/smoke.py")   # for server_args: the flags smoke.py keeps of a run's args
dropin_text = server_command.dropin_text

SETTINGS = ("power.limit,power.default_limit,persistence_mode,ecc.mode.current,compute_mode,"
            "clocks.applications.graphics,clocks.applications.memory")
RECIPE = {"model": "bench", "port": 8181, "host": "127.0.0.1", "ctx": 65536, "parallel": 8,
          "ngl": 99, "flash_attn": "on", "split_mode": "layer", "tensor_split": None, "jinja": True,
          "metrics": True, "api_key": False, "extra_args": []}
# Llama 3 8B's shape, with a 32k SPM vocabulary from the llama.cpp tree: 7.5 B parameters, F16.
SHAPE = {"n_embd": 4096, "n_layer": 32, "n_head": 32, "n_head_kv": 8, "n_ff": 14336, "ctx": 8192}
MODEL_FILE = "llama-8b-shape-f16.gguf"
VOCAB = "models/ggml-vocab-llama-spm.gguf"


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

    target = args.work / MODEL_FILE
    if target.exists():
        print(f"{target} exists")
        return
    start = time.monotonic()
    src = gguf_source(args.work, args.archive)
    sys.path.insert(0, str(src / "gguf-py"))
    import gguf

    vocab = gguf.GGUFReader(str(src / VOCAB))
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
    print(f"wrote {target} ({target.stat().st_size / 2**30:.1f} GiB) in {time.monotonic() - start:.0f} s", flush=True)


def gguf_source(work: Path, archive: Path) -> Path:
    """A llama.cpp tree with gguf-py and the SPM vocabulary: the build's source when unpacked,
    else those two taken from the archive into WORK/gguf-src (so that `model` runs beside `build`,
    which unpacks the source only at its start and replaces it whole)."""
    src = work / "llama.cpp" / "src"
    if (src / "gguf-py" / "gguf").is_dir() and (src / VOCAB).is_file():
        return src
    out = work / "gguf-src"
    if not (out / VOCAB).is_file():
        import tarfile

        if not archive.is_file():
            sys.exit(f"no llama.cpp source for gguf-py: neither {src} nor the archive {archive}")
        shutil.rmtree(out, ignore_errors=True)
        with tarfile.open(archive) as tar:
            members = []
            for m in tar.getmembers():
                rest = m.name.split("/", 1)[1] if "/" in m.name else ""
                if (rest.startswith("gguf-py/") or rest == VOCAB) and (m.isfile() or m.isdir()):
                    m.name = rest
                    members.append(m)
            try:
                tar.extractall(out, members, filter="data")
            except TypeError:  # a Python without extraction filters
                tar.extractall(out, members)
    return out


def chat(port: int, tokens: int, model: str = "bench") -> dict:
    body = json.dumps({"model": model, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8,
                       "messages": [{"role": "user", "content": "Write a long story about a GPU."}]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


@functools.cache
def _guard():
    """roles/gpu_guard/shipped/guard.py, the guard as it runs on a host (standard library only)."""
    return load("roles/gpu_guard/shipped/guard.py")


class Power:
    """Every card sampled by ``nvidia-smi --query-gpu=<the GPU guard's fields> -lms 100`` (reads
    only) while the block runs; ``joules``: the draw of all cards integrated over time (each sample
    held until the next). Each sample also goes through the guard's own judgement of the PCIe link
    under load (guard.links_under_load: the generation against the card's maximum, only while the
    card is busy): ``links`` is what it found, ``loaded`` how many samples were busy enough to judge."""

    def __enter__(self):
        self.guard = _guard()
        fields = f"{self.guard.QUERY},{','.join(self.guard.EXTRA)}"
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                      "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.samples: list[tuple[float, int, float]] = []
        self.state: dict = {}
        self.loaded, self.gens = 0, set()
        self.reader = concurrent.futures.ThreadPoolExecutor(1).submit(self._read)
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            cards, _ = self.guard.parse_sample([line])
            for card in cards:
                now = time.monotonic()
                if card["draw"] is not None:
                    self.samples.append((now, card["index"], card["draw"]))
                if (card.get("utilization.gpu") or 0) >= self.guard.LOADED_PERCENT:
                    self.loaded += 1
                    self.gens.add((card.get("pcie.link.gen.current"), card.get("pcie.link.gen.max")))
                self.guard.links_under_load(self.state, [card], time.time())

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.reader.result(timeout=10)
        self.joules = 0.0
        last: dict[int, tuple[float, float]] = {}
        for t, card, watts in self.samples:
            if card in last:
                self.joules += last[card][1] * (t - last[card][0])
            last[card] = (t, watts)
        self.links = {k: c["link"] for k, c in (self.state.get("cards") or {}).items() if c.get("link")}
        return False


def concurrency(port: int, n: int, tokens: int = 400, model: str = "bench") -> dict:
    with Power() as power:
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            replies = list(pool.map(lambda _: chat(port, tokens, model), range(n)))
        wall = time.monotonic() - start
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    per_request = [r["timings"]["predicted_per_second"] for r in replies]
    return {"concurrent": n, "tokens": generated, "seconds": round(wall, 2),
            "total_tps": round(generated / wall, 1),
            "per_request_tps": round(sum(per_request) / len(per_request), 1),
            "joules": round(power.joules, 1), "joules_per_token": round(power.joules / generated, 3) if generated else None,
            "power_samples": len(power.samples), "loaded_samples": power.loaded,
            "link_gens_under_load": sorted(f"Gen{g:.0f} of Gen{m:.0f}" for g, m in power.gens if g is not None and m is not None),
            "downtrained_under_load": power.links}


def serve_and_measure(label: str, argv: list[str], port: int, log: Path, measure=None, weights: Path | None = None) -> dict:
    """Start ``argv``, wait for /health, measure (``measure(port)``, default: check.py's 1, 4 and 8
    concurrent chats), stop it. ``weights``: the model file to compare VRAM with (default: ``-m``'s;
    a router has none)."""
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
    model = weights or Path(argv[argv.index("-m") + 1])
    return {"label": label, "argv": argv[1:], "ready_s": round(ready, 1), "vram_used_mib": vram,
            "offload": offload[-1] if offload else None, "no_gpu": "no usable GPU found" in text,
            # llama-server's default log level no longer prints "offloaded N/N layers": VRAM tells
            "weights_in_vram": vram * 2**20 > model.stat().st_size, "runs": runs}


def role_argv(bindir: Path, model: Path, build: dict) -> list[str]:
    """The flags of roles/llama_server for RECIPE, through the drop-in it installs (:func:`inst_argv`)."""
    return inst_argv(bindir, model, build, RECIPE)


REPEATS = 4


def cmd_bench(args) -> None:
    """bench.py's measuring (shipped/throughput.py) against check.py's own, on one llama-server
    started from the role's ExecStart: at 1, 4 and 8 concurrent requests of 400 tokens, each
    REPEATS times in turn (check.py first, then throughput.py first, ...); fails beyond 5%. Joules per
    generated token (every card's draw integrated over check.py's runs, :class:`Power`) next to
    tok/s."""
    from shipped import throughput

    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
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
            jpt = [r["joules_per_token"] for r in mine if r["joules_per_token"] is not None]
            links = sorted({g for r in mine for g in r["link_gens_under_load"]})
            slow = {k: v for r in mine for k, v in r["downtrained_under_load"].items()}
            rows.append({"concurrent": n, "check_total_tps": round(check_tps, 1), "bench_total_tps": round(bench_tps, 1),
                         "joules_per_token": round(sum(jpt) / len(jpt), 3) if jpt else None,
                         "check_per_request_tps": round(sum(r["per_request_tps"] for r in mine) / REPEATS, 1),
                         "bench_per_request_tps": round(sum(r["per_request_tps"] for r in theirs) / REPEATS, 1),
                         "ratio": round(bench_tps / check_tps, 4), "failed": sum(r["failed"] for r in theirs),
                         "loaded_samples": sum(r["loaded_samples"] for r in mine), "link_under_load": links,
                         "downtrained_under_load": slow})
            print(f"{n} concurrent: {rows[-1]}", flush=True)
        return rows

    result = serve_and_measure("rigup (roles/llama_server)", role_argv(bindir, model, build), RECIPE["port"],
                               args.out / "bench-server.log", measure=both)
    lines = ["| concurrent | check.py total tok/s | J/token | throughput.py total tok/s | ratio | check.py per request | "
             "throughput.py per request | PCIe link under load (busy samples; the guard's verdict) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['concurrent']} | {r['check_total_tps']} | {r['joules_per_token']} | {r['bench_total_tps']} | "
              f"{r['ratio']:.3f} | {r['check_per_request_tps']} | {r['bench_per_request_tps']} | "
              f"{', '.join(r['link_under_load']) or '-'} ({r['loaded_samples']}; "
              f"{'DOWNTRAINED ' + str(r['downtrained_under_load']) if r['downtrained_under_load'] else 'not downtrained'}) |"
              for r in result["runs"]]
    (args.out / "bench-compare.json").write_text(json.dumps(result, indent=2))
    (args.out / "bench-compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    off = [r for r in result["runs"] if abs(r["ratio"] - 1) > 0.05 or r["failed"]]
    if off:
        sys.exit(f"throughput.py differs from check.py by more than 5%: {off}")


TUNE_LEVELS = (1, 8, 16, 32)
TUNE_REPEATS = 3
TUNE_PORT = 8184
TUNE_FLAGS = spellings(SWEPT)   # the spec's flags (plays/tuning.py spec): the swept flags' spellings


def plan_instance(plan: dict, model: Path) -> tuple[dict, str]:
    """RECIPE without ctx and parallel, as rigup sizes them from this machine's plan
    (roles/llama_server/replicas.py ``sized``, the model's own GGUF header for its KV cache per
    token and trained context), and the plan's words."""
    replicas, gguf = load("roles/llama_server/replicas.py"), load("shipped/gguf.py")
    with model.open("rb") as f:
        head = f.read(4 << 20)
    figures = gguf.kv_figures(gguf.metadata(head, lambda k: not k.startswith("tokenizer."), partial=True))
    entry = {"repo": "rigup-gpu/llama-8b-shape", "size_gib": round(model.stat().st_size / 2**30, 2), "gguf": figures}
    data = {"gpu_enabled": True, "llama_cpp_backend": "cuda", "cmpunlocker_enabled": False}
    inst = {**RECIPE, "ctx": "auto", "parallel": "auto", "flash_attn": "auto", "replicas": 1, "gpus_per_replica": None,
            "rpc_workers": []}
    sized, _, why = replicas.sized(inst, entry, plan, data)
    return sized, why


def inst_argv(bindir: Path, model: Path, build: dict, inst: dict) -> list[str]:
    """The ExecStart roles/llama_server renders for ``inst``, run as is."""
    unit = dropin_text("bench", inst, str(bindir / "llama-server"), str(model), build=build["id"],
                       unit_sha="-", model_revision="-")
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=") and line != "ExecStart="][0]
    return shlex.split(exec_start[len("ExecStart="):])


def cmd_tune(args) -> None:
    """plays/shipped/tune.py on this machine: from rigup's defaults for the plan (ctx and parallel sized
    from the VRAM), target 32 concurrent, each point measured at 1, 8, 16 and 32 concurrent chats
    of 400 tokens (its figure: the geometric mean), within --budget seconds. Writes
    WORK/tune.json (and OUT/tune.json)."""
    from plays.shipped import tune

    before = gpu_settings()
    facts, plan = facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
    inst, why = plan_instance(plan, model)
    if args.ngl is not None:   # a partial offload to start from: the sweep's offload stage climbs from it
        inst = {**inst, "ngl": args.ngl}
        why += f"; started from -ngl {args.ngl}"
    print(f"rigup's defaults for this plan: {why}", flush=True)
    levels = [int(n) for n in args.levels.split(",")] if args.levels else list(TUNE_LEVELS)
    spec = {"argv": inst_argv(bindir, model, build, inst), "port": TUNE_PORT, "concurrency": max(levels),
            "levels": levels, "slot_tokens": inst["ctx"] // inst["parallel"], "max_parallel": 32,
            "gpu": True, "budget_s": args.budget, "max_tokens": 400 if args.ngl is None else 100, "rounds": 1,
            "env": {"NCCL_NVLS_ENABLE": "0"}, "gpus": len(plan.get("cards", [])) or 1,
            "flags": {k: list(v) for k, v in TUNE_FLAGS.items()}}
    logs = args.work / "tune-logs"
    logs.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    shown = [0]   # points printed: the sweep writes its result once more at the end

    def write(result: dict) -> None:
        doc = {"date": time.strftime("%Y-%m-%d"), "plan_defaults": why, "spec": spec, **result}
        for path in (args.work / "tune.json", args.out / "tune.json"):
            path.write_text(json.dumps(doc, indent=1))
        last = result["points"][-1] if len(result["points"]) > shown[0] else None
        shown[0] = len(result["points"])
        if last:
            print(f"point {len(result['points'])} at {last['at_s']} s: {last['flags']} -> {last['status']} "
                  f"{last.get('tps')} ({', '.join(str(lv['total_tps']) for lv in last.get('levels', []))})", flush=True)

    result = tune.tune(spec, write, logs=logs)
    print(f"best: {result['best'] and result['best']['flags']}, {result['ratio']}x rigup's defaults; "
          f"{len(result['points'])} points in {result['spent_s']} s; {result['stopped'] or 'sweep complete'}")
    rows = [f"| {p['flags'] or 'the start'} | {p['status']} | {p.get('tps', '-')} | {p.get('vram_mib', '-')} | "
            f"{p.get('ready_s', '-')} |" for p in result["points"]]
    (args.out / "tune.md").write_text(
        f"# plays/shipped/tune.py on {facts['gpus'][0].get('name', 'a GPU') if facts.get('gpus') else 'this machine'}, "
        f"{time.strftime('%Y-%m-%d')}\n\n{MODEL_FILE} ({result.get('layers')} layers), at {levels} concurrent chats "
        f"of {spec['max_tokens']} tokens; {why}.\n\nBest: {result['best'] and result['best']['flags']}, {result['ratio']}x the start; "
        f"{len(result['points'])} points in {result['spent_s']} s; {result['stopped'] or 'sweep complete'}.\n\n"
        "| flags | status | tok/s | VRAM used MiB | seconds to ready |\n| --- | --- | --- | --- | --- |\n"
        + "\n".join(rows) + "\n")
    if gpu_settings() != before:
        sys.exit("GPU settings changed")


def side_by_side(configs: dict[str, list[str]], port: int, levels: tuple[int, ...], logs: Path
                 ) -> tuple[dict, dict[str, dict[int, float]]]:
    """Each of ``configs`` (label -> argv) served in turn on ``port`` and measured at each of
    ``levels`` concurrent chats of 400 tokens, TUNE_REPEATS times; its log LOGS-K.log. (servers
    as serve_and_measure gives them, {label: {level: mean tok/s}})."""
    def measure(p: int) -> list[dict]:
        rows = []
        for n in levels:
            reps = [concurrency(p, n) for _ in range(TUNE_REPEATS)]
            rows.append({"concurrent": n, "total_tps": [r["total_tps"] for r in reps],
                         "mean_tps": round(sum(r["total_tps"] for r in reps) / len(reps), 1)})
            print(f"  {n} concurrent: {rows[-1]['total_tps']}", flush=True)
        return rows

    servers = {}
    for label, argv in configs.items():
        print(f"{label}: {' '.join(argv[1:])}", flush=True)
        servers[label] = serve_and_measure(label, argv, port, logs.with_name(f"{logs.name}-{len(servers)}.log"),
                                           measure=measure)
    return servers, {label: {r["concurrent"]: r["mean_tps"] for r in s["runs"]} for label, s in servers.items()}


def cmd_admission(args) -> None:
    """Issue 28's 32-concurrent gap: the tuned flags of tests/gpu/results/2026-12-02-h200-tune-morning.json
    (rigup's sized defaults with -fa on) with llama-server's host-RAM prompt cache (on by default:
    each new task on a used slot first saves that slot's KV state to host RAM, in the main loop)
    and with --cache-ram 0, against the reports' recipe; at 16 and 32 concurrent chats of 400
    tokens, TUNE_REPEATS times each. Writes OUT/<date>-h200-admission.{json,md}."""
    from plays.shipped import tune

    before = gpu_settings()
    facts, plan = facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
    inst, why = plan_instance(plan, model)
    port, levels = TUNE_PORT + 1, (16, 32)
    tuned = tune.with_flags(inst_argv(bindir, model, build, inst), {"port": port, "flash_attn": "on"}, TUNE_FLAGS)
    configs = {"tuned (-fa on)": tuned, "tuned with --cache-ram 0": tune.with_flags(tuned, {"cache_ram": 0}, TUNE_FLAGS),
               "the reports' recipe (-c 65536 --parallel 8)": tune.with_flags(inst_argv(bindir, model, build, RECIPE),
                                                                               {"port": port}, TUNE_FLAGS)}

    servers, mean = side_by_side(configs, port, levels, args.out / "admission")
    t, off, reports = (mean[k] for k in configs)
    lines = [f"# llama-server's host-RAM prompt cache at 16 and 32 concurrent, {time.strftime('%Y-%m-%d')}", "",
             f"{facts['gpus'][0]['name'] if facts['gpus'] else '?'}; {model.name}; chats of 400 tokens; total tok/s, "
             f"the mean of {TUNE_REPEATS} runs each; rigup's defaults for this plan: {why}", "",
             "| flags | 16 concurrent | 32 concurrent |", "| --- | --- | --- |"]
    lines += [f"| {label} | {mean[label][16]:,} | {mean[label][32]:,} |" for label in configs]
    lines += ["", f"tuned with --cache-ram 0 against the reports' recipe: {off[32] / reports[32]:.2f}x at 32, "
                  f"{off[16] / reports[16]:.2f}x at 16; against the tuned flags with the cache: "
                  f"{off[32] / t[32]:.2f}x at 32."]
    doc = {"date": time.strftime("%Y-%m-%d"), "build": build, "plan_defaults": why, "servers": servers, "mean_tps": mean,
           "gpu_settings_before": before, "gpu_settings_after": gpu_settings()}
    day = time.strftime("%Y-%m-%d")
    (args.out / f"{day}-h200-admission.json").write_text(json.dumps(doc, indent=1))
    (args.out / f"{day}-h200-admission.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if doc["gpu_settings_before"] != doc["gpu_settings_after"]:
        sys.exit("GPU settings changed")


def cmd_compare(args) -> None:
    """The tuned flags (WORK/tune.json) side by side with rigup's defaults for the plan, the
    reports' recipe (-c 65536 --parallel 8) and llama.cpp's own defaults: each served once, at 1,
    8, 16 and 32 concurrent chats of 400 tokens, TUNE_REPEATS times each; the issue's goals
    judged. Writes OUT/<date>-h200-tune.json and .md."""
    from plays.shipped import tune

    before = gpu_settings()
    facts, plan = facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
    tuned = json.loads((args.work / "tune.json").read_text())
    inst, why = plan_instance(plan, model)
    server = str(bindir / "llama-server")
    port = TUNE_PORT + 1
    configs = {
        "tuned (plays/shipped/tune.py)": tune.with_flags(tuned["best"]["argv"], {"port": port}, TUNE_FLAGS),
        "rigup's defaults (from the plan)": tune.with_flags(inst_argv(bindir, model, build, inst), {"port": port}, TUNE_FLAGS),
        "the reports' recipe (-c 65536 --parallel 8)": tune.with_flags(inst_argv(bindir, model, build, RECIPE),
                                                                        {"port": port}, TUNE_FLAGS),
        "llama.cpp's defaults": [server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)],
    }

    servers, mean = side_by_side(configs, port, TUNE_LEVELS, args.out / "compare")
    after = gpu_settings()
    doc = {"date": time.strftime("%Y-%m-%d"), "gpu_name": facts["gpus"][0]["name"] if facts["gpus"] else None,
           "driver": facts["driver"].get("version"), "build": build, "source": source_note(args.archive),
           "model": {"file": model.name, "bytes": model.stat().st_size, **SHAPE}, "plan_defaults": why,
           "tune": {k: tuned[k] for k in ("ratio", "spent_s", "stopped", "levels")} | {
               "best_flags": tuned["best"]["flags"],
               "points": [{k: p.get(k) for k in ("flags", "status", "tps", "levels", "ready_s", "vram_mib", "error")}
                          for p in tuned["points"]]},
           "servers": servers, "mean_tps": mean,
           "gpu_settings_before": before, "gpu_settings_after": after}
    write_compare(doc, args.out)
    if before != after:
        sys.exit("GPU settings changed")


def cmd_serve(args) -> None:
    before = gpu_settings()
    print(f"GPU settings before: {before}")
    facts, plan = facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
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


ROUTER_PORT = 8186
ROUTER_LEVELS = (1, 8, 32)


def router_inst() -> dict:
    """RECIPE as a router (issue 49): the 8B-shaped model under two names, one loaded at a time."""
    return {**RECIPE, "port": ROUTER_PORT, "also": ["bench-b"], "models_max": 1}


def router_argv(bindir: Path, model: Path, build: dict, preset: Path) -> list[str]:
    """roles/llama_server's router command line for :func:`router_inst`, with its preset (the role's
    own text, :func:`server_command.preset_text`) at ``preset`` instead of /etc/rigup."""
    inst = router_inst()
    preset.write_text(server_command.preset_text("bench", inst, {"bench": str(model), "bench-b": str(model)}))
    argv = inst_argv(bindir, model, build, inst)
    argv[argv.index("--models-preset") + 1] = str(preset)
    return argv


def drop_page_cache() -> bool:
    """The kernel's page cache dropped (a cold read next; not a GPU setting): whether it could be."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def timed_chat(port: int, model: str) -> float:
    start = time.monotonic()
    chat(port, 16, model)
    return round(time.monotonic() - start, 2)


def pinned_argvs(bindir: Path, model: Path, build: dict, preset: Path) -> tuple[list[str], list[str], int]:
    """A router of three with one pinned, as roles/llama_server runs it: (the router's command
    line, its preset written at ``preset``; the pinned model's own server's; that server's port)."""
    inst = {**RECIPE, "port": ROUTER_PORT, "also": ["bench-p", "bench-b", "bench-c"], "models_max": 1,
            "per_model": {"bench-p": {"pinned": True}}}
    (pin,) = server_command.pinned_servers("bench", inst, {})
    routed = server_command.routed(inst)
    preset.write_text(server_command.preset_text("bench", routed, {m: str(model) for m in ["bench", *routed["also"]]}))
    router = inst_argv(bindir, model, build, routed)
    router[router.index("--models-preset") + 1] = str(preset)
    return router, inst_argv(bindir, model, build, pin["inst"]), pin["inst"]["port"]


def mps_daemon(work: Path) -> dict:
    """NVIDIA's Multi-Process Service for this run's servers only: a control daemon of our own
    whose pipe and log directories live under ``work`` (every process given them shares the GPU
    through it, kernels side by side instead of time-sliced contexts). It is a user-space daemon,
    not a GPU setting: the compute mode stays as it is (compared before and after). Returns the
    environment its clients need; this process's own environment gets it too."""
    dirs = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(work / "mps-log")}
    for d in dirs.values():
        Path(d).mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, **dirs}
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=60)
    os.environ.update(dirs)
    return env


def cmd_pinned(args) -> None:
    """Issue 63 on the GPU: a router of three models with one pinned (``per_model: {bench-p:
    {pinned: true}}``): the pinned model's own server (roles/llama_server/command.py
    ``pinned_servers``, its flags as the role renders them) beside the router (``routed``: the
    pinned model out of its preset) with models_max 1 over the two others, all the 8B-shaped model.
    The pinned server's throughput at 1 and 8 concurrent with the router idle, then while the
    router swaps between its two models again and again (each swap timed: a 16-token request for
    the other model, its load included, from the page cache): goal >= 0.95x, and swaps no slower
    than issue 49's 2.9-3.3 s. Writes OUT/pinned.json. Reads GPU settings only."""
    before = gpu_settings()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
    args.out.mkdir(parents=True, exist_ok=True)
    router, pin_argv, pin_port = pinned_argvs(bindir, model, build, args.work / "pinned.models.ini")
    router += shlex.split(os.environ.get("PINNED_ROUTER_EXTRA", ""))   # an experiment's flags (e.g. --no-warmup)
    mps = mps_daemon(args.work) if os.environ.get("PINNED_MPS") else None
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    with (args.out / "pinned-server.log").open("w") as out:
        pinned = subprocess.Popen(pin_argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    # the router's own environment (e.g. CUDA_MPS_CLIENT_PRIORITY=1: its clients below the pinned one's)
    os.environ.update(dict(kv.split("=", 1) for kv in shlex.split(os.environ.get("PINNED_ROUTER_ENV", ""))))
    found: dict = {}

    def measure(port: int) -> list[dict]:
        start = time.monotonic()
        while time.monotonic() - start < 600:
            try:
                chat(pin_port, 16, "bench-p")
                break
            except OSError:
                time.sleep(0.5)
        found["pinned_alone"] = [concurrency(pin_port, n, model="bench-p") for n in (1, 8)]
        swaps: list[float] = []
        stop = threading.Event()

        def swapping() -> None:
            while not stop.is_set():
                for m in ("bench-b", "bench-c"):
                    swaps.append(timed_chat(port, m))
        worker = threading.Thread(target=swapping)
        worker.start()
        time.sleep(2)
        found["pinned_during_swaps"] = [concurrency(pin_port, n, model="bench-p") for n in (1, 8)]
        stop.set()
        worker.join()
        found["swap_s"] = swaps
        return []

    try:
        router_run = serve_and_measure("router beside a pinned model (models_max 1)", router, ROUTER_PORT,
                                       args.out / "router.log", measure=measure, weights=model)
    finally:
        os.killpg(pinned.pid, signal.SIGINT)
        pinned.wait(timeout=60)
        if mps:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps, timeout=60)
    ratios = {str(a["concurrent"]): round(b["total_tps"] / a["total_tps"], 3)
              for a, b in zip(found["pinned_alone"], found["pinned_during_swaps"]) if a["total_tps"]}
    after = gpu_settings()
    swaps = found["swap_s"]
    doc = {"date": time.strftime("%Y-%m-%d"), "build": build, "model": {"file": model.name, "bytes": model.stat().st_size},
           "pinned_argv": pin_argv[1:], "router": router_run, **found,
           "pinned_ratio_during_swaps": ratios, "swaps": len(swaps),
           "swap_s_median": sorted(swaps)[len(swaps) // 2] if swaps else None,
           "goal_met": bool(ratios) and min(ratios.values()) >= 0.95 and bool(swaps) and max(swaps) <= 3.3,
           "gpu_settings_unchanged": before == after, "mps": bool(mps),
           "router_env": os.environ.get("PINNED_ROUTER_ENV", ""), "router_extra": os.environ.get("PINNED_ROUTER_EXTRA", "")}
    (args.out / "pinned.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: doc[k] for k in ("pinned_ratio_during_swaps", "swaps", "swap_s_median", "swap_s", "goal_met",
                                          "gpu_settings_unchanged")}, indent=1))
    if before != after:
        sys.exit("GPU settings changed")


def cmd_router(args) -> None:
    """Issue 49 on the GPU: the role's router with the 8B-shaped model under two names and
    models_max 1. Swap seconds (a 16-token request for the other model, its load included) from the
    page cache and from a cold read (page cache dropped first); then throughput after a swap at 1, 8
    and 32 concurrent, against a dedicated server of the same model and flags (the role's own), in
    one run. Writes OUT/router.json. Reads GPU settings only (compared before and after)."""
    before = gpu_settings()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model = args.work / MODEL_FILE
    args.out.mkdir(parents=True, exist_ok=True)
    swaps: dict = {}

    def after_swaps(port: int) -> list[dict]:
        chat(port, 16, "bench")                                    # bench loaded (at start)
        swaps["page_cache_s"] = [timed_chat(port, "bench-b"), timed_chat(port, "bench")]
        swaps["cold_read_dropped"] = drop_page_cache()
        swaps["cold_read_s"] = timed_chat(port, "bench-b")
        swaps["back_s"] = timed_chat(port, "bench")               # a swap, then the throughput
        return [concurrency(port, n, model="bench") for n in ROUTER_LEVELS]

    router = serve_and_measure("router (models_max 1)", router_argv(bindir, model, build, args.work / "router.models.ini"),
                               ROUTER_PORT, args.out / "router.log", measure=after_swaps, weights=model)
    dedicated = serve_and_measure("dedicated", role_argv(bindir, model, build), RECIPE["port"],
                                  args.out / "dedicated.log", measure=lambda port: [concurrency(port, n) for n in ROUTER_LEVELS])
    ratios = {str(r["concurrent"]): round(r["total_tps"] / d["total_tps"], 3)
              for r, d in zip(router["runs"], dedicated["runs"]) if d["total_tps"]}
    after = gpu_settings()
    doc = {"date": time.strftime("%Y-%m-%d"), "build": build, "model": {"file": model.name, "bytes": model.stat().st_size},
           "swaps": swaps, "router": router, "dedicated": dedicated, "tps_ratio_after_swap": ratios,
           "goal_met": bool(ratios) and min(ratios.values()) >= 0.95, "gpu_settings_unchanged": before == after}
    (args.out / "router.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: doc[k] for k in ("swaps", "tps_ratio_after_swap", "goal_met", "gpu_settings_unchanged")}, indent=1))
    if before != after:
        sys.exit("GPU settings changed")


COMPARE_LABELS = ("tuned", "defaults", "reports", "llama.cpp")  # the order cmd_compare serves them in


def compare_goals(doc: dict) -> dict:
    """Issue 28's goals judged on a compare document's means: {goal: (ratio, met)}."""
    mean = {label: {int(n): tps for n, tps in per.items()} for label, per in doc["mean_tps"].items()}
    by = dict(zip(COMPARE_LABELS, (mean[label] for label in doc["servers"])))  # JSON keeps their order
    t, reports, defaults = by["tuned"], by["reports"], by["defaults"]
    best_other = {n: max(by[k][n] for k in COMPARE_LABELS[1:]) for n in TUNE_LEVELS}
    return {
        "tuned >= 2.5x the reports' recipe at 32": (round(t[32] / reports[32], 2), t[32] >= 2.5 * reports[32]),
        "tuned >= 1.5x the reports' recipe at 16": (round(t[16] / reports[16], 2), t[16] >= 1.5 * reports[16]),
        "tuned >= 0.95x the best of the others at 1": (round(t[1] / best_other[1], 2), t[1] >= 0.95 * best_other[1]),
        "tuned >= 0.95x the best of the others at 8": (round(t[8] / best_other[8], 2), t[8] >= 0.95 * best_other[8]),
        "rigup's defaults >= 0.8x tuned at 16": (round(defaults[16] / t[16], 2), defaults[16] >= 0.8 * t[16]),
    }


def write_compare(doc: dict, out: Path) -> None:
    """OUT/<date>-h200-tune.json and .md of a compare document, its goals judged afresh."""
    doc["goals"] = compare_goals(doc)
    mean = {label: {int(n): tps for n, tps in per.items()} for label, per in doc["mean_tps"].items()}
    tune_doc, model = doc["tune"], doc["model"]
    lines = [f"# Tuned llama-server flags on {doc['gpu_name']}, {doc['date']}", "",
             f"Model: {model['file']} (an 8B-shaped F16 GGUF, {model['bytes'] / 2**30:.1f} GiB); chats of 400 "
             f"tokens; total tok/s, the mean of {TUNE_REPEATS} runs each; one server per row, started as shown.", "",
             f"rigup's defaults for this plan: {doc['plan_defaults']}", "",
             f"Tuned (plays/shipped/tune.py, {len(tune_doc['points'])} points in {tune_doc['spent_s']} s, each at "
             f"{', '.join(map(str, TUNE_LEVELS))} concurrent): {tune_doc['best_flags']}, {tune_doc['ratio']}x rigup's "
             "defaults by its figure (the geometric mean over the levels).", "",
             "| flags | " + " | ".join(f"{n} concurrent" for n in TUNE_LEVELS) + " | VRAM used MiB |",
             "| --- |" + " --- |" * (len(TUNE_LEVELS) + 1)]
    for label, s in doc["servers"].items():
        lines.append(f"| {label} | " + " | ".join(f"{mean[label][n]:,}" for n in TUNE_LEVELS) + f" | {s['vram_used_mib']:,} |")
    lines += ["", "| goal | ratio | met |", "| --- | --- | --- |"]
    lines += [f"| {g} | {r} | {'yes' if ok else 'NO'} |" for g, (r, ok) in doc["goals"].items()]
    lines += ["", "The sweep's points:", "", "| flags | status | figure | " +
              " | ".join(f"{n}" for n in TUNE_LEVELS) + " |", "| --- | --- | --- |" + " --- |" * len(TUNE_LEVELS)]
    for p in tune_doc["points"]:
        per = {lv["concurrency"]: lv["total_tps"] for lv in p.get("levels") or []}
        lines.append(f"| {p['flags'] or 'rigup defaults'} | {p['status']} | {p.get('tps', '')} | " +
                     " | ".join(f"{per.get(n, '')}" for n in TUNE_LEVELS) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{doc['date']}-h200-tune.json").write_text(json.dumps(doc, indent=1))
    (out / f"{doc['date']}-h200-tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cmd_report(args) -> None:
    """compare's .json and .md written again from its .json (--model names it), the goals judged afresh."""
    write_compare(json.loads(args.model.read_text()), args.out)


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


SMOKE_SCRIPT = ROOT / "roles" / "llama_cpp" / "shipped" / "smoke.py"
SMOKE_TINY = ROOT / "roles" / "llama_cpp" / "smoke.gguf"
SMOKE_TRAPS = ROOT / "roles" / "llama_cpp" / "traps.yml"
CPU_MODEL_MAX_BYTES = 20 * 10**9      # the big model on the CPU alone only up to this (it answers slowly)
TINY_TIMEOUT = 120
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_BUFFER = re.compile(r"\b(\S+) model buffer size\s*=\s*([\d.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (\d+/\d+) layers to GPU")


def role_flags(ngl: int) -> list[str]:
    """llama-server's flags after ``-m MODEL`` for an instance of roles/llama_server's defaults
    (``-ngl ngl -fa auto -sm layer --jinja --metrics`` and the port, context and slots that
    smoke.py replaces with its own), as roles/llama_server/smoke.py gives them to the smoke."""
    schema = load("rigup/instances/llama_server.py")
    # ctx and parallel as replicas.sized would choose them: smoke.py puts its own in their place
    inst, problems = normalise({"model": "smoke", "port": 8181, "ngl": ngl, "ctx": 4096, "parallel": 1},
                               schema.LLAMA_INSTANCE, "smoke")
    if problems:
        raise SystemExit(f"rigup/instances/llama_server.py refused the smoke instance: {problems}")
    return server_command.argv("smoke", inst, "llama-server", "MODEL")[3:]


def smoke_remedies(cpu: dict) -> list[dict]:
    """roles/llama_cpp's remedies for a host with this CPU (its ``remedies``: the catalogue's
    server-flag traps whose cpu_flags_any the CPU has), as the smoke spec carries them."""
    from rigup.traps import load as load_traps

    flags = set(cpu.get("flags") or [])
    return [{"id": t.id, "ref": t.ref, "signals": list(t.condition.get("signals", [])), "args": [t.remedy.value]}
            for t in load_traps(SMOKE_TRAPS, condition_keys=("signals", "cpu_flags_any"))
            if t.remedy.kind == "server_flag" and flags & set(t.condition.get("cpu_flags_any", []))]


def cpu_line(cpu: dict) -> str:
    """rigup.gpu.facts.parse_cpu's facts in one line."""
    return (f"CPU: {cpu.get('model')} ({cpu.get('vendor')}); {cpu.get('logical')} logical CPUs, {cpu.get('cores')} "
            f"cores, {cpu.get('sockets')} socket(s), {cpu.get('numa_nodes')} NUMA node(s); AMX "
            f"{'yes' if cpu.get('amx') else 'no'}; flags: {' '.join(cpu.get('flags') or []) or '-'}")


def gpu_present() -> bool:
    return bool(shutil.which("nvidia-smi")) and "GPU " in sh("nvidia-smi -L 2>/dev/null")


def log_attempts(text: str) -> list[dict]:
    """What each server start of a smoke log says about where the weights went: its flags, the
    model buffers (``CPU_REPACK``, ``AMX``, ``CUDA0``, ``CPU_Mapped``: MiB), the layers offloaded,
    llama.cpp's CUDA init line and its CPU features (``system_info``)."""
    attempts = []
    for part in text.split("\n# rigup smoke: ")[1:]:
        lines = part.splitlines()
        buffers: dict[str, float] = {}
        for name, mib in _BUFFER.findall(part):
            buffers[name] = round(buffers.get(name, 0) + float(mib), 2)
        offloaded = _OFFLOADED.findall(part)
        cuda = [ln.split("ggml_cuda_init:", 1)[1].strip() for ln in lines if "ggml_cuda_init:" in ln]
        info = [ln.split("system_info:", 1)[1].strip() for ln in lines if "system_info:" in ln]
        attempts.append({"argv": lines[0] if lines else "", "buffers": buffers,
                         "offloaded": offloaded[-1] if offloaded else None, "cuda": cuda[0] if cuda else None,
                         "system_info": info[0] if info else None})
    return attempts


def model_files(model: Path) -> list[Path]:
    """A GGUF's files: itself, or every shard of a ``-00001-of-N`` one."""
    match = _SHARD.search(model.name)
    return sorted(model.parent.glob(model.name[:match.start()] + "-*-of-*.gguf")) if match else [model]


def link_model(model: Path, folder: Path) -> Path:
    """``folder`` as a served model's folder for smoke.py: a link to ``model`` (and its sibling
    shards) and the ``.rigup-complete.json`` marker naming it; the marker's path."""
    folder.mkdir(parents=True)
    files = model_files(model)
    for f in files:
        (folder / f.name).symlink_to(f.resolve())
    marker = folder / ".rigup-complete.json"
    marker.write_text(json.dumps({"files": [f.name for f in files], "bytes": sum(f.stat().st_size for f in files)}))
    return marker


def smoke_run(name: str, model: Path | None, hidden: bool, args: list[str], bindir: Path, work: Path,
              remedies: list[dict], timeout: int, compare: dict | None = None) -> dict:
    """One spec of roles/llama_cpp/shipped/smoke.py with one run: ``model`` (None: the tiny one) with
    ``args``; ``hidden``: CUDA_VISIBLE_DEVICES empty in its environment (the CPU alone); with
    ``compare`` (smoke.py's ``{bin, tolerance, rounds}``), its speed against that build too."""
    folder = work / "smoke" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run = {"name": name, "args": args}
    size = SMOKE_TINY.stat().st_size
    expected = str(SMOKE_TINY)
    if model is not None:
        marker = link_model(model, folder / "model")
        run["marker"] = str(marker)
        size = json.loads(marker.read_text())["bytes"]
        expected = os.path.normpath(marker.parent / model.name)   # as smoke.py's model_of spells it
    spec = {"key": f"check-{name}", "bin": str(bindir), "log": str(folder / "smoke.log"),
            "out": str(folder / "rigup-smoke.json"), "tiny": str(SMOKE_TINY), "timeout": timeout,
            "max_model_bytes": size, "runs": [run], "remedies": remedies}
    if compare:
        spec["compare"] = compare
    (folder / "spec.json").write_text(json.dumps(spec, indent=2))
    # the trace level prints the model buffers (CPU_REPACK, AMX, CUDA0) and the layers offloaded
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "LLAMA_ARG_LOG_VERBOSITY": "4"}
    if hidden:
        env["CUDA_VISIBLE_DEVICES"] = ""
    print(f"smoke {name}: {model or SMOKE_TINY} {' '.join(smoke.server_args(args))}"
          f"{' (CUDA_VISIBLE_DEVICES= : the CPU alone)' if hidden else ''}", flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(SMOKE_SCRIPT), str(folder / "spec.json")], env=env,
                              capture_output=True, text=True,
                              timeout=(timeout * (1 + len(remedies)) + 60) * (5 if compare else 1))
        lines = proc.stdout.strip().splitlines()
        doc = json.loads(lines[-1]) if lines else {}
        error = None if doc else f"smoke.py printed no result (exit {proc.returncode}): {proc.stderr[-1500:]}"
    except subprocess.TimeoutExpired:
        doc, error = {}, "smoke.py itself did not finish in time"
    except ValueError:
        doc, error = {}, f"smoke.py's last line is not JSON (exit {proc.returncode}): {proc.stdout[-500:]}"
    wall = round(time.monotonic() - start, 2)
    first = (doc.get("runs") or [{}])[0]
    log = Path(spec["log"]).read_text(errors="replace") if Path(spec["log"]).exists() else ""
    row = {"name": name, "model": first.get("model") or expected, "model_bytes": size,
           "gpu_hidden": hidden, "args": smoke.server_args(args), "ok": bool(doc.get("ok")) and not error,
           "seconds": doc.get("seconds"), "wall_seconds": wall, "tokens": first.get("tokens"),
           "phase": first.get("phase"), "signal": first.get("signal"), "exit": first.get("exit"),
           "reason": error or first.get("reason") or "", "remedy": first.get("remedy"), "first": first.get("first"),
           "traps": doc.get("traps", []), "server_args": doc.get("server_args", []),
           "remedies_offered": [r["id"] for r in remedies], "attempts": log_attempts(log),
           "compare": doc.get("compare"),
           "tail": first.get("tail") or [], "log": log}
    if doc and first.get("model") != expected:
        row.update(ok=False, reason=f"smoke.py loaded {first.get('model')}, not {expected}")
    return row


def smoke_markdown(r: dict) -> str:
    lines = [f"# rigup smoke inference on {r['gpu_name'] or 'the CPU alone'} ({r['date']})", "",
             f"Source: {r['source']}; {r['llama_cpp_version'].splitlines()[0] if r['llama_cpp_version'] else '?'}; "
             f"binaries {r['bin']}.", "", r["cpu_line"], "",
             f"llama.cpp's CPU features (system_info): `{r['system_info']}`", "",
             f"Remedies offered (roles/llama_cpp/traps.yml, by the CPU's flags): "
             f"{', '.join(x['id'] + ' ' + ' '.join(x['args']) for x in r['remedies']) or 'none'}.", "",
             "| run | model | flags | GPU hidden | ok | smoke s | tokens | model buffers MiB | offloaded | "
             "remedy needed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in r["runs"]:
        last = x["attempts"][-1] if x["attempts"] else {}
        buffers = ", ".join(f"{k} {v:g}" for k, v in last.get("buffers", {}).items()) or "-"
        remedy = f"yes: {x['remedy']} ({x['first']})" if x.get("remedy") else "no"
        ok = "yes" if x["ok"] else f"**no**: {x['reason']}"
        size = x["model_bytes"]
        size = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        lines.append(f"| {x['name']} | {Path(x['model']).name} ({size}) | "
                     f"`{' '.join(x['args'])}` | {'yes' if x['gpu_hidden'] else 'no'} | {ok} | {x['seconds']} | "
                     f"{x['tokens']} | {buffers} | {last.get('offloaded') or '-'} | {remedy} |")
    for x in r["skipped"]:
        lines.append(f"| {x['name']} | - | - | - | skipped: {x['why']} | - | - | - | - | - |")
    lines += ["", f"Remedy needed: {r['remedy_needed']}."]
    if r["gpu_settings_before"] is not None:
        lines += ["", f"GPU settings before: `{r['gpu_settings_before']}`",
                  f"GPU settings after:  `{r['gpu_settings_after']}`"]
    return "\n".join(lines) + "\n"


def cmd_smoke(args) -> None:
    """roles/llama_cpp/shipped/smoke.py against the build (or ``--bin``): see the module docstring."""
    args.work = args.work.resolve()      # smoke.py starts llama-server in /: every path absolute
    gpu = not args.cpu_only and gpu_present()
    before = gpu_settings() if gpu_present() else None
    facts = parse_hardware(sh(hardware_command([str(args.work if args.work.exists() else "/")])).splitlines())
    cpu = facts["cpu"]
    print(cpu_line(cpu), flush=True)
    if args.bin:
        bindir, build = args.bin.resolve(), None
    else:
        build = json.loads((args.work / "build.json").read_text())
        bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    if not (bindir / "llama-server").exists():
        sys.exit(f"no llama-server in {bindir}")
    out = args.out or ROOT / "tests" / "gpu" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{time.strftime('%Y-%m-%d')}-smoke"
    remedies = smoke_remedies(cpu)
    model_timeout = int(role_defaults("llama_cpp")["llama_cpp_smoke_timeout"])
    label = "8b" if args.model is None else "model"
    plan = [("tiny-gpu", None, False, ["-ngl", "99"], True),
            ("tiny-cpu", None, True, ["-ngl", "0"], False),
            ("tiny-cpu-no-repack", None, True, ["-ngl", "0", "--no-repack"], False),
            (f"{label}-gpu", "model", False, role_flags(99), True),
            (f"{label}-cpu", "model", True, role_flags(0), False)]
    only = set(args.only.split(",")) if args.only else None
    results = {"date": time.strftime("%Y-%m-%d"),
               "gpu_name": facts["gpus"][0]["name"] if gpu and facts["gpus"] else None,
               "driver": facts["driver"].get("version"), "build": build, "bin": str(bindir),
               "llama_cpp_version": sh(f"{shlex.quote(str(bindir / 'llama-server'))} --version 2>&1").strip(),
               "source": str(bindir) if args.bin else source_note(args.archive), "cpu": cpu, "cpu_line": cpu_line(cpu),
               "system_info": None, "remedies": remedies, "runs": [], "skipped": [], "remedy_needed": "no run ran",
               "gpu_settings_before": before, "gpu_settings_after": None}
    model = None

    def save() -> None:
        attempts = [a for x in results["runs"] for a in x["attempts"] if a.get("system_info")]
        results["system_info"] = attempts[0]["system_info"] if attempts else None
        needed = [f"{x['name']}: {x['remedy']} ({x['first']}; with {' '.join(x['server_args'])} it answered)"
                  for x in results["runs"] if x.get("remedy")]
        results["remedy_needed"] = "; ".join(needed) or ("no: no run crashed on a trap's signal" if results["runs"]
                                                         else "no run ran")
        Path(f"{stem}.json").write_text(json.dumps({**results, "runs": [{k: v for k, v in x.items() if k != "log"}
                                                                         for x in results["runs"]]}, indent=2))
        Path(f"{stem}.log").write_text("".join(f"\n===== {x['name']}\n{x['log']}" for x in results["runs"]))
        Path(f"{stem}.md").write_text(smoke_markdown(results))

    for name, which, hidden, flags, on_gpu in plan:
        if only is not None and name not in only:
            continue
        if on_gpu and not gpu:
            results["skipped"].append({"name": name, "why": "--cpu-only" if args.cpu_only else "no nvidia-smi"})
            continue
        if which == "model" and model is None:
            model = args.model.resolve() if args.model else args.work / MODEL_FILE
            if not model.exists() and args.model is None:
                cmd_model(args)
            if not model.exists():
                sys.exit(f"no model {model}")
        path = model if which == "model" else None
        if path is not None and hidden and sum(f.stat().st_size for f in model_files(path)) > CPU_MODEL_MAX_BYTES:
            size = sum(f.stat().st_size for f in model_files(path))
            results["skipped"].append({"name": name, "why": f"{size / 1e9:.1f} GB > 20 GB on the CPU alone"})
            continue
        row = smoke_run(name, path, hidden, flags, bindir, args.work, remedies,
                        TINY_TIMEOUT if path is None else model_timeout)
        results["runs"].append(row)
        last = row["attempts"][-1] if row["attempts"] else {}
        print(f"  {'ok' if row['ok'] else 'FAILED'} in {row['seconds']} s ({row['tokens']} tokens); buffers "
              f"{last.get('buffers')}; offloaded {last.get('offloaded')}; remedy {row['remedy'] or 'not needed'}"
              + ("" if row["ok"] else f": {row['reason']}"), flush=True)
        save()
    results["gpu_settings_after"] = gpu_settings() if before is not None else None
    save()
    print(smoke_markdown(results))
    print(f"wrote {stem}.json, .md and .log")
    if before != results["gpu_settings_after"]:
        sys.exit("GPU settings changed")
    if not results["runs"] or not all(x["ok"] for x in results["runs"]):
        sys.exit(1)


def slow_archive(base: Path, work: Path) -> Path:
    """WORK/llama.cpp-slow.tar.gz: ``base`` (lab-base's tree) with tests/lab/sources.py's
    lab-slow-decode patch (every generated token takes 5x its time), made once."""
    import tarfile
    import tempfile

    from tests.lab import sources

    out = work / "llama.cpp-slow.tar.gz"
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            with tarfile.open(base) as tar:
                tar.extractall(tmp, filter="data")
            (top,) = Path(tmp).iterdir()
            source = top / sources.CRASH_FILE
            source.write_text(sources.slowed(source.read_text()))
            with tarfile.open(f"{out}.part", "w:gz") as tar:
                tar.add(top, arcname=top.name)
        os.rename(f"{out}.part", out)
    return out


def cmd_slower(args) -> None:
    """issue 51's no-slower comparison (roles/llama_cpp/shipped/smoke.py's ``compare``, as the role runs it
    before ``current`` switches) on this machine: the build against itself (equal: it must pass)
    and the lab's tag lab-slow-decode (every generated token takes 5x its time; made from --archive with
    tests/lab/sources.py's patch and built first into WORK/slow) against the build (it must be refused, with its ratio), with the
    8B-shaped model and the role's flags on the GPU, and the tiny model on the CPU alone. Writes
    OUT/<date>-slower.json and .md; exit status 1 when a verdict is not the expected one."""
    args.work = args.work.resolve()
    before = gpu_settings() if gpu_present() else None
    base_build = json.loads((args.work / "build.json").read_text())
    slow_work = args.work / "slow"
    if not (slow_work / "build.json").exists():
        cmd_build(argparse.Namespace(work=slow_work, archive=slow_archive(args.archive.resolve(), slow_work)))
    slow_build = json.loads((slow_work / "build.json").read_text())
    base = args.work / "llama.cpp" / "builds" / base_build["id"] / "bin"
    slow = slow_work / "llama.cpp" / "builds" / slow_build["id"] / "bin"
    facts = parse_hardware(sh(hardware_command([str(args.work)])).splitlines())
    remedies = smoke_remedies(facts["cpu"])
    defaults = role_defaults("llama_cpp")
    against = {"bin": str(base), "tolerance": float(defaults["llama_cpp_slower_tolerance"]),
               "rounds": int(defaults["llama_cpp_compare_rounds"])}
    model = args.work / MODEL_FILE
    if gpu_present() and not model.exists():
        cmd_model(args)
    cases = [(f"{side}-{where}", binary, side == "equal", path, where == "cpu", flags)
             for where, path, flags in (("gpu", model, role_flags(99)), ("cpu", None, ["-ngl", "0"]))
             if where == "cpu" or gpu_present()
             for side, binary in (("equal", base), ("slow", slow))]
    rows = []
    for name, binary, expected, path, hidden, flags in cases:
        row = smoke_run(name, path, hidden, flags, binary, args.work, remedies,
                        TINY_TIMEOUT if path is None else int(defaults["llama_cpp_smoke_timeout"]), against)
        cmp = row.get("compare") or {}
        row["expected_ok"] = expected
        row["as_expected"] = row["ok"] == expected and "ratio" in cmp
        print(f"  {name}: {'passed' if row['ok'] else 'refused'}; ratio {cmp.get('ratio')} ({cmp.get('new_tps')} "
              f"against {cmp.get('current_tps')} tok/s){'' if row['as_expected'] else ' -- NOT AS EXPECTED: ' + (row['reason'] or cmp.get('skipped') or '')}",
              flush=True)
        rows.append({k: v for k, v in row.items() if k != "log"})
    after = gpu_settings() if before is not None else None
    doc = {"date": time.strftime("%Y-%m-%d"), "gpu_name": facts["gpus"][0]["name"] if facts["gpus"] else None,
           "driver": facts["driver"].get("version"), "cpu_line": cpu_line(facts["cpu"]), "base": base_build,
           "slow": slow_build, "tolerance": against["tolerance"], "rounds": against["rounds"], "runs": rows,
           "gpu_settings_before": before, "gpu_settings_after": after}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{doc['date']}-slower"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=2))
    lines = [f"# No slower: a new build's decode against the serving one's ({doc['gpu_name'] or 'CPU'}, {doc['date']})",
             "", "roles/llama_cpp/shipped/smoke.py's comparison, as the role runs it before `current` switches: server "
             f"sessions interleaved new, current ({against['rounds']} pairs), the best of 2 completions of "
             f"{smoke.MEASURE_PREDICT} tokens each; tolerance {against['tolerance']}. Base: tag lab-base "
             f"(build {base_build['id']}); slow: tag lab-slow-decode (every generated token takes 5x its time; build "
             f"{slow_build['id']}).", "", doc["cpu_line"], "",
             "| case | model | flags | verdict | expected | ratio | new tok/s | current tok/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cmp = r.get("compare") or {}
        lines.append(f"| {r['name']} | {Path(r['model']).name} | `{' '.join(r['args'])}` | "
                     f"{'switches' if r['ok'] else 'refused'} | {'switches' if r['expected_ok'] else 'refused'} | "
                     f"{cmp.get('ratio')} | {cmp.get('new_tps')} | {cmp.get('current_tps')} |")
    lines += ["", f"GPU settings before: `{before}`", f"GPU settings after:  `{after}`"]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if before != after:
        sys.exit("GPU settings changed")
    if not all(r["as_expected"] for r in rows):
        sys.exit(1)


LINK_FIELDS = ("index,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.gen.gpumax,"
               "pcie.link.gen.hostmax,pcie.link.width.current,pcie.link.width.max")


def cmd_health(args) -> None:
    """Every card's PCIe link against its maxima (rigup.gpu.plan.link_state; idle, so the
    generation is not judged) and the kernel log's Xid events per card (shipped.xid, from the
    journal or dmesg, as the guard reads them); writes OUT/health.json. Reads only."""
    from shipped import xid
    from rigup.gpu.catalogue import xid_codes
    from rigup.gpu.plan import link_state

    before = gpu_settings()
    cards = []
    for line in sh(f"nvidia-smi --query-gpu={LINK_FIELDS} --format=csv,noheader,nounits").strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        num = [int(c) if c.isdigit() else None for c in cells]
        index, bus, gen, gen_max, gpu_max, host_max, width, width_max = cells[0], cells[1], *num[2:]
        state = link_state(gen, gen_max, width, width_max)
        cards.append({"index": index, "bus_id": bus, "card": xid.card_key(bus), "raw": cells, **state,
                      "gen_gpumax": gpu_max, "gen_hostmax": host_max})
    log = sh(xid.KERNEL_LOG_COMMAND)
    nvrm = sh("(journalctl -k --no-pager 2>/dev/null || dmesg 2>/dev/null) | grep -c 'NVRM' || true").strip()
    found = xid.events(log.splitlines(), xid_codes())
    after = gpu_settings()
    result = {"cards": cards, "kernel_log_nvrm_lines": int(nvrm or 0), "xid_events": found,
              "xid_counts": xid.counts(found), "settings_before": before, "settings_after": after}
    for c in cards:
        print(f"GPU {c['index']} {c['bus_id']}: {c['link']}{' DOWNTRAINED ' + c['why'] if c['downtrained'] else ''} "
              f"(raw {', '.join(c['raw'][2:])})")
    print(f"kernel log: {result['kernel_log_nvrm_lines']} NVRM lines, {len(found)} Xid events: {result['xid_counts']}")
    print(f"GPU settings before: {before}\nGPU settings after:  {after}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "health.json").write_text(json.dumps(result, indent=1) + "\n")
    if before != after:
        sys.exit("GPU settings changed")


def cmd_plan(args) -> None:
    """The plan, the cmake line and the serving drop-in, built and run nowhere (no GPU needed)."""
    facts, plan = facts_and_plan()
    print(format_plan(plan))
    print("cmake " + " ".join(f"-D{o}" for o in cmake_options(plan, build_data(args.archive, args.work))))
    print(dropin_text("bench", RECIPE, "/opt/llama-server", "/srv/model.gguf", build="plan", unit_sha="-",
                      model_revision="-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("plan", "build", "model", "serve", "bench", "smoke", "health", "tune",
                                         "compare", "report", "admission", "router", "slower", "pinned"))
    parser.add_argument("--archive", type=Path, default=ROOT / ".gpu" / "llama.cpp.tar.gz")
    parser.add_argument("--work", type=Path, default=Path("/root/rigup-gpu"))
    parser.add_argument("--out", type=Path, default=None,
                        help="serve, bench: default $OUT or /tmp/rigup-gpu-out; smoke: tests/gpu/results")
    parser.add_argument("--bin", type=Path, help="smoke: llama.cpp binaries to use instead of build.json's")
    parser.add_argument("--model", type=Path, help="smoke: the big model (default: model's 8B-shaped GGUF); report: compare's .json")
    parser.add_argument("--cpu-only", action="store_true", help="smoke: skip the GPU runs")
    parser.add_argument("--only", help="smoke: these runs alone, by name, comma-separated")
    parser.add_argument("--budget", type=float, default=420, help="tune: seconds the sweep may take")
    parser.add_argument("--ngl", type=int, help="tune: start from -ngl N (part of the model in host RAM)")
    parser.add_argument("--levels", help="tune: the concurrencies each point is measured at (default 1,8,16,32)")
    args = parser.parse_args()
    if args.out is None and args.step != "smoke":
        args.out = Path(os.environ.get("OUT", "/tmp/rigup-gpu-out"))
    {"plan": cmd_plan, "build": cmd_build, "model": cmd_model, "serve": cmd_serve, "bench": cmd_bench,
     "smoke": cmd_smoke, "health": cmd_health, "tune": cmd_tune, "compare": cmd_compare,
     "report": cmd_report, "admission": cmd_admission, "router": cmd_router,
     "slower": cmd_slower, "pinned": cmd_pinned}[args.step](args)


if __name__ == "__main__":
    main()
