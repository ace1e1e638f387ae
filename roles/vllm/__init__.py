"""roles/vllm: vLLM's OpenAI-compatible server, one systemd unit per instance, health-gated.

What it does to a host with ``vllm_instances`` (name -> recipe; form: rigup/instances/vllm.py
VLLM_INSTANCE; refusals: roles/vllm/checks.py):
- a virtualenv per pin, ``<vllm_dir>/<pin-id>/venv``: vLLM from PyPI at an exact version
  (``vllm_pip_version``, pin-id ``pip-VERSION``) or from git at a commit (``vllm_git_url`` +
  ``vllm_git_commit``, pin-id ``git-<12 hex>``, checkout in ``.../src``): a fork at a commit, or
  a base commit with a patch series (below). A short commit (7-39 hex) is expanded on the host
  in preflight's round trip (facts.VllmCommit: the repository's branches and tags, commits only,
  cloned into a temporary directory and removed), and the plan prints the full commit to pin;
  one that names no commit or several is refused, naming vllm_git_commit (on a host without git
  yet, vLLM waits for the next converge, after roles/base installed it); anything else is
  refused before any host changes, with the key named;
- ``vllm_extra_packages`` (exact ``NAME==VERSION`` requirements) installed with vLLM into the
  pin's virtualenv; they are part of the pin (the stamp), so a change makes the venv again;
- an ordered patch series (``vllm_patches``, files on the controller) for git pins: each file
  checked on the controller against the sha256 manifest ``vllm_patch_manifest`` (a mismatch
  stops the run before any host changes), copied to ``<vllm_dir>/patches/<sha256>.patch``, then
  applied in a staging checkout in order, ``git apply --check`` before each ``git apply``; a
  patch that does not apply stops the install before the live checkout, venv or stamp change;
- the packages installed by pip, or by uv (``vllm_installer: uv``: uv pinned at
  ``vllm_uv_version``, from PyPI into its own virtualenv ``<vllm_dir>/uv-VERSION``);
- a stamp, ``<pin-dir>/.rigup-stamp.json`` (pin, patch names and sha256s, pip args, install
  env, uv's version): unchanged, nothing is reinstalled (re-applying the series is a no-op); changed, the venv
  is made again from scratch (a pin bump over an old venv fails at start) and the instances
  restart;
- per instance an environment file ``/etc/rigup/vllm/NAME.env`` (root:rigup 0640): HOME, HF_HOME
  and the vLLM/Triton/inductor caches under /var/lib|/var/cache/rigup/vllm/NAME (vLLM breaks with
  an unwritable HOME), ``VLLM_PP_LAYER_PARTITION`` checked (one entry per pp stage, summing to
  the instance's ``layers`` when given), CUDA_VISIBLE_DEVICES from ``gpus``, the NCCL/Gloo knobs
  (``NCCL_P2P_DISABLE=1`` on CMP 170HX hosts unless ``vllm_nccl_p2p_disable`` says otherwise,
  ``NCCL_NVLS_ENABLE=0``, IB, socket interface), ``vllm_env``, then the instance's ``env``;
- the template unit ``rigup-vllm@.service``: runs as ``rigup_user``, KillMode=control-group,
  KillSignal=SIGINT, TimeoutStartSec >= 900, TimeoutStopSec, Restart=on-failure with
  RestartSec=30 and a start limit, after rigup-gpu-power, kept down while the GPU guard is tripped
  (``ConditionPathExists=!{rigup_state_dir}/gpu-guard.tripped``), hardened like llama_server's
  (less ``ProcSubset=pid`` and ``~@resources``: torch reads /proc/meminfo and sets affinities);
- a drop-in per instance: the environment file, ``ExecStartPre`` checks the model's completion
  marker and waits (``<vllm_dir>/bin/rigup-vllm-wait-vram``, ``nvidia-smi
  --query-gpu=memory.used``) until its cards' VRAM is free, then ``vllm serve <model dest>
  --host --port --tensor-parallel-size --pipeline-parallel-size --gpu-memory-utilization
  --served-model-name NAME``, with a drafter (the instance's ``draft_model``: a key of
  models) ``--speculative-config`` of its ``speculative`` keys and the drafter's dest as
  ``model``, and extra args;
- starts an instance only once its model (and its drafter) is complete
  (``<dest>/.rigup-complete.json``, roles/model_fetch), and, with ``cmpunlocker_enabled``, only
  once the cards report their unlocked memory (rigup.gpu.plan.unlock_wait: before the cold
  power-off the plan and the converge say that it waits, and nothing of the instance changes);
  restarts it only when its unit, install stamp, environment, model or drafter changed; then
  gates: vLLM refuses connections while it loads, so /health is polled until 200 (or the unit
  fails), then one real chat completion; on failure the unit's journal is shown.

With ``replicas`` (auto: as many groups of tp x pp GPUs as the host has; checks.replica_groups):
one unit ``rigup-vllm@NAME-K`` per replica, with its own environment file (CUDA_VISIBLE_DEVICES:
its cards' UUIDs) and the instance's key, on 127.0.0.1 at port + 1 + K, rejoining the balancer's
pool once healthy and drained before it stops (rigup.serving.balancer_hooks); the instance's
host:port is roles/balancer's, told by a backends file (rigup.names.balancer_file ``vllm-NAME``).
Servers no longer wanted are retired (rigup.serving.retired): back to one server, the frontend
gives its port up first and roles/balancer stops the HAProxy it started when nothing is left.

Security: vLLM binds every interface unless ``--host`` is given (rigup always gives it; default
127.0.0.1), and its ``--api-key`` (or VLLM_API_KEY) covers only /v1, /v2, /inference and
/cohere paths: /health, /metrics, /load and /invocations stay open. Keep instances on 127.0.0.1
or behind a firewall or an authenticating proxy.

Across hosts with Ray (``vllm_ray_role``: roles/vllm/cluster.py): Ray ``vllm_ray_version`` from
PyPI in the pin's virtualenv and ``rigup-ray.service`` on every host of the cluster (a worker, with
no instance of its own, gets the virtualenv and its node only); the head's instances run with
``--distributed-executor-backend ray`` (``pp`` stages over the hosts' GPUs, with the checked
``VLLM_PP_LAYER_PARTITION``), ``RAY_ADDRESS`` of the head, and an ExecStartPre that waits at most
``vllm_ray_wait_seconds`` for every expected node, naming those missing. Every port Ray opens is
pinned (``vllm_ray_port``, ``vllm_ray_node_port`` +0..5, ``vllm_ray_worker_ports``) and an nftables
table (``inet rigup_ray``, rigup/firewall.py) admits only the cluster's nodes to them: Ray has no
authentication. Outside that list stay the NCCL/Gloo ports vLLM's own workers open (random
ports): the cluster's network must be private.

Variables (roles/vllm/defaults.yml): vllm_instances, vllm_pip_version, vllm_git_url,
vllm_git_commit, vllm_extra_packages, vllm_patches, vllm_patch_manifest, vllm_pip_args,
vllm_install_env, vllm_netrc_src, vllm_dir, vllm_python, vllm_installer, vllm_uv_version, vllm_install_timeout,
vllm_nccl_p2p_disable, vllm_nccl_nvls_enable, vllm_nccl_ib_disable, vllm_socket_ifname,
vllm_env, vllm_vram_free_mib, vllm_vram_wait_seconds, vllm_health_timeout, vllm_health_prompt,
vllm_ray_role, vllm_ray_head, vllm_ray_version, vllm_ray_port, vllm_ray_node_port,
vllm_ray_worker_ports, vllm_ray_dashboard, vllm_ray_dashboard_port, vllm_ray_wait_seconds,
vllm_ray_args, vllm_host_ip; and models / models_dir (roles/model_fetch), rigup_user
(roles/base), cmpunlocker_enabled (roles/cmpunlocker).
"""

from __future__ import annotations

import dataclasses
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.operations import files

from rigup.probe import python

from rigup import apt, firewall, progress, summary
from rigup.gpu.plan import Plan
from rigup.config import Config, ConfigError, fleet_data, role_defaults
from rigup.files import absent, directory, managed, program
from rigup.names import guard_file
from rigup.names import marker_path as completion_marker
from rigup.secrets import bearer, secret_file, written
from rigup.serving import VLLM_EXE, Engine, Served, Shared, filled, serve, unit_running
from rigup.state import read_once, reading
from roles.vllm import cluster
from roles.vllm import command as cmd
from roles.vllm.checks import CHECKS, FLEET_CHECKS, ports, replica_groups
from roles.vllm.checks import plan_lines as instance_lines
from roles.vllm.facts import VllmCommit, VllmState
from rigup.instances.vllm import VllmInstance, instances
from rigup.text import say

__all__ = ["apply", "CHECKS", "FLEET_CHECKS", "plan_lines", "plan_reads", "ports"]

INSTALL_UNIT = "rigup-vllm-install.service"  # the install runs as this transient unit (rigup.progress)


@reading(VllmState, "pin_dir", instances="units")
@operation()
def install(pin_dir: str, patch_dir: str, series: list, script: str, stamp: str, units: dict):
    """The pin's virtualenv, made again only when the stamp differs (``units``: the role's
    servers, read with it): its install script is started as a background job (rigup.progress),
    which the role then waits for, printing pip's progress."""
    state = read_once(VllmState, pin_dir=pin_dir, instances=units)
    if state.get("stamp") == stamp:
        host.noop(f"{pin_dir}/venv is installed from its pin and patches")
        return
    yield f"install -d -m 0755 {shlex.quote(pin_dir)} {shlex.quote(patch_dir)}"
    for p in series:
        yield from files.put._inner(src=StringIO(p["text"]), dest=f"{patch_dir}/{p['sha256']}.patch", mode="644")
    yield written(f"{pin_dir}/install.sh", script, mode="700")  # it may hold vllm_install_env: no temp file
    yield progress.start_command(INSTALL_UNIT, f"bash {shlex.quote(pin_dir)}/install.sh",
                                 f"{pin_dir}/install.log", systemd=True)


def installed_test(path: str, stamp: str) -> str:
    """A shell test: the stamp file ``path`` holds ``stamp`` (a failed or refused install leaves
    the old one), compared by digest."""
    return f"printf '%s  %s\\n' {cmd.sha(stamp)} {shlex.quote(path)} | sha256sum -c --status -"


@reading(VllmState, "pin_dir", instances="units")
@operation()
def instance(unit_name: str, instance_name: str, inst: VllmInstance, argv: list[str], pin_dir: str, venv: str,
             env: str, unit_sha: str, stamp_sha: str, wait: list, user: str, units: dict, balancer: dict | None = None,
             fleet_key: str | None = None, maintenance: bool = False, ray_wait: list | None = None,
             unlock: str | None = None):
    """Server ``unit_name`` (the instance ``instance_name``, or one of its replicas): its
    environment file, drop-in (``argv``: its command line as the serving plan made it, the pin's
    vllm in ``venv`` filled here; with the ``balancer`` hooks of a replica), and unit enabled and
    running; restarted only when the drop-in changed (it names the unit, stamp, environment,
    model revision and drafter) or its key (``fleet_key``: the fleet's, rigup.secrets.fleet_api_key;
    else made on the host). Waits (changes nothing) while its model or its drafter is incomplete,
    and while ``unlock`` says why the cards are not unlocked yet (rigup.gpu.plan.unlock_wait).
    ``units``: every server of the role on the host (read together, once), each with its model's
    completion marker first and its drafter's third (None without one). ``maintenance``: stopped
    (rigup.serving). ``ray_wait``: on a Ray head, the ExecStartPre that waits for every node
    (roles/vllm/cluster.py)."""
    name = instance_name
    marker_path, draft_marker = units[unit_name][0], units[unit_name][2]
    if unlock and not maintenance:
        host.noop(f"{unit_name}: waits for the unlocked VRAM: {unlock}")
        return
    state = read_once(VllmState, pin_dir=pin_dir, instances=units)["instances"].get(unit_name, {})
    marker = state.get("marker")
    for path, present in ((marker_path, marker), (draft_marker, state.get("draft"))):
        if path and not present:
            what = "model" if path == marker_path else "drafter"
            host.noop(f"{unit_name}: waiting for its {what} ({path} does not exist yet)")
            return
    model_path = marker_path.rsplit("/", 1)[0]
    draft = {"path": draft_marker.rsplit("/", 1)[0], "marker": draft_marker, "sha": state["draft"]} \
        if draft_marker else None
    text = cmd.dropin_text(name, inst, venv, model_path, marker_path, unit_sha, stamp_sha, cmd.sha(env)[:12],
                           marker.get("revision"), wait, unit=unit_name, balancer=balancer, ray_wait=ray_wait,
                           draft=draft, command=filled(argv, vllm=f"{venv}/bin/vllm"))
    unit = f"rigup-vllm@{unit_name}.service"
    if cmd.sha(env) != state.get("env"):
        yield f"install -d -m 0750 -g {shlex.quote(user)} /etc/rigup/vllm"
        yield from files.put._inner(src=StringIO(env), dest=cmd.ENV_FILE.format(unit_name), user="root",
                                    group=user, mode="640")
    yield from unit_running(unit, cmd.DROPIN.format(unit_name), text, state, cmd.sha(text) != state.get("dropin"),
                            f"{unit_name} runs with its current install, environment and drop-in",
                            key=(cmd.KEY_FILE.format(name), user, cmd.KEY_PREFIX) if inst["api_key"] else None,
                            fleet_key=fleet_key, maintenance=maintenance)


def _ray_node(data: Config, plan: Plan, fleet: dict, venv: str, script: str, paths: list[str]):
    """Ray in ``venv`` and this host's Ray node (roles/vllm/cluster.py), its wait ``script`` with it."""
    program("roles/vllm/shipped/ray_wait.py", script, paths, name="vllm Ray wait script")
    cluster.installed(name=f"vllm: ray=={data['vllm_ray_version']} in {venv}", venv=venv,
                      version=str(data["vllm_ray_version"]))
    ip = cluster.node_ip(host.name, data)
    env = cluster.node_env(cmd.env_vars("ray", {}, data, plan), ip)
    text = cluster.unit_text(host.name, fleet, venv, env, data["rigup_user"], guard_file(data), script)
    apt.installed(name="vllm: nftables (Ray's allow-list)", packages=["nftables"],
                  cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=data["apt_retry_delay"])
    firewall.allowed(name=f"vllm: only the Ray cluster's nodes reach Ray's ports ({cluster.FIREWALL})",
                     path=cluster.FIREWALL, table=cluster.TABLE, text=cluster.firewall_text(host.name, fleet))
    cluster.node(name=f"vllm: {cluster.RAY_UNIT} ({data['vllm_ray_role']}) on {ip}", venv=venv, text=text)


def _commit_read(data: Config) -> dict:
    """VllmCommit's arguments for a short vllm_git_commit (of a vllm_git_url that passes)."""
    return {"url": data["vllm_git_url"], "prefix": cmd.short_commit(data)}


def plan_reads(data: Config) -> list:
    """A short vllm_git_commit's expansion on the host (preflight's round trip; :func:`plan_lines`
    prints the full commit, check_pin refuses none or several)."""
    if not cmd.short_commit(data) or not (data.get("vllm_instances") or data.get("vllm_ray_role")):
        return []
    try:
        cmd.git_url(data)
    except ConfigError:
        return []                       # refused by check_pin, never handed to git
    return [(VllmCommit, _commit_read(data))]


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Preflight's plan lines (roles/vllm/checks.py plan_lines), with the expansion of a short commit."""
    reads = plan_reads(data)
    return instance_lines(plan, data, read_once(VllmCommit, **reads[0][1]) if reads else None)


def _servers(wanted: dict, plan: Plan, data: Config, entries: dict) -> dict[str, Served]:
    """Each instance with its servers (rigup.serving ``Served``; command.py ``servers``: a replica per group of
    checks.replica_groups), each with its ``argv`` (command.py ``argv``: the model's and the drafter's
    directories as their markers name them; the pin's vllm the operation's to fill, rigup.serving VLLM_EXE); a Ray
    head's instances with Ray's executor (its pp stages and tp ranks are Ray's to place over the hosts)."""
    if data["vllm_ray_role"] == "head":
        wanted = {n: {**i, "extra_args": ["--distributed-executor-backend", "ray", *i["extra_args"]]}
                  for n, i in wanted.items()}

    def where(key: str | None) -> str | None:
        return completion_marker(entries[key]["dest"]).rsplit("/", 1)[0] if key else None

    def with_argv(name: str, server: dict) -> dict:
        inst = server["inst"]
        line = cmd.argv(name, inst, "", where(inst["model"]), where(inst["draft_model"]))
        return {**server, "argv": [VLLM_EXE, *line[1:]]}   # its first item the pin's vllm: the operation's to fill
    return {name: Served(inst, [with_argv(name, s) for s in cmd.servers(name, inst, replica_groups(plan, inst), plan)])
            for name, inst in wanted.items()}


def _prepare(plan: Plan, data: Config, wanted: dict, units: dict) -> Shared:
    """A Ray node no longer wanted retired; the pin (a short commit expanded on the host: none while
    the host has no git yet) and its directory, which its state reads; the template unit."""
    if not data["vllm_ray_role"] and "rigup-ray" in (plan.get("serving_units") or []):
        cluster.retired(name=f"vllm: {cluster.RAY_UNIT} retired (vllm_ray_role: null)")
    ray_role = data["vllm_ray_role"]
    short = cmd.short_commit(data) if wanted or ray_role else None
    full = cmd.expanded(data, read_once(VllmCommit, **_commit_read(data))) if short else None
    no_git = bool(short) and not full       # the host has no git to expand it with yet
    # preflight refused a bad pin (checks.py)
    the_pin = cmd.pin(data, full) if (wanted or ray_role) and not no_git else {"id": "none"}
    vllm_dir = data["vllm_dir"].rstrip("/")
    pin_dir = f"{vllm_dir}/{the_pin['id']}"
    wait_script, ray_script = f"{vllm_dir}/bin/rigup-vllm-wait-vram", f"{vllm_dir}/bin/rigup-ray-wait"
    text = cmd.render("vllm-unit.service.j2", user=data["rigup_user"], guard_file=guard_file(data),
                      start_timeout=max(900, data["vllm_health_timeout"]), stop_timeout=120, restart_sec=30,
                      fabric=bool((plan.get("fabric") or {}).get("nvswitches")))
    return Shared(plan, data, {"pin_dir": pin_dir, "instances": units}, text, [wait_script, cmd.UNIT, ray_script],
                  {"pin": the_pin, "no_git": no_git, "vllm_dir": vllm_dir, "wait_script": wait_script,
                   "ray_script": ray_script})


def _install(shared: Shared, wanted: dict, units: dict) -> Shared | None:
    """The pin's virtualenv (its patches, pip's credentials, the VRAM wait script) and on a Ray
    cluster's host its Ray node; None (nothing more) without an instance or a Ray role, or while
    the host has no git to expand a short commit with."""
    plan, data, own = shared.plan, shared.data, shared.own
    ray_role, the_pin, pin_dir = data["vllm_ray_role"], own["pin"], shared.reads["pin_dir"]
    if not wanted and not ray_role:
        return None
    if own["no_git"]:
        why = (f"vllm: vllm_git_commit {data['vllm_git_commit']} is expanded with git on the host, which roles/base "
               "installs in this run: converge again to install vLLM")
        say(f"    [{host.name}] {why}")
        summary.note(host, why)
        return None
    series = cmd.patches(data)
    stamp = cmd.stamp(the_pin, series, data)
    patch_dir = f"{own['vllm_dir']}/patches"
    label = (f"vllm {the_pin['git']} at {the_pin['commit']}" if "git" in the_pin
             else f"vllm=={the_pin['pip']} from PyPI")
    script = cmd.render("vllm-install.sh.j2", pin_dir=pin_dir, pin_label=label, git=the_pin.get("git"),
                        commit=the_pin.get("commit"), version=the_pin.get("pip"), patches=series,
                        extra=the_pin.get("extra") or [],
                        patch_dir=patch_dir, pip_args=data["vllm_pip_args"], python=data["vllm_python"],
                        install_env={str(k): str(v) for k, v in sorted(data["vllm_install_env"].items())},
                        stamp=stamp, stamp_name=cmd.STAMP, uv=cmd.uv(data),
                        netrc_home=cmd.NETRC_HOME if data.get("vllm_netrc_src") else None)
    auth = [cmd.NETRC_HOME, cmd.NETRC]
    netrc = cmd.netrc_text(data)   # preflight refused a bad one
    if netrc:
        directory(name=f"vllm: {cmd.NETRC_HOME}", path=cmd.NETRC_HOME, paths=auth, mode="700")
        secret_file(name=f"vllm: credentials {cmd.NETRC}", content=netrc, dest=cmd.NETRC, paths=auth)
    else:
        absent(name=f"vllm: no credentials {cmd.NETRC}", dest=cmd.NETRC, paths=auth)
    managed(name="vllm VRAM wait script", dest=own["wait_script"], paths=shared.paths, mode="755",
            text=cmd.render("vllm-wait-vram.sh.j2"))
    installing = install(name=f"vllm virtualenv {the_pin['id']} ({len(series)} patches)", pin_dir=pin_dir,
                         patch_dir=patch_dir, series=series, script=script, stamp=stamp, units=units)
    python.call(name=f"Wait for the vllm install {the_pin['id']}", function=progress.waited,
                label=f"vllm install {the_pin['id']}", unit=INSTALL_UNIT, log=f"{pin_dir}/install.log",
                done=installed_test(f"{pin_dir}/{cmd.STAMP}", stamp), systemd=True,
                timeout=data["vllm_install_timeout"], _if=installing.did_change)
    fleet = fleet_data(host) if ray_role else {}
    if ray_role:
        _ray_node(data, plan, fleet, f"{pin_dir}/venv", own["ray_script"], shared.paths)
    cluster.nodes_started(name="vllm: Ray nodes started")
    return dataclasses.replace(shared, own={**own, "stamp": stamp, "fleet": fleet})


def _args(shared: Shared, name: str, inst: VllmInstance, server: dict) -> dict:
    """:func:`instance`'s own arguments: the pin's virtualenv and stamp, the server's environment
    file (HOME and caches per server, the unit's own StateDirectory/CacheDirectory, %i; its pinning
    last), the VRAM wait on its cards, a Ray head's wait for its nodes."""
    plan, data, own = shared.plan, shared.data, shared.own
    pin_dir, fleet, head = shared.reads["pin_dir"], own["fleet"], data["vllm_ray_role"] == "head"
    ray_env = cluster.instance_env(host.name, fleet) if head else {}
    wait = [own["wait_script"], str(data["vllm_vram_free_mib"]), str(data["vllm_vram_wait_seconds"])]
    wait += ["-i", server["gpus"]] if server["gpus"] else []
    return {"argv": server["argv"], "pin_dir": pin_dir, "venv": f"{pin_dir}/venv", "stamp_sha": cmd.sha(own["stamp"])[:12], "wait": wait,
            "env": cmd.env_text(name, {**cmd.env_vars(server["unit"], {**inst, "_name": name}, data, plan),
                                       **ray_env, **server["env"]}),
            "ray_wait": cluster.wait_argv(f"{pin_dir}/venv", own["ray_script"], cluster.gcs(host.name, fleet),
                                          int(data["vllm_ray_wait_seconds"]), cluster.expected(host.name, fleet))
            if head else None}


def _gate(shared: Shared, name: str, inst: VllmInstance, server: dict) -> dict:
    """vLLM refuses connections while it loads: the gate polls."""
    data = shared.data
    return {"model": cmd.api_name(name, inst), "prompt": data["vllm_health_prompt"],
            "timeout": data["vllm_health_timeout"], "poll": 2,
            "auth": bearer(cmd.KEY_FILE.format(name), cmd.KEY_PREFIX) if inst["api_key"] else ""}


VLLM = Engine(
    role="vllm", template="rigup-vllm", unit=cmd.UNIT, state=VllmState, instances=instances, servers=_servers,
    markers=lambda inst, marker: [marker(inst["draft_model"]) if inst["draft_model"] else None], prepare=_prepare,
    fronted=lambda inst, srv: len(srv) > 1, backend=cmd.backend_name, server=instance, args=_args, gate=_gate,
    install=_install)


@deploy("vllm", data_defaults=role_defaults("vllm"))
def apply(plan: Plan, data: Config):
    serve(VLLM, plan, data)


ROLE = Role("vllm", apply, checks=CHECKS, fleet_checks=FLEET_CHECKS, ports=ports, plan_reads=plan_reads, plan_lines=plan_lines,
            engine=VLLM)
