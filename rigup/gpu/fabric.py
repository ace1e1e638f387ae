"""The NVSwitch fabric of an HGX or DGX host (8 A100, H100 or H200 on one board): read and judged,
pure. On such a host CUDA does not start until NVIDIA's fabric manager runs, at exactly the
driver's version (at another it refuses to start and every CUDA program fails with error 802,
"system not yet initialized": ../shared/notes/field-2026-12b.md, dstack#2348).

What is read (rigup.gpu.facts, in the one hardware read):
- the NVSwitch chips on the PCI bus: NVIDIA devices (vendor 0x10de) of bridge class 0x0680, from
  the same sysfs lines as the cards (:func:`parse_nvswitches`), also before any driver answers;
- with an NVSwitch there, the fabric manager's packages and version (``nvidia-fabricmanager``,
  ``nvidia-fabricmanager-BRANCH``) and its service's state (:data:`MANAGER_COMMAND`);
- each card's ``fabric.state`` and ``fabric.status`` (nvidia-smi's query, Hopper and later; N/A on
  Ampere and on a single card passed through to a VM, as the lent H200 machine reports).

A VM of an HGX host may see eight cards with NVLink and no NVSwitch (the hypervisor runs the
fabric): no fabric manager is wanted there, but the cards' fabric state is still judged.
"""

from __future__ import annotations

import re

from rigup.boundary.core import Unreadable
from rigup.boundary.fields import pci_bus_id
from rigup.boundary.numbers import number, whole

SERVICE = "nvidia-fabricmanager.service"
_PACKAGE = re.compile(r"nvidia-fabricmanager(?:-[0-9]{3})?")   # NVIDIA's CUDA repository's, Ubuntu's per branch
NVSWITCH_CLASS = "0x0680"   # PCI bridge, other: what an NVSwitch is (lspci: "Bridge: NVIDIA ... NVSwitch")
# The fabric manager's packages and its service: "fm PACKAGE VERSION STATUS" lines, then "active
# STATE". rigup.gpu.facts runs it only where its PCI read found an NVSwitch (nothing more elsewhere).
MANAGER_COMMAND = ("dpkg-query -W -f='fm ${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-fabricmanager*' "
                   f"2>/dev/null; echo \"active $(systemctl is-active {SERVICE} 2>/dev/null)\"; "
                   # each card's NVLinks (on Ampere, which reports no fabric state, what says the fabric is up)
                   "timeout 10 nvidia-smi nvlink -s 2>/dev/null | sed 's/^/nvl /'")


def parse_nvswitches(lines: list[str]) -> list[str]:
    """rigup.gpu.facts PCI_COMMAND's lines (``BUS DEVICE CLASS``) -> the NVSwitches' bus ids, in order. A
    line whose bus is no PCI bus id (:func:`rigup.boundary.fields.pci_bus_id`) is skipped, as parse_pci
    skips a card's: sysfs names every device by one, and the guard keys each switch's SXid lines by it
    (issue 61, round 16 FX16: ``\\x1b[31mNOTABUS 0x10de 0x068000`` reached xid.card_key, whose ValueError
    ended the gpu_guard role with a traceback)."""
    def bus(text: str) -> str | None:
        try:
            return pci_bus_id(text, "an NVSwitch's sysfs name")
        except Unreadable:
            return None
    return sorted(b for p in (line.split() for line in lines)
                  if len(p) == 3 and p[2].lower().startswith(NVSWITCH_CLASS) and (b := bus(p[0])))


def parse_manager(lines: list[str]) -> dict:
    """:data:`MANAGER_COMMAND`'s lines -> {"version": the installed fabric manager's version (the
    upstream part, ``580.105.08``) or None, "package": its name or None, "active": the service's
    state or None (not read: no NVSwitch)}."""
    out: dict = {"version": None, "package": None, "active": None, "nvlinks": parse_nvlinks(lines)}
    for line in lines:
        parts = line.split()
        # dpkg's abbreviated status: the wanted state (i, or h when held, as rigup holds it), then "i" installed
        if len(parts) >= 4 and parts[0] == "fm" and parts[3][1:2] == "i" and _PACKAGE.fullmatch(parts[1]):
            out.update(package=parts[1], version=parts[2].split(":")[-1].split("-")[0])
        elif len(parts) == 2 and parts[0] == "active":
            out["active"] = parts[1]
        elif parts == ["active"]:
            out["active"] = "unknown"
    return out


def parse_nvlinks(lines: list[str]) -> dict | None:
    """The ``nvl ``-prefixed lines of ``nvidia-smi nvlink -s`` -> {"up": the fewest links up on a
    card, "most": the most up, "links": links per card, "cards": cards listed, "unreadable": cards
    whose links do not read}, or None (no card listed links: no NVLink, or no driver).

    A link is up only at a positive finite speed (``Link 3: 26.562 GB/s``, read by
    rigup.boundary.numbers): ``<inactive>``, ``0 GB/s`` and ``N/A`` are down. A card that names a
    link twice (``Link 0`` 18 times is one link, not 18 up) or a link by no whole number has links
    that do not read: none of them up, as many as it named, so the fabric is not judged whole. A
    card that names no link among cards that do counts with none up."""
    cards: list[dict | None] = []     # per card: {link index: up}, or None once it does not read
    named: list[set[str]] = []        # the link names each card gave (an unreadable card's count)
    for line in lines:
        if not line.startswith("nvl "):
            continue
        text = line[4:].strip(" \t\r\n\f\v")   # ASCII's blanks alone, as numbers (str.strip() takes U+0085)
        if text.startswith("GPU "):
            cards.append({})
            named.append(set())
        elif text.startswith("Link ") and cards:
            index, _, speed = text[5:].partition(":")
            named[-1].add(index)
            k = whole(index)
            if cards[-1] is None or k is None or k in cards[-1]:
                cards[-1] = None
                continue
            words = re.split("[ \t]+", speed.strip(" \t"))   # ASCII blanks (str.split() takes U+0085)
            cards[-1][k] = len(words) == 2 and words[1] == "GB/s" and (number(words[0], float, lo=0) or 0) > 0
    if not any(named):
        return None
    # a card that names no link beside cards that do counts, with none up (round 4: dropped, the
    # rest read whole)
    ups = [(sum(c.values()), len(c)) if c is not None else (0, len(n)) for c, n in zip(cards, named)]
    return {"up": min(u for u, _ in ups), "most": max(u for u, _ in ups), "links": max(n for _, n in ups),
            "cards": len(ups), "unreadable": sum(1 for c, n in zip(cards, named) if n and c is None)}


def fabric_plan(nvswitches: list[str], gpus: list[dict], manager: dict | None) -> dict | None:
    """What the plan says of the fabric, or None for a host with neither an NVSwitch nor a card
    reporting a fabric state: {"nvswitches": N (0: a VM of an HGX host, whose cards report the
    fabric its hypervisor runs), "buses": their PCI bus ids, "manager": version or None, "package", "active", "states":
    {state/status: count of cards}}."""
    states: dict[str, int] = {}
    for g in gpus:
        if not g.get("lost") and g.get("fabric_state"):
            key = g["fabric_state"] + (f"/{g['fabric_status']}" if g.get("fabric_status") else "")
            states[key] = states.get(key, 0) + 1
    if not nvswitches and not states:
        return None
    manager = manager or {}
    return {"nvswitches": len(nvswitches), "buses": list(nvswitches), "manager": manager.get("version"), "package": manager.get("package"),
            "active": manager.get("active"), "states": states, "nvlinks": manager.get("nvlinks")}


def line(fabric: dict | None) -> str | None:
    """The plan's fabric line: ``fabric:    6 x NVSwitch, fabric manager 580.105.08 active, 8 cards
    Completed/Success``."""
    if not fabric:
        return None
    parts = [f"{fabric['nvswitches']} x NVSwitch" if fabric["nvswitches"] else
             "no NVSwitch on this PCI bus (a VM of an HGX host: its hypervisor runs the fabric)"]
    if fabric["nvswitches"]:
        parts.append(f"fabric manager {fabric['manager']} {fabric['active'] or 'state unknown'}"
                     if fabric["manager"] else "no fabric manager installed")
    links = fabric.get("nvlinks")
    if links:
        parts.append(f"{links['up']} NVLinks up per GPU" if links["up"] == links["most"] == links["links"] else
                     f"NVLinks up per GPU: {links['up']} to {links['most']} of {links['links']}")
        if links.get("unreadable"):
            parts.append(f"the NVLinks of {links['unreadable']} card{'s' * (links['unreadable'] > 1)} unreadable "
                         "(a link named twice or by no number)")
    if fabric["states"]:
        parts.append(", ".join(f"{n} card{'s' * (n > 1)} {s}" for s, n in sorted(fabric["states"].items())))
    return "fabric:    " + ", ".join(parts)


def mismatch(fabric: dict | None, driver_version: str | None) -> str | None:
    """Why the installed fabric manager cannot run with the loaded driver, or None: both versions
    named (they must be equal; at another version it refuses to start and CUDA fails with 802)."""
    if not fabric or not fabric["nvswitches"] or not fabric["manager"] or not driver_version:
        return None
    if fabric["manager"] == driver_version:
        return None
    return (f"fabric manager {fabric['manager']} ({fabric['package']}) with driver {driver_version}: they must be "
            "the same version (the fabric manager refuses to start, and every CUDA program fails with error 802, "
            "'system not yet initialized')")
