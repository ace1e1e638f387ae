"""What a host runs for llama_server, read in one round trip."""

import json
import shlex

from pyinfra.api import FactBase

from rigup.contract.llama_server import DROPIN, PRESET
from rigup.names import BALANCER_DIR
from rigup.nofollow import FUNCTIONS
from rigup.traps import REMEDY_FLAG
from rigup.units import configured, instance_probe, parse_instances
from roles.llama_server.command import KEY



def remedy_flags(text: str | None) -> list[str]:
    """The server flags a passed smoke inference of the serving build recorded (roles/llama_cpp's
    rigup-smoke.json ``server_args``); anything but bare ``--flags`` is ignored."""
    try:
        doc = json.loads(text or "")
    except ValueError:
        return []
    flags = doc.get("server_args") if isinstance(doc, dict) and doc.get("ok") is True else None
    return [f for f in flags if isinstance(f, str) and REMEDY_FLAG.fullmatch(f)] if isinstance(flags, list) else []


class LlamaServerState(FactBase):
    """The llama.cpp build that serves (the target of ``build_link``, llama_cpp's ``current``
    link) and the server flags its smoke inference recorded (``remedy``), the units rigup configured (``units``: names of their drop-in directories), the
    balancer's backends files of llama instances (``backends``), and per unit (``units``: name ->
    [marker, the instance whose key it uses, and for a router {model: marker} of its other
    models]): the sha256 of its drop-in (and a router's preset), whether its key exists,
    its unit's state, and its model's completion marker (rigup.names.marker_path, written by
    roles/model_fetch; a router's others in ``markers``)::

        {"build": "builds/b6123-3f2a...", "remedy": ["--no-repack"], "units": ["glm-0", "glm-1"], "backends": ["llama-glm"],
         "instances": {"glm-0": {"dropin": "ab12...", "key": "1", "active": "active", "enabled": "enabled",
                                 "marker": {"repo": ..., "revision": ..., "files": [...], "bytes": ...}}}}
    """

    default = dict

    def command(self, units: dict, build_link: str) -> str:
        listed = configured("rigup-llama", "llama", BALANCER_DIR) + "; "
        probes = []
        for unit, (marker, key_of, *router) in sorted(units.items()):
            also = router[0] if router else None   # a router's other models: {key: marker}
            files = {"dropin": DROPIN.format(unit), **({"preset": PRESET.format(key_of)} if also else {})}
            probes.append(instance_probe(unit, f"rigup-llama@{unit}.service", files, marker, key=KEY.format(key_of),
                                         also=also))
        link = shlex.quote(build_link)
        return (f"{FUNCTIONS}; echo build=$(readlink {link} 2>/dev/null); "
                f"printf 'smoke=%s\\n' \"$(cat {link}/rigup-smoke.json 2>/dev/null | tr -d '\\n')\"; "
                + listed + "; ".join(probes + ["true"]))

    def process(self, output: list[str]) -> dict:
        head, instances = parse_instances(output)
        return {"build": head.get("build"), "remedy": remedy_flags(head.get("smoke")), "units": (head.get("units") or "").split(),
                "backends": (head.get("backends") or "").split(), "instances": instances}
