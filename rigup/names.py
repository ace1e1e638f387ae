"""Paths and names several roles agree on, each defined once.

- the completion marker a model's download writes last (roles/model_fetch) and the serving roles
  wait for: :func:`marker_path`
- the GPU guard's tripped file (roles/gpu_guard writes it; the serving units do not start while
  it exists): :func:`guard_file`
- the hub token on a host (roles/model_fetch puts it there; its job reads it): :data:`HF_TOKEN`
- the node exporter's textfile directory (roles/metrics sets it) and the GPU metrics file the
  guard writes there (roles/gpu_guard): :data:`TEXTFILE_DIR`, :data:`GPU_METRICS`; those of the
  downloads (roles/model_fetch) and of the watchdog (roles/watchdog): :data:`FETCH_METRICS`,
  :data:`WATCHDOG_METRICS`
- the serving instances' API key files: rigup/contract (``MAPS``; ``served`` and llama-server's
  ``key_file`` give each instance's)
- whether a bind address serves this host only, every interface or others: :func:`bind_scope`
- rigup-burnin's records per card (roles/burnin writes them; preflight's quarantine, the GPU
  guard and status.py read them) and the cards under test now: :func:`burnin_file`,
  :data:`BURNIN_TESTING`; the controller's copy of a host's: :func:`burnin_copy`
- the tok/s the health gate measured at a serving unit's (re)start (rigup/gate.py writes it, the
  watchdog's default floor reads it): :func:`gate_record`
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from rigup.boundary import fields

MARKER = ".rigup-complete.json"
HF_TOKEN = "/etc/rigup/hf-token"
SHARE_TOKEN = "/etc/rigup/share-token"    # the fleet's token for peers' share servers (model_fetch)
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"   # Debian's default --collector.textfile.directory
GPU_METRICS = f"{TEXTFILE_DIR}/rigup_gpu.prom"
FETCH_METRICS = f"{TEXTFILE_DIR}/rigup_model_fetch.prom"   # roles/model_fetch's downloads
WATCHDOG_METRICS = f"{TEXTFILE_DIR}/rigup_watchdog.prom"   # roles/watchdog's checks
BURNIN_METRICS = f"{TEXTFILE_DIR}/rigup_burnin.prom"       # roles/burnin's acceptance runs
BURNIN_TESTING = "/run/rigup/burnin-testing.json"          # the bus ids rigup-burnin tests now


def marker_path(dest: str) -> str:
    """The completion marker of the model downloaded to ``dest``."""
    return f"{dest.rstrip('/')}/{MARKER}"


def revision_dir(dest: str, revision: str) -> str:
    """Where a revision change of the model at ``dest`` is fetched, next to it on the same
    filesystem (``/srv/models/.glm@1a2b3c4d5e6f``); ``dest`` becomes a link to it once complete."""
    parent, _, base = dest.rstrip("/").rpartition("/")
    return f"{parent}/.{base}@{revision[:12]}"


def gate_record(data: dict, unit: str) -> str:
    """The health gate's record of ``unit`` (``rigup-llama@NAME.service``), root-owned JSON
    ``{"unit", "tps", "at"}``: ``{rigup_state_dir}/gate/UNIT.json``."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/gate/{unit}.json"


GUARD_SERVICE = "rigup-gpu-guard.service"   # the GPU guard's oneshot check (roles/gpu_guard; its timer starts it)
GUARD_TIMER = "rigup-gpu-guard.timer"
# the other watchers status.py names when they are down (plays/fleet.py WATCHERS; roles/metrics, roles/watchdog)
RELAY_UNIT = "rigup-metrics-relay.service"
WATCHDOG_SERVICE, WATCHDOG_TIMER = "rigup-watchdog.service", "rigup-watchdog.timer"


def guard_file(data: dict) -> str:
    """The GPU guard's tripped file: ``{rigup_state_dir}/gpu-guard.tripped``."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/gpu-guard.tripped"


def xid_file(data: dict) -> str:
    """The GPU guard's Xid state (counts per card and class, suspect cards; status.py reads it):
    ``{rigup_state_dir}/gpu-guard-xid.json``."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/gpu-guard-xid.json"


def burnin_file(data: dict) -> str:
    """rigup-burnin's records, per card UUID (roles/burnin/shipped/acceptance.py):
    ``{rigup_state_dir}/burnin.json``."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/burnin.json"


def burnin_pulse_file(data: dict) -> str:
    """rigup-burnin pulse's record of the host's power delivery (roles/burnin/shipped/acceptance.py):
    ``{rigup_state_dir}/burnin-pulse.json``."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/burnin-pulse.json"


def burnin_copy(name: str) -> Path:
    """The controller's last good copy of host ``name``'s burn-in records (roles/burnin keeps it at
    each preflight; it and status.py judge by it while the host's own do not read):
    ``$RIGUP_CACHE_DIR`` (~/.cache/rigup)/burnin/NAME.json. ``name``, an inventory name, is a name
    or an address (rigup.boundary.fields.host_file) before a path is built from it (``../../x``
    would be a file outside the copies); :class:`~rigup.boundary.core.Unreadable` naming the host otherwise."""
    fields.host_file(name, f"burn-in: the inventory host {str(name)[:60]!r}")
    return Path(os.environ.get("RIGUP_CACHE_DIR") or Path.home() / ".cache" / "rigup") / "burnin" / f"{name}.json"


def bind_scope(address) -> str:
    """What a server bound to ``address`` serves, the one test of every bind: ``"loopback"`` (this
    host only: 127.0.0.0/8, ::1, localhost), ``"wildcard"`` (every interface: 0.0.0.0, ::, ::0,
    0:0:0:0:0:0:0:0, "0", IPv4-mapped forms, "" and "*") or ``"beyond"`` (an address others reach,
    or a host name: whatever it resolves to). An instance bound beyond loopback needs a key or an
    allow-list."""
    text = str(address or "").strip().removeprefix("[").removesuffix("]")
    if text in ("", "*"):
        return "wildcard"
    if text == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        try:   # the other numeric forms a server's getaddrinfo reads: "0", "127.1", "0x7f000001"
            ip = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return "beyond"
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return "wildcard" if ip.is_unspecified else "loopback" if ip.is_loopback else "beyond"


# Backends a serving role puts behind the balancer (roles/balancer reads them): one JSON file per
# replicated instance, {"bind", "port", "servers": [[name, address, port], ...]}.
BALANCER_DIR = "/etc/rigup/balancer"


def balancer_file(backend: str) -> str:
    """The backends file of HAProxy backend ``backend`` (``llama-NAME``)."""
    return f"{BALANCER_DIR}/{backend}.json"


def balancer_drain(data: dict) -> str:
    """The balancer's drain helper (roles/balancer installs it; replicas' units call it):
    ``drain BACKEND SERVER`` before a stop, ``ready BACKEND SERVER PORT`` once started; ``maint`` and
    ``ready`` without a port on a gateway (roll.py)."""
    return f"{str(data['rigup_prefix']).rstrip('/')}/bin/rigup-balancer-drain"
