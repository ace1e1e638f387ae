"""Round 7b L1, L2 of issue 61: rigup-burnin checks the cuBLAS file it loads, but the loader finds each
library that file needs by its own search, LD_LIBRARY_PATH (read once, at the process's start) first: root's
libcublas.so.13 needing a library a staff user put in a 2775 directory of LD_LIBRARY_PATH ran that user's
constructor as root. rigup-burnin now starts again with only the directories ``alone()`` passes
(``loader_path_checked``). Real dlopen over a scratch tree of gcc-built libraries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from roles.burnin.shipped import acceptance
from tests.unit.test_burnin_cublas import NOBODY, alone_scratch, staff_dir

ROOT = Path(__file__).resolve().parents[2]


def built(out: Path, needs: tuple[Path, ...] = (), mark: Path | None = None, owner: int = 0) -> Path:
    """A shared library at ``out`` with cuBLAS's first symbol; needing ``needs`` (by soname, as a toolkit's
    DT_NEEDED: no path kept); with ``mark``, a constructor that appends the library's own name there."""
    src = out.with_suffix(".c")
    body = "void cublasCreate_v2(void) {}\n"
    if mark:
        body += ("#include <stdio.h>\n__attribute__((constructor)) static void ran(void) "
                 f'{{ FILE *f = fopen("{mark}", "a"); if (f) {{ fputs("{out}\\n", f); fclose(f); }} }}\n')
    src.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), "-Wl,--no-as-needed",
                    *[f"-L{n.parent}" for n in needs], *[f"-l:{n.name}" for n in needs]], check=True)
    src.unlink()
    os.chown(out, owner, owner)
    return out


@pytest.fixture
def tree():
    if os.geteuid() != 0 or not shutil.which("gcc"):
        pytest.skip("needs root (a directory of another user's) and gcc")
    with alone_scratch() as base:
        yield base


def child(code: str, library_path: str) -> subprocess.CompletedProcess:
    """``code`` in a new python (the loader's LD_LIBRARY_PATH is the one it starts with)."""
    prelude = f"import os, sys, ctypes; sys.path.insert(0, {str(ROOT)!r}); from roles.burnin.shipped import acceptance as A; "
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": library_path})


def test_the_loader_reads_library_path_at_start_only(tree):
    """The premise: a change to os.environ after start moves no dlopen, and a library's needs are found
    by the start's LD_LIBRARY_PATH (so the program must start again with a checked one)."""
    dep = built((tree / "a").mkdir() or tree / "a" / "libdep.so")
    lib = built((tree / "b").mkdir() or tree / "b" / "libm1.so", needs=(dep,))
    r = child(f"os.environ['LD_LIBRARY_PATH'] = {str(dep.parent)!r}\ntry: ctypes.CDLL({str(lib)!r}); print('loaded')\n"
              "except OSError: print('not found')", "")
    assert r.stdout.splitlines() == ["not found"], r.stderr
    r = child(f"os.environ.pop('LD_LIBRARY_PATH'); ctypes.CDLL({str(lib)!r}); print('loaded')", str(dep.parent))
    assert r.stdout.splitlines() == ["loaded"], r.stderr


def test_l1_a_need_of_roots_cublas_in_a_skipped_directory_is_never_loaded(tree):
    """L1 as the round ran it: root's checked libcublas.so.13 needs libevil.so, which a staff user put in
    a 2775 directory of LD_LIBRARY_PATH. Without the check the loader maps it (its constructor runs as
    root); with it, that directory is named and left out, and cuBLAS does not load (its need is nowhere
    only root writes). A root's copy in a checked directory of LD_LIBRARY_PATH is the one loaded."""
    ran = tree / "ran"
    staff = staff_dir(tree / "staff")
    evil = built(staff / "libevil.so", mark=ran, owner=NOBODY)
    good = tree / "good"
    good.mkdir()
    cublas = built(good / "libcublas.so.13", needs=(evil,))
    built(good / "libcublasLt.so.13")   # beside it, as the toolkit's (required)
    both = f"{staff}:{good}"
    r = child(f"ctypes.CDLL({str(cublas)!r})", both)     # the loader's own search: the hole
    assert ran.read_text().split() == [str(evil)], r.stderr
    ran.unlink()
    code = "A.loader_path_checked(); A.CUBLAS_DIRS = (); print(A.find_cublas()[1]); print(os.environ['LD_LIBRARY_PATH'])"
    r = child(code, both)
    print(r.stdout, r.stderr)
    assert not ran.exists()
    why, path = r.stdout.splitlines()
    assert why == "no cuBLAS: libcublas.so.13/libcublas.so.12/libcublas.so.11 not found where only root writes"
    assert path == str(good)   # its need is nowhere only root writes: the loader's --list said so, nothing loaded
    assert r.stderr.splitlines() == [f"rigup-burnin: LD_LIBRARY_PATH's {str(staff)!r} left out: {staff} is 2775: "
                                     "writable by its group or others (root loads no library another user can replace)",
                                     f"rigup-burnin: cuBLAS {cublas} skipped: {cublas} needs libevil.so, which the "
                                     "loader does not find (root loads no library another user can replace)"]
    mine = tree / "mine"
    mine.mkdir()
    built(mine / "libevil.so", mark=ran)
    r = child(code, f"{staff};{mine}::relative:/usr/$LIB:{good}")
    assert r.stdout.splitlines() == [str(cublas), f"{mine}:{good}"], r.stderr
    assert ran.read_text().split() == [str(mine / "libevil.so")]
    assert [ln.split(" left out: ")[1] for ln in r.stderr.splitlines()] == [
        f"{staff} is 2775: writable by its group or others (root loads no library another user can replace)",
        "not an absolute path (the loader's current directory) (root loads no library another user can replace)",
        "not an absolute path (the loader's current directory) (root loads no library another user can replace)",
        "a $ the loader expands (root loads no library another user can replace)"]


def test_l2_a_libcublaslt_in_a_skipped_directory_is_never_loaded(tree):
    """L2: root's cuBLAS without its libcublasLt beside it; another user's in LD_LIBRARY_PATH: not loaded."""
    ran = tree / "ran"
    staff = staff_dir(tree / "staff")
    lt = built(staff / "libcublasLt.so.13", mark=ran, owner=NOBODY)
    good = tree / "good"
    good.mkdir()
    built(good / "libcublas.so.13", needs=(lt,))
    r = child("A.loader_path_checked(); A.CUBLAS_DIRS = (); print(A.find_cublas()[1])", f"{staff}:{good}")
    assert "its libcublasLt.so.13 is not beside it (llama.cpp's CUDA build links both)" in r.stderr, r.stdout + r.stderr
    assert not ran.exists()


def test_the_installed_program_starts_again_once(tree):
    """rigup-burnin run by its path (its __main__): the directory named once, the command's own answer."""
    staff = staff_dir(tree / "staff")
    good = tree / "good"   # not the tree itself: its staff/ under it refuses it too (round 9 LH1)
    good.mkdir()
    r = subprocess.run([sys.executable, str(ROOT / "roles/burnin/shipped/acceptance.py"), "status", "--results",
                        str(tree / "none.json")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": f"{staff}:{good}"})
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 1 and "left out" in r.stderr, r.stderr


ENTRIES = st.sampled_from(["", "relative", ".", "$LIB", "/$ORIGIN/lib", "/nonexistent", "GOOD", "GOOD/.",
                           "GOOD/../GOOD", "STAFF", "LINK", "LINK/..", "/"]) | \
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRIES, max_size=8), seps=st.lists(st.sampled_from([":", ";"]), min_size=8, max_size=8))
def test_library_path_keeps_only_checked_absolute_directories(tree, entries, seps):
    """Whatever LD_LIBRARY_PATH holds, the directories kept are real paths :func:`searched` passes (no ``:``,
    ``;`` or ``$``: the loader splits at both and expands ``$``), each once, in order; every other entry
    (an empty one too: the loader's current directory) is named left out."""
    good = tree / "good"
    if not good.exists():
        good.mkdir()
        staff_dir(tree / "staff")
        (tree / "link").symlink_to(good)
    names = {"GOOD": str(good), "STAFF": str(tree / "staff"), "LINK": str(tree / "link")}

    def named(entry: str) -> str:
        head, slash, rest = entry.partition("/")
        return names.get(head, head) + slash + rest

    text = "".join(sep + named(e) for sep, e in zip(seps, entries))[1:]
    kept, out = acceptance.library_path(text)
    passed = [acceptance.searched(d) for d in text.replace(";", ":").split(":")
              if d.startswith("/") and "$" not in d]
    assert kept == list(dict.fromkeys(real for real, why in passed if why is None))
    for d in kept:
        assert d.startswith("/") and not set(d) & set(":;$") and acceptance.alone(d, directory=True) == (d, None)
        assert all(acceptance.alone(os.path.join(d, n))[1] is None for n in os.listdir(d)
                   if os.path.isfile(os.path.join(d, n)))   # every file the loader could map from it (round 8 L2)
    assert len(out) == len(text.replace(";", ":").split(":")) - sum(why is None for _, why in passed)
