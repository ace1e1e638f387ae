"""roles/cmpunlocker: unlock CMP 170HX memory with cmpunlocker's patched open NVIDIA modules.

What it does to a host with ``cmpunlocker_enabled: true`` (preflight first refuses Secure Boot
on, missing kernel headers, a driver not in ``cmpunlocker_supported_drivers`` and any card that
is not a CMP 170HX by PCI id: checks 11-14; this role refuses a source that is not pinned):
- fetches cmpunlocker from ``cmpunlocker_source`` at the full commit ``cmpunlocker_version``
  (checked after checkout), or uploads ``cmpunlocker_archive`` and checks its sha256 on the host,
  into ``cmpunlocker_dir/src-<id>``;
- backs up what the installer changes (/etc/default/grub, /etc/modprobe.d) once, then runs
  ``install.sh --profile=8gb|10gb [--no-iommu] [--no-gen2-service]`` as the transient unit
  rigup-cmpunlocker-install (it outlives SSH); on failure it puts back what the run may have
  changed as it was before (the modules under updates/cmpunlocker, /etc/default/grub,
  /etc/modprobe.d: a failed upgrade keeps the working unlock, a failed first install the stock
  modules) and shows the installer's last lines;
- installs the kernel post-install hook /etc/kernel/postinst.d/zz-rigup-cmpunlocker (rebuilds
  the modules for a new kernel: DKMS is gone);
- writes its state marker ``rigup_state_dir/cmpunlocker.json`` and reports "cold power-off
  required": it never power-cycles a host;
- on a later converge, once the cards are unlocked, verifies memory.total (65536 MiB for
  10de:20c2, 40960 MiB for 10de:2082), the loaded module's path (``cmpunlocker_module_probe``:
  cmpunlocker's, not a stock or DKMS one) and the PCIe link (Gen2 with the Gen2 service);
- while the cards still report their locked memory, preflight's plan says so (:func:`plan_lines`):
  the VRAM checks count the unlocked size, and serving (roles/vllm, roles/llama_server) waits
  until the cards report it (rigup.gpu.plan.unlock_wait);
- ``cmpunlocker_rollback: true`` restores the stock modules (and the backup), marker
  "rolled-back"; a cold power-off returns the cards to stock, which the next converge records.
Each step is decided by roles/cmpunlocker/steps.py from the marker and the cards.

Variables (roles/cmpunlocker/defaults.yml): cmpunlocker_enabled, cmpunlocker_profile,
cmpunlocker_supported_drivers, cmpunlocker_source, cmpunlocker_version, cmpunlocker_archive,
cmpunlocker_archive_sha256, cmpunlocker_iommu, cmpunlocker_gen2_service, cmpunlocker_dir,
cmpunlocker_rollback, cmpunlocker_install_timeout, cmpunlocker_module_probe; rigup_state_dir.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import OperationError, deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.operations import files

from rigup.gpu.plan import Plan, unlock_wait
from rigup.state import read_once
from rigup.templates import render
from rigup.config import Config, role_defaults
from roles.cmpunlocker.facts import CmpUnlockerState
from roles.cmpunlocker.checks import CHECKS
from roles.cmpunlocker.steps import installer_args, next_step, source_id
from rigup.text import say, shown

__all__ = ["apply", "CHECKS", "plan_lines"]

INSTALL_UNIT = "rigup-cmpunlocker-install"
HOOK = "/etc/kernel/postinst.d/zz-rigup-cmpunlocker"
CHANGED_BY_INSTALLER = ("/etc/default/grub", "/etc/modprobe.d")


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Preflight's line while an enabled unlock has not taken yet: what the VRAM checks count, and
    that serving waits for it."""
    why = unlock_wait(plan, data)
    if not why:
        return []
    want = sorted({c["vram_unlocked_mib"] for c in plan["cards"] if c["locked"]})
    return [f"cmpunlocker: the VRAM checks count {' / '.join(map(str, want))} MiB per card (unlocked); {why}"]


def stamp_path(data: Config) -> str:
    return f"{data['rigup_state_dir']}/cmpunlocker.json"


def src_dir(data: Config) -> str:
    ident = source_id(data).replace("sha256:", "")[:40]
    return f"{data['cmpunlocker_dir']}/src-{ident}"


def _write_stamp(path: str, stamp: dict) -> str:
    q = shlex.quote
    text, tmp = q(json.dumps(stamp, sort_keys=True)), q(path + ".tmp")
    return f"mkdir -p {q(path.rsplit('/', 1)[0])} && printf '%s\\n' {text} > {tmp} && mv {tmp} {q(path)}"


def rollback_commands(data: Config) -> str:
    backup = f"{data['cmpunlocker_dir']}/backup"
    return render("cmpunlocker-rollback.sh.j2", backup=backup, hook=HOOK)


@operation()
def unlock_step(data: Config):
    """The next step of the unlock (steps.py): install, verify, roll back, or nothing."""
    state = read_once(CmpUnlockerState, stamp=stamp_path(data), probe=data["cmpunlocker_module_probe"])
    step, why = next_step(state, data)
    stamp = stamp_path(data)
    base = {"source": source_id(data), "args": installer_args(data), "boot_id": state["boot_id"],
            "profile": data["cmpunlocker_profile"]}
    # why names root's stamp (its source) and the module probe's line: host text, escaped
    if step in ("nothing", "pending", "rollback-pending"):
        host.noop(shown(why, 4000))
        return
    if step == "verify-failed":
        raise OperationError(shown(f"cmpunlocker on {host.name}: the unlock did not verify: {why}", 4000))
    if step == "verified-now":
        yield _write_stamp(stamp, {**(state["stamp"] or {}), "state": "verified"})
        return
    if step == "stock-now":
        yield _write_stamp(stamp, {**(state["stamp"] or {}), "state": "stock", "boot_id": state["boot_id"]})
        return
    if step == "rollback":
        yield rollback_commands(data)
        yield _write_stamp(stamp, {**(state["stamp"] or {}), "state": "rolled-back", "boot_id": state["boot_id"]})
        return
    # install
    d, src = data["cmpunlocker_dir"], src_dir(data)
    archive = None
    if data["cmpunlocker_archive"]:
        archive = f"{d}/cmpunlocker-{data['cmpunlocker_archive_sha256'][:16]}.tar.gz"
        yield from files.put._inner(src=data["cmpunlocker_archive"], dest=archive)
    yield render("cmpunlocker-install.sh.j2", dir=d, src=src, archive=archive,
                 sha256=data["cmpunlocker_archive_sha256"], source=data["cmpunlocker_source"],
                 commit=data["cmpunlocker_version"], args=installer_args(data), unit=INSTALL_UNIT,
                 systemd=state["systemd"], backup=f"{d}/backup", backed_up=CHANGED_BY_INSTALLER,
                 timeout=data["cmpunlocker_install_timeout"])
    hook = render("cmpunlocker-postinst.sh.j2", src=src, args=installer_args(data), log=f"{d}/postinst.log")
    yield f"printf '%s' {shlex.quote(hook)} > {HOOK} && chmod 755 {HOOK}"
    yield _write_stamp(stamp, {**base, "state": "installed"})
    yield "echo 'cmpunlocker installed: cold power-off required (shutdown -h now, then power on)'"


@deploy("cmpunlocker", data_defaults=role_defaults("cmpunlocker"))
def apply(plan: Plan, data: Config):
    if not data["cmpunlocker_enabled"] and not data["cmpunlocker_rollback"]:
        return
    state = read_once(CmpUnlockerState, stamp=stamp_path(data), probe=data["cmpunlocker_module_probe"])
    step, why = next_step(state, data)
    if step == "install":
        why += "; then a cold power-off is required (rigup never power-cycles)"
    say(f"    [{host.name}] cmpunlocker: {why}")
    unlock_step(name=f"cmpunlocker: {step if step != 'nothing' else 'check'}", data=data,
                _timeout=data["cmpunlocker_install_timeout"] + 300)


ROLE = Role("cmpunlocker", apply, checks=CHECKS, plan_lines=plan_lines)
