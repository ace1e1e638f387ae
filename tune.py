"""The fastest llama-server flags for each instance of a host, measured on the host itself, written
as the host's data for you to commit; the next converge serves with them.

    pyinfra inventory/mine.py tune.py --limit rig-07 --serial          # the instances stop meanwhile
    .venv/bin/python roll.py inventory/mine.py --play tune.py           # a fleet: one host at a time,
                                                                        # out of the gateways' pools

For each instance of llama_server_instances with one server (replicas: 1), and each model of a router (also)
in turn, loaded alone (the server its router would start for it: rigup.tuning ``model_argv``; a pinned
model's own server), the router's (or the pinned server's) unit stopped meanwhile: a job on the host
(rigup.tuning ``job``: a transient unit, so that it outlives the SSH session) stops its unit, runs
rigup/tune.py as the rigup user, with the unit's environment (its GPUs, CUDA's libraries): a
bounded sweep from the instance as it is (on GPUs with part of the model in host RAM, -ngl up or
--n-cpu-moe down until it does not fit; --parallel; --cache-ram 0; on several GPUs the split mode,
-ts and -mg; on GPUs -fa, batch sizes and a q8_0 KV cache), each point a real server answering
completions at llama_server_tune_levels, within llama_server_tune_budget_s, and starts the unit
again, whatever the sweep did. root's files of the tuner (the scripts, each spec, log and done marker)
live in rigup_state_dir/tuner (root:rigup 0750: anything there that is not root's regular file is
refused before any change); the sweep writes only in its out/ (the rigup user's), and root reads
the result from there as that user (rigup/nofollow.py). A progress line per host; at the end ``host_vars/<host>.yml`` (under the site
directory, RIGUP_SITE, when there is one) gains ``llama_server_tuned`` (roles/llama_server/tuned.py;
a router's models under its ``models``, each laid over its ``per_model`` by the next converge)
and ``tune_out/<date>/<host>-<instance>.md`` (``<host>-<router>-<model>.md``; and ``.png``, bench.py's
plot) holds every point.
Variables (roles/llama_server/defaults.yml): llama_server_tune_concurrency, _levels, _budget_s,
_max_parallel, _max_tokens, _port.
"""

import io
import json

from pyinfra import host
from pyinfra.operations import files, python, server

import charts
from rigup import nofollow, progress, summary, tuning
from rigup.boundary.core import Unreadable
from rigup.config import check_host
from rigup.contract import llama_server
from rigup.text import say
from rigup.tune import flags_of

data = check_host(host)   # the host's configuration (rigup.config.Config)
d, out, user = tuning.workdir(data), tuning.outdir(data), data["rigup_user"]
# one server each; a router (also: several models, issue 49) is swept a model at a time (issue 63)
instances = {n: i for n, i in llama_server.view(data).items() if i["replicas"] == 1 and not i.get("also")}
routers = {n: i for n, i in llama_server.view(data).items() if i["replicas"] == 1 and i.get("also")}
gpu = data.get("llama_cpp_backend") != "cpu"   # -fa, batch sizes, KV types, offload and split swept
# root writes in d (scripts, specs, logs, done markers): refused before any change where anything
# there is not root's own regular file (a link, a FIFO, a file of the rigup user)
unsafe = host.get_fact(tuning.Unsafe, folder=d, user=user)
for kind, owner, path in unsafe:
    say(f"    [{host.name}] refused: {path} ({tuning.KINDS.get(kind, kind)}, {owner}'s): where root writes for "
        "the tuner only root's own files may be, never what another user placed; fix: remove it (rm -rf on "
        "the host follows no link), then run tune.py again", fg="red")
if unsafe:
    summary.refused(host.name, [f"{len(unsafe)} path(s) in {d} not root's own"])
    host.state.fail_hosts({host})
else:
    files.directory(name="tune.py: the old directory (the rigup user's)", path=tuning.old_workdir(data), present=False)
    files.directory(name="tune.py: its directory", path=d, user="root", group=user, mode="750")
    files.directory(name="tune.py: the sweep's own directory", path=out, user=user, group=user, mode="750")
    for script, source in tuning.SCRIPTS.items():
        files.put(name=f"tune.py: {script}", src=str(source), dest=f"{d}/{script}", mode="644")


def sweep(name: str, argv: list[str], gpu_layers: bool, key, served: dict, stop: str | None = None,
          router: str | None = None, model: str | None = None) -> None:
    """The operations of one sweep, ``name`` (an instance, or ``router``'s ``model``, whose job
    stops the unit ``stop``): its spec, its job, the wait, and what it found kept (rigup.tuning.record)."""
    spec = tuning.spec(name, argv, data, gpu_layers, key, served,
                       where=f"{tuning.DROPIN.format(stop or name)}" + (f" and {tuning.PRESET.format(router)}" if router else ""))
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


def refuse(label: str, e: Unreadable) -> None:
    """Sweep ``label`` refused: its drop-in or preset does not read (``e``); the host fails after its sweeps are
    read (an exception here, in the play's load-time code, would end the run for every host)."""
    say(f"    [{host.name}] refused: tune {label}: {e.where}: {e.why}; fix the file (converge deploy.py rewrites it)",
        fg="red")
    refusals.append(f"tune {label}: {e.where} does not read")


def swept(label: str, name: str, argv: list[str], gpu_layers: bool, key, served: dict, **where) -> None:
    """:func:`sweep`, or the sweep refused (:func:`refuse`) when what it runs from does not read
    (its drop-in's ExecStart=, Environment= or counts)."""
    try:
        if served.get("error"):
            raise served["error"]
        sweep(name, argv, gpu_layers, key, served, **where)
    except Unreadable as e:
        refuse(label, e)


for name, inst in sorted(instances.items()) if not unsafe else ():
    argv = host.get_fact(tuning.ExecStart, instance=name)
    if isinstance(argv, Unreadable):
        refuse(name, argv)
        continue
    if not argv:
        say(f"    [{host.name}] tune {name}: no drop-in on the host (converge deploy.py first)")
        continue
    served = host.get_fact(tuning.ServingEnv, instance=name)
    swept(name, name, argv, gpu and inst.get("ngl", 99) != 0, inst["key"], served)

for name, inst in sorted(routers.items()) if not unsafe else ():
    argv = host.get_fact(tuning.ExecStart, instance=name)
    preset = host.get_fact(tuning.Preset, instance=name)
    if isinstance(argv, Unreadable):
        refuse(name, argv)
        continue
    if not argv or preset.get("error"):
        say(f"    [{host.name}] tune {name}: " + (f"{preset['error']}; not swept" if argv else
                                                    "no drop-in on the host (converge deploy.py first)"))
        continue
    pins = llama_server.pinned(inst)   # a pinned model serves from its own unit, beside the router
    for model in [inst["model"], *inst["also"]]:   # each alone, its server stopped meanwhile
        stop = llama_server.PINNED_UNIT.format(name, model) if model in pins else name
        if model in pins:
            alone = host.get_fact(tuning.ExecStart, instance=stop)
            why = "no drop-in of its pinned server on the host (converge deploy.py first)"
        else:
            alone, why = tuning.model_argv(argv, preset["sections"], model)
        if isinstance(alone, Unreadable):
            refuse(f"{name} {model}", alone)
            continue
        if not alone:
            say(f"    [{host.name}] tune {name} {model}: {why}; not swept")
            continue
        swept(f"{name} {model}", tuning.model_job(name, model), alone, gpu and flags_of(alone).get("ngl") != "0",
              inst["key"], host.get_fact(tuning.ServingEnv, instance=stop), stop=stop, router=name, model=model)

if refusals:   # fails closed for this host alone: none of its sweeps runs
    summary.refused(host.name, refusals)
    host.state.fail_hosts({host})
