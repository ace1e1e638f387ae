"""`make bench-overlap`: downloads start before the llama.cpp build (roles/__init__.py STEPS), so
bare host to serving takes about max(build, download) + the model's load, not their sum (issue 18).

On lab hosts of profile none (no GPU, a CPU build of the lab's llama.cpp mirror), one thing at a
time, with ccache off (``llama_cpp_ccache=false``): with the lab's shared ccache a fresh host's
build is all cache hits and takes about 25 s, and the overlap would hardly show:

- (a) lab1, bare: deploy.py without the model (``models`` and ``llama_server_instances`` empty):
  base, the build tools, the llama.cpp build and every other role; the hub is then rate-limited
  (tests/lab/hub.py ``rate``, per stream) so that the model's download takes about the build's own
  time (its ``done in`` line, rigup/progress.py);
- (b) lab1 again: the download alone (tests/roles/steps_only.py: model_fetch apply + waited);
- (c) lab2, bare: deploy.py, bare host to serving (llama-server's health gate passed);
- load: llama-server restarted on lab2, until it answers a one-token completion (its gate in (c)
  waits for /health 200, then one real answer).

Prints a table, asserts c <= 1.1 x (max(a, b) + load), prints a + b + load for contrast, and writes
tests/bench/results/<date>-overlap.{md,json}. Tears the lab down.

    RIGUP_LAB_ID=21 .venv/bin/python -m tests.bench_overlap

Needs root (the lab).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from datetime import date
from pathlib import Path

from tests.converge import PYINFRA, ROOT, Run
from tests.lab import hub, lab, models, sources

RESULTS = ROOT / "tests" / "bench" / "results"
PLAY = "tests/roles/steps_only.py"
FETCH = "model_fetch.apply,model_fetch.waited"
COLD = ("--data", "llama_cpp_ccache=false")
NO_MODEL = ("--data", "models={}", "--data", "llama_server_instances={}")
UNIT, PORT = "rigup-llama@gemma.service", 8081
MARGIN = 1.1
LOGS = Path("/tmp/bench-overlap")  # each converge's output, timed


def converge(host: str, playbook: str, steps: str | None = None, *args: str) -> Run:
    """One converge of ``playbook`` on ``host`` alone (``args``: more of pyinfra's arguments);
    fails with its output. Its output, each line with the seconds since the start, is kept in
    LOGS (where the time of a converge went)."""
    env = {**os.environ, **({"RIGUP_LAB_STEPS": steps} if steps else {})}
    start = time.monotonic()
    proc = subprocess.Popen([PYINFRA, "-y", "inventory/lab.py", playbook, "--limit", host, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    lines = [f"{time.monotonic() - start:7.1f} {line}" for line in proc.stdout]
    run = Run(proc.wait(), "".join(line[8:] for line in lines), time.monotonic() - start)
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"{host}-{len(list(LOGS.iterdir())):02d}.log").write_text("".join(lines))
    if run.returncode:
        raise RuntimeError(f"{host}: {playbook} {steps or ''} failed:\n{run.output[-4000:]}")
    return run


def build_seconds(run: Run, host: str) -> int:
    """The build's own time, from its last progress line (rigup/progress.py ``done in``)."""
    m = re.search(rf"\[{host}\] llama\.cpp build \S+: done in (\d+) s", run.output)
    if not m:
        raise RuntimeError(f"no build on {host}:\n{run.output[-3000:]}")
    return int(m[1])


def load_seconds(host: str) -> float:
    """llama-server restarted: seconds until it answers a one-token completion (what its health
    gate waits for in (c): /health 200, then one real answer)."""
    body = shlex.quote(json.dumps({"prompt": "Hello", "max_tokens": 1}))
    out = lab.ssh(host, f"s=$(date +%s.%N); systemctl restart {UNIT}; "
                        f"until curl -sf -o /dev/null -H 'Content-Type: application/json' -d {body} "
                        f"http://127.0.0.1:{PORT}/v1/completions; do sleep 0.2; done; "
                        "e=$(date +%s.%N); python3 -c \"print($e - $s)\"", timeout=600)
    if out.returncode:
        raise RuntimeError(f"{host}: llama-server did not come back: {out.stdout}{out.stderr}")
    return float(out.stdout.strip())


def write_results(figures: dict, results: Path = RESULTS) -> Path:
    """The figures as JSON and a Markdown table next to the other bench results; their stem."""
    stem = results / f"{date.today().isoformat()}-overlap"
    stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    f = figures
    rows = [(f"(a) bare host to converged without the model (the build alone: {f['build_s']} s, ccache off)",
             f["a_s"]),
            (f"(b) the download alone ({f['model_mib']:.0f} MiB at {f['rate_kib_s']:.0f} KiB/s, one stream)",
             f["b_s"]),
            ("(c) bare host to serving, deploy.py (download and build overlap)", f["c_s"]),
            ("load: llama-server restart to its first answer (what its health gate waits for)", f["load_s"]),
            (f"max(a, b) + load (c must be <= {MARGIN} x this)", f["max_plus_load_s"]),
            ("a + b + load (one after the other, for contrast)", f["sum_s"])]
    width = max(len(r[0]) for r in rows)
    table = "\n".join([f"| {'what':<{width}} | seconds |", f"|{'-' * (width + 2)}|---------|"]
                      + [f"| {w:<{width}} | {s:7.1f} |" for w, s in rows])
    stem.with_suffix(".md").write_text(
        f"# Download and build overlap, bare host to serving ({date.today().isoformat()})\n\n"
        "`make bench-overlap` (tests/bench_overlap.py), on lab hosts (profile none, CPU build of the\n"
        "lab's llama.cpp mirror, Gemma 3 270M Q4_K_M from the lab hub) of a 2-core machine shared\n"
        "with other work (its load average was high during the run); one run, one thing at a time.\n"
        "(a) is deploy.py without the model (`models` and `llama_server_instances` empty), so the\n"
        "roles other than the build are in (a) as in (c). The builds ran with ccache off: with the\n"
        "lab's shared ccache a fresh host's build is all cache hits (about 25 s) and the overlap would\n"
        "hardly show. The hub was rate-limited per stream so that the download takes about as long\n"
        "as the build. deploy.py starts the download (model_fetch.apply) before the build and waits\n"
        "for it (model_fetch.waited) after. Where each converge's time went: /tmp/bench-overlap/*.log\n"
        "(each line with its second); in (c) the download ran during the build tools' apt install and\n"
        "the build, so c - a is the serving part: llama-server's unit and gate, and the metrics.\n\n"
        f"{table}\n\n"
        f"c / (max(a, b) + load) = {f['ratio']:.2f} (goal <= {MARGIN}); "
        f"c / (a + b + load) = {f['c_s'] / f['sum_s']:.2f}.\n")
    return stem


def main() -> None:
    shutil.rmtree(LOGS, ignore_errors=True)
    lab.down()
    try:
        lab.up(2, "none")
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        hub.rate(0)
        a = converge("lab1", "deploy.py", None, *COLD, *NO_MODEL)
        build = build_seconds(a, "lab1")
        size = models.gemma_270m().stat().st_size
        bps = size / max(build, 1)
        hub.rate(int(bps))
        print(f"(a) {a.seconds:.0f} s (build {build} s); hub rate {bps / 1024:.0f} KiB/s", flush=True)
        b = converge("lab1", PLAY, FETCH)
        print(f"(b) {b.seconds:.0f} s", flush=True)
        c = converge("lab2", "deploy.py", None, *COLD)
        print(f"(c) {c.seconds:.0f} s", flush=True)
        load = load_seconds("lab2")
    finally:
        lab.down()
    peak = max(a.seconds, b.seconds) + load
    figures = {"a_s": round(a.seconds, 1), "build_s": build, "b_s": round(b.seconds, 1), "c_s": round(c.seconds, 1),
               "load_s": round(load, 1), "model_mib": round(size / 2**20, 1), "rate_kib_s": round(bps / 1024, 1),
               "max_plus_load_s": round(peak, 1), "sum_s": round(a.seconds + b.seconds + load, 1),
               "ratio": round(c.seconds / peak, 3), "ccache": False}
    stem = write_results(figures)
    print(stem.with_suffix(".md").read_text())
    print(f"written: {stem}.md, {stem}.json")
    assert c.seconds <= MARGIN * peak, f"c = {c.seconds:.0f} s > {MARGIN} x (max(a, b) + load) = {MARGIN * peak:.0f} s"


if __name__ == "__main__":
    main()
