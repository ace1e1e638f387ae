"""What roles/nvidia_driver reads on a host, in one round trip (preflight's, through ``plan_reads``)."""

from __future__ import annotations

from pyinfra.api import FactBase

from rigup.gpu.facts import KERNEL_COMMAND, parse_kernel, sections

MARK = "##rigup-driver:"
# the driver's packages of either distribution (Debian: nvidia-*, libcuda1, firmware-nvidia-gsp;
# Ubuntu: nvidia-*-BRANCH*, libnvidia-*-BRANCH*)
PACKAGES = r"^(nvidia-|libnvidia-|libcuda1 |firmware-nvidia-gsp )"


def _offers(lines: list[str], mark: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in (ln.split() for ln in lines):
        if len(p) == 3 and p[0] == mark:
            out.setdefault(p[1], []).append(p[2])
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
    return {"os": {k.lower(): v.strip('"') for k, v in release.items()},
            "packages": packages,
            "modules": sorted(ln.strip() for ln in sec.get("modules", []) if ln.strip()),
            "headers_candidate": None if candidate in (None, "(none)") else candidate,
            "fabric_candidates": {p[0]: p[1] for p in (ln.split() for ln in sec.get("fabric", []))
                                  if len(p) == 2 and p[1] != "(none)"},
            # every version the sources offer of each, and the kernel modules' candidates (Debian's
            # pin takes every package of the driver to that version: the fabric manager's must exist)
            "fabric_offers": _offers(sec.get("fabric", []), "offer"),
            "module_candidates": {p[1]: p[2] for p in (ln.split() for ln in sec.get("fabric", []))
                                  if len(p) == 3 and p[0] == "module" and p[2] != "(none)"},
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
                # an NVSwitch on the PCI bus: what the sources offer of the fabric manager
                f"echo '{MARK}fabric'; if grep -qsx 0x068000 /sys/bus/pci/devices/*/class; then "
                "for p in $(apt-cache pkgnames nvidia-fabricmanager 2>/dev/null | sort); do "
                "echo \"$p $(apt-cache policy \"$p\" 2>/dev/null | sed -n 's/^ *Candidate: //p')\"; "
                "apt-cache madison \"$p\" 2>/dev/null | awk -F' [|] ' -v p=\"$p\" '{print \"offer \" p \" \" $2}'; done; "
                "for p in nvidia-kernel-dkms nvidia-open-kernel-dkms; do "
                "echo \"module $p $(apt-cache policy \"$p\" 2>/dev/null | sed -n 's/^ *Candidate: //p')\"; done; fi; true")

    def process(self, output: list[str]) -> dict:
        return parse_driver_host(output)
