"""The RPC worker's command line, unit and nftables allow-list, as pure functions:
roles/rpc_worker installs them; a unit test renders them for a 2-GPU machine (loopback)."""

from __future__ import annotations

from rigup.boundary.formats import systemd_env, systemd_quote, unit_comment
from rigup.rpc import RPC_TARGET
from rigup.templates import render

FIREWALL = "/etc/rigup/rpc.nft"
TABLE = "rigup_rpc"


def argv(binary_dir: str, bind: str, port: int) -> list[str]:
    """ggml-rpc-server bound to ``bind``:``port`` (every device it finds: GPUs, else the CPU)."""
    return [f"{binary_dir}/{RPC_TARGET}", "-H", bind, "-p", str(port)]


def firewall_text(port: int, heads: list[str]) -> str:
    """The nftables table admitting only ``heads`` (IP addresses) to ``port``, rejecting the rest
    with a TCP reset; loading it again replaces the table (never adds rules twice)."""
    from rigup import firewall   # here: rigup/firewall.py holds pyinfra operations too, and tests/gpu/rpc.py loads this module without pyinfra

    return firewall.text(TABLE, [port], heads, "roles/rpc_worker", "the heads")


def unit_text(binary_dir: str, bind: str, port: int, heads: list[str], user: str, guard_file: str,
              build: str, cuda_devices: str | None) -> str:
    """rigup-rpc.service: the worker under ``user``, hardened as the serving units, its allow-list
    loaded (with full privileges) before it listens; ``build`` (the llama.cpp build that ``current``
    points to) is named in a comment so that a new build restarts it."""
    env = [systemd_env("CUDA_VISIBLE_DEVICES", cuda_devices)] if cuda_devices else []
    return render("rpc_worker-unit.service.j2", heads=unit_comment(", ".join(heads), "the RPC worker's heads"),
                  build=unit_comment(build, "the RPC worker's llama.cpp build"), firewall=FIREWALL,
                  guard_file=guard_file, user=user, env=env,
                  argv=[systemd_quote(a) for a in argv(binary_dir, bind, port)])
