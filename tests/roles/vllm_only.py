"""A play for the vllm lab tests: preflight, base, vllm and the balancer (for replicas) only (no
llama.cpp build, no fetch)."""

from pyinfra import host

from roles import balancer, base, in_order, preflight, vllm
from rigup.config import check_host

check_host(host)
plan = preflight.run(in_order())
base.apply(plan)
vllm.apply(plan)
balancer.apply(plan)
