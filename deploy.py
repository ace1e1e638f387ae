"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra inventory/a100.py deploy.py

A host that preflight refuses runs no role: nothing on it is read beyond preflight's facts, and
nothing changes. A host another controller converges is refused, naming it (rigup/lock.py).
"""

from pyinfra import host

from rigup import lock, summary
from rigup.config import check_host
from rigup.refusal import Refusal
from roles import in_order, preflight, steps

summary.track(host.state)
check_host(host)
roles = in_order()
holder = lock.hold(host)
plan = preflight.run(roles, [Refusal("another controller converges this host", f"{holder} holds its lock",
                                     "wait for that run to end, or stop it", "lock")] if holder else [])
if host not in host.state.failed_hosts:
    # pyinfra knows an operation across hosts by the line numbers of its call stack: without the
    # step's index (host.loop), two roles' operations on the same line of their own files would be
    # one operation, and hosts running different roles an ordering cycle
    for step in host.loop(steps()):
        step(plan)
