"""Inventory for the VMs of the project's Vagrantfile, read from ``vagrant ssh-config``.

    vagrant up
    pyinfra inventory/vagrant.py deploy.py --dry      # then without --dry; --limit rigup-vm1

The VMs have no GPU: they are in the group ``vagrant`` (group_vars/vagrant.yml: gpu_enabled
false), so preflight plans a CPU-only host (no GPU refusal), llama.cpp builds for the CPU and
the GPU roles skip.

Host keys: ``vagrant ssh-config`` says ``StrictHostKeyChecking no`` and ``UserKnownHostsFile
/dev/null`` (Vagrant's own choice); rigup does not follow it. Each VM gets its own known_hosts
file in its machine directory (``.vagrant/machines/<vm>/<provider>/``, next to the private key
Vagrant made for it), with ``accept-new``: the first connection records the VM's key, a later
changed key is refused. ``vagrant destroy`` empties that directory, so a VM made again by
``vagrant up`` starts a new file instead of being refused as an impostor on the same
``127.0.0.1:2222``.
"""

import subprocess as _subprocess
import sys as _sys
from pathlib import Path as _Path

from pyinfra.api.exceptions import InventoryError as _InventoryError

from rigup.boundary.numbers import whole as _whole
from rigup.config import all_group as _all_group

_ROOT = _Path(__file__).resolve().parents[1]
_BLANK = " \t\r\n\f\v"   # ASCII's blanks alone: str.strip() takes U+0085 ('2222\x85' was a port)


def _ssh_configs(text: str) -> list[dict[str, str]]:
    """The ``Host`` blocks of ``ssh-config`` output, each as {option: value} (``Host`` included)."""
    blocks: list[dict[str, str]] = []
    for line in text.split("\n"):   # not splitlines(): it ends a line at U+0085 and U+2028 too
        key, _, value = line.strip(_BLANK).partition(" ")
        if key == "Host":
            blocks.append({"Host": value.strip(_BLANK)})
        elif key and blocks:
            blocks[-1][key] = value.strip(_BLANK).strip('"')
    return blocks


def _known_hosts(identity_file: str, vm: str) -> str:
    """The VM's own known_hosts file: in the machine directory that holds its private key."""
    machine_dir = _Path(identity_file).parent
    if machine_dir.parent.name != vm or machine_dir.parent.parent.name != "machines":
        raise _InventoryError(f"{vm}: its key {identity_file} is not in .vagrant/machines/{vm}/<provider>/ "
                              "(config.ssh.insert_key false?): keep Vagrant's per-VM key, whose directory "
                              "holds the VM's known_hosts")
    return str(machine_dir / "known_hosts")


def _host(block: dict[str, str]) -> tuple[str, dict]:
    """(name, pyinfra SSH data) of one VM."""
    vm = block["Host"]
    port = _whole(block.get("Port", "22"), 65535)
    if not port:  # the boundary's number rule: ASCII digits, 1..65535 ('٢٢٢٢' and '2_222' were 2222)
        raise _InventoryError(f"{vm}: vagrant ssh-config's Port {block.get('Port')!r} is no port (1..65535)")
    return vm, {
        "ssh_hostname": block["HostName"],
        "ssh_port": port,
        "ssh_user": block.get("User", "vagrant"),
        "ssh_key": block["IdentityFile"],
        "ssh_known_hosts_file": _known_hosts(block["IdentityFile"], vm),
        "ssh_strict_host_key_checking": "accept-new",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
    }


def _vms() -> list[tuple[str, dict]]:
    """The running VMs of the Vagrantfile (``vagrant ssh-config`` in the project's directory)."""
    try:
        done = _subprocess.run(["vagrant", "ssh-config"], cwd=_ROOT, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise _InventoryError("vagrant is not installed (https://developer.hashicorp.com/vagrant)") from None
    hosts = [_host(block) for block in _ssh_configs(done.stdout)]
    if not hosts:
        raise _InventoryError(f"no running VM: run `vagrant up` first (vagrant ssh-config: {done.stderr.strip()})")
    if done.returncode != 0:  # some VMs are not up: the others are the inventory
        print(f"inventory/vagrant.py: only {', '.join(h[0] for h in hosts)} answered: {done.stderr.strip()}",
              file=_sys.stderr)
    return hosts


vagrant = (_vms(), {"_sudo": True})

all = _all_group(globals())
