"""cmpunlocker's decisions: pure functions of the role's data and the host's state.

The unlock happens in steps that span a cold power-off, so the role keeps a state marker on the
host (``rigup_state_dir/cmpunlocker.json``) and each converge takes the next step:

    no marker (or another commit, profile or option)  -> install, marker "installed"
    "installed", same boot as the install              -> pending: cold power-off required
    "installed", cards locked after a reboot            -> pending: only a COLD power-off unlocks
    "installed", cards unlocked                         -> verify (memory, module path, PCIe gen)
    "verified"                                          -> nothing
    cmpunlocker_rollback, marker installed/verified     -> rollback, marker "rolled-back"
    "rolled-back", cards locked after a cold power-off  -> marker "stock"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import re
from pathlib import Path

from rigup.config import GIT_URL
from rigup.gpu.catalogue import card_by_pci_id

if TYPE_CHECKING:
    from rigup.config import Config

UNLOCKER_MODULE_DIR = "/updates/cmpunlocker/"     # where its installer puts nvidia.ko
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def installer_args(data: Config) -> list[str]:
    """The installer's command line options for this data."""
    args = [f"--profile={data['cmpunlocker_profile']}"]
    if not data["cmpunlocker_iommu"]:
        args.append("--no-iommu")
    if not data["cmpunlocker_gen2_service"]:
        args.append("--no-gen2-service")
    return args


def source_id(data: Config) -> str:
    """What is installed: the git commit, or ``sha256:<hash>`` of the archive."""
    if data.get("cmpunlocker_archive"):
        return f"sha256:{data['cmpunlocker_archive_sha256']}"
    return str(data.get("cmpunlocker_version"))


def config_problems(data: Config) -> list[tuple[str, str]]:
    """(key, why) for what is wrong with the source settings of an enabled cmpunlocker."""
    if not data.get("cmpunlocker_enabled") or data.get("cmpunlocker_rollback"):
        return []
    found = []
    archive, sha = data.get("cmpunlocker_archive"), data.get("cmpunlocker_archive_sha256")
    source, version = data.get("cmpunlocker_source"), data.get("cmpunlocker_version")
    if archive:
        if source or version:
            found.append(("cmpunlocker_archive", "give either cmpunlocker_archive (with its sha256) or "
                                                 "cmpunlocker_source with cmpunlocker_version, not both"))
        if not sha or not _HEX64.fullmatch(str(sha)):
            found.append(("cmpunlocker_archive_sha256", f"expected the archive's sha256 (64 lowercase hex), got {sha!r}"))
        elif not Path(archive).is_file():
            found.append(("cmpunlocker_archive", f"{archive} is not a file on this controller"))
        else:
            actual = hashlib.sha256(Path(archive).read_bytes()).hexdigest()
            if actual != sha:
                found.append(("cmpunlocker_archive_sha256", f"{archive} has sha256 {actual}, not {sha}"))
        return found
    if not source:
        found.append(("cmpunlocker_source", "cmpunlocker_enabled needs cmpunlocker_source (a git URL) with "
                                            "cmpunlocker_version, or cmpunlocker_archive with its sha256"))
    elif not GIT_URL.fullmatch(str(source)):
        found.append(("cmpunlocker_source", f"expected a git URL (https://, ssh://, file:// or user@host:path), "
                                            f"got {source!r} (git clone would read it as an option)"))
    if not version or not _HEX40.fullmatch(str(version)):
        found.append(("cmpunlocker_version", f"expected a full 40-hex commit id, got {version!r} "
                                             "(a branch or tag moves; forks force-push)"))
    return found


def verify(gpus: list[dict], module: str | None, data: Config) -> tuple[bool, list[str]]:
    """(locked, problems) of an unlock: ``locked`` when any CMP card still shows its locked
    memory; ``problems`` what is wrong with an unlock that took (memory.total not the unlocked
    size, a module not cmpunlocker's, the PCIe link not Gen2 with the Gen2 service on). ``module``: the
    module file's path as facts.py ``module_path`` read it, or None."""
    problems, locked = [], False
    for gpu in gpus:
        if gpu.get("lost"):
            problems.append(f"GPU {gpu.get('bus_id')} fell off the bus")
            continue
        card = card_by_pci_id(gpu.get("pci_device_id"))
        if not card or not card["quirks"].get("needs_unlock"):
            continue
        where = f"GPU {gpu.get('index')} ({gpu.get('uuid')}, {gpu.get('bus_id')}, {gpu.get('pci_device_id')})"
        total = gpu.get("memory_total_mib")
        if total is not None and total <= card["vram_locked_mib"]:
            locked = True
            continue
        if total != card["vram_mib"]:
            problems.append(f"{where}: memory.total {total} MiB, expected {card['vram_mib']} MiB unlocked")
        gen = gpu.get("pcie_gen")
        if data["cmpunlocker_gen2_service"] and gen != 2:
            problems.append(f"{where}: PCIe link Gen{gen}, expected Gen2 (the Gen2 retrain service is on)")
    if not locked and UNLOCKER_MODULE_DIR not in (module or ""):
        problems.append(f"the loaded nvidia module is {module or '(unknown: ' + data['cmpunlocker_module_probe'] + ' printed no module path)'}, "
                        f"not cmpunlocker's (…{UNLOCKER_MODULE_DIR}nvidia.ko): a stock or DKMS module shadows it")
    return locked, problems


def next_step(state: dict, data: Config) -> tuple[str, str]:
    """(step, why): install | pending | verified-now | verify-failed | nothing | rollback |
    rollback-pending | stock-now."""
    stamp = state.get("stamp") or {}
    kind = stamp.get("state")
    same_boot = stamp.get("boot_id") == state.get("boot_id")
    locked, problems = verify(state.get("gpus") or [], state.get("module"), data)
    if data.get("cmpunlocker_rollback"):
        if kind in ("installed", "verified"):
            return "rollback", f"restore the stock modules (remove cmpunlocker {stamp.get('source')})"
        if kind == "rolled-back":
            if not locked or same_boot:
                return "rollback-pending", ("cold power-off required: the stock modules are back; the cards "
                                            "return to stock only after a full power-off (shutdown -h now, "
                                            "power on again)")
            return "stock-now", "the cards are back to stock (locked) after the cold power-off"
        if kind == "stock":
            return "nothing", "rolled back: the stock modules load and the cards are stock"
        return "nothing", "cmpunlocker is not installed"
    if not data.get("cmpunlocker_enabled"):
        return "nothing", "cmpunlocker_enabled is false"
    want = {"source": source_id(data), "args": installer_args(data)}
    if kind not in ("installed", "verified") or any(stamp.get(k) != v for k, v in want.items()):
        return "install", f"install cmpunlocker {want['source']} ({' '.join(want['args'])})"
    if locked:
        if same_boot:
            return "pending", ("cold power-off required: cmpunlocker is installed; the cards unlock only after a "
                               "full power-off (shutdown -h now, wait 30 s, power on); rigup never power-cycles")
        return "pending", ("cold power-off required: the cards are still locked after a reboot; a warm reboot "
                           "leaves stale GSP state, only a full power-off (shutdown -h now) unlocks")
    if problems:
        return "verify-failed", "; ".join(problems)
    if kind == "verified":
        return "nothing", "unlocked and verified"
    return "verified-now", "unlocked: memory.total, module path and PCIe gen verified"
