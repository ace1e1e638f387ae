"""roles/cmpunlocker's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py).

    check_config        the source settings: a git URL with a full commit, or a tarball whose
                        sha256 matches (read on the controller)
    check_systemd       cmpunlocker on a host where systemd is not PID 1
    check_secure_boot   cmpunlocker with Secure Boot on
    check_headers       cmpunlocker without the running kernel's headers
    check_driver        cmpunlocker on a driver not on its supported list, or the proprietary module
    check_cards         cmpunlocker on cards that are not CMP 170HX (by PCI id), or the wrong profile
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.gpu.catalogue import cards as catalogue_cards
from rigup.gpu.plan import gpu_host
from rigup.refusal import Refusal, config_refusals, gpus_text, needs_systemd
from roles.cmpunlocker.steps import config_problems

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def check_config(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The unlocker's source: a git URL (one git reads as no option) with a full 40-hex commit, or
    a tarball whose sha256 matches on the controller."""
    return config_refusals(config_problems(data))


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """cmpunlocker on a host where systemd is not PID 1."""
    return needs_systemd(facts, ["cmpunlocker_enabled"] if data.get("cmpunlocker_enabled") else [])


def _cmpunlocker_applies(plan: Plan, data: Config) -> bool:
    return bool(data.get("cmpunlocker_enabled")) and gpu_host(plan, data)


def check_secure_boot(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Cmpunlocker with UEFI Secure Boot on."""
    if not _cmpunlocker_applies(plan, data) or facts.get("secure_boot") is not True:
        return []
    return [Refusal("cmpunlocker with Secure Boot on",
                    "its patched NVIDIA kernel modules are unsigned, so the kernel would not load them "
                    "(its installer aborts; mokutil --sb-state says SecureBoot enabled)",
                    "turn Secure Boot off in the firmware setup, or set cmpunlocker_enabled: false for this host",
                    "cmpunlocker_secure_boot")]


def check_headers(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Cmpunlocker without the headers of the running kernel."""
    kernel = facts.get("kernel") or {}
    if not _cmpunlocker_applies(plan, data) or kernel.get("headers"):
        return []
    release = kernel.get("release") or "$(uname -r)"
    return [Refusal("cmpunlocker without kernel headers",
                    f"it builds patched nvidia modules against the running kernel {release}, and "
                    f"/lib/modules/{release}/build is missing",
                    f"install them (apt-get install linux-headers-{release}), or set cmpunlocker_enabled: false",
                    "cmpunlocker_headers")]


def check_driver(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Cmpunlocker on a driver that is not exactly one of cmpunlocker_supported_drivers (or
    on NVIDIA's proprietary kernel module: it patches the open one)."""
    if not _cmpunlocker_applies(plan, data):
        return []
    driver = plan.get("driver") or {}
    supported = [str(v) for v in data.get("cmpunlocker_supported_drivers") or []]
    found = []
    if driver.get("version") not in supported:
        found.append(Refusal(
            f"cmpunlocker on NVIDIA driver {driver.get('version') or '(none loaded)'}",
            f"its patches apply to exactly {', '.join(supported) or '(no version listed)'} "
            "(cmpunlocker_supported_drivers, from its driver/VERSION; there is no range)",
            f"install one of them (e.g. apt-get install nvidia-driver-{(supported or ['610'])[0].split('.')[0]}-open) "
            "and reboot, or add this version to cmpunlocker_supported_drivers if your cmpunlocker fork "
            "lists it", "cmpunlocker_driver"))
    if driver.get("kernel_module") == "proprietary":
        found.append(Refusal(
            "cmpunlocker on NVIDIA's proprietary kernel module",
            "cmpunlocker patches NVIDIA's open kernel modules (open-gpu-kernel-modules)",
            "install the -open driver packages of a supported version and reboot", "cmpunlocker_driver"))
    return found


def _cmp_ids() -> dict[str, str]:
    """PCI id -> cmpunlocker profile ("8gb", "10gb") of every card that needs the unlock."""
    return {pci: f"{card['vram_locked_mib'] // 1024}gb" for card in catalogue_cards().values()
            if card["quirks"].get("needs_unlock") and card.get("vram_locked_mib")
            for pci in card["pci_ids"]}


def check_cards(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Cmpunlocker on a host with cards that are not CMP 170HX (by PCI id), or with a
    cmpunlocker_profile that does not match the cards."""
    if not _cmpunlocker_applies(plan, data):
        return []
    cmp_ids = _cmp_ids()
    gpus = [g for g in facts.get("gpus") or [] if not g.get("lost")]
    others: dict[str, list] = {}
    profiles: dict[str, list] = {}
    for gpu in gpus:
        pci = gpu.get("pci_device_id")
        if pci in cmp_ids:
            profiles.setdefault(cmp_ids[pci], []).append(gpu.get("index"))
        else:
            others.setdefault(pci or "unknown PCI id", []).append(gpu.get("index"))
    found = []
    if others:
        keys = {c["index"]: c.get("key") for c in plan.get("cards") or []}
        cards = "; ".join(f"{gpus_text(idx)} are {pci}" + (f" ({keys.get(idx[0])})" if keys.get(idx[0]) else "")
                          for pci, idx in others.items())
        unlockable = ", ".join(f"{pci} ({prof})" for pci, prof in sorted(cmp_ids.items()))
        found.append(Refusal(
            "cmpunlocker on cards that are not CMP 170HX",
            f"{cards}; cmpunlocker unlocks only {unlockable} cards, found by PCI id",
            "set cmpunlocker_enabled: false for this host", "cmpunlocker_cards"))
    profile = data.get("cmpunlocker_profile")
    wrong = {p: idx for p, idx in profiles.items() if p != profile}
    if wrong and not others:
        want = ", ".join(f"{gpus_text(idx)} need {p}" for p, idx in wrong.items())
        found.append(Refusal(
            f"cmpunlocker_profile {profile} does not match this host's cards",
            f"{want} (by PCI id: 10de:20c2 is the 8 GB card, 10de:2082 the 10 GB card)",
            f"set cmpunlocker_profile: {next(iter(wrong))}", "cmpunlocker_cards"))
    return found


CHECKS = (check_config, check_systemd, check_secure_boot, check_headers,
          check_driver, check_cards)
