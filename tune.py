"""The fastest llama-server flags for each instance of a host, measured on the host itself, written
as the host's data for you to commit; the next converge serves with them.

    pyinfra inventory/mine.py tune.py --limit rig-07 --serial          # the instances stop meanwhile
    .venv/bin/python roll.py inventory/mine.py --play tune.py           # a fleet: one host at a time,
                                                                        # out of the gateways' pools

The sweep starts from the serving plan, as a converge of deploy.py makes it (roles/preflight runs
first and prints it; a host it refuses sweeps nothing): each instance's sized context and slots,
its flags, its cards. The host's installed server is read only to be compared with the plan's
(plays.tuning ``differences``: its drop-in's command line and cards, a router's preset): an
instance whose unit is missing or differs is refused before any change on the host, naming what
differs ("installed -c 4096, the plan's -c 8192": converge deploy.py first), its host failing at
the end, and the others are swept.

For each instance of llama_server_instances with one server (replicas: 1), and each model of a router (also)
in turn, loaded alone (the server its router would start for it: plays.tuning ``model_argv``; a pinned
model's own server), the router's (or the pinned server's) unit stopped meanwhile: a job on the host
(plays.tuning ``job``: a transient unit, so that it outlives the SSH session) stops its unit, runs
plays/shipped/tune.py as the rigup user, with the unit's environment (its GPUs, CUDA's libraries): a
bounded sweep from the instance as it is (on GPUs with part of the model in host RAM, -ngl up or
--n-cpu-moe down until it does not fit; --parallel; --cache-ram 0; on several GPUs the split mode,
-ts and -mg; on GPUs -fa, batch sizes and a q8_0 KV cache), each point a real server answering
completions at llama_server_tune_levels, within llama_server_tune_budget_s, and starts the unit
again, whatever the sweep did. root's files of the tuner (the scripts, each spec, log and done marker)
live in rigup_state_dir/tuner (root:rigup 0750: anything there that is not root's regular file is
refused before any change); the sweep writes only in its out/ (the rigup user's), and root reads
the result from there as that user (rigup/nofollow.py). A progress line per host; at the end ``host_vars/<host>.yml`` (under the site
directory, RIGUP_SITE, when there is one) gains ``llama_server_tuned`` (rigup/instances/tuned.py;
a router's models under its ``models``, each laid over its ``per_model`` by the next converge)
and ``tune_out/<date>/<host>-<instance>.md`` (``<host>-<router>-<model>.md``; and ``.png``, bench.py's
plot) holds every point.
Variables (roles/llama_server/defaults.yml): llama_server_tune_concurrency, _levels, _budget_s,
_max_parallel, _max_tokens, _port.
"""

import io
import json

from pyinfra import host
from pyinfra.api import OperationError
from pyinfra.operations import files, python, server

from plays import charts, tuning
from rigup import nofollow, progress, summary
from rigup.boundary.core import Unreadable
from rigup.config import configure, host_only
from rigup.contract import llama_server
from rigup.files import program, program_paths
from rigup.models import models
from rigup.names import marker_path
from rigup.text import say
from roles import cuda_toolkit, in_order, preflight
from roles.llama_server import LLAMA
from roles.llama_server.command import argv as command_argv, preset_text
from roles.llama_server.facts import REMEDIES

with host_only(host):   # a configuration error fails this host, named, not the run
    data = configure(host, in_order())   # the host's configuration, with the hub's answers, as deploy.py reads it
    plan = preflight.run(in_order(), data)   # the plan a converge installs (its serving: rigup.serving serving_plan)
    ready = host not in host.state.failed_hosts   # preflight refused it: nothing read or changed beyond its facts
    d, out, user = tuning.workdir(data), tuning.outdir(data), data["rigup_user"]
    serving = ((plan.get("serving") or {}).get("llama-server") or {}) if ready else {}
    # one server each; a router (also: several models, issue 49) is swept a model at a time (issue 63)
    instances = {n: s for n, s in serving.items() if s.inst["replicas"] == 1 and not s.inst["also"]}
    routers = {n: s for n, s in serving.items() if s.inst["replicas"] == 1 and s.inst["also"]}
    gpu = data.get("llama_cpp_backend") != "cpu"   # -fa, batch sizes, KV types, offload and split swept
    entries = models(data)[0]
    cuda_env = cuda_toolkit.unit_env(plan, data)   # the cuda.env a converge writes (None: none), compared with the host's
    shared = LLAMA.prepare(plan, data, {n: s.inst for n, s in serving.items()}, {}) if serving else None
    # root writes in d (scripts, specs, logs, done markers): refused before any change where anything
    # there is not root's own regular file (a link, a FIFO, a file of the rigup user)
    unsafe = host.get_fact(tuning.Unsafe, folder=d, user=user) if ready else []
    for kind, owner, path in unsafe:
        say(f"    [{host.name}] refused: {path} ({tuning.KINDS.get(kind, kind)}, {owner}'s): where root writes for "
            "the tuner only root's own files may be, never what another user placed; fix: remove it (rm -rf on "
            "the host follows no link), then run tune.py again", fg="red")
    if unsafe:
        summary.fail(host, [f"{len(unsafe)} path(s) in {d} not root's own"])


    def sweep(name: str, argv: list[str], gpu_layers: bool, key, served: dict, ctx: int, parallel: int,
              stop: str | None = None, router: str | None = None, model: str | None = None) -> None:
        """The operations of one sweep, ``name`` (an instance, or ``router``'s ``model``, whose job
        stops the unit ``stop``) of ``ctx`` and ``parallel`` (the plan's): its spec, its job, the wait,
        and what it found kept (plays.tuning.record)."""
        spec = tuning.spec(name, argv, data, gpu_layers, key, served, ctx=ctx, parallel=parallel)
        files.put(name=f"tune.py: {name}'s spec", src=io.StringIO(json.dumps(spec, indent=1)),
                  dest=f"{d}/{name}.spec.json", user="root", group=user, mode="640")
        unit, command, log, done = tuning.job(name, data, stop)
        server.shell(name=f"tune.py: start the sweep of {name}", commands=[progress.start_command(unit, command, log, True)])
        python.call(name=f"tune.py: the sweep of {name}", function=progress.waited, label=f"tune {name}", unit=unit,
                    log=log, done=progress.exists(done), systemd=True, timeout=int(data["llama_server_tune_budget_s"]) + 1200)

        def keep(name=name, argv=argv, build=served.get("build"), gpus=spec["gpus"]):
            # the result is the rigup user's: read as that user, never through a link, never from a FIFO
            ok, got = host.run_shell_command(command=f"{nofollow.FUNCTIONS}; {nofollow.read_file(out, f'{out}/{name}.json', 16 << 20)}",
                                             print_output=False, print_input=False)
            # read by its typed reader (tuning.record) before anything is written
            tuning.record(host.name, router or name, ("\n".join(got.stdout_lines) or None) if ok else None, data, argv,
                          build, where=f"{host.name}:{out}/{name}.json", model=model, plot=charts.plot, gpus=gpus)

        python.call(name=f"tune.py: keep what the sweep of {name} found", function=keep)


    refusals: list[str] = []   # a record on the host that does not read: this host is refused, never the run
    stale: list[str] = []      # an instance whose installed server is not the plan's: not swept, the host fails at the end
    todo: list[tuple] = []     # each sweep's arguments, once what it runs from reads and is the plan's


    def refuse(label: str, e: Unreadable) -> None:
        """Sweep ``label`` refused: its drop-in or preset does not read (``e``); the host fails after its sweeps are
        read (an exception here, in the play's load-time code, would end the run for every host)."""
        say(f"    [{host.name}] refused: tune {label}: {e.where}: {e.why}; fix the file (converge deploy.py rewrites it)",
            fg="red")
        refusals.append(f"tune {label}: {e.where} does not read")


    def not_the_plans(label: str, found: list[str]) -> None:
        """Sweep ``label`` refused before any change: the host's installed server is not the plan's (``found``)."""
        say(f"    [{host.name}] refused: tune {label}: " + "; ".join(found) + ": converge deploy.py first", fg="red")
        stale.append(f"tune {label}: " + "; ".join(found) + ": converge deploy.py first")


    def model_dir(key: str) -> str:
        """The directory of model ``key`` as the plan places it (its file in there: its marker's first GGUF shard)."""
        return marker_path(entries[key]["dest"]).rsplit("/", 1)[0]


    def as_planned(name: str, s, srv: dict, label: str) -> tuple[list[str], dict] | None:
        """(the installed ExecStart, :class:`plays.tuning.ServingEnv`) of server ``srv`` of instance
        ``name`` (``s``: its plan), when that is the plan's: its drop-in as roles/llama_server writes it
        (command.py ``argv``, with the host's own parts as installed: the model's file, a build's
        remedies), its cards; else None, ``label``'s sweep refused (not read, or not the plan's)."""
        unit, inst = srv["unit"], srv["inst"]
        installed = host.get_fact(tuning.ExecStart, instance=unit)
        served = host.get_fact(tuning.ServingEnv, instance=unit)
        for e in (installed, served.get("error")):
            if isinstance(e, Unreadable):
                refuse(label, e)
                return None
        own = LLAMA.args(shared, name, s.inst, srv)   # what the role writes it with: binary, RPC workers, allow, env
        file = (tuning.settings(installed or []).get("-m") or [()])[-1][:1]
        want = command_argv(name, inst, own["binary"], file[0] if file else model_dir(inst["model"]), own["rpc"],
                            own["allow"])
        found = tuning.differences(want, installed, None if inst["also"] else model_dir(inst["model"]), REMEDIES,
                                   {**own["env"], **llama_server.written_env(own["origins"])}, served["env"],   # the drop-in's
                                   None if cuda_env is None else tuning.env_file(cuda_env))   # cuda.env's
        if found:
            not_the_plans(label, found)
            return None
        return installed, served


    def preset_as_planned(name: str, router: dict, label: str) -> dict | None:
        """Router ``name``'s preset as the host holds it (:class:`plays.tuning.Preset`'s sections), when
        it is the plan's (command.py ``preset_text`` of its server ``router``, each model's file as
        installed where it is under the model's directory); else None, said."""
        preset = host.get_fact(tuning.Preset, instance=name)
        if preset.get("error"):
            say(f"    [{host.name}] tune {label}: {preset['error']}; not swept")
            return None
        have, inst = preset["sections"], router["inst"]
        dirs = {k: model_dir(k) for k in [inst["model"], *inst["also"]]}
        paths = {k: p if (p := (have.get(k) or {}).get("model", "")).startswith(v + "/") else v for k, v in dirs.items()}
        try:
            want = tuning.preset_sections(preset_text(name, inst, paths).splitlines(), "the plan's preset")
        except ValueError as e:   # a file's path a preset cannot hold: not one rigup wrote
            want, found = {}, [f"its preset's model file: {e}"]
        else:
            found = tuning.preset_differences(want, have, dirs)
        if found:
            not_the_plans(label, found)
            return None
        return have


    for name, s in sorted(instances.items()) if not unsafe else ():
        got = as_planned(name, s, s.servers[0], name)
        if got:
            todo.append((name, got[0], gpu and s.inst["ngl"] != 0, llama_server.KEY.format(name) if s.inst["api_key"]
                         else None, got[1], s.inst["ctx"], s.inst["parallel"], {}))

    for name, s in sorted(routers.items()) if not unsafe else ():
        router = s.servers[0]   # the router's own server; a pinned model's follow it
        got = as_planned(name, s, router, name)
        sections = preset_as_planned(name, router, name) if got else None
        if sections is None:
            continue
        key = llama_server.KEY.format(name) if s.inst["api_key"] else None
        pins = {srv["pinned"]: srv for srv in s.servers if srv.get("pinned")}   # each serves from its own unit
        for model in [s.inst["model"], *s.inst["also"]]:   # each alone, its server stopped meanwhile
            if model in pins:
                alone, inst, stop = as_planned(name, s, pins[model], f"{name} {model}"), pins[model]["inst"], pins[model]["unit"]
            else:   # the server its router starts for it: the router's flags under the model's own
                argv, why = tuning.model_argv(got[0], sections, model)
                if not argv:
                    say(f"    [{host.name}] tune {name} {model}: {why}; not swept")
                    continue
                alone, stop = (argv, got[1]), name
                inst = {**router["inst"], **((router["inst"].get("per_model") or {}).get(model) or {})}
            if alone:
                todo.append((tuning.model_job(name, model), alone[0], gpu and inst["ngl"] != 0, key, alone[1], inst["ctx"],
                             inst["parallel"], {"stop": stop, "router": name, "model": model}))

    try:   # the host_vars file each sweep's result is merged into: refused before any sweep (round 10 T1)
        tuning.host_vars(host.name, data.get("_rigup_site"))
    except Unreadable as e:
        say(f"    [{host.name}] refused: tune: {e.where}: {e.why}", fg="red")
        refusals.append(f"tune: {e.where} does not read")

    if todo and not unsafe and not refusals:
        files.directory(name="tune.py: the old directory (the rigup user's)", path=tuning.old_workdir(data), present=False)
        files.directory(name="tune.py: its directory", path=d, user="root", group=user, mode="750")
        files.directory(name="tune.py: the sweep's own directory", path=out, user=user, group=user, mode="750")
        tuner = f"{d}/rigup_tune.py"
        for stale_copy in ("rigup_contract.py", "rigup_llama_contract.py"):   # what an older rigup sent (issue 64: no more)
            files.file(name=f"tune.py: no {stale_copy} (the contracts stay on the controller)", path=f"{d}/{stale_copy}",
                       present=False)
        program(tuning.TUNER, tuner, program_paths(tuner, tuning.TUNER_BESIDE), name="tune.py: rigup_tune.py",
                beside=tuning.TUNER_BESIDE, mode="644")
        for name, argv, gpu_layers, key, served, ctx, parallel, where in todo:
            sweep(name, argv, gpu_layers, key, served, ctx, parallel, **where)

    if refusals:   # fails closed for this host alone: none of its sweeps runs
        summary.fail(host, refusals)
    elif stale:   # the others swept first; then the host fails, naming each instance not swept
        def not_swept(found=tuple(stale)):
            raise OperationError("; ".join(found))

        python.call(name="tune.py: the instances not the plan's (converge deploy.py first)", function=not_swept)
