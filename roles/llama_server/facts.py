"""What a host runs for llama_server, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.units import instance_probe, parse_instances
from roles.llama_server.command import KEY

DROPIN = "/etc/systemd/system/rigup-llama@{}.service.d/rigup.conf"


class LlamaServerState(FactBase):
    """Per instance: the sha256 of its drop-in, whether its key exists, its unit's state, and its
    model's completion marker (``<dest>/.rigup-complete.json``, written by roles/model_fetch)::

        {"glm": {"dropin": "ab12...", "key": "1", "active": "active", "enabled": "enabled",
                 "marker": {"repo": ..., "revision": ..., "files": [...], "bytes": ...}}}
    """

    default = dict

    def command(self, instances: dict) -> str:
        key = "test -s {} && echo key=1 || echo key="
        return "; ".join(
            instance_probe(name, f"rigup-llama@{name}.service", {"dropin": DROPIN.format(name)}, marker,
                           extra=key.format(shlex.quote(KEY.format(name))))
            for name, marker in sorted(instances.items())) or "true"

    def process(self, output: list[str]) -> dict:
        return parse_instances(output)[1]
