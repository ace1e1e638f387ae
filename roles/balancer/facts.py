"""What a host has of the balancer, read in one round trip."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigup.boundary.core import Unreadable, loads
from rigup.boundary.numbers import json_whole
from rigup.names import BALANCER_DIR
from rigup.text import shown
from roles.balancer.config import GATEWAY_KEY, STATE_DROPIN

CONFIG = "/etc/haproxy/haproxy.cfg"
PACKAGES = ("haproxy", "socat")
MARK = "Installed by rigup (roles/balancer)"   # the first line of the config it writes
LIMITS = ("slots", "queue", "wait_s")           # a queued router's (roles/llama_server command.queue_limits)
MAX_SERVERS = 1024


def backends_record(doc: object, where: str) -> dict:
    """A backends file (rigup.serving.backends_file) as rigup writes it, or :class:`Unreadable`
    naming ``where``: a map of ``bind`` (text), ``port`` (a JSON int 1-65535), ``servers`` (a list
    of [unit, address, port]: text, text, a JSON int 1-65535) and a queued router's :data:`LIMITS`
    (JSON ints 1 to 2**20 - 1), no other key (``allow`` would open a held path, ``route`` reroute a
    frontend). It was taken as any JSON: [1, 2], a map without servers or a server [["h1"]] ended the
    balancer's operation in a TypeError, KeyError or IndexError naming no file (issue 61, round 9 B1).
    Names and addresses are checked as HAProxy takes them by config.problems and haproxy_cfg."""
    if not isinstance(doc, dict):
        raise Unreadable(where, f"not a map of bind, port and servers but {type(doc).__name__}")
    if set(doc) - {"bind", "port", "servers", *LIMITS} or not {"bind", "port", "servers"} <= set(doc):
        raise Unreadable(where, f"its keys {sorted(map(str, doc))[:10]!r} are not bind, port, servers and the "
                                f"limits {', '.join(LIMITS)}")
    servers = doc["servers"]
    if not isinstance(doc["bind"], str) or json_whole(doc["port"], 65535, 1) is None:
        raise Unreadable(where, f"bind {doc['bind']!r:.80} port {doc['port']!r:.40}: not an address and a port")
    if not isinstance(servers, list) or len(servers) > MAX_SERVERS:
        raise Unreadable(where, f"servers is not a list of at most {MAX_SERVERS} servers")
    for server in servers:
        if not (isinstance(server, list) and len(server) == 3 and isinstance(server[0], str)
                and isinstance(server[1], str) and json_whole(server[2], 65535, 1) is not None):
            raise Unreadable(where, f"a server {server!r:.120} is not [unit, address, port]")
    for key in LIMITS:
        if key in doc and json_whole(doc[key], (1 << 20) - 1, 1) is None:
            raise Unreadable(where, f"{key} {doc[key]!r:.40} is not a count")
    return {"bind": doc["bind"], "port": doc["port"], "servers": [list(s) for s in servers],
            **{k: doc[k] for k in LIMITS if k in doc}}


class BalancerState(FactBase):
    """The sha256 of haproxy.cfg, of a gateway's key file, of the drain helper and of haproxy.service's
    server-state drop-in (config.STATE_DROPIN), HAProxy's unit state, the packages missing, and the
    backends files of the serving roles (rigup.names.balancer_file)::

        {"cfg": "ab12...", "key": "ef56...", "ours": "1", "drain": "cd34...", "dropin": "0a9b...",
         "active": "active", "enabled": "enabled",
         "missing": ["socat"], "backends": {"llama-glm": {"bind": ..., "port": ..., "servers": [...]}}}

    A backends file not of its form (:func:`backends_record`) is ``{"refused": why}``, which
    config.problems refuses, naming the file.
    """

    default = dict

    def command(self, drain: str) -> str:
        q = shlex.quote
        return "; ".join([
            f"echo cfg=$(sha256sum {CONFIG} 2>/dev/null | cut -c1-64)",
            f"echo key=$(sha256sum {GATEWAY_KEY} 2>/dev/null | cut -c1-64)",
            f"echo ours=$(grep -qF {q(MARK)} {CONFIG} 2>/dev/null && echo 1)",
            f"echo drain=$(sha256sum {q(drain)} 2>/dev/null | cut -c1-64)",
            f"echo dropin=$(sha256sum {STATE_DROPIN} 2>/dev/null | cut -c1-64)",
            "echo active=$(systemctl is-active haproxy 2>/dev/null)",
            "echo enabled=$(systemctl is-enabled haproxy 2>/dev/null)",
            "echo missing=$(for p in " + " ".join(PACKAGES) + "; do dpkg-query -W -f='${Status}\\n' $p 2>/dev/null "
            "| grep -q 'ok installed' || echo $p; done)",
            f"for f in {q(BALANCER_DIR)}/*.json; do [ -f \"$f\" ] && printf '%s\\n' \"backend=$(basename \"$f\" .json) "
            "$(tr -d '\\n' < \"$f\")\"; done; true"])   # printf, never echo of a file's text (round 14 E2)

    def process(self, output: list[str]) -> dict:
        out: dict = {"backends": {}}
        for line in output:
            key, _, value = line.partition("=")
            if key == "backend":
                name, _, text = value.partition(" ")
                where = f"{BALANCER_DIR}/{shown(name, 120)}.json"   # a file's name: host text
                try:   # the boundary's parser: nesting past the stack is Unreadable, not a RecursionError
                    doc = loads(text, where)
                except Unreadable:
                    continue  # half-written: the next converge reads it whole
                try:   # one not of the form: refused by config.problems, naming the file
                    out["backends"][name] = backends_record(doc, where)
                except Unreadable as e:
                    out["backends"][name] = {"refused": str(e)}
            else:
                out[key] = value.split() if key == "missing" else (value or None)
        return out
