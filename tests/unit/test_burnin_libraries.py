"""Issue 61, round 8's items left on rigup-burnin's CUDA libraries (roles/burnin/shipped/acceptance.py), which it
loads with ctypes as root:

- libcublasLt is required beside libcublas (llama.cpp's CUDA build links both): a cuBLAS without it is
  skipped, named, and never loaded;
- libcuda.so.1 is loaded by the path the driver installed it at (LD_LIBRARY_PATH's checked directories,
  then DRIVER_DIRS), never by its bare soname through the loader's search;
- a library the loader finds for one of them (its needs: RUNPATH, LD_LIBRARY_PATH, ld.so.cache) is
  used only when it and every directory above it are root's and not group- or other-writable: an
  ld.so.cache that lists Debian's /usr/local/lib (2775 root:staff) first makes no library there trusted.
Real loader over gcc-built libraries; the ld.so.cache case in a private mount namespace (unshare -m)
where a cache built by ldconfig -C is bound over /etc/ld.so.cache."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from roles.burnin.shipped import acceptance
from tests.unit.test_burnin_cublas import ELF, NOBODY, alone_scratch, library, staff_dir

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = "(root loads no library another user can replace)"


@pytest.fixture
def tree():
    if os.geteuid() != 0 or not shutil.which("gcc"):
        pytest.skip("needs root (a directory of another user's) and gcc")
    with alone_scratch() as base:
        yield base


def built(out: Path, needs: tuple[Path, ...] = (), mark: Path | None = None, soname: str | None = None) -> Path:
    """A shared library with cuBLAS's first symbol, needing ``needs`` by soname; with ``mark`` a
    constructor that appends its path there (it ran)."""
    src = out.with_suffix(".c")
    body = "void cublasCreate_v2(void) {}\n"
    if mark:
        body += ("#include <stdio.h>\n__attribute__((constructor)) static void ran(void) "
                 f'{{ FILE *f = fopen("{mark}", "a"); if (f) {{ fputs("{out}\\n", f); fclose(f); }} }}\n')
    src.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), "-Wl,--no-as-needed",
                    *([f"-Wl,-soname,{soname}"] if soname else []),
                    *[f"-L{n.parent}" for n in needs], *[f"-l:{n.name}" for n in needs]], check=True)
    src.unlink()
    return out


def test_a_cublas_without_its_libcublaslt_beside_it_is_skipped_and_named(tree, monkeypatch):
    lone, paired = tree / "lone", tree / "paired"
    lone.mkdir()
    paired.mkdir()
    library(lone / "libcublas.so.13")
    library(paired / "libcublas.so.12")
    library(paired / "libcublasLt.so.12")
    monkeypatch.setattr(acceptance, "CUBLAS_DIRS", (str(lone), str(paired)))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    found, skipped = acceptance.cublas_candidates()
    print(f"found {found}\nskipped {skipped}")
    assert found == [(str(paired / "libcublas.so.12"), str(paired / "libcublasLt.so.12"))]
    assert skipped == [f"rigup-burnin: cuBLAS {lone / 'libcublas.so.13'} skipped: its libcublasLt.so.13 is not beside "
                       f"it (llama.cpp's CUDA build links both) {SKIPPED}"]


def test_libcuda_is_loaded_by_the_path_the_driver_installed_never_by_its_soname(tree, monkeypatch):
    """The driver's directory (root's, 0755) gives libcuda.so.1 by its real path; one in a 2775
    directory listed before it is skipped, named; none anywhere says where it looked. No ctypes.CDLL of
    rigup-burnin is given a bare name (the loader's search: ld.so.cache, /usr/local/lib first)."""
    staff = staff_dir(tree / "usr-local-lib")
    library(staff / "libcuda.so.1")
    driver = tree / "usr-lib-arch"
    driver.mkdir()
    real = library(driver / "libcuda.so.580.95.05")
    (driver / "libcuda.so.1").symlink_to(real.name)                  # as the driver's package links it
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(acceptance, "DRIVER_DIRS", (str(staff), str(driver)))
    acceptance.libcuda.cache_clear()
    try:
        got = acceptance.libcuda()
        acceptance.libcuda.cache_clear()
        monkeypatch.setattr(acceptance, "DRIVER_DIRS", (str(staff),))
        refused = acceptance.libcuda()
        acceptance.libcuda.cache_clear()
        monkeypatch.setattr(acceptance, "DRIVER_DIRS", (str(tree / "none"),))
        none = acceptance.libcuda()
    finally:
        acceptance.libcuda.cache_clear()
    print(f"driver's: {got}\nonly the 2775 one: {refused}\nnone: {none}")
    assert got == (str(real), "")
    assert refused == (None, f"not loaded: {staff} is 2775: writable by its group or others {SKIPPED}")
    assert none == (None, f"not found in {tree / 'none'} (the driver installs it)")
    bare = [ast.unparse(n) for n in ast.walk(ast.parse((ROOT / "roles/burnin/shipped/acceptance.py").read_text()))
            if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("CDLL") and n.args
            and isinstance(n.args[0], ast.Constant)]
    print(f"CDLL of a constant name: {bare}")
    assert bare == []


def in_namespace(code: str, cache: Path, library_path: str = "") -> subprocess.CompletedProcess:
    """``code`` in a new python whose loader reads ``cache`` as /etc/ld.so.cache (a private mount
    namespace: the machine's own cache is untouched)."""
    # the program alone, as a host runs it (not through the roles package, whose imports would map the
    # controller's venv: a checkout under /tmp maps .so files of a 1777 directory, which the backstop names)
    prelude = (f"import os, sys, ctypes, importlib.util; spec = importlib.util.spec_from_file_location('acceptance', "
               f"{str(ROOT / 'roles/burnin/shipped/acceptance.py')!r}); A = importlib.util.module_from_spec(spec); "
               "sys.modules['acceptance'] = A; spec.loader.exec_module(A); ")
    script = f"mount --bind {cache} /etc/ld.so.cache && exec \"$0\" -c \"$1\""
    return subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable, prelude + code], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": library_path})


def test_a_need_the_ld_so_cache_finds_in_a_group_writable_directory_is_never_loaded(tree):
    """Round 8: root's cuBLAS (with its libcublasLt) in a directory only root writes needs
    librigupdep.so.1, which ld.so.cache finds in a 2775 root:staff directory listed first (Debian's
    /usr/local/lib; ldconfig lists what a staff user put there). The hole first: a plain dlopen runs its
    constructor as root. rigup-burnin's loader trace names it and loads nothing; the same directory at
    0755 (root's alone) gives the cuBLAS."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0 or not shutil.which("ldconfig"):
        pytest.skip("needs unshare -m (a private mount namespace) and ldconfig")
    ran = tree / "ran"
    staff = staff_dir(tree / "usr-local-lib")
    dep = built(staff / "librigupdep.so.1", mark=ran, soname="librigupdep.so.1")
    good = tree / "cuda"
    good.mkdir()
    cublas = built(good / "libcublas.so.13", needs=(dep,))
    built(good / "libcublasLt.so.13")
    (tree / "ld.so.conf").write_text(f"{staff}\n")
    cache = tree / "ld.so.cache"
    subprocess.run(["ldconfig", "-X", "-C", str(cache), "-f", str(tree / "ld.so.conf")], check=True)
    r = in_namespace(f"ctypes.CDLL({str(cublas)!r})", cache)         # the loader's own search: the hole
    print(f"a plain dlopen: rc {r.returncode}, constructors run: {ran.read_text().split() if ran.exists() else []}")
    assert r.returncode == 0 and ran.read_text().split() == [str(dep)], r.stderr
    ran.unlink()
    code = f"A.CUBLAS_DIRS = ({str(good)!r},); print(A.find_cublas()[1])"
    r = in_namespace(code, cache)
    print(f"rigup-burnin: {r.stdout.strip()}\n{r.stderr.strip()}")
    assert r.stdout.strip() == "no cuBLAS: libcublas.so.13/libcublas.so.12/libcublas.so.11 not found where only root writes"
    assert r.stderr.splitlines() == [
        f"rigup-burnin: cuBLAS {cublas} skipped: {cublas} needs librigupdep.so.1, which the loader finds at {dep}: "
        f"{staff} is 2775: writable by its group or others {SKIPPED}"]
    assert not ran.exists()
    staff.chmod(0o755)                                                # root's alone: its library is root's word
    os.chown(staff, 0, 0)
    r = in_namespace(code, cache)
    print(f"the directory at 0755: {r.stdout.strip()}")
    assert r.stdout.strip() == str(cublas) and r.stderr == "", r.stderr


def test_the_trace_refuses_what_it_cannot_read(tree, monkeypatch):
    """A need not found, a file that is no library, no loader where only root writes: each a reason."""
    lib = built(tree / "libtop.so", needs=(built((tree / "d").mkdir() or tree / "d" / "libgone.so"),))
    (tree / "d" / "libgone.so").unlink()
    (tree / "text.so").write_text("not ELF")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    need, text = acceptance.needs_alone(str(lib)), acceptance.needs_alone(str(tree / "text.so"))
    system = acceptance.needs_alone(ELF) if ELF else None            # the system's libm: root's all the way
    monkeypatch.setattr(acceptance, "LOADERS", (str(tree / "none"),))
    no_loader = acceptance.needs_alone(str(lib))
    print(f"{need}\n{text}\n{no_loader}")
    assert need == f"{lib} needs libgone.so, which the loader does not find"
    assert text and str(tree / "text.so") in text
    assert no_loader.startswith("no dynamic loader where only root writes")
    assert system is None
