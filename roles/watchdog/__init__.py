"""roles/watchdog: a throughput watchdog that restarts a serving unit running below its floor.

/health stays 200 while an engine is wedged or silently running on the CPU; rigup gates every
start on a real completion, and this keeps checking after the start. What it does to a host with
systemd and ``llama_server_instances`` (nothing elsewhere; the timer is stopped and disabled once
no instance is watched, or with ``watchdog_enabled: false``):
- installs ``rigup_prefix/bin/rigup-watchdog`` (roles/watchdog/shipped/watchdog.py, standard library) and
  beside it ``rigup_throughput.py`` (shipped/throughput.py, the measuring bench.py also uses), and
  ``/etc/rigup/watchdog.json``: each watched instance's URL, key file and floor, the checks, the
  reboot policy and ``rigup_maintenance``;
- a router (``also``) only with its own ``min_tokens_per_s``, timed on the model it has loaded
  (never one it would have to load; none loaded: not judged); each model it pins (``per_model: {M:
  {pinned: true}}``, its own server rigup-llama@NAME.M) as a server of one model, by the rules below;
- the floor of each server: the instance's ``min_tokens_per_s`` when set; when null, 50% of the
  tok/s the health gate measured at the server's last (re)start by rigup (rigup.names.gate_record,
  written by rigup/gate.py; a server without that record is not judged yet); ``0`` turns the
  watchdog off for that instance;
- runs it every ``watchdog_interval_s`` from ``rigup-watchdog.timer``: one completion of
  ``watchdog_max_tokens`` to each server of the instance (its unit, or each replica's), tok/s as
  llama-server reports it; below the floor, or no answer within ``watchdog_timeout_s``,
  ``watchdog_bad_checks`` times in a row: ``systemctl restart`` of that unit, with the reason in
  the journal (``journalctl -u rigup-watchdog``) and in its metrics file (rigup.names.WATCHDOG_METRICS,
  for the node exporter: ``rigup_watchdog_restarts_total{llama_instance}``, the last tok/s, the floor);
  each server is judged on its own: an answer that gives no tok/s (an HTTP error, cut off
  mid-answer, not JSON, ``usage.completion_tokens`` null or missing) is one bad check of that
  server, never the end of the check; every systemctl call has a timeout, and one that fails or
  hangs is logged and counted for its server (``rigup_watchdog_command_failures_total``); the
  state is saved whatever happens;
- after a (re)start a server is not judged (its answers, HTTP 503 "Loading model" or a refused
  connection included, count nothing) until it passed its gate again (rigup's health gate
  recorded a completion after that start, or the watchdog got a whole completion from it) or
  ``watchdog_grace_s`` passed since its start (systemd's timestamps);
- escalation: still below the floor for ``watchdog_bad_checks`` checks after that restart: the
  reason in the journal (priority crit), ``rigup_watchdog_escalations_total{llama_instance}``, and
  with ``rigup_watchdog_reboot: true`` a reboot of the host, at most ``rigup_watchdog_max_reboots``
  a day (counted in ``rigup_state_dir/watchdog-reboots.json``, root-owned, kept across the reboot;
  ``rigup_watchdog_reboots_today``), and only for a server that passed its gate since its last
  start (one that never came up again is restarted, not a reason to reboot); otherwise (or with
  the day's budget spent) another restart;
- while ``rigup_maintenance`` is true: no check, no restart, no reboot (the metrics say maintenance).

Variables (roles/watchdog/defaults.yml): watchdog_enabled, watchdog_interval_s,
watchdog_bad_checks, watchdog_max_tokens, watchdog_timeout_s, watchdog_grace_s, rigup_watchdog_reboot,
rigup_watchdog_max_reboots; llama_server_instances (roles/llama_server: port, host, api_key,
min_tokens_per_s), rigup_maintenance, rigup_prefix and rigup_state_dir (roles/base).
"""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import systemd
from pyinfra.operations.util import any_changed

from rigup import files, services
from rigup.gpu.plan import Plan
from rigup.config import Config, role_defaults
from rigup.contract import llama_server
from rigup.instances.llama_server import normalised
from rigup.gate import endpoint
from rigup.names import WATCHDOG_METRICS, WATCHDOG_SERVICE, WATCHDOG_TIMER, gate_record
from rigup.templates import render
from roles.watchdog.shipped.watchdog import COMMAND_TIMEOUT_S

THROUGHPUT = ("shipped/throughput.py",)   # the watchdog's measuring, installed beside it
CONFIG = "/etc/rigup/watchdog.json"
SERVICE, TIMER = WATCHDOG_SERVICE, WATCHDOG_TIMER

__all__ = ["apply", "watchdog_config"]


def watched(data: Config) -> dict[str, dict]:
    """The llama-server servers the watchdog checks, as it reaches them: name -> {"url", "port",
    "key" (the key file, or None), "floor" (``min_tokens_per_s``; None: from the health gate's
    record)}. Every instance but those with ``min_tokens_per_s: 0`` (off), from the instances
    (rigup.instances.llama_server ``normalised``).
    A router (``also``, issue 49) is watched only with its own ``min_tokens_per_s`` (its models
    differ in speed, so the gate's tok/s of one is no floor for another) and gets ``models``, its
    set: each check times the model it has loaded (a model it would have to load is never asked
    for: a swap is not a slow server, and the tok/s is llama-server's own decode rate, the load
    left out); with none loaded it is not judged. Each model a router pins (contract ``pinned``:
    out of its set, a server of one model, unit rigup-llama@NAME.M at port + 2 + i) is an entry
    NAME.M of its own, watched as a single-model server with the instance's floor (null: from its
    own gate record), its router's floor or not."""
    found = {}
    for name, inst in normalised(data).items():
        floor, pins = inst["min_tokens_per_s"], llama_server.pinned(inst)
        if floor == 0:
            continue
        judged = {"key": llama_server.key_file(name, inst), "floor": None if floor is None else float(floor),
                  **({"sleeps": True} if inst.get("sleep_idle_s") else {})}   # judged when it served
        if not inst.get("also") or floor is not None:
            found[name] = {"url": endpoint(inst["host"] or "127.0.0.1", inst["port"]), "port": inst["port"], **judged,
                           **({"models": [inst["model"], *(m for m in inst["also"] if m not in pins)]}
                              if inst.get("also") else {})}
        found.update({llama_server.PINNED_UNIT.format(name, m): {"url": endpoint(inst["host"] or "127.0.0.1", port),
                                                                 "port": port, **judged}
                      for m, port in pins.items()})
    return found


def watchdog_config(data: Config) -> dict:
    """/etc/rigup/watchdog.json (pure: data in)."""
    state_dir = str(data["rigup_state_dir"]).rstrip("/")
    return {"instances": watched(data), "interval_s": data["watchdog_interval_s"],
            "bad_checks": data["watchdog_bad_checks"], "max_tokens": data["watchdog_max_tokens"],
            "timeout_s": data["watchdog_timeout_s"], "grace_s": data["watchdog_grace_s"],
            "command_timeout_s": COMMAND_TIMEOUT_S, "maintenance": bool(data["rigup_maintenance"]),
            "state_file": f"{state_dir}/watchdog.json", "metrics_file": WATCHDOG_METRICS,
            "gate_record": gate_record(data, "{}"), "reboot": bool(data["rigup_watchdog_reboot"]),
            "max_reboots": data["rigup_watchdog_max_reboots"], "reboots_file": f"{state_dir}/watchdog-reboots.json"}


def unit_timeout_s(config: dict) -> int:
    """The oneshot's TimeoutStartSec: every server's completion may take the whole timeout, and
    its two systemctl calls (its state, a restart) theirs (replicas: up to 8 servers an
    instance), plus the listing, the reboot and a margin."""
    command = config["command_timeout_s"]
    return 8 * max(1, len(config["instances"])) * (config["timeout_s"] + 5 + 2 * command) + 2 * command + 60


@deploy("watchdog", data_defaults=role_defaults("watchdog"))
def apply(plan: Plan, data: Config):
    if not plan.get("systemd", True):
        return      # no serving units without systemd (preflight refuses them)
    config = watchdog_config(data)
    if not data["watchdog_enabled"] or not config["instances"]:
        services.running(name=f"watchdog: stop {TIMER}", unit=TIMER, units=[TIMER], enabled=False)
        return
    bin_dir = f"{data['rigup_prefix']}/bin"
    script, service_path, timer_path = f"{bin_dir}/rigup-watchdog", f"/etc/systemd/system/{SERVICE}", \
        f"/etc/systemd/system/{TIMER}"
    paths = [*files.program_paths(script, THROUGHPUT), CONFIG, service_path, timer_path]
    files.program("roles/watchdog/shipped/watchdog.py", script, paths, name="watchdog: the watchdog", beside=THROUGHPUT)
    files.managed(name=f"watchdog: {CONFIG}", dest=CONFIG, paths=paths,
                  text=json.dumps(config, indent=1, sort_keys=True) + "\n")
    service = files.managed(name=f"watchdog: {SERVICE}", dest=service_path, paths=paths,
                            text=render("watchdog-service.j2", script=script, config=CONFIG,
                                        timeout=unit_timeout_s(config)))
    timer = files.managed(name=f"watchdog: {TIMER}", dest=timer_path, paths=paths,
                          text=render("watchdog-timer.j2", interval=data["watchdog_interval_s"]))
    systemd.daemon_reload(name="watchdog: systemd daemon-reload", _if=any_changed(service, timer))
    services.running(name=f"watchdog: run {TIMER}", unit=TIMER, units=[TIMER])
    systemd.service(name=f"watchdog: restart {TIMER} (new period)", service=TIMER, restarted=True,
                    _if=timer.did_change)


ROLE = Role("watchdog", apply)
