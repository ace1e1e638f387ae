"""What a host runs for llama_server, read in one round trip."""

import json
import shlex

from pyinfra.api import FactBase

from roles.llama_server.command import KEY

DROPIN = "/etc/systemd/system/rigup-llama@{}.service.d/rigup.conf"


class LlamaServerState(FactBase):
    """Per instance: the sha256 of its drop-in, whether its key exists, its unit's state, and its
    model's completion marker (``<dest>/.rigup-complete.json``, written by roles/model_fetch)::

        {"glm": {"dropin": "ab12...", "key": True, "active": "active", "enabled": "enabled",
                 "marker": {"repo": ..., "revision": ..., "files": [...], "bytes": ...}}}
    """

    default = dict

    def command(self, instances: dict) -> str:
        parts = []
        for name, marker in sorted(instances.items()):
            q = shlex.quote
            unit = f"rigup-llama@{name}.service"
            parts.append(
                f"echo \"@@ {name}\"; "
                f"echo dropin=$(sha256sum {q(DROPIN.format(name))} 2>/dev/null | cut -c1-64); "
                f"test -s {q(KEY.format(name))} && echo key=1 || echo key=0; "
                f"echo active=$(systemctl is-active {unit} 2>/dev/null); "
                f"echo enabled=$(systemctl is-enabled {unit} 2>/dev/null); "
                f"echo marker=$(cat {q(marker)} 2>/dev/null | tr -d '\\n')"
            )
        return "; ".join(parts) or "true"

    def process(self, output: list[str]) -> dict:
        return parse_state(output)


def parse_state(lines: list[str]) -> dict:
    state: dict = {}
    current = None
    for line in lines:
        if line.startswith("@@ "):
            current = state.setdefault(line[3:].strip(), {"dropin": None, "key": False, "active": None,
                                                           "enabled": None, "marker": None})
            continue
        key, _, value = line.partition("=")
        if current is None:
            continue
        if key == "dropin":
            current["dropin"] = value or None
        elif key == "key":
            current["key"] = value == "1"
        elif key in ("active", "enabled"):
            current[key] = value or None
        elif key == "marker" and value:
            try:
                current["marker"] = json.loads(value)
            except ValueError:
                current["marker"] = None
    return state
