"""A play for the gateway host of the balancer lab test: preflight, base and the balancer only."""

from pyinfra import host

from rigup.config import configure
from roles import balancer, base, in_order, preflight

cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
balancer.apply(plan, cfg)
