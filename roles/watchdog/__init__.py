"""roles/watchdog: a throughput watchdog that restarts a serving unit running below its floor.

/health stays 200 while an engine is wedged or silently running on the CPU; rigup gates every
start on a real completion, and this keeps checking after the start. What it does to a host with
systemd where an instance of ``llama_server_instances`` has ``min_tokens_per_s`` (nothing
elsewhere; the timer is stopped and disabled once no instance has one, or with
``watchdog_enabled: false``):
- installs ``rigup_prefix/bin/rigup-watchdog`` (roles/watchdog/watchdog.py, standard library) and
  beside it ``rigup_throughput.py`` (rigup/throughput.py, the measuring bench.py also uses), and
  ``/etc/rigup/watchdog.json``: each such instance's URL, key file and floor, the checks, and
  ``rigup_maintenance``;
- runs it every ``watchdog_interval_s`` from ``rigup-watchdog.timer``: one completion of
  ``watchdog_max_tokens`` to each server of the instance (its unit, or each replica's), tok/s as
  llama-server reports it; below the floor, or no answer within ``watchdog_timeout_s``,
  ``watchdog_bad_checks`` times in a row: ``systemctl restart`` of that unit, with the reason in
  the journal (``journalctl -u rigup-watchdog``) and in its metrics file (rigup.names.WATCHDOG_METRICS,
  for the node exporter: ``rigup_watchdog_restarts_total{llama_instance}``, the last tok/s, the floor);
- while ``rigup_maintenance`` is true: no check and no restart (the metrics say maintenance).

Variables (roles/watchdog/defaults.yml): watchdog_enabled, watchdog_interval_s,
watchdog_bad_checks, watchdog_max_tokens, watchdog_timeout_s; llama_server_instances
(roles/llama_server: port, host, api_key, min_tokens_per_s), rigup_maintenance, rigup_prefix and
rigup_state_dir (roles/base).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from rigup import files, services
from rigup.config import role_defaults
from rigup.gate import endpoint
from rigup.names import LLAMA_KEY, WATCHDOG_METRICS
from rigup.templates import render

HERE = Path(__file__).resolve().parent
THROUGHPUT = HERE.parent.parent / "rigup" / "throughput.py"
CONFIG = "/etc/rigup/watchdog.json"
SERVICE, TIMER = "rigup-watchdog.service", "rigup-watchdog.timer"

__all__ = ["apply", "watchdog_config"]


def watched(data: dict) -> dict[str, dict]:
    """The llama-server instances with a floor, as the watchdog reaches them: name -> {"url",
    "port", "key" (the key file, or None), "floor"}. Read from the raw entries (a role imports no
    other role; the defaults are roles/llama_server/schema.py's: host 127.0.0.1, api_key false)."""
    return {name: {"url": endpoint(inst.get("host") or "127.0.0.1", inst["port"]), "port": inst["port"],
                   "key": LLAMA_KEY.format(name) if inst.get("api_key") else None,
                   "floor": float(inst["min_tokens_per_s"])}
            for name, inst in sorted((data.get("llama_server_instances") or {}).items())
            if isinstance(inst, dict) and inst.get("min_tokens_per_s") is not None and isinstance(inst.get("port"), int)}


def watchdog_config(data: dict) -> dict:
    """/etc/rigup/watchdog.json (pure: data in)."""
    return {"instances": watched(data), "interval_s": data["watchdog_interval_s"],
            "bad_checks": data["watchdog_bad_checks"], "max_tokens": data["watchdog_max_tokens"],
            "timeout_s": data["watchdog_timeout_s"], "maintenance": bool(data["rigup_maintenance"]),
            "state_file": f"{str(data['rigup_state_dir']).rstrip('/')}/watchdog.json",
            "metrics_file": WATCHDOG_METRICS}


def unit_timeout_s(config: dict) -> int:
    """The oneshot's TimeoutStartSec: every server's completion may take the whole timeout
    (replicas: up to 8 servers an instance), plus a margin for the restarts."""
    return 8 * max(1, len(config["instances"])) * (config["timeout_s"] + 5) + 60


@deploy("watchdog", data_defaults=role_defaults("watchdog"))
def apply(plan: dict):
    data = host.data.dict()
    if not plan.get("systemd", True):
        return      # no serving units without systemd (preflight refuses them)
    config = watchdog_config(data)
    if not data["watchdog_enabled"] or not config["instances"]:
        services.running(name=f"watchdog: stop {TIMER}", unit=TIMER, units=[TIMER], enabled=False)
        return
    bin_dir = f"{data['rigup_prefix']}/bin"
    script, service_path, timer_path = f"{bin_dir}/rigup-watchdog", f"/etc/systemd/system/{SERVICE}", \
        f"/etc/systemd/system/{TIMER}"
    paths = [script, f"{bin_dir}/rigup_throughput.py", CONFIG, service_path, timer_path]
    files.managed(name="watchdog: the watchdog", dest=script, paths=paths, mode="755",
                  text=(HERE / "watchdog.py").read_text())
    files.managed(name="watchdog: its measuring (rigup/throughput.py)", dest=f"{bin_dir}/rigup_throughput.py",
                  paths=paths, text=THROUGHPUT.read_text())
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
