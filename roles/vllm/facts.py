"""What a host runs for vllm, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.names import BALANCER_DIR
from rigup.nofollow import FUNCTIONS
from rigup.units import configured, instance_probe, parse_instances
from roles.vllm.command import DROPIN, ENV_FILE, KEY_FILE, STAMP


class VllmState(FactBase):
    """The install stamp of the pin's virtualenv, the units rigup configured (``units``: their
    drop-in directories), the balancer's backends files of vLLM instances (``backends``), and per
    unit the sha256 of its drop-in, environment file and key, its unit's state and its model's
    completion marker::

        {"stamp": "{...}" or None, "units": ["glm-0", "glm-1"], "backends": ["vllm-glm"],
         "instances": {"glm": {"dropin": "ab12...", "env": "cd34...", "active": "active",
                               "enabled": "enabled", "key": "1" or None, "marker": {...}}}}
    """

    default = dict

    def command(self, pin_dir: str, instances: dict) -> str:
        """``instances``: unit -> [marker, the instance whose key it uses] (NAME, or NAME-K)."""
        stamp = f"echo stamp=$(cat {shlex.quote(pin_dir + '/' + STAMP)} 2>/dev/null | tr -d '\\n')"
        return "; ".join([FUNCTIONS, stamp, configured("rigup-vllm", "vllm", BALANCER_DIR)] + [
            instance_probe(unit, f"rigup-vllm@{unit}.service",
                           {"dropin": DROPIN.format(unit), "env": ENV_FILE.format(unit)}, marker,
                           key=KEY_FILE.format(name))
            for unit, (marker, name) in sorted(instances.items())])

    def process(self, output: list[str]) -> dict:
        return parse_state(output)


def parse_state(lines: list[str]) -> dict:
    head, instances = parse_instances(lines)
    return {"stamp": head.get("stamp"), "units": (head.get("units") or "").split(),
            "backends": (head.get("backends") or "").split(), "instances": instances}
