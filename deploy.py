"""rigup's play: check every host's configuration and hardware plan, then run the roles in order.

    pyinfra -y inventory/a100.py deploy.py
"""

from pyinfra import host

from roles import base, cuda_toolkit, llama_cpp, llama_server, preflight
from roles.config import check_host

check_host(host)
plan = preflight.run()
base.apply()
cuda_toolkit.apply(plan)
llama_cpp.apply(plan)
llama_server.apply(plan)
