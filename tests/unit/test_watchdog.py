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

from rigup import throughput
from roles.watchdog import unit_timeout_s, watchdog_config
from roles.watchdog import watchdog as wd

STUB = Path(__file__).resolve().parents[1] / "lab" / "engine_stub.py"
DATA = {"watchdog_interval_s": 300, "watchdog_bad_checks": 3, "watchdog_max_tokens": 32, "watchdog_timeout_s": 60,
        "rigup_maintenance": False, "rigup_state_dir": "/var/lib/rigup",
        "llama_server_instances": {"glm": {"model": "m", "port": 8081, "min_tokens_per_s": 40},
                                   "keyed": {"model": "m", "port": 8082, "host": "10.0.0.5", "api_key": True,
                                             "min_tokens_per_s": 12.5},
                                   "free": {"model": "m", "port": 8083}}}


def test_config_watches_only_instances_with_a_floor():
    config = watchdog_config(DATA)
    assert config["instances"] == {
        "glm": {"url": "http://127.0.0.1:8081", "port": 8081, "key": None, "floor": 40.0},
        "keyed": {"url": "http://10.0.0.5:8082", "port": 8082, "key": "/etc/rigup/llama-server/keyed.key",
                  "floor": 12.5}}
    assert config["state_file"] == "/var/lib/rigup/watchdog.json" and config["maintenance"] is False
    assert unit_timeout_s(config) == 8 * 2 * 65 + 60
    assert watchdog_config({**DATA, "rigup_maintenance": True})["maintenance"] is True


def test_servers_are_the_unit_or_each_replica():
    inst = watchdog_config(DATA)["instances"]["glm"]
    units = ["rigup-llama@glm.service", "rigup-llama@glm-0.service", "rigup-llama@glm-1.service",
             "rigup-llama@glm2.service", "rigup-llama@keyed.service"]
    assert [(s["server"], s["unit"], s["url"]) for s in wd.servers("glm", inst, units)] == [
        ("glm", "rigup-llama@glm.service", "http://127.0.0.1:8081"),
        ("glm-0", "rigup-llama@glm-0.service", "http://127.0.0.1:8082"),
        ("glm-1", "rigup-llama@glm-1.service", "http://127.0.0.1:8083")]


def test_k_checks_in_a_row_below_the_floor_restart_once(capsys):
    config, inst = {"bad_checks": 3}, {"floor": 40.0}
    server = {"server": "glm", "unit": "rigup-llama@glm.service"}
    record = {"bad": 0, "restarts": 0}
    seen = [wd.judge(server, inst, tps, record, config) for tps in (10.0, 50.0, 10.0, None, 39.9)]
    assert seen[:4] == [None] * 4 and record["bad"] == 0
    assert seen[4] == ("3 checks in a row below the floor of 40 tok/s (last: 39.9 tok/s); "
                       "restarting rigup-llama@glm.service")
    log = capsys.readouterr().out
    assert "<4>rigup-watchdog: glm: no answer, below its floor 40 tok/s (2 of 3 checks in a row)" in log


def test_metrics_text_names_the_instance_its_rate_floor_and_restarts():
    records = {"glm": {"bad": 1, "restarts": 2, "last_tps": 3.5, "restart_tps": 2.0, "restarted_at": 100.0},
               "keyed": {"bad": 0, "restarts": 0, "last_tps": None}}
    text = wd.metrics_text(records, {"glm": 40.0, "keyed": 12.5}, {"maintenance": False, "interval_s": 300}, 123.0)
    print(text)
    for line in ('rigup_watchdog_restarts_total{llama_instance="glm"} 2', 'rigup_watchdog_tokens_per_second{llama_instance="glm"} 3.5',
                 'rigup_watchdog_floor_tokens_per_second{llama_instance="keyed"} 12.5', "rigup_watchdog_maintenance 0",
                 "# TYPE rigup_watchdog_restarts_total counter", 'rigup_watchdog_last_restart_tokens_per_second{llama_instance="glm"} 2.0'):
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
