"""llama-server's command line and its systemd drop-in for one instance, as pure functions:
roles/llama_server installs the drop-in; tests/gpu/check.py runs its ExecStart on a GPU machine.
:func:`replica_commands` gives each replica's argv and environment for a plan (no pyinfra: run
it anywhere)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rigup.boundary.formats import ini_comment, ini_line, ini_section, systemd_env, systemd_quote, unit_comment
from rigup.contract import llama_server as contract
from rigup.contract.llama_server import queued   # the rule is the contract's: the metrics relay reads it too
from rigup.rpc import wait_argv
from rigup.templates import render
from rigup.units import main_first, replica_inst, replica_name, visible_devices

if TYPE_CHECKING:
    from rigup.instances.llama_server import LlamaInstance

KEY = contract.KEY
REVISION = re.compile(r"[A-Za-z0-9._-]{1,64}")   # a model's revision as its marker records it
# A router's hub cache: none (a path that is not there, and cannot be made by the service user): its
# /models would list, and load on request, whatever a cache of the service user's holds, past the VRAM plan
NO_CACHE = "/etc/rigup/llama-server/{}.no-cache"


def argv(name: str, inst: LlamaInstance, binary: str, model_path: str, rpc: list[str] = (),
         allow: list[str] = ()) -> list[str]:
    """llama-server's command line for one instance (every flag of the contract explicit, --port
    always; rigup/contract/llama_server.py ``args``, then ``written_flags``: --no-slots unless
    ``allow``, the host's llama_server_allow, has slots); ``rpc``:
    its workers' ADDRESS:PORT (rigup.rpc.endpoint), in the order of its rpc_workers. ``inst`` has
    its ctx and parallel chosen (replicas.sized), never ``auto``."""
    if "auto" in (inst["ctx"], inst["parallel"]) or inst.get("also") and inst["models_max"] == "auto":
        raise ValueError(f"{name}: ctx, parallel and a router's models_max are chosen by "
                         "roles/llama_server/replicas.py sized() first")
    # router mode (also): the models from the preset (:func:`preset_text`), each child given these flags too;
    # a pinned model's server answers as the model (:func:`servers`), as the router did
    serve = ["--models-preset", contract.PRESET.format(name), "--models-max", inst["models_max"]] \
        if inst.get("also") else ["-m", model_path, "--alias", inst.get("alias") or name]
    args = [binary, *serve, "--host", inst["host"], "--port", inst["port"], *contract.args(inst),
            *contract.written_flags(allow)]
    if inst["api_key"]:
        args += ["--api-key-file", KEY.format(name)]
    if rpc:
        args += ["--rpc", ",".join(rpc)]
    return [str(a) for a in args + list(inst["extra_args"])]


def preset_text(name: str, inst: LlamaInstance, paths: dict[str, str], revisions: dict[str, str] | None = None) -> str:
    """Router mode's preset (contract.PRESET): one section per model of the set (``paths``: its key
    of models -> its first GGUF file on the host; ``revisions``: its revision, in a comment, so that
    a new revision of any model changes the preset and restarts the router), the instance's own
    model loaded at start. Each line through the preset's writers (rigup/boundary/formats.py): a
    value llama.cpp would read as more (``;``, ``#``, a bracket, a newline) is refused, as is a
    relative path: nothing else can end up in the file."""
    def lines(values: dict, where: str) -> list[str]:
        return [ini_line(k, v, f"{name}: {where} {k}") for k, v in contract.preset_values(values)]

    out = [ini_comment(f"Installed by rigup (roles/llama_server) for instance {name}: the models llama-server's "
                       "router", name),
           "; serves on its port, each requested by its key (the instance's flags apply to each).", "version = 1"]
    own = inst.get("per_model") or {}
    moved = {k for flags in own.values() for k in flags} - set(contract.PER_MODEL_OWN)   # off the command line: here
    if moved:
        out += ["", "; the instance's value of each flag a model below sets for itself", "[*]",
                *lines({k: inst[k] for k in moved}, "the instance's")]
    for key in [inst["model"], *inst["also"]]:
        path, revision = paths[key], str((revisions or {}).get(key) or "unknown")
        where = f"{name}: the model file of {key} has a path the preset cannot hold"
        if not path.startswith("/"):
            raise ValueError(f"{where}: {path!r}")
        revision = revision if REVISION.fullmatch(revision) else "unreadable"
        out += ["", f"; revision {revision}", ini_section(key, f"{name}: a model's key"), ini_line("model", path, where)]
        startup = key == inst["model"] or (own.get(key) or {}).get("load_on_startup")
        out += (["load-on-startup = true"] if startup else []) + lines(own.get(key) or {}, f"{key}'s")
    return "\n".join(out) + "\n"


def fronted(inst: LlamaInstance, srv: list[dict]) -> bool:
    """Whether HAProxy (roles/balancer) takes the instance's port: replicas, or a router's queue
    (a router's pinned models are servers of their own, on their own ports)."""
    return len([s for s in srv if not s.get("pinned")]) > 1 or queued(inst)


def queue_limits(inst: LlamaInstance, wait_s: int) -> dict:
    """A queued router's limits in its backends file: ``slots`` (requests at the router at once:
    parallel x models_max, what its loaded models serve at once), ``queue`` (more that wait at
    HAProxy, each at most ``wait_s``; beyond them 429). Not more at the router: requests for more
    models than it may hold at once make it evict a model under a request, and in the lab such a
    request failed with HTTP 500 after the child's 10 s stop timeout (llama.cpp's router, b8779's
    tree)."""
    return {"slots": int(inst["parallel"]) * int(inst["models_max"]), "queue": int(inst["queue"]), "wait_s": int(wait_s)}


def backend_name(name: str) -> str:
    """The HAProxy backend of a replicated instance (roles/balancer's config, the drain helper)."""
    return contract.BACKEND.format(name)


def servers(name: str, inst: LlamaInstance, lay) -> list[dict]:
    """Each server of the instance: ``unit`` (the systemd instance name: NAME, or NAME-K for a
    replica), ``inst`` (as that server runs it: a replica on its loopback port) and ``env``
    (CUDA_VISIBLE_DEVICES of its GPU group, by UUID, when pinned). A router's pinned models
    (:func:`pinned_servers`) follow its own server, each with ``pinned``: its model."""
    def order(group: list[dict]) -> list[dict]:   # -ts shares follow the devices' order: kept as set
        return group if inst.get("tensor_split") else main_first(group)

    if lay.replicas == 1:   # one server over every GPU, as before: pinned only to put a downtrained card last
        group = lay.groups[0] if lay.gpu and lay.groups else []
        moved = order(group) != group or lay.pinned   # pinned: a quarantined card is left out (roles/burnin)
        env = {"CUDA_VISIBLE_DEVICES": visible_devices(order(group))} if moved else {}
        pins = contract.pinned(inst)
        router = routed(inst) if pins else inst
        return [{"unit": name, "inst": replica_inst(router, 0) if queued(inst) else router,   # a router behind its queue
                 "env": env}, *pinned_servers(name, inst, env)]
    return [{"unit": replica_name(name, k), "inst": replica_inst(inst, k),
             "env": {"CUDA_VISIBLE_DEVICES": visible_devices(order(group))} if lay.gpu else {}}
            for k, group in enumerate(lay.groups)]


def routed(inst: LlamaInstance) -> LlamaInstance:
    """A router as its own server runs it: its pinned models (and their flags) out of its set."""
    pins = contract.pinned(inst)
    return {**inst, "also": [m for m in inst["also"] if m not in pins],   # type: ignore[typeddict-item]
            "per_model": {m: f for m, f in (inst.get("per_model") or {}).items() if m not in pins}}


def pinned_servers(name: str, inst: LlamaInstance, env: dict) -> list[dict]:
    """A router's pinned models (``per_model: {M: {pinned: true}}``), each a server of its own beside
    the router, out of its eviction: unit NAME.M (contract PINNED_UNIT), the instance's host, its
    port (contract :func:`pinned`: port + 2 + i), the router's cards (``env``) and key, the
    instance's flags under the model's own (its per_model), answering as M (--alias: the name
    requests gave the router); with ``pinned``: M."""
    out = []
    for model, port in contract.pinned(inst).items():
        own = {k: v for k, v in ((inst.get("per_model") or {}).get(model) or {}).items()
               if k not in contract.PER_MODEL_OWN}
        alone = {**inst, **own, "model": model, "also": [], "per_model": {}, "models_max": 1, "queue": None,
                 "port": port, "alias": model}
        out.append({"unit": contract.PINNED_UNIT.format(name, model), "inst": alone, "env": dict(env), "pinned": model})
    return out


def replica_commands(name: str, inst: LlamaInstance, lay, binary: str, model_path: str) -> list[dict]:
    """Each server of a normalised instance of llama_server_instances laid out as ``lay``
    (roles/llama_server/replicas.py ``layout(inst, model, plan, data)``): its ``unit``
    (rigup-llama@UNIT), full ``argv`` (ExecStart) and ``env`` (what its drop-in sets), as the role
    installs them. Both modules are pure: on a machine without pyinfra, load them by their paths
    (as tests/gpu/check.py does) and call ``replica_commands(name, inst, replicas.layout(...), ...)``."""
    return [{"unit": s["unit"], "argv": argv(name, s["inst"], binary, model_path), "env": s["env"]}
            for s in servers(name, inst, lay) if not s.get("pinned")]   # a pinned model's: another model_path


def dropin_text(name: str, inst: LlamaInstance, binary: str, model_path: str, build: str, unit_sha: str,
                model_revision: str, env: dict | None = None, balancer: dict | None = None,
                rpc: list[str] = (), rpc_wait: int = 120, preset: str | None = None, allow: list[str] = (),
                origins: list[str] = (), command: list[str] | None = None) -> str:
    """The drop-in rigup-llama@NAME.service.d/rigup.conf: ExecStart (``command``: the server's
    argv as the serving plan made it, filled by the role's operation; else :func:`argv`, for the
    GPU checks: ``name``, the instance, whose alias and key a replica shares; ``allow``, the host's
    llama_server_allow), its ``env`` (a variable of a feature ``allow`` does not name: ValueError)
    and the CORS ``origins``
    (llama_server_cors_origins: contract ``written_env``), for a replica the balancer's hooks
    (``balancer``: {"ready": argv, "drain": argv}), with RPC workers (``rpc``: ADDRESS:PORT each)
    an ExecStartPre that waits ``rpc_wait`` s at most for them, and in a comment what restarts it
    when it changes (unit, llama.cpp build, model revision; in router mode the ``preset``'s sha256)."""
    held = sorted(set(env or {}) & set(contract.held_off_env(allow)))
    if held:   # no key of rigup's gives llama-server an environment: a guard for code that would
        raise ValueError(f"{name}: its environment would turn on {', '.join(held)}, which llama_server_allow "
                         "does not allow")
    return render("llama_server-dropin.conf.j2", name=unit_comment(name, "an instance's name"), unit_sha=unit_sha,
                  build=unit_comment(build, f"{name}: its llama.cpp build"),
                  model_revision=unit_comment(model_revision, f"{name}: its model's revision"),
                  model_path=systemd_quote(model_path),
                  preset=preset and unit_comment(preset, f"{name}: its preset's sha256"),
                  env=[systemd_env(k, v) for k, v in {**(env or {}), **contract.written_env(origins)}.items()],
                  balancer={k: [systemd_quote(a) for a in v] for k, v in balancer.items()} if balancer else None,
                  rpc_wait=[systemd_quote(a) for a in wait_argv(list(rpc), rpc_wait)] if rpc else None,
                  argv=[systemd_quote(a) for a in command or argv(name, inst, binary, model_path, rpc, allow)])
