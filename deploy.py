"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra -y inventory/a100.py deploy.py
"""

from pyinfra import host

from roles import (base, cmpunlocker, cuda_toolkit, gpu_guard, gpu_power, llama_cpp, llama_server, model_fetch,
                   preflight, vllm)
from rigup.config import check_host

check_host(host)
plan = preflight.run()
base.apply(plan)
cuda_toolkit.apply(plan)
llama_cpp.apply(plan)
model_fetch.apply(plan)
gpu_power.apply(plan)
gpu_guard.apply(plan)
cmpunlocker.apply(plan)
llama_server.apply(plan)
vllm.apply(plan)
