"""What the gpu_power role reads on a host besides its cards (``NvidiaGpus``)."""

from __future__ import annotations

from pyinfra.api import FactBase

from rigup.gpu.facts import sections

CONF = "/etc/rigup/gpu-power.conf"
APPLIED = "/run/rigup/gpu-power.applied"   # written by the boot script after a run that verified
UNIT = "rigup-gpu-power.service"
MARK = "##rigup-power:"


def parse_applied(text: str) -> dict[str, dict]:
    """What the boot script applied at this boot, per card: {uuid: {"watts": "180" or None,
    "clocks": "MIN,MAX" or None}} (its stamp in /run; clock locks cannot be queried back from
    nvidia-smi, and a cap the policy drops must go back to the card's default)."""
    out = {}
    for line in (text or "").splitlines():
        cols = line.split()
        if len(cols) >= 3 and not line.startswith("#"):
            out[cols[0]] = {"watts": None if cols[1] == "-" else cols[1], "clocks": None if cols[2] == "-" else cols[2]}
    return out


def parse_power_state(lines: list[str]) -> dict:
    sec = sections(lines, MARK)
    return {
        "conf": "".join(f"{ln}\n" for ln in sec.get("conf", [])),
        "applied": "".join(f"{ln}\n" for ln in sec.get("applied", [])),
        "enabled": (sec.get("enabled") or [""])[0].strip(),
        "systemd": (sec.get("systemd") or ["no"])[0].strip() == "yes",
    }


class GpuPowerState(FactBase):
    """The boot configuration, what the boot script applied at this boot, whether its unit is
    enabled and whether systemd runs (the cards are ``NvidiaGpus``, which preflight has read)::

        {"conf": "...", "applied": "...", "enabled": "enabled", "systemd": True}
    """

    @staticmethod
    def default() -> dict:
        return parse_power_state([])

    def command(self) -> str:
        return (f"echo '{MARK}conf'; cat {CONF} 2>/dev/null; echo '{MARK}applied'; cat {APPLIED} 2>/dev/null; "
                f"echo '{MARK}enabled'; systemctl is-enabled {UNIT} 2>/dev/null; "
                f"echo '{MARK}systemd'; [ -d /run/systemd/system ] && echo yes || echo no; true")

    def process(self, output: list[str]) -> dict:
        return parse_power_state(output)
