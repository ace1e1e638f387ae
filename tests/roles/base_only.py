"""A play for the fleet test of apt (tests/roles/test_base_fleet.py): preflight and base alone."""

from pyinfra import host

from rigup.config import check_host
from roles import base, in_order, preflight

check_host(host)
plan = preflight.run(in_order())
base.apply(plan)
