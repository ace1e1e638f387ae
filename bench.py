"""Throughput of every serving instance of the fleet, as the seeds' benchmark tables; reads only.

    pyinfra inventory/mine.py bench.py                                  # levels 1, 4, 8, 16
    pyinfra inventory/mine.py bench.py --data bench_levels='[1,2,4]' --data bench_max_tokens=64

For each host (in parallel), each instance of llama_server_instances and vllm_instances is
measured on the host itself (shipped/throughput.py, sent there and run with its python3: endpoints
on loopback are reached, API keys are read where they live and never leave the host): one warm-up
completion, then at each concurrency level of ``bench_levels`` that many clients sending
``bench_rounds`` completions of ``bench_max_tokens`` tokens each; total and per-request tok/s. An
instance with replicas is measured through the balancer (its host:port) and each replica on its
own. Then llama-bench of the build ``current`` points to (``llama_cpp_dir``) on each llama-server
instance's model: ``bench_llama_tests`` (pp512, pp4096, tg128), ``bench_llama_reps`` repetitions,
each test stopped after ``bench_llama_timeout_s`` (the report says so). It loads the model a second
time beside the running server: mind the VRAM on a full card. When the serving build's smoke
inference met the CPU repack trap (``current/rigup-smoke.json``: ``cpu-repack-crash``,
``--no-repack``), llama-bench runs with ``--repack 0`` and the report says
``trap cpu-repack-crash: --repack 0``. A test that ends on a signal is named
(``llama-bench crashed (SIGSEGV) on pp512``), the other tests still run; a ppN test that crashed
on one of the trap's signals while repacking runs once more with ``--repack 0``, and the report
names the trap and asks for a rebuilt, proven llama.cpp on the host. A progress line per host; at the
end, on the controller, ``bench_out/<date>/<host>.md`` and ``.json`` and ``fleet.png`` (tok/s
against concurrency, one line per host and instance; plays/bench.py, drawn by plays/charts.py). Nothing
on the hosts changes but a temporary copy of the script, removed after the run.
"""

import time

from pyinfra import host

from plays import bench, charts
from rigup.config import check_host, host_only

with host_only(host):   # a configuration error fails this host, named, not the run
    data = check_host(host)   # the host's configuration (rigup.config.Config)
    current = f"{str(data['llama_cpp_dir']).rstrip('/')}/current"
    binary = f"{current}/bin/llama-bench"
    seen = host.get_fact(bench.Serving, markers=sorted(set(bench.model_markers(data).values())), binary=binary,
                         smoke=f"{current}/rigup-smoke.json")
    targets = bench.targets(data, seen["units"])
    runs = bench.llama_runs(data, seen) if data["bench_llama_tests"] else []
    started = time.monotonic()
    measured = host.get_fact(bench.Throughput, targets=targets, levels=list(data["bench_levels"]),
                             max_tokens=data["bench_max_tokens"], rounds=data["bench_rounds"]) if targets else {}
    ready = [r for r in runs if not r.get("error")]
    benched = host.get_fact(bench.LlamaBench, runs=ready, binary=binary, tests=list(data["bench_llama_tests"]),
                            reps=data["bench_llama_reps"], timeout=data["bench_llama_timeout_s"]) if ready else {}
    bench.record(host, data, measured, targets, time.monotonic() - started, bench.llama_results(runs, benched),
                 plot=charts.plot)
