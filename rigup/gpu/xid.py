# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""NVIDIA Xid events from the kernel log: each ``NVRM: Xid`` line attributed to a card by its PCI
bus id and classified from the catalogue (rigup/gpu/xid.yml: class and action per code, with
NVIDIA's meaning). Pure functions and standard library only, so the GPU guard (a standalone
script on the host) and tests/gpu/check.py (the real card's log) use the same parser.

The driver writes ``NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, name=python3, GPU has fallen off
the bus.``; older drivers leave out ``PCI:`` (``NVRM: Xid (0000:01:00): 3, ...``). The id names
domain, bus and device, not the function: cards are matched on that.
"""

from __future__ import annotations

import re
from pathlib import Path

CATALOGUE_FILE = Path(__file__).with_name("xid.yml")
BUS = r"(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?"
# the driver's line shape only, from its start (issue 47: a line matched anywhere in a message let
# other text that quotes one, a process name, a device's, count as an Xid): the message itself, or
# one behind dmesg's "[  269.517039] ", syslog's "May 18 19:02:39 [host] kernel: " or journalctl
# -o short-monotonic's "[  269.517039] host kernel: "
PREFIX = r"(?:\[\s*\d+\.\d+\]\s+)?(?:(?:[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+)?(?:\S+\s+)?kernel:\s+)?"
XID = re.compile(rf"{PREFIX}NVRM: Xid \(({BUS})\): (\d{{1,4}}),\s*(.*)$")
UNKNOWN = {"class": "unknown", "action": "log", "meaning": "not in rigup's catalogue"}
KERNEL_LOG_COMMAND = ("journalctl -k -o short-monotonic --no-pager 2>/dev/null | grep -F 'NVRM: Xid' "
                      "|| dmesg 2>/dev/null | grep -F 'NVRM: Xid' || true")


def catalogue() -> dict[int, dict]:
    """The catalogue: {code: {"class", "action", "meaning"}} (PyYAML, where rigup runs)."""
    import yaml

    return {int(code): dict(entry) for code, entry in yaml.safe_load(CATALOGUE_FILE.read_text()).items()}


def card_key(bus_id: str) -> str:
    """``00000000:2B:00.0`` or ``0000:2b:00`` -> ``0000:2b:00`` (domain of 4, bus, device), the part
    of a bus id an Xid line carries."""
    m = re.fullmatch(BUS, bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{m.group(1)[-4:]}:{m.group(2)}:{m.group(3)}".lower()


def events(lines: list[str], known: dict[int, dict]) -> list[dict]:
    """Each Xid line of ``lines`` as ``{"card": "0000:2b:00", "code": 79, "class": "bus",
    "action": "drain_host", "meaning": ..., "text": the driver's words, "line": the whole line}``;
    other lines are skipped."""
    found = []
    for line in lines:
        m = XID.match(line)
        if not m:
            continue
        code = int(m.group(5))
        entry = known.get(code, UNKNOWN)
        found.append({"card": card_key(m.group(1)), "code": code, "class": entry["class"],
                      "action": entry["action"], "meaning": entry["meaning"], "text": m.group(6).strip(),
                      "line": line.rstrip("\n")})
    return found


def counts(found: list[dict]) -> dict[str, dict[str, int]]:
    """{card: {class: events}} of :func:`events`' list."""
    by: dict[str, dict[str, int]] = {}
    for e in found:
        by.setdefault(e["card"], {}).setdefault(e["class"], 0)
        by[e["card"]][e["class"]] += 1
    return by
