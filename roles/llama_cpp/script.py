"""The llama.cpp build a host's plan asks for, as pure functions: its CMake options, its id,
and its build script. roles/llama_cpp runs the script on hosts; tests/gpu/check.py runs the same
script on a real GPU machine without pyinfra."""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import re
import shlex
from pathlib import Path

from functools import lru_cache

from rigup.boundary import owned
from rigup.config import ConfigError
from rigup.templates import render
from rigup.gpu.plan import build_backend, nvcc_path

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.config import Config


def cmake_options(plan: Plan, data: Config) -> list[str]:
    """The CMake cache entries of a build on a host with this plan."""
    options = [
        "CMAKE_BUILD_TYPE=Release",
        "BUILD_SHARED_LIBS=OFF",
        "LLAMA_BUILD_TESTS=OFF",
        "LLAMA_BUILD_EXAMPLES=OFF",
        "LLAMA_OPENSSL=OFF",
        "GGML_RPC=ON",
        f"LLAMA_USE_PREBUILT_UI={'ON' if data['llama_cpp_prebuilt_ui'] else 'OFF'}",
    ]
    launchers = ["C", "CXX"]
    if build_backend(plan, data) == "cuda":
        options += [
            "GGML_CUDA=ON",
            "CMAKE_CUDA_ARCHITECTURES=" + ";".join(plan["cuda_archs"]),
            f"CMAKE_CUDA_COMPILER={nvcc_path(plan, data)}",
        ]
        launchers.append("CUDA")
        if plan["quirks"].get("fma_throttled"):  # CMP 170HX: FP32 FMA is cut in firmware
            options.append("CMAKE_CUDA_FLAGS=-fmad=false")
    else:
        options.append("GGML_CUDA=OFF")
    if data.get("llama_cpp_ccache", True):
        options += [f"CMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in launchers]
    else:       # llama.cpp's CMake takes a ccache it finds on its own (GGML_CCACHE, on by default)
        options.append("GGML_CCACHE=OFF")
    return options + list(data["llama_cpp_cmake_options"])


def build_id(data: Config, options: list[str]) -> str:
    """``<ref>-<hash>``: the same source, ref, options and targets give the same id."""
    archive = data["llama_cpp_archive"]
    source = _archive_digest(archive, _stamp(archive)) if archive else data["llama_cpp_source"]
    key = json.dumps([source, data["llama_cpp_ref"], options, data["llama_cpp_targets"]])
    ref = re.sub(r"[^A-Za-z0-9._-]", "_", data["llama_cpp_ref"])[:40]
    return f"{ref}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


ARCHIVE_MAX = 1 << 30   # a llama.cpp source archive is tens of MiB


def _stamp(archive: str) -> tuple[int, int, int]:
    """The archive file's inode, change and modification times: any write, chmod or chown reads it again."""
    st = Path(archive).stat()
    return st.st_ino, st.st_ctime_ns, st.st_mtime_ns


@lru_cache(maxsize=2)
def _archive_bytes(archive: str, stamp: tuple[int, int, int]) -> bytes:
    """The archive's bytes, read once per run for every host (``stamp``: :func:`_stamp`; a rewritten,
    chmod'ed or chown'ed archive is read again) through the controller-file rule's own descriptor (rigup.boundary.owned: no link, only you
    or root could have written it or a directory above it; round 10 AR1: another user's archive in a
    1777 directory was built as root on every host): what is checked is what is hashed into the build
    id and uploaded (:func:`archive_bytes`)."""
    try:
        return owned.read_bytes(archive, "llama_cpp_archive", limit=ARCHIVE_MAX)
    except owned.NotOwned as e:
        raise ConfigError(f"llama_cpp_archive: {e.why}") from None


@lru_cache(maxsize=2)
def _archive_digest(archive: str, stamp: tuple[int, int, int]) -> str:
    """The archive's sha256 (:func:`_archive_bytes`)."""
    return hashlib.sha256(_archive_bytes(archive, stamp)).hexdigest()


def archive_bytes(data: Config) -> bytes:
    """``llama_cpp_archive``'s bytes as :func:`build_id` hashed them."""
    return _archive_bytes(data["llama_cpp_archive"], _stamp(data["llama_cpp_archive"]))


def render_build_script(data: Config, options: list[str], archive_on_host: str | None = None) -> str:
    """The build script for these inputs (also run alone by tests/gpu/check.sh)."""
    return render(
        "llama_cpp-build.sh.j2",
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
