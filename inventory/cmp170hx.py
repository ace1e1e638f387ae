"""Example inventory: a rack of ex-mining rigs, each with 6x NVIDIA CMP 170HX (seeds 002, 003).

Copied and used as inventory/a100.py says (its host entries, groups and data precedence too):
the hosts below load group_vars/cmp170hx.yml, then the file's own group's (group_vars/mine.yml for a
copy named mine.py), each with <site>/group_vars/ over it; host data and --data win over both.
"""

from rigup.config import all_group as _all_group

cmp170hx = [
    ("rig-01", {"ssh_hostname": "192.0.2.31", "ssh_user": "miner", "ssh_key": "~/.ssh/id_ed25519",
                "ssh_port": 22, "_sudo": True}),
    ("rig-02", {"ssh_hostname": "192.0.2.32", "ssh_user": "miner", "ssh_key": "~/.ssh/id_ed25519",
                "ssh_port": 22, "_sudo": True}),
    ("rig-03", {"ssh_hostname": "192.0.2.33", "ssh_user": "miner", "ssh_key": "~/.ssh/id_ed25519",
                "ssh_port": 22, "_sudo": True}),
]

all = _all_group(globals())   # the last line: every host of every group above, with group_vars/all.yml
