"""A play for the CMP 170HX runbook's lab test (docs/cmp170hx.md): deploy.py's preflight and base,
then the roles a CMP vLLM rig runs, in deploy.py's order: gpu_power, gpu_guard, cmpunlocker,
llama_server, vllm (no CUDA toolkit, no llama.cpp build, no fetch: the lab's cards are simulated
and its models are written in place)."""

from pyinfra import host

from rigup import summary
from rigup.config import check_host
from roles import base, cmpunlocker, gpu_guard, gpu_power, in_order, llama_server, preflight, vllm

summary.track(host.state)     # each host's last line, as deploy.py's
check_host(host)
plan = preflight.run(in_order())
base.apply(plan)
gpu_power.apply(plan)
gpu_guard.apply(plan)
cmpunlocker.apply(plan)
llama_server.apply(plan)
vllm.apply(plan)
