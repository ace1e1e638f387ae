"""rigup's play: check every host's configuration, then run the roles in order.

    pyinfra -y inventory/a100.py deploy.py
"""

from pyinfra import host

from roles import base
from roles.config import check_host

check_host(host)
base.apply()
