"""roles/watchdog without hosts: its configuration from llama_server_instances, the k-in-a-row
judgement, the servers of an instance (replicas), the metrics text, and rigup/throughput.py
against the engine stand-in (tests/lab/engine_stub.py) on loopback."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rigup import gate, throughput
from roles.watchdog import unit_timeout_s, watchdog_config
from roles.watchdog import watchdog as wd

STUB = Path(__file__).resolve().parents[1] / "lab" / "engine_stub.py"
DATA = {"watchdog_interval_s": 300, "watchdog_bad_checks": 3, "watchdog_max_tokens": 32, "watchdog_timeout_s": 60,
        "rigup_maintenance": False, "rigup_state_dir": "/var/lib/rigup", "rigup_watchdog_reboot": False,
        "rigup_watchdog_max_reboots": 1,
        "llama_server_instances": {"glm": {"model": "m", "port": 8081, "min_tokens_per_s": 40},
                                   "keyed": {"model": "m", "port": 8082, "host": "10.0.0.5", "api_key": True,
                                             "min_tokens_per_s": 12.5},
                                   "gated": {"model": "m", "port": 8083},
                                   "off": {"model": "m", "port": 8084, "min_tokens_per_s": 0}}}


def test_config_watches_every_instance_but_those_turned_off():
    config = watchdog_config(DATA)
    assert config["instances"] == {
        "gated": {"url": "http://127.0.0.1:8083", "port": 8083, "key": None, "floor": None},
        "glm": {"url": "http://127.0.0.1:8081", "port": 8081, "key": None, "floor": 40.0},
        "keyed": {"url": "http://10.0.0.5:8082", "port": 8082, "key": "/etc/rigup/llama-server/keyed.key",
                  "floor": 12.5}}
    assert config["state_file"] == "/var/lib/rigup/watchdog.json" and config["maintenance"] is False
    assert config["gate_record"].format("rigup-llama@gated.service") == "/var/lib/rigup/gate/rigup-llama@gated.service.json"
    assert config["reboots_file"] == "/var/lib/rigup/watchdog-reboots.json" and config["reboot"] is False
    assert unit_timeout_s(config) == 8 * 3 * 65 + 60
    assert watchdog_config({**DATA, "rigup_maintenance": True})["maintenance"] is True


def test_default_floor_is_half_the_gates_tok_s(tmp_path):
    """The gate's own record (rigup/gate.py record_command, run here by sh) gives the floor."""
    config = {"gate_record": str(tmp_path / "gate" / "{}.json")}
    server = {"server": "gated", "unit": "rigup-llama@gated.service"}
    assert wd.floor_of(server, {"floor": None}, config) is None          # not gated yet: not judged
    path = config["gate_record"].format(server["unit"])
    subprocess.run(["sh", "-c", gate.record_command(path, server["unit"], 87.25, 1000.0)], check=True)
    print(f"\ngate record: {Path(path).read_text().strip()}")
    assert wd.floor_of(server, {"floor": None}, config) == 43.625
    assert wd.floor_of(server, {"floor": 12.0}, config) == 12.0           # min_tokens_per_s wins
    assert oct(Path(path).stat().st_mode & 0o777) == "0o644"
    assert gate.measured_tps({"timings": {"predicted_per_second": 87.25}}) == 87.25
    assert gate.measured_tps({"usage": {"completion_tokens": 16}}) is None   # vLLM: nothing to record


def test_servers_are_the_unit_or_each_replica():
    inst = watchdog_config(DATA)["instances"]["glm"]
    units = ["rigup-llama@glm.service", "rigup-llama@glm-0.service", "rigup-llama@glm-1.service",
             "rigup-llama@glm2.service", "rigup-llama@keyed.service"]
    assert [(s["server"], s["unit"], s["url"]) for s in wd.servers("glm", inst, units)] == [
        ("glm", "rigup-llama@glm.service", "http://127.0.0.1:8081"),
        ("glm-0", "rigup-llama@glm-0.service", "http://127.0.0.1:8082"),
        ("glm-1", "rigup-llama@glm-1.service", "http://127.0.0.1:8083")]


def test_k_checks_in_a_row_below_the_floor_restart_once(capsys):
    config = {"bad_checks": 3}
    server = {"server": "glm", "unit": "rigup-llama@glm.service"}
    record = {"bad": 0, "restarts": 0}
    seen = [wd.judge(server, 40.0, tps, record, config) for tps in (10.0, 50.0, 10.0, None, 39.9)]
    assert seen[:4] == [None] * 4 and record["bad"] == 0
    assert seen[4] == "3 checks in a row below the floor of 40 tok/s (last: 39.9 tok/s)"
    log = capsys.readouterr().out
    assert "<4>rigup-watchdog: glm: no answer, below its floor 40 tok/s (2 of 3 checks in a row)" in log


def test_still_below_after_the_restart_escalates_within_the_days_reboots(tmp_path, capsys):
    """k bad checks after the watchdog's restart: escalation, a reboot while the day's budget allows."""
    config = {"bad_checks": 2, "reboot": True, "max_reboots": 1, "reboots_file": str(tmp_path / "reboots.json")}
    server = {"server": "glm", "unit": "rigup-llama@glm.service"}
    record, reboots = {"bad": 0, "restarts": 0, "after_restart": True}, wd.reboots_today(config)
    assert reboots["count"] == 0
    why = [wd.judge(server, 40.0, 5.0, record, config) for _ in range(2)][-1]
    assert wd.escalate(server, record, why, config, reboots) == (
        True, "glm: still 2 checks in a row below the floor of 40 tok/s (last: 5.0 tok/s) after its restart by the watchdog")
    assert record["escalations"] == 1 and not record["after_restart"]
    assert "<2>rigup-watchdog: glm: still 2 checks" in capsys.readouterr().out
    Path(config["reboots_file"]).write_text('{"day": "%s", "count": 1}' % reboots["day"])
    assert wd.escalate(server, record, why, config, wd.reboots_today(config)) == (
        False, "not rebooting (1 of 1 reboots today already)")
    Path(config["reboots_file"]).write_text('{"day": "2000-01-01", "count": 1}')   # another day's
    assert wd.escalate(server, record, why, config, wd.reboots_today(config))[0] is True
    assert wd.escalate(server, record, why, {**config, "reboot": False}, reboots) == (
        False, "not rebooting (rigup_watchdog_reboot is false)")
    assert record["escalations"] == 4
    record["after_restart"] = True
    assert wd.judge(server, 40.0, 50.0, record, config) is None and not record["after_restart"]  # good again


def test_metrics_text_names_the_instance_its_rate_floor_and_restarts():
    records = {"glm": {"bad": 1, "restarts": 2, "last_tps": 3.5, "restart_tps": 2.0, "restarted_at": 100.0},
               "keyed": {"bad": 0, "restarts": 0, "last_tps": None}}
    text = wd.metrics_text(records, {"glm": 40.0, "keyed": 12.5}, {"maintenance": False, "interval_s": 300,
                                                                    "reboot": True, "max_reboots": 1}, 123.0,
                           {"day": "2026-11-30", "count": 1})
    print(text)
    for line in ('rigup_watchdog_restarts_total{llama_instance="glm"} 2', 'rigup_watchdog_tokens_per_second{llama_instance="glm"} 3.5',
                 'rigup_watchdog_floor_tokens_per_second{llama_instance="keyed"} 12.5', "rigup_watchdog_maintenance 0",
                 "# TYPE rigup_watchdog_restarts_total counter", "rigup_watchdog_reboots_today 1",
                 "rigup_watchdog_max_reboots 1", 'rigup_watchdog_last_restart_tokens_per_second{llama_instance="glm"} 2.0'):
        assert line in text.splitlines()
    assert 'rigup_watchdog_tokens_per_second{llama_instance="keyed"}' not in text     # no answer: no sample


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def engine():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STUB), "--port", str(port), "--tps", "400", "--slots", "4"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield url, proc
    proc.kill()
    proc.wait()


def test_throughput_of_one_completion_and_of_concurrency_levels(engine):
    url, proc = engine
    one = throughput.completion(url, max_tokens=40)
    print(f"\none completion: {one}")
    assert one["tokens"] == 40 and 300 < one["tps"] <= 400
    levels = throughput.sweep(url, [1, 4, 8], max_tokens=20, rounds=2)
    print("levels: " + "; ".join(f"{lv['concurrency']}: {lv['total_tps']} total, {lv['per_request_tps']} per request"
                                 for lv in levels))
    assert [lv["requests"] for lv in levels] == [2, 8, 16] and all(lv["failed"] == 0 for lv in levels)
    assert levels[1]["total_tps"] > 2.5 * levels[0]["total_tps"]           # 4 slots: 4 at once
    assert levels[2]["total_tps"] < 1.3 * levels[1]["total_tps"]           # 8 clients, still 4 slots
    os.kill(proc.pid, signal.SIGUSR1)                                       # wedged: 2 tok/s
    time.sleep(0.2)
    slow = throughput.completion(url, max_tokens=2)
    assert slow["tps"] < 3, slow
