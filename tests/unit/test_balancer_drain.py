"""roles/balancer/shipped/drain.py (rigup-balancer-drain) against a fake HAProxy: a unix socket server in
the test answering the runtime API's lines the helper sends (show info, show servers state
[BACKEND], show stat, set server B/S state X, disable frontend), and a reload that loads the
server-state file as HAProxy 2.6 does (its srv_admin_state, srv_op_state and srv_port: the port in
the file wins over the config's). Also the config's and the haproxy.service drop-in's lines that
keep the state across reloads."""

import fcntl
import os
import re
import signal
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import assume, given, settings, strategies as st

from rigup.config import role_defaults
from roles.balancer import config
from roles.balancer.shipped import drain

FIELDS = ("be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
          "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
          "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port "
          "srv_check_addr srv_agent_addr srv_agent_port").split()
CFG = """global
    stats socket /run/haproxy/admin.sock mode 660 level admin
    server-state-file /run/haproxy/server-state

defaults
    load-server-state-from-file global

frontend gateway-gemma
    bind 0.0.0.0:8081
    default_backend gateway-gemma

backend gateway-gemma  # the fleet's
    server lab1 10.0.0.11:8081 check
    server lab2 10.0.0.12:{port} check
    server lab3 ipv6@[fd00::13]:8081 check disabled
"""


class FakeHAProxy:
    """The runtime API's state of one HAProxy worker: servers (backend, name) -> their fields."""

    def __init__(self, path: Path, config_text: str):
        self.path, self.pid, self.lock = path, 4_000_000_001, threading.Lock()
        self.heard: list[str] = []
        self.ignore_sets = False      # answers "set server" as done but changes nothing
        self.scur: dict = {}          # (backend, server) -> current sessions
        self.up_after_ready = True    # a readied server's checks pass at once
        self.start(config_text)

    def start(self, config_text: str, state_file: str | None = None) -> None:
        """A (new) worker from ``config_text``, with the state file applied as HAProxy 2.6 does."""
        self.servers = {}
        for (backend, name), port in drain.config_ports(config_text).items():
            self.servers[(backend, name)] = {"srv_op_state": 2, "srv_admin_state": 0, "srv_port": port}
        if state_file and os.path.exists(state_file):
            lines = Path(state_file).read_text().splitlines()
            names = lines[1][1:].split()
            for row in lines[2:]:
                f = dict(zip(names, row.split()))
                srv = self.servers.get((f["be_name"], f["srv_name"]))
                if srv is not None:
                    srv.update(srv_op_state=int(f["srv_op_state"]), srv_admin_state=int(f["srv_admin_state"]),
                               srv_port=f["srv_port"], srv_addr=f["srv_addr"])

    def reload(self, config_text: str, state_file: str | None) -> None:
        with self.lock:
            self.pid += 1
            self.scur = {}   # the old worker's sessions stay with it
            self.start(config_text, state_file)

    def answer(self, line: str) -> str:
        self.heard.append(line)
        words = line.split()
        if line == "show info":
            return f"Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nPid: {self.pid}\nUptime_sec: 10\n\n"
        if words[:3] == ["show", "servers", "state"]:
            rows = [(b, n, s) for (b, n), s in self.servers.items() if len(words) < 4 or b == words[3]]
            if len(words) > 3 and not rows:
                return "Can't find backend.\n\n"
            out = ["1", "# " + " ".join(FIELDS)]
            for k, (b, n, s) in enumerate(rows):
                out.append(f"3 {b} {k + 1} {n} 10.0.0.{k + 11} {s['srv_op_state']} {s['srv_admin_state']} 1 1 5 15 3 3 6 "
                           f"0 0 0 - {s['srv_port']} - 0 0 - - 0")
            return "\n".join(out) + "\n\n"
        if line == "show stat":
            out = ["# pxname,svname,qcur,qmax,scur," + ",".join(f"c{i}" for i in range(5, 20))]
            for (b, n), s in self.servers.items():
                status = ("MAINT" if s["srv_admin_state"] & 1 else "DRAIN" if s["srv_admin_state"] & 8
                          else "UP" if s["srv_op_state"] == 2 else "DOWN")
                cols = [b, n, "0", "0", str(self.scur.get((b, n), 0))] + ["0"] * 12 + [status, "0", "0"]
                out.append(",".join(cols))
            return "\n".join(out) + "\n\n"
        if words[:2] == ["set", "server"] and len(words) == 5:
            backend, _, name = words[2].partition("/")
            srv = self.servers.get((backend, name))
            if srv is None:
                return "No such server.\n\n"
            if not self.ignore_sets:
                flags = srv["srv_admin_state"]
                flags = {"ready": flags & ~9, "drain": (flags & ~1) | 8, "maint": (flags & ~8) | 1}[words[4]]
                srv["srv_admin_state"] = flags
                srv["srv_op_state"] = 0 if flags & 1 else 2 if self.up_after_ready else 0
            return "\n"
        if words[:2] == ["disable", "frontend"]:
            return "\n"
        return "Unknown command.\n\n"


@pytest.fixture
def haproxy(tmp_path, monkeypatch):
    """A fake HAProxy on a unix socket in tmp_path; the helper pointed at it, its config and its
    state file there, its waits short."""
    sock, cfg = tmp_path / "admin.sock", tmp_path / "haproxy.cfg"
    cfg.write_text(CFG.format(port=8081))
    fake = FakeHAProxy(sock, cfg.read_text())

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            line = self.rfile.readline().decode().strip()
            with fake.lock:
                text = fake.answer(line)
            self.wfile.write(text.encode())

    server = socketserver.ThreadingUnixStreamServer(str(sock), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setattr(drain, "SOCKET", str(sock))
    monkeypatch.setattr(drain, "CONFIG", str(cfg))
    monkeypatch.setattr(drain, "STATE", str(tmp_path / "server-state"))
    for name, seconds in (("DRAIN_S", 2), ("UP_S", 1), ("HEALTH_S", 1), ("LOCK_S", 1), ("RELOAD_S", 2)):
        monkeypatch.setattr(drain, name, seconds)
    fake.config, fake.server = cfg, server
    yield fake
    server.shutdown()
    server.server_close()


def flags(fake, server, backend="gateway-gemma"):
    return fake.servers[(backend, server)]["srv_admin_state"]


def test_maint_is_read_back_and_saved(haproxy, capsys):
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    assert flags(haproxy, "lab2") & drain.FMAINT
    assert "set server gateway-gemma/lab2 state drain" in haproxy.heard
    assert "set server gateway-gemma/lab2 state maint" in haproxy.heard
    assert haproxy.heard.count("show servers state gateway-gemma") >= 2   # each change read back
    saved = Path(drain.STATE).read_text().splitlines()
    assert saved[0] == "1" and saved[1].split()[1:] == FIELDS
    rows = {r.split()[3]: r.split() for r in saved[2:]}
    assert set(rows) == {"lab1", "lab2", "lab3"}
    assert rows["lab2"][6] == "1" and rows["lab2"][4] == "-"   # maint; its address left to the config
    said = capsys.readouterr()
    assert said.err == ""
    assert said.out == ("rigup-balancer-drain: gateway-gemma/lab2 is drain (read back from HAProxy)\n"   # roll.py wants these
                        "rigup-balancer-drain: gateway-gemma/lab2 is maint (read back from HAProxy)\n")


def test_drain_and_ready_with_and_without_a_port(haproxy, monkeypatch):
    assert drain.main(["drain", "gateway-gemma", "lab1"]) == 0
    assert flags(haproxy, "lab1") == drain.FDRAIN
    monkeypatch.setattr(drain, "healthy", lambda port, waiting: port == 8081)
    assert drain.main(["ready", "gateway-gemma", "lab1", "8081"]) == 0
    assert flags(haproxy, "lab1") == 0
    assert drain.main(["maint", "gateway-gemma", "lab1"]) == 0
    assert drain.main(["ready", "gateway-gemma", "lab1"]) == 0
    assert flags(haproxy, "lab1") == 0 and haproxy.servers[("gateway-gemma", "lab1")]["srv_op_state"] == 2


def test_a_missing_socket_fails_naming_it(haproxy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    for argv in (["maint", "gateway-gemma", "lab2"], ["drain", "gateway-gemma", "lab2"],
                 ["ready", "gateway-gemma", "lab2"], ["ready", "gateway-gemma", "lab2", "8081"]):
        assert drain.main(argv) == 1
        err = capsys.readouterr().err
        assert f"cannot reach HAProxy's admin socket {tmp_path / 'gone.sock'}" in err and " ".join(argv) in err
    assert drain.main(["release", "llama-gemma"]) == 0   # no HAProxy: nothing holds the port
    assert not any(line.startswith("set ") for line in haproxy.heard)


def test_an_unknown_backend_or_server_fails_naming_it(haproxy, capsys):
    assert drain.main(["maint", "gateway-nope", "lab2"]) == 1
    assert "backend gateway-nope: HAProxy" in capsys.readouterr().err
    assert drain.main(["maint", "gateway-gemma", "lab9"]) == 1
    assert "backend gateway-gemma has no server lab9" in capsys.readouterr().err


def test_a_state_not_as_asked_fails(haproxy, capsys):
    haproxy.ignore_sets = True
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 1
    err = capsys.readouterr().err
    assert "gateway-gemma/lab2: asked drain, HAProxy" in err and "says ready (srv_admin_state 0)" in err
    assert "state maint" not in " ".join(haproxy.heard)   # no maint after a drain not verified


def test_ready_fails_when_the_server_never_comes_up(haproxy, capsys):
    haproxy.up_after_ready = False
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    assert drain.main(["ready", "gateway-gemma", "lab2"]) == 1
    assert "gateway-gemma/lab2: not UP 1 s after ready: DOWN" in capsys.readouterr().err


def test_drain_waits_for_the_running_requests(haproxy):
    haproxy.scur[("gateway-gemma", "lab1")] = 2
    threading.Timer(0.6, lambda: haproxy.scur.update({("gateway-gemma", "lab1"): 0})).start()
    start = time.monotonic()
    assert drain.main(["maint", "gateway-gemma", "lab1"]) == 0
    assert 0.5 < time.monotonic() - start < 1.8


def test_drain_waits_for_the_worker_a_reload_replaced(haproxy, monkeypatch):
    """A reload during the wait: the new worker has the drain (the state file) but not the old
    worker's requests; the helper waits for the old worker to go."""
    old, gone = haproxy.pid, threading.Event()
    monkeypatch.setattr(drain, "alive", lambda pid: pid == old and not gone.is_set())
    haproxy.scur[("gateway-gemma", "lab1")] = 1

    def reload_then_finish():
        assert drain.main(["save-state"]) == 0
        haproxy.reload(haproxy.config.read_text(), drain.STATE)      # its sessions are the old worker's
        time.sleep(0.5)
        gone.set()
    threading.Timer(0.3, reload_then_finish).start()
    start = time.monotonic()
    assert drain.main(["maint", "gateway-gemma", "lab1"]) == 0
    assert time.monotonic() - start > 0.7
    assert haproxy.pid == old + 1 and flags(haproxy, "lab1") & drain.FMAINT


def test_a_reload_keeps_the_state_with_the_configs_port(haproxy, monkeypatch):
    """maint and drain survive a reload (the fake loads the state file as HAProxy does, its port
    winning); a port changed in the config is the one the new worker uses."""
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    assert drain.main(["drain", "gateway-gemma", "lab1"]) == 0
    haproxy.config.write_text(CFG.format(port=9090))
    signals = []

    def kill(pid, sig):
        signals.append((pid, sig))
        haproxy.reload(haproxy.config.read_text(), drain.STATE)
    monkeypatch.setattr(drain.os, "kill", kill)
    assert drain.main(["reload", "1234"]) == 0
    assert signals == [(1234, signal.SIGUSR2)]
    assert flags(haproxy, "lab2") & drain.FMAINT and flags(haproxy, "lab1") == drain.FDRAIN
    assert haproxy.servers[("gateway-gemma", "lab2")]["srv_port"] == "9090"
    assert haproxy.servers[("gateway-gemma", "lab2")]["srv_addr"] == "-"


def test_a_reload_without_the_socket_uses_the_state_last_saved(haproxy, tmp_path, monkeypatch, capsys):
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    monkeypatch.setattr(drain, "RELOAD_S", 0.5)
    monkeypatch.setattr(drain.os, "kill", lambda pid, sig: haproxy.reload(haproxy.config.read_text(), drain.STATE))
    assert drain.main(["reload", "1234"]) == 0
    err = capsys.readouterr().err
    assert "reload with the state last saved (cannot reach HAProxy's admin socket" in err
    assert "restart HAProxy to bring the socket back" in err
    assert flags(haproxy, "lab2") & drain.FMAINT


def test_a_replica_started_while_haproxy_is_away_is_ready_in_the_saved_state(haproxy, tmp_path, monkeypatch, capsys):
    """Its drain (ExecStop) was saved; HAProxy, stopped, would bring it back drained at its start."""
    assert drain.main(["drain", "gateway-gemma", "lab1"]) == 0
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    monkeypatch.setattr(drain, "healthy", lambda port, waiting: True)
    assert drain.main(["ready", "gateway-gemma", "lab1", "8081"]) == 1
    assert "cannot reach HAProxy's admin socket" in capsys.readouterr().err
    haproxy.reload(haproxy.config.read_text(), drain.STATE)   # HAProxy's start
    assert flags(haproxy, "lab1") == 0 and flags(haproxy, "lab2") & drain.FMAINT


def test_save_state_with_nothing_to_save(haproxy, tmp_path, monkeypatch):
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    assert drain.main(["save-state"]) == 0 and not os.path.exists(drain.STATE)


def test_a_change_waits_for_a_reload_holding_the_lock(haproxy, capsys):
    fd = os.open(drain.STATE + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 1
    assert f"{drain.STATE}.lock held for 1 s" in capsys.readouterr().err
    assert flags(haproxy, "lab2") == 0
    threading.Timer(0.3, os.close, [fd]).start()   # the reload's lock released: the change goes on
    start = time.monotonic()
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    assert time.monotonic() - start > 0.2 and flags(haproxy, "lab2") & drain.FMAINT


def test_kept_leaves_address_and_port_to_the_config():
    state = ("1\n# " + " ".join(FIELDS) + "\n"
             "3 gateway-gemma 1 lab1 10.0.0.99 2 8 1 1 5 15 3 3 6 0 0 0 - 7000 - 0 0 - - 0\n"
             "3 gateway-gemma 2 gone 10.0.0.50 2 1 1 1 5 15 3 3 6 0 0 0 - 8081 - 0 0 - - 0\n"
             "3 gateway-gemma 3 lab3 fd00::13 0 5 1 1 5 15 3 3 6 0 0 0 - 8081 - 0 0 - - 0\n"
             "4 llama-old 1 gemma-0 127.0.0.1 2 0 1 1 5 15 3 3 6 0 0 0 - 8082 - 0 0 - - 0\n")
    text = drain.kept(state, CFG.format(port=8081))
    rows = [r.split() for r in text.splitlines()[2:]]
    assert [(r[3], r[4], r[6], r[18]) for r in rows] == [("lab1", "-", "8", "8081"), ("lab3", "-", "5", "8081")]
    assert drain.kept(text, CFG.format(port=8081)) == text
    assert drain.config_ports(CFG.format(port=1)) == {("gateway-gemma", "lab1"): "8081", ("gateway-gemma", "lab2"): "1",
                                                      ("gateway-gemma", "lab3"): "8081"}
    with pytest.raises(drain.Failed, match="not a server state"):
        drain.kept("Can't find backend.\n", CFG)


def test_usage_and_an_unknown_action():
    assert drain.main([]) == 2 and drain.main(["maint", "b"]) == 2 and drain.main(["reload"]) == 2


def test_the_helper_runs_on_the_standard_library_alone(tmp_path):
    """As installed on a bare host: no project module, no site-packages; a missing socket: exit 1."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('d', sys.argv[1]); "
            "d = importlib.util.module_from_spec(spec); spec.loader.exec_module(d); d.SOCKET = sys.argv[2]; "
            "d.STATE = sys.argv[3]; sys.exit(d.main(['maint', 'gateway-gemma', 'lab2']))")
    run = subprocess.run([sys.executable, "-I", "-S", "-c", code, drain.__file__, str(tmp_path / "no.sock"),
                          str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert f"cannot reach HAProxy's admin socket {tmp_path / 'no.sock'}" in run.stderr
    assert Path(drain.__file__).read_text().startswith("#!/usr/bin/python3 -sES\n")


def test_the_config_and_the_unit_keep_the_state():
    assert config.SERVER_STATE == drain.STATE
    text = config.haproxy_cfg([], role_defaults("balancer"))
    assert f"server-state-file {config.SERVER_STATE}\n" in text.split("defaults")[0]
    assert "    load-server-state-from-file global\n" in text.split("defaults")[1]
    dropin = config.state_dropin("/opt/rigup/bin/rigup-balancer-drain").splitlines()
    assert dropin[dropin.index("[Service]"):] == [
        "[Service]", "ExecStartPre=-/opt/rigup/bin/rigup-balancer-drain save-state",
        "ExecStop=-/opt/rigup/bin/rigup-balancer-drain save-state", "ExecReload=",
        "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS",   # Debian's unit's check, then the reload
        "ExecReload=/opt/rigup/bin/rigup-balancer-drain reload $MAINPID"]


@pytest.mark.parametrize("text, count", [("12", 12), ("0", 0), ("\u00b2", None), ("\u0663", None), ("", None),
                                         ("-1", None), ("9" * 18, 10 ** 18 - 1), ("9" * 19, None), ("9" * 5000, None)])
def test_a_haproxy_or_proc_number_is_a_few_ascii_digits(text, count):
    """str.isdigit() took "²" (int() then raised ValueError mid-drain) and "٣" (read as 3); 5000 ASCII
    digits passed and int() raised past Python's 4300 (round 7 D4: a traceback)."""
    print(f"\n{text[:20]!r}: {drain._count(text)}")
    assert drain._count(text) == count


ANSWERS = st.one_of(st.text(max_size=300), st.builds(
    lambda n, digits: f"Pid: {digits}\n1\n# be_name srv_name srv_admin_state\nb s {digits}\nb,s,0,0,{digits}" +
    ",0" * n, st.integers(0, 20), st.text("0123456789\u00b2\u0663-", min_size=0, max_size=6000)))


@settings(max_examples=200, deadline=2000)
@given(ANSWERS)
def test_any_admin_answer_reads_or_fails_never_raises(answer):
    """HAProxy's worker's answer (the haproxy user's process) is outside text: whatever it says, each reader
    gives a bounded number, None, or Failed naming it; no ValueError reaches main (a traceback)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(drain, "admin", lambda command, waiting=None: answer)
        assert drain.worker_pid() is None or 0 <= drain.worker_pid() < 10 ** 18
        assert 0 <= drain.in_flight("b", "s") < 10 ** 18
        for read in (lambda: drain.admin_state("b", "s"), lambda: drain.parse_states(answer)):
            try:
                read()
            except drain.Failed as e:
                assert len(str(e)) < 400


def test_an_answer_drip_fed_fails_within_its_deadline(tmp_path, monkeypatch, capsys):
    """Round 7 D3: a timeout per recv() let a worker answering a byte a second hold ready past UP_S; the
    whole answer has one deadline (ANSWER_S, and the wait's under way), after which the helper fails naming
    the socket."""
    sock, stop = tmp_path / "drip.sock", threading.Event()

    class Drip(socketserver.StreamRequestHandler):
        def handle(self):
            self.rfile.readline()
            while not stop.is_set():
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)

    server = socketserver.ThreadingUnixStreamServer(str(sock), Drip)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setattr(drain, "SOCKET", str(sock))
    try:   # within a wait (ready's UP_S, drain's DRAIN_S): no answer outlasts it, and the wait's time is up
        start = time.monotonic()
        waiting = drain.Waiting()
        assert waiting.wait(lambda: drain.admin("show stat", waiting) == "", 1) is False and waiting.until is None
        assert time.monotonic() - start < 2
        monkeypatch.setattr(drain, "ANSWER_S", 1)
        start = time.monotonic()
        assert drain.main(["ready", "gateway-gemma", "lab2"]) == 1
        spent = time.monotonic() - start
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    print(f"\n{spent:.1f} s: {err}")
    assert spent < 3 and f"HAProxy's admin socket {sock}: no whole answer to 'show' within 1 s" in err


def test_two_servers_never_share_a_lease():
    """Round 3 of issue 61, D1: gateway-gemma/lab2 and gateway/gemma-lab2 (and llama:glm/lab1 and
    llama_glm/lab1) had one timer and one lease file: arming one stopped the other's timer."""
    assert drain.lease_file("gateway-gemma", "lab2") != drain.lease_file("gateway", "gemma-lab2")
    assert drain.lease_unit("llama:glm", "lab1") != drain.lease_unit("llama_glm", "lab1")
    assert drain.lease_unit("gateway-gemma", "lab2") == "rigup-drain-lease-13-gateway-gemma-lab2-lease"


# systemd's unit types: a name ending in one of them is taken as that unit by systemd-run
UNIT_TYPES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path", "slice", "scope")


def systemd_run_units(unit: str) -> tuple[str, str]:
    """The service and timer that ``systemd-run --unit=UNIT --on-active=...`` makes (systemd
    src/run/run.c start_transient_trigger): a name ending in a unit type's suffix has it changed
    to .service and .timer; any other name has them appended."""
    stem, dot, kind = unit.rpartition(".")
    base = stem if dot and kind in UNIT_TYPES else unit
    return base + ".service", base + ".timer"


@pytest.mark.parametrize("suffix", [".timer", ".service", ".socket", ".path", ".target", ".mount"])
def test_a_server_named_like_a_unit_suffix_has_its_own_lease(suffix):
    """Rerun 1 of issue 61, N05/N06: servers lab2 and lab2.timer (lab2.service) gave
    rigup-drain-lease-7-gateway-lab2 and ...-lab2.timer, and systemd-run made both leases one
    ...-lab2.timer/.service: arming one stopped the other's, disarming lab2 stopped lab2.timer's."""
    plain, suffixed = (systemd_run_units(drain.lease_unit("gateway", s)) for s in ("lab2", "lab2" + suffix))
    assert not set(plain) & set(suffixed)
    # arm() and disarm() stop the timer by the name systemd-run gave it
    assert systemd_run_units(drain.lease_unit("gateway", "lab2" + suffix))[1] == \
        drain.lease_unit("gateway", "lab2" + suffix) + ".timer"


NAMES = (st.text(st.sampled_from("ab1-_.:"), min_size=1, max_size=8)
         | st.builds("{}.{}".format, st.text(st.sampled_from("ab1-_.:"), max_size=6), st.sampled_from(UNIT_TYPES))
         | st.text("x-", min_size=100, max_size=100))


@settings(max_examples=200, deadline=1000)
@given(NAMES, NAMES)
def test_a_lease_name_gives_back_its_backend_and_server(backend, server):
    """Injective: the pair is read back from the name alone; a unit name of systemd's characters
    within its 255 (with .timer), which systemd-run takes as it is (no unit type's suffix)."""
    unit = drain.lease_unit(backend, server)
    length, _, rest = unit.removeprefix("rigup-drain-lease-").removesuffix("-lease").partition("-")
    assert (rest[:int(length)], rest[int(length) + 1:]) == (backend, server) and rest[int(length)] == "-"
    assert re.fullmatch(r"[A-Za-z0-9:_.-]+", unit) and len(unit + ".timer") <= 255
    assert systemd_run_units(unit) == (unit + ".service", unit + ".timer")


@settings(max_examples=300, deadline=1000)
@given(NAMES, NAMES, NAMES, NAMES)
def test_two_pairs_never_share_a_systemd_unit(backend, server, backend2, server2):
    """Over pairs of names (unit suffixes among them), two (backend, server) pairs give two
    disjoint sets of the units systemd-run makes, and two lease files."""
    assume((backend, server) != (backend2, server2))
    one, other = drain.lease_unit(backend, server), drain.lease_unit(backend2, server2)
    assert not set(systemd_run_units(one)) & set(systemd_run_units(other))
    assert drain.lease_file(backend, server) != drain.lease_file(backend2, server2)


# ------------------------------------------------------------------ issue 61, round 6: HAProxy's run directory
# /run/haproxy is haproxy:haproxy 2775 (Debian's tmpfiles.d): whatever its group plants there (a link or a FIFO at
# STATE, a listener at the socket's path) is not HAProxy's state or HAProxy.
SECRET = "root:$6$SECRETHASH$abc:19000::::::\n"


def test_a_link_at_the_state_file_is_never_followed(haproxy, tmp_path, monkeypatch, capsys):
    """DR3: HAProxy down (save-state in ExecStartPre/ExecStop), a link at STATE to a root-only file:
    refused naming the link, nothing of the target said; ready's fallback leaves it unread too."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    os.symlink(secret, drain.STATE)
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    code, err = drain.main(["save-state"]), capsys.readouterr().err
    print(code, err)
    assert code == 1 and "SECRETHASH" not in err and "is a symbolic link, which rigup never makes" in err
    drain.ready_in_saved_state("gateway-gemma", "lab2")
    assert secret.read_text() == SECRET and os.path.islink(drain.STATE)


def test_a_fifo_or_another_users_file_at_the_state_file_is_refused_at_once(haproxy, tmp_path, monkeypatch, capsys):
    """DR5: a FIFO at STATE blocked save-state in open() (HAProxy's start hung); a file of another
    user's, or one others may write, is not the state the helper saved."""
    monkeypatch.setattr(drain, "SOCKET", str(tmp_path / "gone.sock"))
    os.mkfifo(drain.STATE)
    start = time.monotonic()
    code, err = drain.main(["save-state"]), capsys.readouterr().err
    print(code, err)
    assert code == 1 and time.monotonic() - start < 5 and "is not the helper's own file" in err
    os.remove(drain.STATE)
    Path(drain.STATE).write_text(SECRET)
    os.chmod(drain.STATE, 0o666)
    code, err = drain.main(["save-state"]), capsys.readouterr().err
    print(code, err)
    assert code == 1 and "SECRETHASH" not in err and "is not the helper's own file" in err
    os.chmod(drain.STATE, 0o644)
    code, err = drain.main(["save-state"]), capsys.readouterr().err   # the helper's own, not a state: its first line
    print(code, err)
    assert code == 1 and "not a server state: 'root:" in err


def test_a_name_is_checked_before_anything_reaches_the_runtime_api(haproxy, capsys):
    """DR1, DR2: BACKEND and SERVER went unchecked into the runtime API, where ';' separates commands."""
    for argv in (["release", "gateway-gemma; shutdown sessions server gateway-gemma/lab2"],
                 ["ready", "gateway-gemma", "lab2 state ready;disable frontend gateway-gemma"],
                 ["drain", "gateway-gemma;x", "lab2"], ["maint", "gateway-gemma", "lab 2", "60"],
                 ["ready", "gateway-gemma", "lab2\n", "8081"], ["expire", "gateway-gemma", "../lab2"]):
        haproxy.heard.clear()
        code, err = drain.main(argv), capsys.readouterr().err
        print(argv, code, err.strip(), haproxy.heard)
        assert code == 1 and "not a backend or server name" in err and haproxy.heard == []


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=120))
def test_any_name_out_of_name_is_refused(name):
    assume(not drain.NAME.fullmatch(name))
    with pytest.raises(drain.Failed, match="not a backend or server name"):
        drain.run(["release", name], drain.Waiting())
    with pytest.raises(drain.Failed, match="not a backend or server name"):
        drain.run(["drain", "gateway-gemma", name], drain.Waiting())


def _listen_as_nobody(path: Path, answer: str) -> subprocess.Popen:
    """A listener at ``path`` bound by root, listening as nobody (SO_PEERCRED's uid is the listener's)."""
    code = ("import os, socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.setuid(65534); "
            "s.listen(4); print('up', flush=True)\nwhile True:\n c, _ = s.accept()\n try:\n  c.recv(4096); "
            "c.sendall(sys.argv[2].encode())\n except OSError:\n  pass\n c.close()")   # a client that hung up ends no listener
    child = subprocess.Popen([sys.executable, "-c", code, str(path), answer], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "up\n"
    return child


@pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another user's needs root to make")
def test_a_listener_at_the_socket_path_that_is_not_roots_is_not_haproxy(tmp_path, monkeypatch, capsys):
    """DR6: whatever listened at /run/haproxy/admin.sock was believed (its Pid, its states)."""
    sock = tmp_path / "admin.sock"
    child = _listen_as_nobody(sock, "Pid: 1\n")
    try:
        monkeypatch.setattr(drain, "SOCKET", str(sock))
        print(drain.worker_pid(), drain.reachable())
        assert drain.worker_pid() is None and not drain.reachable()
        with pytest.raises(drain.Failed, match=r"not a socket of root's|its listener is not root's HAProxy \(uid 65534"):
            drain.admin("show info")
    finally:
        child.kill()
        child.wait()


def test_a_link_at_the_socket_path_to_a_root_listener_is_not_followed(tmp_path, monkeypatch):
    """Re-round 6 ND2: haproxy's group may plant a link at admin.sock to any root listener, whose peer
    credentials are root's: the path's own inode is checked and connected, never the link's target."""
    import socket as sk
    target = tmp_path / "roots.sock"
    with sk.socket(sk.AF_UNIX) as root_listener:
        root_listener.bind(str(target))
        root_listener.listen()
        link = tmp_path / "admin.sock"
        link.symlink_to(target)
        monkeypatch.setattr(drain, "SOCKET", str(link))
        with pytest.raises(drain.Failed) as e:
            drain.admin("show info")
        print(e.value)
        assert "not a socket of root's" in str(e.value)


@pytest.mark.parametrize("addr", ["10.0.0.2[x", "127.0.0.1@evil\x1b[2J", "evil\x1bc\x07", "-", ""])
def test_expire_on_an_address_that_is_no_ip_address_keeps_the_lease(haproxy, tmp_path, monkeypatch, capsys, addr):
    """DR10, DR11: a srv_addr urllib refuses ended the lease's unit in a traceback (not armed again: the
    server stayed out). Now: no answer, said escaped, armed again."""
    monkeypatch.setattr(drain, "LEASES", str(tmp_path / "leases"))
    os.makedirs(drain.LEASES)
    Path(drain.lease_file("gateway-gemma", "lab2")).write_text("{}")
    assert drain.main(["maint", "gateway-gemma", "lab2"]) == 0
    capsys.readouterr()
    real = drain.server_state
    monkeypatch.setattr(drain, "server_state", lambda b, s: {**real(b, s), "srv_addr": addr})
    armed = []
    monkeypatch.setattr(drain, "arm", lambda *a: armed.append(a))
    code, err = drain.main(["expire", "gateway-gemma", "lab2"]), capsys.readouterr().err
    print(code, err, armed)
    assert code == 0 and "\x1b" not in err and "not an IP address and port" in err
    assert armed and armed[0][:3] == ("gateway-gemma", "lab2", drain.RECHECK_S) and flags(haproxy, "lab2") & drain.FMAINT


def test_the_helper_opens_nothing_in_haproxys_directory_by_path():
    """DR3's class, by the syntax tree: a plain open() follows a link and waits on a FIFO, so the
    helper opens by path only root's own files (CONFIG in /etc/haproxy, /proc); STATE and STATE.lock
    (in /run/haproxy, haproxy's group's to write) through os.open with O_NOFOLLOW (read_state, locked)."""
    import ast
    tree = ast.parse(Path(drain.__file__).read_text())
    plain = sorted({ast.unparse(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name) and n.func.id == "open" and n.args})
    print(plain)
    assert all(a == "CONFIG" or a.startswith("'/proc/") for a in plain), plain
    # replace()'s own (O_EXCL|O_NOFOLLOW) is test_host_programs'
    others = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name != "replace"] + \
        [c for c in tree.body if isinstance(c, ast.ClassDef)]
    nofollow = [n for f in others for n in ast.walk(f) if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.open"]
    assert len(nofollow) >= 2 and all("O_NOFOLLOW" in ast.unparse(n.args[1]) for n in nofollow)
