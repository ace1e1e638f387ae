"""roles/metrics: the node exporter and the serving metrics relay on every host, Prometheus with
alert rules on the hosts of the ``monitoring`` group.

What it does to a host with systemd (nothing without: preflight refuses Prometheus there):
- with ``metrics_enabled``: Debian's ``prometheus-node-exporter`` (started by systemd), its
  ARGS in /etc/default/prometheus-node-exporter (written before the package is installed, so it
  never listens on every interface): ``metrics_address`` (null: the host's inventory address, or
  127.0.0.1 when it has none) port ``metrics_node_exporter_port``, and its textfile directory
  (rigup.names.TEXTFILE_DIR), where roles/gpu_guard's guard writes every card's metrics
  (rigup.names.GPU_METRICS); ``rigup-metrics-relay`` (roles/metrics/shipped/relay.py, standard library,
  and beside it ``rigup_throughput.py``, shipped/throughput.py, whose key rule it uses, as the watchdog's)
  on the same address, port ``metrics_relay_port``: GET /metrics/NAME answers llama-server
  instance NAME's /metrics (GET /metrics/NAME.M: the server of a model M its router pins, labelled
  ``model``), fetched on the host with its API key (which never leaves the host),
  to loopback, the monitoring hosts and ``metrics_allow`` only. Each restarts only when its files
  changed. ``metrics_enabled: false`` stops and disables both.
- with ``prometheus_enabled`` (group_vars/monitoring.yml sets it for the ``monitoring`` group):
  Debian's ``prometheus`` bound to ``prometheus_address`` (null: the inventory address) port
  ``prometheus_port``, keeping ``prometheus_retention_days``; its configuration generated from
  the inventory (roles/metrics/prometheus.py): jobs ``node`` and ``llama-server`` (file_sd
  targets: every host of the inventory with metrics_enabled, and each of its llama-server
  instances with ``metrics`` on, through its relay), every ``prometheus_scrape_interval_s``, and
  alert rules with ``for:`` ``prometheus_alert_for_s`` (an instance down, a node exporter down,
  the GPU guard tripped, lost GPU telemetry, a silent guard). A changed configuration is written
  to /etc/prometheus/rigup-candidate first and replaces the live one only after ``promtool check
  config`` and ``promtool check rules`` passed on it; then Prometheus reloads. A bad
  configuration fails the host and leaves the working one running. ``prometheus_enabled: false``
  stops and disables it.
- none of the three listeners checks a key, so each one bound beyond loopback is behind an nftables
  allow-list (roles/metrics/allow.py, rigup/firewall.py; others get a TCP reset), loaded before it
  listens: Debian's ``nftables``; table ``inet rigup_metrics`` (/etc/rigup/metrics.nft) for the
  node exporter's and the relay's ports, admitting loopback, the monitoring hosts' inventory
  addresses and ``metrics_allow``; on a monitoring host with ``prometheus_address`` beyond
  loopback, ``inet rigup_prometheus`` (/etc/rigup/prometheus.nft) for Prometheus's port: loopback,
  the monitoring hosts and ``prometheus_allow``. The gateways are in neither (they scrape and
  query nothing). Each file is checked by ``nft -c`` before it goes live; each unit loads it again
  at every start, at boot too, through a drop-in (``ExecStartPre=+/usr/sbin/nft -f FILE`` in
  /etc/systemd/system/UNIT.d/rigup-allow-list.conf: the Debian units are not rigup's to write,
  and the relay gets the same; a new drop-in restarts nothing, the table being live already). A listener back on loopback or
  turned off: its table, file and drop-ins go once it is off the network (after its restart or
  stop). Preflight refuses such a listener when its allow-list cannot name a monitoring host (an
  inventory address that is no IP address).

Variables (roles/metrics/defaults.yml): metrics_enabled, metrics_address,
metrics_node_exporter_port, metrics_relay_port, metrics_allow, prometheus_enabled, prometheus_address,
prometheus_port, prometheus_allow, prometheus_scrape_interval_s, prometheus_alert_for_s,
prometheus_retention_days;
llama_server_instances (roles/llama_server), rigup_user and rigup_prefix and apt_cache_seconds
(roles/base), and every host's ssh_hostname (the inventory).
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import operation
from rigup.probe import systemd
from pyinfra.operations.util import any_changed

from rigup import apt, files, firewall, services
from rigup.gpu.plan import Plan
from rigup.config import Config, fleet_data, role_defaults
from rigup.files import FileStates
from rigup.names import RELAY_UNIT, TEXTFILE_DIR
from rigup.secrets import written
from rigup.state import read_once
from rigup.templates import render
from roles.metrics import allow
from roles.metrics.checks import CHECKS, FLEET_CHECKS, ports
from roles.metrics.prometheus import bind_address, config_files, relay_config, url_host

__all__ = ["apply", "CHECKS", "FLEET_CHECKS", "ports"]

THROUGHPUT = ("shipped/throughput.py",)   # the relay's key rule, installed beside it
NODE_DEFAULT, PROM_DEFAULT = "/etc/default/prometheus-node-exporter", "/etc/default/prometheus"
RELAY_CONFIG, RELAY = "/etc/rigup/metrics-relay.json", RELAY_UNIT
RELAY_UNIT = f"/etc/systemd/system/{RELAY}"
NODE, PROMETHEUS = "prometheus-node-exporter.service", "prometheus.service"
LIVE, CANDIDATE = "/etc/prometheus", "/etc/prometheus/rigup-candidate"


def listen(data: Config, key: str, port_key: str) -> str:
    return f"{url_host(bind_address(host.name, data, key))}:{data[port_key]}"


def promote_command(names: list[str]) -> str:
    """Shell that checks the candidate configuration and, only when promtool passes it, copies
    each file over the live one (a rename each) and reloads Prometheus."""
    q = shlex.quote
    copies = " && ".join(f"cp {q(f'{CANDIDATE}/{n}')} {q(f'{LIVE}/.{n}.new')} && mv {q(f'{LIVE}/.{n}.new')} "
                         f"{q(f'{LIVE}/{n}')}" for n in names)
    return (f"cd {q(CANDIDATE)} && promtool check config prometheus.yml && promtool check rules rigup-rules.yml && "
            f"{copies} && systemctl reload-or-restart prometheus")


@operation()
def checked_config(texts: dict[str, str]):
    """Prometheus's files (``texts``: name in /etc/prometheus -> text) written to the candidate
    directory, checked by promtool, and only then made live; nothing when the live ones match."""
    states = read_once(FileStates, paths=[f"{LIVE}/{n}" for n in sorted(texts)])
    stale = [n for n, text in sorted(texts.items())
             if (states.get(f"{LIVE}/{n}") or {}).get("sha256") != hashlib.sha256(text.encode()).hexdigest()]
    if not stale:
        host.noop("the live configuration is the checked one")
        return
    yield f"rm -rf {shlex.quote(CANDIDATE)} && mkdir -p {shlex.quote(CANDIDATE)}"
    for name, text in sorted(texts.items()):
        yield written(f"{CANDIDATE}/{name}", text, "644")
    yield promote_command(sorted(texts))


def exporters(data: Config, fleet: list[tuple[str, dict]]) -> None:
    """The node exporter and the relay, each restarted only when its files changed."""
    script = f"{data['rigup_prefix']}/bin/rigup-metrics-relay"
    # the relay imports its key rule from the file beside it (as the watchdog)
    paths = [NODE_DEFAULT, TEXTFILE_DIR, *files.program_paths(script, THROUGHPUT), RELAY_CONFIG, RELAY_UNIT]
    args = files.managed(name=f"metrics: {NODE_DEFAULT}", dest=NODE_DEFAULT, paths=paths,
                         text=render("metrics-node-exporter.default.j2", textfile_dir=TEXTFILE_DIR,
                                     listen=listen(data, "metrics_address", "metrics_node_exporter_port")))
    apt.installed(name="metrics: prometheus-node-exporter", packages=["prometheus-node-exporter"],
                  cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=data["apt_retry_delay"])
    files.directory(name=f"metrics: {TEXTFILE_DIR}", path=TEXTFILE_DIR, paths=paths, mode=None, user=None, group=None)
    services.running(name="metrics: run prometheus-node-exporter", unit="prometheus-node-exporter",
                     units=["prometheus-node-exporter", RELAY])
    systemd.service(name="metrics: restart prometheus-node-exporter (new arguments)",
                    service="prometheus-node-exporter", restarted=True, _if=args.did_change)
    relay = [
        *files.program("roles/metrics/shipped/relay.py", script, paths, name="metrics: the relay", beside=THROUGHPUT),
        files.managed(name=f"metrics: {RELAY_CONFIG}", dest=RELAY_CONFIG, paths=paths,
                      text=json.dumps(relay_config(host.name, data, fleet), indent=1, sort_keys=True) + "\n"),
        unit := files.managed(name=f"metrics: {RELAY}", dest=RELAY_UNIT, paths=paths,
                              text=render("metrics-relay.service.j2", user=data["rigup_user"], script=script,
                                          config=RELAY_CONFIG))]
    systemd.daemon_reload(name="metrics: systemd daemon-reload", _if=unit.did_change)
    services.running(name=f"metrics: run {RELAY}", unit=RELAY, units=["prometheus-node-exporter", RELAY])
    systemd.service(name=f"metrics: restart {RELAY} (changed)", service=RELAY, restarted=True, _if=any_changed(*relay))


def prometheus(data: Config, fleet: list[tuple[str, dict]]) -> None:
    """Prometheus, its configuration checked before it goes live, restarted on new arguments."""
    args = files.managed(name=f"metrics: {PROM_DEFAULT}", dest=PROM_DEFAULT, paths=[PROM_DEFAULT],
                         text=render("metrics-prometheus.default.j2", retention_days=data["prometheus_retention_days"],
                                     listen=listen(data, "prometheus_address", "prometheus_port")))
    apt.installed(name="metrics: prometheus", packages=["prometheus"], cache_seconds=data["apt_cache_seconds"],
                  _retries=2, _retry_delay=data["apt_retry_delay"])
    checked_config(name="metrics: Prometheus configuration (promtool checks it first)",
                   texts=config_files(host.name, data, fleet))
    services.running(name="metrics: run prometheus", unit="prometheus", units=["prometheus"])
    systemd.service(name="metrics: restart prometheus (new arguments)", service="prometheus", restarted=True,
                    _if=args.did_change)


def stopped(units: list[str], why: str) -> None:
    """``units`` stopped and disabled (nothing where they never ran)."""
    for unit in units:
        services.running(name=f"metrics: {unit} stopped ({why})", unit=unit, units=units, enabled=False)


@deploy("metrics", data_defaults=role_defaults("metrics"))
def apply(plan: Plan, data: Config):
    if not plan.get("systemd", True):
        return      # the Debian units need systemd (preflight refuses prometheus_enabled there)
    fleet = list(fleet_data(host).items())
    # Each listener bound beyond loopback: its allow-list loaded before it starts (and by its unit at
    # every start); back on loopback, or off: the allow-list goes once the listener is gone from there.
    lists = [(data["metrics_enabled"] and allow.exposed(host.name, data, "metrics_address"), allow.METRICS_NFT,
              allow.METRICS_TABLE, (NODE, RELAY), allow.metrics_text),
             (data["prometheus_enabled"] and allow.exposed(host.name, data, "prometheus_address"),
              allow.PROMETHEUS_NFT, allow.PROMETHEUS_TABLE, (PROMETHEUS,), allow.prometheus_text)]
    if any(wanted for wanted, *_ in lists):
        apt.installed(name="metrics: nftables (the allow-lists)", packages=["nftables"],
                      cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=data["apt_retry_delay"])
    for wanted, path, table, units, text in lists:
        if wanted:
            firewall.allowed(name=f"metrics: only the allow-list reaches {', '.join(units)} ({path})", path=path,
                             table=table, text=text(data, fleet), units=units)
    if data["metrics_enabled"]:
        exporters(data, fleet)
    else:
        stopped([NODE, RELAY], "metrics_enabled: false")
    if data["prometheus_enabled"]:
        prometheus(data, fleet)
    else:
        stopped([PROMETHEUS], "prometheus_enabled: false")
    for wanted, path, table, units, _ in lists:
        if not wanted:
            firewall.dropped(name=f"metrics: no allow-list for {', '.join(units)} ({path})", path=path, table=table,
                             units=units)


ROLE = Role("metrics", apply, checks=CHECKS, fleet_checks=FLEET_CHECKS, ports=ports)
