"""A play for the vllm lab tests: preflight, base, vllm and the balancer (for replicas) only (no
llama.cpp build, no fetch)."""

from pyinfra import host

from roles import balancer, base, in_order, preflight, vllm
from rigup.config import configure

cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
vllm.apply(plan, cfg)
balancer.apply(plan, cfg)
