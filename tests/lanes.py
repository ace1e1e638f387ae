"""`make test`: the whole suite in two lanes at once, each on a lab of its own (issue 45).

The lab tests are CPU-bound in bursts (converges, builds) and wait the rest of the time (timers,
reboots, stalls, a watchdog's checks): one lane kept the 2-core machine 1.1 cores busy on
average. Lane B runs the modules that mostly wait (WAITING, each on hosts it converges itself)
on a second lab, RIGUP_LAB_ID=LANE_B_LAB (its own hosts, bridge and hub; the base root, the
ccache and, through its apt-cacher-ng, the package cache shared with the first); lane A runs
everything else, the unit tests first. Lane A's output streams; lane B's log follows it (and is
kept in LOG). Exit status: non-zero when either lane failed.

    .venv/bin/python -m tests.lanes [pytest arguments for both lanes]
    .venv/bin/python -m pytest tests/roles/test_gpu_guard.py      # one module alone, one lab
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANE_B_LAB = "9"
LOG = Path(tempfile.gettempdir()) / "rigup-test-lane-b.log"
# the modules that wait more than they compute (make test's per-module table: wall over CPU); one
# lane of everything took 49 min on warm caches; two lanes 34.5 (A) and 20 (B), then with the last
# four moved 34.7 and 31.1 (35.1 for bash .ci/run)
WAITING = [f"tests/roles/test_{m}.py" for m in (
    "gpu_guard", "fetch_faults", "vllm", "llama_server", "metrics", "model_fetch_nosystemd", "model_fetch",
    "watchdog_reboot", "rpc", "watchdog_faults", "watchdog", "status", "model_fetch_metrics", "gate_faults",
    # and, so that both lanes end near the same time, four that compute (apt, dkms, Ray)
    "cuda_toolkit", "cmpunlocker", "ray", "nvidia_driver", "router_fleet")]


def main(args: list[str]) -> int:
    missing = [m for m in WAITING if not (ROOT / m).exists()]
    if missing:
        print(f"tests/lanes.py: no such module: {', '.join(missing)}", file=sys.stderr)
        return 2
    python = sys.executable
    start = time.monotonic()
    with open(LOG, "w") as log:
        lane_b = subprocess.Popen([python, "-m", "pytest", "-p", "no:cacheprovider", *WAITING, *args], cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RIGUP_LAB_ID": LANE_B_LAB})
        try:
            a = subprocess.call([python, "-m", "pytest", *(f"--ignore={m}" for m in WAITING), *args], cwd=ROOT)
            b = lane_b.wait()
        except BaseException:
            lane_b.send_signal(signal.SIGINT)    # pytest's own interrupt: its lab is torn down
            lane_b.wait(timeout=300)
            raise
    print(f"\n===== lane B (RIGUP_LAB_ID={LANE_B_LAB}): {', '.join(m.split('/')[-1] for m in WAITING)} =====")
    print(LOG.read_text(errors="replace"))
    print(f"===== make test: lane A exit {a}, lane B exit {b}; {time.monotonic() - start:.0f} s wall for both =====")
    return a or b


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
