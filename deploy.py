"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra inventory/a100.py deploy.py

A host that preflight refuses runs no role: nothing on it is read beyond preflight's facts, and
nothing changes. A host another controller converges is refused, naming it (rigup/lock.py).
"""

from pyinfra import host

from rigup import lock, summary
from rigup.config import check_host
from roles import in_order, preflight, steps

summary.track(host.state)
check_host(host)
roles = in_order()
refused = lock.hold(host)
plan = preflight.run(roles, [refused] if refused else [])
if host not in host.state.failed_hosts:
    # pyinfra knows an operation across hosts by the line numbers of its call stack: without the
    # step's index (host.loop), two roles' operations on the same line of their own files would be
    # one operation, and hosts running different roles an ordering cycle
    for step in host.loop(steps()):
        step(plan)
