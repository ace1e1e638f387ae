"""roles/nvidia_driver on the lab: a bare host (an a100 profile's 8 cards on its PCI bus, no
nvidia-smi, no driver) goes to serving in one deploy.py run with nvidia_driver_branch 535: Debian
12's driver packages really installed from the distribution through the lab's proxy (the kernel
module's load is the lab's stand-in: tests/lab/lab.py DRIVER_HOOK), then every later role on the
plan made from the PCI bus; the second converge changes nothing. (A branch change on serving hosts
through roll.py: tests/roles/test_roll.py.)"""

import json

import pytest

from tests.conftest import on_host
from tests.converge import converge

pytestmark = pytest.mark.lab
BRANCH = ("--data", "nvidia_driver_branch=535")
PROMPT = json.dumps({"model": "gemma", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})


@pytest.fixture(scope="module")
def bare(lab):
    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    lab.up(1, "a100", first=first, driver=False)
    name = f"lab{first}"
    try:
        yield name
    finally:
        lab.remove(name)


@pytest.fixture(scope="module")
def served(lab, bare):
    before = lab.ssh(bare, "command -v nvidia-smi").returncode
    pci = on_host(lab, bare, "ls /sys/bus/pci/devices | wc -l").strip()
    first = converge("inventory/lab.py", "--limit", bare, *BRANCH, timeout=2400)
    again = converge("inventory/lab.py", "--limit", bare, *BRANCH)
    print(f"\nbare host {bare} ({pci} NVIDIA cards on its PCI bus, nvidia-smi found: {before == 0}): "
          f"one converge to serving in {first.seconds:.0f} s ({first.totals['changed']} changed); "
          f"again: {again.seconds:.1f} s, {again.totals['changed']} changed")
    assert before != 0 and pci == "8"
    return first, again


def test_a_bare_host_serves_after_one_deploy_run(lab, bare, served):
    first, _ = served
    assert f"[{bare}] cards:     8 x a100 (from the PCI bus: no driver answers yet)" in first.output
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


def test_preflight_holds_cuda_to_the_driver_before_any_change(lab, bare, served):
    """On the host now at 535 (CUDA up to 12.2): a CUDA 12.8 toolkit, and a vLLM wheel built for
    CUDA 13, are refused naming both versions; pinned to branch 570 the toolkit passes (the plan's
    driver is the branch it will have), and that branch change on a serving host is refused outside
    a roll. Preflight changes nothing: the next converge still has nothing to do."""
    from tests.converge import pyinfra
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
    assert converge("inventory/lab.py", "--limit", bare, *BRANCH).totals["changed"] == 0
