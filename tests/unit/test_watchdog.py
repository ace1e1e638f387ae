"""roles/watchdog without hosts: its configuration from llama_server_instances, the k-in-a-row
judgement, the servers of an instance (replicas), the metrics text, and shipped/throughput.py
against the engine stand-in (tests/lab/engine_stub.py) on loopback."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rigup import gate
from shipped import throughput
from roles.watchdog import unit_timeout_s, watchdog_config, watched
from roles.watchdog.shipped import watchdog as wd

from tests.unit.world import remade

_remade = remade(throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)

STUB = Path(__file__).resolve().parents[1] / "lab" / "engine_stub.py"
DATA = {"watchdog_interval_s": 300, "watchdog_bad_checks": 3, "watchdog_max_tokens": 32, "watchdog_timeout_s": 60,
        "watchdog_grace_s": 300, "rigup_maintenance": False, "rigup_state_dir": "/var/lib/rigup",
        "rigup_watchdog_reboot": False, "rigup_watchdog_max_reboots": 1,
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
    assert config["grace_s"] == 300 and config["command_timeout_s"] == wd.COMMAND_TIMEOUT_S == 30
    assert unit_timeout_s(config) == 8 * 3 * (65 + 2 * 30) + 2 * 30 + 60
    assert watchdog_config({**DATA, "rigup_maintenance": True})["maintenance"] is True
    router = {**DATA["llama_server_instances"]["glm"], "also": ["other"], "port": 8090}   # issue 49: its own floor
    routers = {"router": router, "unfloored": {**router, "port": 8095, "min_tokens_per_s": None}}
    found = watched({**DATA, "llama_server_instances": {**DATA["llama_server_instances"], **routers}})
    assert found["router"]["models"] == ["m", "other"] and found["router"]["floor"] == 40.0
    assert "unfloored" not in found       # one gate's tok/s is no floor for the set's other models


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
    assert wd.escalate(server, record, why, config, reboots, gated=True) == (
        True, "glm: still 2 checks in a row below the floor of 40 tok/s (last: 5.0 tok/s) after its restart by the watchdog")
    assert record["escalations"] == 1 and not record["after_restart"]
    assert "<2>rigup-watchdog: glm: still 2 checks" in capsys.readouterr().out
    Path(config["reboots_file"]).write_text('{"day": "%s", "count": 1}' % reboots["day"])
    assert wd.escalate(server, record, why, config, wd.reboots_today(config), gated=True) == (
        False, "not rebooting (1 of 1 reboots today already)")
    Path(config["reboots_file"]).write_text('{"day": "2000-01-01", "count": 1}')   # another day's
    assert wd.escalate(server, record, why, config, wd.reboots_today(config), gated=True)[0] is True
    assert wd.escalate(server, record, why, {**config, "reboot": False}, reboots, gated=True) == (
        False, "not rebooting (rigup_watchdog_reboot is false)")
    # bad checks of a server that has not passed its gate since its last start: never a reboot
    assert wd.escalate(server, record, why, config, wd.reboots_today(config), gated=False) == (
        False, "not rebooting (it has not passed its gate since its last start: no whole completion since)")
    assert record["escalations"] == 5
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
    # 8 clients, still 4 slots: never above the stand-in's cap of 4 x 400 tok/s (a ratio to the 4-client level
    # failed at 1554 vs 1.3 x 1000 on a machine at load 8, whose 4 clients were the ones slowed)
    assert levels[2]["total_tps"] <= 1.05 * 4 * 400
    os.kill(proc.pid, signal.SIGUSR1)                                       # wedged: 2 tok/s
    time.sleep(0.2)
    slow = throughput.completion(url, max_tokens=2)
    assert slow["tps"] < 3, slow


# The faults of one host's servers, one check after another, against a fake systemctl on PATH
# (FAKE_SYSTEMCTL: the units of a JSON file, every call logged, some made to hang) and servers on
# loopback: the engine stand-in in its modes, a tiny server here that closes the connection.
FAKE_SYSTEMCTL = r'''#!{python}
import json, sys, time
UNITS, CALLS = {units!r}, {calls!r}
args = sys.argv[1:]
with open(CALLS, "a") as f:
    f.write(" ".join(args) + "\n")
with open(UNITS) as f:
    doc = json.load(f)
verb, unit = args[0], args[-1]
if verb in doc["hang"] or f"{{verb}} {{unit}}" in doc["hang"]:
    time.sleep(120)
now = time.clock_gettime(time.CLOCK_MONOTONIC)
if verb == "list-units":
    for name, u in sorted(doc["units"].items()):
        if u["active"]:
            print(f"{{name}} loaded active running rigup lab stub")
elif verb == "show":
    u = doc["units"].get(unit)
    mono = int((now - (time.time() - u["started"])) * 1e6) if u else 0
    print(f"ActiveState={{'active' if u and u['active'] else 'inactive'}}")
    print(f"ActiveEnterTimestampMonotonic={{mono}}\nExecMainStartTimestampMonotonic={{mono}}")
elif verb == "restart":
    doc["units"][unit]["started"] = time.time()
    with open(UNITS, "w") as f:
        json.dump(doc, f)
'''
FLOOR, OLD, GRACE = 50.0, 100, 60          # a start OLD s ago is past the GRACE


class FakeHost:
    """A host of the watchdog's: its config, state and gate records under ``tmp``, its units in
    the fake systemctl's file (Unix start times), and what systemctl was asked."""

    def __init__(self, tmp: Path, monkeypatch):
        if time.clock_gettime(time.CLOCK_MONOTONIC) < 3 * OLD:
            pytest.skip("the machine booted too recently to date units OLD s back")
        self.tmp, self.units_file, self.calls_file = tmp, tmp / "units.json", tmp / "calls.log"
        (tmp / "bin").mkdir()
        fake = tmp / "bin" / "systemctl"
        fake.write_text(FAKE_SYSTEMCTL.format(python=sys.executable, units=str(self.units_file),
                                              calls=str(self.calls_file)))
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}")
        self.doc = {"units": {}, "hang": []}
        self.calls_file.write_text("")
        self.config = {"instances": {}, "interval_s": 300, "bad_checks": 2, "max_tokens": 8, "timeout_s": 5,
                       "grace_s": GRACE, "command_timeout_s": 0.5, "maintenance": False,
                       "state_file": str(tmp / "state" / "watchdog.json"),
                       "metrics_file": str(tmp / "textfile" / "rigup_watchdog.prom"),
                       "gate_record": str(tmp / "gate" / "{}.json"), "reboot": True, "max_reboots": 1,
                       "reboots_file": str(tmp / "state" / "watchdog-reboots.json")}
        (tmp / "textfile").mkdir()

    def serve(self, name: str, url: str, started_ago: float, gated_ago: float | None = None) -> None:
        """Instance ``name`` at ``url``, its unit active since ``started_ago`` s, its gate passed
        ``gated_ago`` s ago (rigup/gate.py's own record command)."""
        self.config["instances"][name] = {"url": url, "port": int(url.rsplit(":", 1)[1]), "key": None,
                                          "floor": FLOOR}
        self.doc["units"][f"rigup-llama@{name}.service"] = {"active": True, "started": time.time() - started_ago}
        if gated_ago is not None:
            unit = f"rigup-llama@{name}.service"
            subprocess.run(["sh", "-c", gate.record_command(self.config["gate_record"].format(unit), unit, 200.0,
                                                            time.time() - gated_ago)], check=True)
        self.save()

    def save(self) -> None:
        self.units_file.write_text(json.dumps(self.doc))

    def older(self, name: str, seconds: float) -> None:
        """``seconds`` passed for ``name`` alone: its unit's start, and the times the watchdog
        kept of it, that much earlier."""
        self.doc = json.loads(self.units_file.read_text())
        self.doc["units"][f"rigup-llama@{name}.service"]["started"] -= seconds
        self.save()
        state = self.state()
        for field in ("started", "restarted_at", "passed_at", "escalated_at"):
            if field in state[name]:
                state[name][field] -= seconds
        Path(self.config["state_file"]).write_text(json.dumps(state))

    def hang(self, *calls: str) -> None:
        """These systemctl calls (a verb, or "verb unit") hang from now on."""
        self.doc = json.loads(self.units_file.read_text())
        self.doc["hang"] = list(calls)
        self.save()

    def check(self, capsys) -> str:
        assert wd.check(self.config) == 0
        return capsys.readouterr().out

    def state(self) -> dict:
        return json.loads(Path(self.config["state_file"]).read_text())

    def calls(self, verb: str) -> list[str]:
        return [ln.split()[-1] for ln in self.calls_file.read_text().splitlines() if ln.split()[0] == verb]

    def counts(self) -> str:
        """The restarts and reboots counted, as the tests print them."""
        state, reboots = self.state(), wd.load(self.config["reboots_file"], {}).get("count", 0)
        return (", ".join(f"{s}: {r.get('restarts', 0)} restarts, {r.get('escalations', 0)} escalations, "
                          f"{r.get('failed', 0)} failed, {r.get('unjudged', 0)} not judged, "
                          f"{r.get('command_failures', 0)} systemctl failures" for s, r in sorted(state.items()))
                + f"; reboots: {reboots} counted, {len(self.calls('reboot'))} asked of systemctl")


class CutOff(BaseHTTPRequestHandler):
    """A server that dies under its answer: ``cut`` sends the headers and part of the body, then
    closes the connection; ``gone`` closes it without a word."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.server.mode == "cut":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "400")
            self.end_headers()
            self.wfile.write(b'{"object": "chat.completion", "choices": [{"message": {"content": "word wo')
        self.close_connection = True

    def log_message(self, *a):
        pass


def cut_off_server(mode: str):
    server = ThreadingHTTPServer(("127.0.0.1", 0), CutOff)
    server.mode, server.daemon_threads = mode, True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def start_stub(*extra: str, tps: float = 400) -> tuple[str, subprocess.Popen]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STUB), "--port", str(port), "--tps", str(tps), *extra])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.05)
    return url, proc


@pytest.fixture(scope="module")
def engines():
    """Stand-ins on loopback: healthy (400 tok/s), slow (20 tok/s, below FLOOR), nulls, die,
    loading (503), and the in-test servers that cut their answer off or close without one."""
    procs, servers_ = {}, {}
    try:
        for name, extra, tps in (("good", (), 400), ("slow", (), 20), ("nulls", ("--mode", "nulls"), 400),
                                 ("die", ("--mode", "die"), 400), ("loading", ("--mode", "loading"), 400)):
            procs[name] = start_stub(*extra, tps=tps)
        for mode in ("cut", "gone"):
            servers_[mode] = cut_off_server(mode)
        urls = {name: url for name, (url, _) in procs.items()}
        urls.update({mode: f"http://127.0.0.1:{s.server_address[1]}" for mode, s in servers_.items()})
        urls["refused"] = f"http://127.0.0.1:{free_port()}"      # nothing listens (yet)
        yield urls
    finally:
        for _, proc in procs.values():
            proc.kill()
            proc.wait()
        for s in servers_.values():
            s.shutdown()
            s.server_close()


def test_the_engine_stubs_faults_are_samples_not_exceptions(engines):
    """What each faulty answer is to the measuring (shipped/throughput.py raises; a cut-off answer
    is http.client.IncompleteRead, not an OSError) and to the watchdog: one sample."""
    config = {"max_tokens": 8, "timeout_s": 5}
    with pytest.raises(ValueError, match="^usage.completion_tokens is not a whole number"):   # null: no count
        throughput.completion(engines["nulls"], max_tokens=8)
    with pytest.raises(http.client.IncompleteRead):
        throughput.completion(engines["die"], max_tokens=8)
    seen = {name: wd.measure({"server": name, "url": engines[name]}, {"key": None}, config)
            for name in ("good", "nulls", "die", "cut", "gone", "loading", "refused")}
    for name, sample in seen.items():
        print(f"{name}: {sample}")
    assert seen["good"]["tps"] > FLOOR and "kind" not in seen["good"]
    assert seen["nulls"]["kind"] == "bad" and "malformed answer" in seen["nulls"]["why"]
    for name in ("die", "cut", "gone"):
        assert seen[name]["kind"] == "bad" and "cut off" in seen[name]["why"], name
    assert seen["loading"] == {"tps": None, "kind": "starting", "why": "HTTP 503 (Loading model)"}
    assert seen["refused"] == {"tps": None, "kind": "starting", "why": "connection refused"}
    with urllib.request.urlopen(engines["good"] + "/health", timeout=5) as ok:
        assert ok.status == 200
    with pytest.raises(urllib.error.HTTPError) as loading:
        urllib.request.urlopen(engines["loading"] + "/health", timeout=5)
    assert loading.value.code == 503                          # as llama-server's /health while it loads


def test_each_server_is_judged_on_its_own(engines, tmp_path, monkeypatch, capsys):
    """One host, every fault at once: nulls, an answer cut off (the stand-in's die mode and a server
    here), a connection closed without an answer, a server still loading (503) and one refusing
    right after their restart, a unit whose systemctl show hangs, one whose restart hangs. The
    healthy one is judged as usual in every check; the faulty ones with a gate passed since their
    start are restarted after 2 bad checks; the loading and refusing ones are not judged, not
    restarted; nothing reboots the host; the state is saved each time. Then, past the grace after
    their restart, the same faults escalate and are restarted again, never rebooted: they have
    not passed their gate since that restart."""
    host = FakeHost(tmp_path, monkeypatch)
    for name in ("good", "nulls", "die", "cut", "gone"):
        host.serve(name, engines[name], started_ago=OLD, gated_ago=OLD - 5)
    host.serve("loading", engines["loading"], started_ago=3, gated_ago=2 * OLD)   # restarted, gated before
    host.serve("refused", engines["refused"], started_ago=2, gated_ago=2 * OLD)
    host.serve("hung", engines["good"], started_ago=OLD, gated_ago=OLD - 5)
    host.serve("stuck", engines["slow"], started_ago=OLD, gated_ago=OLD - 5)
    host.hang("show rigup-llama@hung.service", "restart rigup-llama@stuck.service")
    started = time.monotonic()
    first, second = host.check(capsys), host.check(capsys)
    took = time.monotonic() - started
    print(first + second)
    print(f"2 checks in {took:.1f} s: {host.counts()}")
    state = host.state()
    assert state["good"]["last_tps"] > FLOOR and state["good"]["bad"] == 0 and not state["good"].get("restarts")
    assert all(re.search(r"<6>rigup-watchdog: good: [\d.]+ tok/s, at or above its floor 50 tok/s", log)
               for log in (first, second))
    assert sorted(host.calls("restart")) == sorted(f"rigup-llama@{n}.service" for n in ("nulls", "die", "cut", "gone",
                                                                                        "stuck"))
    for name in ("nulls", "die", "cut", "gone"):
        assert state[name]["restarts"] == 1 and state[name]["failed"] == 2 and state[name]["after_restart"], name
    assert "nulls: a malformed answer (no usable usage.completion_tokens: ValueError" in first
    assert "die: the answer was cut off: the connection closed mid-answer (IncompleteRead" in first
    assert "gone: the answer was cut off: the connection closed mid-answer (RemoteDisconnected" in first
    for name, why in (("loading", "HTTP 503 (Loading model)"), ("refused", "connection refused")):
        assert state[name]["unjudged"] == 2 and state[name]["starting"] == 1 and not state[name].get("restarts")
        assert not state[name].get("failed") and not state[name].get("bad")
        assert re.search(rf"<5>rigup-watchdog: {name}: {re.escape(why)}, \d+ s after its start: not judged \(until "
                         rf"it passes its gate, at most {GRACE} s after its start\)", first), name
    assert state["hung"]["command_failures"] == 2 and "last_tps" not in state["hung"]
    assert "hung: not judged: its unit's state is unknown: `systemctl show" in first
    assert "did not return within 0.5 s (killed)" in first
    assert state["stuck"]["command_failures"] == 1 and not state["stuck"].get("restarts")
    assert "stuck: restart of rigup-llama@stuck.service failed: `systemctl restart --no-block" in second
    assert state["stuck"]["bad"] == 1                       # the next bad check asks for the restart again
    assert host.calls("reboot") == [] and not Path(host.config["reboots_file"]).exists()
    assert [p.name for p in Path(host.config["state_file"]).parent.iterdir()] == ["watchdog.json"]   # no tmp left
    metrics = Path(host.config["metrics_file"]).read_text()
    assert 'rigup_watchdog_starting{llama_instance="loading"} 1' in metrics
    assert 'rigup_watchdog_command_failures_total{llama_instance="hung"} 2' in metrics
    assert 'rigup_watchdog_failed_checks_total{llama_instance="nulls"} 2' in metrics
    # right after the watchdog's restart: not judged (no gate passed since), nothing restarted
    third = host.check(capsys)
    assert host.calls("restart").count("rigup-llama@nulls.service") == 1
    assert "nulls: a malformed answer" in third and "s after its start: not judged" in third
    # past the grace, still faulty: escalated, restarted again, never a reboot
    for name in ("nulls", "die", "cut", "gone"):
        host.older(name, GRACE)
    later = host.check(capsys) + host.check(capsys)
    print(later)
    print(f"past the grace: {host.counts()}")
    state = host.state()
    for name in ("nulls", "die", "cut", "gone"):
        assert state[name]["restarts"] == 2 and state[name]["escalations"] == 1, name
        assert f"{name}: still 2 checks in a row below the floor of 50 tok/s" in later
    assert later.count("not rebooting (it has not passed its gate since its last start") == 4
    assert host.calls("reboot") == [] and not Path(host.config["reboots_file"]).exists()
    assert state["good"]["bad"] == 0 and not state["good"].get("restarts") and state["good"]["last_tps"] > FLOOR
    assert not state["loading"].get("restarts") and not state["refused"].get("restarts")


def test_slow_after_passing_its_gate_again_still_reboots(engines, tmp_path, monkeypatch, capsys):
    """The escalation's reboot stays for a server that came up again and is still slow: after the
    watchdog's restart its first whole completion is its gate (not judged), the next ones judge."""
    host = FakeHost(tmp_path, monkeypatch)
    host.serve("slow", engines["slow"], started_ago=OLD, gated_ago=OLD - 5)
    host.config["bad_checks"] = 1
    log = host.check(capsys)
    assert host.calls("restart") == ["rigup-llama@slow.service"]
    log += host.check(capsys)
    assert "slow: a whole completion (" in log and "passed its gate; judged from the next check" in log
    assert host.calls("reboot") == []
    log += host.check(capsys)
    print(log + f"\n{host.counts()}")
    assert "slow: still 1 checks in a row below the floor of 50 tok/s" in log
    assert "rebooting the host (1 of 1 today)" in log and host.calls("reboot") == ["reboot"]
    assert json.loads(Path(host.config["reboots_file"]).read_text())["count"] == 1
    assert host.state()["slow"]["escalations"] == 1


def test_a_loading_server_is_judged_once_it_answers(tmp_path, monkeypatch, capsys):
    """Still loading after its restart (503 while a file exists): not judged; loaded: its first
    whole completion passes its gate, the next is judged (good)."""
    host = FakeHost(tmp_path, monkeypatch)
    loading = tmp_path / "loading"
    loading.touch()
    url, proc = start_stub("--loading-file", str(loading))
    try:
        host.serve("gemma", url, started_ago=2, gated_ago=OLD)
        log = host.check(capsys) + host.check(capsys)
        assert log.count("gemma: HTTP 503 (Loading model)") == 2 and "not judged" in log
        loading.unlink()
        log += host.check(capsys)
        assert "passed its gate" in log and host.state()["gemma"]["starting"] == 1
        log += host.check(capsys)
        print(log + host.counts())
    finally:
        proc.kill()
        proc.wait()
    record = host.state()["gemma"]
    assert record["starting"] == 0 and record["last_tps"] > FLOOR and record["bad"] == 0 and record["unjudged"] == 2
    assert host.calls("restart") == [] and host.calls("reboot") == []


def test_an_unlisted_host_checks_the_servers_of_its_last_run(engines, tmp_path, monkeypatch, capsys):
    host = FakeHost(tmp_path, monkeypatch)
    host.serve("good", engines["good"], started_ago=OLD, gated_ago=OLD - 5)
    host.check(capsys)
    host.hang("list-units")
    log = host.check(capsys)
    print(log)
    assert "the serving units could not be listed: `systemctl list-units" in log
    assert "checking the 1 of the last run" in log
    assert host.state()["good"]["last_tps"] > FLOOR and host.calls("show").count("rigup-llama@good.service") == 2


def test_a_failure_inside_one_servers_check_is_that_servers(engines, tmp_path, monkeypatch, capsys):
    """An exception of the watchdog's own in one server's check: that server's failed check; the
    others are judged, the state saved. One that ends the run (SystemExit: SIGTERM) still saves."""
    host = FakeHost(tmp_path, monkeypatch)
    for name in ("a", "b", "c"):
        host.serve(name, engines["good"], started_ago=OLD, gated_ago=OLD - 5)
    measure = wd.measure

    def broken(server, inst, config, *model):
        if server["server"] == "b":
            raise RuntimeError("a bug")
        return measure(server, inst, config, *model)

    monkeypatch.setattr(wd, "measure", broken)
    log = host.check(capsys)
    assert "<3>rigup-watchdog: b: the check failed: RuntimeError: a bug" in log
    state = host.state()
    assert state["a"]["last_tps"] > FLOOR and state["c"]["last_tps"] > FLOOR and state["b"]["failed"] == 1

    def stopped(server, inst, config, *model):
        if server["server"] == "b":
            raise SystemExit("stopped by signal 15")
        return measure(server, inst, config, *model)

    Path(host.config["state_file"]).unlink()
    monkeypatch.setattr(wd, "measure", stopped)
    with pytest.raises(SystemExit):
        wd.check(host.config)
    assert host.state()["a"]["last_tps"] > FLOOR and "c" not in host.state()


def test_sigterm_while_systemctl_hangs_saves_the_state(engines, tmp_path, monkeypatch):
    """The script as the unit runs it, killed by its unit's timeout (SIGTERM) while a systemctl
    hangs: the state of the servers checked so far is saved."""
    host = FakeHost(tmp_path, monkeypatch)
    host.serve("a", engines["good"], started_ago=OLD, gated_ago=OLD - 5)
    host.serve("b", engines["good"], started_ago=OLD, gated_ago=OLD - 5)
    host.hang("show rigup-llama@b.service")
    host.config["command_timeout_s"] = 60
    (tmp_path / "config.json").write_text(json.dumps(host.config))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "roles/watchdog/shipped/watchdog.py"), "--config",
                             str(tmp_path / "config.json"), "check"], env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(200):
        if "rigup-llama@b.service" in " ".join(host.calls("show")):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=10)
    finally:   # the hung systemctl is in a session of its own: on a host, systemd ends the unit's cgroup
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / "bin" / "systemctl")], check=False)
    print(out)
    assert proc.returncode == 1 and "stopped by signal 15" in out
    assert host.state()["a"]["last_tps"] > FLOOR and host.state()["b"] == {"bad": 0, "restarts": 0,
                                                                           "unit": "rigup-llama@b.service"}


def test_a_server_that_may_sleep_is_judged_only_after_it_served(tmp_path, monkeypatch, capsys):
    """issue 49: an instance with sleep_idle_s (``sleeps``) is judged only when clients were served
    since the last check (its /metrics' tokens, which neither wake it nor reset its idle timer): a
    check of an idle server sends nothing (it would wake it, or keep it from sleeping); its own
    completion does not count as a client's; a slow server that serves is still restarted."""
    host = FakeHost(tmp_path, monkeypatch)
    url, proc = start_stub(tps=20)           # below FLOOR when measured
    try:
        host.serve("gemma", url, started_ago=OLD, gated_ago=OLD)
        host.config["instances"]["gemma"]["sleeps"] = True
        served = lambda: throughput.tokens_served(url)   # noqa: E731
        log = host.check(capsys)              # first sight: measured (nothing to compare with)
        after_first = served()
        log += host.check(capsys) + host.check(capsys)   # nobody asked since: not judged, nothing sent
        idle_checks = log.count("no request served since the last check")
        assert served() == after_first and idle_checks == 2 and host.calls("restart") == []
        throughput.completion(url, None, 8)   # a client
        log += host.check(capsys)             # judged: slow (2nd bad check in a row with the first)
        print(log + host.counts())
    finally:
        proc.kill()
        proc.wait()
    assert host.calls("restart") == ["rigup-llama@gemma.service"]


def test_a_router_is_timed_on_the_model_it_has_loaded_and_never_made_to_load_one(tmp_path, monkeypatch, capsys):
    """Issue 49: a router (the stand-in's router mode, one model loaded at a time) is timed on its
    loaded model; with none loaded it is not judged; the checks load nothing (its load count)."""
    host = FakeHost(tmp_path, monkeypatch)
    procs = {"loaded": start_stub("--router", "a,b", "--loaded", "b", "--load-s", "2"),
             "none": start_stub("--router", "a,b", "--loaded", "", "--load-s", "2")}
    try:
        for name, (url, _) in procs.items():
            host.serve(name, url, started_ago=OLD, gated_ago=OLD - 5)
            host.config["instances"][name]["models"] = ["a", "b"]
        for _ in range(2):
            log = host.check(capsys)
        state = host.state()
        loads = {n: json.loads(urllib.request.urlopen(f"{u}/stub/loads", timeout=5).read()) for n, (u, _) in procs.items()}
        print(log, state, loads)
        assert "rigup-watchdog: loaded: timed b, the model it has loaded" in log
        assert state["loaded"]["last_tps"] > FLOOR and state["loaded"].get("bad", 0) == 0
        assert "none: not judged: none of its models is loaded" in log and state["none"]["unjudged"] == 2
        assert loads == {"loaded": {"loaded": "b", "loads": 0}, "none": {"loaded": "", "loads": 0}}
    finally:
        for _, proc in procs.values():
            proc.kill()
            proc.wait()


class Reports(BaseHTTPRequestHandler):
    """A server whose completions report ``timings.predicted_per_second`` as ``server.rate`` (raw
    JSON text: Infinity, NaN, -5, 1e308) with a whole usage; it answers at once."""

    def do_POST(self):
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        body = ('{"choices": [{"message": {"content": "%s"}}], "usage": {"completion_tokens": %d}, '
                '"timings": {"predicted_per_second": %s}}'
                % ("word " * asked["max_tokens"], asked["max_tokens"], self.server.rate)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


ABSURD = ("Infinity", "-Infinity", "NaN", "-5", "0", "1e308", "1e12")


def test_an_absurd_speed_never_becomes_a_figure_a_floor_or_a_restart(tmp_path, monkeypatch, capsys):
    """issue 65 (47, 61 before it): a speed of inf, NaN, a negative or an absurd one, wherever it comes
    from, is no figure: a server's own report gives way to the wall-clock rate (a finite one); the
    gate's record of it (rigup/gate.py writes Infinity as it measured it) gives no floor (the server
    not judged, said in the journal); a floor in the config that is none (a YAML .inf or .nan) judges
    nothing; so no check restarts anything."""
    rates, floors = {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Reports)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for text in ABSURD:
            server.rate = text
            rates[text] = throughput.completion(url, None, 8, 5)["tps"]
    finally:
        server.shutdown()
        server.server_close()
    config = {"gate_record": str(tmp_path / "gate" / "{}.json")}
    unit = "rigup-llama@gated.service"
    for value in (float("inf"), float("-inf"), float("nan"), -5.0, 0.0, 1e308, 1e12):
        subprocess.run(["sh", "-c", gate.record_command(config["gate_record"].format(unit), unit, value, 1000.0)],
                       check=True)
        floors[repr(value)] = wd.floor_of({"server": "gated", "unit": unit}, {"floor": None}, config)
    configured = {repr(v): wd.floor_of({"server": "s", "unit": unit}, {"floor": v}, config)
                  for v in (float("inf"), float("nan"), -1.0, 1e12, True, "40")}
    log = capsys.readouterr().out
    print(f"reported -> measured tok/s: {rates}\ngate record -> floor: {floors}\nconfig floor -> floor: {configured}")
    assert all(0 < tps < 1e7 for tps in rates.values()), rates      # the wall-clock rate of 8 tokens
    assert set(floors.values()) == {None} and set(configured.values()) == {None}
    assert wd.floor_of({"server": "s", "unit": unit}, {"floor": 40}, config) == 40
    assert "is not one (ignored: no floor from it" in log and "not a number in 0..1e+07" in log
    assert "s: not judged: its floor is none (min_tokens_per_s: not a number in 0..1e+07: inf)" in log
    # and the state file: a figure out of bounds is never read back as a last or restarting tok/s
    path = tmp_path / "state.json"
    path.write_text('{"glm": {"bad": 1, "last_tps": Infinity, "restart_tps": NaN}}')
    assert wd.load_state({"state_file": str(path)}) == {}


def test_one_bad_answer_between_good_ones_restarts_nothing(tmp_path, monkeypatch, capsys):
    """issue 65: the watchdog acts on ``bad_checks`` answers in a row (2 here, 3 by default), never
    on one: a server slow once between good checks, twice with a good one between, is restarted
    only at its second slow check in a row; a server whose configured floor is none (.inf) is
    never judged, so never restarted. Each check's verdict printed."""
    host = FakeHost(tmp_path, monkeypatch)
    slow = tmp_path / "slow"
    url, proc = start_stub("--slow-file", str(slow), "--slow-tps", "20")
    try:
        host.serve("glm", url, started_ago=OLD, gated_ago=OLD - 5)
        host.serve("inf", url, started_ago=OLD, gated_ago=OLD - 5)
        host.config["instances"]["inf"]["floor"] = float("inf")
        seen = []
        for answer in ("good", "slow", "good", "slow", "good", "slow", "slow"):
            slow.touch() if answer == "slow" else slow.unlink(missing_ok=True)
            host.check(capsys)
            state = host.state()
            seen.append((answer, state["glm"]["last_tps"], state["glm"]["bad"], len(host.calls("restart"))))
    finally:
        proc.kill()
        proc.wait()
    print("\n".join(f"{a}: {tps} tok/s, {bad} bad in a row, {n} restarts" for a, tps, bad, n in seen))
    assert [n for *_, n in seen] == [0, 0, 0, 0, 0, 0, 1] and host.calls("restart") == ["rigup-llama@glm.service"]
    assert [bad for _, _, bad, _ in seen] == [0, 1, 0, 1, 0, 1, 0]     # the restart starts the count again
    assert "last_tps" not in host.state()["inf"] and not host.state()["inf"].get("restarts")


def reply(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def answer_fast(handler: BaseHTTPRequestHandler) -> int:
    """A whole completion of the tokens asked, at 400 tok/s as the server reports it; the tokens."""
    tokens = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length", 0))))["max_tokens"]
    reply(handler, json.dumps({"choices": [{"message": {"content": "word " * tokens}}], "usage": {"completion_tokens": tokens},
                               "timings": {"predicted_per_second": 400.0}}).encode())
    return tokens


class Sleepy(BaseHTTPRequestHandler):
    """A llama-server with sleep_idle_s as its /metrics shows it: ``server.figures`` (its counters and
    gauges, as llama-server names them without the prefix); a completion adds its tokens to
    tokens_predicted_total and is counted in ``server.asked``."""

    def do_GET(self):
        reply(self, "".join(f"llamacpp:{k} {v}\n" for k, v in self.server.figures.items()).encode())

    def do_POST(self):
        self.server.asked += 1
        self.server.figures["tokens_predicted_total"] += answer_fast(self)

    def log_message(self, *a):
        pass


def test_a_wedged_sleeping_server_is_restarted(tmp_path, monkeypatch, capsys):
    """issue 65: a server with sleep_idle_s is not judged while idle (nothing served, nothing waiting:
    a check would wake it); but requests waiting (llamacpp:requests_processing + requests_deferred)
    with no token generated and no decode since the last check is a wedged server: a bad check,
    without a completion sent (it would only wait too); ``bad_checks`` (2) in a row restart it. A
    long generation (decodes going on, no request finished) is not wedged. Each check printed."""
    host = FakeHost(tmp_path, monkeypatch)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sleepy)
    server.daemon_threads, server.asked = True, 0
    server.figures = {"tokens_predicted_total": 100, "n_decode_total": 50, "requests_processing": 0,
                      "requests_deferred": 0}
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    seen, said = [], []

    def check(what: str, **figures) -> None:
        server.figures.update(figures)
        asked = server.asked
        log = host.check(capsys)
        record = host.state()["gemma"]
        seen.append((what, record.get("bad"), len(host.calls("restart")), server.asked - asked))
        said.append(f"{what}: {record.get('bad')} bad in a row, {seen[-1][2]} restarts, {seen[-1][3]} completions "
                    "sent; " + " | ".join(ln for ln in log.splitlines() if "gemma" in ln))

    try:
        host.serve("gemma", url, started_ago=OLD, gated_ago=OLD - 5)
        host.config["instances"]["gemma"]["sleeps"] = True
        check("first sight")
        check("idle")
        check("a long generation", requests_processing=1, n_decode_total=400)
        check("wedged", requests_deferred=3)
        check("still wedged")
    finally:
        server.shutdown()
        server.server_close()
    print("\n".join(said))
    assert seen == [("first sight", 0, 0, 1), ("idle", 0, 0, 0), ("a long generation", 0, 0, 1),
                    ("wedged", 1, 0, 0), ("still wedged", 0, 1, 0)]
    assert host.calls("restart") == ["rigup-llama@gemma.service"]


class Router(BaseHTTPRequestHandler):
    """A router of llama-server's as its /models shows each model's status (``server.models``: id ->
    status object, as llama-server writes it: ``{"value": "unloaded", "failed": true, "exit_code":
    1}`` after a load that failed); a completion for a loaded model answers at 400 tok/s."""

    def do_GET(self):
        reply(self, json.dumps({"data": [{"id": m, "status": s} for m, s in self.server.models.items()]}).encode()
              if self.path == "/models" else b"llamacpp:tokens_predicted_total 0\n")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        status = self.server.models.get(body.get("model")) or {}
        if status.get("failed") and not getattr(self.server, "answers_anyway", False):   # its load fails again
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply(self, json.dumps({"choices": [{"message": {"content": "word " * body["max_tokens"]}}],
                                "usage": {"completion_tokens": body["max_tokens"]},
                                "timings": {"predicted_per_second": 400.0}}).encode())

    def log_message(self, *a):
        pass


LOADED, UNLOADED = {"value": "loaded"}, {"value": "unloaded"}
FAILED = {"value": "unloaded", "failed": True, "exit_code": 1}


def test_a_router_model_that_keeps_failing_to_load_is_named_and_its_router_restarted_once(tmp_path, monkeypatch, capsys):
    """issue 65: a model of a router's set that reads failed (its last load failed: llama-server's
    status ``failed``, with its exit code) in ``bad_checks`` (2) checks in a row is named and the
    router restarted (a fresh router clears it); failing again after that restart it is named at
    priority crit and counted (an escalation), never restarted again until it has loaded once (a
    model whose file or flags fail restarts nothing in a loop); one failed look alone restarts
    nothing; the loaded model is judged as usual meanwhile. Each check printed."""
    host = FakeHost(tmp_path, monkeypatch)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    server.daemon_threads, server.models = True, {"a": LOADED, "b": UNLOADED}
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    seen, said = [], []

    def check(what: str, b: dict) -> None:
        server.models["b"] = b
        log = host.check(capsys)
        record = host.state()["duo"]
        seen.append((what, len(host.calls("restart")), record.get("escalations", 0)))
        said.append(f"{what}: {seen[-1][1]} restarts, {seen[-1][2]} escalations; "
                    + " | ".join(ln for ln in log.splitlines() if " b " in ln or "restarting" in ln))

    try:
        host.serve("duo", url, started_ago=OLD, gated_ago=OLD - 5)
        host.config["instances"]["duo"]["models"] = ["a", "b"]
        check("b fine", UNLOADED)
        check("b failed once", FAILED)
        check("b not failed between", UNLOADED)
        check("b failed", FAILED)
        check("b failed again", FAILED)        # 2 in a row: restarted, b named
        check("after the restart", UNLOADED)
        check("b failed after it", FAILED)
        check("b failed after it again", FAILED)   # escalated, not restarted
        check("b still failed", FAILED)
        check("b still failed again", FAILED)
        check("b loaded", LOADED)
        check("b failed anew", FAILED)
        check("b failed anew again", FAILED)   # it had loaded since: restarted again
    finally:
        server.shutdown()
        server.server_close()
    print("\n".join(said))
    assert [(n, e) for _, n, e in seen] == [(0, 0), (0, 0), (0, 0), (0, 0), (1, 0), (1, 0), (1, 0), (1, 1), (1, 1),
                                           (1, 2), (1, 2), (1, 2), (2, 2)]
    assert "duo: model b failed to load (exit code 1) in 2 checks in a row; restarting rigup-llama@duo.service" in said[4]
    assert "<2>rigup-watchdog: duo: model b still fails to load (exit code 1) after its restart by the watchdog" in said[7]
    assert host.state()["duo"]["last_tps"] > FLOOR


def test_a_router_model_that_reads_failed_but_loads_when_asked_is_not_restarted(tmp_path, monkeypatch, capsys):
    """A model evicted while it loaded reads failed in llama-server's /models as a failed load does
    (seen on the lab's real router, tests/roles/test_watchers.py): before restarting the router the
    watchdog asks that model once; it loads and answers, so nothing is restarted."""
    host = FakeHost(tmp_path, monkeypatch)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    server.daemon_threads, server.models, server.answers_anyway = True, {"a": LOADED, "b": FAILED}, True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        host.serve("duo", url, started_ago=OLD, gated_ago=OLD - 5)
        host.config["instances"]["duo"]["models"] = ["a", "b"]
        logs = [host.check(capsys) for _ in range(3)]
    finally:
        server.shutdown()
        server.server_close()
    said = [ln for log in logs for ln in log.splitlines() if " b " in ln]
    print("\n".join(said))
    assert len(host.calls("restart")) == 0
    assert any("model b read failed, but loads and answers now" in ln for ln in said)


def test_a_routers_pinned_model_is_watched_as_a_server_of_its_own(tmp_path, monkeypatch, capsys):
    """Issue 63: a model a router pins (per_model: {M: {pinned: true}}) runs as rigup-llama@NAME.M at
    port + 2 + i, out of the router's set. The watchdog's config has it as an instance NAME.M of its
    own (the router's set without it), by the instance's floor rules: min_tokens_per_s when set, 0
    off, null half its own gate's tok/s (the router, without a floor of its own, is not watched).
    Below that floor bad_checks times in a row, its unit is restarted, never the router's."""
    url, proc = start_stub(tps=20)
    port = int(url.rsplit(":", 1)[1])
    router = {"model": "a", "also": ["b", "qwen"], "port": port - 2, "per_model": {"qwen": {"pinned": True}},
              "api_key": True}
    found = watched({**DATA, "llama_server_instances": {"x": router}})
    key = "/etc/rigup/llama-server/x.key"
    assert found == {"x.qwen": {"url": url, "port": port, "key": key, "floor": None}}
    floored = watched({**DATA, "llama_server_instances": {"x": {**router, "min_tokens_per_s": 5, "sleep_idle_s": 60}}})
    assert floored == {"x": {"url": f"http://127.0.0.1:{port - 2}", "port": port - 2, "key": key, "floor": 5.0,
                             "sleeps": True, "models": ["a", "b"]},
                       "x.qwen": {"url": url, "port": port, "key": key, "floor": 5.0, "sleeps": True}}
    assert watched({**DATA, "llama_server_instances": {"x": {**router, "min_tokens_per_s": 0}}}) == {}
    units = ["rigup-llama@x.service", "rigup-llama@x.qwen.service"]
    assert [s["unit"] for s in wd.servers("x", floored["x"], units)] == ["rigup-llama@x.service"]
    assert [(s["server"], s["url"]) for s in wd.servers("x.qwen", found["x.qwen"], units)] == [("x.qwen", url)]
    host = FakeHost(tmp_path, monkeypatch)
    try:
        host.serve("x.qwen", url, started_ago=OLD, gated_ago=OLD - 5)   # its unit, its gate's record: 200 tok/s
        host.doc["units"]["rigup-llama@x.service"] = {"active": True, "started": time.time() - OLD}
        host.save()
        host.config["instances"] = {"x.qwen": {**found["x.qwen"], "key": None}}
        log = host.check(capsys) + host.check(capsys)
        print(log)
        assert re.search(r"x\.qwen: [\d.]+ tok/s, below its floor 100 tok/s \(2 of 2 checks in a row\)", log)
        assert host.calls("restart") == ["rigup-llama@x.qwen.service"]
        assert host.state()["x.qwen"]["restarts"] == 1
        assert 'rigup_watchdog_restarts_total{llama_instance="x.qwen"} 1' in Path(host.config["metrics_file"]).read_text()
    finally:
        proc.kill()
        proc.wait()


class Claims(BaseHTTPRequestHandler):
    """A slow server that claims a high rate: it waits ``server.wait`` s, answers
    ``server.tokens`` tokens and ``timings.predicted_per_second`` 9999999."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(self.server.wait)
        reply(self, json.dumps({"choices": [{"message": {"content": "word " * self.server.tokens}}],
                                "usage": {"completion_tokens": self.server.tokens},
                                "timings": {"predicted_per_second": 9999999}}).encode())

    def log_message(self, *a):
        pass


def test_a_claimed_rate_is_judged_by_the_tokens_over_the_clients_clock():
    """Round 1 of issue 61, G09: a server that slept 2 s and gave 0 tokens claimed 9999999 tok/s,
    which the watchdog took as its speed: above any floor, never restarted."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Claims)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    inst, config = {"key": None}, {"max_tokens": 8, "timeout_s": 5}
    try:
        server.wait, server.tokens = 0.5, 0
        assert wd.measure({"url": f"http://127.0.0.1:{server.server_address[1]}"}, inst, config) == {"tps": 0.0}
        server.tokens = 8
        tps = wd.measure({"url": f"http://127.0.0.1:{server.server_address[1]}"}, inst, config)["tps"]
        assert 0 < tps <= 16.1, tps    # 8 tokens over at least 0.5 s
    finally:
        server.shutdown()
        server.server_close()
