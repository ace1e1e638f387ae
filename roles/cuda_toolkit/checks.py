"""roles/cuda_toolkit's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py).

    check_driver_for_cuda   a driver older than the chosen cuda_version needs
    check_cuda_for_archs    a cuda_version too old for the host's cards, or too new (CUDA 13: cc >= 7.5)
    check_nvcc_root_alone   the nvcc the build would run as root sits where another user can replace it
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.gpu.catalogue import cuda_version, min_driver_for_cuda, newest_cuda_for_driver, oldest_cc, version_tuple
from rigup.gpu.driver import driver_for_checks
from rigup.gpu.plan import build_backend, gpu_host, nvcc_path
from rigup.refusal import Refusal

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def check_driver_for_cuda(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The loaded driver (or the nvidia_driver_branch it is changed to) is older than the chosen
    cuda_version needs (where the host builds for CUDA: the toolkit is installed for that alone)."""
    if not gpu_host(plan, data) or build_backend(plan, data) != "cuda":
        return []
    wanted = str(data.get("cuda_version") or "")
    driver, named = driver_for_checks(plan)
    if version_tuple(wanted) is None:
        return [Refusal(f"cuda_version {wanted!r} is not a CUDA version",
                        "it must be major.minor, e.g. \"12.8\"",
                        "set cuda_version to a quoted major.minor (on the command line: "
                        "--data 'cuda_version=\"12.8\"')", "driver_for_cuda")]
    need = min_driver_for_cuda(wanted)
    if not driver or need is None or version_tuple(driver) is None:
        return []
    listed, min_driver = need
    if version_tuple(driver) >= version_tuple(min_driver):
        return []
    newest = newest_cuda_for_driver(driver)
    table = "" if listed == wanted else f" (the minimum of CUDA {listed}, the nearest listed)"
    return [Refusal(
        f"NVIDIA driver {named} is too old for CUDA {wanted}",
        f"CUDA {wanted} needs driver >= {min_driver}{table} (CUDA release notes; "
        "rigup/gpu/catalogue.yml cuda_min_driver); driver " + f"{named} runs CUDA up to {newest or '?'}",
        (f"set cuda_version to {newest} or older (the newest this driver runs), or " if newest else "")
        + (f"set nvidia_driver_branch to {min_driver.split('.')[0]} or newer" if named != driver
           else f"upgrade the NVIDIA driver to >= {min_driver}"), "driver_for_cuda")]


def check_cuda_for_archs(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The chosen cuda_version is older than the host's cards need (plan min_cuda), or newer than
    still builds for them (CUDA 13 dropped compute capability below 7.5: catalogue oldest_cc)."""
    if not gpu_host(plan, data):
        return []
    wanted = str(data.get("cuda_version") or "")
    floor = oldest_cc("cuda", wanted) if version_tuple(wanted) else None
    old = sorted({(c["class"], c.get("cmake_arch")) for c in plan.get("cards") or []
                  if floor and c.get("compute_capability") and tuple(c["compute_capability"]) < floor[0]})
    if old:
        cc = ".".join(map(str, floor[0]))
        return [Refusal(f"CUDA {wanted} cannot build for this host's cards",
                        f"{', '.join(f'{cls} (sm_{arch})' for cls, arch in old)}: CUDA {floor[1]} and later build for "
                        f"compute capability >= {cc} only (rigup/gpu/catalogue.yml oldest_cc)",
                        f"set cuda_version below {floor[1]} (e.g. \"12.9\")", "cuda_for_archs")]
    needed = plan.get("min_cuda")
    if version_tuple(wanted) is None or not needed or cuda_version(wanted) >= cuda_version(needed):
        return []
    short = {}
    for card in plan.get("cards") or []:
        if card.get("min_cuda") and cuda_version(card["min_cuda"]) > cuda_version(wanted):
            short[(card["class"], card.get("cmake_arch"), card["min_cuda"])] = True
    cards = "; ".join(f"{cls} cards (sm_{arch}) need CUDA >= {need}" for cls, arch, need in short)
    return [Refusal(f"CUDA {wanted} is too old for this host's cards",
                    f"{cards}: nvcc {wanted} cannot build for them (rigup/gpu/catalogue.yml min_cuda)",
                    f"set cuda_version to {needed} or newer", "cuda_for_archs")]


def check_nvcc_root_alone(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The nvcc this host's build would compile with as root (cuda_source nvidia or distro: its fixed
    path; present: none of cuda_version found, and one refused) is one the CUDA fact found and did not run:
    a directory up to / of its real path or of a link on the way to it is not root's alone (rigup/gpu/facts.py
    parse_refused_nvcc; Debian's /usr/local is 2775 root:staff). Said once here, naming the directory and the fix, rather than a
    toolkit that is silently "none installed" (and the build's CMAKE_CUDA_COMPILER another user's)."""
    if not gpu_host(plan, data) or build_backend(plan, data) != "cuda" or not plan.get("llama_cpp_compiles", True):
        return []
    refused = facts.get("cuda_refused") or []
    source, version = data.get("cuda_source"), str(data.get("cuda_version") or "")
    wanted = nvcc_path(plan, data)
    if source == "present":
        if any(t.get("version") == version for t in facts.get("cuda_toolkits") or []):
            return []
        hits, then = refused, f"no nvcc {version} is found that root may run (cuda_source present)"
    else:   # the build runs it by this name: a name refused (its real path's directories or its own)
        hits = [r for r in refused if wanted in r["seen_as"]]
        then = f"the build compiles with it as root (cuda_source {source})"
    return [nvcc_refusal(r, wanted, then, source, version) for r in hits]


def nvcc_refusal(refused: dict, wanted: str, then: str, source: str, version: str) -> Refusal:
    """The refusal of an nvcc the CUDA fact did not run (``refused``: rigup/gpu/facts.py
    parse_refused_nvcc), named ``wanted`` where it was found by that name: preflight's, and the
    install's own (roles/cuda_toolkit ``compiler_root_alone``) when the compiler came in this run."""
    other = {"nvidia": "; or set cuda_source to distro (/usr/bin/nvcc)",
             "present": f"; or install nvcc {version} where root alone writes"}.get(source, "")
    return Refusal(f"nvcc {wanted if wanted in refused['seen_as'] else refused['path']} not used",
                   f"{refused['why']}: {then}, and root must not run a program another user can replace",
                   f"{refused['fix']}{other}", "nvcc_root_alone")


CHECKS = (check_driver_for_cuda, check_cuda_for_archs, check_nvcc_root_alone)
