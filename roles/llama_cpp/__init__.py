"""roles/llama_cpp: llama.cpp compiled on the host for the host's own GPUs.

What it does to a host:
- receives its build instead of compiling it when a host of the same key compiled and proved it
  (``llama_cpp_handover``; roles/llama_cpp/artifact.py and handover.py): the key holds the build
  id, the commit the ref resolved to, the OS release, the machine, a CUDA build's toolkit and a
  native build's CPU flags. The controller keeps each build its host proved (packed on that host,
  its sha256 computed by the controller: ``llama_cpp_artifacts``); a receiving host gets that
  file (or the compiling host's copy), checked against the controller's record and for what a
  build may hold, unpacks it into ``builds/<id>``, and smokes it as below. A refused artifact (its
  hash, a link out of its tree) is said and compiled here instead; a received build that fails its
  smoke is moved aside (``builds/<id>.refused``), so the next converge compiles. A receiving host
  gets only the run-time libraries, no build tools. The plan names where each build comes from;
- installs the build tools (compiler, CMake, git, ccache) where it compiles;
- builds ``llama_cpp_targets`` from ``llama_cpp_source`` at ``llama_cpp_ref`` (or from
  ``llama_cpp_archive``) into ``llama_cpp_dir/builds/<ref>-<hash>``, where the hash covers the
  source, the ref, the CMake options and the targets. CUDA builds name the host's archs as an
  explicit list (never ``native``: a build host may have no GPU). Static binaries
  (``BUILD_SHARED_LIBS=OFF``), ccache, Release;
- proves a new build before it serves (``proven``, a step of its own after the model downloads were
  waited for): the new llama-server answers a short real completion on the host with each
  instance's flags (its served model when on disk and at most ``llama_cpp_smoke_max_model_gib``,
  else a tiny Q4_0 model rigup ships: roles/llama_cpp/smoke_model.py), as the rigup user, under
  ``llama_cpp_smoke_timeout``. A crash (named by its signal), a hang or an empty answer: no switch,
  ``current`` and every instance stay as they were, the build stays for inspection
  (``builds/<id>/smoke.log``), the host fails. A crash that a known trap's remedy avoids
  (roles/llama_cpp/traps.yml: ``--no-repack`` for the CPU repack/AMX crash) is tried again with
  it; when that answers, the instances get the remedy's flags (recorded in
  ``builds/<id>/rigup-smoke.json``, which roles/llama_server reads) and the trap is named;
- with ``llama_cpp_compare``, proves it no slower: the new build's decode rate against the current
  build's, the first smoke run's model and flags, server sessions interleaved new, current, new,
  current (``llama_cpp_compare_rounds`` pairs); a new build more than ``llama_cpp_slower_tolerance``
  slower does not switch, and the host fails naming the ratio and both rates (kept in
  ``rigup-smoke.json``; status.py shows the serving build's ratio);
- switches ``current`` to the new build only then; the build it replaced stays as ``previous``,
  and ``llama_cpp_rollback: true`` switches back to it.
The same inputs again build nothing and change nothing (a stamp per build, read in one round
trip). A failed build leaves ``current`` alone and shows the compiler's last lines.

Variables (roles/llama_cpp/defaults.yml): llama_cpp_source, llama_cpp_ref, llama_cpp_archive,
llama_cpp_dir, llama_cpp_backend, llama_cpp_targets, llama_cpp_cmake_options, llama_cpp_jobs,
llama_cpp_ccache_dir, llama_cpp_rollback, llama_cpp_build_timeout, llama_cpp_prebuilt_ui,
llama_cpp_smoke, llama_cpp_smoke_timeout, llama_cpp_smoke_max_model_gib, llama_cpp_compare,
llama_cpp_slower_tolerance, llama_cpp_compare_rounds, llama_cpp_handover, llama_cpp_artifacts; rigup_user (roles/base);
gpu_enabled (roles/preflight), cuda_source and cuda_version (roles/cuda_toolkit); and the plan's
``smoke`` runs (each serving role's ``smoke_runs``, gathered by preflight) and ``cpu`` facts.
"""

from __future__ import annotations

import hashlib
import json
from io import BytesIO

from pyinfra import host
from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import files, python

from rigup import apt, progress
from rigup.files import directory
from rigup.config import Config, role_defaults
from rigup.cuda import toolkit_packages
from rigup.gpu.plan import Plan, build_backend
from rigup.state import read_once
from rigup.text import say, shown
from rigup.traps import load as load_traps
from roles.llama_cpp import artifact, handover
from roles.llama_cpp.build import build_log, build_stamp, built, switched
from roles.llama_cpp.checks import CHECKS
from roles.llama_cpp.facts import BUILD_UNIT, LlamaCppState
from roles.llama_cpp.script import archive_bytes, build_id, cmake_options, render_build_script

__all__ = ["apply", "proven", "CHECKS", "BUILD_PACKAGES", "plan_lines", "plan_reads"]

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "pkg-config"]


# what a received build needs at run time beyond the base system (its OpenMP runtime; a CUDA
# build's libraries come with roles/cuda_toolkit)
RUNTIME_PACKAGES = ["libgomp1"]


def build_source(plan: Plan, data: Config) -> dict:
    """Where this host's build comes from (roles/llama_cpp/handover.py ``source``): built here
    already, compiled here, or received from the host that compiled it."""
    options = cmake_options(plan, data)
    state = read_once(LlamaCppState, dir=data["llama_cpp_dir"])
    toolkit = str(data.get("cuda_version")) if build_backend(plan, data) == "cuda" else None
    runtime = artifact.runtime(state, (plan.get("cpu") or {}).get("flags") or [], options, toolkit)
    return handover.source(host.name, data, state, build_id(data, options), runtime)


def fallback_packages(plan: Plan, data: Config) -> list[str]:
    """What a host that was to receive its build installs when it compiles it after all (the build
    refused, or never packed): the build tools, and for CUDA the toolkit's compiler, which
    roles/cuda_toolkit left out there (its repository and components are set up all the same)."""
    cuda = toolkit_packages(data["cuda_source"], data["cuda_version"]) if build_backend(plan, data) == "cuda" else []
    return BUILD_PACKAGES + RUNTIME_PACKAGES + cuda


def plan_adds(plan: Plan, data: Config) -> dict:
    """``llama_cpp_compiles``: whether this host compiles its build (roles/cuda_toolkit installs
    the CUDA compiler only then; a host that has or receives it gets the run-time libraries)."""
    return {"llama_cpp_compiles": not data["llama_cpp_rollback"] and build_source(plan, data)["how"] == "compile"}


@deploy("llama_cpp", data_defaults=role_defaults("llama_cpp"))
def apply(plan: Plan, data: Config):
    dir = data["llama_cpp_dir"]
    if data["llama_cpp_rollback"]:
        switched(name="Roll llama.cpp back to the previous build", dir=dir, target="previous")
        return
    options = cmake_options(plan, data)
    ident = build_id(data, options)
    say(f"    [{host.name}] llama.cpp {ident}: cmake " + " ".join(f"-D{o}" for o in options))
    if build_source(plan, data)["how"] != "compile":    # built here already, or received at the proven step
        apt.installed(name="Install llama.cpp's run-time libraries", packages=RUNTIME_PACKAGES,
                      cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=data["apt_retry_delay"])
        return
    apt.installed(name="Install build tools", packages=BUILD_PACKAGES + RUNTIME_PACKAGES,
                  cache_seconds=data["apt_cache_seconds"], _retries=2, _retry_delay=data["apt_retry_delay"])
    ccache = data["llama_cpp_ccache_dir"]
    directory(name=f"Directory {ccache}", path=ccache, paths=[ccache], mode=None, user=None, group=None)
    archive = None
    if data["llama_cpp_archive"]:
        archive = f"{dir}/src-{build_id(data, options)}.tar.gz"
        files.put(name="Upload the llama.cpp source archive", src=BytesIO(archive_bytes(data)), dest=archive)
    build = built(name=f"Build llama.cpp {data['llama_cpp_ref']} ({build_backend(plan, data)})", dir=dir,
                  build_id=ident, script=render_build_script(data, options, archive),
                  _timeout=data["llama_cpp_build_timeout"])
    systemd = read_once(LlamaCppState, dir=dir)["systemd"]
    python.call(name=f"Wait for the llama.cpp build {ident}", function=progress.waited,
                label=f"llama.cpp build {ident}", unit=BUILD_UNIT, log=build_log(dir, ident),
                done=progress.exists(build_stamp(dir, ident)), systemd=systemd,
                timeout=data["llama_cpp_build_timeout"], _if=build.did_change)


TRAPS = load_traps(__file__.rsplit("/", 1)[0] + "/traps.yml", condition_keys=("signals", "cpu_flags_any"))


def remedies(plan: Plan) -> list[dict]:
    """The catalogue's remedies a smoke may try on this host: those whose CPU flags it has."""
    flags = set((plan.get("cpu") or {}).get("flags") or [])
    return [{"id": t.id, "ref": t.ref, "signals": list(t.condition.get("signals", [])),
             "args": [t.remedy.value]} for t in TRAPS
            if t.remedy.kind == "server_flag" and flags & set(t.condition.get("cpu_flags_any", []))]


def smoke_spec(plan: Plan, data: Config) -> dict | None:
    """What roles/llama_cpp/shipped/smoke.py gets (less the paths of the build), with ``key``: a hash of
    it, so that a build proven with the same spec is not tried again; None with llama_cpp_smoke off."""
    if not data.get("llama_cpp_smoke", True):
        return None
    spec = {"runs": list(plan.get("smoke") or []), "remedies": remedies(plan), "user": data["rigup_user"],
            "timeout": data["llama_cpp_smoke_timeout"],
            "max_model_bytes": int(data["llama_cpp_smoke_max_model_gib"] * 2**30)}
    if data["llama_cpp_compare"]:
        spec["compare"] = {"tolerance": data["llama_cpp_slower_tolerance"], "rounds": data["llama_cpp_compare_rounds"]}
    spec["key"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return spec


def plan_reads(data: Config) -> list:
    """The builds' state, which :func:`plan_lines` reads (in preflight's round trip)."""
    return [(LlamaCppState, {"dir": data["llama_cpp_dir"]})]


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """The plan's lines for the smoke: what a new build answers with, the traps it may meet, and
    the trap the serving build's smoke met (its remedy the instances run with)."""
    state = read_once(LlamaCppState, dir=data["llama_cpp_dir"])
    current = (state["current"] or "").split("/", 1)[-1]
    met = state["smokes"].get(current) or {}
    lines = [f"llama.cpp {current}: trap {', '.join(met['traps'])} met by its smoke inference; instances run with "
             f"{' '.join(met.get('server_args') or [])}"] if met.get("ok") and met.get("traps") else []
    if state.get("switching"):
        lines.append(f"llama.cpp: found a switch to {shown(state['switching'], 200)} cut short (its converge ended "
                     f"between the build and the switch; current stayed {shown(state['current'] or 'unset', 200)} "
                     "and served): this converge carries it on")
    found = None if data["llama_cpp_rollback"] else build_source(plan, data)
    came = found and handover.source_line(found["ident"], found)
    return lines + ([came] if came else []) + _smoke_lines(plan, data)


def _smoke_lines(plan: Plan, data: Config) -> list[str]:
    spec = smoke_spec(plan, data)
    if spec is None:
        return ["llama.cpp smoke: off (llama_cpp_smoke: false): a new build serves after --version alone"]
    runs = ", ".join(r["name"] for r in spec["runs"]) or "the tiny smoke model"
    traps = ", ".join(r["id"] for r in spec["remedies"])
    compare = spec.get("compare")
    return [f"llama.cpp smoke: a new build answers with {runs} before it serves"
            + (f"; on a crash it retries for {traps}" if traps else "")
            + (f"; it serves only if its decode is within {compare['tolerance']:.0%} of the current build's"
               if compare else "")]


@deploy("llama_cpp proven", data_defaults=role_defaults("llama_cpp"))
def proven(plan: Plan, data: Config):
    """The new build answers its smoke inference, then ``current`` switches to it."""
    if data["llama_cpp_rollback"]:
        return
    options = cmake_options(plan, data)
    ident, dir = build_id(data, options), data["llama_cpp_dir"]
    runs = len(plan.get("smoke") or []) or 1
    sessions = 2 * data["llama_cpp_compare_rounds"] if data["llama_cpp_compare"] else 0
    smoke = {"smoke": smoke_spec(plan, data),
             "smoke_timeout": (runs * 2 + sessions) * data["llama_cpp_smoke_timeout"] + runs * 90}
    found = build_source(plan, data)
    if found["how"] != "receive":
        switched(name=f"llama.cpp current -> {ident}", dir=dir, target=f"builds/{ident}", **smoke)
        if found["how"] == "compile" and found.get("key"):
            handover.packed(name=f"Keep llama.cpp {ident} as artifact {found['key']}", dir=dir, build_id=ident,
                            key=found["key"], cache=data["llama_cpp_artifacts"],
                            record={"build_id": ident, "ref": data["llama_cpp_ref"], "commit": found["commit"],
                                    "runtime": found["runtime"]})
    if found.get("key"):    # one operation of every host, on this line: the packing hosts' before the receiving ones'
        handover.handed_over(name="llama.cpp builds of this run packed")
    if found["how"] != "receive":
        return
    handover.received(name=f"Receive llama.cpp {ident} from {found['from']}", dir=dir, build_id=ident,
                      key=found["key"], cache=data["llama_cpp_artifacts"],
                      script=render_build_script(data, options), systemd=read_once(LlamaCppState, dir=dir)["systemd"],
                      timeout=data["llama_cpp_build_timeout"],
                      install=f"{apt.waiting(apt.updated(), apt.lock_timeout())} && "
                              f"{apt.install_command(fallback_packages(plan, data))}")
    switched(name=f"llama.cpp current -> {ident} (received)", dir=dir, target=f"builds/{ident}", **smoke)


ROLE = Role("llama_cpp", apply, checks=CHECKS, plan_reads=plan_reads, plan_lines=plan_lines, plan_adds=plan_adds,
            steps={'proven': proven})
