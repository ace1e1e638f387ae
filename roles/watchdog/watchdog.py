#!/usr/bin/env python3
"""rigup-watchdog: the host side of roles/watchdog, run by rigup-watchdog.timer. Python 3
standard library only (it runs on bare hosts); the measuring is rigup/throughput.py, installed
next to this script as rigup_throughput.py.

    rigup-watchdog --config /etc/rigup/watchdog.json check

Each check sends one short real completion to every server of every llama-server instance that
has a floor (``min_tokens_per_s``): the instance's own unit ``rigup-llama@NAME`` at its port, or
each replica's ``rigup-llama@NAME-K`` at 127.0.0.1:port+1+K. A server below its floor (or not
answering within the timeout) counts one bad check; ``bad_checks`` in a row restart its unit,
with the reason in the journal (priority crit) and in the metrics file
(``rigup_watchdog_restarts_total{llama_instance}``, the tok/s that caused it). A server whose unit is not active
is left alone (the GPU guard, an operator or a failed start stopped it: LlamaServerDown says so).
With ``maintenance`` (rigup_maintenance) it checks and restarts nothing, and says so.
State (bad checks in a row, restarts) is kept in ``state_file`` across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

try:
    import rigup_throughput as throughput           # on a host: installed next to this script
except ImportError:                                 # in the source tree (unit tests)
    from rigup import throughput


def log(priority: int, text: str) -> None:
    """A journal line with its syslog priority (systemd reads the <N> prefix)."""
    print(f"<{priority}>{text}", flush=True)


def load(path: str, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def replace(path: str, text: str) -> None:
    """Write ``path`` atomically (a dot-file beside it, then a rename): the node exporter's
    textfile collector never reads half a file."""
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)


def servers(name: str, inst: dict, units: list[str]) -> list[dict]:
    """The servers of instance ``name`` among the host's active ``units``: its own unit at its
    address, or its replicas (NAME-K at 127.0.0.1:port+1+K)."""
    found = []
    for unit in units:
        m = re.fullmatch(rf"rigup-llama@{re.escape(name)}(?:-(\d+))?\.service", unit)
        if m and m.group(1) is None:
            found.append({"server": name, "unit": unit, "url": inst["url"]})
        elif m:
            found.append({"server": f"{name}-{m.group(1)}", "unit": unit,
                          "url": f"http://127.0.0.1:{inst['port'] + 1 + int(m.group(1))}"})
    return found


def active_units() -> list[str]:
    out = systemctl("list-units", "--state=active", "--plain", "--no-legend", "rigup-llama@*").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def judge(server: dict, inst: dict, tps: float | None, record: dict, config: dict) -> str | None:
    """Update ``record`` (bad, restarts, last_tps) with one check; the reason to restart the
    server's unit, or None."""
    record["last_tps"] = tps
    floor, k = inst["floor"], config["bad_checks"]
    if tps is not None and tps >= floor:
        record["bad"] = 0
        return None
    record["bad"] = record.get("bad", 0) + 1
    seen = "no answer" if tps is None else f"{tps:.1f} tok/s"
    log(4, f"rigup-watchdog: {server['server']}: {seen}, below its floor {floor:g} tok/s "
           f"({record['bad']} of {k} checks in a row)")
    if record["bad"] < k:
        return None
    record["bad"] = 0
    return (f"{k} checks in a row below the floor of {floor:g} tok/s (last: {seen}); "
            f"restarting {server['unit']}")


def measure(server: dict, inst: dict, config: dict) -> float | None:
    """The server's tok/s with one short completion, or None when it does not answer."""
    try:
        key = throughput.read_key(inst.get("key"))
        return throughput.completion(server["url"], key, config["max_tokens"], config["timeout_s"])["tps"]
    except (OSError, ValueError, KeyError) as e:
        log(4, f"rigup-watchdog: {server['server']}: no completion: {e}")
        return None


def metrics_text(records: dict, floors: dict, config: dict, now: float) -> str:
    """rigup_watchdog_* in the text format, labelled llama_instance (the server: NAME or NAME-K; as
    roles/metrics labels llama-server's own series: ``instance`` is Prometheus's target label)."""
    series = [("tokens_per_second", "tok/s of the last check (absent: no answer)", "last_tps"),
              ("floor_tokens_per_second", "The server's floor (min_tokens_per_s)", "floor"),
              ("bad_checks", "Checks in a row below the floor", "bad"),
              ("restarts_total", "Restarts by the watchdog (counter)", "restarts"),
              ("last_restart_tokens_per_second", "tok/s of the check that restarted it (0: no answer)",
               "restart_tps"),
              ("last_restart_timestamp_seconds", "When the watchdog last restarted it", "restarted_at")]
    lines = []
    for metric, text, field in series:
        kind = "counter" if metric.endswith("_total") else "gauge"
        rows = [(s, {**r, "floor": floors.get(s)}.get(field)) for s, r in sorted(records.items())]
        rows = [(s, v) for s, v in rows if v is not None]
        if rows:
            lines += [f"# HELP rigup_watchdog_{metric} {text}", f"# TYPE rigup_watchdog_{metric} {kind}"]
            lines += [f'rigup_watchdog_{metric}{{llama_instance="{s}"}} {v}' for s, v in rows]
    for metric, text, value in (("maintenance", "1 while rigup_maintenance holds the watchdog", int(config["maintenance"])),
                                ("last_run_timestamp_seconds", "When the watchdog last ran", round(now, 3)),
                                ("interval_seconds", "The watchdog's period", config["interval_s"])):
        lines += [f"# HELP rigup_watchdog_{metric} {text}", f"# TYPE rigup_watchdog_{metric} gauge",
                  f"rigup_watchdog_{metric} {value}"]
    return "\n".join(lines) + "\n"


def restart(server: dict, record: dict, why: str) -> None:
    """Restart the server's unit (not waiting for its start), saying why; count it."""
    log(2, f"rigup-watchdog: {server['server']}: {why}")
    done = systemctl("restart", "--no-block", server["unit"])
    if done.returncode != 0:
        log(3, f"rigup-watchdog: restart of {server['unit']} failed: {done.stderr.strip()}")
    record["restarts"] += 1
    record["restart_tps"] = record["last_tps"] or 0
    record["restarted_at"] = round(time.time(), 3)


def check(config: dict) -> int:
    """One check of every server; restarts those below their floor ``bad_checks`` times in a row."""
    state = load(config["state_file"], {})
    floors = {}
    if config["maintenance"]:
        log(5, "rigup-watchdog: rigup_maintenance is on: no check, no restart")
    units = active_units()
    for name, inst in sorted(config["instances"].items()):
        for server in servers(name, inst, units):
            floors[server["server"]] = inst["floor"]
            record = state.setdefault(server["server"], {"bad": 0, "restarts": 0})
            why = None if config["maintenance"] else judge(server, inst, measure(server, inst, config), record, config)
            if why:
                restart(server, record, why)
    os.makedirs(os.path.dirname(config["state_file"]), exist_ok=True)
    replace(config["state_file"], json.dumps(state))
    if os.path.isdir(os.path.dirname(config["metrics_file"])):
        replace(config["metrics_file"], metrics_text({s: state[s] for s in floors}, floors, config, time.time()))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rigup-watchdog")
    parser.add_argument("--config", required=True)
    parser.add_argument("command", choices=["check"])
    args = parser.parse_args(argv)
    return check(load(args.config, None))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
