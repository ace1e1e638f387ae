"""A play for lab tests of preflight's plan alone: it reads the hosts and prints and refuses,
changing nothing (tests/roles/test_rpc_plan.py)."""

from pyinfra import host

from rigup.config import configure
from roles import in_order, preflight

cfg = configure(host, in_order())
preflight.run(in_order(), cfg)
