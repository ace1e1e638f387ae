"""Preflight alone: check the configuration, print each host's hardware plan, refuse what
cannot work. Changes nothing.

    pyinfra inventory/lab.py preflight.py
"""

from pyinfra import host

from rigup import summary
from rigup.config import check_host
from roles import in_order, preflight

summary.track(host.state)
check_host(host)
preflight.run(in_order())
