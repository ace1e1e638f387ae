#!/usr/bin/env python3
"""Run a play over a large inventory as several pyinfra processes side by side, one per shard of
its hosts, and end with one summary: for a controller with several cores.

    .venv/bin/python shards.py -j 4 inventory/mine.py deploy.py [pyinfra args: --data k=v, --limit X ...]
    .venv/bin/python shards.py -j 4 inventory/mine.py status.py

pyinfra runs a play on one core of the controller, and its work grows with the hosts (about 0.02-0.05
CPU s a host for a no-op converge, tests/bench/results/*-fleet.md): on a fleet of hundreds the hosts
wait for the controller. Here the hosts (the inventory's, or those ``--limit`` picks, as pyinfra
reads it) are dealt round-robin in inventory order into ``-j`` shards (default: the controller's
cores), and each shard runs ``pyinfra -y INVENTORY PLAY --limit ...`` with the other arguments,
each host picked by its exact name (plays.roll.limiter). Each host is in one shard only, so each
holds its own hosts' converge locks (rigup/lock.py) and a failure stays in its shard.

When all have ended: each shard's output (deploy.py and other plays), then one summary: rigup's
line for every host (what happened to it, rigup/summary.py), in inventory order, and the exit code
is the worst of the shards'. For status.py the shards answer in JSON and one table is printed
(plays/fleet.py: hosts in name order, what needs attention first), or the JSON with
``--data status_format=json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from plays import fleet, inventory as inventories, roll
from rigup.boundary.core import Unreadable, loads
from rigup.boundary.numbers import whole
from rigup.text import shown, shown_lines

ROOT = Path(__file__).resolve().parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
SUMMARY = "--> rigup: what happened to each host"
NO_JSON = "its shard printed no status JSON that reads"   # shards.py's reasons for a host without a row
NO_ROW = "its shard's status JSON held no row for it that reads"
USAGE = "usage: shards.py [-j N] INVENTORY PLAY [pyinfra arguments]"


def parse(argv: list[str]) -> tuple[int, str, str, list[str]]:
    """``-j N`` (default: the controller's cores), the inventory, the play, pyinfra's arguments."""
    jobs = os.cpu_count() or 1
    if argv[:1] == ["-j"] or (argv and argv[0].startswith("-j")):
        value, argv = (argv[1], argv[2:]) if argv[0] == "-j" and len(argv) > 1 else (argv[0][2:], argv[1:])
        jobs = whole(value, 4096)   # ASCII digits (round 5 C17: "²" passed isdigit and ended in int()'s ValueError)
        if not jobs:
            raise SystemExit(f"shards.py: -j wants a number of processes 1..4096, got {value!r}\n{USAGE}")
    if len(argv) < 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        raise SystemExit(USAGE)
    return jobs, argv[0], argv[1], argv[2:]


def limits_of(args: list[str]) -> tuple[list[str], list[str]]:
    """The ``--limit`` patterns among ``args`` (``--limit X``, ``--limit=X``) and the other arguments."""
    patterns, rest, i = [], [], 0
    while i < len(args):
        if args[i] == "--limit" and i + 1 < len(args):
            patterns += args[i + 1].split(",")
            i += 2
            continue
        if args[i].startswith("--limit="):
            patterns += args[i][8:].split(",")
        else:
            rest.append(args[i])
        i += 1
    picking = roll.host_options(rest)
    if picking:
        raise SystemExit(f"shards.py: {' '.join(picking)}: pick hosts with --limit NAME (or a group)")
    return patterns, rest


def deal(names: list[str], jobs: int) -> list[list[str]]:
    """``names`` dealt round-robin into at most ``jobs`` shards, none empty."""
    return [s for s in (names[i::jobs] for i in range(jobs)) if s]


def split_summary(output: str) -> tuple[str, str | None]:
    """One shard's output: (pyinfra's output, rigup's summary after its marker or None). The marker
    counts only at the start of a line and only its last time: a host's echoed text (``[b] echo:
    --> rigup: ...``) neither cuts pyinfra's output short nor takes the place of the summary."""
    at = ("\n" + output).rfind("\n" + SUMMARY)
    return (output, None) if at < 0 else (output[:at], output[at + len(SUMMARY):])


def summary_lines(output: str, hosts: list[str] | None = None) -> dict[str, str]:
    """rigup's summary of one shard's output: host name -> its line (only ``hosts``, the shard's,
    when given)."""
    summary = split_summary(output)[1]
    found = {}
    for line in (summary or "").splitlines():
        text = line.strip()
        if text.startswith("[") and "]" in text:
            name = text[1:text.index("]")]
            if hosts is None or name in hosts:
                found[name] = text
    return found


def _renders(row: object) -> bool:
    """Whether fleet can show ``row``: a dict whose host is text, whose cells, notes and JSON build
    (rows of a shard's status.py; their host text came through pyinfra's output)."""
    if not isinstance(row, dict) or not isinstance(row.get("host"), str):
        return False
    try:
        fleet.cells(row), fleet.notes(row), json.dumps(row)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError):
        return False
    return True


def status_rows(output: str, hosts: list[str] | None = None) -> tuple[list[dict], dict]:
    """The rows and the joules per token of one status.py shard's JSON: its last document (status.py
    prints it at exit, after anything a host made pyinfra print), each row one fleet can show, of
    one of ``hosts`` (the shard's, when given) and once; every host of ``hosts`` without such a row
    gets an unreachable row saying why, and a shard whose JSON does not read gives its hosts that row
    (never an exception: the other shards' rows still print)."""
    start = output.rfind('{\n "hosts"')
    end = output.find("\n}\n", start)
    try:
        doc = loads(output[start:end + 2], "the shard's status JSON") if 0 <= start < end else {}
    except Unreadable:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    listed = doc.get("hosts") if isinstance(doc.get("hosts"), list) else []
    rows, seen = [], set()
    for row in listed:
        if _renders(row) and row["host"] not in seen and (hosts is None or row["host"] in hosts):
            seen.add(row["host"])
            rows.append(row)
    why = NO_ROW if listed else NO_JSON
    rows += [fleet.unreachable_row(name, why) for name in hosts or [] if name not in seen]
    energy = doc.get("joules_per_token") if isinstance(doc.get("joules_per_token"), dict) else {}
    energy = {k: v for k, v in energy.items() if isinstance(k, str) and type(v) in (int, float) and 0 < v < float("inf")}
    return rows, energy


def run_shard(play: str, inventory: str, limit: list[str], args: list[str], log: Path) -> tuple[int, float]:
    start = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run([PYINFRA, "-y", inventory, play, *limit, *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    return rc, time.monotonic() - start


def main(argv: list[str]) -> int:
    jobs, inventory, play, args = parse(argv)
    patterns, args = limits_of(args)
    inv = inventories.read(inventory)   # as pyinfra's CLI reads it
    names = [h.name for h in inv]
    if patterns:
        picked = roll.limited(patterns, {g: [h.name for h in hs] for g, hs in inv.groups.items()}, names)
        names = [n for n in names if n in picked]
    if not names:
        raise SystemExit(f"shards.py: no host of {inventory} to run{' (--limit ' + ','.join(patterns) + ')' if patterns else ''}")
    status = Path(play).name == "status.py"
    wants_json = "status_format=json" in args
    if status and not wants_json:
        args = [*args, "--data", "status_format=json"]
    shards = deal(names, jobs)
    limiter = roll.limiter(inv)
    limits = [limiter(s) for s in shards]
    bad = [text for text in limits if isinstance(text, str)]
    if bad:
        raise SystemExit(f"shards.py: {bad[0]}")
    with tempfile.TemporaryDirectory(prefix="rigup-shards-") as tmp:
        logs = [Path(tmp) / f"shard-{i + 1}.log" for i in range(len(shards))]
        with ThreadPoolExecutor(len(shards)) as pool:
            results = list(pool.map(lambda i: run_shard(play, inventory, limits[i], args, logs[i]), range(len(shards))))
        outputs = [log.read_text(errors="replace") for log in logs]
    worst = max(rc for rc, _ in results)
    if status:
        rows, energy = [], {}
        for (rc, _), output, shard in zip(results, outputs, shards):
            found, figures = status_rows(output, shard)
            rows += found
            energy.update(figures)
            if any(row.get("reason") in (NO_JSON, NO_ROW) for row in found):
                print(shown_lines(output[-3000:], 4000, None), file=sys.stderr)
        for row in rows:
            if row.get("reachable") and row.get("joules_per_token") is None and row["host"] in energy:
                row["joules_per_token"] = energy[row["host"]]
        print(fleet.render_json(rows) if wants_json else fleet.render_table(rows))
        return worst
    for i, ((rc, seconds), output) in enumerate(zip(results, outputs)):
        print(shown(f"--> shard {i + 1} of {len(shards)}: {len(shards[i])} hosts, exit {rc}, {seconds:.1f} s"))
        print(shown_lines(split_summary(output)[0].rstrip(), 4000, None))   # pyinfra's output: host text in it
    lines = {}
    for output, shard in zip(outputs, shards):
        lines.update(summary_lines(output, shard))
    print(shown(f"{SUMMARY} ({len(shards)} shards, {len(names)} hosts)"))
    for name in names:
        print(shown(f"    {lines.get(name, f'[{name}] unknown: its shard printed no line for it')}", 4000))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
