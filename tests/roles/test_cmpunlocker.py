"""roles/cmpunlocker on a lab cmp170hx host, against a stand-in unlocker repository
(tests/lab/unlocker_repo.py): refusals first, then the whole flow: install, "cold power-off
required", a warm reboot that does not unlock, a cold boot, verify, rollback and its cold boot;
last, the CMP runbook (docs/cmp170hx.md) on the same rack, from stock cards to serving with the
stand-in vLLM (tests/lab/vllm_stub.py): a fork at a (short) commit and a base plus patches."""

import json
import subprocess
import time

import pytest

from rigup import config
from tests.conftest import on_host
from tests.lab import unlocker_repo, vllm_stub
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


# ----------------------------------------------------------------------------- the CMP runbook
RUNBOOK = "tests/roles/cmp_only.py"
STUB_URL = "file:///root/vllm-stub/vllm-stub.git"
QWEN, DRAFTER, REV, PORT = "/srv/models/qwen-stub", "/srv/models/drafter-stub", "1" * 40, 8000
SPECULATIVE = {"method": "draft_model", "num_speculative_tokens": 5}


@pytest.fixture(scope="module")
def stub(lab, cmp, tmp_path_factory):
    """The stand-in vLLM on the rig: its repository (main, and the already patched fork on branch
    cmp170hx), the patch series of main with its manifest, and the wheel of an extra package."""
    tmp = tmp_path_factory.mktemp("vllm-stub")
    base = vllm_stub.make_repo(tmp / "repo")
    patches = vllm_stub.make_patches(tmp / "repo", tmp / "patches")
    fork = vllm_stub.make_fork(tmp / "repo")
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp / "repo"), str(tmp / "vllm-stub.git")], check=True)
    vllm_stub.extra_wheel(tmp / "wheels")
    vllm_stub.published(lab, tmp, cmp)
    series = [str(patches[n]) for n in ("0001-greeting.patch", "0002-patch-level.patch")]
    return {"base": base, "fork": fork, "series": series,
            "manifest": str(vllm_stub.manifest(series, tmp / "SHA256SUMS"))}


def runbook(repo, stub, **over) -> list[str]:
    """docs/cmp170hx.md's recipe on the lab: the pinned (stand-in) unlocker, caps 180 W with one
    card at 150 W, the fork at a short commit with an extra package, a drafter by name."""
    lab_vars = config.load_yaml(config.GROUP_VARS_DIR / "lab.yml")
    entry = {"repo": "rigup-lab/qwen-stub", "revision": REV, "dest": QWEN}
    instance = {"model": "qwen", "port": PORT, "pp": 2, "pp_partition": "3,3", "layers": 6,
                "gpu_memory_utilization": 0.94, "draft_model": "drafter", "speculative": SPECULATIVE}
    return data(**{"cmpunlocker_enabled": True, "cmpunlocker_source": repo["url"],
                   "cmpunlocker_version": repo["commit"], **PROBE,
                   "gpu_power_watts": 180, "gpu_power_overrides": {"0000:0A:00.0": 150},
                   "models": {**lab_vars["models"], "qwen": entry,
                              "drafter": {**entry, "repo": "rigup-lab/drafter-stub", "dest": DRAFTER}},
                   "vllm_instances": {"qwen": instance},
                   "vllm_git_url": STUB_URL, "vllm_git_commit": stub["fork"][:9],
                   "vllm_extra_packages": [f"{vllm_stub.EXTRA_NAME}=={vllm_stub.EXTRA_VERSION}"],
                   "vllm_installer": "pip", "vllm_health_timeout": 60,     # the stub, offline:
                   "vllm_pip_args": ["--no-index", "--find-links", "/root/vllm-stub/wheels", "--no-build-isolation"],
                   **over})


def stock_rig(lab, host):
    """The rig as it came (stock cards, no unlocker), the models written in place (no fetch)."""
    on_host(lab, host, "rm -rf /lib/modules/*/updates/cmpunlocker /etc/kernel/postinst.d/zz-rigup-cmpunlocker "
                       f"/etc/modprobe.d/cmp-pcie-gen2.conf /opt/rigup/cmpunlocker {STAMP}")
    lab.cold_boot(host)
    for dest, repo in ((QWEN, "rigup-lab/qwen-stub"), (DRAFTER, "rigup-lab/drafter-stub")):
        marker = json.dumps({"repo": repo, "revision": REV, "files": ["config.json"], "bytes": 2})
        on_host(lab, host, f"mkdir -p {dest} && echo '{{}}' > {dest}/config.json && "
                           f"printf '%s' '{marker}' > {dest}/.rigup-complete.json && chmod -R a+rX {dest}")


def caps(lab, host) -> dict[str, float]:
    return {c["bus_id"]: float(c["limit"]) for c in cards(lab, host)}


def ask(lab, host) -> tuple[dict, str]:
    """What the stand-in vLLM runs with (its argv, patch level) and one chat completion's answer."""
    info = json.loads(on_host(lab, host, f"curl -sf http://127.0.0.1:{PORT}/rigup-stub"))
    answer = on_host(lab, host, "curl -sf -H 'Content-Type: application/json' -d '{\"model\": \"qwen\", "
                                f"\"messages\": []}}' http://127.0.0.1:{PORT}/v1/chat/completions")
    return info, json.loads(answer)["choices"][0]["message"]["content"]


def test_the_cmp_runbook_from_stock_cards_to_serving(lab, repo, cmp, stub):
    """docs/cmp170hx.md on the lab rig: the first converge installs the unlocker, the caps and
    the fork's virtualenv (its short commit expanded on the host, an extra package in it) while
    serving waits for the unlocked VRAM; the cold power-off unlocks; the next converge verifies
    and serves, with the drafter; the base-plus-patches recipe then replaces the fork."""
    figures, mark = [], time.monotonic()
    stock_rig(lab, cmp)
    locked = cards(lab, cmp)
    assert {c["memory"] for c in locked} == {"8192"}
    figures.append(f"stock rig (files removed, cold boot): {time.monotonic() - mark:.1f} s; "
                   f"VRAM {len(locked)} x {locked[0]['memory']} MiB")

    fork, unlocker = stub["fork"], ""
    if lab.ssh(cmp, "command -v git").returncode != 0:   # a rig no earlier test converged: base brings git
        bare = play(cmp, *runbook(repo, stub), file=RUNBOOK)
        assert (f"[{cmp}] vllm: vllm_git_commit {fork[:9]} is expanded with git on the host, which roles/base "
                "installs in this run: converge again to install vLLM") in bare.output, bare.output[-4000:]
        figures.append(f"converge 0 (no git on the rig yet: vLLM waits for it): {bare.seconds:.1f} s")
        unlocker = bare.output
    first = play(cmp, *runbook(repo, stub), file=RUNBOOK)
    out = first.output
    assert (f"[{cmp}] cmpunlocker: the VRAM checks count 65536 MiB per card (unlocked); the cards report 8192 MiB "
            "(locked): serving waits until they report 65536 MiB, after a cold power-off") in out, out[-4000:]
    assert f"[{cmp}] vllm:      a fork at a commit: {STUB_URL} at {fork}" in out, out[-4000:]
    assert (f"[{cmp}] vllm:      vllm_git_commit {fork[:9]} is {fork} in {STUB_URL} (expanded on the host): "
            f"pin it: vllm_git_commit: \"{fork}\"") in out
    assert f"[{cmp}] vllm:      extra packages in its virtualenv: {vllm_stub.EXTRA_NAME}==0.0.1" in out
    assert f"[{cmp}] vllm:      qwen: 1 replica x 2 GPUs (GPU 0-1), drafter drafter; waits for the unlocked VRAM" in out
    assert f"[{cmp}] cmpunlocker: install cmpunlocker {repo['commit']} (--profile=8gb)" in (unlocker or out)
    changed = " ".join(first.changed_operations())
    assert f"vllm virtualenv git-{fork[:12]} (0 patches)" in changed and "vllm qwen answers" not in changed
    venv = f"/opt/rigup/vllm/git-{fork[:12]}/venv/bin/python"
    assert on_host(lab, cmp, f"{venv} -c 'import rigup_stub_extra as x; print(x.VERSION)'").strip() == "0.0.1"
    assert lab.ssh(cmp, "test -e /etc/systemd/system/rigup-vllm@qwen.service.d").returncode != 0
    last = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith(f"[{cmp}] converged ("))
    assert "vllm qwen: waits for the unlocked VRAM (cold power-off, then converge again)" in last, last
    assert "llama-server gemma: waits for the unlocked VRAM" in last       # lab.yml's instance waits too
    want = {c["bus_id"]: 150.0 if c["bus_id"].endswith("0A:00.0") else 180.0 for c in locked}
    assert caps(lab, cmp) == want
    figures.append(f"converge 1 (unlocker, caps, fork venv; serving waits): {first.seconds:.1f} s, "
                   f"{first.totals['changed']} changed; caps read back: {sorted(set(caps(lab, cmp).values()))} W")

    again = play(cmp, *runbook(repo, stub), file=RUNBOOK)
    assert again.totals["changed"] == 0, again.changed_operations()
    assert f"[{cmp}] vllm:      qwen: 1 replica x 2 GPUs (GPU 0-1), drafter drafter; waits for the unlocked VRAM" \
        in again.output
    figures.append(f"converge 2 (cards still 8 GB): {again.seconds:.1f} s, 0 changed")

    mark = time.monotonic()
    lab.cold_boot(cmp)                                   # the operator's shutdown -h now, power on
    unlocked = cards(lab, cmp)
    assert {c["memory"] for c in unlocked} == {"65536"} and caps(lab, cmp) == want   # the boot unit's caps
    figures.append(f"cold power-off and on: {time.monotonic() - mark:.1f} s; VRAM {len(unlocked)} x "
                   f"{unlocked[0]['memory']} MiB; caps after boot: {sorted(set(caps(lab, cmp).values()))} W")

    served = play(cmp, *runbook(repo, stub), file=RUNBOOK)
    assert f"[{cmp}] cmpunlocker: unlocked: memory.total, module path and PCIe gen verified" in served.output
    assert "waits for the unlocked VRAM" not in served.output
    assert "vllm qwen answers" in " ".join(served.changed_operations())
    info, answer = ask(lab, cmp)
    spec = '{"method":"draft_model","model":"%s","num_speculative_tokens":5}' % DRAFTER
    assert info["patch_level"] == 5 and answer == "hello from the fork"
    assert info["extra"][:2] == ["--speculative-config", spec], info["extra"]
    assert on_host(lab, cmp, "systemctl is-active rigup-vllm@qwen.service").strip() == "active"
    figures.append(f"converge 3 (verify, serve the fork): {served.seconds:.1f} s; answer {answer!r}")

    patched = play(cmp, *runbook(repo, stub, vllm_git_commit=stub["base"], vllm_patches=stub["series"],
                                 vllm_patch_manifest=stub["manifest"]), file=RUNBOOK)
    assert (f"[{cmp}] vllm:      a base plus a patch series: {STUB_URL} at {stub['base']}, then 0001-greeting.patch, "
            "0002-patch-level.patch (sha256 checked)") in patched.output
    changed = " ".join(patched.changed_operations())
    assert f"vllm virtualenv git-{stub['base'][:12]} (2 patches)" in changed and "vllm qwen answers" in changed
    info, answer = ask(lab, cmp)
    assert info["patch_level"] == 2 and answer == "hello from the patched stub"
    assert caps(lab, cmp) == want
    figures.append(f"converge 4 (base + 2 patches replaces the fork): {patched.seconds:.1f} s; answer {answer!r}")
    print("\n" + "\n".join(figures))
