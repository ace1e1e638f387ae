"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra inventory/a100.py deploy.py

A host that preflight refuses runs no role: nothing on it is read beyond preflight's facts, and
nothing changes.
"""

from pyinfra import host

from rigup import summary
from rigup.config import check_host
from roles import in_order, preflight

summary.track(host.state)
check_host(host)
roles = in_order()
plan = preflight.run(roles)
if host not in host.state.failed_hosts:
    for role in roles:
        role.apply(plan)
