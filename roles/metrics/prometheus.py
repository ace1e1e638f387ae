"""What roles/metrics writes, as pure functions of host data: the addresses it binds, the relay's
configuration, Prometheus's configuration, its scrape targets (generated from the inventory) and
its alert rules. No pyinfra here (unit tests call these with plain dicts).

Every host of the inventory (``fleet``: (name, data) pairs) with ``metrics_enabled`` is scraped:
job ``node`` (the node exporter, with the GPU guard's textfile metrics) and job ``llama-server``
(each instance with ``metrics`` on, through the host's rigup-metrics-relay at /metrics/NAME, and
each model a router pins, a server of its own, at /metrics/NAME.M: the instances bind loopback by
default and may check an API key, and the relay reads both on the host, so no key leaves its host
and no instance has to listen beyond loopback for its metrics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipaddress
import json

import yaml

from rigup.config import peer_value
from rigup.contract import llama_server
from rigup.instances.llama_server import normalised
from rigup.gate import endpoint
from rigup.names import bind_scope

if TYPE_CHECKING:
    from rigup.config import Config

# Files Prometheus reads, by name (relative names in prometheus.yml: resolved against its directory,
# so that a candidate set is checked in a directory of its own before it replaces the live one).
RULES, NODE_TARGETS, LLAMA_TARGETS = "rigup-rules.yml", "rigup-node.json", "rigup-llama.json"


def inventory_address(name: str, data: Config) -> str:
    """The address other hosts reach ``name`` at: its ``ssh_hostname`` (or its inventory name),
    127.0.0.1 for a host with no other (``@local``, ``localhost``)."""
    address = str(data.get("ssh_hostname") or name)
    if address.startswith("@") or address == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address                                   # a DNS name: resolved by whoever binds or scrapes


def bind_address(name: str, data: Config, key: str) -> str:
    """The address to bind for ``key`` (metrics_address, prometheus_address): its value, or the
    inventory address when null."""
    return data.get(key) or inventory_address(name, data)


def url_host(address: str) -> str:
    """``address`` as the host part of a URL or of ``host:port`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def llama_instances(data: Config) -> dict[str, dict]:
    """The host's llama-server servers whose /metrics is on, as the relay reaches them: instance
    name -> {"url", "key"} (key: the API key file, or None), and for a router (also) "models" (the
    set it loads, its own first) and, with a bounded queue, "queue" (HAProxy's stats, its backend
    and the limit); each model a router pins (contract ``pinned``: a server of its own, unit
    rigup-llama@NAME.M at port + 2 + i, out of the router's set) NAME.M -> {"url", "key", "model":
    M}, its series labelled ``model`` as a router's models' are. From the instances
    (rigup.instances.llama_server ``normalised``) and llama-server's contract."""
    found = {}
    for name, inst in normalised(data).items():
        if not inst["metrics"]:
            continue
        pins, key = llama_server.pinned(inst), llama_server.key_file(name, inst)
        found[name] = {"url": endpoint(inst["host"] or "127.0.0.1", inst["port"]) if not llama_server.queued(inst) else
                       # a queued router itself, behind HAProxy on 127.0.0.1:port+1 (the contract's queue row): the
                       # relay's event stream never holds one of the slots the queue hands out
                       endpoint("127.0.0.1", inst["port"] + 1), "key": key,
                       **({"models": [inst["model"], *(m for m in inst["also"] if m not in pins)]}
                          if inst.get("also") else {}),   # a router's set: its pinned models are not its to load
                       **({"queue": {"stats": f"http://127.0.0.1:{data['balancer_stats_port']}/stats;csv",
                                     "backend": llama_server.BACKEND.format(name), "limit": inst["queue"]}}
                          if llama_server.queued(inst) else {})}   # HAProxy holds its queue
        found.update({llama_server.PINNED_UNIT.format(name, m): {"url": endpoint(inst["host"] or "127.0.0.1", port),
                                                                 "key": key, "model": m}
                      for m, port in pins.items()})
    return found


def monitors(fleet: list[tuple[str, dict]]) -> list[str]:
    """The addresses of the hosts that run Prometheus (the relay answers them, and its own host, only)."""
    return sorted({inventory_address(name, data) for name, data in fleet if data.get("prometheus_enabled")})


def scrapers(data: Config, fleet: list[tuple[str, dict]]) -> list[str]:
    """Who may scrape a host's node exporter and relay (with ``data``): the monitoring hosts and
    its ``metrics_allow``."""
    return sorted({*monitors(fleet), *(data.get("metrics_allow") or [])})


def relay_config(name: str, data: Config, fleet: list[tuple[str, dict]]) -> dict:
    """rigup-metrics-relay's configuration on host ``name``: it answers loopback, its own address,
    the monitoring hosts and ``metrics_allow`` (as its nftables allow-list, roles/metrics/allow.py)."""
    address = bind_address(name, data, "metrics_address")
    return {"listen": [address, data["metrics_relay_port"]], "instances": llama_instances(data),
            "allow": sorted({"127.0.0.1", "::1", address, *scrapers(data, fleet)})}


def targets(me: str, fleet: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """The file_sd target groups of jobs node and llama-server for the Prometheus on host ``me``:
    every host with metrics_enabled, labelled ``host``; a llama-server target also ``llama_instance``
    and ``instance`` HOST/NAME. A host that binds loopback is scraped only by its own Prometheus."""
    node, llama = [], []
    for name, data in sorted(fleet):
        # each peer's settings typed (ConfigError naming it): a monitoring host's run configures no peer
        # (round 10 G3: a metrics_address '10.0.0.9/x?y=' became the target '10.0.0.9/x?y=:9100')
        if not peer_value(data, "metrics_enabled"):
            continue
        address = peer_value(data, "metrics_address") or inventory_address(name, data)
        if bind_scope(address) == "loopback" and name != me:
            continue
        host = url_host(address)
        node.append({"targets": [f"{host}:{peer_value(data, 'metrics_node_exporter_port')}"], "labels": {"host": name}})
        llama += [{"targets": [f"{host}:{peer_value(data, 'metrics_relay_port')}"],
                   "labels": {"host": name, "llama_instance": inst, "instance": f"{name}/{inst}",
                              "__metrics_path__": f"/metrics/{inst}"}} for inst in llama_instances(data)]
    return {NODE_TARGETS: node, LLAMA_TARGETS: llama}


def prometheus_yml(data: Config) -> dict:
    """prometheus.yml: the scrape and evaluation interval, the rules, jobs node and llama-server."""
    every = f"{data['prometheus_scrape_interval_s']}s"
    return {"global": {"scrape_interval": every, "evaluation_interval": every,
                       "scrape_timeout": f"{min(10, data['prometheus_scrape_interval_s'])}s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": job, "file_sd_configs": [{"files": [f]}]}
                               for job, f in (("node", NODE_TARGETS), ("llama-server", LLAMA_TARGETS))]}


def rules(data: Config) -> dict:
    """The alert rules: an instance or a node exporter down, the GPU guard tripped, a suspect GPU
    (repeated memory or firmware Xid events), lost GPU
    telemetry (a card gone, nvidia-smi failing or hung), a guard that stopped reporting, an instance
    below its throughput floor (roles/watchdog's rigup_watchdog_* metrics), a model's
    download failed (roles/model_fetch's rigup_model_fetch_* metrics) or stalled (its job dead,
    stopped, or running without a byte for 10 minutes). And one recorded series,
    ``rigup:host_joules_per_token`` per host: every card's draw (W, J/s) over the tokens its
    llama-server instances generate per second (5 minutes' rate), while they generate."""
    hold = f"{data['prometheus_alert_for_s']}s"

    def alert(name, expr, summary, hold_for=hold):
        return {"alert": name, "expr": expr, "for": hold_for, "labels": {"severity": "critical"},
                "annotations": {"summary": summary}}

    return {"groups": [{"name": "rigup", "rules": [
        {"record": "rigup:host_joules_per_token",
         "expr": "sum by (host) (rigup_gpu_power_draw_watts) / "
                 "(sum by (host) (rate(llamacpp:tokens_predicted_total[5m])) > 0)"},
        alert("LlamaServerDown", 'up{job="llama-server"} == 0',
              "llama-server {{ $labels.instance }} does not answer its /metrics (unit stopped, failed or hung)"),
        alert("NodeExporterDown", 'up{job="node"} == 0', "the node exporter of {{ $labels.host }} does not answer"),
        alert("GpuGuardTripped", "rigup_gpu_guard_tripped == 1",
              "the GPU guard of {{ $labels.host }} tripped and stopped serving (rigup-gpu-guard status)", "0s"),
        alert("GpuSuspect", "rigup_gpu_suspect == 1",
              "GPU {{ $labels.gpu }} ({{ $labels.bus }}) of {{ $labels.host }} had repeated memory or firmware Xid "
              "events: its serving units are stopped (rigup-gpu-guard status; clear once the card is replaced)", "0s"),
        alert("GpuTelemetryLost", "rigup_gpu_telemetry_lost == 1",
              "a GPU of {{ $labels.host }} is gone or nvidia-smi fails (journalctl -u rigup-gpu-guard)"),
        alert("GpuGuardSilent",
              "time() - rigup_gpu_guard_last_run_timestamp_seconds > 3 * rigup_gpu_guard_interval_seconds + 30",
              "the GPU guard of {{ $labels.host }} has not reported for 3 periods"),
        alert("ThroughputBelowFloor", "rigup_watchdog_tokens_per_second < rigup_watchdog_floor_tokens_per_second",
              "{{ $labels.llama_instance }} on {{ $labels.host }} runs below its min_tokens_per_s (the watchdog "
              "restarts it after watchdog_bad_checks checks; journalctl -u rigup-watchdog)"),
        alert("ModelDownloadFailed", 'rigup_model_fetch_state{state="failed"} == 1',
              "the download of {{ $labels.model }} on {{ $labels.host }} failed (rigup_model_fetch_error_info, "
              "status.py)", "0s"),
        alert("ModelDownloadStalled",
              '(rigup_model_fetch_state{state=~"dead|stopped"} == 1) or (rigup_model_fetch_state{state="running"} '
              "== 1 and on (instance, model) changes(rigup_model_fetch_bytes[10m]) == 0)",
              "the download of {{ $labels.model }} on {{ $labels.host }} is {{ $labels.state }} and incomplete "
              "(journalctl -u rigup-fetch-*; a converge starts it again)"),
    ]}]}


def config_files(me: str, data: Config, fleet: list[tuple[str, dict]]) -> dict[str, str]:
    """Every file of Prometheus's configuration (name in /etc/prometheus -> text)."""
    files = {"prometheus.yml": _yaml(prometheus_yml(data)), RULES: _yaml(rules(data))}
    files.update({f: json.dumps(groups, indent=1, sort_keys=True) + "\n" for f, groups in targets(me, fleet).items()})
    return files


def _yaml(value: dict) -> str:
    return "# Installed by rigup (roles/metrics).\n" + yaml.safe_dump(value, sort_keys=False, width=200)
