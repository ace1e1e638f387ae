"""nftables allow-lists of the services whose protocol has no authentication (llama.cpp's RPC
worker, Ray's ports): one table per service (``inet <table>``, its file under /etc/rigup) that
admits only the listed addresses to its TCP ports and resets every other connection to them; the
host's other traffic is untouched. The file is checked (``nft -c -f``) before it replaces the live
one and is loaded again on a change; loading it twice gives the same table. The unit of the
service loads it (``ExecStartPre=+/usr/sbin/nft -f FILE``) before it listens, at every boot and
every restart: rigup's own units say so themselves; a unit a Debian package owns gets a drop-in
(:func:`dropin`) that says it. A flushed ruleset (``nft flush ruleset``, nftables.service's
/etc/nftables.conf) takes the table away until the unit's next start or the next converge.

:func:`text` is pure (unit tests render it); :func:`allowed` and :func:`dropped` are the operations.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex

from pyinfra import host
from pyinfra.api import FactBase
from rigup.probe import operation

from rigup.boundary.formats import nft_address, nft_comment, nft_name, systemd_quote
from rigup.boundary.numbers import json_whole
from rigup.secrets import written
from rigup.state import read_once, reading
from rigup.templates import render


def port_set(ports: list[int | tuple[int, int]]) -> str:
    """nft's set elements of ``ports``: ints, and ``(low, high)`` ranges, e.g. ``6379, 10002-10101``.
    The writer checks its own ports (a bool is an int to Python, ``int()`` takes text): each a TCP
    port, an int 1..65535, a range's low at most its high; a ValueError otherwise."""
    def port(p) -> int:
        if not json_whole(p, 65535):   # None (no int of 0..65535: a bool, text, a float) or port 0
            raise ValueError(f"an nftables set of ports: {str(p)[:40]!r} is no TCP port (an int 1..65535)")
        return p

    def element(p) -> str:
        if not isinstance(p, tuple):
            return str(port(p))
        if len(p) != 2 or port(p[0]) > port(p[1]):
            raise ValueError(f"an nftables set of ports: {str(p)[:60]!r} is no range (low, high) of ports")
        return f"{p[0]}-{p[1]}"

    return ", ".join(element(p) for p in ports)


def text(table: str, ports: list[int | tuple[int, int]], sources: list[str], owner: str, who: str,
         loopback: bool = False) -> str:
    """The nftables file of table ``inet table``: only ``sources`` (IP addresses; and the loopback
    interface with ``loopback``) reach ``ports`` over TCP, others get a TCP reset. ``owner`` and
    ``who`` are named in its header comment. Each address through nft_address: an IPv6 zone (which
    ipaddress keeps verbatim, a newline and a rule with it), a name or a network is a ValueError."""
    ips = {ipaddress.ip_address(nft_address(s, f"inet {table}: an allowed address")) for s in sources}
    header = nft_comment(f"Installed by rigup ({owner}): only {who} reach TCP port(s) {port_set(ports)}.",
                         f"inet {table}")
    return render("firewall.nft.j2", table=nft_name(table, "an nftables table"), ports=port_set(ports), header=header,
                  loopback=loopback, v4=sorted(str(a) for a in ips if a.version == 4),
                  v6=sorted(str(a) for a in ips if a.version == 6))


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def removed(path: str, table: str) -> str:
    """A shell command that deletes table ``inet table`` and its file ``path`` (none there: nothing)."""
    return f"rm -f {shlex.quote(path)}; nft delete table inet {shlex.quote(table)} 2>/dev/null"


def dropin(unit: str) -> str:
    """The drop-in through which ``unit`` (a Debian package's) loads its allow-list."""
    return f"/etc/systemd/system/{unit}.d/rigup-allow-list.conf"


def dropin_text(path: str) -> str:
    """The drop-in that loads the allow-list ``path`` before each start of its unit."""
    return render("firewall-dropin.conf.j2", path=systemd_quote(path))


class Firewall(FactBase):
    """The allow-list file's sha256, whether its table is loaded, and the sha256 of the drop-in
    of each of ``units`` (empty: none)::

        {"sha": "ab12..", "loaded": True, "dropins": {"prometheus.service": "cd34.."}}
    """

    default = dict

    def command(self, path: str, table: str, units: tuple[str, ...] = ()) -> str:
        self.units = list(units)
        q = shlex.quote
        return "; ".join([f"echo sha=$(sha256sum {q(path)} 2>/dev/null | cut -c1-64)",
                          f"nft list table inet {q(table)} >/dev/null 2>&1 && echo loaded=1 || echo loaded=",
                          *(f"echo {q(f'dropin {u}')}=$(sha256sum {q(dropin(u))} 2>/dev/null | cut -c1-64)"
                            for u in units)])

    def process(self, output: list[str]) -> dict:
        found = dict(line.partition("=")[::2] for line in output if "=" in line)
        return {"sha": found.get("sha", ""), "loaded": found.get("loaded") == "1",
                "dropins": {u: found.get(f"dropin {u}", "") for u in getattr(self, "units", [])}}


@reading(Firewall, "path", "table", "units")
@operation()
def allowed(path: str, table: str, text: str, units: tuple[str, ...] = ()):
    """The allow-list ``text`` at ``path`` and its table ``inet table`` loaded: a new text is
    written beside it, checked by ``nft -c -f``, and only then moved over the live file and loaded.
    Each of ``units`` (Debian's, whose unit files rigup does not write) gets the drop-in that loads
    it before each start; the table is live already, so a new drop-in restarts nothing."""
    state = read_once(Firewall, path=path, table=table, units=units)
    want = dropin_text(path)
    stale = [u for u in units if state["dropins"].get(u) != _sha(want)]
    if state.get("sha") == _sha(text) and state.get("loaded") and not stale:
        host.noop(f"the allow-list is loaded (inet {table})")
        return
    q, candidate = shlex.quote, f"{path}.candidate"
    if state.get("sha") != _sha(text) or not state.get("loaded"):
        yield f"mkdir -p {q(path.rsplit('/', 1)[0])}"
        yield written(candidate, text, "644")
        yield f"nft -c -f {q(candidate)} && mv {q(candidate)} {q(path)} && nft -f {q(path)}"
    for unit in stale:
        yield f"mkdir -p {q(dropin(unit).rsplit('/', 1)[0])}"
        yield written(dropin(unit), want, "644")
    if stale:
        yield "systemctl daemon-reload"


@reading(Firewall, "path", "table", "units")
@operation()
def dropped(path: str, table: str, units: tuple[str, ...] = ()):
    """No allow-list wanted (its listeners gone, or back on loopback): table ``inet table``, its
    file ``path`` and the drop-ins of ``units`` removed; nothing when none is there."""
    state = read_once(Firewall, path=path, table=table, units=units)
    there = [u for u in units if state["dropins"].get(u)]
    if not state.get("sha") and not state.get("loaded") and not there:
        host.noop(f"no allow-list (inet {table})")
        return
    q = shlex.quote
    yield "; ".join([*(f"rm -f {q(dropin(u))}; rmdir {q(dropin(u).rsplit('/', 1)[0])} 2>/dev/null" for u in there),
                     removed(path, table), *(["systemctl daemon-reload"] if there else ["true"])])
