"""A play for the gateway host of the balancer lab test: preflight, base and the balancer only."""

from pyinfra import host

from rigup.config import check_host
from roles import balancer, base, in_order, preflight

check_host(host)
plan = preflight.run(in_order())
base.apply(plan)
balancer.apply(plan)
