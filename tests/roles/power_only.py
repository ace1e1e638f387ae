"""A play for the gpu_power, gpu_guard, cmpunlocker and burnin tests: deploy.py's preflight and
base, then those four roles in deploy.py's order (no CUDA, no llama.cpp build, no serving)."""

from pyinfra import host

from roles import base, burnin, cmpunlocker, gpu_guard, gpu_power, in_order, preflight
from rigup.config import configure

cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
gpu_power.apply(plan, cfg)
gpu_guard.apply(plan, cfg)
cmpunlocker.apply(plan, cfg)
burnin.apply(plan, cfg)
