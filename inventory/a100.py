"""Example inventory: hosts with 8x NVIDIA A100-SXM4-80GB (seed 000: rented, Ubuntu 24.04).

Copy it (inventory/mine.py), put your hosts in, and run pyinfra from the checkout:
    pyinfra inventory/mine.py debug-inventory    # each host's groups and merged data
    pyinfra inventory/mine.py deploy.py --dry    # the plan, nothing changed; then without --dry

Groups: ``a100`` below and the file's own, ``mine`` for mine.py (pyinfra's); each loads
group_vars/<group>.yml, then <site>/group_vars/<group>.yml over it (a site directory of your own:
RIGUP_SITE=~/rigup-site, or ``all_group(globals(), site="~/rigup-site")``). Data precedence,
lowest first: roles/*/defaults.yml < group_vars/all.yml < <site>/group_vars/all.yml < the groups
in the order this file defines them, the file's own group last (a host in two groups gets the
later one's value) < host data < --data.
"""

from rigup.config import all_group as _all_group

a100 = [
    # (name, host data): how pyinfra reaches the host (Ansible's names in brackets), and anything
    # only this host needs.
    ("a100-01", {
        "ssh_hostname": "203.0.113.10",   # its address (ansible_host)
        "ssh_user": "ubuntu",             # (ansible_user)
        "ssh_key": "~/.ssh/id_ed25519",   # (ansible_ssh_private_key_file); left out: ssh-agent, ~/.ssh/id_*
        "ssh_port": 22,                   # (ansible_port)
        "_sudo": True,                    # operations run with sudo (become: true); pyinfra asks
    }),                                   # for the password if sudo wants one
    ("a100-02", {"ssh_hostname": "203.0.113.11", "ssh_user": "ubuntu", "ssh_key": "~/.ssh/id_ed25519",
                 "ssh_port": 22, "_sudo": True}),
]
# A host of the list in another group, by name: Prometheus on a100-01, scraping every host here
# (roles/metrics; group_vars/monitoring.yml).
# monitoring = ["a100-01"]

all = _all_group(globals())   # the last line: every host of every group above, with group_vars/all.yml
