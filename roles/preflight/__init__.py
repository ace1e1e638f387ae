"""roles/preflight: read a host's hardware, print its plan, refuse a plan that cannot work.

It changes nothing on a host. It reads every hardware fact in one round trip (rigup.gpu.facts.
HardwareFacts, with the free disk where each model goes), derives the plan (rigup.gpu.plan),
prints it, and checks plan, facts and data with the pure checks of roles/preflight/checks.py
(the 14 refusals, and the nested maps by key path: roles/preflight/schema.py). A refused host
is taken out of the run with one line per reason (host, what, why, how to fix); the other hosts
go on, pyinfra ends non-zero, and a last line names every refused host. Facts are read when the
deploy file is loaded, before any operation runs, so `--dry` and a real run print the same plan.

Variables: gpu_enabled (roles/preflight/defaults.yml); it reads those of cuda_toolkit,
gpu_power, model_fetch, llama_server, vllm and cmpunlocker.
"""

from __future__ import annotations

import atexit

import click
from pyinfra import host

from rigup.gpu.facts import HardwareFacts
from rigup.gpu.plan import format_plan, hardware_plan
from roles.preflight.checks import Refusal, refusals
from roles.preflight.facts import PathBytes
from roles.preflight.schema import serving_config

__all__ = ["Refusal", "refusals", "run", "model_paths"]

_refused: dict[str, int] = {}


def _summary() -> None:
    if _refused:
        names = ", ".join(f"{name} ({n} reason{'s' if n > 1 else ''})" for name, n in sorted(_refused.items()))
        click.echo(click.style(f"--> preflight refused {len(_refused)} host(s): {names}", fg="red"), err=True)


atexit.register(_summary)


def model_paths(data: dict) -> list[str]:
    """Where this host's models go (their ``dest``), for the free-disk facts."""
    config, _ = serving_config(data)
    return sorted({m["dest"] for m in config["models"].values()})


def run() -> dict:
    """Print this host's plan and take the host out of the run when it is refused. Returns the
    plan, with ``systemd`` (whether systemd is PID 1) added for the roles."""
    data = host.data.dict()
    dests = model_paths(data)
    facts = dict(host.get_fact(HardwareFacts, paths=["/", *dests]))
    facts["model_bytes"] = host.get_fact(PathBytes, paths=dests) if dests else {}
    plan = dict(hardware_plan(facts["gpus"], facts["driver"], facts["cuda_toolkits"]), systemd=facts["systemd"])
    for line in format_plan(plan).splitlines():
        click.echo(f"    [{host.name}] {line}", err=True)
    found = refusals(plan, facts, data)
    for refusal in found:
        click.echo(click.style(f"    {refusal.line(host.name)}", fg="red"), err=True)
    if found:
        _refused[host.name] = len(found)
        host.state.fail_hosts({host})
    return plan
