"""roles/metrics's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py), and the ports its units take.

    check_addresses   metrics_address or prometheus_address a wildcard (every interface)
    check_systemd     Prometheus on a host where systemd is not PID 1
"""

from __future__ import annotations

from rigup.names import bind_scope
from rigup.refusal import Port, Refusal, needs_systemd


def ports(plan: dict, data: dict, fleet=None) -> list[Port]:
    """The node exporter's and the relay's ports (with metrics_enabled), Prometheus's (with
    prometheus_enabled); a listener of the unit itself is no conflict (its process names)."""
    found = []
    if data.get("metrics_enabled") and plan.get("systemd", True):
        found += [Port(data["metrics_node_exporter_port"], "metrics_node_exporter_port", ("prometheus-node",)),
                  Port(data["metrics_relay_port"], "metrics_relay_port", ("rigup-metrics",))]
    if data.get("prometheus_enabled"):
        found.append(Port(data["prometheus_port"], "prometheus_port", ("prometheus",)))
    return found


def check_addresses(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """metrics_address or prometheus_address that is a wildcard (0.0.0.0, ::, ::0, 0:0:0:0:0:0:0:0):
    the exporters and Prometheus bind one address, the host's inventory address or loopback."""
    return [Refusal(f"{key} is {data[key]}", "a wildcard serves the host's metrics on every interface, "
                    "public ones too", f"set {key} to one address of the host, or null for its inventory address",
                    "addresses")
            for key in ("metrics_address", "prometheus_address")
            if data.get(key) is not None and bind_scope(data[key]) == "wildcard"]


def check_systemd(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """prometheus_enabled on a host where systemd is not PID 1 (the node exporter is left out there)."""
    return needs_systemd(facts, ["prometheus_enabled"] if data.get("prometheus_enabled") else [])


CHECKS = (check_addresses, check_systemd)
