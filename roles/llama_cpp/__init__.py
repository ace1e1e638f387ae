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

import hashlib
import json
import re
import shlex
from pathlib import Path

import click
import jinja2
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files

from roles import cuda_toolkit
from roles.common import TEMPLATES, apt
from roles.config import role_defaults
from roles.gpu.plan import build_backend
from roles.llama_cpp.build import built, switched

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "pkg-config"]


def cmake_options(plan: dict, data: dict) -> list[str]:
    """The CMake cache entries of a build on a host with this plan."""
    options = [
        "CMAKE_BUILD_TYPE=Release",
        "BUILD_SHARED_LIBS=OFF",
        "LLAMA_BUILD_TESTS=OFF",
        "LLAMA_BUILD_EXAMPLES=OFF",
        "LLAMA_OPENSSL=OFF",
        "GGML_RPC=ON",
        f"LLAMA_USE_PREBUILT_UI={'ON' if data['llama_cpp_prebuilt_ui'] else 'OFF'}",
        "CMAKE_C_COMPILER_LAUNCHER=ccache",
        "CMAKE_CXX_COMPILER_LAUNCHER=ccache",
    ]
    if build_backend(plan, data) == "cuda":
        options += [
            "GGML_CUDA=ON",
            "CMAKE_CUDA_ARCHITECTURES=" + ";".join(plan["cuda_archs"]),
            f"CMAKE_CUDA_COMPILER={cuda_toolkit.nvcc_path(plan, data)}",
            "CMAKE_CUDA_COMPILER_LAUNCHER=ccache",
        ]
        if plan["quirks"].get("fma_throttled"):  # CMP 170HX: FP32 FMA is cut in firmware
            options.append("CMAKE_CUDA_FLAGS=-fmad=false")
    else:
        options.append("GGML_CUDA=OFF")
    return options + list(data["llama_cpp_cmake_options"])


def build_id(data: dict, options: list[str]) -> str:
    """``<ref>-<hash>``: the same source, ref, options and targets give the same id."""
    archive = data["llama_cpp_archive"]
    source = hashlib.sha256(Path(archive).read_bytes()).hexdigest() if archive else data["llama_cpp_source"]
    key = json.dumps([source, data["llama_cpp_ref"], options, data["llama_cpp_targets"]])
    ref = re.sub(r"[^A-Za-z0-9._-]", "_", data["llama_cpp_ref"])[:40]
    return f"{ref}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def render_build_script(data: dict, options: list[str], archive_on_host: str | None = None) -> str:
    """The build script for these inputs (also run alone by tests/gpu/check.sh)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    return env.get_template("llama_cpp-build.sh.j2").render(
        dir=data["llama_cpp_dir"],
        build_id=build_id(data, options),
        options_id=hashlib.sha256(json.dumps(options).encode()).hexdigest()[:10],
        archive=archive_on_host,
        source=data["llama_cpp_source"],
        ref=data["llama_cpp_ref"],
        targets=data["llama_cpp_targets"],
        ccache_dir=data["llama_cpp_ccache_dir"],
        cmake_options=options,
        jobs=data["llama_cpp_jobs"] or "$(nproc)",
    )


@deploy("llama_cpp", data_defaults=role_defaults("llama_cpp"))
def apply(plan: dict):
    data = host.data.dict()
    dir = data["llama_cpp_dir"]
    if data["llama_cpp_rollback"]:
        switched(name="Roll llama.cpp back to the previous build", dir=dir, target="previous")
        return
    apt.installed(name="Install build tools", packages=BUILD_PACKAGES,
                  cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=10)
    files.directory(name=f"Directory {data['llama_cpp_ccache_dir']}", path=data["llama_cpp_ccache_dir"])
    options = cmake_options(plan, data)
    archive = None
    if data["llama_cpp_archive"]:
        archive = f"{dir}/src-{build_id(data, options)}.tar.gz"
        files.put(name="Upload the llama.cpp source archive", src=data["llama_cpp_archive"],
                  dest=archive)
    ident = build_id(data, options)
    click.echo(f"    [{host.name}] llama.cpp {ident}: cmake " + " ".join(f"-D{o}" for o in options), err=True)
    built(name=f"Build llama.cpp {data['llama_cpp_ref']} ({build_backend(plan, data)})", dir=dir,
          build_id=ident, script=render_build_script(data, options, archive),
          _timeout=data["llama_cpp_build_timeout"])
    switched(name=f"llama.cpp current -> {ident}", dir=dir, target=f"builds/{ident}")
