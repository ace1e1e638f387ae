"""The serving plan and walk (roles/llama_server, roles/vllm). :func:`serving_plan`: every instance
of each engine on a host normalised, tuned and sized, with its servers (:class:`Served`,
:class:`Server`), made once by preflight and kept on the plan as ``serving``. :func:`serve`
installs exactly that: it takes an :class:`Engine`, an
engine's record, through the steps every serving engine takes on a host, in this order: its
planned instances (refused: nothing changes), its models, its servers, their markers and units, the servers
no longer wanted retired, the engine's install (vLLM's virtualenv and Ray node), the unlock wait,
the template unit, then per instance its backends file and per server its balancer hooks, its
drop-in and unit (the engine's operation), and unless in maintenance its gate (rigup.gate
``answered``) after a (re)start. An engine's role keeps only what is its own: its operation's
drop-in, its flags, its extras.

Below the walk, the systemd side of a server: its drop-in installed and its unit restarted when the
drop-in changed, started when it is down, and nothing when it runs as it should; servers no
longer wanted stopped and removed; replicas' hooks into the balancer (roles/balancer) and their
backends file."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from io import StringIO
from typing import NamedTuple, TypedDict

from pyinfra import host
from pyinfra.operations import files

from rigup import summary
from rigup.files import directory, managed
from rigup.gate import answered
from rigup.config import Config
from rigup.gpu.plan import Plan, unlock_wait
from rigup.models import models
from rigup.names import BALANCER_DIR, balancer_drain, balancer_file, marker_path
from rigup.probe import operation, python
from rigup.secrets import fleet_api_key, new_key, written
from rigup.state import read_once, will_read
from rigup.text import say


class Server(TypedDict, total=False):
    """One server of an instance as the host runs it: ``unit`` (the systemd instance name,
    TEMPLATE@UNIT.service), ``inst`` (the instance as that server runs it: a replica on its
    loopback port), ``env`` (what its drop-in sets: CUDA_VISIBLE_DEVICES of its cards), ``argv``
    (its command line, what its drop-in's ExecStart runs, each item as the plan made it but the
    :data:`SLOTS`, which the engine's operation fills: :func:`filled`) and, for a router's pinned
    model, ``pinned`` (the model)."""

    unit: str
    inst: dict
    env: dict
    argv: list[str]
    pinned: str


# The items of a server's argv the plan cannot know, each filled by its engine's operation from what
# it reads on the host or of its peers. Each holds a control character, which every writer of a
# unit's command refuses (rigup/boundary/formats.py systemd_quote): one left unfilled is never run.
MODEL_FILE = "\x00model-file"   # llama-server: its model's first GGUF file, as its completion marker names it
RPC = "\x00rpc"                 # llama-server: its RPC workers' ADDRESS:PORT, from their hosts' data
VLLM_EXE = "\x00vllm"           # vLLM: the pin's vllm (a short git commit names its virtualenv once expanded there)
SLOTS = (MODEL_FILE, RPC, VLLM_EXE)


def filled(argv: list[str], **values: str) -> list[str]:
    """A server's ``argv`` (:class:`Server`) with each slot given in ``values`` (model_file, rpc,
    vllm: :data:`SLOTS`) in its place."""
    slots = {MODEL_FILE: "model_file", RPC: "rpc", VLLM_EXE: "vllm"}
    return [values[slots[a]] if a in slots and slots[a] in values else a for a in argv]


class Served(NamedTuple):
    """An instance of an engine's map as it serves: ``inst`` normalised, tuned and sized (no
    ``auto`` left where the engine sizes it), its ``servers``, and ``sized``: the engine's own
    record of how it sized the instance, which its refusals and plan lines read (llama-server:
    roles/llama_server/replicas.py ``Sized``, its layout, why and a router's set plan; None where
    the engine keeps none)."""

    inst: dict
    servers: list[Server]
    sized: object = None


# engine (its Engine's role: "llama-server", "vllm") -> instance name -> what it serves; an engine
# whose instances have problems -> None (preflight refuses the host: nothing is served or retired)
ServingPlan = dict[str, "dict[str, Served] | None"]


@dataclass(frozen=True)
class Shared:
    """What one host's servers of an engine share, made once by the engine's ``prepare``: its state
    fact's arguments (``reads``: the retirement's read and every server's), its template unit's
    text and the role's files read with it (``paths``), and the engine's own values (``own``)."""

    plan: Plan
    data: Config
    reads: dict
    unit_text: str
    paths: list
    own: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Engine:
    """A serving engine as :func:`serve` walks it. ``role``: its operations' names ("llama-server");
    ``template``: its systemd template (units TEMPLATE@NAME.service) at ``unit``; ``state``: the
    fact its operations read, with :class:`Shared` ``reads``; ``instances(data)``: its contract's
    instances and problems; ``servers(wanted, plan, data, entries)``: each instance as served
    (:class:`Served`: sized, with its servers, each with ``unit``, ``inst``, ``env``, ``argv``;
    ``pinned`` for a router's pinned model);
    ``markers(inst, marker)``: a server's markers beyond its model's (``marker(key)``: a model's);
    ``prepare(plan, data, wanted, units)``: the :class:`Shared`; ``fronted(inst, servers)``: whether
    the balancer takes the instance's port; ``backend(name)``: its HAProxy backend; ``server``: its
    operation (one server's drop-in and unit) and ``args(shared, name, inst, server)`` its own
    arguments; ``gate(shared, name, inst, server)``: rigup.gate.answered's own arguments;
    ``install(shared, wanted, units)``: the engine's install before its servers, returning the
    :class:`Shared` to go on with or None (nothing to serve yet), else the walk goes on when an
    instance is wanted; ``limits(inst, data)``: a backends file's limits (a queued router's)."""

    role: str
    template: str
    unit: str
    state: type
    instances: Callable
    servers: Callable
    markers: Callable
    prepare: Callable
    fronted: Callable
    backend: Callable
    server: Callable
    args: Callable
    gate: Callable
    install: Callable | None = None
    limits: Callable | None = None


def serving_plan(engines: list[Engine], data: Config, plan: Plan) -> ServingPlan:
    """Every instance of each of ``engines`` on this host, normalised, tuned and sized, with each
    server's unit, port (its ``inst``), environment and argv: what :func:`serve` installs. Pure (data
    and plan in); preflight makes it once per host and keeps it on the plan (``serving``), where
    the serving roles, their refusals and plan lines, and the readers of the serving maps find it.
    An engine whose instances have problems maps to None, unsized (preflight refuses the host;
    its checks size the valid instances to name every refusal)."""
    entries = models(data)[0]
    out: ServingPlan = {}
    for engine in engines:
        wanted, problems = engine.instances(data)
        if problems:
            out[engine.role] = None
            continue
        out[engine.role] = engine.servers(wanted, plan, data, entries)
    return out


def serve(engine: Engine, plan: Plan, data: Config) -> None:
    """The serving walk of ``engine`` on this host (module docstring), called by its role's
    ``apply``: every operation it calls is the role's, in the role's deploy."""
    found = plan["serving"][engine.role]   # preflight's serving_plan
    if found is None:   # preflight refused the host: touch nothing
        return
    entries = models(data)[0]
    wanted = {name: s.inst for name, s in found.items()}
    plans = {name: s.servers for name, s in found.items()}

    def marker(key: str) -> str:
        return marker_path(entries[key]["dest"])
    # each server's model marker, the instance whose key it uses, and the engine's other markers
    units = {s["unit"]: [marker(s["inst"]["model"]), name, *engine.markers(s["inst"], marker)]
             for name, srv in plans.items() for s in srv}
    fronted = sorted(name for name, srv in plans.items() if engine.fronted(wanted[name], srv))
    shared = engine.prepare(plan, data, wanted, units)
    if wanted or any(u.startswith(f"{engine.template}@") for u in plan.get("serving_units") or []):  # none: no read
        will_read(engine.state, **shared.reads)
        retired(name=f"{engine.role}: retire servers no longer wanted", template=engine.template,
                fact=engine.state, reads=shared.reads, wanted=sorted(units),
                backends=[engine.backend(n) for n in fronted], drain=balancer_drain(data))
    shared = engine.install(shared, wanted, units) if engine.install else shared if wanted else None
    if shared is None:
        return
    unlock = waits_for_unlock(engine.role, wanted, plan, data)
    managed(name=f"{engine.role} template unit", dest=engine.unit, text=shared.unit_text, paths=shared.paths)
    unit_sha = hashlib.sha256(shared.unit_text.encode()).hexdigest()[:12]
    for name, srv in sorted(plans.items()):
        inst = wanted[name]
        if name in fronted:   # the balancer's servers: all but a router's pinned models
            backends_file(engine.backend(name), inst["host"], inst["port"],
                          [[s["unit"], s["inst"]["host"], s["inst"]["port"]] for s in srv if not s.get("pinned")],
                          engine.limits(inst, data) if engine.limits else None)
        for server in srv:
            unit, bind, port = server["unit"], server["inst"]["host"], server["inst"]["port"]
            hooks = balancer_hooks(engine.backend(name), unit, port, data) \
                if name in fronted and not server.get("pinned") else None
            started = engine.server(name=f"{engine.role} {unit} on {bind}:{port}", unit_name=unit, instance_name=name,
                                    inst=server["inst"], units=units, unit_sha=unit_sha, user=data["rigup_user"],
                                    balancer=hooks, fleet_key=fleet_api_key(data),
                                    maintenance=data["rigup_maintenance"], unlock=unlock,
                                    **engine.args(shared, name, inst, server))
            if data["rigup_maintenance"]:
                continue
            python.call(answered, unit=f"{engine.template}@{unit}.service", port=port, bind=bind,
                        name=f"{engine.role} {unit} answers", _if=started.did_change,
                        **engine.gate(shared, name, inst, server))


def waits_for_unlock(role: str, names, plan: dict, data: dict) -> str | None:
    """Why the instances ``names`` of a serving ``role`` wait (rigup.gpu.plan.unlock_wait: an
    enabled cmpunlocker whose cards still report their locked memory), said on the converge's
    output and the host's last line; None when they need not wait."""
    why = unlock_wait(plan, data) if names else None
    if why:
        say(f"    [{host.name}] {role}: {', '.join(sorted(names))}: {why}")
        summary.note(host, f"{role} {', '.join(sorted(names))}: waits for the unlocked VRAM (cold power-off, "
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


@operation()
def retired(template: str, fact: type, reads: dict, wanted: list[str], backends: list[str], drain: str):
    """The servers of ``template`` the host has (``fact``'s ``units``, read with ``reads``) that are
    not ``wanted`` (an instance dropped, a single server replaced by replicas or back, replicas
    beyond the count) stopped, disabled and their drop-ins removed (their keys and state stay,
    should they come back); its backends files (``fact``'s ``backends``) not in ``backends``
    removed, their frontends first giving up their ports (``drain``: roles/balancer's helper,
    ``release``), so that a single server taking over an instance's port starts at once
    (roles/balancer then drops or stops HAProxy)."""
    found = read_once(fact, **reads)
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
