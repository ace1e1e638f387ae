"""Example inventory: hosts with 4x NVIDIA H100 80GB HBM3 (seed 001: rented, Ubuntu 24.04).

Copy it, put your hosts' addresses in, then: pyinfra -y inventory/h100.py deploy.py
Data precedence: roles/*/defaults.yml < group_vars/all.yml < group_vars/h100.yml < the host
data below < --data. See it merged with: pyinfra inventory/h100.py debug-inventory
"""

from rigup.config import all_group as _all_group
from rigup.config import group_vars as _group_vars

h100 = (
    [
        # (name, host data): connection settings and anything only this host needs.
        ("h100-01", {"ssh_hostname": "203.0.113.20", "ssh_user": "ubuntu", "_sudo": True}),
        ("h100-02", {"ssh_hostname": "203.0.113.21", "ssh_user": "ubuntu", "_sudo": True}),
    ],
    _group_vars("h100"),
)

all = _all_group(h100)
