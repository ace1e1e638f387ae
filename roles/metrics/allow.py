"""Who reaches roles/metrics's listeners, as pure functions of host data (unit tests render them).

None of them checks a key, so each one bound beyond loopback is behind an nftables allow-list
(rigup/firewall.py: others get a TCP reset):

- ``inet rigup_metrics`` (/etc/rigup/metrics.nft): the node exporter's and the relay's ports, from
  loopback, the monitoring hosts (those with prometheus_enabled: they scrape) and ``metrics_allow``;
- ``inet rigup_prometheus`` (/etc/rigup/prometheus.nft), on a monitoring host: Prometheus's port,
  from loopback, the monitoring hosts and ``prometheus_allow``.

The gateways are in neither: they balance the serving ports and scrape or query nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup import firewall
from rigup.names import bind_scope
from roles.metrics.prometheus import bind_address, monitors, scrapers

if TYPE_CHECKING:
    from rigup.config import Config

METRICS_NFT, METRICS_TABLE = "/etc/rigup/metrics.nft", "rigup_metrics"
PROMETHEUS_NFT, PROMETHEUS_TABLE = "/etc/rigup/prometheus.nft", "rigup_prometheus"


def exposed(name: str, data: Config, key: str) -> bool:
    """Whether what binds ``key`` (metrics_address, prometheus_address) on host ``name`` listens
    beyond loopback (preflight refuses a wildcard)."""
    return bind_scope(bind_address(name, data, key)) != "loopback"


def metrics_text(data: Config, fleet: list[tuple[str, dict]]) -> str:
    """The allow-list of the node exporter's and the relay's ports."""
    return firewall.text(METRICS_TABLE, [data["metrics_node_exporter_port"], data["metrics_relay_port"]],
                         scrapers(data, fleet), "roles/metrics", "loopback, the monitoring hosts and metrics_allow",
                         loopback=True)


def prometheus_text(data: Config, fleet: list[tuple[str, dict]]) -> str:
    """The allow-list of Prometheus's port."""
    return firewall.text(PROMETHEUS_TABLE, [data["prometheus_port"]],
                         sorted({*monitors(fleet), *(data.get("prometheus_allow") or [])}), "roles/metrics",
                         "loopback, the monitoring hosts and prometheus_allow", loopback=True)
