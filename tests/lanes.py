"""`make test`: the unit tests, then the lab tests in two labs side by side.

The lab tests mostly wait (converges, reboots, timers, a roll's drains), so two labs on one
2-core machine take little more than the longer of the two. Lane 1 (RIGUP_LAB_ID=1) runs the
fleet loop's modules (LANE_1: the balancer's replicas, the rolls behind a gateway); lane 0 runs
every other lab module, those that build nothing first (EARLY), so that the two lanes do not
compile llama.cpp at the same time: lane 1 compiles it at once, and lane 0 finds the objects in
the ccache the lanes share (RIGUP_LAB_SHARED: lane 1 boots on lane 0's base root too).
What both lanes read from the machine's caches (the base root, the llama-cpp-python sdist each
lab's llama.cpp mirror is made from, the model) is made once before they start. Each lane's log is printed whole when it ends (lane 1's under its
name); the exit status is the first failure's.

    .venv/bin/python -m tests.lanes              # what make test runs
    .venv/bin/python -m tests.lanes -- -x        # extra pytest arguments go to both lanes
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# the modules of lane 1, in order; a new module goes to lane 0 unless it is named here
LANE_1 = ("tests/roles/test_balancer.py", "tests/roles/test_roll.py")
# lane 0's modules that build no llama.cpp, run first while lane 1 compiles
EARLY = ("tests/test_lab.py", "tests/roles/test_fetch_faults.py", "tests/roles/test_model_fetch.py",
         "tests/roles/test_model_fetch_hub.py", "tests/roles/test_model_fetch_hub_host.py",
         "tests/roles/test_model_fetch_metrics.py", "tests/roles/test_model_fetch_nosystemd.py",
         "tests/roles/test_cmpunlocker.py", "tests/roles/test_gpu_power.py", "tests/roles/test_gpu_guard.py",
         "tests/roles/test_base_fleet.py", "tests/roles/test_gate_faults.py", "tests/roles/test_rpc_plan.py",
         "tests/roles/test_preflight.py", "tests/roles/test_vllm.py", "tests/roles/test_status.py")


def lab_modules() -> list[str]:
    """Every lab test module (tests/test_lab.py and tests/roles/test_*.py), relative to ROOT."""
    found = [TESTS / "test_lab.py", *sorted((TESTS / "roles").glob("test_*.py"))]
    return [str(p.relative_to(ROOT)) for p in found]


def lanes(modules: list[str]) -> list[list[str]]:
    """[lane 0's modules, lane 1's]: LANE_1 as named; the rest with EARLY first, in order."""
    unknown = [m for m in (*LANE_1, *EARLY) if m not in modules]
    if unknown:
        raise SystemExit(f"tests/lanes.py names modules that do not exist: {', '.join(unknown)}")
    rest = [m for m in modules if m not in LANE_1]
    return [[m for m in EARLY if m in rest] + [m for m in rest if m not in EARLY], list(LANE_1)]


def prepare() -> None:
    """What both lanes read from the machine's caches, made once: lane 0's base root, the sdist
    and the model (tests/lab)."""
    from tests.lab import lab, models, sources

    lab.ensure_tools()
    with lab.locked():
        built = lab.build_base()
    print(f"base root: {'built in %s s' % built if built else 'cached'}; llama.cpp from {sources.sdist()}; "
          f"model: {models.gemma_270m()}", flush=True)


def run_lane(n: int, modules: list[str], extra: list[str], logs: Path, results: dict) -> None:
    """Lane ``n``'s pytest over ``modules`` (its own lab, basetemp and log)."""
    from tests.lab import lab

    env = dict(os.environ)
    if n:   # the next lab id after lane 0's (RIGUP_LAB_ID, none by default)
        env.update(RIGUP_LAB_ID=str(int(lab.LAB_ID or 0) + n), RIGUP_LAB_SHARED=str(lab.STATE))
    log = logs / f"lane{n}.log"
    argv = [sys.executable, "-m", "pytest", "-m", "lab", "-p", "no:cacheprovider",
            f"--basetemp={logs / f'tmp{n}'}", *extra, *modules]
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    results[n] = rc, time.monotonic() - start, log


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    unit = subprocess.run([sys.executable, "-m", "pytest", "-m", "not lab", *extra], cwd=ROOT).returncode
    logs = Path(os.environ.get("RIGUP_LANES_DIR") or "/tmp/rigup-lanes")
    logs.mkdir(parents=True, exist_ok=True)
    prepare()
    plan = lanes(lab_modules())
    for n, modules in enumerate(plan):
        print(f"lane {n}: {len(modules)} modules, log {logs / f'lane{n}.log'}: {' '.join(Path(m).stem for m in modules)}",
              flush=True)
    results: dict = {}
    threads = [threading.Thread(target=run_lane, args=(n, m, extra, logs, results)) for n, m in enumerate(plan)]
    for t in threads:
        t.start()
    for t in threads:   # lane 0 is printed first, however they end
        t.join()
        n = threads.index(t)
        rc, seconds, log = results.get(n, (1, 0.0, logs / f"lane{n}.log"))
        print(f"\n{'=' * 30} lane {n}: exit {rc} after "
              f"{seconds:.0f} s {'=' * 30}", flush=True)
        sys.stdout.write(log.read_text(errors="replace") if log.exists() else "(no log)\n")
        sys.stdout.flush()
    codes = [unit] + [results.get(n, (1,))[0] for n in range(len(plan))]
    print(f"\nunit tests: exit {unit}; " + "; ".join(f"lane {n}: exit {results.get(n, (1, 0))[0]} in "
                                                   f"{results.get(n, (1, 0))[1]:.0f} s" for n in range(len(plan))))
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
