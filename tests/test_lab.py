"""The lab of throwaway systemd hosts (tests/lab), on the lab the whole test run shares.

Needs root. Run: .venv/bin/python -m pytest -q -m lab tests/test_lab.py
That no namespace, link, mount or process is left after `down` is checked when the shared lab
is torn down (tests/conftest.py).
"""
import ipaddress
import json
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.lab import lab

pytestmark = pytest.mark.lab
POWER_LIMIT = "nvidia-smi -i 0 --query-gpu=power.limit --format=csv,noheader,nounits"


@pytest.fixture(scope="module")
def host(lab):
    """The first host of the shared lab (tests/conftest.py)."""
    return lab.hosts()[0]["name"]


def on(host, cmd, timeout=120):
    """Run `cmd` on `host`; return its stdout, failing the test if it fails."""
    proc = lab.ssh(host, cmd, timeout=timeout)
    assert proc.returncode == 0, f"{cmd!r} on {host} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout.strip()


def test_state_file_and_list(host):
    state = json.loads(lab.STATE_FILE.read_text())
    assert state["hosts"][0] == {"name": host, "address": lab.address(host), "profile": "a100"}
    assert state["proxy"] == f"http://{state['gateway']}:8888"
    assert lab.hosts() == state["hosts"]
    assert Path(state["known_hosts"]).read_text().startswith(f"{lab.address(host)} ssh-ed25519 ")


def test_ssh_checks_host_key(host):
    assert on(host, "hostname") == host
    assert "StrictHostKeyChecking=yes" in lab.ssh_argv(host)
    unknown = [a.replace(str(lab.KNOWN_HOSTS), "/dev/null") for a in lab.ssh_argv(host)]
    proc = subprocess.run(unknown + ["true"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr


def test_systemd_is_up(host):
    assert on(host, "systemctl is-system-running || true") in ("running", "degraded")
    assert on(host, "cat /etc/rigup-lab/profile") == "a100"


def test_apt_goes_through_proxy(host):
    on(host, "apt-get update", timeout=300)


def test_only_the_lan_is_reachable(host):
    gateway = json.loads(lab.STATE_FILE.read_text())["gateway"]
    connect = "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)'"
    on(host, f"{connect} {gateway} 8888")  # the proxy
    mirror = urlparse(lab.debian_mirror()).hostname
    targets = {socket.getaddrinfo(mirror, 80, socket.AF_INET)[0][4][0]}
    for line in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout.splitlines():
        fields = line.split()  # "2: eth0    inet 192.0.2.2/24 ...": the controller's other addresses
        ip = ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip
        if not ip.is_loopback and ip not in lab.SUBNET:
            targets.add(str(ip))
    for target in targets:
        proc = lab.ssh(host, f"{connect} {target} 80", timeout=30)
        assert proc.returncode != 0 and "unreachable" in proc.stderr, (target, proc)


def test_reboot(host):
    on(host, "touch /run/rigup-lab-test-marker")
    gpu = lab.GPU_SIM.exists()
    if gpu:
        default = float(on(host, POWER_LIMIT))
        on(host, "nvidia-smi -i 0 -pl 300")
        assert float(on(host, POWER_LIMIT)) == 300
    assert lab.reboot(host) in ("running", "degraded")
    assert on(host, "test -e /run/rigup-lab-test-marker || echo fresh") == "fresh"
    if gpu:
        assert float(on(host, POWER_LIMIT)) == default
    else:
        pytest.skip("tests/lab/nvidia_smi.py does not exist yet: power limit not checked")


def test_pyinfra_server_reboot(host):
    """pyinfra's own ``server.reboot`` waits until the host's uptime restarts: each boot of a lab
    host gets a boot clock of its own (tests/lab/lab.py ``boot``), as a real machine's restarts."""
    from tests.converge import pyinfra
    on(host, "touch /run/rigup-lab-test-marker")
    before = float(on(host, "cut -d' ' -f1 /proc/uptime"))
    start = time.monotonic()
    run = pyinfra("inventory/lab.py", "server.reboot", "delay=2", "reboot_timeout=120", "--limit", host, timeout=300)
    after = float(on(host, "cut -d' ' -f1 /proc/uptime"))
    since = time.monotonic() - start   # the reboot and the uptime read after it
    print(f"server.reboot: {run.seconds:.1f} s; uptime {before:.0f} s before, {after:.1f} s after "
          f"({since:.1f} s since the reboot began)")
    assert run.returncode == 0, run.output[-3000:]
    # a fresh /run and an uptime shorter than the reboot took (the host may have booted just
    # before, e.g. by test_reboot when this module runs alone: `before` is no yardstick then)
    assert on(host, "test -e /run/rigup-lab-test-marker || echo fresh") == "fresh"
    assert after < since
