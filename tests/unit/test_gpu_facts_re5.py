"""Host facts of the fifth re-round (issue 61): the nvcc run is the one checked (N22); a port's listener
is a unit's own only where root's or the account the unit runs as (N1), and every socket of the port
is looked at (N4)."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given, settings, strategies as st

from rigup.gpu.facts import CUDA_COMMAND, PORTS_COMMAND, parse_cuda_toolkits, parse_listening_ports
from rigup.refusal import Port
from roles.metrics.checks import PACKAGE_USERS
from roles.preflight.checks import port_refusals

CLAIM = Port(8080, "llama_server_instances.g", ("llama-server",))
ACCOUNTS = ["--- users", "rigup:997", "www-data:33", "alice:1000", "prometheus:110"]


def socket(name: str, uid: int = 0, at: str = "127.0.0.1") -> str:
    """ss -Hltnpe's line of ``name``'s socket on ``at``:8080 (no uid column for root's, as ss prints it)."""
    return (f'LISTEN 0 5 {at}:8080 0.0.0.0:* users:(("{name}",pid=4242,fd=3))' + (f" uid:{uid}" if uid else "")
            + " ino:81 sk:1 cgroup:/system.slice <->")


def refused(lines: list[str], claim: Port = CLAIM, user: str | None = "rigup") -> list[str]:
    ports = parse_listening_ports(["ss", *lines, *ACCOUNTS])
    found = [r.line("h") for r in port_refusals([claim], {"listening_ports": ports}, user)]
    print(f"{ports} -> {found}")
    return found


def test_N1_only_roots_or_the_units_own_accounts_listener_is_the_unit():
    """N1: llama-server of uid 33 (www-data; any account below 1000) passed as the instance's own."""
    assert refused([socket("llama-server", 33)]) and "(user www-data)" in refused([socket("llama-server", 33)])[0]
    assert refused([socket("llama-server", 1000)]) and refused([socket("llama-server", 4321)])   # no name: its uid
    assert refused([socket("llama-server")]) == [] and refused([socket("llama-server", 997)]) == []
    assert refused([socket("llama-server", 997)], user=None)   # no rigup user known: root's alone
    # the metrics role's units run as the package's account, and only theirs is
    prometheus = Port(8080, "prometheus_port", ("prometheus",), PACKAGE_USERS)
    assert refused([socket("prometheus", 110)], prometheus) == [] and refused([socket("prometheus", 997)], prometheus)
    # a process name holding a uid column of its own, or a line break before the accounts
    # a second process on the socket named to hold a uid column ("a uid:0 b"): ss's first uid was taken
    shared = socket("llama-server", 1000).replace("fd=3))", 'fd=3),("a uid:0 b",pid=4243,fd=3))')
    assert refused([shared]) and "(uid ?)" in refused([shared])[0]
    forged = parse_listening_ports(["ss", socket("llama-server", 1000), "--- users", "rigup:1000", *ACCOUNTS])
    assert forged[8080] == "llama-server (user alice)"


def test_N4_every_socket_of_the_port_is_looked_at():
    """N4: root's llama-server on 10.0.0.5:8080 hid a login user's python3 on 127.0.0.1:8080."""
    found = refused([socket("llama-server", at="10.0.0.5"), socket("python3", 1000)])
    assert found and "python3 (user alice)" in found[0]
    assert refused([socket("llama-server", 997, "10.0.0.5"), socket("llama-server", 997, "[::]")]) == []
    assert refused([socket("llama-server", at="10.0.0.5"), socket("llama-server", 1000)])
    unnamed = 'LISTEN 0 5 127.0.0.2:8080 0.0.0.0:* users:(("'   # a name ss split with a line break
    assert refused([socket("llama-server"), unnamed])
    assert parse_listening_ports(["proc", "  0: 00000000:1F90 00000000:0000 0A"]) == {8080: None}


def test_the_ports_command_names_each_uids_account(tmp_path):
    """The accounts section is the host's own passwd entries of the uids ss printed."""
    import shutil
    if not shutil.which("ss"):
        return
    out = subprocess.run(["sh", "-c", PORTS_COMMAND], capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert out[0] == "ss" and out.count("--- users") == 1
    print(parse_listening_ports(out))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["llama-server", "python3", "haproxy"]),
                          st.sampled_from([0, 33, 997, 1000, 4321])), min_size=1, max_size=4))
def test_a_port_is_the_units_only_where_every_socket_is_an_owners_of_root_or_its_account(sockets):
    lines = [socket(name, uid, f"10.0.0.{k}") for k, (name, uid) in enumerate(sockets)]
    ports = parse_listening_ports(["ss", *lines, *ACCOUNTS])
    own = all(name == "llama-server" and uid in (0, 997) for name, uid in sockets)
    assert (port_refusals([CLAIM], {"listening_ports": ports}, "rigup") == []) is own

# Flips argv[1] between /usr/bin/true (root's: passes the walk) and argv[2] until killed.
FLIP = """import os, sys
link, evil = sys.argv[1:]
for i in range(10**9):
    tmp = f"{link}.{i % 2}"
    try: os.unlink(tmp)
    except FileNotFoundError: pass
    os.symlink("/usr/bin/true" if i % 2 == 0 else evil, tmp)
    os.replace(tmp, link)
"""


def test_the_nvcc_run_is_the_real_path_checked_not_the_name_read_again(tmp_path):
    """N22: ``$n``, a link in a directory another user writes, flipped between a root-owned program (for
    the check) and the user's script (for the run): the script ran 41 times in 300 gatherings."""
    mark, evil, link = tmp_path / "ran", tmp_path / "evil", tmp_path / "bin" / "nvcc"
    link.parent.mkdir()
    evil.write_text(f"#!/bin/sh\necho ran >> {mark}\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    evil.chmod(0o755)
    flipper = subprocess.Popen([sys.executable, "-c", FLIP, str(link), str(evil)])
    try:
        env = {**os.environ, "PATH": f"{link.parent}:/usr/bin:/bin"}
        # 100 gatherings: the unchecked run took 41 of 300, so it would be missed in 100 with odds
        # of (259/300)**100, about 4e-7 (each gathering forks some 30 programs beside the flipper's core)
        for _ in range(100):
            out = subprocess.run(["sh", "-c", CUDA_COMMAND], capture_output=True, text=True, timeout=60,
                                 env=env).stdout.splitlines()
            assert all(t["path"] != str(evil) for t in parse_cuda_toolkits(out))
    finally:
        flipper.kill()
        flipper.wait()
    runs = mark.read_text().count("ran") if mark.exists() else 0
    print(f"the link's other target ran {runs} times in 100 gatherings")
    assert runs == 0
    # the race is timing's; the text is not: the program run is the path the walk read
    assert '"$r" --version' in CUDA_COMMAND and '"$n" --version' not in CUDA_COMMAND
