"""roles/cuda_toolkit: the CUDA compiler and libraries that llama.cpp and vLLM build against.

What it does to a host (only when it builds for CUDA: GPUs present, gpu_enabled, and
llama_cpp_backend not cpu):
- ``cuda_source: nvidia``: NVIDIA's apt repository through cuda-keyring (ubuntu2204,
  ubuntu2404, debian12), then ``cuda-toolkit-X-Y`` only, never a driver package;
- ``distro``: Debian's or Ubuntu's ``nvidia-cuda-toolkit`` (enables Debian's contrib and non-free
  components; Debian's toolkit brings the driver's user-space libraries, not a kernel module);
- ``present``: installs nothing, and fails when ``nvcc`` of ``cuda_version`` is not there;
- a host that does not compile its llama.cpp build (it has it, or receives it from the host that
  compiled it: the plan's ``llama_cpp_compiles``, roles/llama_cpp) gets only what a CUDA build
  loads at run time: the CUDA runtime and cuBLAS (rigup/cuda.py ``RUNTIME``), no compiler;
- PATH and LD_LIBRARY_PATH for login shells (/etc/profile.d/rigup-cuda.sh) and for rigup's
  units (/etc/rigup/cuda.env).
apt waits on the dpkg lock (roles/base) and transient failures are retried. The right version
already present changes nothing. An nvcc the build would run as root under a directory that is not
root's alone (Debian's /usr/local is 2775 root:staff) is not used: preflight refuses the host once,
naming the directory, its mode and owner, and the fix (checks.py ``check_nvcc_root_alone``).

Variables (roles/cuda_toolkit/defaults.yml): cuda_source, cuda_version.
"""

import shlex

from pyinfra import host
from pyinfra.api import OperationError, deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import LinuxDistribution

from rigup import apt
from rigup.cuda import runtime_packages, toolkit_packages
from rigup.config import Config, role_defaults
from rigup.files import managed
from rigup.gpu.facts import CudaToolkits, RefusedNvcc
from rigup.gpu.plan import Plan, build_backend, nvcc_path
from rigup.state import read_once, reading
from rigup.templates import render
from rigup.text import shown
from roles.cuda_toolkit.checks import CHECKS, nvcc_refusal

KEYRING_URL = "https://developer.download.nvidia.com/compute/cuda/repos/{repo}/x86_64/cuda-keyring_1.1-1_all.deb"
REPOS = {("ubuntu", 22): "ubuntu2204", ("ubuntu", 24): "ubuntu2404", ("debian", 12): "debian12"}
__all__ = ["apply", "CHECKS"]


def _home(data: Config) -> str:
    return f"/usr/local/cuda-{data['cuda_version']}" if data["cuda_source"] == "nvidia" else "/usr"


@reading(DebPackages)
@operation()
def keyring(repo: str):
    """NVIDIA's cuda-keyring package (the apt source and its key), unless installed."""
    if "cuda-keyring" in read_once(DebPackages):
        host.noop("cuda-keyring is installed")
        return
    url = KEYRING_URL.format(repo=repo)
    # a directory of its own (mktemp -d, root's 0700): a fixed name in /tmp is anyone's to place first
    yield ('t=$(mktemp -d) && curl -fsSL --retry 3 -o "$t/cuda-keyring.deb" ' + shlex.quote(url)
           + ' && dpkg -i "$t/cuda-keyring.deb" && rm -rf "$t" && ' + apt.waiting(apt.updated(), apt.lock_timeout()))


@reading(CudaToolkits)
@operation()
def version_present(version: str):
    """Fail unless an nvcc of ``version`` is installed (cuda_source: present)."""
    found = [t["version"] for t in read_once(CudaToolkits)]
    if version not in found:
        raise OperationError(shown(f"cuda_source is present but no nvcc {version} is installed "
                                   f"(found: {', '.join(found) or 'none'}); install it or set cuda_source", 4000))
    host.noop(f"nvcc {version} is installed")
    return
    yield


@operation()
def compiler_root_alone(path: str, source: str, version: str):
    """Fail the host when the nvcc just installed at ``path`` is one root may not run (a directory up to /
    not root's alone: Debian's /usr/local is 2775 root:staff), before llama.cpp compiles with it as root:
    preflight had nothing to read before the install, and says it itself from the next run on
    (checks.py ``check_nvcc_root_alone``). Run only after an install (``_if``): a converged host reads
    nothing more."""
    for refused in read_once(RefusedNvcc):
        if path in refused["seen_as"]:
            r = nvcc_refusal(refused, path, f"the build compiles with it as root (cuda_source {source})", source, version)
            raise OperationError(shown(f"{r.what}: {r.why}; fix: {r.fix}", 4000))
    host.noop(f"{path} is root's alone")
    return
    yield


@deploy("cuda_toolkit", data_defaults=role_defaults("cuda_toolkit"))
def apply(plan: Plan, data: Config):
    if build_backend(plan, data) != "cuda":
        return
    source, version = data["cuda_source"], data["cuda_version"]
    compiles = plan.get("llama_cpp_compiles", True)
    if source == "present":
        if compiles:
            version_present(name=f"CUDA {version} is installed", version=version)
    elif source == "nvidia":
        distro = read_once(LinuxDistribution)
        repo = REPOS.get((distro["release_meta"].get("ID"), distro["major"]))
        if not repo:
            raise OperationError(shown(f"{host.name}: cuda_source nvidia supports ubuntu 22.04/24.04 and "
                                       f"debian 12, not {distro['name']} {distro['major']}; use distro", 4000))
        keyring(name="NVIDIA's CUDA apt repository", repo=repo)
        runtime = None if compiles else runtime_packages(source, version, ())
        installed = apt.installed(name=f"Install cuda-toolkit {version}" if not runtime
                                  else f"Install CUDA {version}'s run-time libraries",
                                  packages=runtime or toolkit_packages(source, version), cache_seconds=0, _retries=2,
                                  _retry_delay=30)
    else:
        distro = read_once(LinuxDistribution)
        ident = distro["release_meta"].get("ID")
        wanted = (None if compiles else runtime_packages(source, version, (ident, distro["major"]))) \
            or toolkit_packages(source, version)
        if ident == "debian":
            # libcuda1 and the CUDA libraries need nvidia-support (contrib) and non-free
            apt.components(name="Debian contrib and non-free components", names=["contrib", "non-free"],
                           _if=lambda: not set(wanted) <= set(read_once(DebPackages)))
        installed = apt.installed(name="Install nvidia-cuda-toolkit" if wanted == toolkit_packages(source, version)
                                  else "Install the CUDA run-time libraries",
                                  packages=wanted, cache_seconds=0, _retries=2, _retry_delay=30)
    if source != "present" and compiles:
        compiler_root_alone(name="The CUDA compiler is root's alone", path=nvcc_path(plan, data), source=source,
                            version=version, _if=installed.did_change)
    paths = env_paths(data)
    both = ["/etc/profile.d/rigup-cuda.sh", "/etc/rigup/cuda.env"]
    managed(name="CUDA on login shells' PATH", dest=both[0], paths=both,
            text=render("cuda_toolkit-profile.sh.j2", **paths))
    managed(name="CUDA for rigup's units", dest=both[1], paths=both, text=render("cuda_toolkit.env.j2", **paths))


def env_paths(data: Config) -> dict[str, str]:
    """The values of /etc/profile.d/rigup-cuda.sh and /etc/rigup/cuda.env (their templates'): the
    toolkit's version, its bin and library directories."""
    home, source = _home(data), data["cuda_source"]
    return {"version": data["cuda_version"], "bin_dir": f"{home}/bin",
            "lib_dir": f"{home}/lib64" if source == "nvidia" else "/usr/lib/x86_64-linux-gnu"}


def unit_env(plan: Plan, data: Config) -> str | None:
    """The text of /etc/rigup/cuda.env that :func:`apply` writes for the host, or None where it writes
    none (no CUDA build): tune.py compares the host's with it (plays.tuning ``differences``)."""
    return render("cuda_toolkit.env.j2", **env_paths(data)) if build_backend(plan, data) == "cuda" else None


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Its line of the plan where the host gets no CUDA compiler."""
    if build_backend(plan, data) != "cuda" or plan.get("llama_cpp_compiles", True):
        return []
    return [f"CUDA {data['cuda_version']} ({data['cuda_source']}): the run-time libraries only, no compiler "
            "(this host's llama.cpp build is not compiled here)"]


ROLE = Role("cuda_toolkit", apply, checks=CHECKS, plan_lines=plan_lines)
