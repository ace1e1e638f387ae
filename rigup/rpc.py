"""llama.cpp RPC across hosts, what roles/llama_server (the head) and roles/rpc_worker (the
workers) agree on: the worker unit's name, which hosts are whose workers (read from every host's
instances, rigup.instances.llama_server ``normalised``: no role imports another), each worker's
address and port, and the head's wait for its workers (an ExecStartPre) as one argv.

The RPC protocol has no authentication and is bound to the llama.cpp version: workers bind their
inventory address only, admit only their heads (nftables), and build the head's llama.cpp ref.
"""

from __future__ import annotations

from rigup.boundary.fields import host_ip

RPC_UNIT = "rigup-rpc.service"
RPC_TARGET = "ggml-rpc-server"      # llama.cpp's target and binary (rpc-server before the rename)
# Measured on 2x H200 (loopback, an 8B-shaped F16 model; issue 19): RPC is for models that do not fit.
RPC_COST = "RPC costs about 0.8-0.9x the tok/s of a local split (0.89x at 1 request, 0.80x at 8) and a slower load"

# The head's ExecStartPre: each worker "ADDRESS:PORT" must accept a TCP connection (opened and
# closed, nothing sent: the RPC server reads a command) before $0 seconds pass; else it says which.
_WAIT = ('end=$((SECONDS+$0)); for a; do until timeout 5 bash -c ": <>/dev/tcp/${a%:*}/${a##*:}" 2>/dev/null; do '
         'if [ "$SECONDS" -ge "$end" ]; then echo "rigup: RPC worker $a does not answer (waited $0 s; '
         'is rigup-rpc running there?)" >&2; exit 1; fi; sleep 1; done; done')


def rpc_workers(data: dict) -> dict[str, list[str]]:
    """{instance: [worker host, ...]} of a host's llama-server instances with ``rpc_workers``
    (its instances, rigup.instances.llama_server ``normalised``: an entry not of its form is
    preflight's to refuse, and is skipped here)."""
    # here, not at the top: roles/llama_server/command.py (wait_argv) loads without pyinfra (tests/gpu),
    # and the instances' form reads rigup.config, which imports it
    from rigup.instances.llama_server import normalised
    return {name: [str(w) for w in inst["rpc_workers"]] for name, inst in normalised(data).items() if inst["rpc_workers"]}


def heads_of(me: str, hosts: dict[str, dict]) -> list[str]:
    """The hosts (``hosts``: name -> data, the inventory) with an instance naming ``me`` a worker."""
    return sorted(name for name, data in hosts.items() if name != me
                  and any(me in workers for workers in rpc_workers(data).values()))


def address(name: str, data: dict) -> str:
    """The inventory address of host ``name``: its ``ssh_hostname``, else its name."""
    return str(data.get("ssh_hostname") or name)


def port(data: dict) -> int:
    """The RPC port of a worker (``rpc_worker_port``, roles/rpc_worker/defaults.yml: every host's
    data holds it through group_vars all), typed: a head-only run configures no worker (round 10 G3:
    ``True`` was port 1, ``"٥٠٠٥٢"`` 50052); ConfigError naming the worker and the key."""
    from rigup.config import peer_value   # here: roles/llama_server/command.py imports this module without pyinfra
    return peer_value(data, "rpc_worker_port")


def endpoint(name: str, data: dict) -> str:
    """``ADDRESS:PORT`` of worker ``name`` (with its ``data``), as ``--rpc`` takes it."""
    return f"{address(name, data)}:{port(data)}"


def wait_argv(endpoints: list[str], seconds: int) -> list[str]:
    """The head's ExecStartPre: waits at most ``seconds`` for each worker endpoint to answer."""
    return ["/bin/bash", "-c", _WAIT, str(seconds), *endpoints]


def ref_problem(me: str, my_data: dict, other: str, other_data: dict) -> str | None:
    """Why ``me`` and ``other`` cannot talk RPC (the protocol is version-bound): they build another
    ``llama_cpp_ref`` (roles/llama_cpp); None when they build the same."""
    mine, theirs = my_data.get("llama_cpp_ref"), other_data.get("llama_cpp_ref")
    if mine == theirs:
        return None
    return f"{me} builds llama.cpp {mine} (llama_cpp_ref) and {other} builds {theirs}: the RPC protocol is version-bound"


def ip_problem(name: str, data: dict) -> str | None:
    """Why host ``name``'s inventory address cannot be used by RPC (the allow-list and the bind
    take IP addresses), or None."""
    if not host_ip(str(address(name, data))):   # an IPv6 zone (fe80::1%x ...) is no address nft takes
        return (f"{name}'s inventory address {address(name, data)!r} is not one host's IP address (the RPC bind and "
                "allow-list take one); set its ssh_hostname to its private IP address")
    return None
