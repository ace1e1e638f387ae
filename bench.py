"""Throughput of every serving instance of the fleet, as the seeds' benchmark tables; reads only.

    pyinfra inventory/mine.py bench.py                                  # levels 1, 4, 8, 16
    pyinfra inventory/mine.py bench.py --data bench_levels='[1,2,4]' --data bench_max_tokens=64

For each host (in parallel), each instance of llama_server_instances and vllm_instances is
measured on the host itself (rigup/throughput.py, sent there and run with its python3: endpoints
on loopback are reached, API keys are read where they live and never leave the host): one warm-up
completion, then at each concurrency level of ``bench_levels`` that many clients sending
``bench_rounds`` completions of ``bench_max_tokens`` tokens each; total and per-request tok/s. A
progress line per host; at the end, on the controller, ``bench_out/<date>/<host>.md`` and
``.json`` and ``fleet.png`` (tok/s against concurrency, one line per host and instance; rigup/bench.py).
Nothing on the hosts changes but a temporary copy of the script, removed after the run.
"""

import time

from pyinfra import host

from rigup import bench
from rigup.config import check_host

check_host(host)
data = host.data.dict()
targets = bench.targets(data)
started = time.monotonic()
measured = host.get_fact(bench.Throughput, targets=targets, levels=list(data["bench_levels"]),
                         max_tokens=data["bench_max_tokens"], rounds=data["bench_rounds"]) if targets else {}
bench.record(host.name, data, measured, targets, time.monotonic() - started)
