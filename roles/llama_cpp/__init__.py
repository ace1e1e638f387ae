"""roles/llama_cpp: llama.cpp compiled on the host for the host's own GPUs.

What it does to a host:
- installs the build tools (compiler, CMake, git, ccache);
- builds ``llama_cpp_targets`` from ``llama_cpp_source`` at ``llama_cpp_ref`` (or from
  ``llama_cpp_archive``) into ``llama_cpp_dir/builds/<ref>-<hash>``, where the hash covers the
  source, the ref, the CMake options and the targets. CUDA builds name the host's archs as an
  explicit list (never ``native``: a build host may have no GPU). Static binaries
  (``BUILD_SHARED_LIBS=OFF``), ccache, Release;
- switches ``current`` to the new build only after its ``llama-server --version`` ran; the build
  it replaced stays as ``previous``, and ``llama_cpp_rollback: true`` switches back to it.
The same inputs again build nothing and change nothing (a stamp per build, read in one round
trip). A failed build leaves ``current`` alone and shows the compiler's last lines.

Variables (roles/llama_cpp/defaults.yml): llama_cpp_source, llama_cpp_ref, llama_cpp_archive,
llama_cpp_dir, llama_cpp_backend, llama_cpp_targets, llama_cpp_cmake_options, llama_cpp_jobs,
llama_cpp_ccache_dir, llama_cpp_rollback, llama_cpp_build_timeout, llama_cpp_prebuilt_ui; and
gpu_enabled (roles/preflight), cuda_source and cuda_version (roles/cuda_toolkit).
"""

from __future__ import annotations

import click
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, python

from rigup import apt, progress
from rigup.files import directory
from rigup.config import role_defaults
from rigup.gpu.plan import build_backend
from rigup.state import read_once
from roles.llama_cpp.build import build_log, build_stamp, built, switched
from roles.llama_cpp.checks import CHECKS
from roles.llama_cpp.facts import BUILD_UNIT, LlamaCppState
from roles.llama_cpp.script import build_id, cmake_options, render_build_script

__all__ = ["apply", "CHECKS", "BUILD_PACKAGES"]

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "pkg-config"]


@deploy("llama_cpp", data_defaults=role_defaults("llama_cpp"))
def apply(plan: dict):
    data = host.data.dict()
    dir = data["llama_cpp_dir"]
    if data["llama_cpp_rollback"]:
        switched(name="Roll llama.cpp back to the previous build", dir=dir, target="previous")
        return
    apt.installed(name="Install build tools", packages=BUILD_PACKAGES,
                  cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=10)
    ccache = data["llama_cpp_ccache_dir"]
    directory(name=f"Directory {ccache}", path=ccache, paths=[ccache], mode=None, user=None, group=None)
    options = cmake_options(plan, data)
    archive = None
    if data["llama_cpp_archive"]:
        archive = f"{dir}/src-{build_id(data, options)}.tar.gz"
        files.put(name="Upload the llama.cpp source archive", src=data["llama_cpp_archive"],
                  dest=archive)
    ident = build_id(data, options)
    click.echo(f"    [{host.name}] llama.cpp {ident}: cmake " + " ".join(f"-D{o}" for o in options), err=True)
    build = built(name=f"Build llama.cpp {data['llama_cpp_ref']} ({build_backend(plan, data)})", dir=dir,
                  build_id=ident, script=render_build_script(data, options, archive),
                  _timeout=data["llama_cpp_build_timeout"])
    systemd = read_once(LlamaCppState, dir=dir)["systemd"]
    python.call(name=f"Wait for the llama.cpp build {ident}", function=progress.waited,
                label=f"llama.cpp build {ident}", unit=BUILD_UNIT, log=build_log(dir, ident),
                done=progress.exists(build_stamp(dir, ident)), systemd=systemd,
                timeout=data["llama_cpp_build_timeout"], _if=build.did_change)
    switched(name=f"llama.cpp current -> {ident}", dir=dir, target=f"builds/{ident}")
