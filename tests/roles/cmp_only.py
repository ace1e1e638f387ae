"""A play for the CMP 170HX runbook's lab test (docs/cmp170hx.md): deploy.py's preflight, then the
roles a CMP vLLM rig runs, in deploy.py's order: base, gpu_power, gpu_guard, cmpunlocker,
llama_server, vllm (no CUDA toolkit, no llama.cpp build, no fetch: the lab's cards are simulated
and its models are written in place), and deploy.py's last line per host."""

from pyinfra import host

from rigup import summary
from rigup.config import configure
from roles import base, cmpunlocker, gpu_guard, gpu_power, in_order, llama_server, preflight, vllm

summary.track(host.state)
cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
if host not in host.state.failed_hosts:
    for role in host.loop([base, gpu_power, gpu_guard, cmpunlocker, llama_server, vllm]):   # as deploy.py's steps
        role.apply(plan, cfg)
