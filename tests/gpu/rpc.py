"""llama.cpp RPC on a real multi-GPU machine (no pyinfra, no systemd): llama-server on GPU 0 with
its layers split over an RPC worker on GPU 1 (two processes, loopback), each started with the
argv and environment the roles render (roles/llama_server/command.py ``argv`` with ``rpc``,
roles/rpc_worker/command.py ``argv``), against one server split over both GPUs locally (the
role's single-server ExecStart); ready time and total tok/s at 1 and 8 concurrent requests of
400 tokens. Reads GPU settings only, before and after.

    python3 tests/gpu/rpc.py --work /root/rigup-gpu --out $OUT   (after check.py build + model)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402  (the build, the model, the chat client and the settings readers)
from replicas import healthy, load, start, stop  # noqa: E402

command = check.load("roles/llama_server/command.py")
worker = check.load("roles/rpc_worker/command.py")
CONCURRENCY = (1, 8)
RPC_PORT = 50052


def measure(label: str, procs_argv: list[tuple[list[str], dict, str]], out: Path, results: dict) -> None:
    """Start ``procs_argv`` ([(argv, env, log name)], the last one the llama-server), time its
    /health, measure every level of CONCURRENCY, stop them all."""
    procs = []
    try:
        for argv, env, log in procs_argv[:-1]:
            procs.append(start(argv, env, out / log))
        time.sleep(2)   # the worker listens before the head connects (the role's ExecStartPre waits)
        argv, env, log = procs_argv[-1]
        procs.append(start(argv, env, out / log))
        ready = round(healthy(check.RECIPE["port"]), 1)
        check.chat(check.RECIPE["port"], 16)
        results["runs"][label] = {"ready_s": ready, "argv": [a for a, _, _ in procs_argv],
                                  "env": [e for _, e, _ in procs_argv],
                                  "load": [load([check.RECIPE["port"]], n) for n in CONCURRENCY]}
        print(label, json.dumps(results["runs"][label]["load"]), f"ready in {ready} s", flush=True)
    finally:
        stop(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/root/rigup-gpu"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/rigup-gpu-out")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    before = check.gpu_settings()
    build = json.loads((args.work / "build.json").read_text())
    bindir = args.work / "llama.cpp" / "builds" / build["id"] / "bin"
    model_path = str(args.work / "llama-8b-shape-f16.gguf")
    server = str(bindir / "llama-server")
    results = {"date": time.strftime("%Y-%m-%d"), "model_gib": round(Path(model_path).stat().st_size / 2**30, 2),
               "gpu_settings_before": before, "runs": {}}
    local = command.argv("bench", check.RECIPE, server, model_path)
    measure("one server over GPU 0 and 1", [(local, {"CUDA_VISIBLE_DEVICES": "0,1"}, "local.log")], args.out, results)
    rpc_worker = worker.argv(str(bindir), "127.0.0.1", RPC_PORT)
    head = command.argv("bench", check.RECIPE, server, model_path, rpc=[f"127.0.0.1:{RPC_PORT}"])
    measure("head on GPU 0 + RPC worker on GPU 1", [(rpc_worker, {"CUDA_VISIBLE_DEVICES": "1"}, "worker.log"),
                                                    (head, {"CUDA_VISIBLE_DEVICES": "0"}, "head.log")],
            args.out, results)
    after = check.gpu_settings()
    results["gpu_settings_after"] = after
    one, rpc = (r["load"] for r in results["runs"].values())
    results["rpc_vs_local"] = {str(a["concurrent"]): round(b["total_tps"] / a["total_tps"], 3) for a, b in zip(one, rpc)}
    (args.out / "rpc.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
    if before != after:
        sys.exit("GPU settings changed")


if __name__ == "__main__":
    main()
