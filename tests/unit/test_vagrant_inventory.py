"""inventory/vagrant.py, loaded by pyinfra itself (``pyinfra inventory/vagrant.py
debug-inventory``, which connects to nothing) with a stand-in ``vagrant`` on PATH that prints
what ``vagrant ssh-config`` prints for the Vagrantfile's two VMs (virtualbox, Vagrant 2.4); the
merged data of a VM plans a CPU-only host that preflight does not refuse."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from rigup.config import ROOT, problems
from rigup.gpu.plan import build_backend, format_plan, hardware_plan
from tests.unit.hosts import NO_DRIVER, refusals

PYINFRA = Path(sys.executable).with_name("pyinfra")

SSH_CONFIG = """Host rigup-vm1
  HostName 127.0.0.1
  User vagrant
  Port 2222
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile {dir}/.vagrant/machines/rigup-vm1/virtualbox/private_key
  IdentitiesOnly yes
  LogLevel FATAL
  PubkeyAcceptedKeyTypes +ssh-rsa
  HostKeyAlgorithms +ssh-rsa

Host rigup-vm2
  HostName 127.0.0.1
  User vagrant
  Port 2200
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile "{dir}/.vagrant/machines/rigup-vm2/virtualbox/private_key"
  IdentitiesOnly yes
  LogLevel FATAL
  PubkeyAcceptedKeyTypes +ssh-rsa
  HostKeyAlgorithms +ssh-rsa

"""
NOT_UP = ("The provider for this Vagrant-managed machine is reporting that it\n"
          "is not yet ready for SSH. Depending on your provider this can carry\n"
          "different meanings. Make sure your machine is created and running and\n"
          "try again.\n")


def _stand_in(tmp_path, monkeypatch, stdout: str, stderr: str = "", rc: int = 0):
    """A ``vagrant`` first on PATH that prints ``stdout`` for ``ssh-config`` and notes its cwd."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = bin_dir / "vagrant"
    script.write_text(f"""#!/bin/sh
[ "$1" = ssh-config ] || {{ echo "stand-in: only ssh-config" >&2; exit 2; }}
pwd > '{tmp_path}/cwd'
cat '{tmp_path}/out'; cat '{tmp_path}/err' >&2
exit {rc}
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _load() -> tuple[dict[str, dict], str]:
    """Each host's merged data as ``pyinfra inventory/vagrant.py debug-inventory`` prints it, and
    the output."""
    done = subprocess.run([str(PYINFRA), "inventory/vagrant.py", "debug-inventory"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr  # pyinfra prints the inventory on stderr
    hosts = re.findall(r"^\[([\w.-]+)\] *\n--> Groups:[^\n]*\n--> Data:\n(\{.*?\n\})$", output, re.M | re.S)
    return {name: json.loads(text) for name, text in hosts}, output


def test_the_vms_get_their_ssh_data_and_a_host_key_file_of_their_own(tmp_path, monkeypatch):
    _stand_in(tmp_path, monkeypatch, SSH_CONFIG.format(dir=tmp_path))
    hosts, _ = _load()
    assert (tmp_path / "cwd").read_text().strip() == str(ROOT)  # the Vagrantfile's directory
    assert sorted(hosts) == ["rigup-vm1", "rigup-vm2"]
    vm2 = hosts["rigup-vm2"]
    machine = tmp_path / ".vagrant/machines/rigup-vm2/virtualbox"
    assert (vm2["ssh_hostname"], vm2["ssh_port"], vm2["ssh_user"]) == ("127.0.0.1", 2200, "vagrant")
    assert vm2["ssh_key"] == str(machine / "private_key")
    # not Vagrant's "StrictHostKeyChecking no" into /dev/null: the VM's own file, checked
    assert vm2["ssh_known_hosts_file"] == str(machine / "known_hosts")
    assert vm2["ssh_strict_host_key_checking"] == "accept-new"
    assert vm2["_sudo"] is True
    print(f"rigup-vm2: {vm2['ssh_user']}@{vm2['ssh_hostname']}:{vm2['ssh_port']}, "
          f"known_hosts {vm2['ssh_known_hosts_file']} ({vm2['ssh_strict_host_key_checking']})")


def test_a_vm_is_planned_cpu_only_and_preflight_refuses_nothing(tmp_path, monkeypatch):
    _stand_in(tmp_path, monkeypatch, SSH_CONFIG.format(dir=tmp_path))
    data = _load()[0]["rigup-vm1"]
    assert problems(data) == []                       # deploy.py's validation of the merged data
    plan = hardware_plan([], NO_DRIVER, [])           # what the facts of a VM without nvidia-smi give
    facts = {"listening_ports": {22: "sshd"}, "systemd": True, "free_disk": {}, "model_bytes": {}}
    print(format_plan(plan))
    assert data["gpu_enabled"] is False and build_backend(plan, data) == "cpu"
    assert refusals(plan, facts, data) == []
    refused = refusals(plan, facts, {**data, "gpu_enabled": True})   # what the VMs got before
    assert [r.check for r in refused] == ["gpu_host"]
    print(f"with gpu_enabled true: {refused[0].line('rigup-vm1')}")


def test_a_vm_that_is_not_up_is_left_out(tmp_path, monkeypatch):
    one = SSH_CONFIG.format(dir=tmp_path).split("\n\n")[0] + "\n\n"
    _stand_in(tmp_path, monkeypatch, one, NOT_UP, rc=1)
    hosts, output = _load()
    assert list(hosts) == ["rigup-vm1"]
    assert "only rigup-vm1 answered" in output


def test_no_vm_up_says_vagrant_up(tmp_path, monkeypatch):
    _stand_in(tmp_path, monkeypatch, "", NOT_UP, rc=1)
    hosts, output = _load()
    assert hosts == {} and "run `vagrant up` first" in output
    print(output.strip().splitlines()[-1])


def test_a_shared_insecure_key_is_refused(tmp_path, monkeypatch):
    config = SSH_CONFIG.format(dir=tmp_path).replace(
        f"{tmp_path}/.vagrant/machines/rigup-vm1/virtualbox/private_key", f"{tmp_path}/.vagrant.d/insecure_private_key")
    _stand_in(tmp_path, monkeypatch, config)
    hosts, output = _load()
    assert hosts == {} and "insert_key" in output
