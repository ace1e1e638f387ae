"""roles/llama_server: llama.cpp's OpenAI-compatible server, one systemd unit per instance.

What it does to a host, for each of ``llama_server_instances`` (name -> recipe):
- the template unit ``rigup-llama@.service``: runs as ``rigup_user``, SIGINT to stop,
  TimeoutStartSec >= 600, Restart=on-failure with a start limit, after the driver and
  rigup-gpu-power, HOME and caches set, hardened (ProtectSystem=strict, DevicePolicy with
  /dev/nvidia* allowed, ...), kept down while the GPU guard is tripped;
- a drop-in per instance with its ExecStart: the first GGUF shard of its model (from the model's
  completion marker, roles/model_fetch), the llama.cpp build that ``current`` points to (read on
  the host: roles/llama_cpp switches it), ``--host --port``, a flag for each row of its contract
  (rigup/contract/llama_server.py: ``-c --parallel -ngl -fa -sm --jinja --metrics`` always, the
  others when set), ``--api-key-file`` and extra args;
- with ``api_key: true``, a random key made on the host (never seen by pyinfra or argv) in
  /etc/rigup/llama-server/NAME.key, root:rigup 0640, without trailing whitespace; with
  ``fleet_api_key: true`` (roles/balancer) the fleet's key from the controller there instead
  (rigup.secrets.fleet_api_key, sent on stdin), so that a gateway's one URL takes one key;
- starts an instance only once its model is complete, and with ``cmpunlocker_enabled`` only once
  the cards report their unlocked memory (before the cold power-off it waits, changing nothing:
  rigup.serving.waits_for_unlock); restarts it only when its unit, drop-in
  (flags, llama.cpp build, model) or key changed; then gates on /health 200 and one real chat
  completion, and shows the unit's journal when that fails; the gate keeps that completion's tok/s
  in ``rigup_state_dir/gate/UNIT.json`` (rigup.names.gate_record: the watchdog's default floor);
- adds the server flags of a trap that the serving build's smoke inference worked around
  (roles/llama_cpp: ``--no-repack`` where repacking crashed), from the build's ``rigup-smoke.json``. On a GPU build it also fails when
  llama-server logs ``no usable GPU found`` (it would silently run on the CPU);
- serves inference only unless ``llama_server_allow`` names more (rigup/contract/llama_server.py
  ``HELD_OFF``): ``--no-slots`` on the command line, ``LLAMA_ARG_CORS_ORIGINS`` in the drop-in's
  environment (``llama_server_cors_origins``; none: empty, no origin), and preflight refuses each
  flag of a feature not allowed in extra_args (rigup/instances/llama_server.py).

With ``replicas`` (roles/llama_server/replicas.py plans them): one unit ``rigup-llama@NAME-K`` per
replica, pinned to its GPU group by UUID (CUDA_VISIBLE_DEVICES in its drop-in), on 127.0.0.1 at
port + 1 + K, rejoining the balancer's pool once healthy and drained before it stops (ExecStartPost,
ExecStop: roles/balancer's helper); the instance's host:port is the balancer's, told by a backends
file (rigup.names.balancer_file). Servers no longer wanted (the single server replicas replace,
replicas beyond the count, instances dropped) are stopped and removed. Going back from replicas to
one server on the same port: the instance's frontend gives up the port before the server starts
(roles/balancer's helper), then roles/balancer drops the frontend, or stops and disables the
HAProxy it started when nothing is left to balance.

With ``rpc_workers`` (hosts of the inventory running roles/rpc_worker): ``--rpc ADDRESS:PORT,...``
(their inventory addresses and rpc_worker_port) and an ExecStartPre that waits
``llama_server_rpc_wait`` s at most for each worker's port, failing with the worker's name.

With ``also`` (more keys of ``models``) the instance is llama-server's router: one server on its
port, started with ``--models-preset /etc/rigup/llama-server/NAME.models.ini`` (one section per
model of the set, its first GGUF file; root:rigup_user 0640) and ``--models-max``, each model in a
child process of its own on a loopback port the kernel picks, loaded on the first request naming
it by its key (the instance's own model at start, and those with ``load_on_startup``), the least
recently used unloaded beyond models_max; it starts once every model of the set is complete,
restarts when the preset changes, and its gate asks the instance's own model. ``models_max: auto``
(the default) is written as how many of the router's models fit at once on its cards beside its
pinned ones, the largest first (roles/llama_server/replicas.py ``set_plan``: each at weights + KV
cache at its ctx + 1 GiB per GPU), at least 1; preflight's plan says the figure and why, and
refuses a set whose largest model does not fit beside the pinned ones, pinned ones that do not fit
together, and more models loaded at start than fit (checks.py ``check_set_vram``).

A model of ``also`` with ``per_model: {M: {pinned: true}}`` leaves the router's set (its preset,
its eviction) for a server of its own beside it: unit ``rigup-llama@NAME.M`` (a server of the
instance, as a replica is), on the instance's host at port + 2 + i (i: its place among the pinned,
in also's order; port + 1 is a queued router's), on the router's cards, with the instance's key
and flags under its own per_model, ``-m`` its model and ``--alias M``: a request names it as it
named it to the router, and a gateway (roles/balancer) sends requests naming it to that port
(rigup/contract/llama_server.py ``pinned``). It starts, restarts and is gated (asked as M) as any
server; unpinned, its unit is retired and the model is the router's again.

With ``rigup_maintenance`` (roles/base) every server is stopped and nothing else changes (its
drop-in, key and enablement stay); false again starts them, gated as after a restart.

Variables (roles/llama_server/defaults.yml): llama_server_instances, llama_server_health_timeout,
llama_server_health_prompt, llama_server_rpc_wait; and models / models_dir (roles/model_fetch), rigup_user, rigup_maintenance (roles/base),
llama_cpp_dir (roles/llama_cpp), rigup_state_dir (roles/base), cmpunlocker_enabled (roles/cmpunlocker). Instance form:
rigup/instances/llama_server.py; refusals: roles/llama_server/checks.py.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host
from pyinfra.api import OperationError, deploy
from rigup.role import Role
from rigup.probe import operation

from rigup.config import Config, config_of, role_defaults
from rigup.gpu.plan import Plan, build_backend
from rigup.models import first_gguf
from rigup.rpc import endpoint
from rigup.names import gate_record, guard_file
from rigup.contract.llama_server import PRESET, api_model
from rigup.secrets import bearer, written
from rigup.serving import MODEL_FILE, RPC, Engine, Served, Shared, filled, serve, unit_running
from rigup.state import read_once, reading
from rigup.text import shown
from roles.llama_server.checks import CHECKS, FLEET_CHECKS, fleet_plan_lines, plan_lines, ports
from roles.llama_server.command import (KEY, NO_CACHE, backend_name, dropin_text, fronted, preset_text, queue_limits,
                                       queued, render, servers)
from roles.llama_server.command import argv as command_line
from roles.llama_server.facts import DROPIN, LlamaServerState
from roles.llama_server.replicas import sizes
from rigup.instances.llama_server import LlamaInstance, instances
from roles.llama_server.smoke import smoke_runs
from rigup.instances.tuned import tuned_lines

__all__ = ["apply", "CHECKS", "FLEET_CHECKS", "fleet_plan_lines", "plan_lines", "ports", "smoke_runs"]

UNIT = "/etc/systemd/system/rigup-llama@.service"


@reading(LlamaServerState, "units", "build_link")
@operation()
def instance(unit_name: str, instance_name: str, inst: LlamaInstance, argv: list[str], binary: str, units: dict,
             build_link: str, unit_sha: str, user: str, env: dict, balancer: dict | None,
             rpc: list[str], rpc_wait: int, fleet_key: str | None = None, maintenance: bool = False,
             unlock: str | None = None, allow: list[str] = (), origins: list[str] = ()):
    """Server ``unit_name`` (the instance ``instance_name``, or one of its replicas): its key, its
    drop-in (``argv``: its command line as the serving plan made it, its model file and RPC workers
    filled here, then a trap's remedy the build's smoke avoided; with ``env`` and the ``balancer``
    hooks of a replica), and its unit enabled and running;
    restarted only when the drop-in (flags, the build ``build_link`` points to, the model) or the
    key changed. Waits (changes nothing) while its model is incomplete. ``units``: every server of
    the role on the host (read together, once), each with its model's marker first. ``rpc``: its
    RPC workers' ADDRESS:PORT; such a server is started without waiting for the start job, so that
    the gate shows why it failed (a worker that does not answer) from the journal. ``fleet_key``:
    the fleet's API key (else one made on the host). ``maintenance``: stopped, nothing else
    changes. ``unlock``: why it waits for the unlocked VRAM (rigup.serving.waits_for_unlock),
    changing nothing. ``allow``: the features beyond inference the host allows
    (llama_server_allow); ``origins``: its llama_server_cors_origins."""
    name = instance_name
    marker_file = units[unit_name][0]
    if unlock and not maintenance:
        host.noop(f"{unit_name}: waits for the unlocked VRAM: {unlock}")
        return
    found = read_once(LlamaServerState, units=units, build_link=build_link)
    state = found["instances"].get(unit_name, {})
    # its model's first GGUF file, and in router mode (also) each other model's of the set
    wanted = {inst["model"]: (marker_file, state.get("marker"))}
    wanted.update({key: (path, (state.get("markers") or {}).get(key))
                   for key, path in (units[unit_name][2] if inst["also"] else {}).items()})
    paths = {}
    for key, (path, found_marker) in wanted.items():
        if not found_marker:
            host.noop(f"{unit_name}: waiting for its model {key} ({path} is not there yet, or not a marker the fetch writes)")
            return
        gguf = first_gguf(found_marker.get("files", []))
        if not gguf:
            raise OperationError(f"{name}: no GGUF file (or first shard) among the files of {path}: "
                                 f"{', '.join(found_marker.get('files', [])) or 'none'}")
        paths[key] = path.rsplit("/", 1)[0] + "/" + gguf
    marker, model_path = state["marker"], paths[inst["model"]]
    remedy = [f for f in found["remedy"] if f not in inst["extra_args"]]   # a trap the build's smoke avoided
    inst = {**inst, "extra_args": [*inst["extra_args"], *remedy]} if remedy else inst
    revisions = {key: (found_marker or {}).get("revision") for key, (_, found_marker) in wanted.items()}
    try:   # router mode: the set's preset; a model file's name it cannot hold (a hub's '#', ';', '[') fails this host
        preset = preset_text(name, inst, paths, revisions) if inst["also"] else None
    except ValueError as e:   # (round 13 SV1: a ValueError here ended the run for every host)
        raise OperationError(shown(str(e), 4000)) from None
    digest = hashlib.sha256(preset.encode()).hexdigest() if preset else None
    command = [*filled(argv, model_file=model_path, rpc=",".join(rpc)), *remedy]   # extra_args, then the remedy
    text = dropin_text(name, inst, binary, model_path, found["build"] or "none", unit_sha, marker.get("revision"),
                       env, balancer, rpc, rpc_wait, preset=digest, allow=allow, origins=origins, command=command)
    changed = hashlib.sha256(text.encode()).hexdigest() != state.get("dropin")
    if preset and digest != state.get("preset") and not maintenance:
        where = PRESET.format(name)
        yield f"install -d -m 0750 -g {shlex.quote(user)} {shlex.quote(where.rsplit('/', 1)[0])}"
        yield written(where, preset, mode="640", group=user)
        changed = True
    unit = f"rigup-llama@{unit_name}.service"
    yield from unit_running(unit, DROPIN.format(unit_name), text, state, changed,
                            f"{unit_name} runs with its current drop-in and key",
                            key=(KEY.format(name), user, "") if inst["api_key"] else None, fleet_key=fleet_key,
                            block=not rpc, maintenance=maintenance)


def _servers(wanted: dict, plan: Plan, data: Config, entries: dict) -> dict[str, Served]:
    """The instances with ctx, parallel and models_max sized where auto (replicas.py ``sizes``,
    kept as each one's ``sized`` for checks.py), and each one's servers (command.py ``servers``:
    replicas, a router's pinned models), each with its ``argv`` (command.py ``argv``; its model
    file and RPC workers the operation's to fill: rigup.serving MODEL_FILE, RPC)."""
    laid = {name: sizes(inst, entries[inst["model"]], plan, data, entries) for name, inst in wanted.items()}

    def with_argv(name: str, server: dict) -> dict:
        rpc = [RPC] if server["inst"]["rpc_workers"] else []
        return {**server, "argv": command_line(name, server["inst"], _binary(data), MODEL_FILE, rpc,
                                               data["llama_server_allow"])}
    return {name: Served(s.inst, [with_argv(name, srv) for srv in servers(name, s.inst, s.layout)], s)
            for name, s in laid.items()}


def _binary(data: Config) -> str:
    """The server binary in the build link its state reads (llama_cpp_dir/current)."""
    return f"{data['llama_cpp_dir']}/current/bin/llama-server"


def _prepare(plan: Plan, data: Config, wanted: dict, units: dict) -> Shared:
    """The build link its state reads, the template unit, the server binary and whether it serves from GPUs."""
    build_link = f"{data['llama_cpp_dir']}/current"
    text = render("llama_server-unit.service.j2", user=data["rigup_user"], guard_file=guard_file(data),
                  start_timeout=max(600, data["llama_server_health_timeout"]),
                  fabric=bool((plan.get("fabric") or {}).get("nvswitches")))
    return Shared(plan, data, {"units": units, "build_link": build_link}, text, [UNIT],
                  {"binary": _binary(data), "gpu": build_backend(plan, data) == "cuda"})


def _args(shared: Shared, name: str, inst: LlamaInstance, server: dict) -> dict:
    """:func:`instance`'s own arguments: a router's children keep no model cache (NO_CACHE), its RPC workers."""
    data, env = shared.data, server["env"]
    return {"argv": server["argv"], "binary": shared.own["binary"], "build_link": shared.reads["build_link"],
            "env": {**env, "LLAMA_CACHE": NO_CACHE.format(name)} if server["inst"]["also"] else env,
            "rpc": [endpoint(w, config_of(host.inventory.get_host(w))) for w in inst["rpc_workers"]],
            "rpc_wait": data["llama_server_rpc_wait"], "allow": data["llama_server_allow"],
            "origins": data["llama_server_cors_origins"]}


def _gate(shared: Shared, name: str, inst: LlamaInstance, server: dict) -> dict:
    """The gate asks a pinned model by its name, else the instance's; its tok/s kept for the watchdog."""
    data, unit = shared.data, f"rigup-llama@{server['unit']}.service"
    return {"record": gate_record(data, unit), "model": server.get("pinned") or api_model(name, inst),
            "prompt": data["llama_server_health_prompt"], "timeout": data["llama_server_health_timeout"],
            "auth": bearer(KEY.format(name)) if inst["api_key"] else "",
            "fail_on_log": "no usable GPU found" if shared.own["gpu"] else None}   # it would serve from the CPU


LLAMA = Engine(
    role="llama-server", template="rigup-llama", unit=UNIT, state=LlamaServerState, instances=instances,
    servers=_servers, markers=lambda inst, marker: [{m: marker(m) for m in inst["also"]}] if inst["also"] else [],
    prepare=_prepare, fronted=fronted, backend=backend_name, server=instance, args=_args, gate=_gate,
    limits=lambda inst, data: queue_limits(inst, data["llama_server_health_timeout"]) if queued(inst) else None)


@deploy("llama_server", data_defaults=role_defaults("llama_server"))
def apply(plan: Plan, data: Config):
    serve(LLAMA, plan, data)


def _plan_lines(plan: Plan, data: Config) -> list[str]:
    """checks.plan_lines, then a tuned router model no longer served (tuned.tuned_lines: ignored)."""
    return plan_lines(plan, data) + tuned_lines(data)


ROLE = Role("llama_server", apply, checks=CHECKS, fleet_checks=FLEET_CHECKS, ports=ports, plan_lines=_plan_lines, fleet_plan_lines=fleet_plan_lines, smoke_runs=smoke_runs, engine=LLAMA)
