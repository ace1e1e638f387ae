"""The systemd side of a serving instance (roles/llama_server, roles/vllm): its drop-in
installed and its unit restarted when the drop-in changed, started when it is down, and nothing
when it runs as it should; servers no longer wanted stopped and removed; replicas' hooks into the
balancer (roles/balancer) and their backends file."""

from __future__ import annotations

import hashlib
import json
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.operations import files

from rigup import summary
from rigup.files import directory, managed
from rigup.gpu.plan import unlock_wait
from rigup.names import BALANCER_DIR, balancer_drain, balancer_file
from rigup.secrets import new_key, written
from rigup.text import say


def waits_for_unlock(role: str, names, plan: dict, data: dict) -> str | None:
    """Why the instances ``names`` of a serving ``role`` wait (rigup.gpu.plan.unlock_wait: an
    enabled cmpunlocker whose cards still report their locked memory), said on the converge's
    output and the host's last line; None when they need not wait."""
    why = unlock_wait(plan, data) if names else None
    if why:
        say(f"    [{host.name}] {role}: {', '.join(sorted(names))}: {why}")
        summary.note(host.name, f"{role} {', '.join(sorted(names))}: waits for the unlocked VRAM (cold power-off, "
                                "then converge again)")
    return why


def unit_running(unit: str, dropin: str, text: str, state: dict, changed: bool, noop: str,
                 key: tuple[str, str, str] | None = None, fleet_key: str | None = None, block: bool = True,
                 maintenance: bool = False):
    """Commands (for an operation to ``yield from``) that bring ``unit`` to run with the drop-in
    ``text`` at ``dropin``: ``changed`` (the drop-in or something it names differs) installs it,
    reloads systemd and restarts the unit; a unit not active or not enabled is started; else
    ``noop`` is noted. ``state``: the instance's probe (``active``, ``enabled``, ``key``).
    ``key``: (path, group, prefix) of its API key, made on the host when missing (a restart);
    ``fleet_key``: the fleet's key instead (rigup.secrets.fleet_api_key), written there, sent on
    stdin, when the file differs (a restart).
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
        yield f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart{now} {unit}"
    elif state.get("active") != "active" or state.get("enabled") != "enabled":
        # a unit that hit its start limit (a worker or a model that was away) starts when told to
        yield f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl start{now} {unit}"
    else:
        host.noop(noop)


def balancer_hooks(backend: str, unit: str, port: int, data: dict) -> dict:
    """A replica's ExecStartPost/ExecStop argv: back in the balancer's pool (HAProxy backend
    ``backend``, server ``unit``) once healthy on ``port``, drained before it stops
    (rigup.names.balancer_drain, installed by roles/balancer)."""
    drain = balancer_drain(data)
    return {"ready": [drain, "ready", backend, unit, str(port)], "drain": [drain, "drain", backend, unit]}


def backends_file(backend: str, bind: str, port: int, servers: list[list], limits: dict | None = None) -> None:
    """The balancer's backends file of a replicated instance (rigup.names.balancer_file): its public
    ``bind`` and ``port``, and each replica's [unit, loopback address, port]; a queued router's
    ``limits`` too (roles/llama_server command.queue_limits: slots, queue, wait_s)."""
    text = json.dumps({"bind": bind, "port": port, "servers": servers, **(limits or {})}, indent=2) + "\n"
    dest = balancer_file(backend)
    directory(name=f"Directory {BALANCER_DIR}", path=BALANCER_DIR, paths=[BALANCER_DIR, dest])
    managed(name=f"Balancer backends {backend}", dest=dest, text=text, paths=[BALANCER_DIR, dest])


def retirements(template: str, found: dict, wanted, backends, drain: str):
    """Commands (for an operation to ``yield from``; a no-op when there is nothing to retire): the
    instances of ``template`` the host has (``found["units"]``) that are not ``wanted`` stopped,
    disabled and their drop-ins removed (their keys and state stay, should they come back); its
    backends files (``found["backends"]``) not in ``backends`` removed, their frontends first giving
    up their ports (``drain``: roles/balancer's helper, ``release``), so that a single server
    taking over an instance's port starts at once (roles/balancer then drops or stops HAProxy)."""
    q = shlex.quote
    stale = [u for u in found["units"] if u not in wanted]
    gone = [b for b in found["backends"] if b not in backends]
    if not stale and not gone:
        host.noop(f"no retired {template} servers or backends")
        return
    for name in stale:
        unit = q(f"{template}@{name}.service")
        yield (f"systemctl disable --now {unit}; systemctl reset-failed {unit} 2>/dev/null; "
               f"rm -rf {q(f'/etc/systemd/system/{template}@{name}.service.d')}")
    for backend in gone:
        yield f"if [ -x {q(drain)} ]; then {q(drain)} release {q(backend)}; fi"
        yield f"rm -f {q(balancer_file(backend))}"
    yield "systemctl daemon-reload"
