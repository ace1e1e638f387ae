"""`make test`: the whole suite in two lanes at once, each on a lab of its own (issue 45).

The lab tests are CPU-bound in bursts (converges, builds) and wait the rest of the time (timers,
reboots, stalls, a watchdog's checks): one lane kept the 2-core machine 1.1 cores busy on
average. Lane B runs the modules that mostly wait (WAITING, each on hosts it converges itself)
on a second lab, RIGUP_LAB_ID=LANE_B_LAB (its own hosts, bridge and hub; the base root, the
ccache and, through its apt-cacher-ng, the package cache shared with the first); lane C the modules
of OWN_HOSTS on a third (LANE_C_LAB); lane A runs everything else, the unit tests first. Lane A's
output streams; lane B's and lane C's logs follow it (and are kept in LOG and LOG_C). Exit status:
non-zero when any lane failed.

    .venv/bin/python -m tests.lanes [pytest arguments for both lanes]
    .venv/bin/python -m pytest tests/roles/test_gpu_guard.py      # one module alone, one lab
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANE_B_LAB = "9"
LANE_C_LAB = "8"
LOG = Path(tempfile.gettempdir()) / "rigup-test-lane-b.log"
LOG_C = Path(tempfile.gettempdir()) / "rigup-test-lane-c.log"
# the modules that wait more than they compute (make test's per-module table: wall over CPU); one
# lane of everything took 49 min on warm caches; two lanes 34.5 (A) and 20 (B), then with the last
# four moved 34.7 and 31.1 (35.1 for bash .ci/run); with more tests, 50.1 (A) and 33.1 (B), so the
# smoke module (6.7 min of lane A, most of it its slow build's sessions) moved too
WAITING = [f"tests/roles/test_{m}.py" for m in (
    "gpu_guard", "fetch_faults", "vllm", "llama_server", "metrics", "model_fetch_nosystemd", "model_fetch",
    "watchdog_reboot", "rpc", "watchdog_faults", "watchdog", "status", "model_fetch_metrics", "gate_faults",
    # and, so that both lanes end near the same time, some that compute (apt, dkms, Ray, builds)
    "cuda_toolkit", "cmpunlocker", "ray", "nvidia_driver", "router_fleet", "smoke",
    # issue 63's pinned router model: one host, 91 s alone (lane A about 43 min, B 40 before it)
    "router_pinned",
    # issue 65's watchers: one host of its own, checks run one at a time (3.4 min; its one real router builds llama.cpp)
    "watchers",
    # the tuner (issue 63 added a router's sweep, about 3 min): lane A had grown by the burn-in's
    # pulse and schedule and the roll killed midway
    "tune")]
# Two lanes kept the 2 cores 1.5 busy on average (CI at 988f035: 3,469 s of the machine's CPU in 2,289 s of
# lane B's wall; 42.5 min for the run): a third lane fills what the waits of the two leave idle. Lane C
# takes modules that converge hosts of their own and none of the session's shared converges (conftest.py
# first_converge), so the third lab costs its boot alone: about 19 of lane A's and B's 35 min moved (their
# walls at 42e7d0d in two lanes: A 1,611 s left, B 1,393, C 1,164).
OWN_HOSTS = [f"tests/roles/test_{m}.py" for m in (
    "watchdog_reboot", "watchdog_faults", "router_pinned", "model_fetch", "model_fetch_nosystemd", "gpu_guard", "vllm",
    "ray", "router", "preflight", "gpu_power", "burnin", "base_fleet", "bench_llama", "progress")]
WAITING = [m for m in WAITING if m not in OWN_HOSTS]
# issue 65's kill points a burn-in, a build switch and a sweep long (about 6 min of the two lanes at
# 14c3916, when both ran past 47 min): make bench-faults, one lab (FAULTS)
FAULTS = ["tests/roles/test_roll.py", "tests/roles/test_kill_switch.py", "tests/roles/test_tune.py"]


# CI gives the whole run 90 minutes: a lane still running at 78 is interrupted as ctrl-C does (pytest
# prints the test and the line it was in, and its labs are torn down), so a hang fails with its place
# named instead of timing CI out with nothing said.
DEADLINE_S = 78 * 60


def stop(lanes: list[subprocess.Popen]) -> None:
    """SIGINT each lane still running (pytest's own interrupt: its lab is torn down), then wait; a
    lane still there after 5 minutes is killed."""
    for lane in lanes:
        if lane.poll() is None:
            lane.send_signal(signal.SIGINT)
    for lane in lanes:
        try:
            lane.wait(timeout=300)
        except subprocess.TimeoutExpired:
            lane.kill()
            lane.wait()


def main(args: list[str]) -> int:
    missing = [m for m in WAITING + OWN_HOSTS if not (ROOT / m).exists()]
    if missing:
        print(f"tests/lanes.py: no such module: {', '.join(missing)}", file=sys.stderr)
        return 2
    # a shell's background job (nohup ... &) starts with SIGINT ignored, and an ignored signal stays
    # ignored across exec: the lanes' pytest would not stop at the deadline, nor a stand-in server at
    # its SIGINT (each waited 15 s to be killed: 4.5 minutes of tests/unit/test_smoke.py)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    python = sys.executable
    # issue 65's longer kill points (pytest.ini's faults marker) run in make bench-faults; a -m of the
    # caller's own comes after this one, and pytest takes the last
    args = ["-m", "not faults", *args]
    start = time.monotonic()
    deadline = start + float(os.environ.get("RIGUP_TEST_DEADLINE_S", DEADLINE_S))
    behind = [("B", LANE_B_LAB, WAITING, LOG), ("C", LANE_C_LAB, OWN_HOSTS, LOG_C)]   # each logged, shown after A
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(open(log, "w")) for *_, log in behind]
        lanes = [subprocess.Popen([python, "-m", "pytest", *(f"--ignore={m}" for m in WAITING + OWN_HOSTS), *args],
                                  cwd=ROOT)]
        lanes += [subprocess.Popen([python, "-m", "pytest", "-p", "no:cacheprovider", *modules, *args], cwd=ROOT,
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RIGUP_LAB_ID": lab})
                  for (_, lab, modules, _), log in zip(behind, logs)]
        try:
            while any(lane.poll() is None for lane in lanes) and time.monotonic() < deadline:
                time.sleep(2)
            late = [lane for lane in lanes if lane.poll() is None]
            if late:
                print(f"\n===== make test: past its deadline ({deadline - start:.0f} s, RIGUP_TEST_DEADLINE_S): lane(s) "
                      f"{', '.join('ABC'[lanes.index(lane)] for lane in late)} interrupted where they are =====", flush=True)
            stop(late)
        except BaseException:
            stop(lanes)
            raise
    codes = [lane.returncode for lane in lanes]
    for name, lab, modules, log in behind:
        print(f"\n===== lane {name} (RIGUP_LAB_ID={lab}): {', '.join(m.split('/')[-1] for m in modules)} =====")
        print(log.read_text(errors="replace"))
    print(f"===== make test: {', '.join(f'lane {n} exit {c}' for n, c in zip('ABC', codes))}; "
          f"{time.monotonic() - start:.0f} s wall for all =====")
    return next((c for c in codes if c), 0)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
