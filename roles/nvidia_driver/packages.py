"""The NVIDIA driver's packages by distribution (pure; roles/nvidia_driver installs them).

Debian (non-free, bookworm: 535): one branch per release, named by version (nvidia-smi
535.261.03-1), so the install checks the candidate's branch first. The headless set: the DKMS
kernel module, nvidia-smi, libcuda1 and the persistence daemon; the open modules need the GSP
firmware. Ubuntu (restricted): the branch is in the names, the server (long-lived) branches'
headless packages, as NVIDIA's own Ansible role installs them.
"""

from __future__ import annotations


def driver_packages(os_id: str, branch: int, modules: str) -> dict | None:
    """``{"packages": [...], "components": [...], "versioned": bool, "probe": name}`` for
    ``os_id`` (debian, ubuntu), or None for another distribution. ``versioned``: the branch is in
    the packages' versions (check ``probe``'s candidate before installing), not their names."""
    if os_id == "debian":
        module = ["nvidia-open-kernel-dkms", "firmware-nvidia-gsp"] if modules == "open" else ["nvidia-kernel-dkms"]
        return {"packages": [*module, "nvidia-smi", "libcuda1", "nvidia-persistenced"],
                "components": ["contrib", "non-free", "non-free-firmware"], "versioned": True, "probe": "nvidia-smi"}
    if os_id == "ubuntu":
        flavour = "-open" if modules == "open" else ""
        return {"packages": [f"nvidia-headless-{branch}-server{flavour}", f"nvidia-utils-{branch}-server"],
                "components": [], "versioned": False, "probe": f"nvidia-utils-{branch}-server"}
    return None


def at_branch(installed: dict, packages: list[str], branch: int, versioned: bool) -> list[str]:
    """Those of ``packages`` that are not installed at ``branch`` (``installed``: DriverHost's
    packages), in order."""
    return [p for p in packages if p not in installed
            or (versioned and not str(installed[p]["version"]).startswith(f"{branch}."))]
