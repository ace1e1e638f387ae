"""A play for the CUDA-without-a-GPU test: deploy.py's roles up to cuda_toolkit, no build."""

from pyinfra import host

from rigup.config import check_host
from roles import base, cuda_toolkit, in_order, preflight

check_host(host)
plan = preflight.run(in_order())
base.apply(plan)
cuda_toolkit.apply(plan)
