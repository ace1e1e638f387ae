"""What roles/burnin reads on a host, in preflight's round trip: rigup-burnin's records and the
cards the active serving units hold (a card in use is never tested)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigup.gpu.facts import sections

MARK = "##rigup-burnin:"
UNITS = ("rigup-llama@*", "rigup-vllm@*", "rigup-rpc*")


def parse_burnin_state(lines: list[str]) -> dict:
    """{"records": {uuid: record}, "unreadable": why or None, "units": {unit: [CUDA_VISIBLE_DEVICES
    entries] or None (every card)}}."""
    sec = sections(lines, MARK)
    text = "\n".join(sec.get("records", [])).strip()
    records, unreadable = {}, None
    if text:
        try:
            records = json.loads(text)
        except ValueError as e:
            unreadable = f"not JSON ({e})"
        if not isinstance(records, dict):
            records, unreadable = {}, unreadable or "not a mapping"
    units = {}
    for line in sec.get("units", []):
        unit, _, env = line.strip().partition(" ")
        if not unit:
            continue
        devices = None
        for word in env.split():
            if word.startswith("CUDA_VISIBLE_DEVICES="):
                devices = [d for d in word.split("=", 1)[1].split(",") if d]
        units[unit] = devices
    return {"records": {k: v for k, v in records.items() if isinstance(v, dict)}, "unreadable": unreadable,
            "units": units}


class BurninState(FactBase):
    """rigup-burnin's records at ``path`` and the active serving units' cards::

        {"records": {"GPU-17a2...": {"passed": True, "key": {...}, ...}}, "unreadable": None,
         "units": {"rigup-llama@main.service": None, "rigup-llama@main-1.service": ["GPU-17a2..."]}}
    """

    @staticmethod
    def default() -> dict:
        return parse_burnin_state([])

    def command(self, path: str) -> str:
        units = " ".join(shlex.quote(u) for u in UNITS)
        return (f"echo '{MARK}records'; cat {shlex.quote(path)} 2>/dev/null; echo; echo '{MARK}units'; "
                f"for u in $(systemctl list-units --state=active --plain --no-legend {units} 2>/dev/null "
                "| awk '{print $1}'); do printf '%s ' \"$u\"; systemctl show -p Environment --value \"$u\"; done; true")

    def process(self, output: list[str]) -> dict:
        return parse_burnin_state(output)
