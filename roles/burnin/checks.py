"""roles/burnin's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_clear    burnin_clear: an entry that is not a GPU UUID (GPU-...) or "all"
    check_named    a vLLM instance's ``gpus`` or rpc_worker_cuda_devices naming a quarantined card
    check_records  rigup-burnin's records on the host, or the controller's copy, that do not read
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rigup.refusal import Refusal, config_refusals

if TYPE_CHECKING:
    from rigup.config import Config
    from rigup.gpu.facts import Facts
    from rigup.gpu.plan import Plan

UUID = re.compile(r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def check_clear(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """burnin_clear names cards by UUID (indexes reorder between boots) or is "all"."""
    return config_refusals([(f"burnin_clear[{i}]", f"expected a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) "
                                                  f"or \"all\", got {v!r}")
                            for i, v in enumerate(data.get("burnin_clear") or [])
                            if v != "all" and not UUID.fullmatch(str(v))])


def check_named(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The cards an operator named by index for a unit (a vLLM instance's ``gpus``,
    rpc_worker_cuda_devices) are used as named: one quarantined among them is refused, naming it."""
    bad = {str(q["index"]): q for q in (plan.get("burnin") or {}).get("quarantined") or [] if q.get("index") is not None}
    named = [(f"vllm_instances.{name}.gpus", str(inst.get("gpus") or ""))
             for name, inst in (data.get("vllm_instances") or {}).items() if isinstance(inst, dict)]
    named.append(("rpc_worker_cuda_devices", str(data.get("rpc_worker_cuda_devices") or "")))
    found = []
    for where, text in named:
        for index in (i.strip() for i in text.split(",") if i.strip() in bad):
            q = bad[index]
            found.append(Refusal(f"{where} names GPU {index} ({q['uuid']})",
                                 f"it is quarantined by its burn-in: {'; '.join(q['failed'])}",
                                 "leave it out of the list, or fix the card and converge with burnin_retest: true "
                                 "(burnin_clear accepts it as it is)", "burnin"))
    return found


def check_records(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The records the host's cards are judged by do not read (roles/burnin ``judged``): this host
    is refused, naming the file (the plan judged its cards by the last good copy meanwhile)."""
    return [Refusal(f"burn-in records {bad['where']} do not read", bad["why"], bad["fix"], "burnin")
            for bad in (plan.get("burnin") or {}).get("unreadable") or []]


CHECKS = (check_clear, check_named, check_records)
