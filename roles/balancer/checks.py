"""roles/balancer's refusals and ports: pure functions of a host's plan, facts and data.

    check_systemd   a gateway on a host where systemd is not PID 1 (HAProxy runs as a unit)
    check_gateway   a gateway with no host behind it, or with its frontends on ports its own
                    instances take

The balancer's frontend of a replicated instance takes the instance's port: roles/llama_server
claims it (it knows the layout); a gateway claims its frontends' ports here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.contract import MAPS
from rigup.instances import every
from rigup.refusal import Port, Refusal, needs_systemd
from roles.balancer.config import gateway_backends

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def _gateway(data: Config, fleet) -> list[dict]:
    if not data.get("balancer_gateway") or fleet is None:
        return []
    return gateway_backends(fleet.me, fleet.hosts, data["balancer_gateway_bind"], bool(data.get("fleet_api_key")))


def ports(plan: Plan, data: Config, fleet=None) -> list[Port]:
    """The stats frontend (loopback) when the host balances anything, and a gateway's frontends."""
    gateway = _gateway(data, fleet)
    replicated = any(inst["replicas"] != 1 for _, _, inst in every(data))
    stats = [Port(data["balancer_stats_port"], "balancer_stats_port", ("haproxy",))] \
        if gateway or replicated else []
    return stats + [Port(b["port"], f"balancer_gateway ({b['name']})", ("haproxy",)) for b in gateway
                    if not b.get("route")]   # a router model's backend: its instance's frontend


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A gateway on a host where systemd is not PID 1."""
    return needs_systemd(facts, ["balancer_gateway"] if data.get("balancer_gateway") else [])


def check_gateway(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A gateway host that serves instances itself (their ports are its frontends')."""
    own = sorted(n for var in MAPS for n in (data.get(var) or {}))
    if data.get("balancer_gateway") and own:
        return [Refusal(f"gateway host serves {', '.join(own)} itself",
                        "a gateway's frontends take the ports of the fleet's instances",
                        "set llama_server_instances: {} and vllm_instances: {} for the gateway hosts "
                        "(group_vars/gateway.yml)", "gateway")]
    return []


CHECKS = (check_systemd, check_gateway)
