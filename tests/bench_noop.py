"""A no-op converge of the whole play, this tree against another (``--base REV``, e.g. the commit
before a restructuring), on lab hosts of their own in one run: each tree converges its host once,
then both converge again in alternating rounds; prints the wall and the controller's CPU seconds
(pyinfra and its SSH children, from wait4) of every round, the medians and their ratios: the CPU
seconds hold when the machine is shared, the wall seconds do not. Needs root; tears the lab down
at the end.

    .venv/bin/python -m tests.bench_noop --base eb4a244 --rounds 5
    .venv/bin/python -m tests.bench_noop --base ac62db1 --rounds 3 --data burnin_enabled=true   # both with burn-in on
"""

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

from tests.bench_fleet import timed
from tests.converge import ROOT, Run
from tests.lab import hub, lab, models, sources


def converge_in(tree: Path, host: str, data: list[str] = ()) -> tuple[Run, float]:
    """``pyinfra -y inventory/lab.py deploy.py --limit HOST [--data KEY=VALUE...]`` run from ``tree``,
    and the CPU seconds it and its children used (tests/bench_fleet.py's ``timed``: wait4)."""
    sample = timed("inventory/lab.py", "deploy.py", "--limit", host, *(a for d in data for a in ("--data", d)), cwd=tree)
    return sample.run, sample.cpu


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_noop")
    parser.add_argument("--base", required=True)
    parser.add_argument("--head", help="compare this revision instead of the working tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="pyinfra --data for both trees' converges (e.g. burnin_enabled=true)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def report(times: dict[str, tuple[list[float], list[float]]], base: str) -> str:
    """Every round's wall and controller CPU seconds of each tree ({label: (walls, cpus)}), the
    medians, and this tree's against ``base``."""
    lines = [f"{label:10} no-op converge, wall s: {' '.join(f'{v:.2f}' for v in walls)}; median "
             f"{statistics.median(walls):.2f}; controller CPU s: {' '.join(f'{v:.2f}' for v in cpus)}; "
             f"median {statistics.median(cpus):.2f}" for label, (walls, cpus) in times.items()]
    for i, what in enumerate(("wall", "controller CPU")):
        ratio = statistics.median(times["this tree"][i]) / statistics.median(times["base"][i])
        lines.append(f"this tree / base ({base}), {what}: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        other, mine = Path(tmp) / "base", ROOT
        subprocess.run(["git", "worktree", "add", "--detach", str(other), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        if args.head:
            mine = Path(tmp) / "head"
            subprocess.run(["git", "worktree", "add", "--detach", str(mine), args.head], cwd=ROOT, check=True,
                           capture_output=True)
        try:
            lab.down()
            lab.up(2, "a100")
            sources.llama_cpp_mirror()
            sources.serve()
            hub.serve()
            models.publish_gemma()
            old_host, new_host = (h["name"] for h in lab.hosts()[:2])
            for tree, host in ((other, old_host), (mine, new_host)):
                first, _ = converge_in(tree, host, args.data)
                print(f"first converge of {host} by {tree.name}: {first.seconds:.0f} s")
            times = {"base": ([], []), "this tree": ([], [])}
            for i in range(args.rounds):
                for label, tree, host in (("base", other, old_host), ("this tree", mine, new_host)):
                    run, cpu = converge_in(tree, host, args.data)
                    assert run.totals["changed"] == 0, (label, run.changed_operations())
                    times[label][0].append(run.seconds)
                    times[label][1].append(cpu)
            print(report(times, args.base))
        finally:
            lab.down()
            for tree in {other, mine} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
