"""What a host has of the balancer, read in one round trip."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigup.boundary.core import Unreadable, loads
from rigup.names import BALANCER_DIR
from roles.balancer.config import GATEWAY_KEY, STATE_DROPIN

CONFIG = "/etc/haproxy/haproxy.cfg"
PACKAGES = ("haproxy", "socat")
MARK = "Installed by rigup (roles/balancer)"   # the first line of the config it writes


class BalancerState(FactBase):
    """The sha256 of haproxy.cfg, of a gateway's key file, of the drain helper and of haproxy.service's
    server-state drop-in (config.STATE_DROPIN), HAProxy's unit state, the packages missing, and the
    backends files of the serving roles (rigup.names.balancer_file)::

        {"cfg": "ab12...", "key": "ef56...", "ours": "1", "drain": "cd34...", "dropin": "0a9b...",
         "active": "active", "enabled": "enabled",
         "missing": ["socat"], "backends": {"llama-glm": {"bind": ..., "port": ..., "servers": [...]}}}
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
            f"for f in {q(BALANCER_DIR)}/*.json; do [ -f \"$f\" ] && echo \"backend=$(basename \"$f\" .json) "
            "$(tr -d '\\n' < \"$f\")\"; done; true"])

    def process(self, output: list[str]) -> dict:
        out: dict = {"backends": {}}
        for line in output:
            key, _, value = line.partition("=")
            if key == "backend":
                name, _, text = value.partition(" ")
                try:   # the boundary's parser: nesting past the stack is Unreadable, not a RecursionError
                    out["backends"][name] = loads(text, f"{BALANCER_DIR}/{name}.json")
                except Unreadable:
                    continue  # half-written: the next converge reads it whole
            else:
                out[key] = value.split() if key == "missing" else (value or None)
        return out
