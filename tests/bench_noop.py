"""A no-op converge of the whole play, this tree against another (``--base REV``, e.g. the commit
before a restructuring), on lab hosts of their own in one run: each tree converges its host once,
then both converge again in alternating rounds; prints the seconds of every round, the medians
and their ratio. Needs root; tears the lab down at the end.

    .venv/bin/python -m tests.bench_noop --base eb4a244 --rounds 5
"""

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tests.converge import PYINFRA, ROOT, Run
from tests.lab import hub, lab, models, sources


def converge_in(tree: Path, host: str) -> Run:
    """``pyinfra -y inventory/lab.py deploy.py --limit HOST`` run from ``tree``."""
    start = time.monotonic()
    result = subprocess.run([PYINFRA, "-y", "inventory/lab.py", "deploy.py", "--limit", host], cwd=tree,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3600)
    run = Run(result.returncode, result.stdout + result.stderr, time.monotonic() - start)
    assert run.returncode == 0, run.output[-4000:]
    return run


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_noop")
    parser.add_argument("--base", required=True)
    parser.add_argument("--head", help="compare this revision instead of the working tree")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def report(times: dict[str, list[float]], base: str) -> str:
    """Every round's seconds of each tree, the medians, and this tree's against ``base``."""
    lines = [f"{label:10} no-op converge, s: {' '.join(f'{v:.2f}' for v in values)}; "
             f"median {statistics.median(values):.2f}" for label, values in times.items()]
    ratio = statistics.median(times["this tree"]) / statistics.median(times["base"])
    return "\n".join(lines + [f"this tree / base ({base}): {ratio:.2f}x"])


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
                first = converge_in(tree, host)
                print(f"first converge of {host} by {tree.name}: {first.seconds:.0f} s")
            times = {"base": [], "this tree": []}
            for i in range(args.rounds):
                for label, tree, host in (("base", other, old_host), ("this tree", mine, new_host)):
                    run = converge_in(tree, host)
                    assert run.totals["changed"] == 0, (label, run.changed_operations())
                    times[label].append(run.seconds)
            print(report(times, args.base))
        finally:
            lab.down()
            for tree in {other, mine} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
