"""A play for the CUDA-without-a-GPU test: deploy.py's roles up to cuda_toolkit, no build."""

from pyinfra import host

from rigup.config import configure
from roles import base, cuda_toolkit, in_order, preflight

cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
cuda_toolkit.apply(plan, cfg)
