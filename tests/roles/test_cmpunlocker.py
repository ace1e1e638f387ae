"""roles/cmpunlocker on a lab cmp170hx host, against a stand-in unlocker repository
(tests/lab/unlocker_repo.py): refusals first, then the whole flow: install, "cold power-off
required", a warm reboot that does not unlock, a cold boot, verify, rollback and its cold boot."""

import json

import pytest

from tests.conftest import on_host
from tests.lab import unlocker_repo
from tests.roles.power_lab import cards, data, play

pytestmark = pytest.mark.lab
STAMP = "/var/lib/rigup/cmpunlocker.json"
PROBE = {"cmpunlocker_module_probe": "rigup-gpu-sim module"}   # the lab's "modinfo -n nvidia"


@pytest.fixture(scope="module")
def repo(lab):
    return unlocker_repo.make()


@pytest.fixture(scope="module")
def cmp(lab, repo):
    n = len(lab.hosts()) + 1
    lab.up(1, "cmp170hx", first=n)
    name = f"lab{n}"
    on_host(lab, name, "mkdir -p /lib/modules/$(uname -r)/build")    # kernel headers (preflight 12)
    try:
        yield name
    finally:
        lab.remove(name)


def enabled(repo, **more):
    return data(**{"cmpunlocker_enabled": True, "cmpunlocker_source": repo["url"],
                   "cmpunlocker_version": repo["commit"], **PROBE, **more})


def nothing_installed(lab, host):
    out = lab.ssh(host, f"cat {STAMP}; ls /opt/rigup/cmpunlocker /var/lib/cmpunlocker-standin "
                        "/lib/modules/*/updates/cmpunlocker").stdout
    return out.strip() == ""


def test_refused_with_secure_boot_on_unsupported_driver_and_non_cmp_cards(lab, repo, cmp):
    on_host(lab, cmp, "printf '#!/bin/sh\\necho SecureBoot enabled\\n' > /usr/local/bin/mokutil && "
                      "chmod +x /usr/local/bin/mokutil")
    try:
        run = play(cmp, *enabled(repo), check=False)
    finally:
        on_host(lab, cmp, "rm /usr/local/bin/mokutil")
    assert run.returncode != 0 and f"[{cmp}] refused: cmpunlocker with Secure Boot on" in run.output
    run = play(cmp, *enabled(repo, cmpunlocker_supported_drivers=["610.57.04"]), check=False)
    assert run.returncode != 0
    assert f"[{cmp}] refused: cmpunlocker on NVIDIA driver 610.43.02: its patches apply to exactly 610.57.04" \
        in run.output
    a100 = lab.hosts()[0]["name"]
    run = play(a100, *enabled(repo), check=False)
    assert run.returncode != 0 and f"[{a100}] refused: cmpunlocker on cards that are not CMP 170HX" in run.output
    assert nothing_installed(lab, cmp) and nothing_installed(lab, a100)


def test_an_unpinned_source_is_refused_before_anything_changes(lab, repo, cmp):
    run = play(cmp, *data(cmpunlocker_enabled=True, cmpunlocker_source=repo["url"], cmpunlocker_version="main"),
               check=False)
    assert run.returncode != 0
    assert (f"[{cmp}] refused: cmpunlocker_version (--data): expected a full 40-hex commit id, got 'main'"
            in run.output), run.output[-3000:]
    run = play(cmp, *data(cmpunlocker_enabled=True, cmpunlocker_archive=repo["archive"],
                          cmpunlocker_archive_sha256="0" * 64), check=False)
    assert run.returncode != 0 and f"{repo['archive']} has sha256 {repo['sha256']}, not {'0' * 64}" in run.output
    assert nothing_installed(lab, cmp)


def test_a_failing_installer_leaves_the_host_as_it_was(lab, cmp):
    broken = unlocker_repo.make(fail=True)
    run = play(cmp, *data(cmpunlocker_enabled=True, cmpunlocker_source=broken["url"],
                          cmpunlocker_version=broken["commit"], **PROBE), check=False)
    assert run.returncode != 0
    assert "cmpunlocker: install.sh --profile=8gb failed (1); the previous modules and files are restored" in run.output \
        or "failed (2); the previous modules" in run.output
    assert "stand-in failure" in run.output
    assert lab.ssh(cmp, f"ls /lib/modules/*/updates/cmpunlocker; cat {STAMP}").stdout.strip() == ""


def test_whole_flow_install_cold_boot_verify_rollback(lab, repo, cmp):
    run = play(cmp, *enabled(repo, cmpunlocker_gen2_service=True))
    assert f"[{cmp}] cmpunlocker: install cmpunlocker {repo['commit']} (--profile=8gb); then a cold power-off " \
           "is required" in run.output
    assert on_host(lab, cmp, "cat /var/lib/cmpunlocker-standin/calls.log").splitlines()[-1] == "install.sh --profile=8gb"
    stamp = json.loads(on_host(lab, cmp, f"cat {STAMP}"))
    assert stamp["state"] == "installed" and stamp["source"] == repo["commit"]
    assert on_host(lab, cmp, "test -x /etc/kernel/postinst.d/zz-rigup-cmpunlocker && echo ok").strip() == "ok"
    assert all(c["memory"] == "8192" for c in cards(lab, cmp))

    again = play(cmp, *enabled(repo))
    assert "cold power-off required: cmpunlocker is installed" in again.output
    assert again.totals["changed"] == 0, again.changed_operations()

    lab.reboot(cmp)                                                  # warm: stale GSP state, still locked
    warm = play(cmp, *enabled(repo))
    assert "cold power-off required: the cards are still locked after a reboot" in warm.output
    assert all(c["memory"] == "8192" for c in cards(lab, cmp))

    lab.cold_boot(cmp)
    unlocked = cards(lab, cmp)
    assert all(c["memory"] == "65536" and c["gen"] == "2" and c["name"] == "NVIDIA CMP 170HX" for c in unlocked)
    verify = play(cmp, *enabled(repo))
    assert f"[{cmp}] cmpunlocker: unlocked: memory.total, module path and PCIe gen verified" in verify.output
    assert json.loads(on_host(lab, cmp, f"cat {STAMP}"))["state"] == "verified"
    assert play(cmp, *enabled(repo)).totals["changed"] == 0

    # an upgrade whose installer fails keeps the working unlock: its module, GRUB, modprobe options, marker
    before = on_host(lab, cmp, f"cat /lib/modules/*/updates/cmpunlocker/nvidia.ko /etc/default/grub "
                               f"/etc/modprobe.d/cmp-pcie-gen2.conf {STAMP}")
    broken = unlocker_repo.make(fail=True)
    failed = play(cmp, *data(cmpunlocker_enabled=True, cmpunlocker_source=broken["url"],
                             cmpunlocker_version=broken["commit"], **PROBE), check=False)
    assert failed.returncode != 0 and "stand-in failure" in failed.output
    assert "the previous modules and files are restored" in failed.output
    assert on_host(lab, cmp, f"cat /lib/modules/*/updates/cmpunlocker/nvidia.ko /etc/default/grub "
                             f"/etc/modprobe.d/cmp-pcie-gen2.conf {STAMP}") == before
    assert "unlocked and verified" in play(cmp, *enabled(repo)).output

    # every converge verifies again: a stock or DKMS module shadowing the unlocker's fails it
    shadow = play(cmp, *enabled(repo, cmpunlocker_module_probe="echo /lib/modules/x/updates/dkms/nvidia.ko"),
                  check=False)
    assert shadow.returncode != 0
    assert "the loaded nvidia module is /lib/modules/x/updates/dkms/nvidia.ko, not cmpunlocker's" in shadow.output

    back = play(cmp, *data(cmpunlocker_rollback=True, **PROBE))
    assert f"[{cmp}] cmpunlocker: restore the stock modules" in back.output
    assert lab.ssh(cmp, "ls /lib/modules/*/updates/cmpunlocker /etc/kernel/postinst.d/zz-rigup-cmpunlocker "
                        "/etc/modprobe.d/cmp-pcie-gen2.conf").stdout.strip() == ""
    assert "iommu=pt" not in lab.ssh(cmp, "cat /etc/default/grub").stdout
    assert "cold power-off required" in play(cmp, *data(cmpunlocker_rollback=True, **PROBE)).output
    lab.cold_boot(cmp)
    assert all(c["memory"] == "8192" and c["gen"] == "1" for c in cards(lab, cmp))
    stock = play(cmp, *data(cmpunlocker_rollback=True, **PROBE))
    assert "the cards are back to stock (locked) after the cold power-off" in stock.output
    assert json.loads(on_host(lab, cmp, f"cat {STAMP}"))["state"] == "stock"
    assert play(cmp, *data(cmpunlocker_rollback=True, **PROBE)).totals["changed"] == 0


def test_offline_archive_install_and_verify(lab, repo, cmp):
    """From the tarball (sha256-pinned) instead of git: uploaded, checked on the host, unpacked,
    installed; then the cold boot and the verify, as from git."""
    archived = data(cmpunlocker_enabled=True, cmpunlocker_archive=repo["archive"],
                    cmpunlocker_archive_sha256=repo["sha256"], **PROBE)
    run = play(cmp, *archived)
    assert f"[{cmp}] cmpunlocker: install cmpunlocker sha256:{repo['sha256']} (--profile=8gb)" in run.output
    assert on_host(lab, cmp, "cat /var/lib/cmpunlocker-standin/calls.log").splitlines()[-1] == "install.sh --profile=8gb"
    uploaded = f"/opt/rigup/cmpunlocker/cmpunlocker-{repo['sha256'][:16]}.tar.gz"
    assert on_host(lab, cmp, f"sha256sum {uploaded}").split()[0] == repo["sha256"]
    src = f"/opt/rigup/cmpunlocker/src-{repo['sha256'][:40]}"
    assert on_host(lab, cmp, f"ls {src}").split() == ["driver", "install.sh", "patches"]
    assert f"cd {src} " in on_host(lab, cmp, "cat /etc/kernel/postinst.d/zz-rigup-cmpunlocker")
    stamp = json.loads(on_host(lab, cmp, f"cat {STAMP}"))
    assert stamp["state"] == "installed" and stamp["source"] == f"sha256:{repo['sha256']}"
    assert play(cmp, *archived).totals["changed"] == 0
    lab.cold_boot(cmp)
    assert "unlocked: memory.total, module path and PCIe gen verified" in play(cmp, *archived).output
    assert json.loads(on_host(lab, cmp, f"cat {STAMP}"))["state"] == "verified"
