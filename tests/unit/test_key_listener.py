"""A key goes only to a listener whose user may read it already (issue 61, round 5 C1's class in the
host programs): the watchdog and the metrics relay read the kernel's tables (/proc/net/tcp, tcp6) for
the uid of every socket listening on the instance's port; a process of another user (the unit down,
its port taken) is sent no key. Run as root: a listener of the user nobody stands in for that user."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
from pathlib import Path

import pytest

from roles.metrics.shipped import relay
from roles.watchdog.shipped import watchdog
from tests.unit.world import remade

# made again here: a module before may have remade shipped/throughput.py (its opener's socket, after a gevent
# patch), and each binds throughput's listener_may_read where it loads (tests/unit/world.py)
_relay = remade(relay)
_watchdog = remade(watchdog)

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another user needs root to start")

LISTEN = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
         "print(s.getsockname()[1], flush=True); time.sleep(60)"


def nobodys_listener() -> tuple[subprocess.Popen, int]:
    """A process of the user nobody listening on 127.0.0.1 (its port)."""
    proc = subprocess.Popen(["/usr/bin/python3", "-c", LISTEN], stdout=subprocess.PIPE, text=True,
                            user=NOBODY, group=NOBODY)
    return proc, int(proc.stdout.readline())


def test_the_relay_and_the_watchdog_use_the_one_function():
    """One key rule: shipped/throughput.py's, which roles/metrics and roles/watchdog install beside their
    scripts (the relay had a copy of its own, held equal here before)."""
    from shipped import throughput
    assert relay.listener_may_read is throughput.listener_may_read is watchdog.listener_may_read
    assert not [n for n in ast.parse((ROOT / "roles/metrics/shipped/relay.py").read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == "listener_may_read"]


@pytest.mark.parametrize("program, source", [("rigup-metrics-relay", "roles/metrics/shipped/relay.py"),
                                             ("rigup-watchdog", "roles/watchdog/shipped/watchdog.py")])
def test_the_relay_and_watchdog_on_a_host_import_the_file_installed_beside_it_only(tmp_path, program, source):
    """As roles/metrics and roles/watchdog install them (RIGUP_PREFIX/bin: the program and
    rigup_throughput.py), run as their units run them (python3 -s -E -S) and plainly: with the file
    beside it the program starts and reads its configuration (absent here); without it, it does not
    start, naming the file, even where a ``shipped`` package with a throughput module is on sys.path
    (round 7's R3: the fallback imported whatever site directory had one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / program
    script.write_text((ROOT / source).read_text())
    decoy = tmp_path / "site" / "shipped"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "throughput.py").write_text(f"open({str(tmp_path / 'decoy-ran')!r}, 'w').close()\n")
    (tmp_path / "site" / "rigup_throughput.py").write_text(f"open({str(tmp_path / 'decoy-ran')!r}, 'w').close()\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site")}

    def start(*flags) -> str:
        return subprocess.run(["/usr/bin/python3", *flags, str(script), "--config", str(tmp_path / "none.json"), "check"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                              env=env).stdout
    alone = [start(), start("-s", "-E", "-S")]
    (bin_dir / "rigup_throughput.py").write_text((ROOT / "shipped/throughput.py").read_text())
    beside = [start(), start("-s", "-E", "-S")]
    print(f"alone: {[a.strip().splitlines()[-1] for a in alone]}; beside: {[b.strip().splitlines()[-1] for b in beside]}")
    assert all(a.strip() == f"{program}: rigup_throughput.py is not beside it "
               f"(roles/{source.split('/')[1]} installs the two): not {'started' if 'relay' in program else 'run'}" for a in alone)
    assert all("ImportError" not in b and "not beside it" not in b and ("FileNotFoundError" in b or "no configuration" in b)
               for b in beside)
    assert not (tmp_path / "decoy-ran").exists()


@pytest.mark.parametrize("mode, group, sent", [
    (0o600, 0, False),        # root's key: nobody's listener gets nothing (round 5 C1)
    (0o640, 0, False),        # root's group: nobody is not in it
    (0o640, NOBODY, True),    # nobody's group may read it (as the service user's group reads a key: root:rigup 0640)
    (0o644, 0, True),         # anyone may read it already
])
def test_a_key_goes_only_to_a_listener_whose_user_may_read_it(tmp_path, mode, group, sent):
    key = tmp_path / "k.key"
    key.write_text("SECRET-KEY\n")
    os.chown(key, 0, group)
    key.chmod(mode)
    proc, port = nobodys_listener()
    try:
        url = f"http://127.0.0.1:{port}"
        got = watchdog.listener_may_read(url, str(key))
        request = relay.keyed({"url": url, "key": str(key)}, "/metrics")
        print(f"key {oct(mode)} root:{group}, listener of uid {NOBODY}: may read {got}; the relay's request "
              f"carries {request.unredirected_hdrs}")
        assert got is sent and bool(request.unredirected_hdrs) is sent
        assert (watchdog._key({"key": str(key)}, {"url": url, "server": "x"}) == "SECRET-KEY") is sent
    finally:
        proc.kill()
        proc.wait()


def test_roots_own_listener_gets_the_key_and_no_listener_none(tmp_path):
    key = tmp_path / "k.key"
    key.write_text("K\n")
    key.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert watchdog.listener_may_read(f"http://127.0.0.1:{port}", str(key)) is False   # bound, not listening
        s.listen()
        assert watchdog.listener_may_read(f"http://127.0.0.1:{port}", str(key)) is True
        assert watchdog.listener_may_read(f"http://127.0.0.1:{port}", str(tmp_path / "none")) is False


def test_throughputs_sweep_sends_no_key_to_another_users_listener(tmp_path, capsys):
    """bench.py's and tune.py's runs (shipped/throughput.py sweep --key-file): a port held by a process of
    a user who may not read the key file ends the sweep before any request (it sent the key to it)."""
    import json

    from shipped import throughput
    key = tmp_path / "k.key"
    key.write_text("SECRET-KEY\n")
    key.chmod(0o600)
    proc, port = nobodys_listener()
    try:
        code = throughput.main(["sweep", f"http://127.0.0.1:{port}", "--levels", "1", "--key-file", str(key)])
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads(capsys.readouterr().out)
    print(code, doc["error"])
    assert code == 1 and "levels" not in doc and "the key is not sent to it" in doc["error"]


def test_the_relay_and_the_watchdog_carry_one_import_of_the_key_rule():
    """The two programs' import of rigup_throughput.py (each ships alone: its own copy) are one,
    but for the role and the program's name."""
    def block(source: str, role: str, program: str) -> str:
        text = (ROOT / source).read_text()
        start = text.index("# The measuring and the key rule")
        return (text[start:text.index("raise SystemExit(2)", start)].replace(program, "PROGRAM")
                .replace(source.rsplit("/", 1)[1], "FILE").replace(role, "ROLE"))
    relay = block("roles/metrics/shipped/relay.py", "metrics", "rigup-metrics-relay").replace("not started", "not run")
    assert relay == block("roles/watchdog/shipped/watchdog.py", "watchdog", "rigup-watchdog")
