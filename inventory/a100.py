"""Example inventory: hosts with 8x NVIDIA A100-SXM4-80GB (seed 000: rented, Ubuntu 24.04).

Copy it, put your hosts' addresses in, then: pyinfra -y inventory/a100.py deploy.py
Data precedence: roles/*/defaults.yml < group_vars/all.yml < group_vars/a100.yml < the host
data below < --data. See it merged with: pyinfra inventory/a100.py debug-inventory
"""

from rigup.config import all_group as _all_group
from rigup.config import group_vars as _group_vars

a100 = (
    [
        # (name, host data): connection settings and anything only this host needs.
        ("a100-01", {"ssh_hostname": "203.0.113.10", "ssh_user": "ubuntu", "_sudo": True}),
        ("a100-02", {"ssh_hostname": "203.0.113.11", "ssh_user": "ubuntu", "_sudo": True}),
    ],
    _group_vars("a100"),
)
# Prometheus on one of them, scraping every host here (roles/metrics; group_vars/monitoring.yml):
# monitoring = ([("a100-01", {"ssh_hostname": "203.0.113.10", "ssh_user": "ubuntu", "_sudo": True})],
#               _group_vars("monitoring"))

all = _all_group(a100)
