"""roles/nvidia_driver on the lab: a bare HGX host (the hgx-h100 profile's 8 cards and 4 NVSwitch
chips on its PCI bus, no nvidia-smi, no driver) goes to serving in one deploy.py run with
nvidia_driver_branch 535: Debian 12's driver packages really installed from the distribution through
the lab's proxy (the kernel module's load is the lab's stand-in: tests/lab/lab.py DRIVER_HOOK), the
fabric manager of the branch at the driver's release from the host's other source (the lab's
apt repository of stand-in packages, as NVIDIA's CUDA repository would be: tests/lab/fabric_debs.py;
it holds the driver's release, named as NVIDIA names it, 535.309.01-1 where Debian's security
update is 535.309.01-0+deb12u1, and another release), running, the fabric registered before the instance
starts (its unit ordered after the fabric manager), then every later role on the plan made from the
PCI bus; the second converge changes nothing. (A branch change on serving hosts through roll.py:
tests/roles/test_roll.py.)"""

import json

import pytest

from tests.conftest import on_host
from tests.converge import converge

pytestmark = pytest.mark.lab
BRANCH = ("--data", "nvidia_driver_branch=535")
PROMPT = json.dumps({"model": "gemma", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})




@pytest.fixture(scope="module")
def bare(lab):
    from roles.nvidia_driver.packages import upstream
    from tests.lab import fabric_debs, hub

    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    lab.up(1, "hgx-h100", first=first, driver=False)
    name = f"lab{first}"
    try:
        version = on_host(lab, name, fabric_debs.CANDIDATE).strip()
        assert version.startswith("535."), version
        # the driver's release as NVIDIA's CUDA repository names it (535.309.01-1: Debian's security
        # update is 535.309.01-0+deb12u1), and a fabric manager of the branch at another release
        nvidia, other = f"{upstream(version)}-1", "535.999.01-1"
        fabric_debs.build([nvidia, other])
        hub.serve()
        on_host(lab, name, fabric_debs.source_setup())   # the operator's second source (NVIDIA's CUDA repository)
        yield name, version, nvidia
    finally:
        lab.remove(name)


@pytest.fixture(scope="module")
def served(lab, bare):
    bare = bare[0]
    before = lab.ssh(bare, "command -v nvidia-smi").returncode
    pci = on_host(lab, bare, "ls /sys/bus/pci/devices | wc -l").strip()
    first = converge("inventory/lab.py", "--limit", bare, *BRANCH, timeout=2400)
    again = converge("inventory/lab.py", "--limit", bare, *BRANCH)
    print(f"\nbare host {bare} ({pci} NVIDIA cards on its PCI bus, nvidia-smi found: {before == 0}): "
          f"one converge to serving in {first.seconds:.0f} s ({first.totals['changed']} changed); "
          f"again: {again.seconds:.1f} s, {again.totals['changed']} changed")
    assert before != 0 and pci == "12"      # 8 cards, 4 NVSwitches
    return first, again


def test_a_bare_host_serves_after_one_deploy_run(lab, bare, served):
    bare = bare[0]
    first, _ = served
    assert f"[{bare}] cards:     8 x h100 (from the PCI bus: no driver answers yet)" in first.output
    assert f"[{bare}] driver:    branch 535 (proprietary modules) to install" in first.output
    smi = on_host(lab, bare, "nvidia-smi --query-gpu=driver_version,pci.bus_id --format=csv,noheader").splitlines()
    assert len(smi) == 8 and all(line.startswith("535.") for line in smi), smi
    held = on_host(lab, bare, "apt-mark showhold").split()
    versions = on_host(lab, bare, "dpkg-query -W -f='${Package} ${Version}\\n' nvidia-kernel-dkms nvidia-smi libcuda1")
    print(f"held: {held}\n{versions}")
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"} <= set(held)
    assert len({line.split()[1] for line in versions.splitlines()}) == 1, versions   # one release, module and libraries
    assert "blacklist nouveau" in on_host(lab, bare, "cat /etc/modprobe.d/rigup-nouveau.conf")
    assert on_host(lab, bare, "systemctl is-active nvidia-persistenced rigup-llama@gemma").split() == ["active"] * 2
    answer = json.loads(on_host(lab, bare, "curl -s -m 120 http://127.0.0.1:8081/v1/completions -H "
                                           f"'Content-Type: application/json' -d '{PROMPT}'"))
    print(f"answer: {answer['choices'][0]['text']!r}")
    assert answer["choices"][0]["text"].strip()


def test_the_second_converge_changes_nothing(served):
    _, again = served
    assert again.totals["changed"] == 0, again.changed_operations()
    assert "every role converged" in again.output


def test_the_fabric_manager_runs_at_the_drivers_version_before_the_instance(lab, bare, served):
    """The fabric manager of the branch at exactly the driver's version (of the two the source
    offers), held with it, active; every card's fabric registered; the instance's unit ordered
    after it and started after it."""
    bare, _, nvidia = bare
    first, _ = served
    fm = on_host(lab, bare, "dpkg-query -W -f='${Version}\\n' nvidia-fabricmanager-535 libnvidia-nscq-535; "
                            "apt-mark showhold | grep -c -e fabricmanager -e nscq").split()
    fabric = on_host(lab, bare, "nvidia-smi --query-gpu=fabric.state,fabric.status --format=csv,noheader").splitlines()
    starts = on_host(lab, bare, "for u in nvidia-fabricmanager rigup-llama@gemma; do "
                                "systemctl show -p ActiveEnterTimestampMonotonic --value $u; done").split()
    after = on_host(lab, bare, "systemctl show -p After --value rigup-llama@gemma")
    plan = [ln.strip() for ln in first.output.splitlines() if "fabric:" in ln]
    print(f"fabric manager {fm}; cards: {sorted(set(fabric))} x {len(fabric)}; started at {starts} (monotonic us); "
          f"plan: {plan[:1]}")
    assert fm[:2] == [nvidia, nvidia] and fm[2] == "2"                    # 535.999.01-1 offered, not taken
    assert on_host(lab, bare, "systemctl is-active nvidia-fabricmanager").strip() == "active"
    assert fabric == ["Completed, Success"] * 8
    assert "nvidia-fabricmanager.service" in after.split() and 0 < int(starts[0]) < int(starts[1])
    assert plan and "4 x NVSwitch" in plan[0]


def test_a_stopped_fabric_manager_drains_the_host_and_the_next_converge_serves_again(lab, bare, served):
    """The fabric manager stopped by hand: the GPU guard trips at its second check in a row that
    finds it down (issue 65: one answer drains nothing), naming the fabric (serving stopped), status.py names the cause; the next converge starts the fabric
    manager, waits for the fabric, clears that trip and serves again."""
    import time
    from tests.converge import pyinfra

    bare = bare[0]
    tripped = "/var/lib/rigup/gpu-guard.tripped"
    on_host(lab, bare, "systemctl stop nvidia-fabricmanager")
    stopped, record = time.monotonic(), None
    while time.monotonic() - stopped < 50 and not record:
        time.sleep(1)
        record = lab.ssh(bare, f"cat {tripped} 2>/dev/null").stdout.strip()
    drained = time.monotonic() - stopped
    serving = lab.ssh(bare, "systemctl is-active rigup-llama@gemma").stdout.strip()
    status = pyinfra("inventory/lab.py", "status.py", "--limit", bare, timeout=120)
    back = converge("inventory/lab.py", "--limit", bare, *BRANCH)
    after = on_host(lab, bare, "systemctl is-active nvidia-fabricmanager rigup-llama@gemma").split()
    print(f"fabric manager stopped: guard tripped after {drained:.0f} s (interval 10 s, two checks in a row): {record[:160]}; "
          f"gemma {serving}; status.py: "
          + "; ".join(ln.strip()[:160] for ln in status.output.splitlines() if "fabric" in ln or "TRIPPED" in ln)
          + f"\nnext converge: {back.seconds:.0f} s, changed: {back.changed_operations()}; then {after}")
    assert json.loads(record)["reason"] == "the NVSwitch fabric: nvidia-fabricmanager.service is inactive"
    assert drained < 35 and serving != "active"    # two checks 10 s apart
    assert "guard TRIPPED" in status.output and "the NVSwitch fabric" in status.output
    assert after == ["active", "active"] and lab.ssh(bare, f"test -e {tripped}").returncode != 0
    assert any("NVSwitch fabric registered" in op for op in back.changed_operations())


def test_a_fabric_manager_offered_only_at_another_version_is_refused_naming_both(lab, bare, served):
    """The host's fabric manager removed, its source offering the branch's fabric manager at another
    version only: preflight refuses, naming both versions, before any change; the source mended, the
    next converge installs it at the driver's version and serves again."""
    from tests.converge import pyinfra
    from tests.lab import fabric_debs

    bare, version, nvidia = bare
    fm = "nvidia-fabricmanager-535 libnvidia-nscq-535"
    fabric_debs.build(["535.999.01-1"])
    on_host(lab, bare, f"systemctl stop nvidia-fabricmanager; apt-mark unhold {fm} >/dev/null; "
                       f"apt-get purge -y -qq {fm} >/dev/null 2>&1; apt-get -qq update")
    refused = pyinfra("inventory/lab.py", "preflight.py", "--limit", bare, *BRANCH)
    lines = [ln.strip() for ln in refused.output.splitlines() if "refused:" in ln]
    fabric_debs.build([nvidia, "535.999.01-1"])
    on_host(lab, bare, "apt-get -qq update")
    back = converge("inventory/lab.py", "--limit", bare, *BRANCH)
    installed = on_host(lab, bare, "dpkg-query -W -f='${Version}' nvidia-fabricmanager-535").strip()
    print("\n".join(lines) + f"\nmended: {back.seconds:.0f} s, fabric manager {installed}")
    assert refused.returncode != 0 and any(
        f"[{bare}] refused: NVSwitch host: its sources offer nvidia-fabricmanager-535 at 535.999.01-1, the driver at "
        f"{version}" in ln for ln in lines), lines
    assert installed == nvidia
    assert on_host(lab, bare, "systemctl is-active nvidia-fabricmanager rigup-llama@gemma").split() == ["active"] * 2


def test_preflight_holds_cuda_to_the_driver_before_any_change(lab, bare, served):
    """On the host now at 535 (CUDA up to 12.2): a CUDA 12.8 toolkit, and a vLLM wheel built for
    CUDA 13, are refused naming both versions; pinned to branch 570 the toolkit passes (the plan's
    driver is the branch it will have), and that branch change on a serving host is refused outside
    a roll. Preflight changes nothing: the next converge still has nothing to do."""
    from tests.converge import pyinfra
    bare = bare[0]
    cuda = ("--data", "llama_cpp_backend=cuda", "--data", 'cuda_version="12.8"')
    vllm = ("--data", "vllm_pip_version=0.33.0+cu130",
            "--data", 'vllm_instances={"v": {"model": "gemma-270m", "port": 8000}}')
    runs = {what: pyinfra("inventory/lab.py", "preflight.py", "--limit", bare, *args)
            for what, args in (("toolkit", (*BRANCH, *cuda)), ("wheel", (*BRANCH, *vllm)),
                               ("branch 570", ("--data", "nvidia_driver_branch=570", *cuda)))}
    for what, run in runs.items():
        print(f"{what}: exit {run.returncode}; " + "; ".join(line.strip()[:160] for line in run.output.splitlines()
                                                             if "refused:" in line))
    assert runs["toolkit"].returncode != 0
    assert f"[{bare}] refused: NVIDIA driver 535.309.01 is too old for CUDA 12.8" in runs["toolkit"].output
    assert "runs CUDA up to 12.2" in runs["toolkit"].output
    assert f"[{bare}] refused: the vLLM wheel is built for CUDA 13.0" in runs["wheel"].output
    assert "newer than NVIDIA driver 535.309.01 runs" in runs["wheel"].output
    assert "too old for CUDA" not in runs["branch 570"].output
    assert f"[{bare}] refused: driver 535.309.01 -> branch 570 on a serving host" in runs["branch 570"].output
    # the plan of a serving HGX host names its fabric: switches, manager, NVLinks, the cards' state
    fabric = [ln.strip() for ln in runs["toolkit"].output.splitlines() if f"[{bare}] fabric:" in ln]
    print(f"plan: {fabric}")
    assert fabric == [f"[{bare}] fabric:    4 x NVSwitch, fabric manager 535.309.01 active, 18 NVLinks up per GPU, "
                      "8 cards Completed/Success"]
    # an NVSwitch host: a branch whose fabric manager its sources lack is refused with it (issue 48)
    assert f"[{bare}] refused: NVSwitch host (4 x NVSwitch): no nvidia-fabricmanager-570 in its sources" \
        in runs["branch 570"].output
    assert converge("inventory/lab.py", "--limit", bare, *BRANCH).totals["changed"] == 0
