"""roles/rpc_worker's refusals: pure functions of a host's plan, facts, data and the run's fleet
(rigup.refusal.Fleet: every host's data, to see which heads name this host a worker).

    check_worker    a worker that cannot serve its heads: no systemd, an inventory address that is
                    no IP address (its own, or a head's), a head that builds another llama.cpp ref
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.refusal import Fleet, Port, Refusal, needs_systemd
from rigup.rpc import RPC_UNIT, heads_of, ip_problem, ref_problem

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def _heads(fleet: Fleet | None) -> list[str]:
    return heads_of(fleet.me, fleet.hosts) if fleet else []


def ports(plan: Plan, data: Config, fleet: Fleet | None = None) -> list[Port]:
    """The RPC port, on a host that some instance names a worker."""
    heads = _heads(fleet)
    return [Port(int(data["rpc_worker_port"]), f"rpc_worker_port (the RPC worker of {', '.join(heads)})",
                 ("ggml-rpc-server", "rpc-server"))] if heads else []


def check_worker(plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """A host named a worker by some instance (its heads) where the worker cannot run: no systemd,
    its or a head's inventory address is no IP address, or a head builds another llama_cpp_ref."""
    heads = _heads(fleet)
    if not heads:
        return []
    found = needs_systemd(facts, [f"{RPC_UNIT} (the RPC worker of {', '.join(heads)})"])
    where = f"the RPC worker of {', '.join(heads)}"
    for name in [fleet.me, *heads]:
        problem = ip_problem(name, fleet.hosts[name] if name != fleet.me else data)
        if problem:
            found.append(Refusal(f"{where} cannot bind or allow-list", problem, "use IP addresses in the inventory", "rpc"))
    for head in heads:
        problem = ref_problem(fleet.me, data, head, fleet.hosts[head])
        if problem:
            found.append(Refusal(f"llama_cpp_ref differs from its head {head}", problem,
                                 f"set the same llama_cpp_ref on {fleet.me} and {head}", "rpc"))
    return found


CHECKS = ()
FLEET_CHECKS = (check_worker,)
