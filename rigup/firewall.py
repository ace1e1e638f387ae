"""nftables allow-lists of the services whose protocol has no authentication (llama.cpp's RPC
worker, Ray's ports): one table per service (``inet <table>``, its file under /etc/rigup) that
admits only the listed addresses to its TCP ports and resets every other connection to them; the
host's other traffic is untouched. The file is checked (``nft -c -f``) before it replaces the live
one and is loaded again on a change; loading it twice gives the same table. The unit of the
service loads it (``ExecStartPre=+/usr/sbin/nft -f FILE``) before it listens, at every boot.

:func:`text` is pure (unit tests render it); :func:`allowed` is the operation.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from rigup.secrets import written
from rigup.state import read_once, reading
from rigup.templates import render


def port_set(ports: list[int | tuple[int, int]]) -> str:
    """nft's set elements of ``ports``: ints, and ``(low, high)`` ranges, e.g. ``6379, 10002-10101``."""
    return ", ".join(f"{int(p[0])}-{int(p[1])}" if isinstance(p, tuple) else str(int(p)) for p in ports)


def text(table: str, ports: list[int | tuple[int, int]], sources: list[str], owner: str, who: str,
         loopback: bool = False) -> str:
    """The nftables file of table ``inet table``: only ``sources`` (IP addresses; and the loopback
    interface with ``loopback``) reach ``ports`` over TCP, others get a TCP reset. ``owner`` and
    ``who`` are named in its header comment."""
    ips = {ipaddress.ip_address(s) for s in sources}
    return render("firewall.nft.j2", table=table, ports=port_set(ports), owner=owner, who=who, loopback=loopback,
                  v4=sorted(str(a) for a in ips if a.version == 4), v6=sorted(str(a) for a in ips if a.version == 6))


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def removed(path: str, table: str) -> str:
    """A shell command that deletes table ``inet table`` and its file ``path`` (none there: nothing)."""
    return f"rm -f {shlex.quote(path)}; nft delete table inet {shlex.quote(table)} 2>/dev/null"


class Firewall(FactBase):
    """The allow-list file's sha256 and whether its table is loaded::

        {"sha": "ab12..", "loaded": True}
    """

    default = dict

    def command(self, path: str, table: str) -> str:
        return (f"echo sha=$(sha256sum {shlex.quote(path)} 2>/dev/null | cut -c1-64); "
                f"nft list table inet {shlex.quote(table)} >/dev/null 2>&1 && echo loaded=1 || echo loaded=")

    def process(self, output: list[str]) -> dict:
        found = dict(line.partition("=")[::2] for line in output if "=" in line)
        return {"sha": found.get("sha", ""), "loaded": found.get("loaded") == "1"}


@reading(Firewall, "path", "table")
@operation()
def allowed(path: str, table: str, text: str):
    """The allow-list ``text`` at ``path`` and its table ``inet table`` loaded: a new text is
    written beside it, checked by ``nft -c -f``, and only then moved over the live file and loaded."""
    state = read_once(Firewall, path=path, table=table)
    if state.get("sha") == _sha(text) and state.get("loaded"):
        host.noop(f"the allow-list is loaded (inet {table})")
        return
    q, candidate = shlex.quote, f"{path}.candidate"
    yield f"mkdir -p {q(path.rsplit('/', 1)[0])}"
    yield written(candidate, text, "644")
    yield f"nft -c -f {q(candidate)} && mv {q(candidate)} {q(path)} && nft -f {q(path)}"
