#!/usr/bin/env python3
"""rigup-watchdog: the host side of roles/watchdog, run by rigup-watchdog.timer. Python 3
standard library only (it runs on bare hosts); the measuring is rigup/throughput.py, installed
next to this script as rigup_throughput.py.

    rigup-watchdog --config /etc/rigup/watchdog.json check

Each check sends one short real completion to every server of every watched llama-server
instance: the instance's own unit ``rigup-llama@NAME`` at its port, or each replica's
``rigup-llama@NAME-K`` at 127.0.0.1:port+1+K. Its floor is the instance's ``floor``
(``min_tokens_per_s``) or, when that is null, :data:`DEFAULT_FLOOR_SHARE` of the tok/s the health
gate measured at the server's last (re)start (``gate_record``, written by rigup/gate.py; a server
without one is not judged). A server below its floor (or not answering within the timeout) counts
one bad check; ``bad_checks`` in a row restart its unit, with the reason in the journal (priority
crit) and in the metrics file (``rigup_watchdog_restarts_total{llama_instance}``, the tok/s that
caused it). Still ``bad_checks`` in a row below after that restart: escalation, as HiveOS's
watchdog does: the reason in the journal, ``rigup_watchdog_escalations_total``, and with
``reboot`` a reboot of the host, at most ``max_reboots`` a day (``reboots_file`` keeps the day's
count across the reboot); without it, or with the budget spent, the unit is restarted again.
A server whose unit is not active is left alone (the GPU guard, an operator or a failed start
stopped it: LlamaServerDown says so). With ``maintenance`` (rigup_maintenance) it checks,
restarts and reboots nothing, and says so. State (bad checks in a row, restarts) is kept in
``state_file`` across runs.
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

# The floor of an instance without min_tokens_per_s: this share of the gate's tok/s at its start.
DEFAULT_FLOOR_SHARE = 0.5


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


def floor_of(server: dict, inst: dict, config: dict) -> float | None:
    """The server's floor: the instance's min_tokens_per_s, else DEFAULT_FLOOR_SHARE of the tok/s
    the health gate recorded at its unit's last (re)start; None without either."""
    if inst["floor"] is not None:
        return inst["floor"]
    gated = load(config["gate_record"].format(server["unit"]), {})
    tps = gated.get("tps") if isinstance(gated, dict) else None
    return round(DEFAULT_FLOOR_SHARE * tps, 3) if isinstance(tps, (int, float)) and tps > 0 else None


def judge(server: dict, floor: float, tps: float | None, record: dict, config: dict) -> str | None:
    """Update ``record`` (bad, last_tps, after_restart) with one check; the reason to act
    (``bad_checks`` in a row below ``floor``), or None."""
    record["last_tps"] = tps
    k = config["bad_checks"]
    if tps is not None and tps >= floor:
        record["bad"], record["after_restart"] = 0, False
        return None
    record["bad"] = record.get("bad", 0) + 1
    seen = "no answer" if tps is None else f"{tps:.1f} tok/s"
    log(4, f"rigup-watchdog: {server['server']}: {seen}, below its floor {floor:g} tok/s "
           f"({record['bad']} of {k} checks in a row)")
    if record["bad"] < k:
        return None
    record["bad"] = 0
    return f"{k} checks in a row below the floor of {floor:g} tok/s (last: {seen})"


def measure(server: dict, inst: dict, config: dict) -> float | None:
    """The server's tok/s with one short completion, or None when it does not answer."""
    try:
        key = throughput.read_key(inst.get("key"))
        return throughput.completion(server["url"], key, config["max_tokens"], config["timeout_s"])["tps"]
    except (OSError, ValueError, KeyError) as e:
        log(4, f"rigup-watchdog: {server['server']}: no completion: {e}")
        return None


def metrics_text(records: dict, floors: dict, config: dict, now: float, reboots: dict) -> str:
    """rigup_watchdog_* in the text format, labelled llama_instance (the server: NAME or NAME-K; as
    roles/metrics labels llama-server's own series: ``instance`` is Prometheus's target label)."""
    series = [("tokens_per_second", "tok/s of the last check (absent: no answer)", "last_tps"),
              ("floor_tokens_per_second", "The server's floor (min_tokens_per_s, or half the gate's tok/s)", "floor"),
              ("bad_checks", "Checks in a row below the floor", "bad"),
              ("restarts_total", "Restarts by the watchdog (counter)", "restarts"),
              ("last_restart_tokens_per_second", "tok/s of the check that restarted it (0: no answer)",
               "restart_tps"),
              ("last_restart_timestamp_seconds", "When the watchdog last restarted it", "restarted_at"),
              ("escalations_total", "Times it was still below its floor after a restart (counter)", "escalations"),
              ("last_escalation_timestamp_seconds", "When it was last still below after a restart", "escalated_at")]
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
                                ("interval_seconds", "The watchdog's period", config["interval_s"]),
                                ("reboots_today", "Reboots by the watchdog today", reboots["count"]),
                                ("max_reboots", "Reboots allowed a day (0 with rigup_watchdog_reboot false)",
                                 config["max_reboots"] if config["reboot"] else 0)):
        lines += [f"# HELP rigup_watchdog_{metric} {text}", f"# TYPE rigup_watchdog_{metric} gauge",
                  f"rigup_watchdog_{metric} {value}"]
    return "\n".join(lines) + "\n"


def restart(server: dict, record: dict, why: str) -> None:
    """Restart the server's unit (not waiting for its start), saying why; count it."""
    log(2, f"rigup-watchdog: {server['server']}: {why}; restarting {server['unit']}")
    done = systemctl("restart", "--no-block", server["unit"])
    if done.returncode != 0:
        log(3, f"rigup-watchdog: restart of {server['unit']} failed: {done.stderr.strip()}")
    record["restarts"] = record.get("restarts", 0) + 1
    record["restart_tps"] = record["last_tps"] or 0
    record["restarted_at"] = round(time.time(), 3)
    record["after_restart"] = True


def escalate(server: dict, record: dict, why: str, config: dict, reboots: dict) -> tuple[bool, str]:
    """Still below after the watchdog's restart: say so, count it; (True, the reason) to reboot the
    host when ``reboot`` is on and the day's budget allows, else (False, why the unit is restarted
    again instead)."""
    record["escalations"] = record.get("escalations", 0) + 1
    record["escalated_at"] = round(time.time(), 3)
    record["after_restart"] = False
    reason = f"{server['server']}: still {why} after its restart by the watchdog"
    log(2, f"rigup-watchdog: {reason}")
    if not config["reboot"]:
        return False, "not rebooting (rigup_watchdog_reboot is false)"
    if reboots["count"] >= config["max_reboots"]:
        return False, f"not rebooting ({reboots['count']} of {config['max_reboots']} reboots today already)"
    return True, reason


def reboots_today(config: dict) -> dict:
    """The watchdog's reboots of the host's local day: {"day", "count"} (a new day: 0)."""
    day, kept = time.strftime("%Y-%m-%d"), load(config["reboots_file"], {})
    count = kept.get("count", 0) if isinstance(kept, dict) and kept.get("day") == day else 0
    return {"day": day, "count": count}


def save(config: dict, state: dict, floors: dict, reboots: dict) -> None:
    """The state file and the metrics file (when the node exporter's directory exists)."""
    os.makedirs(os.path.dirname(config["state_file"]), exist_ok=True)
    replace(config["state_file"], json.dumps(state))
    if os.path.isdir(os.path.dirname(config["metrics_file"])):
        replace(config["metrics_file"], metrics_text({s: state[s] for s in floors}, floors, config, time.time(), reboots))


def reboot(config: dict, reboots: dict, reasons: list[str]) -> None:
    """Reboot the host (already counted in ``reboots``), saying why."""
    log(2, f"rigup-watchdog: rebooting the host ({reboots['count']} of {config['max_reboots']} today): "
           + "; ".join(reasons))
    done = systemctl("reboot")
    if done.returncode != 0:
        log(3, f"rigup-watchdog: reboot failed: {done.stderr.strip()}")


def check(config: dict) -> int:
    """One check of every server; restarts those below their floor ``bad_checks`` times in a row,
    escalates those still below after that restart (and reboots the host, once, when allowed)."""
    state, reboots, floors, reasons = load(config["state_file"], {}), reboots_today(config), {}, []
    if config["maintenance"]:
        log(5, "rigup-watchdog: rigup_maintenance is on: no check, no restart, no reboot")
    units = active_units()
    for name, inst in sorted(config["instances"].items()):
        for server in servers(name, inst, units):
            floor = floors[server["server"]] = floor_of(server, inst, config)
            record = state.setdefault(server["server"], {"bad": 0, "restarts": 0})
            if config["maintenance"]:
                continue
            if floor is None:
                log(6, f"rigup-watchdog: {server['server']}: no floor yet (no min_tokens_per_s, and the health "
                       f"gate has not recorded its tok/s at {config['gate_record'].format(server['unit'])})")
                continue
            why = judge(server, floor, measure(server, inst, config), record, config)
            rebooting = False
            if why and record.get("after_restart"):
                rebooting, why = escalate(server, record, why, config, reboots)
            if rebooting:
                reasons.append(why)
            elif why:
                restart(server, record, why)
    if reasons:     # counted first: the count survives the reboot
        reboots["count"] += 1
        replace(config["reboots_file"], json.dumps(reboots))
    save(config, state, floors, reboots)
    if reasons:
        reboot(config, reboots, reasons)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rigup-watchdog")
    parser.add_argument("--config", required=True)
    parser.add_argument("command", choices=["check"])
    args = parser.parse_args(argv)
    return check(load(args.config, None))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
