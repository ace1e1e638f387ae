"""roles/nvidia_driver's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py).

    check_cards        nvidia_driver_branch on a host with no NVIDIA card on its PCI bus, or with cards
                       the catalogue cannot plan before their driver answers
    check_branch_cards a branch that no longer runs the host's cards (after 580: cc < 7.5)
    check_modules      nvidia_driver_modules that does not run every card (open below Turing,
                       proprietary on Blackwell)
    check_distribution a distribution whose driver packages rigup does not know (Debian, Ubuntu)
    check_headers      a driver to build with DKMS, and no headers package for the running kernel
    check_secure_boot  a driver to build with DKMS on a host with Secure Boot on
    check_serving      a branch change on a host that serves, outside a roll
    check_fabric       an NVSwitch host whose fabric manager cannot run with its driver (rigup/gpu/fabric.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.gpu.catalogue import driver_branches, oldest_cc
from rigup.gpu.fabric import mismatch
from rigup.gpu.driver import modules_choice
from rigup.gpu.plan import gpu_host
from rigup.refusal import Refusal
from roles.nvidia_driver.packages import driver_packages, preferred_modules, upstream

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def _branch(data: Config) -> int | None:
    return data.get("nvidia_driver_branch") if data.get("gpu_enabled", True) else None


def _host(facts: Facts) -> dict:
    return (facts.get("reads") or {}).get("DriverHost") or {}


def check_cards(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """nvidia_driver_branch where no NVIDIA GPU is on the PCI bus (nothing to drive), or where the
    driver is missing and a card's PCI id is not in the catalogue (its plan needs the driver)."""
    branch = _branch(data)
    if branch is None:
        return []
    step = plan.get("driver_step")
    if not gpu_host(plan, data) and not step and not facts.get("pci"):
        return [Refusal(f"nvidia_driver_branch {branch} on a host without an NVIDIA GPU",
                        "no NVIDIA display or 3D controller is on its PCI bus (/sys/bus/pci/devices, vendor 0x10de)",
                        "set nvidia_driver_branch: null and gpu_enabled: false for this host", "driver_cards")]
    unknown = (step or {}).get("unknown") or []
    if unknown:
        ids = ", ".join(f"{d['bus_id']} ({d['pci_device_id']})" for d in unknown)
        return [Refusal(f"NVIDIA cards rigup cannot plan before their driver answers: {ids}",
                        "their PCI ids are not in rigup/gpu/catalogue.yml, so their compute capability, "
                        "memory and architecture are unknown until nvidia-smi reports them",
                        "add the cards to rigup/gpu/catalogue.yml (docs/layout.md, Add a GPU card), or install "
                        f"the driver of branch {branch} by hand once and converge again", "driver_cards")]
    return []


def check_modules(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """nvidia_driver_modules that no card runs: open modules below Turing (compute capability 7.5),
    proprietary ones on Blackwell (rigup/gpu/catalogue.yml driver_modules)."""
    if _branch(data) is None or not gpu_host(plan, data):
        return []
    prefer = preferred_modules((_host(facts).get("os") or {}).get("id", ""))
    chosen, why = modules_choice(plan, data.get("nvidia_driver_modules", "auto"), prefer)
    if chosen:
        return []
    return [Refusal(f"nvidia_driver_modules: {data.get('nvidia_driver_modules')}", why,
                    "set nvidia_driver_modules: auto, or drive the other cards from another host", "driver_modules")]


def check_branch_cards(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """nvidia_driver_branch not a branch NVIDIA released (rigup/gpu/catalogue.yml driver_branches),
    or newer than runs this host's cards (branches after 580 dropped compute capability below 7.5:
    Maxwell, Pascal, Volta; catalogue.yml oldest_cc)."""
    branch = _branch(data)
    known = driver_branches()
    if branch is not None and int(branch) not in known:
        near = sorted(known, key=lambda b: abs(b - int(branch)))[:2]
        return [Refusal("nvidia_driver_branch", f"{branch} is not a driver branch NVIDIA released (the nearest: "
                        f"{', '.join(map(str, sorted(near)))}; rigup/gpu/catalogue.yml driver_branches)",
                        "set one of them (a branch released since: add it to driver_branches)", "driver_cards")]
    floor = oldest_cc("driver", str(branch)) if branch is not None and gpu_host(plan, data) else None
    old = sorted({c["class"] for c in plan.get("cards") or []
                  if floor and c.get("compute_capability") and tuple(c["compute_capability"]) < floor[0]})
    if not old:
        return []
    return [Refusal(f"nvidia_driver_branch {branch} does not run this host's {', '.join(old)} cards",
                    f"driver branches from {floor[1]} on run compute capability >= {'.'.join(map(str, floor[0]))} "
                    "only (rigup/gpu/catalogue.yml oldest_cc)",
                    "set nvidia_driver_branch to 580, the last branch that runs them", "driver_cards")]


def check_distribution(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A driver to install on a distribution other than Debian or Ubuntu."""
    os_release = _host(facts).get("os") or {}
    if _branch(data) is None or not plan.get("driver_step") or not os_release:
        return []
    if driver_packages(os_release.get("id", ""), int(_branch(data)), "open"):
        return []
    return [Refusal(f"nvidia_driver_branch on {os_release.get('id') or 'an unknown distribution'} "
                    f"{os_release.get('version_id', '')}".rstrip(),
                    "rigup installs the driver from Debian's and Ubuntu's own packages only",
                    "install the NVIDIA driver by hand and set nvidia_driver_branch: null", "driver_distribution")]


def check_headers(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A driver to install with nvidia_driver_headers on, while the running kernel has no headers
    and apt has no package of them (a kernel updated but not booted, a provider's own kernel):
    DKMS could not build the module, and the driver would never load."""
    state = _host(facts)
    if (_branch(data) is None or not plan.get("driver_step") or not data.get("nvidia_driver_headers", True)
            or not state or state.get("headers") or state.get("headers_candidate")):
        return []
    release = state.get("release") or "the running kernel"
    return [Refusal(f"no headers for the running kernel {release}",
                    f"DKMS builds the NVIDIA module against them, and apt has no linux-headers-{release} "
                    "(the kernel was updated and not booted, or it is not the distribution's)",
                    "reboot into the distribution's newest kernel and converge again, or install its headers by "
                    "hand (nvidia_driver_headers: false once they are there another way)", "driver_headers")]


def check_secure_boot(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A driver to build with DKMS on a host with UEFI Secure Boot on."""
    if _branch(data) is None or not plan.get("driver_step") or facts.get("secure_boot") is not True:
        return []
    return [Refusal("NVIDIA driver to install with Secure Boot on",
                    "DKMS builds the module on the host, unsigned by a key the firmware trusts, so the kernel "
                    "would not load it (mokutil --sb-state says SecureBoot enabled)",
                    "turn Secure Boot off in the firmware setup, or enroll DKMS's key (mokutil --import "
                    "/var/lib/dkms/mok.pub) and converge again", "driver_secure_boot")]


def check_serving(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A branch change (a driver loaded, another branch pinned) on a host whose serving units are
    installed, outside a roll (rigup_rolling, set by roll.py) and maintenance: the reboot would drop
    its requests."""
    step = plan.get("driver_step")
    if (not step or not step.get("loaded") or not plan.get("serving_units") or data.get("rigup_rolling")
            or data.get("rigup_maintenance")):
        return []
    return [Refusal(f"driver {step['loaded']} -> branch {step['branch']} on a serving host",
                    f"the module is swapped by a reboot, and {', '.join(plan['serving_units'])} would drop what "
                    "they serve meanwhile",
                    "change it with ./roll.py (each host out of the gateways' pools while it converges), or put the "
                    "host in maintenance (rigup_maintenance: true) first", "driver_serving")]


def _fabric_version_offered(plan: Plan, facts: Facts, data: Config) -> Refusal | None:
    """On Debian, where every package of the driver is pinned to the kernel module's candidate: a
    fabric manager to install whose sources offer it at other versions only (both named)."""
    host, branch = _host(facts), _branch(data)
    if (host.get("os") or {}).get("id") != "debian" or branch is None:
        return None
    modules = modules_choice(plan, data.get("nvidia_driver_modules", "auto"), preferred_modules("debian"))[0]
    table = driver_packages("debian", branch, modules or "proprietary")
    driver = (host.get("module_candidates") or {}).get(table["probe"])
    name = f"nvidia-fabricmanager-{branch}"
    offers = (host.get("fabric_offers") or {}).get(name) or []
    have = ((host.get("packages") or {}).get(name) or {}).get("version")
    if not driver or not str(driver).startswith(f"{branch}.") or not offers \
            or upstream(driver) in {upstream(o) for o in offers} or (have and upstream(have) == upstream(driver)):
        return None
    return Refusal(f"NVSwitch host: its sources offer {name} at {', '.join(offers[:3])}, the driver at {driver}",
                   "the fabric manager must be the driver's release (at another it refuses to start, and "
                   "every CUDA program fails with error 802)",
                   f"add the source that has {name} {upstream(driver)} (NVIDIA's CUDA repository keeps every version), or pin "
                   "nvidia_driver_branch to a branch whose driver and fabric manager your sources offer alike",
                   "driver_fabric")


def check_fabric(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An NVSwitch host (HGX, DGX) whose fabric manager cannot run with its driver: one installed at
    another version than the loaded driver (both named), or none where the driver comes from
    Debian's packages (they ship no fabric manager). Without it CUDA fails with error 802."""
    fabric = plan.get("fabric")
    if not fabric or not fabric["nvswitches"] or not data.get("gpu_enabled", True):
        return []
    driver = (plan.get("driver") or {}).get("version")
    why = None if plan.get("driver_step") else mismatch(fabric, driver)   # a branch change moves both
    if why:
        return [Refusal(f"NVSwitch host: fabric manager {fabric['manager']}, driver {driver}", why,
                        f"install the fabric manager of version {driver} from the driver's own source (Ubuntu: "
                        f"nvidia-fabricmanager-{str(driver).split('.')[0]}; NVIDIA's CUDA repository: "
                        f"nvidia-fabricmanager={driver}-1), or reboot if the driver was upgraded and its module not "
                        "loaded yet", "driver_fabric")]
    os_id, branch = (_host(facts).get("os") or {}).get("id"), _branch(data)
    offered = (_host(facts).get("fabric_candidates") or {}).get(f"nvidia-fabricmanager-{branch}")
    mismatched = _fabric_version_offered(plan, facts, data)
    if mismatched:
        return [mismatched]
    have = (_host(facts).get("packages") or {}).get(f"nvidia-fabricmanager-{branch}") or {}
    if (os_id == "debian" and branch is not None and not str(offered or "").startswith(f"{branch}.")
            and not str(have.get("version") or "").startswith(f"{branch}.")):
        return [Refusal(f"NVSwitch host ({fabric['nvswitches']} x NVSwitch): no nvidia-fabricmanager-{branch} in its "
                        "sources" + (f" (they offer {offered})" if offered else ""),
                        "Debian's driver packages ship no fabric manager, and CUDA does not start on an NVSwitch board "
                        f"without one at the driver's exact version (driver branch {branch})",
                        "add NVIDIA's CUDA repository for Debian (it has nvidia-fabricmanager-BRANCH at each driver "
                        "version) to the host's apt sources, or run Ubuntu, whose archive has it", "driver_fabric")]
    return []


CHECKS = (check_cards, check_branch_cards, check_modules, check_distribution, check_headers, check_secure_boot, check_serving,
          check_fabric)
