"""roles/gpu_power: per-card power limits that survive reboots, applied by UUID and verified live.

What it does to a host with GPUs (nothing on a CPU-only host, with gpu_enabled false, or on a
host without systemd, where preflight refuses a cap):
- writes ``/etc/rigup/gpu-power.conf``: one line per card, by UUID (never by index, which
  reorders between boots): its watts (``gpu_power_overrides`` by UUID or PCI bus id, else its
  share of ``gpu_psu_watts``, the power supply's budget for the cards, within its range and at most
  ``gpu_power_watts``, else ``gpu_power_watts``; ``-`` leaves the card's limit alone), its clock lock (``gpu_power_clocks``
  by card class) and persistence mode (``gpu_power_persistence``);
- installs ``rigup_prefix/bin/rigup-gpu-power``, which applies that file card by card with
  ``nvidia-smi -i <UUID>`` (never a bare ``-pl``), only where a card differs, reads each value
  back and fails on a mismatch; a cap or clock lock it set that the policy no longer has goes
  back to the card's default (``power.default_limit``, ``-rgc``): no stale pin until reboot;
  and ``rigup-gpu-power.service`` (oneshot, After=nvidia-persistenced, before
  multi-user.target; serving units order After= it), enabled, which runs it at every boot, plus a udev rule that runs it again when the nvidia module is reloaded;
- when a card differs from the policy, restarts that unit (so converge and boot share one path);
  when every card matches, changes nothing.
Every value is checked against each card's own power.min_limit..max_limit before any change
(preflight refuses it first, checks 1 and 2; the operation checks again on the live cards).
Preflight prints the same plan (:func:`plan_lines`: every card, its limits and what would change,
when anything would; else one line), so ``preflight.py`` (or ``deploy.py --dry``) shows it and
changes nothing.

Variables (roles/gpu_power/defaults.yml): gpu_power_watts, gpu_psu_watts, gpu_power_overrides,
gpu_power_persistence, gpu_power_clocks; gpu_enabled (roles/preflight), rigup_prefix (roles/base).
"""

from __future__ import annotations

from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import systemd

from rigup import files, services
from rigup.config import Config, role_defaults
from rigup.gpu.plan import Plan, gpu_host
from rigup.templates import render
from roles.gpu_power.checks import CHECKS
from roles.gpu_power.facts import APPLIED, CONF, UNIT, GpuPowerState
from roles.gpu_power.policy import format_plan
from roles.gpu_power.power import limits_applied, plan_for, power_state

__all__ = ["apply", "CHECKS", "plan_reads", "plan_lines"]

UDEV_RULE = "/etc/udev/rules.d/71-rigup-gpu-power.rules"


def applies(plan: Plan, data) -> bool:
    """GPUs, and systemd to keep the policy at boot (preflight refuses a cap without systemd)."""
    return gpu_host(plan, data) and plan.get("systemd", True)


def plan_reads(data: Config) -> list:
    """The boot configuration and what its script applied (GpuPowerState), for :func:`plan_lines`
    and :func:`apply`, in preflight's round trip; nothing with gpu_enabled false."""
    return [(GpuPowerState, {})] if data["gpu_enabled"] else []


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Preflight's power lines: when the policy would change anything (or refuses), each card, its
    limits and what would change; else one line. Reads only (the cards are preflight's read)."""
    if not applies(plan, data):
        return []
    power = plan_for(power_state(), data)
    if power["problems"] or any(r["change"] for r in power["cards"]) or power["lost"]:
        return [f"power: {line}" for line in format_plan(power).splitlines()]
    return [f"power: {len(power['cards'])} card(s) at the policy's limits, clocks and persistence: no change"]


@deploy("gpu_power", data_defaults=role_defaults("gpu_power"))
def apply(plan: Plan, data: Config):
    if not applies(plan, data):
        return
    script, unit_path = f"{data['rigup_prefix']}/bin/rigup-gpu-power", f"/etc/systemd/system/{UNIT}"
    paths = [script, unit_path, UDEV_RULE]
    files.managed(name="gpu_power: the boot script", dest=script, paths=paths, mode="755",
                  text=render("gpu_power-apply.sh.j2", conf=CONF, stamp=APPLIED))
    unit = files.managed(name=f"gpu_power: {UNIT}", dest=unit_path, paths=paths,
                         text=render("gpu_power-unit.service.j2", script=script, conf=CONF, stamp=APPLIED))
    files.managed(name="gpu_power: apply again when the nvidia module reloads", dest=UDEV_RULE, paths=paths,
                  text=render("gpu_power-udev.rules.j2", unit=UNIT))
    systemd.daemon_reload(name="gpu_power: systemd daemon-reload", _if=unit.did_change)
    limits_applied(name="GPU power limits by UUID (set what differs, read back)", data=data, script=script)
    services.running(name=f"gpu_power: enable {UNIT}", unit=UNIT, units=[UNIT])


ROLE = Role("gpu_power", apply, checks=CHECKS, plan_reads=plan_reads, plan_lines=plan_lines)
