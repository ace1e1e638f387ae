"""roles/preflight: read a host's hardware, print its plan, refuse a plan that cannot work.

It changes nothing on a host. It reads every hardware fact in one round trip (roles.gpu.facts.
HardwareFacts), derives the plan (roles.gpu.plan), prints it, and checks it. A refused host is
taken out of the run with one line per reason (host, what, why, how to fix); the other hosts go
on, and pyinfra ends non-zero. Facts are read when the deploy file is loaded, before any
operation runs, so `--dry` and a real run print the same plan.

Variables (roles/preflight/defaults.yml): gpu_enabled.
"""

from __future__ import annotations

from dataclasses import dataclass

import click
from pyinfra import host

from roles.gpu.facts import HardwareFacts
from roles.gpu.plan import format_plan, hardware_plan


@dataclass(frozen=True)
class Refusal:
    """Why a host cannot go on: what is wrong, why it matters, and how to fix it."""

    what: str
    why: str
    fix: str

    def line(self, host_name: str) -> str:
        return f"[{host_name}] refused: {self.what}: {self.why}; fix: {self.fix}"


def refusals(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """Every reason this plan cannot work on this host (pure: plan, facts and data in)."""
    found = []
    if data.get("gpu_enabled", True) and plan["cpu_only"]:
        found.append(Refusal(
            "GPU roles enabled on a host without a usable NVIDIA GPU",
            plan["why_cpu_only"],
            "install the NVIDIA driver, or set gpu_enabled: false for this host"))
    return found


def run() -> dict:
    """Print this host's plan and take the host out of the run when it is refused."""
    facts = host.get_fact(HardwareFacts)
    plan = hardware_plan(facts["gpus"], facts["driver"], facts["cuda_toolkits"])
    for line in format_plan(plan).splitlines():
        click.echo(f"    [{host.name}] {line}", err=True)
    found = refusals(plan, facts, host.data.dict())
    for refusal in found:
        click.echo(click.style(f"    {refusal.line(host.name)}", fg="red"), err=True)
    if found:
        host.state.fail_hosts({host})
    return plan
