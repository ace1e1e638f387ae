"""A llama.cpp build as an artifact handed from host to host, as pure functions and the
controller's cache: its key, what a receiving host must have, and what an artifact may hold.

A build that passed its smoke on the host that compiled it is packed there
(``<llama_cpp_dir>/artifacts/<key>.tar.gz``: its ``bin/``, ``version.txt`` and stamp) and pulled
into the controller's cache (``llama_cpp_artifacts``), where the controller writes its own record:
the sha256 and size of the bytes it received, the host, the resolved commit. A host with the same
key receives that file instead of compiling; the hash it must have comes from that record, never
from a host that offers it.

The key: the build id (source, ref, CMake options with the CUDA archs, targets), the commit the
ref resolved to, and what the binaries need at run time: the OS release (and so its compiler and
glibc), the machine, the CUDA toolkit of a CUDA build, and, for a build compiled for the CPU it
ran on (llama.cpp's default ``GGML_NATIVE``: ``-march=native``), the CPU flags that matter to it
(rigup.gpu.facts CPU_FLAGS). A host whose CPU lacks one has another key and compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tarfile
from functools import lru_cache
from pathlib import Path

from rigup.boundary import owned, results
from rigup.boundary.core import Unreadable
from rigup.text import carries_credentials

# what an artifact may hold: its binaries (one relative link: ggml-rpc-server -> rpc-server, made
# by the build script), the version the build printed, its stamp
TOP_FILES = ("version.txt", "rigup-build.json")
BIN_NAME = re.compile(r"bin/[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LINK_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_BYTES = 4 << 30          # unpacked: llama.cpp's CUDA binaries for every arch stay far below
TRAILER_BYTES = 1 << 20     # zero blocks after an archive's end: GNU tar pads to 10 KiB records
KEY = results.KEY
COMMIT = re.compile(r"[0-9a-f]{40}")


def key(build_id: str, commit: str, runtime: dict) -> str:
    """The artifact key: 16 hex digits of the build id, the resolved commit and the runtime profile."""
    text = json.dumps({"build": build_id, "commit": commit, "runtime": runtime}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def runtime(state: dict, cpu_flags: list[str], options: list[str], toolkit: str | None) -> dict:
    """What a build's binaries need of a host: ``{os, glibc, machine, toolkit, cpu_flags}``
    (``toolkit``: a CUDA build's toolkit version, else None; ``cpu_flags``: only for a native build,
    else None). ``state``: roles/llama_cpp/facts.py's, which reads the OS release, glibc and machine."""
    native = not any(o.split("=", 1)[0] == "GGML_NATIVE" and o.split("=", 1)[1].upper() in ("OFF", "0", "FALSE")
                     for o in options)
    return {"os": state.get("os"), "glibc": state.get("glibc"), "machine": state.get("machine"),
            "toolkit": toolkit, "cpu_flags": sorted(cpu_flags) if native else None}


def missing(runtime_had: dict, runtime_here: dict) -> str | None:
    """Why a build made for ``runtime_had`` cannot run here (None when it can): the CPU flags it
    uses that this CPU lacks, or the OS, glibc, machine or toolkit that differ."""
    lacks = sorted(set(runtime_had.get("cpu_flags") or []) - set(runtime_here.get("cpu_flags") or []))
    if lacks:
        return f"it uses {', '.join(lacks)}, which this CPU lacks"
    for k in ("os", "glibc", "machine", "toolkit"):
        if runtime_had.get(k) != runtime_here.get(k):
            return f"it was built for {k} {runtime_had.get(k)}, this host has {runtime_here.get(k)}"
    return None


@lru_cache(maxsize=16)
def resolved(source: str, ref: str) -> tuple[str | None, str]:
    """The commit ``ref`` (a tag, or a full commit id) names at ``source``, asked once per run from
    the controller (``git ls-remote``): (commit, "") or (None, why)."""
    if COMMIT.fullmatch(ref):
        return ref, ""
    if carries_credentials(source):   # never in argv (preflight refuses the key: round 12 SEC2)
        return None, "llama_cpp_source carries credentials in its URL: not asked"
    try:
        done = subprocess.run(["git", "ls-remote", "--", source, f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"git ls-remote: {type(e).__name__}"
    found = dict(reversed(line.split("\t", 1)) for line in done.stdout.splitlines() if "\t" in line)
    commit = found.get(f"refs/tags/{ref}^{{}}") or found.get(f"refs/tags/{ref}")   # an annotated tag: its commit
    if done.returncode != 0 or not commit or not COMMIT.fullmatch(commit):
        return None, (done.stderr.strip().splitlines() or [f"no tag {ref}"])[-1][:200]
    return commit, ""


# ----------------------------------------------------------------------------- the controller's cache
def cache_dir(path: str) -> Path:
    """The controller's cache (``~`` expanded), made private (0700) when it is made; used only when
    no other user could have written it or a directory on its path (rigup.boundary.owned): else
    ConfigError naming llama_cpp_artifacts, before any host receives what it holds."""
    from rigup.config import ConfigError

    try:   # made only below a checked directory: none under another user's link
        return owned.directory(path, "llama_cpp_artifacts", make=True)
    except owned.Unreadable as e:
        raise ConfigError(str(e)) from None


def checked_record(cache: str, artifact: str) -> tuple[dict | None, str | None]:
    """(the controller's record of ``artifact`` as rigup.boundary.results ``artifact_record``
    read it, None); (None, None) when there is none; or (None, why it is not one it wrote: of
    another key, a sha256 that is no sha256, a path that is not the artifact's ...)."""
    path = cache_dir(cache) / f"{artifact}.json"
    if not os.path.lexists(path):
        return None, None
    try:   # only a record no other user could have written (rigup.boundary.owned.read)
        return results.artifact_record(owned.read(path, f"controller:{path}"), f"controller:{path}", artifact), None
    except Unreadable as e:
        return None, f"its record is unreadable ({e.where}: {e.why})"


def record(cache: str, artifact: str) -> dict | None:
    """The controller's record of ``artifact``, or None (none, or not one it wrote: :func:`checked_record`)."""
    return checked_record(cache, artifact)[0]


def records(cache: str) -> list[dict]:
    """Every record in the cache (for the plan's reason when none fits)."""
    return [r for p in sorted(cache_dir(cache).glob("*.json")) if (r := record(cache, p.stem))]


def tarball(cache: str, artifact: str) -> Path:
    return cache_dir(cache) / f"{artifact}.tar.gz"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def kept(cache: str, artifact: str, received: Path, doc: dict) -> dict:
    """Keep ``received`` (a file the controller just pulled) as ``artifact``'s, with the
    controller's record of it (``doc`` plus the sha256 and size the controller computed itself)."""
    d = cache_dir(cache)
    doc = {**doc, "schema": results.SCHEMA, "key": artifact, "sha256": sha256(received), "size": received.stat().st_size}
    os.replace(received, d / f"{artifact}.tar.gz")   # the directory was checked by cache_dir
    owned.write(d / f"{artifact}.json", json.dumps(doc, sort_keys=True, indent=1), "llama_cpp_artifacts")
    return doc


def unsafe(path: Path) -> str | None:
    """Why the artifact at ``path`` may not be unpacked on a host (None when it may): a member
    that is no plain file under ``bin/`` or at the top (:data:`TOP_FILES`), a link other than one
    from ``bin/`` to a sibling name, a special file, set-id bits, more than :data:`MAX_BYTES`."""
    total = 0
    try:
        with tarfile.open(path, "r:gz") as tar:
            for m in tar:
                name = m.name[2:] if m.name.startswith("./") else m.name
                if m.isdir() and name in ("", ".", "bin"):
                    continue
                if m.issym():
                    if not BIN_NAME.fullmatch(name) or not LINK_TARGET.fullmatch(m.linkname):
                        return f"{name!r} is a link to {m.linkname!r}, outside its own directory"
                    continue
                if not m.isfile():
                    return f"{name!r} is not a plain file ({'a hard link' if m.islnk() else 'a special file'})"
                if not (BIN_NAME.fullmatch(name) or name in TOP_FILES):
                    return f"{name!r} is not a file a build holds (bin/NAME, {', '.join(TOP_FILES)})"
                if m.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
                    return f"{name!r} has set-id bits"
                total += m.size
                if total > MAX_BYTES:
                    return f"it unpacks to more than {MAX_BYTES >> 30} GiB"
            # where tarfile stopped, only the end's zero blocks and padding: tarfile stops at a header whose
            # checksum is wrong, GNU tar skips it and unpacks what follows (round 32 A32a)
            tar.fileobj.seek(tar.offset)
            rest = tar.fileobj.read(TRAILER_BYTES + 1)
            if len(rest) > TRAILER_BYTES or rest.strip(b"\0"):
                return "it holds more after its last readable member than the end of an archive (a broken header?)"
    except (OSError, tarfile.TarError, EOFError) as e:
        return f"it is no .tar.gz ({type(e).__name__})"
    return None if total else "it holds no file"
