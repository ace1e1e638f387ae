"""The running lab hosts (`make lab-up`), read from the lab's state file.

Each host is a Debian 12 container booted with systemd, reached over real SSH as root with the
lab's key and known_hosts (strict host key checking). Hosts join the group of their GPU profile
(a100, h100, cmp170hx, none; hgx-h100 in h100), so group_vars/<profile>.yml applies, and then the group ``lab``,
whose settings (group_vars/lab.yml, and the lab's own source mirror) win over the profile's: of
two groups, the one defined later in this file wins (pyinfra's order; rigup/config.py).
"""

import json as _json
import os as _os
from pathlib import Path as _Path

from rigup.config import all_group as _all_group

# The same default as tests/lab/lab.py: RIGUP_LAB_ID names a second lab on the same machine.
_STATE = _Path(_os.environ.get("RIGUP_LAB_DIR", "/var/lib/rigup-lab" + _os.environ.get("RIGUP_LAB_ID", ""))) / "lab.json"
_lab = _json.loads(_STATE.read_text()) if _STATE.exists() else {"hosts": []}
# RIGUP_LAB_HOST_DATA='{"lab1": {...}}': host data of lab hosts (a lab test's recipe, which every
# host of the run sees, e.g. a gateway reading the other hosts' instances; --data would set it on
# the gateway too).
_HOST_DATA = _json.loads(_os.environ.get("RIGUP_LAB_HOST_DATA") or "{}")


def _host(h):
    return (h["name"], {
        "ssh_hostname": h["address"],
        "ssh_user": "root",
        "ssh_key": _lab["ssh_key"],
        "ssh_known_hosts_file": _lab["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        **_HOST_DATA.get(h["name"], {}),
    })


def _profile_group(profile):
    return [_host(h) for h in _lab["hosts"] if h["profile"] == profile]


a100 = _profile_group("a100")
h100 = _profile_group("h100") + _profile_group("hgx-h100")   # an HGX H100 board is an h100 host
cmp170hx = _profile_group("cmp170hx")
none = _profile_group("none")
# Defined after the profiles, so it wins: the lab's file server and model hub on its gateway
# (tests/lab/sources.py, tests/lab/hub.py), under group_vars/lab.yml.
lab = ([_host(h) for h in _lab["hosts"]], {
    "llama_cpp_source": f"http://{_lab.get('gateway')}:8000/llama.cpp.git",
    "hf_endpoint": f"http://{_lab.get('gateway')}:8090",
    # builds handed between lab hosts (roles/llama_cpp/handover.py): kept for the lab's life
    "llama_cpp_artifacts": str(_STATE.parent / "artifacts"),
    "hf_endpoint_insecure": True,                    # the lab hub is http:// on the lab's own network
    # (its https origin, https://GATEWAY with the lab CA's certificate, is for the tests of the
    # token's path, which set hf_endpoint to it and hf_endpoint_insecure: false)
})

# RIGUP_LAB_GATEWAYS=lab3 (names, comma-separated) puts lab hosts in the group `gateway`
# (group_vars/gateway.yml: HAProxy over the other hosts' endpoints, roles/balancer).
_gateways = _os.environ.get("RIGUP_LAB_GATEWAYS", "").split(",")
gateway = [_host(h) for h in _lab["hosts"] if h["name"] in _gateways]

# RIGUP_LAB_MAINTENANCE=lab4 (names, comma-separated) puts lab hosts in maintenance (rigup_maintenance).
_maintenance = _os.environ.get("RIGUP_LAB_MAINTENANCE", "").split(",")
maintenance = ([_host(h) for h in _lab["hosts"] if h["name"] in _maintenance], {"rigup_maintenance": True})

all = _all_group(globals())
