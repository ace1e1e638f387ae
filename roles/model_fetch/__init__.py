"""roles/model_fetch: pinned model weights from the hub (or a peer), fetched in the background,
resumed after any kill, verified file by file, then marked complete.

What it does to a host:
- reads every model's state in one round trip (roles/model_fetch/facts.py ModelFetchState): the
  marker ``<dest>/.rigup-complete.json``, the job's progress, and for a model not complete the
  hub's file list (sizes, sha256 or git blob ids) and the free disk; prints a progress line per
  model (bytes, %, rate, ETA);
- refuses (preflight, checks.py ``check_dest``) a dest inside rigup's own directories or holding
  one, shared by two models, or inside another model's;
- refuses, before any byte and before any other role changes the host, an unknown repo or
  revision, an include pattern that matches nothing, an incomplete GGUF shard set, a download
  larger than the free disk (with the numbers), and a ``fetch_from`` peer that does not hold
  the model; each line names the host, the key path and the file the value came from;
- on the controller, before preflight's refusals (``plan_lines``, roles/model_fetch/hub.py, with
  huggingface_hub): resolves a branch or tag typed as ``revision`` to its commit and prints the
  pin to write (refused unless ``models_allow_unpinned``), takes ``size_gib`` from the hub's file
  sizes when absent, and reads an unknown family's layers and KV size from its GGUF header, so
  that the disk and VRAM checks of every role judge the model; a hostile answer there (a commit
  that is not 40 hex, an unsafe or duplicate path, a compressed listing or header, a next page
  on another origin) refuses the model, before anything changes;
- installs ``rigup_prefix/bin/rigup-fetch`` (roles/model_fetch/shipped/fetcher.py, standard library);
  puts the hub token at ``/etc/rigup/hf-token`` (root, 0600): ``model_fetch_hf_token_src``, else
  ``HF_TOKEN`` or the ``hf auth login`` store of the controller; removes it when there is none
  (``hf_endpoint_insecure``, the source dropped, no models);
- never follows what the rigup user placed (rigup/nofollow.py): each model's directory is read as
  its owner, never through a link or from a FIFO; a symlink, FIFO or foreign file where rigup
  keeps the marker or the job's files, or a dest under a directory another user than root can
  write, refuses the host, naming the path; dest is made by root, what is inside it (the job's
  directory, job.json) by the rigup user;
- starts one job per model that is not complete: the transient unit ``rigup-fetch-<name>``
  (``systemd-run --collect``, as ``rigup_user``, the token passed as a systemd credential), or,
  on hosts without systemd (rental containers), as root in the tmux session of that name, or
  with ``setsid`` where tmux is missing (log: ``<dest>/.rigup-fetch/job.log``). The job outlives
  SSH and pyinfra; a job already running is left alone (a changed plan stops it and starts the
  new one). It resumes partial files with HTTP ranges, checks each file's size and hash, fetches
  a bad one again, checks GGUF shard sets, and writes the marker last. A completed model whose
  files changed since they were verified (size or mtime) is checked again and repaired;
- ``fetch_from: <peer>``: the job copies the model from the peer's share server
  (``rigup-share``, port ``model_fetch_share_port``; the peer starts it when a host of the
  inventory names it), after the peer completes it, and verifies it against the hub's hashes;
- ``wait: true``: the converge blocks until the model is complete, printing a progress line per
  host every ``model_fetch_wait_interval`` seconds;
- a changed ``revision`` of a model that is complete (and may be serving): the job fetches into
  the revision's own directory next to dest (rigup.names.revision_dir), hard-linking every file
  the two revisions share; once it is complete and verified, after the waits, dest becomes a
  link to it in one rename (the serving roles then restart their instances on the new
  revision, a replica at a time behind the balancer); after the serving roles (``pruned``) the
  old revision's directory is removed, or kept (the newest one) with ``models_keep_previous``.
A converge while a job runs, or after it completed, changes nothing. ``status.py`` shows each
model's state in its row (facts.py ``progress_command``: progress.json, the marker, the lock).

Variables (roles/model_fetch/defaults.yml): models_dir, models (entry form: rigup/models.py
MODEL, shared with the serving roles), models_allow_unpinned, hf_endpoint (else HF_ENDPOINT of
the controller's environment; https://, or http:// with hf_endpoint_insecure and no token),
hf_endpoint_insecure, model_fetch_hf_token_src,
model_fetch_workers, model_fetch_share_port, model_fetch_peer_wait, model_fetch_stall_timeout,
model_fetch_retries, model_fetch_wait_timeout, model_fetch_wait_interval, models_keep_previous;
rigup_user and rigup_prefix (roles/base).
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import OperationError, StringCommand, deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.operations import files

from rigup.probe import python, systemd
from pyinfra.operations.util import any_changed
from rigup.text import say

from rigup import files as managed
from rigup import apt, run as run_state, services, summary
from rigup.gpu.plan import Plan
from rigup.config import Config, config_of, fleet_data, role_defaults, source_of
from rigup.models import hub_endpoint
from rigup.models import models as model_entries
from rigup.names import HF_TOKEN as TOKEN_PATH
from rigup.names import FETCH_METRICS, MARKER, SHARE_TOKEN, revision_dir
from rigup.refusal import Port
from rigup.templates import render
from rigup.secrets import controller_token, secret_file
from rigup.state import read_once
from roles.model_fetch.checks import CHECKS
from roles.model_fetch.facts import (FETCHER, SHARE_LOCK, SHARE_UNIT, ModelFetchState, parse_probe, probe_command,
                                     unit_name)
from roles.model_fetch.shipped.fetcher import PERMANENT
from roles.model_fetch.hub import lines as hub_lines
from roles.model_fetch.hub import resolve, token
from roles.model_fetch.plan import ModelPlan, human, pending_note, plan_model, progress_line

__all__ = ["apply", "waited", "pruned", "specs", "ports", "plan_reads", "plan_lines", "resolve", "CHECKS",
           "ModelFetchState"]

SHARE_CONFIG = "/etc/rigup/share.json"
METRICS_CONFIG = "/etc/rigup/model-metrics.json"
# Not rigup-fetch-*: that prefix is the download jobs' (a model may be called "metrics").
METRICS_SERVICE, METRICS_TIMER = "rigup-model-metrics.service", "rigup-model-metrics.timer"
METRICS_PATHS = [METRICS_CONFIG, f"/etc/systemd/system/{METRICS_SERVICE}", f"/etc/systemd/system/{METRICS_TIMER}"]
WARM_CONFIG = "/etc/rigup/model-warm.json"
WARM_SERVICE, WARM_TIMER = "rigup-model-warm.service", "rigup-model-warm.timer"
WARM_PATHS = [WARM_CONFIG, f"/etc/systemd/system/{WARM_SERVICE}", f"/etc/systemd/system/{WARM_TIMER}"]
# Stop the job whose pid is in the lock file {lock} (written by a job running as rigup_user): kill
# it only when that pid is a rigup-fetch job, never whatever process the file names.
KILL_JOB = ('pid=$(head -c 16 {lock} | tr -cd 0-9); [ -n "$pid" ] && '
            'case "$(tr "\\0" " " < /proc/$pid/cmdline 2>/dev/null)" in *rigup-fetch*" fetch "*) kill "$pid";; esac')
# The job's unit restarts it after a failure a restart may mend (the hub unreachable past the
# job's own retries, a crash, a kill -9), RESTART_S apart, at most START_BURST times in
# START_WINDOW_S; not after one it cannot (exit status PERMANENT: no space, a hub refusal, an
# unsafe listing), which it records in progress.json for the converge and status.py.
RESTART_S, START_WINDOW_S, START_BURST = 30, 600, 5
START_GRACE_S = 30  # a job that neither runs nor wrote progress this long after the start is dead


def _summary(refused: dict[str, int]) -> None:
    """The run's last line of model_fetch: every host it refused (rigup/run.py ``fetch_refused``)."""
    say(f"--> model_fetch refused {len(refused)} host(s): {', '.join(sorted(refused))}", fg="red")


def _models(data: Config) -> dict:
    return model_entries(data)[0]  # entries with problems were refused by preflight already


def _peer_address(name: str) -> str | None:
    peer = host.inventory.get_host(name, None)
    if peer is None:
        return None
    return peer.data.get("ssh_hostname") or name


def _requests_for_me() -> list[tuple[str, str]]:
    """(repo, revision) of the models other hosts of the inventory copy from this host."""
    return requests_for(host.name, fleet_data(host))


def specs(data: Config, models: dict) -> list[dict]:
    return [{"name": name, "dest": m["dest"], "repo": m["repo"], "revision": m["revision"],
             "include": m["include"], "endpoint": hub_endpoint(data), "marker": MARKER, "token_file": TOKEN_PATH,
             "stage": revision_dir(m["dest"], m["revision"])}
            for name, m in models.items()]


def _plans(data: Config, models: dict, facts: dict) -> list[ModelPlan]:
    plans = []
    for name, entry in models.items():
        state = facts["models"].get(name) or {"probe_error": "no answer from the probe"}
        peer = entry.get("fetch_from")
        source = hub_endpoint(data)
        extra = []
        if peer:
            address = _peer_address(peer)
            if peer == host.name:
                extra.append((f"models.{name}.fetch_from", "names this host itself; fix: name a peer or remove it"))
            elif address is None:
                extra.append((f"models.{name}.fetch_from", f"{peer!r} is not a host of this inventory; "
                                                           "fix: name a host of the inventory"))
            else:
                theirs = _models(config_of(host.inventory.get_host(peer))).values()
                if not any(m["repo"] == entry["repo"] and m["revision"] == entry["revision"] for m in theirs):
                    extra.append((f"models.{name}.fetch_from", f"{peer} does not declare {entry['repo']} at "
                                                               f"{entry['revision'][:12]} in its models; fix: add it "
                                                               "there, or fetch from the hub"))
                source = f"http://{address}:{config_of(host.inventory.get_host(peer))['model_fetch_share_port']}"
        plan = plan_model(name, entry, state, endpoint=hub_endpoint(data), source=source,
                          peer=peer if peer else None, workers=data["model_fetch_workers"],
                          peer_wait=data["model_fetch_peer_wait"], stall_s=data["model_fetch_stall_timeout"],
                          retries=data["model_fetch_retries"])
        if extra:
            plan.action, plan.problems = "refused", extra + plan.problems
        plans.append(plan)
    return plans


def _print(plans: list[ModelPlan]) -> None:
    for plan in plans:
        say(f"    [{host.name}] {plan.line}")


def _background(name: str, command: str) -> str:
    """Run the shell ``command`` in tmux session ``name`` unless that session exists, or with
    setsid where tmux is missing (callers run this only when their probe found nothing running):
    either way it outlives the SSH session."""
    q = shlex.quote
    return (f"if command -v tmux >/dev/null; then tmux has-session -t ={name} 2>/dev/null || "
            f"tmux new-session -d -s {name} {q(command)}; "
            f"else setsid nohup sh -c {q(command)} >/dev/null 2>&1 </dev/null & fi")


def _start_command(plan: ModelPlan, data: Config, systemd: bool) -> str:
    """Start the job of ``plan`` unless it runs: a transient unit, or (without systemd, as root)
    a tmux session or a setsid process."""
    unit = unit_name(plan.name)
    work = f"{plan.job['dest']}/.rigup-fetch"
    script = f"{data['rigup_prefix']}/bin/rigup-fetch"
    env = {"HF_ENDPOINT": hub_endpoint(data), "HF_XET_HIGH_PERFORMANCE": "1"}
    # python3 -s -E -S: no site directory (.pth files run at start), no PYTHON* variable; -u: its lines
    # reach the journal or job.log as they are written (PYTHONUNBUFFERED, which -E ignores)
    q = shlex.quote
    if systemd:
        setenv = " ".join(f"--setenv={k}={q(v)}" for k, v in env.items())
        restart = (f"--property=Restart=on-failure --property=RestartSec={RESTART_S} "
                   f"--property=RestartPreventExitStatus={PERMANENT} "
                   f"--property=StartLimitIntervalSec={START_WINDOW_S} --property=StartLimitBurst={START_BURST}")
        # a unit waiting to restart (auto-restart) is not active: stopped, then started anew
        return (f"cred=; [ -f {TOKEN_PATH} ] && cred=--property=LoadCredential=hf-token:{TOKEN_PATH}; "
                f"[ -f {SHARE_TOKEN} ] && cred=\"$cred --property=LoadCredential=share-token:{SHARE_TOKEN}\"; "
                f"systemctl is-active -q {unit} || {{ systemctl stop {unit} 2>/dev/null; "
                f"systemctl reset-failed {unit} 2>/dev/null; "
                f"systemd-run --unit={unit} --collect --quiet --property=User={q(data['rigup_user'])} "
                f"--property=Group={q(data['rigup_user'])} --property=Nice=5 {restart} $cred {setenv} "
                f"--description={q('rigup: fetch model ' + plan.name)} "
                f"/usr/bin/python3 -s -E -S -u {script} fetch {q(work + '/job.json')}; }}")
    envs = " ".join(f"{k}={q(v)}" for k, v in env.items())
    job = f"env {envs} /usr/bin/python3 -s -E -S -u {script} fetch {q(work + '/job.json')} >> {q(work + '/job.log')} 2>&1"
    return _background(unit, job)


@operation()
def fetched(plan: ModelPlan, data: Config, systemd: bool):
    """Start ``plan``'s download job, unless the model is complete or its job runs already."""
    if plan.action in ("complete", "running", "switch"):
        host.noop(plan.line)
        return
    unit = unit_name(plan.name)
    dest, user = plan.job["dest"], data["rigup_user"]
    q = shlex.quote
    if plan.action == "restart" and systemd:  # the plan changed under a running job: stop it, start the new one
        yield f"systemctl stop {unit} 2>/dev/null; true"
    elif plan.action == "restart":   # root's job, in root's directory: the job writes its pid in its lock
        lock = q(dest + "/.rigup-fetch/lock")
        yield (f"flock -n {lock} true || {KILL_JOB.format(lock=lock)}; "
               f"while [ -e {lock} ] && ! flock -n {lock} true; do sleep 1; done; true")
    job = json.dumps(plan.job, indent=1, sort_keys=True) + "\n"
    yield job_written(dest, job, user if systemd else None)
    yield _start_command(plan, data, systemd)


def job_written(dest: str, job: str, user: str | None) -> StringCommand:
    """Shell that makes the job's directory ``dest/.rigup-fetch`` and writes ``job`` (sent on
    stdin) to its job.json, removing the last job's progress (it would pass for this one's until
    the job writes its own). With ``user`` (the job runs as the rigup user, who owns dest): dest is
    made by root (install -d, under root's directories only: the probe refused any other parent),
    everything inside it by ``user`` (runuser), so that nothing that user placed there (a symlink,
    a FIFO) is ever followed or opened by root; the job file goes to a new name (mktemp), then
    over job.json in one rename. Without (root's job): all of it root's, in root's directory."""
    q = shlex.quote
    inside = ('mkdir -p "$1/.rigup-fetch" && t=$(mktemp "$1/.rigup-fetch/job.json.tmp.XXXXXX") && cat > "$t" && '
              'chmod 644 "$t" && mv -f "$t" "$1/.rigup-fetch/job.json" && rm -f "$1/.rigup-fetch/progress.json"')
    if user is None:
        return StringCommand(f"sh -c {q(inside)} sh {q(dest)}", _stdin=job)
    return StringCommand(f"install -d -o {q(user)} -g \"$(id -g {q(user)})\" {q(dest)} && runuser -u {q(user)} -- "
                         f"sh -c {q(inside)} sh {q(dest)}", _stdin=job)


# The share server's unit: it reads the models and the fleet's token (a credential), nothing else.
SHARE_HARDENING = ("ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
                   "NoNewPrivileges=yes", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
                   "ProtectControlGroups=yes", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
                   "RestrictNamespaces=yes", "LockPersonality=yes", "CapabilityBoundingSet=",
                   "SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes")


@operation()
def shared(dests: list[str], data: Config, bind: str, systemd: bool, active: bool):
    """Serve the completed models in ``dests`` to the fleet's peers, on ``bind`` (this host's
    inventory address) only, to requests with the fleet's token (unit ``rigup-share``, hardened;
    without systemd a tmux session or a setsid process holding SHARE_LOCK) unless it runs."""
    config = json.dumps({"port": data["model_fetch_share_port"], "bind": bind, "dests": sorted(dests),
                         "marker": MARKER, "token_file": TOKEN_PATH, "share_token_file": SHARE_TOKEN},
                        indent=1) + "\n"
    yield from files.put._inner(src=StringIO(config), dest=SHARE_CONFIG, mode="644")
    if active:
        return  # it reads its config on every request
    script = shlex.quote(f"{data['rigup_prefix']}/bin/rigup-share")  # its own name: ss shows it
    if systemd:
        hardening = " ".join(f"--property={shlex.quote(p)}" for p in SHARE_HARDENING)
        yield (f"systemctl is-active -q {SHARE_UNIT} || {{ systemctl reset-failed {SHARE_UNIT} 2>/dev/null; "
               f"systemd-run --unit={SHARE_UNIT} --collect --quiet --property=User={shlex.quote(data['rigup_user'])} "
               f"--property=LoadCredential=share-token:{SHARE_TOKEN} {hardening} "
               f"--description='rigup: serve completed models to peers' {script} share {SHARE_CONFIG}; }}")
    else:
        yield _background(SHARE_UNIT, f"flock -n {SHARE_LOCK} {script} share {SHARE_CONFIG}")


@operation()
def unshared(systemd: bool, script: str):
    """Stop the share server: no peer of the inventory copies from this host any more."""
    yield (f"systemctl stop {SHARE_UNIT}" if systemd else
           f"tmux kill-session -t ={SHARE_UNIT} 2>/dev/null; pkill -f -- {shlex.quote(script + ' share ')}; true")


@operation()
def started():
    """Nothing to do: an operation every host of the run has, so that pyinfra (which orders each
    host's operations and merges the hosts') runs every share server before any host's wait."""
    host.noop("jobs and share servers started")
    yield from ()   # an operation is a generator, even one that never has anything to do


def share_token(data: Config) -> str:
    """The fleet's share token, kept on the controller (``model_fetch_share_token_src``, by default
    ~/.config/rigup/share-token, made 0600 on first use): the same for every host and every run."""
    return controller_token(Path(data["model_fetch_share_token_src"] or Path.home() / ".config" / "rigup" / "share-token"))


def requests_for(me: str, fleet: dict[str, dict]) -> list[tuple[str, str]]:
    """(repo, revision) of the models the other hosts of ``fleet`` ({name: data}) copy from ``me``.
    Only a host whose raw entries name ``me`` has its models read in full: every host asks this
    of every host."""
    return [(m["repo"], m["revision"]) for name, data in fleet.items() if name != me
            and any(isinstance(raw, dict) and raw.get("fetch_from") == me for raw in (data.get("models") or {}).values())
            for m in _models(data).values() if m.get("fetch_from") == me]


def plan_reads(data: Config) -> list:
    """The models' state, which :func:`apply` reads, in preflight's round trip (a branch is already
    pinned: the configuration asked the hub first); none while an entry has a problem (refused)."""
    models, problems = model_entries(data)
    if problems or not (models or _requests_for_me()):
        return []
    return [(ModelFetchState, {"specs": specs(data, models)})]


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Preflight's lines for the models: what the hub said (roles/model_fetch/hub.py ``resolve``,
    asked by rigup.config when the host's configuration was first read)."""
    return hub_lines(data)


def ports(plan: Plan, data: Config, fleet=None) -> list[Port]:
    """The share server's port, on a host that peers copy from."""
    if fleet and requests_for(fleet.me, fleet.hosts):
        return [Port(data["model_fetch_share_port"], "model_fetch_share_port", ("rigup-share",))]
    return []


def dead_job(name: str, state: dict, waited: float) -> str | None:
    """Why model ``name``'s job is dead (it neither runs nor completed), or None while it runs,
    completed, or may still be starting (no progress yet, within START_GRACE_S)."""
    if state.get("complete") or state.get("staged") or state.get("running"):
        return None
    p = state.get("progress") or {}
    done = f"at {human(p.get('bytes') or 0)} / {human(p.get('total') or 0)}"
    if p.get("state") == "failed":
        return f"the download failed: {p.get('error')} ({done}" + (f", from {p['source']})" if p.get("source") else ")")
    if p.get("state") == "stopped":
        return f"the download was stopped {done} ({p.get('detail')}); a converge starts it again"
    if p:
        return (f"the download ended {done} without completing or saying why (killed?); see "
                f"journalctl -u {unit_name(name)}; a converge resumes it")
    if waited > START_GRACE_S:
        return (f"the download job did not start within {START_GRACE_S} s; see journalctl -u "
                f"{unit_name(name)} (or .rigup-fetch/job.log)")
    return None


def _wait(plans: list[ModelPlan], specs: list[dict], data: Config) -> None:
    """Block until every model of ``plans`` is complete, printing a progress line per host; fail
    at once, with the reason, when a job is dead."""
    me = host  # python.call runs this in the host's context
    command = probe_command([dict(s, no_hub=True) for s in specs])
    started = time.monotonic()
    deadline = started + data["model_fetch_wait_timeout"]
    names = {p.name for p in plans}
    first = True
    while True:
        if not first:
            time.sleep(data["model_fetch_wait_interval"])
        first = False
        ok, output = me.run_shell_command(command=command, print_output=False, print_input=False)
        if not ok:
            raise OperationError(f"cannot read the progress of {', '.join(sorted(names))}")
        models = parse_probe(list(output.stdout_lines))["models"]
        left = []
        for name in sorted(names):
            state = models.get(name, {})
            say(f"    [{me.name}] {progress_line(name, state)}")
            if state.get("complete") or state.get("staged"):
                continue
            dead = dead_job(name, state, time.monotonic() - started)
            if dead:
                raise OperationError(f"model {name}: {dead}")
            left.append(name)
        if not left:
            return
        if time.monotonic() > deadline:
            raise OperationError(f"models {', '.join(left)} not complete after "
                                 f"{data['model_fetch_wait_timeout']} s (model_fetch_wait_timeout); "
                                 "their jobs go on")


@deploy("model_fetch", data_defaults=role_defaults("model_fetch"))
def apply(plan: Plan, data: Config):
    models = _models(data)
    share_for = _requests_for_me()
    if not models and not share_for:
        managed.absent(name=f"No hub token here ({TOKEN_PATH})", dest=TOKEN_PATH, paths=[TOKEN_PATH])
        return
    facts = read_once(ModelFetchState, specs=specs(data, models))   # preflight's round trip (plan_reads)
    if not facts.get("python", True):
        plans = [ModelPlan(n, "refused", problems=[(f"models.{n}", "/usr/bin/python3 is missing on the host; fix: "
                                                                    "install python3 (roles/base does)")], line="")
                 for n in models]
    else:
        plans = _plans(data, models, facts)
    _print([p for p in plans if p.line])
    refused = [(p, key, why) for p in plans for key, why in p.problems]
    if refused:
        origin = source_of(host, "models")
        for _, key, why in refused:
            say(f"    [{host.name}] refused: {key} ({origin}): {why}", fg="red")
        run = run_state.host_run(host)
        run.fetch_refused[host.name] = len(refused)
        run.at_end(_summary, run.fetch_refused)
        summary.refused(host, [f"{key} ({why.split(': ', 1)[0].split('; ', 1)[0]})" for _, key, why in refused])
        host.state.fail_hosts({host})
        return
    bin_dir = f"{data['rigup_prefix']}/bin"
    peers = share_for or any(m.get("fetch_from") for m in models.values())
    hub_token = token(data)
    etc = hub_token or peers or facts["systemd"]    # systemd: the metrics' config
    paths = [bin_dir, f"{bin_dir}/rigup-fetch", f"{bin_dir}/rigup-share", TOKEN_PATH] + (
        ["/etc/rigup", SHARE_TOKEN, *METRICS_PATHS] if etc else [])
    managed.directory(name=f"Directory {bin_dir}", path=bin_dir, paths=paths)
    managed.program(FETCHER, f"{bin_dir}/rigup-fetch", paths, name="Install rigup-fetch")
    if etc:
        managed.directory(name="Directory /etc/rigup", path="/etc/rigup", paths=paths)
    if hub_token:
        secret_file(name=f"Hub token {TOKEN_PATH}", content=hub_token, dest=TOKEN_PATH, paths=paths)
    else:   # an insecure hub, or no token source any more: a token left from before goes
        managed.absent(name=f"No hub token here ({TOKEN_PATH})", dest=TOKEN_PATH, paths=paths)
    if peers:
        secret_file(name=f"The fleet's share token {SHARE_TOKEN}", content=share_token(data), dest=SHARE_TOKEN,
                    paths=paths)
    for p in plans:
        fetched(name=f"Fetch model {p.name}" + (f" from {p.job['peer']}" if p.job and p.job.get("peer") else ""),
                plan=p, data=data, systemd=facts["systemd"])
    dests = [m["dest"] for m in models.values() if (m["repo"], m["revision"]) in share_for]
    if dests:
        managed.program(FETCHER, f"{bin_dir}/rigup-share", paths, name="Install rigup-share")   # fetcher.py whole
        shared(name="Serve completed models to peers", dests=dests, data=data, systemd=facts["systemd"],
               bind=_peer_address(host.name), active=facts["share_active"])
    elif facts["share_active"]:
        unshared(name="Stop serving models to peers (no peer needs them)", systemd=facts["systemd"],
                 script=f"{bin_dir}/rigup-share")
    if facts["systemd"]:
        exported(data, models, script=f"{bin_dir}/rigup-fetch", paths=paths)
        warmed(data, models, script=f"{bin_dir}/rigup-fetch")
    started(name="model_fetch: jobs and share servers started")
    # what the later steps of this host take from here (rigup/run.py: staging, pruning, waiting)
    run, wanted = run_state.host_run(host), {s["name"]: s for s in specs(data, models)}
    staging = run.staging[host.name] = [wanted[p.name] for p in plans
                                        if (facts["models"].get(p.name) or {}).get("where") == wanted[p.name]["stage"]]
    keep = 1 if data["models_keep_previous"] else 0
    run.pruning[host.name] = staging + [
        wanted[p.name] for p in plans if wanted[p.name] not in staging
        and len((facts["models"].get(p.name) or {}).get("previous") or []) > keep]
    waiting = [p for p in plans if p.action not in ("complete", "switch") and models[p.name]["wait"]]
    for p in plans:
        note = "" if p in waiting else pending_note(p, facts["models"].get(p.name) or {})
        if note:
            summary.note(host, note)
    if waiting:
        run.waiting[host.name] = (waiting, [s for s in specs(data, models) if s["name"] in {p.name for p in waiting}])


def _now(spec: dict, together: list[dict]) -> dict:
    """The model's state read now (at execution: after the waits), without asking the hub; the
    models ``together`` are read in the same round trip (one probe for all, read once)."""
    found = read_once(ModelFetchState, specs=[dict(s, no_hub=True) for s in together])["models"]
    return found.get(spec["name"]) or {}


@operation()
def switched(spec: dict, script: str, together: list[dict]):
    """Serve model ``spec``'s new revision: once its directory holds it complete and verified,
    dest becomes a link to it in one rename (``rigup-fetch switch``); before that, nothing."""
    state = _now(spec, together)
    if not state.get("staged"):
        host.noop(f"model {spec['name']}: " + ("serves its revision" if state.get("complete") else
                                               f"revision {spec['revision'][:12]} not complete yet; "
                                               "a converge after it completes switches to it"))
        return
    serving = state.get("serving") or {}
    previous = revision_dir(spec["dest"], serving["revision"]) if serving.get("revision") else None
    blob = base64.b64encode(json.dumps({"dest": spec["dest"], "stage": spec["stage"],
                                        "previous": previous}).encode()).decode()
    yield f"/usr/bin/python3 -s -E -S {shlex.quote(script)} switch {shlex.quote(blob)}"


@operation()
def pruned_revisions(spec: dict, script: str, keep: int, together: list[dict]):
    """Remove model ``spec``'s revision directories beyond the ``keep`` newest (``rigup-fetch
    prune``): what a revision change left once the instances serve the new one."""
    old = _now(spec, together).get("previous") or []
    if len(old) <= keep:
        host.noop(f"model {spec['name']}: no old revision to remove")
        return
    blob = base64.b64encode(json.dumps(dict(spec, keep=keep)).encode()).decode()
    yield f"/usr/bin/python3 -s -E -S {shlex.quote(script)} prune {shlex.quote(blob)}"


def metrics_config(models: dict) -> dict:
    """rigup-model-metrics's configuration: every model's dest, the metrics file (pure)."""
    return {"models": [{"name": n, "dest": m["dest"]} for n, m in sorted(models.items())],
            "metrics_file": FETCH_METRICS, "marker": MARKER, "token_file": TOKEN_PATH}


def exported(data: Config, models: dict, script: str, paths: list[str]) -> None:
    """The timer that writes every model's download state (rigup_model_fetch_*) to the node
    exporter's textfile directory every model_fetch_metrics_interval_s, as root (the directory is
    root's; the jobs run as rigup_user); it writes nothing while that directory is missing."""
    managed.managed(name=f"model_fetch: {METRICS_CONFIG}", dest=METRICS_CONFIG, paths=paths,
                    text=json.dumps(metrics_config(models), indent=1, sort_keys=True) + "\n")
    units = [managed.managed(name=f"model_fetch: {unit}", dest=path, paths=paths,
                             text=render(template, script=script, config=METRICS_CONFIG,
                                         interval=data["model_fetch_metrics_interval_s"]))
             for unit, path, template in zip((METRICS_SERVICE, METRICS_TIMER), METRICS_PATHS[1:],
                                             ("model_fetch-metrics.service.j2", "model_fetch-metrics.timer.j2"))]
    reloaded(units, "metrics")
    services.running(name=f"model_fetch: run {METRICS_TIMER}", unit=METRICS_TIMER, units=[METRICS_TIMER])
    restarted(METRICS_TIMER, units)


def warmed(data: Config, models: dict, script: str) -> None:
    """The models with ``warm: true`` kept in the page cache: vmtouch (Debian's) reads what is not
    cached of each one's files, every model_fetch_warm_interval_s, as the rigup user (the models'
    owner) at the lowest CPU and I/O priority. None warm: the timer and its files go."""
    warm = {n: m for n, m in sorted(models.items()) if m["warm"]}
    if not warm:
        services.running(name=f"model_fetch: no {WARM_TIMER} (no model is warm)", unit=WARM_TIMER,
                         units=[WARM_TIMER], enabled=False)
        gone = [managed.absent(name=f"model_fetch: no {path}", dest=path, paths=WARM_PATHS) for path in WARM_PATHS]
        systemd.daemon_reload(name="model_fetch: systemd daemon-reload (no warm timer)", _if=any_changed(*gone))
        return
    apt.installed(name="vmtouch (the warm models' page cache)", packages=["vmtouch"])
    doc = {"models": [{"name": n, "dest": m["dest"]} for n, m in warm.items()], "marker": MARKER,
           "token_file": TOKEN_PATH}
    managed.managed(name=f"model_fetch: {WARM_CONFIG}", dest=WARM_CONFIG, paths=WARM_PATHS,
                    text=json.dumps(doc, indent=1, sort_keys=True) + "\n")
    # spelt out as in exported(): tests/unit/test_bench_ansible.py reads each unit and path from the code
    units = [managed.managed(name=f"model_fetch: {unit}", dest=path, paths=WARM_PATHS,
                             text=render(template, script=script, config=WARM_CONFIG, user=data["rigup_user"],
                                         interval=data["model_fetch_warm_interval_s"]))
             for unit, path, template in zip((WARM_SERVICE, WARM_TIMER), WARM_PATHS[1:],
                                             ("model_fetch-warm.service.j2", "model_fetch-warm.timer.j2"))]
    reloaded(units, "warm")
    services.running(name=f"model_fetch: run {WARM_TIMER}", unit=WARM_TIMER, units=[WARM_TIMER])
    restarted(WARM_TIMER, units)


def reloaded(units: list, what: str) -> None:
    """systemd reads a service's and its timer's files again when ``units`` (the operations that
    wrote them) changed one."""
    systemd.daemon_reload(name=f"model_fetch: systemd daemon-reload ({what})", _if=any_changed(*units))


def restarted(timer: str, units: list) -> None:
    """``timer`` restarted when its file (``units[1]``) changed: a new period."""
    systemd.service(name=f"model_fetch: restart {timer} (new period)", service=timer, restarted=True,
                    _if=units[1].did_change)


@deploy("model_fetch: wait", data_defaults=role_defaults("model_fetch"))
def waited(plan: Plan, data: Config):
    """Block until the models with ``wait: true`` are complete (their jobs were started by
    :func:`apply`, before the build, so that downloads and the build overlap); then switch the
    models whose new revision is complete to it."""
    run = run_state.host_run(host)
    if host.name in run.waiting:
        waiting, wanted = run.waiting.pop(host.name)
        python.call(name="Wait for " + ", ".join(f"model {p.name}" for p in waiting), function=_wait,
                    plans=waiting, specs=wanted, data=data)
    script = f"{data['rigup_prefix']}/bin/rigup-fetch"
    staging = run.staging.pop(host.name, [])
    for spec in staging:
        switched(name=f"Model {spec['name']}: serve revision {spec['revision'][:12]}", spec=spec, script=script,
                 together=staging)


@deploy("model_fetch: prune", data_defaults=role_defaults("model_fetch"))
def pruned(plan: Plan, data: Config):
    """After the serving roles restarted on a new revision: remove the old revisions' directories
    (all, or all but the newest with ``models_keep_previous``)."""
    keep = 1 if data["models_keep_previous"] else 0
    pruning = run_state.host_run(host).pruning.pop(host.name, [])
    for spec in pruning:
        pruned_revisions(name=f"Model {spec['name']}: old revisions", spec=spec, keep=keep,
                         script=f"{data['rigup_prefix']}/bin/rigup-fetch", together=pruning)


ROLE = Role("model_fetch", apply, checks=CHECKS, resolve=resolve, ports=ports, plan_reads=plan_reads, plan_lines=plan_lines, steps={'waited': waited, 'pruned': pruned})
