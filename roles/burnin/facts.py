"""What roles/burnin reads on a host, in preflight's round trip: rigup-burnin's records and the
cards the active serving units hold (a card in use is never tested)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigup.boundary import Unreadable, burnin
from rigup.gpu.facts import sections
from rigup.text import shown
from roles.burnin.shipped.acceptance import UNITS, unit_devices

MARK = "##rigup-burnin:"


def parse_burnin_state(lines: list[str]) -> dict:
    """{"records": {uuid: record}, "untested": {uuid: why its pass is not believed}, "unreadable":
    why the file does not read (rigup.boundary.burnin.records; roles/burnin then judges by the
    controller's last good copy and refuses the host) or None, "pulse": the pulse record
    (rigup.boundary.burnin.pulse) or None, "pulse_unreadable": why it does not read or None, "units": {unit: [CUDA_VISIBLE_DEVICES
    entries] or None (every card)}, "lapsed": what a lapsed lease of a burn-in cut short did (its
    watcher's line, roles/burnin accepted) or None}."""
    sec = sections(lines, MARK)
    try:
        text = "\n".join(ln[1:] if ln.startswith("|") else ln for ln in sec.get("records", []))
        read, unreadable = burnin.records(text, "records"), None
    except Unreadable as e:
        read, unreadable = burnin.Records({}, {}), e.why
    try:
        pulse, pulse_unreadable = burnin.pulse("\n".join(ln[1:] if ln.startswith("|") else ln
                                                         for ln in sec.get("pulse", [])), "pulse"), None
    except Unreadable as e:
        pulse, pulse_unreadable = None, e.why
    return {"records": read.cards, "untested": read.untested, "unreadable": unreadable,
            "pulse": pulse, "pulse_unreadable": pulse_unreadable,
            "units": unit_devices("\n".join(sec.get("units", []))),
            "lapsed": shown(" ".join(ln[1:] for ln in sec.get("lapsed", []) if ln.startswith("|")), 600) or None}


class BurninState(FactBase):
    """rigup-burnin's records at ``path`` and the active serving units' cards::

        {"records": {"GPU-17a2...": {"passed": True, "key": {...}, ...}}, "unreadable": None,
         "units": {"rigup-llama@main.service": None, "rigup-llama@main-1.service": ["GPU-17a2..."]}}
    """

    @staticmethod
    def default() -> dict:
        return parse_burnin_state([])

    def command(self, path: str, pulse: str = "", lapsed: str = "") -> str:
        # each line of the files behind "|": no line of them can pass for a section's marker
        units = " ".join(shlex.quote(u) for u in UNITS)
        read_pulse = f"echo '{MARK}pulse'; sed 's/^/|/' {shlex.quote(pulse)} 2>/dev/null; echo; " if pulse else ""
        if lapsed:
            read_pulse += f"echo '{MARK}lapsed'; head -c 2000 {shlex.quote(lapsed)} 2>/dev/null | sed 's/^/|/'; echo; "
        return (f"echo '{MARK}records'; sed 's/^/|/' {shlex.quote(path)} 2>/dev/null; echo; {read_pulse}echo '{MARK}units'; "
                f"u=$(systemctl list-units --state=active --plain --no-legend {units} 2>/dev/null | awk '{{print $1}}'); "
                '[ -z "$u" ] || systemctl show -p Id,Environment $u 2>/dev/null; true')   # every unit in one call

    def process(self, output: list[str]) -> dict:
        return parse_burnin_state(output)
