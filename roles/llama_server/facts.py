"""What a host runs for llama_server, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup import traps
from rigup.boundary import Unreadable, results
from rigup.config import ROLES_DIR
from rigup.contract.llama_server import DROPIN, FIXED, PRESET, held_off_flags
from rigup.names import BALANCER_DIR
from rigup.nofollow import FUNCTIONS
from rigup.units import configured, instance_probe, parse_instances
from roles.llama_server.command import KEY

# The flags a build's smoke may hand the instances: the server_flag remedies of roles/llama_cpp's
# catalogue (the smoke tries no other), less any flag rigup writes itself or llama_server_allow
# holds off (a smoke record naming --slots would open /slots on a host that does not allow it)
REMEDIES = frozenset(t.remedy.value for t in traps.load(ROLES_DIR / "llama_cpp" / "traps.yml")
                     if t.remedy.kind == "server_flag") - set(held_off_flags()) - set(FIXED)


def remedy_flags(text: str | None) -> list[str]:
    """The server flags a passed smoke inference of the serving build recorded (roles/llama_cpp's
    rigup-smoke.json ``server_args``), read through rigup.boundary.results.smoke, the one reader of
    that record (one it refuses, or a failed smoke, gives none), and only those of :data:`REMEDIES`."""
    try:
        doc = results.smoke(text, "rigup-smoke.json") if text else None
    except Unreadable:   # the build's smoke is unknown: roles/llama_cpp runs it again
        return []
    return [f for f in doc.get("server_args") or [] if f in REMEDIES] if doc and doc["ok"] else []


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
        return (f"{FUNCTIONS}; printf 'build=%s\\n' \"$(readlink {link} 2>/dev/null)\"; "
                f"printf 'smoke=%s\\n' \"$(cat {link}/rigup-smoke.json 2>/dev/null | tr -d '\\n')\"; "
                + listed + "; ".join(probes + ["true"]))

    def process(self, output: list[str]) -> dict:
        head, instances = parse_instances(output)
        return {"build": head.get("build"), "remedy": remedy_flags(head.get("smoke")), "units": (head.get("units") or "").split(),
                "backends": (head.get("backends") or "").split(), "instances": instances}
