"""gpu_power's plan mode on a real NVIDIA machine with only python3 and nvidia-smi (no pyinfra,
no network, no YAML needed): print the cards, their power limits and what a policy would change,
with rigup's own parser (rigup.gpu.facts.parse_gpus) and policy (roles.gpu_power.policy).

It only reads: the one nvidia-smi call is rigup.gpu.facts.GPU_COMMAND (--query-gpu). It never
runs -pl, -pm or -lgc, and prints the calls that a converge would make instead.

    python3 tests/gpu/power_plan.py [--watts W] [--psu W] [--override UUID|BUS=W ...] [--clocks CLASS=MIN,MAX ...]
                                    [--no-persistence] [--from FILE]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.standalone import load  # noqa: E402  (pyinfra stood in where it is missing)
try:
    import yaml  # noqa: F401
    HAVE_YAML = True
except ImportError:
    # rigup/gpu/catalogue.py reads catalogue.yml with PyYAML; without it, cards have no class
    # (clock locks by class are then not planned) but everything else works.
    sys.modules["yaml"] = types.ModuleType("yaml")
    HAVE_YAML = False

from rigup.gpu.facts import GPU_COMMAND, parse_gpus  # noqa: E402

policy = load("roles/gpu_power/policy.py")
commands, format_plan, power_plan = policy.commands, policy.format_plan, policy.power_plan


def class_of(gpu: dict):
    if not HAVE_YAML:
        return None
    from rigup.gpu.catalogue import card_for
    card = card_for(gpu)
    return card["class"] if card else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--watts", type=int, default=None, help="gpu_power_watts (default: null)")
    p.add_argument("--psu", type=int, default=None, help="gpu_psu_watts (default: null)")
    p.add_argument("--override", action="append", default=[], help="UUID-or-bus-id=WATTS")
    p.add_argument("--clocks", action="append", default=[], help="CLASS=MIN,MAX")
    p.add_argument("--no-persistence", action="store_true")
    p.add_argument("--from", dest="source", help="read the nvidia-smi output from this file")
    args = p.parse_args(argv)
    if args.source:
        lines = Path(args.source).read_text().splitlines()
    else:
        print(f"$ {GPU_COMMAND}")
        lines = subprocess.run(["sh", "-c", GPU_COMMAND], capture_output=True, text=True).stdout.splitlines()
    overrides = {k: int(v) for k, _, v in (o.rpartition("=") for o in args.override)}
    clocks = dict(c.split("=", 1) for c in args.clocks)
    plan = power_plan(parse_gpus(lines), args.watts, overrides, clocks, not args.no_persistence, class_of,
                      psu_watts=args.psu)
    print(format_plan(plan))
    todo = commands(plan)
    print("a converge would run (rigup-gpu-power, per card):" if todo else "a converge would run nothing")
    for argv_ in todo:
        print("    " + shlex.join(argv_))
    return 1 if plan["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
