"""What a host runs for vllm, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.units import instance_probe, parse_instances
from roles.vllm.command import DROPIN, ENV_FILE, KEY_FILE, STAMP


class VllmState(FactBase):
    """The install stamp of the pin's virtualenv, and per instance the sha256 of its drop-in and
    environment file, its unit's state and its model's completion marker::

        {"stamp": "{...}" or None,
         "instances": {"glm": {"dropin": "ab12...", "env": "cd34...", "active": "active",
                               "enabled": "enabled", "key": "1" or None, "marker": {...}}}}
    """

    default = dict

    def command(self, pin_dir: str, instances: dict) -> str:
        stamp = f"echo stamp=$(cat {shlex.quote(pin_dir + '/' + STAMP)} 2>/dev/null | tr -d '\\n')"
        return "; ".join([stamp] + [
            instance_probe(name, f"rigup-vllm@{name}.service",
                           {"dropin": DROPIN.format(name), "env": ENV_FILE.format(name)}, marker,
                           key=KEY_FILE.format(name))
            for name, marker in sorted(instances.items())])

    def process(self, output: list[str]) -> dict:
        return parse_state(output)


def parse_state(lines: list[str]) -> dict:
    head, instances = parse_instances(lines)
    return {"stamp": head.get("stamp"), "instances": instances}
