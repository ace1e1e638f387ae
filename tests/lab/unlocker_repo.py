"""A stand-in for cmpunlocker's source repository, for the cmpunlocker role's lab tests.

``make()`` creates a git repository served by the lab's file server
(``http://GATEWAY:8000/cmpunlocker.git``) and a .tar.gz of the same tree, and returns
``{"url", "commit", "archive", "sha256"}``. Its ``install.sh`` takes the real installer's options
(``--profile=8gb|10gb``, ``--no-iommu``, ``--no-gen2-service``), records them in
/var/lib/cmpunlocker-standin/calls.log on the host, refuses what the real one refuses (Secure
Boot on, a driver not in driver/VERSION), and installs what the real one installs: a patched
``nvidia.ko`` under /lib/modules/$(uname -r)/updates/cmpunlocker/, the Gen2 modprobe options
and the iommu=pt GRUB change. It never touches the cards: the simulated cards come up unlocked
at the next COLD boot (``lab.cold_boot``) because that module is there (tests/lab/nvidia_smi.py
``power_cycle``). A file driver/FAIL (``make(fail=True)``) makes it fail halfway, after
overwriting the module with a half-built one, as a broken build would.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path

from tests.lab import lab, sources

NAME = "cmpunlocker.git"
INSTALL_SH = r"""#!/bin/sh
# Stand-in for cmpunlocker's install.sh (rigup lab): records its arguments, installs a module.
set -e
log=/var/lib/cmpunlocker-standin/calls.log
mkdir -p "$(dirname "$log")"
echo "install.sh $*" >> "$log"
profile=8gb; iommu=1; gen2=1
for a in "$@"; do
    case "$a" in
        --profile=*) profile=${a#--profile=} ;;
        --no-iommu) iommu=0 ;;
        --no-gen2-service) gen2=0 ;;
        *) echo "install.sh: unknown option $a"; exit 2 ;;
    esac
done
case "$profile" in 8gb|10gb) ;; *) echo "install.sh: unknown profile $profile"; exit 2 ;; esac
if command -v mokutil >/dev/null 2>&1 && mokutil --sb-state 2>/dev/null | grep -q "SecureBoot enabled"; then
    echo "Secure Boot is enabled: the patched modules would not load. Aborting."; exit 1
fi
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
grep -qx "$driver" driver/VERSION || { echo "driver $driver is not in driver/VERSION"; exit 1; }
release=${KERNELRELEASE:-$(uname -r)}
echo "building open-gpu-kernel-modules $driver with $(ls patches | wc -l) patches for $release"
mkdir -p "/lib/modules/$release/updates/cmpunlocker"
echo "stand-in patched nvidia.ko $driver $profile" > "/lib/modules/$release/updates/cmpunlocker/nvidia.ko"
if [ -e driver/FAIL ]; then
    echo "stand-in half-built nvidia.ko" > "/lib/modules/$release/updates/cmpunlocker/nvidia.ko"
    echo "make: *** [modules] Error 2 (stand-in failure)"; exit 2
fi
echo "removing nvidia DKMS"
if [ "$gen2" = 1 ]; then
    mkdir -p /etc/modprobe.d
    echo 'options nvidia NVreg_RegistryDwords="RmForceEnableGen2=1;RMPcieLinkSpeed=0x1"' > /etc/modprobe.d/cmp-pcie-gen2.conf
fi
if [ "$iommu" = 1 ]; then
    mkdir -p /etc/default
    echo 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"' >> /etc/default/grub
fi
echo "Done. A FULL POWER-OFF is required (shutdown -h now); a reboot is not enough."
"""


def _tree(root: Path, fail: bool) -> None:
    (root / "driver").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "install.sh").write_text(INSTALL_SH)
    (root / "install.sh").chmod(0o755)
    (root / "driver" / "VERSION").write_text("610.43.02\n610.43.03\n")
    for i in range(1, 4):
        (root / "patches" / f"{i:04d}-stand-in.patch").write_text(f"stand-in patch {i}\n")
    if fail:
        (root / "driver" / "FAIL").write_text("1\n")


def make(fail: bool = False) -> dict:
    """The stand-in repository (served by the lab's file server) and an archive of its tree."""
    sources.serve()
    name = "cmpunlocker-fail.git" if fail else NAME
    bare = sources.SRV / name
    with tempfile.TemporaryDirectory(dir=lab.STATE) as tmp:
        work = Path(tmp) / "cmpunlocker"
        _tree(work, fail)
        lab.run("git", "init", "-q", "-b", "main", work)
        sources._git(work, "add", "-A")
        sources._git(work, "commit", "-q", "-m", "cmpunlocker stand-in")
        commit = sources._git(work, "rev-parse", "HEAD")
        archive = lab.STATE / f"{name.removesuffix('.git')}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(work, arcname="cmpunlocker", filter=lambda m: None if "/.git" in m.name else m)
        shutil.rmtree(bare, ignore_errors=True)
        lab.run("git", "clone", "-q", "--bare", work, bare)
        sources._git(bare, "update-server-info")
    return {"url": sources.url(name), "commit": commit, "archive": str(archive),
            "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}
