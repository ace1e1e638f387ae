"""Example inventory: a rack of ex-mining rigs, each with 6x NVIDIA CMP 170HX (seeds 002, 003).

Copy it, put your rigs' addresses in, then: pyinfra -y inventory/cmp170hx.py deploy.py
Data precedence: roles/*/defaults.yml < group_vars/all.yml < group_vars/cmp170hx.yml < the
host data below < --data. See it merged with: pyinfra inventory/cmp170hx.py debug-inventory
"""

from rigup.config import all_group as _all_group
from rigup.config import group_vars as _group_vars

cmp170hx = (
    [
        ("rig-01", {"ssh_hostname": "192.0.2.31", "ssh_user": "miner", "_sudo": True}),
        ("rig-02", {"ssh_hostname": "192.0.2.32", "ssh_user": "miner", "_sudo": True}),
        ("rig-03", {"ssh_hostname": "192.0.2.33", "ssh_user": "miner", "_sudo": True}),
    ],
    _group_vars("cmp170hx"),
)

all = _all_group(cmp170hx)
