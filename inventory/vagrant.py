"""Inventory for the two VMs of the project's Vagrantfile, through pyinfra's @vagrant connector.

    vagrant up && pyinfra -y inventory/vagrant.py deploy.py

The VMs have no GPU: GPU roles see none and skip, or refuse in preflight.
"""

from rigup.config import all_group as _all_group
from rigup.config import group_vars as _group_vars

vagrant = (["@vagrant/rigup-vm1", "@vagrant/rigup-vm2"], {"_sudo": True, **_group_vars("vagrant")})

all = _all_group(vagrant)
