"""What the cmpunlocker role reads on a host, in one round trip."""

from __future__ import annotations

from pyinfra.api import FactBase

from rigup.boundary.core import Unreadable, loads
from rigup.boundary.fields import PATH_CHARS, PATH_MAX
from rigup.gpu.facts import GPU_COMMAND, sections, parse_gpus

MARK = "##rigup-cmp:"


def module_path(line: str | None) -> str | None:
    """The module probe's line (``modinfo -n nvidia``) as the absolute path of a module file, else
    None: it is printed in the unlock's verdict, and a line holding an escape sequence reached the
    operator's terminal through it (issue 61, round 9 C1)."""
    ok = line is not None and line.startswith("/") and len(line) <= PATH_MAX and PATH_CHARS.fullmatch(line)
    return line if ok else None


def parse_unlock_state(lines: list[str]) -> dict:
    sec = sections(lines, MARK)
    try:   # root's stamp, typed: JSON nested deep raised RecursionError out of the fact (the run ended)
        stamp = loads("".join(sec.get("stamp", [])) or "null", "the cmpunlocker stamp")
    except Unreadable:
        stamp = None
    stamp = stamp if isinstance(stamp, dict) else None   # the role spreads it: {**stamp}
    first = lambda key: next((ln.strip() for ln in sec.get(key, []) if ln.strip()), None)  # noqa: E731
    return {"stamp": stamp, "gpus": parse_gpus(sec.get("gpus", [])), "module": module_path(first("module")),
            "boot_id": first("boot"), "systemd": first("systemd") == "yes"}


class CmpUnlockerState(FactBase):
    """The role's state marker (``stamp``: what was installed or rolled back, at which boot), the
    cards, the nvidia module the kernel loaded (``probe``'s output), this boot's id::

        {"stamp": {"state": "installed", "commit": "...", "boot_id": "...", ...} | None,
         "gpus": [...NvidiaGpus...], "module": "/lib/modules/6.1.0-26-amd64/updates/cmpunlocker/nvidia.ko",
         "boot_id": "3f0c...", "systemd": True}
    """

    @staticmethod
    def default() -> dict:
        return parse_unlock_state([])

    def command(self, stamp: str, probe: str) -> str:
        return (f"echo '{MARK}stamp'; cat {stamp} 2>/dev/null; echo; "
                f"echo '{MARK}gpus'; if command -v nvidia-smi >/dev/null 2>&1; then {GPU_COMMAND}; fi; "
                f"echo '{MARK}module'; ( {probe} ) 2>/dev/null | head -n 1; "
                f"echo '{MARK}boot'; cat /proc/sys/kernel/random/boot_id; "
                f"echo '{MARK}systemd'; [ -d /run/systemd/system ] && echo yes || echo no; true")

    def process(self, output: list[str]) -> dict:
        return parse_unlock_state(output)
