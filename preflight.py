"""Preflight alone: check the configuration, print each host's hardware plan, refuse what
cannot work. Changes nothing.

    pyinfra inventory/lab.py preflight.py
"""

from pyinfra import host

from rigup import summary
from rigup.config import configure, host_only
from roles import in_order, preflight

summary.track(host.state)
with host_only(host):   # a configuration error fails this host, named, not the run
    preflight.run(in_order(), configure(host, in_order()))
