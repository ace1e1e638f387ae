"""`make bench-smoke`: what the smoke inference of a new llama.cpp build adds to a converge that
switches builds (roles/llama_cpp: the goal is <= 10 s), measured in one run.

Boots lab1 (no GPU), converges it (lab-base, Gemma 270M serving), builds lab-bump once, then
alternates converges between the two refs, each a switch of ``current`` and a restart of the
instance with its gate, with the smoke on and off (``llama_cpp_smoke``); before each converge with
the smoke on, the target build's smoke result is removed so that the smoke really runs. Prints
the median wall of each, the difference (what the smoke adds), the smoke's own seconds from its
result, and writes them under tests/bench/results/. Needs root; tears the lab down unless --keep.

    .venv/bin/python -m tests.bench_smoke [--rounds 3] [--keep]
"""

import argparse
import datetime
import json
import statistics
from pathlib import Path

from tests.converge import ROOT, pyinfra
from tests.lab import hub, lab, models, sources

RESULTS = ROOT / "tests" / "bench" / "results"
DIR = "/opt/rigup/llama.cpp"
HOST = "lab1"


def converge(*data: str):
    run = pyinfra("inventory/lab.py", "deploy.py", *[a for d in data for a in ("--data", d)])
    assert run.returncode == 0, run.output[-4000:]
    return run


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def figures_of(walls: dict[str, list[float]], smoke_s: list[float]) -> dict:
    """The result: the median walls with the smoke on and off, what it adds, the smoke's own seconds."""
    on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
    return {"date": datetime.date.today().isoformat(), "rounds": len(walls["on"]),
            "converge_switch_smoke_on_s": round(on, 2), "converge_switch_smoke_off_s": round(off, 2),
            "smoke_adds_s": round(on - off, 2), "ratio_on_off": round(on / off, 3),
            "smoke_script_s_median": round(statistics.median(smoke_s), 2), "walls": walls, "goal_adds_at_most_s": 10}


def write_results(figures: dict, results: Path = RESULTS) -> Path:
    """``results/<date>-smoke.{json,md}``; the JSON's path."""
    on, off, rounds = figures["converge_switch_smoke_on_s"], figures["converge_switch_smoke_off_s"], figures["rounds"]
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{figures['date']}-smoke.json"
    out.write_text(json.dumps(figures, indent=1) + "\n")
    (results / f"{figures['date']}-smoke.md").write_text(
        f"# The smoke inference in a converge that switches builds ({figures['date']})\n\n"
        f"`python -m tests.bench_smoke --rounds {rounds}`: lab1 (2-core machine, no GPU), Gemma 3 270M,\n"
        "alternating lab-base / lab-bump, each converge a switch, a restart and a gate.\n\n"
        "| smoke | median wall | converges |\n| --- | --- | --- |\n"
        f"| on | {on:.2f} s | {len(figures['walls']['on'])} |\n"
        f"| off | {off:.2f} s | {len(figures['walls']['off'])} |\n\n"
        f"The smoke adds {on - off:.2f} s ({on / off:.2f}x); the smoke script itself: "
        f"{figures['smoke_script_s_median']} s (median). Goal: at most 10 s.\n")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    lab.down()
    try:
        lab.up(1, "none")
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        converge()
        converge("llama_cpp_ref=lab-bump")
        walls: dict[str, list[float]] = {"on": [], "off": []}
        smoke_s = []
        refs = ["lab-base", "lab-bump"]
        for i in range(args.rounds):
            for mode in ("on", "off"):
                ref = refs[len(walls["on"] + walls["off"]) % 2]
                if mode == "on":
                    lab.ssh(HOST, f"rm -f {DIR}/builds/{ref}-*/rigup-smoke.json")
                run = converge(f"llama_cpp_ref={ref}", f"llama_cpp_smoke={'true' if mode == 'on' else 'false'}")
                walls[mode].append(run.seconds)
                if mode == "on":
                    doc = json.loads(lab.ssh(HOST, f"cat {DIR}/current/rigup-smoke.json").stdout)
                    smoke_s.append(doc["seconds"])
                print(f"round {i + 1}: {ref} smoke {mode}: {run.seconds:.2f} s", flush=True)
        figures = figures_of(walls, smoke_s)
        print(json.dumps(figures, indent=1))
        out = write_results(figures)
        print(f"wrote {out}")
    finally:
        if not args.keep:
            lab.down()


if __name__ == "__main__":
    main()
