"""What roles/nvidia_driver reads on a host, in one round trip (preflight's, through ``plan_reads``)."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from rigup.gpu.facts import KERNEL_COMMAND, parse_kernel, sections

MARK = "##rigup-driver:"
# the driver's packages of either distribution (Debian: nvidia-*, libcuda1, firmware-nvidia-gsp;
# Ubuntu: nvidia-*-BRANCH*, libnvidia-*-BRANCH*)
PACKAGES = r"^(nvidia-|libnvidia-|libcuda1 |firmware-nvidia-gsp )"


_PACKAGE = re.compile(r"^(\S+):$")                        # apt-cache policy: a package's section
# its version table: "     VERSION PRIORITY" (Ubuntu adds " (phased N%)"), then its sources' lines
_VERSION = re.compile(r"^ (?:\*\*\*|   ) (\S+) -?[0-9]+(?: \(phased [0-9]+%\))?$")
_SOURCE = re.compile(r"^ {8}-?[0-9]+ (\S+)")
MODULES = ("nvidia-kernel-dkms", "nvidia-open-kernel-dkms")


def parse_policy(lines: list[str]) -> dict[str, dict]:
    """``apt-cache policy P...``'s output -> {package: {"candidate": its candidate or None,
    "versions": every version its sources offer, in apt's order (one only installed, whose one
    source is dpkg's status file, is not offered)}}."""
    out: dict[str, dict] = {}
    current, version = None, None
    for line in lines:
        if m := _PACKAGE.match(line):
            current, version = out.setdefault(m.group(1), {"candidate": None, "versions": []}), None
        elif current is not None and line.strip().startswith("Candidate:"):
            found = line.split(":", 1)[1].strip()
            current["candidate"] = None if found in ("", "(none)") else found
        elif current is not None and (m := _VERSION.match(line)):
            version = m.group(1)
        elif version and (m := _SOURCE.match(line)) and m.group(1) != "/var/lib/dpkg/status" \
                and version not in current["versions"]:
            current["versions"].append(version)
    return out


def parse_driver_host(lines: list[str]) -> dict:
    """:class:`DriverHost`'s output -> its value (see there)."""
    sec = sections(lines, MARK)
    release = dict(line.strip().split("=", 1) for line in sec.get("os", []) if "=" in line)
    packages = {}
    for line in sec.get("packages", []):
        parts = line.split()
        if len(parts) >= 3 and len(parts[2]) >= 2 and parts[2][1] == "i":   # dpkg: installed
            packages[parts[0]] = {"version": parts[1], "held": parts[2][0] == "h"}
    candidate = next((ln.strip() for ln in sec.get("headers", []) if ln.strip()), None)
    policy = parse_policy(sec.get("fabric", []))
    return {"os": {k.lower(): v.strip('"') for k, v in release.items()},
            "packages": packages,
            "modules": sorted(ln.strip() for ln in sec.get("modules", []) if ln.strip()),
            "headers_candidate": None if candidate in (None, "(none)") else candidate,
            "fabric_candidates": {p: v["candidate"] for p, v in policy.items() if p not in MODULES and v["candidate"]},
            # every version the sources offer of each, and the kernel modules' candidates (Debian's
            # pin takes every package of the driver to that version: the fabric manager's must exist)
            "fabric_offers": {p: v["versions"] for p, v in policy.items() if p not in MODULES and v["versions"]},
            "module_candidates": {p: v["candidate"] for p, v in policy.items() if p in MODULES and v["candidate"]},
            **parse_kernel(sec.get("kernel", []))}


class DriverHost(FactBase):
    """The distribution, the NVIDIA driver packages installed (and held), the GPU kernel modules
    loaded, and the apt candidate of the running kernel's headers::

        {"os": {"id": "debian", "version_id": "12", "version_codename": "bookworm"},
         "packages": {"nvidia-smi": {"version": "535.261.03-1", "held": True}, ...},
         "modules": ["nouveau"],                          # of nouveau, nvidia
         "headers_candidate": "6.1.135-1",                # None: no headers package for it
         "fabric_candidates": {"nvidia-fabricmanager-535": "535.261.03-1"},   # NVSwitch hosts only
         "release": "6.1.0-37-amd64", "headers": False}   # the running kernel; its headers installed
    """

    @staticmethod
    def default() -> dict:
        return parse_driver_host([])

    def command(self) -> str:
        return (f"echo '{MARK}os'; grep -E '^(ID|VERSION_ID|VERSION_CODENAME)=' /etc/os-release 2>/dev/null; "
                f"echo '{MARK}packages'; dpkg-query -W -f='${{Package}} ${{Version}} ${{db:Status-Abbrev}}\\n' "
                f"2>/dev/null | grep -E '{PACKAGES}'; "
                f"echo '{MARK}modules'; for m in nouveau nvidia; do [ -d /sys/module/$m ] && echo $m; done; "
                f"echo '{MARK}headers'; apt-cache policy \"linux-headers-$(uname -r)\" 2>/dev/null "
                "| sed -n 's/^ *Candidate: //p'; "
                f"echo '{MARK}kernel'; {KERNEL_COMMAND}; "
                # an NVSwitch on the PCI bus: what the sources offer of the fabric manager and the kernel
                # modules, in one apt-cache call (one per package costs a host seconds)
                f"echo '{MARK}fabric'; if grep -qsx 0x068000 /sys/bus/pci/devices/*/class; then "
                f"LC_ALL=C apt-cache policy $(apt-cache pkgnames nvidia-fabricmanager 2>/dev/null | sort) {' '.join(MODULES)} "
                "2>/dev/null; fi; true")

    def process(self, output: list[str]) -> dict:
        return parse_driver_host(output)
