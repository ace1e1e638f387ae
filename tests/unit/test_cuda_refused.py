"""An nvcc the CUDA fact found and did not run (a directory up to / of its real path or of its name is not
root's alone: Debian's /usr/local is 2775 root:staff) is said, not silently none (issue 61's leftovers): the fact keeps the
directory, its mode, owner and group (rigup/gpu/facts.py parse_refused_nvcc), and preflight refuses the
host once, naming them and the fix (roles/cuda_toolkit/checks.py check_nvcc_root_alone), where the build
would compile with it as root."""

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rigup.gpu.facts import CUDA_COMMAND, parse_cuda_toolkits, parse_hardware, parse_refused_nvcc
from tests.unit.hosts import data, host, only, refusals

STAFF = ["--- /usr/local/cuda/bin/nvcc /usr/local/cuda-12.4/bin/nvcc", "unsafe 0 2775 root:staff /usr/local",
         "--- /usr/local/cuda-12.4/bin/nvcc /usr/local/cuda-12.4/bin/nvcc", "unsafe 0 2775 root:staff /usr/local",
         "--- /usr/bin/nvcc /usr/bin/nvcc", "Cuda compilation tools, release 11.8, V11.8.89"]


def test_a_refused_nvcc_keeps_its_directory_mode_owner_and_group():
    (r,) = parse_refused_nvcc(STAFF)
    print(r)
    assert r["path"] == "/usr/local/cuda-12.4/bin/nvcc"
    assert r["seen_as"] == ["/usr/local/cuda/bin/nvcc", "/usr/local/cuda-12.4/bin/nvcc"]
    assert (r["dir"], r["mode"], r["owner"], r["group"]) == ("/usr/local", "2775", "root", "staff")
    assert r["why"] == "/usr/local is 2775 root:staff, writable by group staff"
    assert r["fix"] == "chmod g-w /usr/local"
    # the usable toolkits are as before, and the hardware fact carries both
    assert [t["path"] for t in parse_cuda_toolkits(STAFF)] == ["/usr/bin/nvcc"]
    hw = parse_hardware(["##rigup:cuda", *STAFF])
    assert [t["path"] for t in hw["cuda_refused"]] == [r["path"]] and parse_hardware([])["cuda_refused"] == []


def test_each_reason_is_named_with_its_fix():
    def one(line):
        (r,) = parse_refused_nvcc(["--- /opt/c/bin/nvcc /opt/c/bin/nvcc", line])
        return r["why"], r["fix"]
    assert one("unsafe 1000 755 bob:bob /opt/c/bin") == ("/opt/c/bin is 755 bob:bob, owned by bob", "chown root /opt/c/bin")
    assert one("unsafe 0 1777 root:root /tmp") == ("/tmp is 1777 root:root, writable by group root and writable by others",
                                                   "chmod g-w /tmp; chmod o-w /tmp")
    assert one("unsafe ? ? ?:? /opt/c") == ("/opt/c is not readable (stat failed)",
                                            "make /opt/c root's alone (chown root, chmod go-w)")
    # a directory holding a space or a shell character is no name the command prints (round 7 N11): not read,
    # and the section it is in is no toolkit either; it is still refused, naming its nvcc (round 8 N1: never
    # silently none)
    bad = ["--- /opt/c/bin/nvcc /opt/c/bin/nvcc", "unsafe 0 777 root:root /opt/a b;x",
           "Cuda compilation tools, release 12.8, V12.8.93"]
    assert [(r["dir"], r["mode"]) for r in parse_refused_nvcc(bad)] == [("/opt/c/bin/nvcc", None)]
    assert parse_cuda_toolkits(bad) == []
    # a link the chain did not follow (a target outside the names, or a loop)
    assert one("unsafe name /usr/local/cuda") == (
        "/usr/local/cuda is a link rigup does not follow (its target holds a character other than "
        "A-Z a-z 0-9 / . _ + -, or more than 40 links lead there)", "point /usr/local/cuda at the toolkit's plain path")
    # the form before this one (a path alone) still reads
    assert one("unsafe /usr")[0] == "/usr is not readable (stat failed)"


def gathered(path: str) -> list[str]:
    """CUDA_COMMAND's output on this machine's shell with ``path`` first on PATH."""
    return subprocess.run(["sh", "-c", CUDA_COMMAND], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{path}:/usr/bin:/bin"}).stdout.splitlines()


def test_the_walk_prints_the_directory_group_writable_on_a_real_shell(tmp_path):
    """CUDA_COMMAND on this machine's shell: an nvcc under a 2775 directory is neither run nor a toolkit,
    and the fact names that directory and its mode (the walk goes up from the binary: the first found)."""
    ran = tmp_path / "ran"
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f'#!/bin/sh\ntouch {ran}\necho "Cuda compilation tools, release 12.8, V12.8.93"\n')
    nvcc.chmod(0o755)
    nvcc.parent.chmod(0o2775)
    out = gathered(str(nvcc.parent))
    got = {r["path"]: r for r in parse_refused_nvcc(out)}
    print([ln for ln in out if ln.startswith("unsafe")], got)
    assert str(nvcc) in got and not ran.exists()
    r = got[str(nvcc)]
    assert r["dir"] == str(nvcc.parent) and r["mode"] == "2775" and "writable by group" in r["why"]
    assert str(nvcc) not in {t["path"] for t in parse_cuda_toolkits(out)}
    # found by a relative PATH entry ("bin"): no nvcc at all (not run, not listed)
    out = subprocess.run(["sh", "-c", CUDA_COMMAND], capture_output=True, text=True, timeout=60, cwd=nvcc.parent.parent,
                         env={**os.environ, "PATH": "bin:/usr/bin:/bin"}).stdout.splitlines()
    assert not [ln for ln in out if str(tmp_path) in ln or ln.startswith("--- bin/")] and not ran.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory chain root alone owns is made under /root")
def test_a_name_in_a_directory_another_user_writes_is_refused_though_its_target_is_roots(tmp_path):
    """N22's stricter rule: the build runs cuda_source nvidia's and distro's nvcc by its name, so a link in a
    group-writable directory (theirs to point elsewhere) is refused although the nvcc it reaches is root's
    alone. NVIDIA's own layout, /usr/local/cuda a link to cuda-12.8 in a directory of root's, is no refusal
    (a link's own mode, 777, is no one's to change: stat -L), and the nvcc is a toolkit by either name."""
    import shutil
    import tempfile
    home = Path(tempfile.mkdtemp(dir="/root"))
    try:
        home.chmod(0o755)
        ran = tmp_path / "ran"
        real = home / "cuda-12.8" / "bin" / "nvcc"
        real.parent.mkdir(parents=True)
        real.write_text(f'#!/bin/sh\necho "$0" >> {ran}\necho "Cuda compilation tools, release 12.8, V12.8.93"\n')
        real.chmod(0o755)
        (home / "cuda").symlink_to("cuda-12.8")
        link = tmp_path / "g" / "nvcc"
        link.parent.mkdir()
        link.parent.chmod(0o2775)
        link.symlink_to(real)
        out = gathered(str(link.parent))
        refused = [r for r in parse_refused_nvcc(out) if r["path"] == str(real)]
        print(refused)
        assert [(r["seen_as"], r["dir"], r["mode"]) for r in refused] == [([str(link)], str(link.parent), "2775")]
        assert str(link) not in {s for t in parse_cuda_toolkits(out) for s in t["seen_as"]} and not ran.exists()
        for name in (real, home / "cuda" / "bin" / "nvcc"):
            out = gathered(str(name.parent))
            assert str(name) in {s for t in parse_cuda_toolkits(out) if t["path"] == str(real) for s in t["seen_as"]}
            assert str(real) not in {r["path"] for r in parse_refused_nvcc(out)}
        assert ran.read_text().splitlines() == [str(real)] * 2     # run by its real path, never by the name
    finally:
        shutil.rmtree(home)


@settings(max_examples=60, deadline=1000)
@given(st.lists(st.sampled_from(["--- /a/nvcc /a/nvcc", "--- /a/nvcc", "unsafe ", "unsafe 0 2775 root:staff /x",
                                 "Cuda compilation tools, release 12.8, V12.8.93"]) | st.text(max_size=40), max_size=8))
def test_any_cuda_text_reads_as_refused_or_not_never_both(lines):
    """Host text (a path, a user or group name come from the host): read without an exception, each
    refused nvcc's directory a path, and no name both a toolkit's and refused."""
    refused = parse_refused_nvcc(lines)
    assert all(r["dir"].startswith("/") and r["why"].startswith(r["dir"]) for r in refused)
    assert not {s for r in refused for s in r["seen_as"]} & {s for t in parse_cuda_toolkits(lines) for s in t["seen_as"]}


REFUSED = parse_refused_nvcc(STAFF)


def test_preflight_says_once_why_the_nvcc_the_build_would_use_is_not_used():
    plan, facts = host("h100", cuda_refused=REFUSED)
    (r,) = only(refusals(plan, facts, data(cuda_version="12.4")), "nvcc_root_alone")
    print(r.line("h"))
    assert r.line("h").startswith("[h] refused: nvcc /usr/local/cuda-12.4/bin/nvcc not used: /usr/local is 2775 "
                                  "root:staff, writable by group staff: the build compiles with it as root")
    assert r.fix == "chmod g-w /usr/local; or set cuda_source to distro (/usr/bin/nvcc)"


def test_a_refused_nvcc_the_build_does_not_use_refuses_nothing():
    plan, facts = host("h100", cuda_refused=REFUSED)
    assert refusals(plan, facts, data(cuda_version="12.8")) == []                         # nvidia's 12.8: another path
    assert refusals(plan, facts, data(cuda_version="12.4", cuda_source="distro")) == []    # /usr/bin/nvcc
    assert refusals(plan, facts, data(cuda_version="12.4", llama_cpp_backend="cpu")) == []
    assert refusals({**plan, "llama_cpp_compiles": False}, facts, data(cuda_version="12.4")) == []   # receives its build


def test_cuda_source_present_names_the_refused_nvcc_when_none_of_its_version_is_usable():
    plan, facts = host("h100", cuda_refused=REFUSED, cuda_toolkits=[{"version": "12.8", "path": "/opt/ok/nvcc"}])
    (r,) = only(refusals(plan, facts, data(cuda_version="12.4", cuda_source="present")), "nvcc_root_alone")
    assert "no nvcc 12.4 is found that root may run (cuda_source present)" in r.why
    assert r.fix == "chmod g-w /usr/local; or install nvcc 12.4 where root alone writes"
    assert refusals(plan, facts, data(cuda_version="12.8", cuda_source="present")) == []


def test_a_compiler_installed_this_run_where_another_user_writes_fails_the_host_before_it_compiles(monkeypatch):
    """roles/cuda_toolkit's install, the first run: preflight read no nvcc (none was there yet), so after
    apt installed one (``_if``: only then) the refused nvcc fails the host with preflight's own words, before
    llama.cpp compiles with it as root; an nvcc of root's alone is a no-op."""
    import types

    from pyinfra.api import OperationError

    import roles.cuda_toolkit as role
    said = []
    monkeypatch.setattr(role, "host", types.SimpleNamespace(noop=said.append, name="h"))
    monkeypatch.setattr(role, "read_once", lambda fact, **kw: REFUSED if fact is role.RefusedNvcc else [])
    with pytest.raises(OperationError) as e:
        list(role.compiler_root_alone._inner(path="/usr/local/cuda-12.4/bin/nvcc", source="nvidia", version="12.4"))
    print(e.value)
    assert str(e.value) == ("nvcc /usr/local/cuda-12.4/bin/nvcc not used: /usr/local is 2775 root:staff, writable by "
                            "group staff: the build compiles with it as root (cuda_source nvidia), and root must not "
                            "run a program another user can replace; fix: chmod g-w /usr/local; or set cuda_source "
                            "to distro (/usr/bin/nvcc)")
    assert list(role.compiler_root_alone._inner(path="/usr/bin/nvcc", source="distro", version="12.4")) == []
    assert said == ["/usr/bin/nvcc is root's alone"]
