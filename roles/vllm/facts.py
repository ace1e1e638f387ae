"""What a host runs for vllm, read in one round trip."""

import json
import shlex

from pyinfra.api import FactBase

from roles.vllm.command import DROPIN, ENV_FILE, STAMP


class VllmState(FactBase):
    """The install stamp of the pin's virtualenv, and per instance the sha256 of its drop-in and
    environment file, its unit's state and its model's completion marker::

        {"stamp": "{...}" or None,
         "instances": {"glm": {"dropin": "ab12...", "env": "cd34...", "active": "active",
                               "enabled": "enabled", "marker": {...}}}}
    """

    default = dict

    def command(self, pin_dir: str, instances: dict) -> str:
        q = shlex.quote
        parts = [f"echo stamp=$(cat {q(pin_dir + '/' + STAMP)} 2>/dev/null | tr -d '\\n')"]
        for name, marker in sorted(instances.items()):
            unit = f"rigup-vllm@{name}.service"
            parts.append(
                f"echo \"@@ {name}\"; "
                f"echo dropin=$(sha256sum {q(DROPIN.format(name))} 2>/dev/null | cut -c1-64); "
                f"echo env=$(sha256sum {q(ENV_FILE.format(name))} 2>/dev/null | cut -c1-64); "
                f"echo active=$(systemctl is-active {unit} 2>/dev/null); "
                f"echo enabled=$(systemctl is-enabled {unit} 2>/dev/null); "
                f"echo marker=$(cat {q(marker)} 2>/dev/null | tr -d '\\n')")
        return "; ".join(parts)

    def process(self, output: list[str]) -> dict:
        return parse_state(output)


def parse_state(lines: list[str]) -> dict:
    state: dict = {"stamp": None, "instances": {}}
    current = None
    for line in lines:
        if line.startswith("@@ "):
            current = state["instances"].setdefault(line[3:].strip(), {
                "dropin": None, "env": None, "active": None, "enabled": None, "marker": None})
            continue
        key, _, value = line.partition("=")
        if current is None:
            if key == "stamp":
                state["stamp"] = value or None
            continue
        if key in ("dropin", "env", "active", "enabled"):
            current[key] = value or None
        elif key == "marker" and value:
            try:
                current["marker"] = json.loads(value)
            except ValueError:
                current["marker"] = None
    return state
