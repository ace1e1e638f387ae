"""roles/llama_cpp/artifact.py: the key of a build handed between hosts, what a receiving host must
have, the controller's record, and what an artifact may hold (hostile archives refused)."""

import gzip
import io
import json
import subprocess
import tarfile

import pytest

from roles.llama_cpp import artifact

STATE = {"os": "debian 12", "glibc": "2.36", "machine": "x86_64"}
FLAGS = ["avx", "avx2", "avx512f", "fma"]


def test_the_key_holds_the_build_the_commit_and_what_the_binaries_need():
    rt = artifact.runtime(STATE, FLAGS, ["CMAKE_BUILD_TYPE=Release"], None)
    assert rt == {"os": "debian 12", "glibc": "2.36", "machine": "x86_64", "toolkit": None, "cpu_flags": FLAGS}
    k = artifact.key("b8779-0123456789", "a" * 40, rt)
    assert artifact.KEY.fullmatch(k) and k == artifact.key("b8779-0123456789", "a" * 40, dict(rt))
    others = [artifact.key("b8779-9999999999", "a" * 40, rt), artifact.key("b8779-0123456789", "b" * 40, rt),
              artifact.key("b8779-0123456789", "a" * 40, {**rt, "os": "ubuntu 24.04"}),
              artifact.key("b8779-0123456789", "a" * 40, {**rt, "cpu_flags": ["avx", "avx2", "fma"]}),
              artifact.key("b8779-0123456789", "a" * 40, {**rt, "toolkit": "12.8"})]
    assert len({k, *others}) == 6
    # a build for no particular CPU (GGML_NATIVE=OFF) needs no CPU flag of the host
    assert artifact.runtime(STATE, FLAGS, ["GGML_NATIVE=OFF"], "12.8")["cpu_flags"] is None


def test_a_build_never_goes_to_a_cpu_without_the_flags_it_uses():
    had = artifact.runtime(STATE, FLAGS, [], None)
    assert artifact.missing(had, artifact.runtime(STATE, FLAGS + ["amx_tile"], [], None)) is None
    assert artifact.missing(had, artifact.runtime(STATE, ["avx", "avx2", "fma"], [], None)) == \
        "it uses avx512f, which this CPU lacks"
    assert "glibc" in artifact.missing(had, {**had, "glibc": "2.31"})


def test_the_controller_keeps_its_own_record_of_what_it_received(tmp_path):
    cache = str(tmp_path / "cache")
    part = tmp_path / "part"
    part.write_bytes(_tar({"bin/llama-server": b"\x7fELF", "version.txt": b"version: 1", "rigup-build.json": b"{}"}))
    doc = artifact.kept(cache, "0123456789abcdef", part, {"host": "lab1", "sha256": "not mine", "size": 1})
    assert doc["sha256"] == artifact.sha256(artifact.tarball(cache, "0123456789abcdef"))   # its own, not the offer's
    assert artifact.record(cache, "0123456789abcdef") == doc and not part.exists()
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700
    (tmp_path / "cache" / "fedcba9876543210.json").write_text(json.dumps({"key": "other", "sha256": "x"}))
    assert artifact.record(cache, "fedcba9876543210") is None           # not a record it wrote
    assert [r["key"] for r in artifact.records(cache)] == ["0123456789abcdef"]


def _tar(files: dict, links: dict | None = None, extra=()) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.size else None)
    return out.getvalue()


GOOD = {"bin/llama-server": b"\x7fELF", "bin/rpc-server": b"\x7fELF", "version.txt": b"v", "rigup-build.json": b"{}"}


def _info(name, kind=tarfile.REGTYPE, mode=0o644, size=0, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    return info


@pytest.mark.parametrize("hostile, why", [
    ({"links": {"bin/llama-bench": "/etc/shadow"}}, "is a link to '/etc/shadow', outside its own directory"),
    ({"links": {"bin/x": "../../../root/.ssh/authorized_keys"}}, "outside its own directory"),
    ({"links": {"version.txt.d": "bin"}}, "outside its own directory"),
    ({"files": {"../../etc/cron.d/x": b"* * * * * root sh"}}, "is not a file a build holds"),
    ({"files": {"/etc/passwd": b"root::0:0"}}, "is not a file a build holds"),
    ({"files": {"bin/sub/llama-server": b"x"}}, "is not a file a build holds"),
    ({"extra": [_info("bin/hard", tarfile.LNKTYPE, link="bin/llama-server")]}, "a hard link"),
    ({"extra": [_info("bin/fifo", tarfile.FIFOTYPE)]}, "a special file"),
    ({"extra": [_info("bin/su", mode=0o4755, size=1)]}, "has set-id bits"),
])
def test_an_artifact_holding_what_a_build_does_not_is_refused(tmp_path, hostile, why):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(_tar({**GOOD, **hostile.get("files", {})}, hostile.get("links"), hostile.get("extra", ())))
    found = artifact.unsafe(path)
    print(f"\nrefused: {found}")
    assert found and why in found


def test_a_member_behind_a_header_tarfile_stops_at_is_refused(tmp_path):
    """Round 32 A32a: a second header with a wrong checksum ends Python's reading there, while GNU tar skips
    it and unpacks the member after it: what follows the last member read is refused unless it is the end's
    zero blocks."""
    raw = bytearray(_tar(GOOD))
    plain = bytearray(gzip.decompress(bytes(raw)))
    hidden = _tar({"bin/llama-server": b"planted"})
    second = 512 + 512     # the first member's header and its one block of data
    plain[second + 148:second + 156] = b"0000000\0"      # a wrong checksum on the second header
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(bytes(plain[:second]) + bytes(plain[second:second + 512]) +
                                   gzip.decompress(hidden)))
    found = artifact.unsafe(path)
    print(f"\nrefused: {found}")
    assert found and "more after its last readable member" in found
    path.write_bytes(gzip.compress(gzip.decompress(bytes(raw)) + b"\0" * 20480))   # padding only: accepted
    assert artifact.unsafe(path) is None


def test_a_build_as_the_host_packs_it_is_accepted(tmp_path):
    build = tmp_path / "builds" / "b1"
    (build / "bin").mkdir(parents=True)
    for name in ("llama-server", "rpc-server"):
        (build / "bin" / name).write_bytes(b"\x7fELF")
    (build / "bin" / "ggml-rpc-server").symlink_to("rpc-server")
    (build / "version.txt").write_text("version: 1")
    (build / "rigup-build.json").write_text("{}")
    (build / "smoke.log").write_text("not packed")
    out = tmp_path / "a.tar.gz"
    # the command roles/llama_cpp/handover.py's _pack runs on the host
    subprocess.run(f"cd {build} && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - bin "
                   f"{' '.join(artifact.TOP_FILES)} | gzip -n -1 > {out}", shell=True, check=True)
    assert artifact.unsafe(out) is None
    first = artifact.sha256(out)
    subprocess.run(f"cd {build} && touch bin/llama-server && tar --sort=name --mtime=@0 --owner=0 --group=0 "
                   f"--numeric-owner -cf - bin {' '.join(artifact.TOP_FILES)} | gzip -n -1 > {out}", shell=True, check=True)
    assert artifact.sha256(out) == first          # packed again: the same bytes (a peer's copy is checkable)
    out.write_bytes(b"not gzip")
    assert "no .tar.gz" in artifact.unsafe(out)


def test_a_ref_resolves_to_its_commit_from_the_controller(tmp_path):
    repo = tmp_path / "src.git"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    subprocess.run(f"git init -q {repo} && cd {repo} && git commit -q --allow-empty -m one && git tag light && "
                   "git tag -a -m note annotated", shell=True, check=True, env=env)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    artifact.resolved.cache_clear()
    assert artifact.resolved(f"file://{repo}", "light") == (head, "")
    assert artifact.resolved(f"file://{repo}", "annotated") == (head, "")       # the tag's commit, not the tag
    assert artifact.resolved(f"file://{repo}", "b" * 40) == ("b" * 40, "")     # a commit id is its own
    commit, why = artifact.resolved(f"file://{repo}", "nope")
    assert commit is None and why
    assert artifact.resolved(f"file://{tmp_path}/none.git", "light")[0] is None


# ----------------------------------------------------------------------------- where a host's build comes from
from pyinfra.api import Config, Inventory, State  # noqa: E402
from pyinfra.context import ctx_state  # noqa: E402

from roles.llama_cpp import handover  # noqa: E402
from tests.runs import own_run  # noqa: E402

COMMIT = "c" * 40
RT = artifact.runtime(STATE, FLAGS, [], None)


def lab_run(names=("lab1", "lab2", "lab3", "lab4"), data=None):
    """A run of these hosts (tests/runs.py): its choices start empty and end with the test."""
    return own_run(State(Inventory((list(names), data or {})), Config()))


def reach(*names: str) -> None:
    """These hosts of the test's run reached, as pyinfra's connect marks them: in this run."""
    state = ctx_state.get()
    for name in names:
        state.activate_host(state.inventory.get_host(name))


@pytest.fixture
def data(tmp_path):
    with lab_run():
        yield {"llama_cpp_handover": True, "llama_cpp_archive": None, "llama_cpp_source": "https://example.invalid/l.git",
               "llama_cpp_ref": COMMIT, "llama_cpp_artifacts": str(tmp_path / "cache")}


def _state(*builds):
    return {"builds": {b: {"id": b} for b in builds}}


def test_the_first_host_of_a_key_compiles_and_the_next_ones_receive_its_build(data):
    reach("lab1", "lab2")
    first = handover.source("lab1", data, _state(), "b1", RT)
    assert first["how"] == "compile" and first["why"] == f"no host has {first['key']}" and first["commit"] == COMMIT
    second = handover.source("lab2", data, _state(), "b1", RT)
    assert second == {"how": "receive", "key": first["key"], "from": "lab1", "size": None, "cached": False, "ident": "b1"}
    assert handover.source_line("b1", second) == f"llama.cpp b1: from lab1 (compiled in this run; artifact {first['key']})"
    assert handover.source_line("b1", first) == f"llama.cpp b1: compile (no host has {first['key']})"
    assert handover.source("lab1", data, _state(), "b1", RT) is handover.source("lab1", data, _state(), "b1", RT)
    # a host with the build has nothing to get; without handover every host compiles
    assert handover.source("lab3", data, _state("b1"), "b1", RT)["how"] == "have"
    assert handover.source_line("b1", {"how": "have"}) is None
    off = handover.source("lab4", {**data, "llama_cpp_handover": False}, _state(), "b1", RT)
    assert off["how"] == "compile" and off["why"] == "llama_cpp_handover: false"


def test_a_recorded_build_is_received_from_the_cache_and_a_cpu_without_its_flags_compiles(data, tmp_path):
    key = artifact.key("b1", COMMIT, RT)
    part = tmp_path / "part"
    part.write_bytes(_tar(GOOD))
    artifact.kept(data["llama_cpp_artifacts"], key, part, {"build_id": "b1", "host": "lab1", "runtime": RT})
    got = handover.source("lab2", data, _state(), "b1", RT)
    assert got["how"] == "receive" and got["from"] == "lab1" and got["cached"]
    assert handover.source_line("b1", got).startswith("llama.cpp b1: from lab1 (0 MiB, cached; artifact ")
    less = artifact.runtime(STATE, ["avx", "avx2", "fma"], [], None)
    got = handover.source("lab3", data, _state(), "b1", less)
    assert got["how"] == "compile" and got["why"] == "lab1's build cannot run here: it uses avx512f, which this CPU lacks"


def test_the_compiling_host_is_the_first_of_the_inventory_whichever_asks_first(tmp_path):
    """issue 64: of the hosts of the run with the same key, the first of the inventory compiles,
    though a later one asks first (pyinfra prepares hosts at once): the later one works its key out
    from its configuration, its preflight's plan and its builds, read (@local: pyinfra's local
    connector, a host read for real) and kept on the run; a host not in the run is not counted."""
    from rigup.config import config_of
    from rigup.gpu.plan import hardware_plan
    from roles.llama_cpp.facts import LlamaCppState
    from roles.llama_cpp.script import build_id, cmake_options

    # llama_cpp_dir: of root's, as a peer's is read (peer_value; a /tmp path is refused), never made
    same = {"llama_cpp_ref": COMMIT, "llama_cpp_dir": "/opt/rigup-test-absent/llama.cpp",
            "llama_cpp_artifacts": str(tmp_path / "cache")}
    for reached in (True, False):
        with lab_run(("@local", "lab2"), same) as run:
            local, lab2 = (ctx_state.get().inventory.get_host(n) for n in ("@local", "lab2"))
            if reached:
                reach("@local", "lab2")
            plan = run.plans["@local"] = dict(hardware_plan([]))   # as its preflight made it: a CPU host
            data = config_of(lab2)
            options = cmake_options(plan, data)
            ident, state = build_id(data, options), local.get_fact(LlamaCppState, dir=same["llama_cpp_dir"])
            runtime = artifact.runtime(state, [], options, None)    # lab2 is the same machine
            got = handover.source("lab2", data, state, ident, runtime)
            print(f"\n@local {'in' if reached else 'not in'} the run, lab2 first: {handover.source_line(ident, got)}")
            if not reached:
                assert got["how"] == "compile" and "@local" not in run.compiling
                continue
            assert got["how"] == "receive" and got["from"] == "@local" and run.compiling["@local"] == got["key"]
            first = handover.source("@local", config_of(local), state, ident, runtime)
            assert first["how"] == "compile" and first["key"] == got["key"]


def test_a_ref_the_controller_cannot_resolve_compiles_saying_why(data, tmp_path):
    got = handover.source("lab1", {**data, "llama_cpp_ref": "b8779", "llama_cpp_source": f"file://{tmp_path}/none.git"},
                          _state(), "b1", RT)
    assert got["how"] == "compile" and got["why"].startswith("the controller could not resolve b8779: ")
