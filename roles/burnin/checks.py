"""roles/burnin's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_clear    burnin_clear: an entry that is not a GPU UUID (GPU-...) or "all"
    check_named    a vLLM instance's ``gpus`` or rpc_worker_cuda_devices naming a quarantined card
    check_records  rigup-burnin's records on the host, or the controller's copy, that do not read
    check_pulse    the host's power delivery failed its pulse (burnin_pulse), or its record does not read
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


def check_pulse(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The host's power delivery failed its pulse (burnin_pulse) and is not due again: refused, with
    the pulse's figures, until the supply is fixed (burnin_retest in a roll) or gpu_psu_watts lowered;
    a pulse record that does not read is refused, naming it."""
    pulse = (plan.get("burnin") or {}).get("pulse") or {}
    if pulse.get("unreadable"):
        return [Refusal("the burn-in pulse record (rigup_state_dir/burnin-pulse.json) does not read", pulse["unreadable"],
                        "move it aside (the pulse is then due again, in the next roll)", "burnin")]
    if not pulse.get("failed"):
        return []
    return [Refusal("the host's power delivery failed its pulse test (burnin_pulse)", "; ".join(pulse["failed"]),
                    "fix the power supply, its cables or the risers, then roll with burnin_retest: true; or lower "
                    "gpu_psu_watts (the cards' caps then share less: the pulse runs again in the next roll)", "burnin")]


CHECKS = (check_clear, check_named, check_records, check_pulse)
