"""The systemd side of a serving instance (roles/llama_server, roles/vllm): its drop-in
installed and its unit restarted when the drop-in changed, started when it is down, and nothing
when it runs as it should; instances dropped from the configuration stopped and removed."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files

from rigup.secrets import new_key, written


def unit_running(unit: str, dropin: str, text: str, state: dict, changed: bool, noop: str,
                 key: tuple[str, str, str] | None = None, fleet_key: str | None = None):
    """Commands (for an operation to ``yield from``) that bring ``unit`` to run with the drop-in
    ``text`` at ``dropin``: ``changed`` (the drop-in or something it names differs) installs it,
    reloads systemd and restarts the unit; a unit not active or not enabled is started; else
    ``noop`` is noted. ``state``: the instance's probe (``active``, ``enabled``, ``key``).
    ``key``: (path, group, prefix) of its API key, made on the host when missing (a restart);
    ``fleet_key``: the fleet's key instead (rigup.secrets.fleet_api_key), written there, sent on
    stdin, when the file differs (a restart)."""
    if key and fleet_key:
        path, group, prefix = key
        if hashlib.sha256((prefix + fleet_key).encode()).hexdigest() != state.get("key"):
            yield f"install -d -m 0750 -g {shlex.quote(group)} {shlex.quote(path.rsplit('/', 1)[0])}"
            yield written(path, prefix + fleet_key, mode="640", group=group)
            changed = True
    elif key and not state.get("key"):
        yield new_key(*key)
        changed = True
    if changed:
        yield from files.put._inner(src=StringIO(text), dest=dropin, mode="644")
        yield "systemctl daemon-reload"
        yield f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart {unit}"
    elif state.get("active") != "active" or state.get("enabled") != "enabled":
        yield f"systemctl enable {unit} && systemctl start {unit}"
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
