"""roles/cuda_toolkit without a GPU: Debian's toolkit in a lab host (cuda_source: distro), then
the proof that llama.cpp configures for CUDA with the host's arch and that nvcc compiles a
kernel for sm_80 and sm_90. The full CUDA build is proven on real silicon (tests/gpu/)."""

import shlex

import pytest

from rigup.config import group_vars
from rigup.gpu.facts import GPU_COMMAND, parse_gpus
from rigup.gpu.plan import hardware_plan
from rigup.cuda import RUNTIME
from roles.llama_cpp import cmake_options
from tests.conftest import on_host
from tests.converge import pyinfra
from tests.lab import sources

pytestmark = pytest.mark.lab
CUDA = ("--data", "llama_cpp_backend=cuda", "--data", "cuda_source=distro")
KERNEL = "__global__ void add(float *a, const float *b) { a[threadIdx.x] += b[threadIdx.x]; }\n"


@pytest.fixture(scope="module")
def host(lab, second_converge):
    """The first lab host, with the toolkit installed by the role (twice: idempotence): the host that
    compiles llama.cpp for the others, so the build tools this module installs are not found on a
    host that received its build (test_handover.py asserts it has none, whichever module ran first)."""
    name = lab.hosts()[0]["name"]
    first = pyinfra("inventory/lab.py", "tests/roles/cuda_only.py", "--limit", name, *CUDA)
    assert first.returncode == 0, first.output[-4000:]
    again = pyinfra("inventory/lab.py", "tests/roles/cuda_only.py", "--limit", name, *CUDA)
    assert again.returncode == 0, again.output[-4000:]
    print(f"\ncuda_toolkit (distro) install: {first.seconds:.0f} s; again: {again.seconds:.1f} s")
    # nvcc needs a host compiler, and CMake: a host that received its llama.cpp build has neither
    # (roles/llama_cpp/handover.py)
    on_host(lab, name, "command -v cmake >/dev/null && command -v gcc >/dev/null || DEBIAN_FRONTEND=noninteractive "
                       "apt-get install -y -q --no-install-recommends build-essential cmake >/dev/null")
    return name, again


def test_second_run_changes_nothing(host):
    _, again = host
    assert again.totals["changed"] == 0, again.changed_operations()


def test_nvcc_on_the_path_of_login_shells(lab, host):
    name, _ = host
    assert "release 11.8" in on_host(lab, name, "bash -lc 'nvcc --version'")
    assert "PATH=/usr/bin:" in on_host(lab, name, "cat /etc/rigup/cuda.env")


def test_nvcc_compiles_a_kernel_for_sm80_and_sm90(lab, host):
    name, _ = host
    on_host(lab, name, f"printf %s {shlex.quote(KERNEL)} > /tmp/k.cu")
    for arch in ("80", "90"):
        elf = on_host(lab, name, f"cd /tmp && nvcc -arch=sm_{arch} -c k.cu -o k{arch}.o && "
                                 f"cuobjdump --list-elf k{arch}.o")
        assert f"sm_{arch}.cubin" in elf


def test_llama_cpp_configures_for_cuda_with_the_hosts_arch(lab, host):
    """CMake with exactly the options the role gives this host's plan (from its own nvidia-smi)."""
    name, _ = host
    plan = hardware_plan(parse_gpus(on_host(lab, name, GPU_COMMAND).splitlines()),
                         {"loaded": True}, [])
    data = {**group_vars("all"), **group_vars("lab"), "llama_cpp_backend": "cuda",
            "cuda_source": "distro"}
    options = " ".join(shlex.quote(f"-D{o}") for o in cmake_options(plan, data))
    log = on_host(lab, name, f"rm -rf /tmp/l && git clone -q {sources.url('llama.cpp.git')} /tmp/l"
                             f" && git -C /tmp/l checkout -q lab-base && cmake -S /tmp/l -B /tmp/l/b {options}")
    assert "Using CMAKE_CUDA_ARCHITECTURES=80 " in log and "Including CUDA backend" in log
    cache = on_host(lab, name, "grep -E '^(GGML_CUDA|CMAKE_CUDA_ARCHITECTURES)' /tmp/l/b/CMakeCache.txt")
    assert "GGML_CUDA:BOOL=ON" in cache and "CMAKE_CUDA_ARCHITECTURES:UNINITIALIZED=80" in cache


def test_a_host_that_receives_its_build_gets_no_compiler(lab, host):
    """issue 51: two hosts of one CUDA build in one run: the first the play reaches compiles it
    (the toolkit), the other receives it (roles/llama_cpp/handover.py), so roles/cuda_toolkit
    gives it the CUDA runtime and cuBLAS alone (rigup/cuda.py RUNTIME), the very packages
    Debian's toolkit brings here."""
    name, _ = host
    names = [h["name"] for h in lab.hosts()]
    run = pyinfra("inventory/lab.py", "tests/roles/cuda_only.py", "--dry", *CUDA,
                  *[a for n in names for a in ("--limit", n)], yes=False)
    assert run.returncode == 0, run.output[-3000:]
    lines = {n: [ln for ln in run.output.splitlines() if f"[{n}] CUDA " in ln and "run-time libraries only" in ln]
             for n in names}
    print(f"\n{len(names)} hosts of one build: " + "; ".join(f"{n}: {(lines[n] or ['the toolkit'])[0].strip()}"
                                                          for n in names))
    compiling = [n for n in names if not lines[n]]      # the host the play reaches first compiles
    assert len(compiling) == 1, lines
    assert all(f"from {compiling[0]} (compiled in this run" in run.output for n in names if lines[n]), run.output[-3000:]
    packages = RUNTIME[("debian", 12)]
    status = on_host(lab, name, "dpkg-query -W -f '${Package} ${Status}\\n' " + " ".join(packages))
    assert status.count("install ok installed") == len(packages), status
