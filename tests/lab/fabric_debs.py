"""Stand-ins for NVIDIA's fabric manager packages, which no registry this project reaches has
(they come from NVIDIA's CUDA repository and Ubuntu's restricted archive): built with dpkg-deb at
the versions a test names and served as a flat apt repository by the lab hub (``/_apt/``, from
APT_DIR; tests/lab/hub.py). What is simulated is only the daemon:

- ``nvidia-fabricmanager-BRANCH`` VERSION: ``/usr/bin/nv-fabricmanager`` and its
  ``nvidia-fabricmanager.service`` (not started by the package, as NVIDIA's is not). The daemon
  refuses to start when the loaded driver (the lab's nvidia-smi) is at another version than its
  own, as the real one does ("fabric manager version mismatch"); at the same version it writes its
  version to /run/nvidia-fabricmanager/ready, which the lab's nvidia-smi reads for an HGX
  profile's fabric.state/status (Completed/Success), and removes it when it stops.
- ``libnvidia-nscq-BRANCH`` VERSION: an empty library package (the NVSwitch query library the
  real fabric manager ships with).
Each provides, conflicts with and replaces its virtual ``...-branch`` name, as NVIDIA's apt
packages do (NVIDIA/yum-packaging-fabric-manager#1: ``nvidia-fabricmanager-branch``), so that apt
takes one branch's out when another's comes in (a driver roll on an NVSwitch host).

A host of an HGX profile gets the repository as its second source with :data:`SOURCE_SETUP`; the
version of the driver apt would install there is :data:`CANDIDATE`'s answer.

    python -m tests.lab.fabric_debs 535.261.03-1 [VERSION...]   # build into APT_DIR
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.lab import lab

APT_DIR = lab.STATE / "hub" / "apt"
READY = "/run/nvidia-fabricmanager/ready"
# What apt would install of the proprietary kernel module with the driver's components, read into
# a scratch directory (the host's own sources and lists unchanged): the fabric manager's version.
# Every index must come (--error-on=any, 3 tries): one run's update lost bookworm-security's, read
# bookworm's 535.261.03 where the role then installed the security update's 535.309.01, and the
# stand-in fabric manager did not match the driver (test_roll, 2026-12-05).
CANDIDATE = ("d=$(mktemp -d) && mkdir -p $d/parts $d/lists/partial && for f in /etc/apt/sources.list.d/*.sources; do "
             "sed 's/^Components: main$/Components: main contrib non-free non-free-firmware/' $f > $d/parts/${f##*/}; done && "
             "o=\"-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$d/parts -o Dir::State::Lists=$d/lists\" && "
             "ok= && for i in 1 2 3; do if apt-get -qq --error-on=any $o update >/dev/null 2>&1; then ok=1; break; fi; "
             "sleep 3; done; [ -n \"$ok\" ] && apt-cache $o policy nvidia-kernel-dkms | sed -n 's/^ *Candidate: //p'; "
             "rm -rf $d")
SOURCE_FILE = "/etc/apt/sources.list.d/rigup-lab-fabric.list"

DAEMON = f"""#!/bin/sh
# rigup lab: the fabric manager's stand-in (tests/lab/fabric_debs.py)
own=@VERSION@
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
if [ "$driver" != "$own" ]; then
    echo "nv-fabricmanager: fabric manager version $own does not match the loaded driver ${{driver:-(none)}}" >&2
    exit 1
fi
mkdir -p /run/nvidia-fabricmanager && echo "$own" > {READY}
echo "nv-fabricmanager $own: fabric registered"
exec sleep infinity
"""

UNIT = f"""[Unit]
Description=NVIDIA fabric manager (rigup lab stand-in)
After=nvidia-persistenced.service

[Service]
ExecStart=/usr/bin/nv-fabricmanager
ExecStopPost=/bin/rm -f {READY}

[Install]
WantedBy=multi-user.target
"""


def _deb(out: Path, name: str, version: str, files: dict[str, tuple[str, int]], description: str, virtual: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, (text, mode) in files.items():
            f = root / path.lstrip("/")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
            f.chmod(mode)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: rigup lab <lab@rigup.invalid>\n"
            f"Provides: {virtual}\nConflicts: {virtual}\nReplaces: {virtual}\n"
            f"Section: non-free/utils\nPriority: optional\nDescription: {description}\n")
        deb = out / f"{name}_{version}_amd64.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                       check=True, capture_output=True)
    return deb


def build(versions: list[str], out: Path = APT_DIR) -> Path:
    """The stand-in packages at each Debian ``version`` (e.g. 535.261.03-1: its branch is the
    name's), and the repository's Packages index; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.deb"):
        old.unlink()
    debs = []
    for version in versions:
        upstream, branch = version.split("-")[0], version.split(".")[0]
        debs.append(_deb(out, f"nvidia-fabricmanager-{branch}", version,
                         {"/usr/bin/nv-fabricmanager": (DAEMON.replace("@VERSION@", upstream), 0o755),
                          "/lib/systemd/system/nvidia-fabricmanager.service": (UNIT, 0o644)},
                         "NVIDIA fabric manager (rigup lab stand-in)", "nvidia-fabricmanager-branch"))
        debs.append(_deb(out, f"libnvidia-nscq-{branch}", version,
                         {f"/usr/share/doc/libnvidia-nscq-{branch}/README": ("rigup lab stand-in\n", 0o644)},
                         "NVIDIA NVSwitch query library (rigup lab stand-in)", "libnvidia-nscq-branch"))
    stanzas = []
    for deb in debs:
        data = deb.read_bytes()
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        stanzas.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    index = "\n".join(stanzas).encode()
    (out / "Packages").write_bytes(index)
    (out / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    return out


def source_line(gateway: str = str(lab.GATEWAY), port: int | None = None) -> str:
    """The apt source of the lab's repository (the hub's http origin; unsigned: trusted=yes)."""
    from tests.lab import hub

    return f"deb [trusted=yes] http://{gateway}:{port or hub.PORT}/_apt/ ./\n"


def source_setup() -> str:
    """The shell command that gives a lab host the repository as a second source, reached directly
    (not through the lab's package proxy), as an operator adds NVIDIA's CUDA repository."""
    import shlex

    return (f"printf %s {shlex.quote(source_line())} > {SOURCE_FILE} && "
            f"echo 'Acquire::http::Proxy::{lab.GATEWAY} \"DIRECT\";' > /etc/apt/apt.conf.d/02rigup-lab-fabric && "
            "apt-get -qq update")


if __name__ == "__main__":
    print(build(sys.argv[1:]))
