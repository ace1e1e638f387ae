"""roles/watchdog on the lab, with the engine stand-in (tests/lab/engine_stub.py) as the host's
serving unit rigup-llama@gemma: converged twice (0 changes the second time); a stand-in wedged for
real (SIGUSR1: SLOW_TPS tok/s, until its process restarts) below its floor is restarted by the watchdog
after k checks, and the journal and the metrics (read from the node exporter) say why; in
maintenance mode the same fault changes nothing.

The play is preflight + base + metrics + watchdog (no llama.cpp build)."""

import re
import time

import pytest

from tests.conftest import on_host
from tests.roles.watch_lab import play, serve_stub, unserve_stub, until

pytestmark = pytest.mark.lab
# the shortest period the role takes, and a wedged rate whose check (8 tokens) takes 1 s: the
# checks, the restart and maintenance's runs come at the same counts, sooner
EVERY_S, K, FLOOR, SLOW_TPS = 2, 3, 50, 8
UNIT = "rigup-llama@gemma.service"
SETTINGS = {"llama_server_instances": {"gemma": {"model": "gemma-270m", "port": 8081, "min_tokens_per_s": FLOOR}},
            "watchdog_interval_s": EVERY_S, "watchdog_bad_checks": K, "watchdog_max_tokens": 8,
            "watchdog_timeout_s": 10}


def main_pid(lab, name):
    return on_host(lab, name, f"systemctl show -p MainPID --value {UNIT}").strip()


def exported(lab, host):
    """The watchdog's series as the node exporter serves them: {series: value}."""
    text = on_host(lab, host["name"], f"curl -sf http://{host['address']}:9100/metrics")
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith("rigup_watchdog_")}


def journal(lab, name, since):
    return on_host(lab, name, f"journalctl -q -o cat -u rigup-watchdog.service --since @{since}")


@pytest.fixture(scope="module")
def host(lab, tmp_path_factory):
    h = lab.hosts()[1]
    serve_stub(lab, h["name"], "gemma", 8081, tps=200, extra=("--slow-tps", str(SLOW_TPS)))
    tmp = tmp_path_factory.mktemp("watchdog")
    first = play(tmp, ["metrics", "watchdog"], {h["name"]: SETTINGS})
    again = play(tmp, ["metrics", "watchdog"], {h["name"]: SETTINGS})
    print(f"\nwatchdog converge {first.seconds:.1f} s; again {again.seconds:.1f} s: {again.totals['changed']} changed")
    assert again.totals["changed"] == 0, again.changed_operations()
    yield h, tmp
    on_host(lab, h["name"], "systemctl disable --now rigup-watchdog.timer")
    unserve_stub(lab, h["name"], "gemma")


def test_a_wedged_instance_is_restarted_after_k_checks(lab, host):
    h, _ = host
    name = h["name"]
    seen = until(lambda: exported(lab, h).get('rigup_watchdog_tokens_per_second{llama_instance="gemma"}'), 30)
    assert seen and seen > FLOOR, "no healthy check reached the node exporter"
    print(f"healthy: {seen} tok/s (floor {FLOOR})")
    before, since = main_pid(lab, name), int(time.time())
    on_host(lab, name, f"kill -USR1 {before}")
    wedged = time.monotonic()
    assert until(lambda: main_pid(lab, name) not in (before, "0"), K * (EVERY_S + 5) + 30), "never restarted"
    took = time.monotonic() - wedged
    log = journal(lab, name, since)
    bad = re.findall(r"gemma: ([\d.]+) tok/s, below its floor 50 tok/s \((\d) of 3 checks in a row\)", log)
    why = next(ln for ln in log.splitlines() if "restarting" in ln)
    print(f"wedged at {SLOW_TPS} tok/s: restarted {took:.1f} s later after {len(bad)} bad checks "
          f"({', '.join(t for t, _ in bad)} tok/s); journal: {why}")
    assert [n for _, n in bad] == ["1", "2", "3"] and all(float(t) < FLOOR for t, _ in bad)
    assert "3 checks in a row below the floor of 50 tok/s" in why and f"restarting {UNIT}" in why
    metrics = until(lambda: (m := exported(lab, h)) and m.get('rigup_watchdog_restarts_total{llama_instance="gemma"}')
                    and m, 30)
    print("metrics: " + ", ".join(f"{k} {v}" for k, v in sorted(metrics.items()) if "gemma" in k))
    assert metrics['rigup_watchdog_restarts_total{llama_instance="gemma"}'] == 1
    assert metrics['rigup_watchdog_last_restart_tokens_per_second{llama_instance="gemma"}'] < FLOOR
    assert metrics['rigup_watchdog_floor_tokens_per_second{llama_instance="gemma"}'] == FLOOR
    # the restarted process is fast again: the next checks are good
    assert until(lambda: (exported(lab, h).get('rigup_watchdog_tokens_per_second{llama_instance="gemma"}') or 0)
                 > FLOOR, 30)


def test_maintenance_mode_changes_nothing(lab, host):
    h, tmp = host
    name = h["name"]
    play(tmp, ["metrics", "watchdog"], {name: {**SETTINGS, "rigup_maintenance": True}})
    assert until(lambda: exported(lab, h).get("rigup_watchdog_maintenance") == 1, 30)
    restarts = exported(lab, h)['rigup_watchdog_restarts_total{llama_instance="gemma"}']
    pid, since = main_pid(lab, name), int(time.time())
    on_host(lab, name, f"kill -USR1 {pid}")
    wedged, paused = time.monotonic(), "rigup_maintenance is on: no check, no restart"
    # K + 2 runs logged since the second of the kill (the first may have begun just before it): K
    # whole runs after the fault, as many as restart it out of maintenance, within the old window
    until(lambda: journal(lab, name, since).count(paused) >= K + 2, K * (EVERY_S + 5) + 10, poll=1)
    log = journal(lab, name, since)
    runs = log.count(paused)
    print(f"\nmaintenance: {runs} runs in {time.monotonic() - wedged:.0f} s, none checked; "
          f"pid {pid} -> {main_pid(lab, name)}")
    assert main_pid(lab, name) == pid and runs >= K and "below its floor" not in log and "restarting" not in log
    assert exported(lab, h)['rigup_watchdog_restarts_total{llama_instance="gemma"}'] == restarts
    on_host(lab, name, f"kill -USR2 {pid}")
    play(tmp, ["metrics", "watchdog"], {name: SETTINGS})
