"""vLLM across hosts with Ray: one Ray node per host (``rigup-ray.service``), the head's vLLM
instances started only once every expected node has joined.

- ``vllm_ray_role: head`` runs ``ray start --head``; ``worker`` runs ``ray start --address`` of its
  head (``vllm_ray_head``: the head's inventory name). The cluster is read from every host's data
  (no host lists its peers twice): a head's workers are the hosts whose ``vllm_ray_head`` names it.
- Ray from PyPI at ``vllm_ray_version`` (pip's own configuration applies: proxy, index), in the
  vLLM virtualenv of the pin; every host of a cluster runs the same Ray and vLLM (checks.py refuses
  otherwise: Ray refuses peers of another version).
- Each node advertises its inventory address (``--node-ip-address``; ``vllm_host_ip`` when set),
  the dashboard is off unless ``vllm_ray_dashboard``, and then bound to that address
  (``--dashboard-host``), never 0.0.0.0.
- Ray's own servers (GCS, raylet, object manager, agents, workers) listen on every interface
  whatever the flags say (Ray 2.52 has no bind option) and have no authentication: every port Ray
  opens is pinned (``vllm_ray_port``; ``vllm_ray_node_port`` and the 5 after it; the worker range
  ``vllm_ray_worker_ports``; the dashboard's when on), and the nftables table ``inet rigup_ray``
  (/etc/rigup/ray.nft, rigup/firewall.py) admits only the cluster's node addresses (and loopback)
  to them, others get a TCP reset; rigup-ray loads it before Ray starts. Outside the list: the
  NCCL/Gloo ports vLLM's own workers open (random ports): the cluster network must be private.
- The node's environment is the vLLM instances' (HOME, caches, NCCL/Gloo knobs, vllm_env) with
  ``VLLM_HOST_IP`` set to the node's address and ``RAY_TMPDIR`` under its state directory, where
  the head's vLLM instance (``RAY_ADDRESS``) finds the local node's sockets.
- A worker waits (ExecStartPre, bounded by ``vllm_ray_wait_seconds``) for its head; the head's
  vLLM instance waits the same way for every expected node, naming those missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shlex

from pyinfra import host
from pyinfra.api import FactBase
from rigup.probe import operation

from rigup import firewall
from rigup.boundary.formats import systemd_env, systemd_quote
from rigup.rpc import address
from rigup.state import read_once, reading
from rigup.templates import render
from rigup.units import service_commands, unit_state
from roles.vllm.command import RAY_DIR

if TYPE_CHECKING:
    from rigup.config import Config

RAY_UNIT = "rigup-ray.service"
UNIT = f"/etc/systemd/system/{RAY_UNIT}"
FIREWALL, TABLE = "/etc/rigup/ray.nft", "rigup_ray"
# The `ray start` flags of the ports pinned at vllm_ray_node_port, +1, ... in this order.
# No --ray-client-server-port: the Ray client server needs ray[client] (`ray start` refuses the
# flag without it) and the minimal Ray installed here starts none.
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
              "--runtime-env-agent-port")


def node_ip(name: str, data: Config) -> str:
    """The address host ``name`` (with ``data``) gives Ray: ``vllm_host_ip``, else its inventory address."""
    return str(data.get("vllm_host_ip") or address(name, data))


def workers_of(me: str, hosts: dict[str, dict]) -> list[str]:
    """The hosts (``hosts``: name -> data) that are Ray workers of head ``me``."""
    return sorted(name for name, data in hosts.items() if name != me and data.get("vllm_ray_role") == "worker"
                  and data.get("vllm_ray_head") == me)


def gcs(head: str, hosts: dict[str, dict]) -> str:
    """``ADDRESS:PORT`` of head ``head``'s Ray GCS."""
    return f"{node_ip(head, hosts[head])}:{int(hosts[head]['vllm_ray_port'])}"


def head_of(me: str, data: Config) -> str:
    """The head of host ``me``'s cluster: itself, or its ``vllm_ray_head``."""
    return me if data.get("vllm_ray_role") == "head" else str(data.get("vllm_ray_head"))


def expected(head: str, hosts: dict[str, dict]) -> list[str]:
    """Every node address of head ``head``'s cluster, the head first."""
    return [node_ip(head, hosts[head])] + [node_ip(w, hosts[w]) for w in workers_of(head, hosts)]


def wait_argv(venv: str, script: str, gcs_address: str, seconds: int, nodes: list[str]) -> list[str]:
    """An ExecStartPre that waits at most ``seconds`` for the Ray cluster at ``gcs_address`` to
    show every address of ``nodes`` alive; else fails naming the missing ones."""
    return [f"{venv}/bin/python", script, gcs_address, str(seconds), *nodes]


def port_flags(data: Config) -> list[str]:
    """The `ray start` flags that pin every port of a node: ``vllm_ray_node_port`` and the ones
    after it (:data:`NODE_PORTS`), and the workers' range ``vllm_ray_worker_ports``."""
    base, (low, high) = int(data["vllm_ray_node_port"]), data["vllm_ray_worker_ports"]
    flags = [a for i, flag in enumerate(NODE_PORTS) for a in (flag, str(base + i))]
    return flags + ["--min-worker-port", str(int(low)), "--max-worker-port", str(int(high))]


def node_ports(data: Config) -> list[int | tuple[int, int]]:
    """Every TCP port a node with ``data`` opens for Ray: the GCS's, the pinned block, the
    workers' range, and the dashboard's when it is on."""
    base, (low, high) = int(data["vllm_ray_node_port"]), data["vllm_ray_worker_ports"]
    found = [int(data["vllm_ray_port"]), (base, base + len(NODE_PORTS) - 1), (int(low), int(high))]
    return found + ([int(data["vllm_ray_dashboard_port"])] if data.get("vllm_ray_dashboard") else [])


def firewall_text(me: str, hosts: dict[str, dict]) -> str:
    """Host ``me``'s allow-list: only its cluster's node addresses (and loopback) reach its Ray ports."""
    head = head_of(me, hosts[me])
    return firewall.text(TABLE, node_ports(hosts[me]), expected(head, hosts), "roles/vllm",
                         f"the Ray nodes of {head}'s cluster", loopback=True)


def argv(me: str, hosts: dict[str, dict], venv: str) -> list[str]:
    """``ray start --block`` for host ``me``: the head (GCS port, dashboard off or on its address)
    or a worker of its head; the node's address and every port given, usage stats off, then
    ``vllm_ray_args``."""
    data = hosts[me]
    ip = node_ip(me, data)
    args = [f"{venv}/bin/ray", "start", "--block", "--node-ip-address", ip, "--disable-usage-stats",
            *port_flags(data)]
    if data["vllm_ray_role"] == "head":
        args += ["--head", "--port", str(int(data["vllm_ray_port"]))]
        if data["vllm_ray_dashboard"]:
            args += ["--include-dashboard=true", "--dashboard-host", ip,
                     "--dashboard-port", str(int(data["vllm_ray_dashboard_port"]))]
        else:
            args += ["--include-dashboard=false"]
    else:
        args += ["--address", gcs(head_of(me, data), hosts)]
    return args + [str(a) for a in data.get("vllm_ray_args") or []]


def unit_text(me: str, hosts: dict[str, dict], venv: str, env: dict[str, str], user: str, guard_file: str,
              script: str) -> str:
    """rigup-ray.service for host ``me``: its ``ray start`` under ``user``, its environment, and
    for a worker the bounded wait for its head; names the Ray version (a new one restarts it)."""
    data = hosts[me]
    head = head_of(me, data)
    wait = (wait_argv(venv, script, gcs(head, hosts), int(data["vllm_ray_wait_seconds"]), [node_ip(head, hosts[head])])
            if head != me else None)
    return render("vllm-ray.service.j2", role=data["vllm_ray_role"], head=head, version=data["vllm_ray_version"],
                  user=user, guard_file=guard_file, firewall=FIREWALL,
                  env=[systemd_env(k, v) for k, v in env.items()],
                  wait=[systemd_quote(a) for a in wait] if wait else None,
                  argv=[systemd_quote(a) for a in argv(me, hosts, venv)])


def node_env(env: dict[str, str], ip: str) -> dict[str, str]:
    """The node's environment: the vLLM instances' (``env``), its address, Ray's temp dir, no usage stats."""
    return {**env, "VLLM_HOST_IP": ip, "RAY_TMPDIR": RAY_DIR, "RAY_USAGE_STATS_ENABLED": "0"}


def instance_env(me: str, hosts: dict[str, dict]) -> dict[str, str]:
    """What the head's vLLM instance adds to its environment: the cluster, Ray's temp dir, its address."""
    return {"RAY_ADDRESS": gcs(me, hosts), "RAY_TMPDIR": RAY_DIR, "VLLM_HOST_IP": node_ip(me, hosts[me])}


class RayState(FactBase):
    """The Ray node's unit (sha256), its state and the Ray version in ``venv``::

        {"unit": "ab12..", "active": "active", "enabled": "enabled", "ray": "2.52.1"}
    """

    default = dict

    def command(self, venv: str) -> str:
        q = shlex.quote
        return "; ".join([*unit_state(UNIT, RAY_UNIT),
                          # the dist-info's name, not an import of ray (a second or more)
                          f"echo ray=$(ls -d {q(venv)}/lib/python*/site-packages/ray-*.dist-info 2>/dev/null "
                          "| sed -n 's/.*ray-\\(.*\\)\\.dist-info/\\1/p' | head -1)"])

    def process(self, output: list[str]) -> dict:
        return dict(line.partition("=")[::2] for line in output if "=" in line)



@reading(RayState, "venv")
@operation()
def installed(venv: str, version: str):
    """Ray ``version`` from PyPI in the vLLM virtualenv ``venv`` (pip's configuration applies)."""
    state = read_once(RayState, venv=venv)
    if state.get("ray") == version:
        host.noop(f"ray {version} is in {venv}")
        return
    yield f"{shlex.quote(venv)}/bin/pip install -q --disable-pip-version-check {shlex.quote(f'ray=={version}')} 2>&1"


@reading(RayState, "venv")
@operation()
def node(venv: str, text: str):
    """rigup-ray.service with ``text``, enabled and running; restarted when the unit (flags,
    cluster, Ray version, environment) changed."""
    state = read_once(RayState, venv=venv)
    yield from service_commands(UNIT, RAY_UNIT, text, state, f"{RAY_UNIT} runs")


@operation()
def retired():
    """No Ray node wanted here (preflight saw its unit): rigup-ray stopped, its unit and allow-list removed."""
    yield (f"systemctl disable --now {RAY_UNIT} 2>/dev/null; rm -f {shlex.quote(UNIT)}; "
           f"{firewall.removed(FIREWALL, TABLE)}; systemctl daemon-reload")


@operation()
def nodes_started():
    """Nothing to do: an operation every host of the run has, so that every Ray node is (re)started
    before any head's vLLM instance starts (it waits for them)."""
    host.noop("Ray nodes started")
    yield from ()
