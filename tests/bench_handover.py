"""`make bench-handover`: llama.cpp builds handed from host to host (issue 51), in one run, on lab
hosts of profile none (a CPU build of the lab's llama.cpp mirror, Gemma 3 270M from the lab hub),
with ccache off (``llama_cpp_ccache=false``: with the lab's shared ccache every build after the
first is all cache hits):

- (a) lab1 alone, bare host to serving, the controller's cache of builds empty: it compiles;
- (b) lab2..lab5, four bare hosts of the same profile in one converge, the cache emptied again:
  lab2 compiles, the three others receive its build (roles/llama_cpp/handover.py);
- (c) lab6, bare host to serving with the controller's cache warm (the build of (b)): it receives.

Prints a table, asserts b <= 1.1 x a (goal of issue 51), prints c / a (a kind already built
against a cold one), and writes tests/bench/results/<date>-handover.{md,json}. Tears the lab down.

    RIGUP_LAB_ID=21 .venv/bin/python -m tests.bench_handover

Needs root (the lab).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

from tests.bench_overlap import RESULTS
from tests.converge import PYINFRA, ROOT
from tests.lab import hub, lab, models, sources

COLD = ("--data", "llama_cpp_ccache=false")
MARGIN = 1.1


def converge(hosts: list[str]) -> tuple[float, str]:
    """deploy.py on ``hosts`` at once, ccache off: (seconds, output); fails with its output."""
    limits = [a for h in hosts for a in ("--limit", h)]
    start = time.monotonic()
    done = subprocess.run([PYINFRA, "-y", "inventory/lab.py", "deploy.py", *limits, *COLD], cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, env=dict(os.environ))
    seconds = time.monotonic() - start
    log = Path(tempfile.gettempdir()) / f"rigup-bench-handover-{'-'.join(hosts)}.log"
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"{hosts}: deploy.py failed (its whole output: {log}):\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, done.stdout + done.stderr


def came(output: str, host: str) -> str:
    """How ``host``'s build came: compiled, or received (from whom)."""
    line = next((ln for ln in output.splitlines() if f"[{host}] llama.cpp " in ln and "received from" in ln), None)
    return line.split("received from ")[1].split()[0] if line else "compiled"


def main() -> None:
    lab.down()
    cache = lab.STATE / "artifacts"
    try:
        lab.up(6, "none")
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        a, out_a = converge(["lab1"])
        print(f"(a) lab1 alone: {a:.0f} s", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        fleet = ["lab2", "lab3", "lab4", "lab5"]
        b, out_b = converge(fleet)
        how = {h: came(out_b, h) for h in fleet}
        print(f"(b) {', '.join(fleet)} at once: {b:.0f} s ({how})", flush=True)
        c, out_c = converge(["lab6"])
        print(f"(c) lab6, cache warm: {c:.0f} s ({came(out_c, 'lab6')})", flush=True)
    finally:
        lab.down()
    figures = {"a_s": round(a, 1), "b_s": round(b, 1), "c_s": round(c, 1), "b_over_a": round(b / a, 3),
               "c_over_a": round(c / a, 3), "fleet": how, "lab6": came(out_c, "lab6"), "ccache": False}
    stem = RESULTS / f"{date.today().isoformat()}-handover"
    stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    stem.with_suffix(".md").write_text(
        f"# llama.cpp builds handed between hosts ({date.today().isoformat()})\n\n"
        "`make bench-handover` (tests/bench_handover.py): lab hosts of profile none on a 2-core machine,\n"
        "bare host to serving (deploy.py), ccache off, one run.\n\n"
        "| what | seconds |\n|---|---|\n"
        f"| (a) lab1 alone, compiles (cache empty) | {a:.1f} |\n"
        f"| (b) 4 hosts at once: {', '.join(f'{h} {w}' for h, w in how.items())} | {b:.1f} |\n"
        f"| (c) lab6 alone, the controller's cache warm ({figures['lab6']}) | {c:.1f} |\n\n"
        f"b / a = {b / a:.2f} (goal <= {MARGIN}); c / a = {c / a:.2f}.\n")
    print(stem.with_suffix(".md").read_text())
    assert figures["lab6"] != "compiled" and sum(w != "compiled" for w in how.values()) == 3, figures
    assert b <= MARGIN * a, f"b = {b:.0f} s > {MARGIN} x a = {MARGIN * a:.0f} s"


if __name__ == "__main__":
    main()
