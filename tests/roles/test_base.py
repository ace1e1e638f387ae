"""roles/base in the Molecule lifecycle on the lab: converge, converge again, verify."""

import pytest

from tests.conftest import on_host
from tests.converge import pyinfra

pytestmark = pytest.mark.lab


def test_packages_user_and_directories(lab, second_converge):
    for h in lab.hosts():
        name = h["name"]
        on_host(lab, name, "dpkg -s jq git tmux python3-venv >/dev/null")
        assert on_host(lab, name, "getent passwd rigup").strip().endswith(":/usr/sbin/nologin")
        assert on_host(lab, name, "stat -c '%U %a' /opt/rigup").split() == ["root", "755"]
        assert on_host(lab, name, "stat -c '%U %G %a' /var/lib/rigup").split() == ["root", "rigup", "750"]
        assert "DPkg::Lock::Timeout" in on_host(lab, name, "cat /etc/apt/apt.conf.d/80rigup")


def test_journal_is_persistent(lab, second_converge):
    for h in lab.hosts():
        files = on_host(lab, h["name"], "journalctl --header | grep 'File path'")
        assert "/var/log/journal/" in files


def test_bad_data_stops_the_run_before_any_change(lab, second_converge):
    name = lab.hosts()[0]["name"]
    before = on_host(lab, name, "stat -c %Y /etc/apt/apt.conf.d/80rigup")
    run = pyinfra("inventory/lab.py", "deploy.py", "--data", "apt_lock_timeout=forever")
    assert run.returncode != 0
    assert "--data: apt_lock_timeout: expected int 0..3600, got 'forever'" in run.output
    assert "Starting operation" not in run.output
    assert on_host(lab, name, "stat -c %Y /etc/apt/apt.conf.d/80rigup") == before
