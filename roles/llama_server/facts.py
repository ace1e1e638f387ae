"""What a host runs for llama_server, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.units import instance_probe, parse_instances
from roles.llama_server.command import KEY

DROPIN = "/etc/systemd/system/rigup-llama@{}.service.d/rigup.conf"


class LlamaServerState(FactBase):
    """The llama.cpp build that serves (the target of ``build_link``, llama_cpp's ``current``
    link), and per instance: the sha256 of its drop-in, whether its key exists, its unit's state,
    and its model's completion marker (rigup.names.marker_path, written by roles/model_fetch)::

        {"build": "builds/b6123-3f2a...",
         "instances": {"glm": {"dropin": "ab12...", "key": "1", "active": "active", "enabled": "enabled",
                               "marker": {"repo": ..., "revision": ..., "files": [...], "bytes": ...}}}}
    """

    default = dict

    def command(self, instances: dict, build_link: str) -> str:
        return f"echo build=$(readlink {shlex.quote(build_link)} 2>/dev/null); " + "; ".join(
            instance_probe(name, f"rigup-llama@{name}.service", {"dropin": DROPIN.format(name)}, marker,
                           key=KEY.format(name))
            for name, marker in sorted(instances.items())) or "true"

    def process(self, output: list[str]) -> dict:
        head, instances = parse_instances(output)
        return {"build": head.get("build"), "instances": instances}
