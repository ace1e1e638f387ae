"""Plan mode of roles/gpu_power: print each host's cards, their power limits and what the policy
(gpu_power_watts, gpu_power_overrides, gpu_power_clocks, gpu_power_persistence) would change.
Changes nothing: it only reads (nvidia-smi --query-gpu), never -pl, -pm or -lgc.

    pyinfra inventory/lab.py power_plan.py --data gpu_power_watts=180
"""

from pyinfra import host

from roles import gpu_power
from rigup.config import check_host

gpu_power.show_plan(check_host(host))
