"""Preflight alone: check the configuration, print each host's hardware plan, refuse what
cannot work. Changes nothing.

    pyinfra inventory/lab.py preflight.py
"""

from pyinfra import host

from rigup import summary
from rigup.config import configure
from roles import in_order, preflight

summary.track(host.state)
cfg = configure(host, in_order())
preflight.run(in_order(), cfg)
