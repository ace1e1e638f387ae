"""systemd services a role keeps running, read in one round trip per role.

pyinfra's ``systemd.service`` reads two facts (status, enabled) and runs its body twice, so
each call costs four round trips on a converge that has nothing to do; here a role names its
units once and :func:`running` compares each with one :class:`ServiceStates` read (read_once).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase
from rigup.probe import operation

from rigup.state import read_once, reading


class ServiceStates(FactBase):
    """``{unit: (active, enabled)}`` for ``units``, as ``systemctl is-active`` and ``is-enabled`` say
    (``""``: no unit file), from one ``systemctl show`` (two calls per unit cost the host ten times
    as much); a unit systemd cannot show (no systemd) is left out."""

    merge_by = "units"   # rigup/state.py Batch: the reads of several roles in one command

    def command(self, units: list[str]) -> str:
        self.units = list(units)
        if not units:
            return "true"
        # each unit shows ActiveState before UnitFileState (systemd's property order), both always
        return ("systemctl show -p ActiveState,UnitFileState -- " + " ".join(shlex.quote(u) for u in units)
                + " 2>/dev/null | sed -n '/^ActiveState=/{s///;h;};/^UnitFileState=/{s///;H;x;s/\\n/ /;p;}'; true")

    def process(self, output: list[str]) -> dict:
        return {u: tuple((line.split() + ["", ""])[:2]) for u, line in zip(self.units, output)}


@reading(ServiceStates, "units")
@operation()
def running(unit: str, units: list[str], enabled: bool = True):
    """``unit`` is active (and enabled, or disabled and stopped with ``enabled=False``);
    ``units``: the role's units, read together."""
    active, is_enabled = read_once(ServiceStates, units=units).get(unit, ("", ""))
    q = shlex.quote(unit)
    if enabled and (active, is_enabled) == ("active", "enabled"):
        host.noop(f"{unit} runs and is enabled")
    elif not enabled and active != "active" and is_enabled != "enabled":
        host.noop(f"{unit} is stopped and disabled")
    else:
        yield f"systemctl enable --now {q}" if enabled else f"systemctl disable --now {q}"
