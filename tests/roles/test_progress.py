"""Progress lines for long work (rigup/progress.py): a llama.cpp build on a lab host prints, per
host, make's progress every RIGUP_PROGRESS_INTERVAL_S seconds (15 by default; 3 here, since the
build of a new build id is mostly ccache hits in the lab) while the converge waits for it, and
how long it took."""

import re

import pytest

from tests.converge import pyinfra

pytestmark = pytest.mark.lab
INTERVAL_S = 3
# an option the build ignores: a new build id, the same compile commands (ccache hits)
NEW_ID = ("--data", 'llama_cpp_cmake_options=["RIGUP_LAB_PROGRESS=1"]')


def build(host: str, *args: str):
    run = pyinfra("inventory/lab.py", "tests/roles/steps_only.py", "--limit", host, *args,
                  env={"RIGUP_LAB_STEPS": "base.apply,llama_cpp.apply", "RIGUP_PROGRESS_INTERVAL_S": str(INTERVAL_S)})
    assert run.returncode == 0, run.output[-4000:]
    return run


def test_a_build_prints_its_progress_per_host(lab):
    host = lab.hosts()[0]["name"]
    try:
        run = build(host, *NEW_ID)
    finally:
        build(host)   # current back to the default build (no build)
    head = rf"\[{host}\] llama\.cpp build lab-base-[0-9a-f]{{10}}: "
    seen = re.findall(head + r"(.+) \((\d+) s\)", run.output)
    done = re.findall(head + r"done in (\d+) s", run.output)
    print(f"\nbuild alone: {run.seconds:.0f} s; progress lines of {host} (every {INTERVAL_S} s):\n"
          + "\n".join(f"  {s:>4} s  {p}" for p, s in seen) + f"\ndone in {done[0] if done else '?'} s")
    assert done and int(done[0]) > 2 * INTERVAL_S, "the build was too short to show its progress"
    times = [int(s) for _, s in seen]
    assert len(seen) >= int(done[0]) // INTERVAL_S - 2
    assert all(b - a >= INTERVAL_S - 1 for a, b in zip(times, times[1:]))
    percents = [int(p.rstrip("%")) for p, _ in seen if re.fullmatch(r"\d+%", p)]
    assert percents and percents == sorted(percents) and percents[-1] <= 100
