"""Example inventory: hosts with 4x NVIDIA H100 80GB HBM3 (seed 001: rented, Ubuntu 24.04).

Copied and used as inventory/a100.py says (its host entries, groups and data precedence too):
the hosts below load group_vars/h100.yml, then the file's own group's (group_vars/mine.yml for a
copy named mine.py), each with <site>/group_vars/ over it; host data and --data win over both.
"""

from rigup.config import all_group as _all_group

h100 = [
    ("h100-01", {"ssh_hostname": "203.0.113.20", "ssh_user": "ubuntu", "ssh_key": "~/.ssh/id_ed25519",
                 "ssh_port": 22, "_sudo": True}),
    ("h100-02", {"ssh_hostname": "203.0.113.21", "ssh_user": "ubuntu", "ssh_key": "~/.ssh/id_ed25519",
                 "ssh_port": 22, "_sudo": True}),
]

all = _all_group(globals())   # the last line: every host of every group above, with group_vars/all.yml
