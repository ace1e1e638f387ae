"""The NVIDIA driver's packages by distribution (pure; roles/nvidia_driver installs them).

Debian (non-free, bookworm: 535): one branch per release, named by version (nvidia-smi
535.261.03-1), so the install checks the candidate's branch first. The headless set: the DKMS
kernel module, nvidia-smi, libcuda1 and the persistence daemon; the open modules need the GSP
firmware. Its open modules (contrib, their own source package) lag the driver's security updates
(seen 2026-12-03: nvidia-open-kernel-dkms 535.261.03-1 in bookworm, the libraries and firmware
535.309.01 in bookworm-security): apt cannot install them beside the newest libraries, so every
package is pinned to the kernel module's release (an apt preference, :func:`PIN_FILE`), and
``auto`` takes the proprietary modules on Debian, which follow the security updates. Ubuntu (restricted): the branch is in the names, the server (long-lived) branches'
headless packages, as NVIDIA's own Ansible role installs them.
"""

from __future__ import annotations

import re


PIN_FILE = "/etc/apt/preferences.d/rigup-nvidia-driver"
# The packages PIN_FILE pins to the kernel module's release: the driver's family by name, globs
# (apt ignores a version pin of "Package: *", warning "Did not understand pin type version": the
# generic form takes release and origin pins only; seen on a lab host, where a fabric manager of
# another version was installed beside the driver)
PINNED = "nvidia-* libnvidia-* libcuda1 firmware-nvidia-gsp"


def preferred_modules(os_id: str) -> tuple[str, ...]:
    """The module flavours ``nvidia_driver_modules: auto`` tries, best first, on ``os_id``."""
    return ("proprietary", "open") if os_id == "debian" else ("open", "proprietary")


FABRIC_PACKAGE = re.compile(r"(?:nvidia-fabricmanager|libnvidia-nscq)-[0-9]{3}")   # a branch's, of either


def other_fabric(installed: dict, packages: list[str]) -> list[str]:
    """The fabric manager packages of another branch installed (``installed``: DriverHost's
    packages), which a branch change replaces in the same apt transaction: rigup holds them with the
    driver, and held, apt would not take them out for the new branch's (they conflict)."""
    return sorted(p for p in installed if FABRIC_PACKAGE.fullmatch(p) and p not in packages)


def driver_packages(os_id: str, branch: int, modules: str, nvswitch: bool = False) -> dict | None:
    """``{"packages": [...], "components": [...], "versioned": bool, "probe": name}`` for
    ``os_id`` (debian, ubuntu), or None for another distribution. ``versioned``: the branch is in
    the packages' versions, not their names: ``probe`` (the kernel module's package) has its
    candidate checked to be of the branch, and every package is pinned to its version. On an
    NVSwitch host (``nvswitch``) the set has the fabric manager and its NSCQ library of the same
    branch, held with the driver: on Ubuntu from the same archive; on Debian, which ships none, from
    another source of the host's (NVIDIA's CUDA repository names them alike), pinned to the kernel
    module's version with every other package (check_fabric refuses a host whose sources have none
    of the branch)."""
    fabric = [f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"] if nvswitch else []
    if os_id == "debian":
        module = ["nvidia-open-kernel-dkms", "firmware-nvidia-gsp"] if modules == "open" else ["nvidia-kernel-dkms"]
        return {"packages": [*module, "nvidia-smi", "libcuda1", "nvidia-persistenced", *fabric],
                "components": ["contrib", "non-free", "non-free-firmware"], "versioned": True, "probe": module[0]}
    if os_id == "ubuntu":
        flavour = "-open" if modules == "open" else ""
        return {"packages": [f"nvidia-headless-{branch}-server{flavour}", f"nvidia-utils-{branch}-server", *fabric],
                "components": [], "versioned": False, "probe": f"nvidia-utils-{branch}-server"}
    return None


def upstream(version: str) -> str:
    """A Debian version's upstream part (no epoch, no revision): what the fabric manager compares
    with the driver. Debian's security update 535.309.01-0+deb12u1 and NVIDIA's CUDA repository's
    fabric manager 535.309.01-1 are the same driver release."""
    version = version.partition(":")[2] or version
    return version.rpartition("-")[0] or version


def at_branch(installed: dict, packages: list[str], branch: int, versioned: bool) -> list[str]:
    """Those of ``packages`` that are not installed at ``branch`` (``installed``: DriverHost's
    packages), in order."""
    return [p for p in packages if p not in installed
            or (versioned and not str(installed[p]["version"]).startswith(f"{branch}."))]
