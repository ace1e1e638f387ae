"""Operations that hand a proven llama.cpp build from the host that compiled it to hosts of the
same key, through the controller's cache (roles/llama_cpp/artifact.py), and the choice, per host,
of where its build comes from.

Which host compiles a build no host has (no record on the controller) is a rule, not the order
in which pyinfra's greenlets reach it: of the inventory's hosts in this run (in ``--limit`` and
reached), in the inventory's order, the first whose build key is the same compiles; the others
receive from it. A host before this one is read for its key only when this host needs a build it
has no record of, and only as far as needed: its own choice when it made it already, else its
configuration, its hardware plan (its preflight's, else read: rigup/peer.py) and, for the same
build id alone, its builds (one read); each kept on the run (rigup/run.py ``compiling``).

Why through the controller and by hand: pyinfra moves files between the controller and a host
(``get_file``, ``put_file``), not between hosts, and the expected hash must be the controller's
own record anyway; no library packs, records and checks a build for this.
"""

from __future__ import annotations

import json
import shlex
import time
from io import BytesIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, StringCommand
from pyinfra.context import ctx_state

from rigup import peer as peers, progress, run as run_state, summary
from rigup.boundary import fields
from rigup.boundary.core import Unreadable
from rigup.config import config_of, peer_value, role_defaults
from rigup.gpu.plan import build_backend
from rigup.probe import operation
from rigup.text import say, shown
from roles.llama_cpp import artifact
from roles.llama_cpp.build import build_log, build_stamp
from roles.llama_cpp.facts import BUILD_UNIT, LlamaCppState
from roles.llama_cpp.script import build_id, cmake_options


def source(name: str, data, state: dict, ident: str, runtime: dict) -> dict:
    """Where host ``name``'s build ``ident`` comes from, decided once per host and run (kept on the
    run of the State pyinfra runs, rigup/run.py ``sources``): ``{"how": "have"}`` (built here
    already), ``{"how": "compile", "why"}``, or ``{"how": "receive", "key", "from", "size",
    "cached"}`` (``from``: the host that compiled it)."""
    run = run_state.now()
    if name in run.sources and run.sources[name].get("ident") == ident:
        return run.sources[name]
    found = _source(run, name, data, state, ident, runtime)
    run.compiling[name] = found.get("key")
    stamp = (state.get("unreadable") or {}).get(ident)   # roles/llama_cpp/facts.py: built there, its stamp bad
    run.sources[name] = {**found, "ident": ident, **({"stamp": stamp} if stamp else {})}
    return run.sources[name]


def _source(run, name: str, data, state: dict, ident: str, runtime: dict) -> dict:
    if ident in (state.get("builds") or {}):
        return {"how": "have"}
    if not data["llama_cpp_handover"]:
        return {"how": "compile", "why": "llama_cpp_handover: false"}
    commit, why = _commit(data)
    if commit is None:
        return {"how": "compile", "why": f"the controller could not resolve {data['llama_cpp_ref']}: {why}"}
    key = artifact.key(ident, commit, runtime)
    cache = data["llama_cpp_artifacts"]
    doc, unreadable = artifact.checked_record(cache, key)
    if doc:
        return {"how": "receive", "key": key, "from": doc.get("host"), "size": doc.get("size"),
                "cached": artifact.tarball(cache, key).exists()}
    first = _compiler(run, name, key, ident)
    if first != name:
        return {"how": "receive", "key": key, "from": first, "size": None, "cached": False}
    other = [r for r in artifact.records(cache) if r.get("build_id") == ident]
    reasons = [f"{r.get('host')}'s build cannot run here: {artifact.missing(r.get('runtime') or {}, runtime)}"
               for r in other if artifact.missing(r.get("runtime") or {}, runtime)]
    return {"how": "compile", "key": key, "commit": commit, "runtime": runtime,
            "why": reasons[0] if reasons else f"{key}: {unreadable}" if unreadable else f"no host has {key}"}


def _commit(data) -> tuple[str | None, str]:
    """(the commit the build is of, "") or (None, why the controller could not resolve its ref)."""
    if data["llama_cpp_archive"]:
        return "archive", ""          # the build id holds the archive's sha256
    return artifact.resolved(data["llama_cpp_source"], data["llama_cpp_ref"])


def _compiler(run, name: str, key: str, ident: str) -> str:
    """The host that compiles build ``key`` (id ``ident``) in this run: of the inventory's hosts
    in ``--limit``, reached (connected) and not failed, in the inventory's order, the first whose key is
    ``key`` (the module docstring); ``name`` when none before it is. A failed host compiles nothing:
    its own play refused it (rigup.summary ``fail``), or reading its builds failed it (pyinfra fails
    a host whose fact's command fails); activated_hosts keeps it (issue 61, round 12 HO3)."""
    state = ctx_state.get()
    for peer in getattr(state, "inventory", None) or ():
        if peer.name == name:
            break
        counted = state.is_host_in_limit(peer) and peer in state.activated_hosts and peer not in state.failed_hosts
        if counted and _key_of(run, peer, ident, name) == key:
            return peer.name
    return name


# the keys a peer's build key is worked out from, and the rest its own configure checks of the role:
# read through peer_value, a peer's value not of its form is refused there as in its own play, so it
# compiles nothing ('llama_cpp_handover: "no"' read as true: issue 61, round 12 HO3)
PEER_KEYS = (*role_defaults("llama_cpp"), "cuda_version", "cuda_source", "gpu_enabled")


def _key_of(run, peer, ident: str, asking: str) -> str | None:
    """The build key ``peer`` compiles or receives in this run, when its build id is ``ident``
    (None: another id, its build is there, it hands none over, or it cannot be read): its own
    choice when made (rigup/run.py ``compiling``), else worked out as its own will be."""
    if peer.name in run.compiling:
        return run.compiling[peer.name]
    data = config_of(peer)
    try:
        for key in PEER_KEYS:
            peer_value(data, key)       # ConfigError naming the peer and the key
        if not data["llama_cpp_handover"] or data["llama_cpp_rollback"]:
            return None
        plan = peers.plan(peer)
        options = cmake_options(plan, data) if plan is not None else None
        if options is None or build_id(data, options) != ident:   # unplanned, or another build: nothing more to read
            return None
        state = peer.get_fact(LlamaCppState, dir=data["llama_cpp_dir"])
        if peer in ctx_state.get().failed_hosts:    # its command failed: pyinfra failed it, the default read
            return None
    except Exception as e:   # noqa: BLE001 - unreachable, or its facts did not read: not the one that compiles
        say(f"    [{asking}] llama.cpp {ident}: cannot read whether {peer.name} compiles it: {e}")
        return None
    commit, _ = _commit(data)
    toolkit = str(data.get("cuda_version")) if build_backend(plan, data) == "cuda" else None
    runtime = artifact.runtime(state, (plan.get("cpu") or {}).get("flags") or [], options, toolkit)
    found = None if ident in (state.get("builds") or {}) or commit is None else artifact.key(ident, commit, runtime)
    run.compiling[peer.name] = found
    return found


def source_line(ident: str, found: dict) -> str | None:
    """The plan's line: ``llama.cpp <id>: from lab2 (41 MiB, cached)`` or ``... compile (why)``."""
    if found["how"] == "have":
        return None
    stamp = f"; its stamp here did not read: {found['stamp']}" if found.get("stamp") else ""
    if found["how"] == "compile":
        return f"llama.cpp {ident}: compile ({found['why']}{stamp})"
    size = f"{found['size'] / 2**20:.0f} MiB, " if found.get("size") else ""
    where = "cached" if found["cached"] else "compiled in this run" if found["size"] is None else "on the host"
    return f"llama.cpp {ident}: from {found['from']} ({size}{where}; artifact {found['key']}{stamp})"


def _sh(text: str) -> StringCommand:
    return StringCommand(text)


@operation()
def packed(dir: str, build_id: str, key: str, cache: str, record: dict):
    """Pack the build ``build_id`` this host compiled and proved (``<dir>/artifacts/<key>.tar.gz``,
    root-only) and keep it in the controller's cache with the controller's own record."""
    yield FunctionCommand(_pack, (dir, build_id, key, cache, record), {})


def _pack(state, host, dir: str, build_id: str, key: str, cache: str, record: dict) -> bool:
    q = shlex.quote
    try:   # the copy's part file is named after the host: a name, never a path ('../../x': issue 61, round 6 BD16)
        name = fields.host_file(host.name, f"llama.cpp's artifact: the inventory host {str(host.name)[:60]!r}")
    except Unreadable as e:
        host.log_styled(shown(f"llama.cpp {build_id}: not kept as an artifact: {e}"), fg="yellow", log_func=logger.warning)
        return True
    remote = f"{dir}/artifacts/{key}.tar.gz"
    command = (f"install -d -m 700 {q(dir + '/artifacts')} && cd {q(dir + '/builds/' + build_id)} && "
               f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - bin "
               f"{' '.join(artifact.TOP_FILES)} | gzip -n -1 > {q(remote + '.tmp')} && mv -f {q(remote + '.tmp')} "
               f"{q(remote)} && sha256sum {q(remote)} | cut -c1-64")
    ok, out = host.run_shell_command(_sh(command), print_output=False, print_input=False)
    lines = list(out.stdout_lines)
    if not ok or not lines:
        host.log_styled(shown(f"llama.cpp {build_id}: not kept as an artifact (packing failed: "
                              f"{' '.join(out.stderr_lines)[-300:]})", 4000), fg="yellow", log_func=logger.warning)
        return True         # it serves here all the same; no host receives it
    part = artifact.cache_dir(cache) / f"{key}.part-{name}"
    host.get_file(remote, str(part))
    why = None if artifact.sha256(part) == lines[-1].strip() else "the file changed while it was copied"
    why = why or artifact.unsafe(part)
    if why:
        part.unlink(missing_ok=True)
        host.log_styled(shown(f"llama.cpp {build_id}: not kept as an artifact: {why}; no host receives it"),
                        fg="yellow", log_func=logger.warning)
        return True
    doc = artifact.kept(cache, key, part, {**record, "host": host.name, "path": remote, "time": int(time.time())})
    say(f"    [{host.name}] llama.cpp {build_id}: kept as artifact {key} ({doc['size'] / 2**20:.0f} MiB, "
        f"sha256 {doc['sha256'][:12]})")
    return True


@operation()
def handed_over():
    """No command: the one operation every host of the build's key registers at this line, after
    a compiling host's :func:`packed` and before a receiving host's :func:`received`. pyinfra runs
    the operations as a graph of each host's sequence, every ready operation at once, and a host
    that receives has fewer operations before it than the one that compiles: without this shared
    node it asked for the build before the build was packed (make bench-handover, 4 hosts)."""
    host.noop("the builds compiled in this run are packed")
    return
    yield


@operation()
def received(dir: str, build_id: str, key: str, cache: str, script: str, systemd: bool, timeout: int,
             install: str):
    """Receive the build ``build_id`` (artifact ``key``) into ``<dir>/builds/<build_id>``: the
    controller's cached copy, else the copy of the host its record names; refused when its sha256
    is not the controller's record or it holds what a build does not (roles/llama_cpp/artifact.py),
    and then compiled here (``install``: the build tools' install command, ``script``: the build's)."""
    yield FunctionCommand(_receive, (dir, build_id, key, cache, script, systemd, timeout, install), {})


def _receive(state, host, dir, build_id, key, cache, script, systemd, timeout, install) -> bool:
    why, origin = _fetched(state, host, cache, key)
    if not why:
        why = _unpacked(host, dir, build_id, key, cache, origin)
    if not why:
        say(f"    [{host.name}] llama.cpp {build_id}: received from {origin} (artifact {key})")
        return True
    text = f"llama.cpp {build_id}: refused the artifact {key}{' from ' + origin if origin else ''}: {why}; compiling here"
    host.log_styled(shown(text), fg="yellow", log_func=logger.warning)
    summary.note(host, f"llama.cpp artifact refused ({why[:80]}); compiled")
    return _compiled(host, dir, build_id, script, systemd, timeout, install)


def _fetched(state, host, cache: str, key: str) -> tuple[str | None, str | None]:
    """The artifact in the controller's cache, checked against the record: (why not, its origin)."""
    doc = artifact.record(cache, key)
    if not doc:
        return "no host passed a build of it in a run of this controller (no record)", None
    origin = doc.get("host")
    tar = artifact.tarball(cache, key)
    if tar.exists() and artifact.sha256(tar) != doc["sha256"]:
        tar.unlink()
        return f"the controller's copy is not the one it recorded (sha256 differs from {doc['sha256'][:12]})", origin
    if not tar.exists():
        peer = state.inventory.get_host(origin, None) if origin else None
        if not doc.get("path"):
            return "the controller's copy is gone and its record names no file on a host", origin
        if peer is None:
            return f"the controller's copy is gone and {origin} is not in the inventory to offer it", origin
        try:   # the record's host names the part file (the controller's own record: checked all the same)
            part = artifact.cache_dir(cache) / f"{key}.part-from-{fields.host_file(origin, 'its record')}"
        except Unreadable as e:
            return f"the controller's copy is gone and {e}", origin
        ours = not peer.connected          # a host outside --limit: connected for this copy alone
        try:
            if ours:
                peer.connect(reason=f"to offer its llama.cpp build to {host.name}", raise_exceptions=True)
            peer.get_file(doc["path"], str(part))
        except Exception as e:   # noqa: BLE001 - the peer is unreachable, its file gone: a refusal
            part.unlink(missing_ok=True)
            return f"the controller's copy is gone and {origin} no longer offers it ({type(e).__name__})", origin
        finally:
            if ours and peer.connected:
                peer.disconnect()
        got = artifact.sha256(part)
        if got != doc["sha256"]:
            part.unlink()
            return (f"{origin} offered a build whose sha256 is {got[:12]}, not the recorded {doc['sha256'][:12]} "
                    "(another build)"), origin
        part.replace(tar)
    return artifact.unsafe(tar), origin


def _unpacked(host, dir: str, build_id: str, key: str, cache: str, origin: str | None) -> str | None:
    """Put the checked artifact on the host, check its sha256 there, unpack it beside the builds
    and move it into place: None, or why not."""
    q = shlex.quote
    doc = artifact.record(cache, key)
    part = f"{dir}/artifacts/{key}.tar.gz.part"
    out = f"{dir}/builds/{build_id}"
    ok, _ = host.run_shell_command(_sh(f"install -d -m 700 {q(dir + '/artifacts')} && install -d {q(dir + '/builds')}"),
                                   print_output=False, print_input=False)
    if not ok:
        return f"{dir}/artifacts could not be made"
    host.put_file(str(artifact.tarball(cache, key)), part)
    received = json.dumps({"key": key, "sha256": doc["sha256"], "size": doc["size"], "from": origin,
                           "commit": doc.get("commit")}, sort_keys=True)
    command = (f"[ \"$(sha256sum {q(part)} | cut -c1-64)\" = {q(doc['sha256'])} ] || {{ echo sha256; exit 3; }}; "
               f"rm -rf {q(out + '.recv')} && mkdir -m 755 {q(out + '.recv')} && "
               f"tar -xzf {q(part)} -C {q(out + '.recv')} --no-same-owner --no-same-permissions && "
               f"test -x {q(out + '.recv/bin/llama-server')} && printf '%s\\n' {q(received)} > "
               f"{q(out + '.recv/rigup-received.json')} && rm -rf {q(out)} && mv -T {q(out + '.recv')} {q(out)} && "
               f"mv -f {q(part)} {q(dir + '/artifacts/' + key + '.tar.gz')}")
    ok, output = host.run_shell_command(_sh(command), print_output=False, print_input=False)
    if ok:
        return None
    host.run_shell_command(_sh(f"rm -rf {q(out + '.recv')} {q(part)}"), print_output=False, print_input=False)
    said = " ".join(list(output.stdout_lines) + list(output.stderr_lines))
    return ("its sha256 on this host is not the recorded one" if said.strip() == "sha256"
            else f"it did not unpack here: {said[-200:]}")


def _compiled(host, dir: str, build_id: str, script: str, systemd: bool, timeout: int, install: str) -> bool:
    """Compile ``build_id`` here after all: the build tools, the script (as roles/llama_cpp's build
    runs it, in its unit), then wait for its stamp."""
    q = shlex.quote
    ok, output = host.run_shell_command(_sh(install), print_output=False, print_input=False, _timeout=1800)
    if not ok:
        raise OperationError(shown(f"the build tools did not install: {' '.join(output.stderr_lines)[-400:]}"))
    path = f"{dir}/build-{build_id}.sh"
    host.put_file(BytesIO(script.encode()), path)
    start = progress.start_command(BUILD_UNIT, q(path), build_log(dir, build_id), systemd,
                                   unless=build_stamp(dir, build_id))
    ok, output = host.run_shell_command(_sh(f"chmod 755 {q(path)} && mkdir -p {q(dir + '/builds')} && {{ {start}; }}"),
                                        print_output=False, print_input=False)
    if not ok:
        raise OperationError(shown(f"the build did not start: {' '.join(output.stderr_lines)[-400:]}"))
    progress.waited(label=f"llama.cpp build {build_id}", unit=BUILD_UNIT, log=build_log(dir, build_id),
                    done=progress.exists(build_stamp(dir, build_id)), systemd=systemd, timeout=timeout)
    return True
