"""A play for the CUDA-without-a-GPU test: deploy.py's roles up to cuda_toolkit, no build."""

from pyinfra import host

from roles import base, cuda_toolkit, preflight
from rigup.config import check_host

check_host(host)
plan = preflight.run()
base.apply(plan)
cuda_toolkit.apply(plan)
