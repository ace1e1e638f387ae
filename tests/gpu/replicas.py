"""Replicas on a real multi-GPU machine (no pyinfra, no systemd): the plan of roles/llama_server
for the 8B-shaped model with ``replicas: auto``, each replica started with exactly the argv and
environment the role renders (roles/llama_server/command.py ``replica_commands``), against one
server split over every GPU (the seeds' way, the role's single-server ExecStart); total tok/s at
1, 8 and 16 concurrent requests of 400 tokens. Requests go through HAProxy with the config
roles/balancer renders when its .debs are carried in .gpu/debs (else spread by the client, and
the results say so). Reads GPU settings only, before and after.

    python3 tests/gpu/replicas.py --work /root/rigup-gpu --out $OUT   (after check.py build + model)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402  (the build, the model, the load and the settings readers; pyinfra stood in)

ROOT = check.ROOT
replicas = check.load("roles/llama_server/replicas.py")
command = check.load("roles/llama_server/command.py")
CONCURRENCY = (1, 8, 16)


def load(ports: list[int], n: int, tokens: int = 400) -> dict:
    """``n`` concurrent chat completions, request i to ``ports[i % len(ports)]``: total tok/s."""
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda i: check.chat(ports[i % len(ports)], tokens), range(n)))
    wall = time.monotonic() - start
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    return {"concurrent": n, "tokens": generated, "seconds": round(wall, 2), "total_tps": round(generated / wall, 1)}


def start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "NCCL_NVLS_ENABLE": "0", **env})


def healthy(port: int, seconds: float = 600) -> float:
    begun = time.monotonic()
    while time.monotonic() - begun < seconds:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - begun
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"no /health 200 on port {port} in {seconds} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGINT)
    for p in procs:
        p.wait(timeout=60)


def haproxy(out: Path, frontend_port: int, backends: list[int]) -> tuple[list, subprocess.Popen | None, str]:
    """HAProxy from the carried .debs with roles/balancer's config, or None and why not."""
    debs = sorted((ROOT / ".gpu" / "debs").glob("*.deb"))
    if not debs:
        return [], None, "no .debs carried: requests spread by the client"
    root = Path("/root/rigup-haproxy")
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    binary = root / "usr/sbin/haproxy"
    libs = ":".join(str(p) for p in (root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu"))
    config = out / "haproxy.cfg"
    config.write_text(balancer_config(frontend_port, backends))
    env = {**os.environ, "LD_LIBRARY_PATH": libs}
    checked = subprocess.run([str(binary), "-c", "-f", str(config)], env=env, capture_output=True, text=True)
    if checked.returncode:
        return [], None, f"haproxy -c failed: {checked.stdout[-500:]}{checked.stderr[-500:]}"
    proc = subprocess.Popen([str(binary), "-db", "-f", str(config)], env=env, start_new_session=True,
                            stdout=(out / "haproxy.log").open("w"), stderr=subprocess.STDOUT)
    healthy(frontend_port, 30)
    return [frontend_port], proc, f"through HAProxy {subprocess.run([str(binary), '-v'], env=env, capture_output=True, text=True).stdout.split()[2]}"


def balancer_config(port: int, backends: list[int]) -> str:
    """roles/balancer's haproxy.cfg for the replicas, less what needs Debian's haproxy user and
    directories (chroot, user, group; the admin socket goes to /tmp): the machine has neither."""
    config = check.load("roles/balancer/config.py")
    text = config.haproxy_cfg([{"name": "bench", "bind": "127.0.0.1", "port": port,
                                "servers": [[f"bench-{k}", "127.0.0.1", p] for k, p in enumerate(backends)]}],
                              check.role_defaults("balancer"))
    keep = [line for line in text.splitlines() if line.split()[:1] not in (["chroot"], ["user"], ["group"], ["log"])]
    return "\n".join(keep).replace("/run/haproxy/admin.sock", "/tmp/rigup-haproxy.sock") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/root/rigup-gpu"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/rigup-gpu-out")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    before = check.gpu_settings()
    facts, plan = check.facts_and_plan()
    build = json.loads((args.work / "build.json").read_text())
    binary = str(args.work / "llama.cpp" / "builds" / build["id"] / "bin" / "llama-server")
    model_path = args.work / "llama-8b-shape-f16.gguf"
    data = {**check.role_defaults("llama_cpp"), "llama_cpp_backend": "cuda", "gpu_enabled": True,
            "cmpunlocker_enabled": False}
    model = {"repo": "rigup-gpu/llama-8b-shape", "size_gib": round(model_path.stat().st_size / 2**30, 2),
             "family": None}
    inst = {**check.RECIPE, "replicas": "auto", "gpus_per_replica": "auto"}
    lay = replicas.layout(inst, model, plan, data)
    plan_line = replicas.layout_text("bench", lay)
    print(plan_line, flush=True)
    results = {"date": time.strftime("%Y-%m-%d"), "gpus": len(plan["cards"]), "plan": plan_line,
               "model_gib": model["size_gib"], "gpu_settings_before": before, "runs": {}}
    single = command.replica_commands("bench", {**check.RECIPE, "replicas": 1, "gpus_per_replica": None},
                                      replicas.layout({**inst, "replicas": 1, "gpus_per_replica": None},
                                                      model, plan, data), binary, str(model_path))[0]
    proc = start(single["argv"], single["env"], args.out / "single.log")
    try:
        results["single_ready_s"] = round(healthy(check.RECIPE["port"]), 1)
        check.chat(check.RECIPE["port"], 16)
        results["runs"]["one server over every GPU"] = [load([check.RECIPE["port"]], n) for n in CONCURRENCY]
    finally:
        stop([proc])
    servers = command.replica_commands("bench", inst, lay, binary, str(model_path))
    results["replica_commands"] = servers
    procs = [start(s["argv"], s["env"], args.out / f"{s['unit']}.log") for s in servers]
    ports = [int(s["argv"][s["argv"].index("--port") + 1]) for s in servers]
    lb = None
    try:
        for port in ports:
            healthy(port)
            check.chat(port, 16)
        front, lb, how = haproxy(args.out, check.RECIPE["port"], ports)
        results["replicas_how"] = how
        results["runs"][f"{len(servers)} replicas ({how})"] = [load(front or ports, n) for n in CONCURRENCY]
    finally:
        stop(procs + ([lb] if lb else []))
    after = check.gpu_settings()
    results["gpu_settings_after"] = after
    one, many = results["runs"].values()
    results["ratio_at_16"] = round(many[-1]["total_tps"] / one[-1]["total_tps"], 2)
    (args.out / "replicas.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "replica_commands"}, indent=1))
    if before != after:
        sys.exit("GPU settings changed")


if __name__ == "__main__":
    main()
