"""What a host runs for llama_server, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.names import BALANCER_DIR
from rigup.units import configured, instance_probe, parse_instances
from roles.llama_server.command import KEY

DROPIN = "/etc/systemd/system/rigup-llama@{}.service.d/rigup.conf"


class LlamaServerState(FactBase):
    """The llama.cpp build that serves (the target of ``build_link``, llama_cpp's ``current``
    link), the units rigup configured (``units``: names of their drop-in directories), the
    balancer's backends files of llama instances (``backends``), and per unit (``units``: name ->
    [marker, the instance whose key it uses]): the sha256 of its drop-in, whether its key exists,
    its unit's state, and its model's completion marker (rigup.names.marker_path, written by
    roles/model_fetch)::

        {"build": "builds/b6123-3f2a...", "units": ["glm-0", "glm-1"], "backends": ["llama-glm"],
         "instances": {"glm-0": {"dropin": "ab12...", "key": "1", "active": "active", "enabled": "enabled",
                                 "marker": {"repo": ..., "revision": ..., "files": [...], "bytes": ...}}}}
    """

    default = dict

    def command(self, units: dict, build_link: str) -> str:
        listed = configured("rigup-llama", "llama", BALANCER_DIR) + "; "
        probes = [instance_probe(unit, f"rigup-llama@{unit}.service", {"dropin": DROPIN.format(unit)}, marker,
                                 key=KEY.format(key_of)) for unit, (marker, key_of) in sorted(units.items())]
        return f"echo build=$(readlink {shlex.quote(build_link)} 2>/dev/null); " + listed + "; ".join(probes + ["true"])

    def process(self, output: list[str]) -> dict:
        head, instances = parse_instances(output)
        return {"build": head.get("build"), "units": (head.get("units") or "").split(),
                "backends": (head.get("backends") or "").split(), "instances": instances}
