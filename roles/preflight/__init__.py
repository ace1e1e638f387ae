"""roles/preflight: read a host's hardware, print its plan, refuse a plan that cannot work.

It changes nothing on a host. It reads every hardware fact in one round trip (rigup.gpu.facts.
HardwareFacts, with the free disk where each model goes), derives the plan (rigup.gpu.plan),
prints it, and runs every role's refusals on plan, facts and data: the play hands it the roles'
records (rigup/role.py ``Role``, each package's ``ROLE``), which declare their checks (from
``roles/<role>/checks.py``) and, when their units listen, their ports (``ports``), what they add
to the printed plan (``plan_lines``; with the fleet: ``fleet_plan_lines``), and what a new
llama.cpp build is smoke-tested with (``smoke_runs``: the plan's ``smoke``); the facts their plan lines read (``plan_reads``) are read
in preflight's one round trip, and handed to the checks as ``facts["reads"]`` (fact class name
-> value). Preflight imports no role. A refused host is taken out
of the run with one line per reason (host, what, why, how to fix); the other hosts go on,
pyinfra ends non-zero, and a last line names every refused host. Facts are read when the
deploy file is loaded, before any operation runs, so `--dry` and a real run print the same plan.

Variables: gpu_enabled (roles/preflight/defaults.yml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import replace

from pyinfra import host

from rigup import peer, run as run_state, summary
from rigup.boundary import Unreadable
from rigup.config import Config, fleet_data, source_of
from rigup.gpu.fabric import fabric_plan
from rigup.gpu.driver import planned_gpus
from rigup.gpu.facts import HardwareFacts, NvidiaDriver, NvidiaGpus
from rigup.gpu.plan import Plan, format_plan, hardware_plan
from rigup.models import model_dests, model_places
from rigup.names import MARKER
from rigup.refusal import Fleet, Refusal
from rigup.serving import serving_plan
from rigup.state import known, read_once, will_read
from roles.preflight.checks import check_gpu_host, port_refusals
from roles.preflight.facts import PathBytes
from rigup.text import say

if TYPE_CHECKING:
    from rigup.role import Role
    from rigup.gpu.facts import Facts

__all__ = ["run", "refusals"]


def plan_of(name: str) -> dict | None:
    """Host ``name``'s hardware plan (an RPC head's VRAM plan needs its workers' GPUs): the one its
    own preflight made, else read now from its facts as its preflight reads them (rigup/peer.py);
    None when it cannot be read. Kept on the run (rigup/run.py ``plans``)."""
    plans = run_state.host_run(host).plans
    if name not in plans:
        try:
            peer.plan(host.inventory.get_host(name))
        except Exception as e:      # unreachable: the head is refused, naming the worker
            say(f"    [{host.name}] cannot read the GPUs of {name}: {e}")
            plans[name] = None
    return plans[name]


def _summary(refused: dict[str, int]) -> None:
    """The run's last line of preflight: every host it refused, with its count of reasons."""
    names = ", ".join(f"{name} ({n} reason{'s' if n > 1 else ''})" for name, n in sorted(refused.items()))
    say(f"--> preflight refused {len(refused)} host(s): {names}", fg="red")


def refusals(roles: list[Role], plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """Every reason this plan cannot work on this host (pure: plan, facts and data in): preflight's
    own checks, each role's ``CHECKS`` and ``FLEET_CHECKS`` (these also take ``fleet``: every
    host's data, for what one host's settings mean to another), and the ports of every role's
    ``ports``."""
    found = check_gpu_host(plan, facts, data)
    for role in roles:
        for check in role.checks:
            found += check(plan, facts, data)
        for check in role.fleet_checks:
            found += check(plan, facts, data, fleet)
    claims = [claim for role in roles if role.ports for claim in role.ports(plan, data, fleet)]
    return found + port_refusals(claims, facts, data.get("rigup_user"))


def _sourced(refusal: Refusal) -> Refusal:
    """A configuration refusal with the file or layer its value came from (``models.glm.dest
    (group_vars/a100.yml)``)."""
    if refusal.check != "config":
        return refusal
    key = refusal.what.split(".", 1)[0].split(":", 1)[0]
    return replace(refusal, what=f"{refusal.what} ({source_of(host, key)})")


def run(roles: list[Role], data: Config, more: list[Refusal] = ()) -> Plan:
    """Print this host's plan and take the host out of the run when any of ``roles`` refuses it
    (or the play has ``more`` refusals of its own); ``data``: the host's configuration
    (rigup.config.configure). Returns the plan, with ``systemd`` (whether systemd is PID 1) and
    ``serving_units`` (the serving instances installed), ``serving`` (rigup.serving
    ``serving_plan``: what the serving roles install) and ``driver_step`` (rigup.gpu.driver: the
    driver nvidia_driver installs, or None) added for the roles."""
    dests = model_dests(data)
    places = model_places(data)
    if dests:
        will_read(PathBytes, paths=places, marker=MARKER)   # one round trip for both
    reads = [r for role in roles if role.plan_reads for r in role.plan_reads(data)]
    for fact, kwargs in reads:   # what a role's plan_lines and checks read of the host: in the same round trip
        will_read(fact, **kwargs)
    facts = dict(read_once(HardwareFacts, paths=["/", *dests]))
    known(NvidiaGpus, facts["gpus"])     # gpu_power's read of the cards, unless a change came first
    known(NvidiaDriver, facts["driver"])  # nvidia_driver's: nvidia-smi runs once per converge
    facts["model_bytes"] = read_once(PathBytes, paths=places, marker=MARKER) if dests else {}
    facts["reads"] = {fact.__name__: read_once(fact, **kwargs) for fact, kwargs in reads}
    # a driver step (roles/nvidia_driver): without a driver the cards come from the PCI bus
    gpus, step = planned_gpus(facts, data)
    fabric = fabric_plan(facts.get("nvswitches") or [], gpus, facts.get("fabric_manager"))
    parts: dict = {}
    for role in roles:   # the cards the plan may serve on (roles/burnin: all but the quarantined), and its part
        if role.cards:
            try:
                gpus, added = role.cards(gpus, facts, data)
            except Unreadable as e:   # a record of this host that does not read: this host refused, not the run
                more = [*more, Refusal(f"{e.where} does not read", e.why, "correct the file or move it aside",
                                       role.name)]
                continue
            parts.update(added)
    plan: Plan = dict(hardware_plan(gpus, facts["driver"], facts["cuda_toolkits"], facts.get("cpu")),
                      systemd=facts["systemd"], serving_units=facts.get("serving_units", []), driver_step=step,
                      fabric=fabric, **parts)
    current = run_state.host_run(host)
    current.plans[host.name] = plan
    fleet = Fleet(host.name, fleet_data(host), plan_of)
    # every serving instance sized, with its servers, once: what the serving roles install, smoke and read,
    # and what their plan lines and refusals below print (made first, so that they read it and size nothing)
    plan["serving"] = serving_plan([role.engine for role in roles if role.engine], data, plan)
    # what a new llama.cpp build is tried with before it serves (roles/llama_cpp): each role's runs
    plan["smoke"] = [run for role in roles if role.smoke_runs for run in role.smoke_runs(plan, data, fleet)]
    for role in roles:   # what a role tells the roles before it (llama_cpp: whether this host compiles)
        if role.plan_adds:
            plan.update(role.plan_adds(plan, data))
    lines = format_plan(plan).splitlines()
    lines += [line for role in roles if role.plan_lines for line in role.plan_lines(plan, data)]
    lines += [line for role in roles if role.fleet_plan_lines
              for line in role.fleet_plan_lines(plan, data, fleet)]
    for line in lines:
        say(f"    [{host.name}] {line}")
    found = [_sourced(r) for r in [*more, *refusals(roles, plan, facts, data, fleet)]]
    for refusal in found:
        say(f"    {refusal.line(host.name)}", fg="red")
    if found:
        current.refusals[host.name] = len(found)
        current.at_end(_summary, current.refusals)
        summary.refused(host, [f"{r.what}" for r in found])
        host.state.fail_hosts({host})
    return plan
