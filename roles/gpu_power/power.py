"""The operation that brings a host's cards to its power policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError
from rigup.probe import operation
from pyinfra.operations import files

from rigup.state import read_once, reading
from rigup.gpu.catalogue import card_for
from rigup.gpu.facts import NvidiaGpus
from roles.gpu_power.facts import APPLIED, CONF, UNIT, GpuPowerState, parse_applied
from roles.gpu_power.policy import config_lines, power_plan

if TYPE_CHECKING:
    from rigup.config import Config


def card_class(gpu: dict) -> str | None:
    card = card_for(gpu)
    return card["class"] if card else None


def power_state() -> dict:
    """The host's cards (``NvidiaGpus``: preflight's read, while no operation has run commands on
    the host; nvidia-smi is slow to start on a card without persistence) and ``GpuPowerState``."""
    return {**read_once(GpuPowerState), "gpus": read_once(NvidiaGpus)}


def plan_for(state: dict, data: Config) -> dict:
    """The power plan of this host's live cards under its data (gpu_power_* variables)."""
    return power_plan(state["gpus"], data["gpu_power_watts"], data["gpu_power_overrides"],
                      data["gpu_power_clocks"], data["gpu_power_persistence"], card_class,
                      parse_applied(state["applied"]), data["gpu_psu_watts"])


@reading(GpuPowerState)
@reading(NvidiaGpus)
@operation()
def limits_applied(data: Config, script: str):
    """Write the boot configuration (by UUID) and run the boot unit when a card differs from the
    policy: it sets only the cards that differ, each with ``-i <UUID>``, and reads every value
    back, failing on a mismatch. Every value is checked against the card's own min..max first:
    an out-of-range value or an override naming no card raises before anything changes."""
    state = power_state()
    plan = plan_for(state, data)
    if plan["problems"]:
        raise OperationError(f"gpu_power on {host.name}: " + "; ".join(plan["problems"]))
    conf = config_lines(plan, data["gpu_power_persistence"])
    changes = [f"GPU {r['index']} {r['uuid']}: {c}" for r in plan["cards"] for c in r["change"]]
    if conf == state["conf"] and not changes:
        host.noop("every card is as the policy wants")
        return
    if conf != state["conf"]:
        yield from files.put._inner(src=StringIO(conf), dest=CONF, mode="644")
    if not changes:
        return
    if state["systemd"]:
        yield (f"systemctl restart {UNIT} || {{ echo 'rigup-gpu-power failed:'; "
               f"journalctl -u {UNIT} -n 20 --no-pager -o cat; exit 1; }}")
    else:
        yield f"{shlex.quote(script)} {CONF} {APPLIED}"
