"""roles/rpc_worker: llama.cpp's RPC server (``ggml-rpc-server``) on the hosts that some host's
llama-server instance names in ``rpc_workers`` (its heads), so that one model's layers span hosts.

What it does to a worker host (a host no instance names gets nothing, and loses a worker it ran):
- Debian's ``nftables``, and the table ``inet rigup_rpc`` (/etc/rigup/rpc.nft): only the heads'
  inventory addresses reach the RPC port, others get a TCP reset (the protocol has no
  authentication). The file is checked (``nft -c -f``) before it replaces the live one, and loaded
  again on a change; rigup-rpc loads it (with full privileges) before it listens, at every boot;
- ``rigup-rpc.service``: the llama.cpp build ``current`` points to (roles/llama_cpp), bound to
  the host's inventory address (ssh_hostname), never a wildcard; hardened as the serving units;
  restarted only when its unit (flags, heads, build) changed.
The heads wait for their workers before they start (roles/llama_server), and preflight refuses a
worker that builds another llama.cpp ref than its head (the protocol is version-bound).

Variables (roles/rpc_worker/defaults.yml): rpc_worker_port, rpc_worker_cuda_devices; and
llama_cpp_dir (roles/llama_cpp), rigup_user (roles/base), every host's llama_server_instances
and ssh_hostname (the inventory).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, deploy
from rigup.role import Role
from rigup.probe import operation

from rigup import apt, firewall
from rigup.gpu.plan import Plan
from rigup.config import Config, fleet_data, role_defaults
from rigup.names import guard_file
from rigup.rpc import RPC_UNIT, address, heads_of
from rigup.state import read_once, reading
from rigup.units import keyed, service_commands, unit_state
from roles.rpc_worker.checks import CHECKS, FLEET_CHECKS, ports
from roles.rpc_worker.command import FIREWALL, TABLE, firewall_text, unit_text

__all__ = ["apply", "CHECKS", "FLEET_CHECKS", "ports", "smoke_runs"]

UNIT = f"/etc/systemd/system/{RPC_UNIT}"


class RpcWorkerState(FactBase):
    """The worker's files (sha256), whether the rigup table is loaded, its unit's state and the
    build ``build_link`` points to::

        {"unit": "ab12..", "firewall": "cd34..", "loaded": True, "active": "active",
         "enabled": "enabled", "build": "builds/lab-base-1a2b.."}
    """

    default = dict

    def command(self, build_link: str) -> str:
        q = shlex.quote
        return "; ".join([*unit_state(UNIT, RPC_UNIT),
                          keyed("firewall", f"sha256sum {q(FIREWALL)} 2>/dev/null | cut -c1-64"),
                          f"nft list table inet {TABLE} >/dev/null 2>&1 && echo loaded=1 || echo loaded=",
                          keyed("build", f"readlink {q(build_link)} 2>/dev/null")])   # printf: round 14 E1

    def process(self, output: list[str]) -> dict:
        found = dict(line.partition("=")[::2] for line in output if "=" in line)
        return {**found, "loaded": found.get("loaded") == "1"}



@reading(RpcWorkerState, "build_link")
@operation()
def server(data: Config, heads: list[str], build_link: str):
    """rigup-rpc.service with its current unit, enabled and running; restarted when the unit
    (flags, heads, the build ``build_link`` points to) changed."""
    state = read_once(RpcWorkerState, build_link=build_link)
    text = unit_text(f"{build_link}/bin", address(host.name, data), int(data["rpc_worker_port"]), heads,
                     data["rigup_user"], guard_file(data), state.get("build") or "none",
                     data["rpc_worker_cuda_devices"])
    yield from service_commands(UNIT, RPC_UNIT, text, state, f"{RPC_UNIT} runs for {', '.join(heads)}")


@reading(RpcWorkerState, "build_link")
@operation()
def retired(build_link: str):
    """A worker no instance names any more: its unit stopped and removed, its table deleted."""
    state = read_once(RpcWorkerState, build_link=build_link)
    if not state.get("unit") and not state.get("firewall") and not state["loaded"]:
        host.noop("no RPC worker here")
        return
    yield (f"systemctl disable --now {RPC_UNIT} 2>/dev/null; rm -f {shlex.quote(UNIT)}; "
           f"{firewall.removed(FIREWALL, TABLE)}; systemctl daemon-reload")


@deploy("rpc_worker", data_defaults=role_defaults("rpc_worker"))
def apply(plan: Plan, data: Config):
    build_link = f"{data['llama_cpp_dir']}/current"
    if not plan.get("systemd", True):
        return      # preflight refuses a worker without systemd
    fleet = fleet_data(host)
    heads = heads_of(host.name, fleet)
    if not heads:
        retired(name="rpc_worker: no instance names this host a worker", build_link=build_link)
    else:
        apt.installed(name="rpc_worker: nftables", packages=["nftables"], cache_seconds=data["apt_cache_seconds"],
                      _retries=2, _retry_delay=data["apt_retry_delay"])
        firewall.allowed(name=f"rpc_worker: only {', '.join(heads)} reach port {data['rpc_worker_port']}",
                         path=FIREWALL, table=TABLE,
                         text=firewall_text(int(data["rpc_worker_port"]), [address(h, fleet[h]) for h in heads]))
        server(name=f"rpc_worker: {RPC_UNIT} on {address(host.name, data)}:{data['rpc_worker_port']}", data=data,
               heads=heads, build_link=build_link)
    workers_started(name="rpc_worker: workers started")


def smoke_runs(plan: Plan, data: Config, fleet) -> list[dict]:
    """A worker's new llama.cpp build is tried as a worker before it serves (roles/llama_cpp's
    smoke): its ggml-rpc-server on a loopback port, with the devices the unit gives it, and the
    same build's llama-server offloading every layer of the tiny model to it."""
    if not heads_of(host.name if fleet is None else fleet.me, fleet.hosts if fleet else {}):
        return []
    devices = data["rpc_worker_cuda_devices"]
    env = {"CUDA_VISIBLE_DEVICES": str(devices)} if devices else {}
    return [{"name": "rpc-server", "rpc": True, "args": ["-ngl", "99"], "env": env}]


@operation()
def workers_started():
    """Nothing to do: an operation every host of the run has, so that pyinfra (which orders each
    host's operations and merges the hosts') starts every worker before any head starts (a head
    waits for its workers: started after them, it would wait for a worker not yet started)."""
    host.noop("RPC workers started")
    yield from ()


ROLE = Role("rpc_worker", apply, checks=CHECKS, fleet_checks=FLEET_CHECKS, ports=ports, smoke_runs=smoke_runs)
