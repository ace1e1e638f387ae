"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra inventory/a100.py deploy.py

A host that preflight refuses runs no role: nothing on it is read beyond preflight's facts, and
nothing changes. A host another controller converges is refused, naming it (rigup/lock.py).
A role found converged registers no operation (rigup/probe.py): a no-op converge of a host logs
one line for it.
"""

from pyinfra import host

from rigup import lock, probe, summary
from rigup.config import configure, host_only
from roles import STEPS, in_order, preflight, steps

summary.track(host.state)
roles = in_order()
with host_only(host):   # a configuration error fails this host, named, not the run
    cfg = configure(host, roles)   # validated, with what the hub says of its models
    refused = lock.hold(host)
    plan = preflight.run(roles, cfg, [refused] if refused else [])
    if host not in host.state.failed_hosts:
        # Each role's operation calls are recorded and checked against the host's state first: the
        # roles found converged register no operation; from the first role with a change on, every
        # call is handed to pyinfra, each ordered by its step and its own lines (rigup/probe.py)
        probe.converge(steps(), plan, cfg, list(STEPS))
