"""The NVIDIA driver step of a host's plan: pure functions of its facts, data and the catalogue.

With ``nvidia_driver_branch`` set (roles/nvidia_driver), a host whose loaded driver is not of that
branch, or where none answers, gets a driver step in its plan::

    {"branch": 580, "why": "no NVIDIA driver answers (nvidia-smi missing, or no module loaded)",
     "predicted": True,      # the cards come from the PCI bus and the catalogue, not nvidia-smi
     "unknown": [],          # PCI ids on the bus the catalogue cannot plan (refused)
     "loaded": None}         # the version loaded now (a branch change: the module must be swapped)

A host without a driver has no ``nvidia-smi`` to tell its cards, so its GPU plan is made from the
NVIDIA devices on its PCI bus (sysfs: vendor 0x10de, device id) and their catalogue entries
(compute capability, architecture, memory as shipped, power range): every later role plans on
it in the same run, and the driver role checks after the install that ``nvidia-smi`` reports the
same cards, failing the host if not (the next converge then plans from what the driver says).
The checks that hold a driver against CUDA (the toolkit, a vLLM wheel) take the branch the host
will have (:func:`driver_for_checks`), not the one loaded before the step.
"""

from __future__ import annotations

import re

from typing import TYPE_CHECKING, Any

from rigup.gpu.catalogue import card_by_pci_id, modules_for
from rigup.text import shown

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan

NO_DRIVER = "no NVIDIA driver answers (nvidia-smi missing, or no module loaded)"


def branch_of(version: Any) -> int | None:
    """``"580.105.08"`` -> 580; None when not a dotted version."""
    head = str(version or "").split(".")[0]
    # a branch is 3 ASCII digits today; a lying host's "٥٨٠", "²" or 5000 digits is no branch (issue 47)
    return int(head) if re.fullmatch(r"[0-9]{1,6}", head) else None


def driver_step(facts: dict, data: Any) -> dict | None:
    """This host's driver step (module docstring), or None: no branch pinned, GPU roles off, no
    NVIDIA card at all, or the pinned branch already loaded and answering."""
    branch = data.get("nvidia_driver_branch")
    if branch is None or not data.get("gpu_enabled", True):
        return None
    driver, gpus, pci = facts.get("driver") or {}, facts.get("gpus") or [], facts.get("pci") or []
    loaded = driver.get("version") if driver.get("loaded") else None
    if not gpus and not pci:
        return None
    if gpus and branch_of(loaded) == int(branch):
        return None
    predicted = not gpus
    # the host's text, shown as text and bounded; a version that names no branch is said to be one
    now = f"{shown(loaded, 40)}" + ("" if branch_of(loaded) is not None else " (not a version of any branch)")
    if not loaded:
        why = NO_DRIVER
    elif branch_of(loaded) == int(branch):   # the branch is loaded, yet nvidia-smi lists none of the bus's cards
        why = f"driver {now} (branch {branch}) is loaded but nvidia-smi reports none of the cards on the PCI bus"
    else:
        why = f"driver {now} is loaded, not branch {branch}"
    return {"branch": int(branch),
            "why": why,
            "predicted": predicted,
            "unknown": [p for p in pci if predicted and not card_by_pci_id(p["pci_device_id"])],
            "loaded": loaded}


def planned_gpus(facts: dict, data: Any) -> tuple[list[dict], dict | None]:
    """The cards to plan on (nvidia-smi's, or with a driver step and no driver answering, the PCI
    bus's: :func:`predicted_gpus`) and the driver step (preflight makes the plan from both)."""
    step = driver_step(facts, data)
    return (predicted_gpus(facts.get("pci") or []) if step and step["predicted"] else facts.get("gpus") or []), step


def predicted_gpus(pci: list[dict]) -> list[dict]:
    """``NvidiaGpus``-shaped cards for the catalogued NVIDIA devices on the PCI bus: what
    nvidia-smi will report once the driver is loaded (memory as shipped: a CMP 170HX locked)."""
    found = []
    for dev in pci:
        card = card_by_pci_id(dev["pci_device_id"])
        if not card:
            continue
        memory = card["vram_locked_mib"] if card["quirks"].get("needs_unlock") else card["vram_mib"]
        found.append({"index": len(found), "bus_id": "0000" + dev["bus_id"].upper(), "uuid": None,
                      "name": card["name"], "pci_device_id": dev["pci_device_id"],
                      "compute_capability": tuple(card["compute_capability"]),
                      "memory_total_mib": memory, "lost": False})
    return found


def modules_choice(plan: Plan, wanted: str, prefer: tuple[str, ...] = ("open", "proprietary")) -> tuple[str | None, str]:
    """The kernel modules for this plan's cards (``nvidia_driver_modules``: auto, open or
    proprietary; auto takes the first of ``prefer`` that runs every card) and, when none fits,
    why: ("open", ""), or (None, "...")."""
    allowed = list(prefer)
    for card in plan.get("cards") or []:
        fits = modules_for(card.get("compute_capability"))
        allowed = [m for m in allowed if m in fits]
    if wanted == "auto":
        return (allowed[0], "") if allowed else (None, "no kernel module flavour runs every card of this host")
    if wanted in allowed:
        return wanted, ""
    return None, (f"{wanted} kernel modules do not run every card of this host (they run: "
                  f"{', '.join(allowed) or 'neither'}; rigup/gpu/catalogue.yml driver_modules)")


def driver_for_checks(plan: Plan) -> tuple[str | None, str | None]:
    """The driver version the CUDA checks hold the plan to, and how to name it: the loaded one, or,
    with a driver step, the pinned branch's newest (``("580.9999.9999", "branch 580 (nvidia_driver_branch)")``)."""
    step = plan.get("driver_step")
    if step:
        return f"{step['branch']}.9999.9999", f"branch {step['branch']} (nvidia_driver_branch)"
    version = (plan.get("driver") or {}).get("version")
    return version, version
