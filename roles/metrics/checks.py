"""roles/metrics's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py), and the ports its units take.

    check_addresses    metrics_address or prometheus_address a wildcard (every interface)
    check_systemd      Prometheus on a host where systemd is not PID 1
    check_allow_lists  (FLEET_CHECKS, with every host's data) a listener bound beyond loopback
                       whose allow-list cannot name a monitoring host (no IP address)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.config import host_ip
from rigup.names import bind_scope
from rigup.refusal import Fleet, Port, Refusal, needs_systemd, open_listener
from roles.metrics.allow import exposed
from roles.metrics.prometheus import bind_address, inventory_address

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

# What each address binds: (the setting that runs it, the address key, what listens there).
LISTENERS = (("metrics_enabled", "metrics_address", "the node exporter and the relay"),
             ("prometheus_enabled", "prometheus_address", "Prometheus"))


# the account Debian's prometheus and prometheus-node-exporter units run as (User=prometheus)
PACKAGE_USERS = ("prometheus",)


def ports(plan: Plan, data: Config, fleet=None) -> list[Port]:
    """The node exporter's and the relay's ports (with metrics_enabled), Prometheus's (with
    prometheus_enabled); a listener of the unit itself is no conflict (its process names)."""
    found = []
    if data.get("metrics_enabled") and plan.get("systemd", True):
        found += [Port(data["metrics_node_exporter_port"], "metrics_node_exporter_port", ("prometheus-node",),
                       PACKAGE_USERS),
                  Port(data["metrics_relay_port"], "metrics_relay_port", ("rigup-metrics",))]
    if data.get("prometheus_enabled"):
        found.append(Port(data["prometheus_port"], "prometheus_port", ("prometheus",), PACKAGE_USERS))
    return found


def check_addresses(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """metrics_address or prometheus_address that is a wildcard (0.0.0.0, ::, ::0, 0:0:0:0:0:0:0:0):
    the exporters and Prometheus bind one address, the host's inventory address or loopback."""
    return [Refusal(f"{key} is {data[key]}", "a wildcard serves the host's metrics on every interface, "
                    "public ones too", f"set {key} to one address of the host, or null for its inventory address",
                    "addresses")
            for key in ("metrics_address", "prometheus_address")
            if data.get(key) is not None and bind_scope(data[key]) == "wildcard"]


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """prometheus_enabled on a host where systemd is not PID 1 (the node exporter is left out there)."""
    return needs_systemd(facts, ["prometheus_enabled"] if data.get("prometheus_enabled") else [])


def check_allow_lists(plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """The node exporter, the relay or Prometheus (none checks a key) bound beyond loopback where
    its nftables allow-list cannot name a monitoring host: that host's inventory address is no IP
    address (nftables takes addresses, not names)."""
    if fleet is None or not facts.get("systemd", True):
        return []
    hosts = {**fleet.hosts, fleet.me: data}
    unnamed = [(name, inventory_address(name, d)) for name, d in sorted(hosts.items())
               if d.get("prometheus_enabled") and not host_ip(inventory_address(name, d))]
    return [open_listener(f"{key} ({what}, no key)", bind_address(fleet.me, data, key), "without an allow-list",
                          f"set {name}'s ssh_hostname to its IP address, or {key}: 127.0.0.1", "allow_list",
                          f": its allow-list cannot name the monitoring host {name}, whose inventory address "
                          f"{address!r} is not an IP address")
            for on, key, what in LISTENERS if data.get(on) and exposed(fleet.me, data, key)
            for name, address in unnamed]


CHECKS = (check_addresses, check_systemd)
FLEET_CHECKS = (check_allow_lists,)
