"""Another host of the run, as its own preflight plans it: what an RPC head's checks read of its
workers (roles/preflight ``plan_of``) and what roles/llama_cpp reads of the hosts before it in the
inventory, to know which of them compiles a build (roles/llama_cpp/handover.py)."""

from __future__ import annotations

from rigup import run as run_state
from rigup.config import config_of
from rigup.gpu.driver import planned_gpus
from rigup.gpu.facts import HardwareFacts
from rigup.gpu.plan import Plan, hardware_plan


def plan(peer) -> Plan | None:
    """``peer``'s hardware plan: the one its own preflight made in this run (rigup/run.py
    ``plans``), else one made now from its facts (one round trip) as preflight makes it (the cards
    of nvidia-smi, or of the PCI bus before a driver step; its CPU), kept on the run. The cards a
    role's own hook leaves out (roles/burnin's quarantine) are still in. Raises what the read raises."""
    plans = run_state.host_run(peer).plans
    if peer.name not in plans:
        facts = peer.get_fact(HardwareFacts, paths=["/"])
        gpus, _ = planned_gpus(facts, config_of(peer))
        plans[peer.name] = dict(hardware_plan(gpus, facts["driver"], facts["cuda_toolkits"], facts.get("cpu")))
    return plans[peer.name]
