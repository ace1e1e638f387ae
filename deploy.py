"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra -y inventory/a100.py deploy.py
"""

from pyinfra import host

from roles import base, preflight
from roles.config import check_host

check_host(host)
preflight.run()
base.apply()
