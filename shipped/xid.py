# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""NVIDIA Xid events from the kernel log: each ``NVRM: Xid`` line attributed to a card by its PCI
bus id and classified from the catalogue (rigup/gpu/xid.yml: class and action per code, with
NVIDIA's meaning; read on the controller by rigup/gpu/catalogue.py ``xid_codes``, the guard gets it
in its config). Pure functions and standard library only, so the GPU guard (a standalone script on
the host) and tests/gpu/check.py (the real card's log) use the same parser.

The driver writes ``NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, name=python3, GPU has fallen off
the bus.``; older drivers leave out ``PCI:`` (``NVRM: Xid (0000:01:00): 3, ...``). The id names
domain, bus and device, not the function: cards are matched on that.

On an NVSwitch board (rigup/gpu/fabric.py) the switches' driver writes SXid events:
``nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ
interrupt``, each with further lines of the same code (``Data {...}``, ``Severity 0 ...``) that
are not events of their own. NVIDIA's fabric manager guide (SXid errors) names each event fatal or
not: a fatal one stalls the NVLink traffic through that switch and needs the GPUs and switches
reset (the host drained; a reboot where the operator allows it); a non-fatal one is logged and
counted. They are events of the switch's bus id, class ``nvswitch``.
"""

from __future__ import annotations

import re

BUS = r"(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?"
# the driver's line shape only, from its start (issue 47: a line matched anywhere in a message let
# other text that quotes one, a process name, a device's, count as an Xid): the message itself, or
# one behind dmesg's "[  269.517039] ", syslog's "May 18 19:02:39 [host] kernel: " or journalctl
# -o short-monotonic's "[  269.517039] host kernel: "
PREFIX = r"(?:\[\s*[0-9]+\.[0-9]+\]\s+)?(?:(?:[A-Z][a-z]{2}\s+[0-9]{1,2}\s+[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\s+)?(?:\S+\s+)?kernel:\s+)?"
# a code as the driver prints it: plain ASCII decimal (issue 61: "0079" is no code a kernel prints, and
# \d took "٧٩" too; such a line is not the driver's, so no event: never a drain)
CODE = r"0|[1-9][0-9]{0,%d}"
XID = re.compile(rf"{PREFIX}NVRM: Xid \(({BUS})\): ({CODE % 3}),\s*(.*)$")
SXID = re.compile(rf"{PREFIX}nvidia-nvswitch[0-9]{{1,3}}: SXid \(({BUS})\): ({CODE % 4}), (Fatal|Non-fatal),\s*(.*)$")
SXID_CLASS = {"Fatal": {"class": "nvswitch", "action": "drain_host",
                        "meaning": "NVSwitch fatal error (SXid): NVLink traffic through the switch stalls; the GPUs "
                                   "and switches need a reset"},
              "Non-fatal": {"class": "nvswitch", "action": "log", "meaning": "NVSwitch non-fatal error (SXid)"}}
UNKNOWN = {"class": "unknown", "action": "log", "meaning": "not in rigup's catalogue"}
# journalctl's match for gpu_guard_xid_source: the kernel's own transport (no local process can write
# it), or the lab's stand-in lines (tests/lab/nvidia_smi.py ``sim xid``; lab hosts share one kernel)
JOURNAL_MATCH = {"kernel": "_TRANSPORT=kernel", "lab": "SYSLOG_IDENTIFIER=rigup-lab-kernel"}
KERNEL_LOG_COMMAND = ("journalctl -k -o short-monotonic --no-pager 2>/dev/null | grep -E 'NVRM: Xid|: SXid [(]' "
                      "|| dmesg 2>/dev/null | grep -E 'NVRM: Xid|: SXid [(]' || true")


def card_key(bus_id: str) -> str:
    """``00000000:2B:00.0`` or ``0000:2b:00`` -> ``0000:2b:00`` (domain, bus, device), the part of a
    bus id an Xid line carries. The domain is whole, at least 4 digits as the kernel prints it: a VMD
    domain's ``00010000:2B:00.0`` (nvidia-smi) and ``PCI:10000:2b:00`` (the driver) are ``10000:2b:00``,
    not domain 0's card (its last 4 digits made them one: issue 61, round 13 XD6)."""
    m = re.fullmatch(BUS, bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{m.group(1).lstrip('0').rjust(4, '0')}:{m.group(2)}:{m.group(3)}".lower()


def events(lines: list[str], known: dict[int, dict]) -> list[dict]:
    """Each Xid line of ``lines`` as ``{"card": "0000:2b:00", "code": 79, "class": "bus",
    "action": "drain_host", "meaning": ..., "text": the driver's words, "line": the whole line}``;
    each SXid event line (``..., Fatal, ...`` or ``Non-fatal``) as one with ``"kind": "SXid"`` and
    the switch's bus id as its card; other lines are skipped."""
    found = []
    for line in lines:
        m = XID.match(line)
        if not m:
            s = SXID.match(line)
            if s:
                found.append({"card": card_key(s.group(1)), "code": int(s.group(5)), **SXID_CLASS[s.group(6)],
                              "text": f"{s.group(6)}, {s.group(7).strip()}", "line": line.rstrip("\n"), "kind": "SXid"})
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
