"""A play for lab tests of preflight's plan alone: it reads the hosts and prints and refuses,
changing nothing (tests/roles/test_rpc_plan.py)."""

from pyinfra import host

from rigup.config import check_host
from roles import in_order, preflight

check_host(host)
preflight.run(in_order())
