"""The systemd side of a serving instance (roles/llama_server, roles/vllm): its drop-in
installed and its unit restarted when the drop-in changed, started when it is down, and nothing
when it runs as it should; instances dropped from the configuration stopped and removed."""

from __future__ import annotations

from io import StringIO

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files

from rigup.secrets import new_key


def unit_running(unit: str, dropin: str, text: str, state: dict, changed: bool, noop: str,
                 key: tuple[str, str, str] | None = None, block: bool = True, maintenance: bool = False):
    """Commands (for an operation to ``yield from``) that bring ``unit`` to run with the drop-in
    ``text`` at ``dropin``: ``changed`` (the drop-in or something it names differs) installs it,
    reloads systemd and restarts the unit; a unit not active or not enabled is started; else
    ``noop`` is noted. ``state``: the instance's probe (``active``, ``enabled``, ``key``).
    ``key``: (path, group, prefix) of its API key, made on the host when missing (a restart).
    ``block=False``: start or restart without waiting for the start job (the gate then waits, and
    shows the journal when its ExecStartPre fails). ``maintenance`` (rigup_maintenance): the unit is
    stopped, and nothing else changes (its drop-in, key and enablement stay, to start as they were
    when maintenance ends)."""
    if maintenance:
        if state.get("active") in ("active", "activating", "reloading"):
            yield f"systemctl stop {unit}"
        else:
            host.noop(f"{unit} is stopped (rigup_maintenance)")
        return
    now = "" if block else " --no-block"
    if key and not state.get("key"):
        yield new_key(*key)
        changed = True
    if changed:
        yield from files.put._inner(src=StringIO(text), dest=dropin, mode="644")
        yield "systemctl daemon-reload"
        yield f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart{now} {unit}"
    elif state.get("active") != "active" or state.get("enabled") != "enabled":
        yield f"systemctl enable {unit} && systemctl start{now} {unit}"
    else:
        host.noop(noop)


def stale_units(template: str, keep, plan: dict) -> list[str]:
    """Instances of ``template`` (``rigup-llama``) installed on the host (preflight's plan:
    ``serving_units``) whose names are not in ``keep``."""
    return sorted(u.split("@", 1)[1] for u in plan.get("serving_units") or []
                  if u.startswith(template + "@") and u.split("@", 1)[1] not in keep)


@operation()
def stale_removed(template: str, stale: list[str]):
    """Instances ``stale`` of ``template``: stopped, disabled, their drop-in removed, systemd
    reloaded (their keys and state stay, should they come back)."""
    for name in stale:
        unit = shlex.quote(f"{template}@{name}.service")
        yield (f"systemctl disable --now {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "
               f"rm -rf {shlex.quote(f'/etc/systemd/system/{template}@{name}.service.d')}")
    yield "systemctl daemon-reload"
