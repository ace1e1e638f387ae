"""A play for the fleet test of apt (tests/roles/test_base_fleet.py): preflight and base alone."""

from pyinfra import host

from rigup.config import configure
from roles import base, in_order, preflight

cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
