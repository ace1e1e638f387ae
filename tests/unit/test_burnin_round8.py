"""Round 8 of issue 61 on rigup-burnin (roles/burnin/shipped/acceptance.py) and its lease (roles/burnin/__init__.py).

L1: the LD_LIBRARY_PATH check ran in ``__main__``, after the module's imports had mapped libffi (ctypes),
libcrypto (hashlib), libbz2 and liblzma (shutil) through the unchecked path: another user's libffi.so.8
ran as root at ``import ctypes``. The check now comes before any import that maps a library."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from roles.burnin.shipped import acceptance
from tests.unit.test_burnin_cublas import NOBODY, alone_scratch, staff_dir

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"   # the host's, as the program's first line names it
# a libffi.so.8 that _ctypes accepts (its versioned symbols), with a constructor: round 8's stand-in
FFI = """typedef struct { unsigned long size; unsigned short a, t; void **e; } T;
#define D(n) T n = {8, 8, 0, 0};
D(ffi_type_double) D(ffi_type_float) D(ffi_type_longdouble) D(ffi_type_pointer) D(ffi_type_sint16)
D(ffi_type_sint32) D(ffi_type_sint64) D(ffi_type_sint8) D(ffi_type_uint16) D(ffi_type_uint32)
D(ffi_type_uint64) D(ffi_type_uint8) D(ffi_type_void)
int ffi_call(){return 0;} int ffi_prep_cif(){return 0;} int ffi_prep_cif_var(){return 0;}
void *ffi_closure_alloc(){return 0;} void ffi_closure_free(){} int ffi_prep_closure_loc(){return 0;}
"""
FFI_MAP = ("LIBFFI_BASE_8.0 { global: ffi_type_*; ffi_call; ffi_prep_cif; ffi_prep_cif_var; local: *; };\n"
           "LIBFFI_CLOSURE_8.0 { global: ffi_closure_alloc; ffi_closure_free; ffi_prep_closure_loc; } LIBFFI_BASE_8.0;\n")


def planted(out: Path, mark: Path, body: str = "", version_map: str = "") -> Path:
    """A library at ``out``, another user's, whose constructor appends its path to ``mark``."""
    src = out.parent / (out.name + ".c")
    src.write_text(body + '#include <stdio.h>\n__attribute__((constructor)) static void ran(void) '
                   f'{{ FILE *f = fopen("{mark}", "a"); if (f) {{ fputs("{out}\\n", f); fclose(f); }} }}\n')
    extra = []
    if version_map:
        (out.parent / "v.map").write_text(version_map)
        extra = [f"-Wl,--version-script={out.parent / 'v.map'}"]
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{out.name}", *extra], check=True)
    src.unlink()
    os.chown(out, NOBODY, NOBODY)
    return out


def installed(where: Path) -> Path:
    """rigup-burnin as roles/burnin installs it: the program, rigup_xid.py beside it."""
    (where / "rigup-burnin").write_text((ROOT / "roles/burnin/shipped/acceptance.py").read_text())
    (where / "rigup_xid.py").write_text((ROOT / "shipped/xid.py").read_text())
    return where / "rigup-burnin"


def runtime_libraries(program: Path) -> set[str]:
    """The sonames the loader maps for ``program --help`` after the interpreter's own start (its imports')."""
    r = subprocess.run([PYTHON, "-sES", str(program), "--help"], capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "LD_DEBUG": "libs"})
    after = r.stderr.split("transferring control:", 1)[1]
    return {Path(line.split("calling init: ", 1)[1].strip()).name for line in after.splitlines()
            if "calling init: " in line and "/lib-dynload/" not in line}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("gcc") or not os.path.exists(PYTHON),
                    reason="needs root (another user's directory), gcc and /usr/bin/python3")
def test_l1_no_library_is_searched_for_in_a_skipped_directory_after_the_start(tmp_path):
    """Every library the program's imports map, planted in a 2775 directory another user writes (named
    first in LD_LIBRARY_PATH): the loader never tries a file there after the interpreter's own start (the
    libraries python3 itself needs are mapped at its exec, the caller's to clean: no program can check
    before its own exec), no constructor of theirs runs, and the directory is named left out once."""
    program = installed(tmp_path)
    names = runtime_libraries(program)
    print("mapped by the imports:", sorted(names))
    assert "libffi.so.8" in names or not names, names   # Debian's python3: ctypes' libffi, hashlib's libcrypto...
    with alone_scratch() as base:
        staff = staff_dir(base / "staff")
        mark = base / "ran"
        for name in names | {"libffi.so.8"}:
            planted(staff / name, mark, *((FFI, FFI_MAP) if name == "libffi.so.8" else ()))
        good = base / "good"
        good.mkdir()
        r = subprocess.run([PYTHON, "-sES", str(program), "--help"], capture_output=True, text=True, timeout=60, cwd="/",
                           env={"PATH": "/usr/bin:/bin", "LD_DEBUG": "libs", "LD_LIBRARY_PATH": f"{staff}:{good}"})
        assert r.returncode == 0 and "usage: rigup-burnin" in r.stdout, r.stderr[-2000:]
        started, rest = r.stderr.split("transferring control:", 1)
        tried = [line for line in rest.splitlines() if str(staff) in line and not line.startswith("rigup-burnin:")]
        assert tried == [], tried
        assert not mark.exists(), mark.read_text()
        said = [line for line in r.stderr.splitlines() if line.startswith("rigup-burnin:")]
        assert said == [f"rigup-burnin: LD_LIBRARY_PATH's {str(staff)!r} left out: {staff} is 2775: writable by its "
                        "group or others (root loads no library another user can replace)"]
        assert f"search path={good}" in rest   # started again with the directory that passed


def test_l1_only_modules_built_into_the_interpreter_come_before_the_check():
    """The module's imports above its ``loader_path_checked()`` are pure Python over modules the
    interpreter has built in (posix, _sre, _stat, itertools): no library mapped, wherever it runs."""
    import ast
    import sys
    tree = ast.parse((ROOT / "roles/burnin/shipped/acceptance.py").read_text())
    before = []
    for node in tree.body:
        if isinstance(node, ast.If) and "loader_path_checked" in ast.unparse(node):
            break
        if isinstance(node, ast.Import):
            before += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            before.append(node.module)
    else:
        pytest.fail("no loader_path_checked() at the module's top level")
    assert before and set(before) <= {"os", "re", "stat", "sys", "itertools"}, before
    assert {"itertools", "sys", "posix", "_sre", "_stat"} <= set(sys.builtin_module_names)


# ---------------------------------------------------------------- L2: the files in a directory the loader searches
# Root's kept LD_LIBRARY_PATH directory holding a link to another user's file (or a 0666 file) that root's
# checked cuBLAS needs: the loader mapped it as root. A directory the loader searches is used only where
# every file in it passes alone() too (acceptance.searched): LD_LIBRARY_PATH's and cuBLAS's own.

def cublas_needing(out: Path, dep: Path, origin: bool = False) -> Path:
    """Root's libcublas.so.13 at ``out``, needing ``dep`` by its soname (with ``origin``: RUNPATH $ORIGIN)."""
    from tests.unit.test_burnin_loader import built
    if not origin:
        return built(out, needs=(dep,))
    src = out.parent / "cublas.c"
    src.write_text("void cublasCreate_v2(void) {}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), "-Wl,--no-as-needed", "-Wl,-rpath,$ORIGIN",
                    f"-L{dep.parent}", f"-l:{dep.name}"], check=True)
    src.unlink()
    return out


@pytest.mark.parametrize("kind", ["link to theirs", "0666", "origin"])
def test_l2_a_file_in_a_searched_directory_that_another_user_can_replace_is_never_loaded(kind):
    """Round 8 L2 and L3 (LD_LIBRARY_PATH's kept directory) and cuBLAS's own directory under a RUNPATH of
    $ORIGIN: without the check the loader maps the file (the hole, shown first); with it, the directory is
    left out named, and no constructor runs."""
    from tests.unit.test_burnin_loader import built, child
    if os.geteuid() != 0 or not shutil.which("gcc"):
        pytest.skip("needs root (another user's file) and gcc")
    with alone_scratch() as tree:
        ran = tree / "ran"
        staff = staff_dir(tree / "staff")
        good = tree / "good"
        good.mkdir()
        dep = good / "libdep.so"
        if kind == "0666":
            built(dep, mark=ran).chmod(0o666)
        else:
            dep.symlink_to(built(staff / "libdep.so", mark=ran, owner=NOBODY))
        cublas = cublas_needing(good / "libcublas.so.13", dep, origin=kind == "origin")
        library_path = "" if kind == "origin" else str(good)
        r = child(f"ctypes.CDLL({str(cublas)!r})", library_path)     # the loader's own search: the hole
        assert ran.exists(), r.stderr
        ran.unlink()
        code = (f"A.loader_path_checked(); A.CUBLAS_DIRS = ({str(good)!r},); print(A.find_cublas()[1]); "
                "print(os.environ.get('LD_LIBRARY_PATH'))")
        r = child(code, library_path)
        print(r.stdout, r.stderr)
        assert not ran.exists()
        why = {"link to theirs": f"its libdep.so: {staff} is 2775: writable by its group or others",
               "0666": f"its libdep.so: {dep} is 666: writable by its group or others"}
        if kind == "origin":
            assert r.stdout.splitlines() == [f"no cuBLAS: {'/'.join(acceptance.CUBLAS)} not found where only root writes",
                                             ""]
            assert r.stderr.splitlines() == [f"rigup-burnin: cuBLAS {cublas} skipped: its libdep.so: {staff} is 2775: "
                                             "writable by its group or others (root loads no library another user "
                                             "can replace)"]
        else:
            assert r.stdout.splitlines()[1] == "None"
            assert f"rigup-burnin: LD_LIBRARY_PATH's {str(good)!r} left out: {why[kind]}" in r.stderr


ENTRY = st.sampled_from(["root 644", "root 755", "root 666", "root 620", "theirs 644", "link to root's",
                         "link to theirs", "link through theirs", "link to a directory", "link to theirs/",
                         "subdirectory", "dangling"])
BAD = {"root 666", "root 620", "theirs 644", "link to theirs", "link through theirs", "link to theirs/", "dangling"}


@pytest.fixture(scope="module")
def scratch():
    if os.geteuid() != 0:
        pytest.skip("another user's files need root")
    with alone_scratch() as base:
        staff = staff_dir(base / "staff")
        (staff / "theirs.so").write_text("")
        os.chown(staff / "theirs.so", NOBODY, NOBODY)
        (base / "roots.so").write_text("")
        (base / "sub").mkdir()
        yield base


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY, max_size=6))
def test_searched_passes_a_directory_only_where_each_file_in_it_is_roots_alone(scratch, entries):
    """A directory of any of these entries is passed exactly where none is a file (or a link's target)
    another user could write, or a link to nothing; a subdirectory and a link to root's directory are
    not files the loader maps."""
    d = scratch / f"d{len(list(scratch.iterdir()))}"
    d.mkdir()
    for i, kind in enumerate(entries):
        p = d / f"lib{i}.so"
        if kind.startswith("root ") or kind == "theirs 644":
            p.write_text("")
            os.chown(p, NOBODY if kind.startswith("theirs") else 0, 0)
            p.chmod(int(kind.split()[1], 8))
        elif kind == "subdirectory":
            p.mkdir()
        else:
            p.symlink_to({"link to root's": scratch / "roots.so", "link to theirs": scratch / "staff/theirs.so",
                          "link through theirs": scratch / "staff/../roots.so", "link to a directory": scratch / "sub",
                          "link to theirs/": scratch / "staff", "dangling": scratch / "none.so"}[kind])
    real, why = acceptance.searched(str(d))
    bad = [k for k in entries if k in BAD]
    assert (why is None) == (not bad), (entries, why)
    assert real == str(d) and (why is None or why.startswith("its lib"))


# ---------------------------------------------------------------- R1: the Xid parser, by its path only
DECOY = "import os, sys; print('decoy ran as uid', os.getuid(), file=sys.stderr); raise SystemExit(9)\n"


@pytest.mark.skipif(not os.path.exists(PYTHON), reason="no /usr/bin/python3")
@pytest.mark.parametrize("flags", [["-sES"], []])
def test_r1_the_xid_parser_is_read_from_beside_the_program_only(tmp_path, flags):
    """Installed as roles/burnin installs it (PREFIX/bin) but without rigup_xid.py beside it (a converge cut
    between the two files): decoys in the prefix's parent (round 8 R1: /opt), a shipped package there, in the
    current directory and on PYTHONPATH are never imported; the program ends naming the file. With the file
    beside it, and a rigup_xid/ package beside that, the file is the one read (by its path)."""
    bin_ = tmp_path / "opt/rigup/bin"
    bin_.mkdir(parents=True)
    program = installed(bin_)
    (bin_ / "rigup_xid.py").unlink()
    for where in (tmp_path / "opt", tmp_path / "cwd", tmp_path / "pp"):
        where.mkdir(exist_ok=True)
        (where / "rigup_xid.py").write_text(DECOY)
        (where / "shipped").mkdir(parents=True)
        (where / "shipped/xid.py").write_text(DECOY)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "pp")}
    r = subprocess.run([PYTHON, *flags, str(program), "--help"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path / "cwd", env=env)
    assert (r.returncode, r.stderr) == (2, "rigup-burnin: rigup_xid.py is not beside it (roles/burnin installs the two): "
                                           "not run\n")
    (bin_ / "rigup_xid.py").write_text((ROOT / "shipped/xid.py").read_text())
    (bin_ / "rigup_xid").mkdir()
    (bin_ / "rigup_xid/__init__.py").write_text(DECOY)
    r = subprocess.run([PYTHON, *flags, str(program), "status", "--results", str(tmp_path / "none.json")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path / "cwd", env=env)
    assert r.returncode == 0 and "decoy" not in r.stderr, r.stderr


def test_r1_the_source_tree_reads_its_own_file():
    """In the source tree (the controller imports the module; tests/gpu runs the file) shipped/xid.py."""
    assert acceptance.xid_lines.__file__ == str(ROOT / "shipped/xid.py")


# ---------------------------------------------------------------- W1: the lease's watcher signals only the burn-in's group
def start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat (after the name, which may hold blanks and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def watched(tmp_path: Path, group: int, started: str) -> subprocess.CompletedProcess:
    """The lease's WATCH under sh as systemd-run starts it: its session already ended, a lease of 1 s."""
    from roles import burnin
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "systemctl").write_text("#!/bin/sh\necho \"systemctl $*\" >> \"$(dirname \"$0\")/calls\"\n")
    (shim / "systemctl").chmod(0o755)
    ended = subprocess.Popen(["true"])
    ended.wait()
    return subprocess.run(["sh", "-c", burnin.WATCH, "rigup-burnin-lease", str(ended.pid), str(group), started, "1",
                           str(tmp_path / "note"), str(tmp_path / "testing"), "rigup-llama@a.service"],
                          capture_output=True, text=True, timeout=60, env={"PATH": f"{shim}:/usr/bin:/bin"})


def test_w1_the_session_records_the_groups_leader_and_its_start_time():
    """SESSION's $g and $t: the operation's process group and the start time of its leader, as /proc says."""
    from roles import burnin
    r = subprocess.run(["setsid", "sh", "-c", burnin.SESSION + '; echo "$g $t"; echo $$'], capture_output=True,
                       text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    (group, started), (me,) = (line.split() for line in r.stdout.splitlines())
    assert group == me and started.isdigit(), r.stdout


@pytest.mark.parametrize("case", ["its leader's pid taken by another", "the burn-in's still", "its leader gone"])
def test_w1_the_watcher_signals_the_recorded_group_only_while_it_is_the_burn_ins(tmp_path, case):
    """Round 8 W1: the group id recorded at arm time, its leader's pid now another process's (a run that ended
    without a verdict, the id reused): that process's group is left alone, and the units still started
    again. The burn-in's own group (its leader of the recorded start time, or its leader gone while its
    workers live) is ended."""
    if case == "its leader gone":   # the leader exits at once; the member in its group lives on
        leader = subprocess.Popen(["setsid", "sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE,
                                  text=True)
        member = int(leader.stdout.readline())
        group, started = leader.pid, "1"
        leader.wait()
    else:
        other = subprocess.Popen(["setsid", "sleep", "30"])
        for _ in range(100):   # setsid has made the group once sleep runs in it
            if os.getpgid(other.pid) == other.pid and "sleep" in Path(f"/proc/{other.pid}/comm").read_text():
                break
            __import__("time").sleep(0.02)
        group, member = other.pid, other.pid
        started = start_time(other.pid) if case == "the burn-in's still" else str(int(start_time(other.pid)) - 1)
    try:
        r = watched(tmp_path, group, started)
        print(r.stdout, r.stderr)
        if case == "its leader's pid taken by another":
            assert not gone(member) and other.poll() is None
        else:
            assert __import__("time").sleep(0.2) or gone(member)
        assert (tmp_path / "bin/calls").read_text() == "systemctl start rigup-llama@a.service\n"
        assert "lapsed: rigup-llama@a.service started again" in (tmp_path / "note").read_text()
    finally:
        if not gone(member):
            os.kill(member, 9)
