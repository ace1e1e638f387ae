"""Issue 61, round 10/11 BU1 on rigup-burnin (roles/burnin/shipped/acceptance.py), which loads libcuda as root: libcuda
dlopens more libraries BY SONAME while it runs (libnvidia-ptxjitcompiler.so.1 for its PTX JIT, which every
kernel of rigup-burnin needs; libnvidia-nvvm.so.4, libnvidia-gpucomp.so.<driver>...), which no trace of its
DT_NEEDED shows: the loader's search for them (ld.so.cache, Debian's /usr/local/lib first) could answer with
another user's file. Now each is found where that dlopen would find it (the loader's trace, LD_PRELOAD) and
must be root's alone; the JIT's files beside libcuda's real path are loaded by that path first, so the
dlopen by soname finds them loaded; after a run every library mapped is checked again (the backstop).

Real loader over gcc-built stand-ins: a libcuda whose cuInit dlopens libnvidia-ptxjitcompiler.so.1 by soname,
as the driver's does (rigup-burnin's own Device runs it); the ld.so.cache cases in a private mount namespace
where a cache built by ldconfig -C from a fake ld.so.conf is bound over /etc/ld.so.cache."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from roles.burnin.shipped import acceptance
from tests.unit.test_burnin_cublas import NOBODY, alone_scratch, staff_dir
from tests.unit.test_burnin_libraries import SKIPPED, built, in_namespace

VERSION = "580.95.05"
PTXJIT = "libnvidia-ptxjitcompiler.so.1"


@pytest.fixture
def tree():
    if os.geteuid() != 0 or not shutil.which("gcc") or not shutil.which("ldconfig"):
        pytest.skip("needs root (a directory of another user's), gcc and ldconfig")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (a private mount namespace)")
    with alone_scratch() as base:
        yield base


def libcuda(driver: Path) -> Path:
    """The driver's libcuda stand-in at ``driver``/libcuda.so.VERSION (linked as libcuda.so.1, its soname):
    every entry point rigup-burnin's Device binds, cuInit dlopening PTXJIT by soname as the driver's JIT
    does and answering 100 (no device) when that dlopen found it, 999 when not."""
    names = sorted(set(re.findall(r'"(cu[A-Z]\w*)"', inspect.getsource(acceptance.Device))) - {"cuInit"})
    src = driver / "cuda.c"
    src.write_text("#include <dlfcn.h>\n" + "".join(f"int {n}(void) {{ return 0; }}\n" for n in names)
                   + f'int cuInit(unsigned f) {{ return dlopen("{PTXJIT}", RTLD_NOW) ? 100 : 999; }}\n')
    out = driver / f"libcuda.so.{VERSION}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(src), "-ldl"],
                   check=True)
    src.unlink()
    (driver / "libcuda.so.1").symlink_to(out.name)
    return out


def ptxjit(where: Path, mark: Path, owner: int = 0) -> Path:
    """A PTX JIT stand-in (soname PTXJIT) whose constructor appends its path to ``mark``."""
    out = built(where, mark=mark, soname=PTXJIT)
    os.chown(out, owner, owner)
    return out


def cache_of(tree: Path, *dirs: Path) -> Path:
    """An ld.so.cache listing ``dirs`` (a fake ld.so.conf, as Debian's lists /usr/local/lib first)."""
    (tree / "ld.so.conf").write_text("".join(f"{d}\n" for d in dirs))
    cache = tree / "ld.so.cache"
    subprocess.run(["ldconfig", "-X", "-C", str(cache), "-f", str(tree / "ld.so.conf")], check=True)
    return cache


def device(driver: Path) -> str:
    """rigup-burnin's Device over the stand-in: its answer (cuInit's code, or the refusal), then the
    files of the PTX JIT this process maps."""
    return (f"A.DRIVER_DIRS = ({str(driver)!r},)\n"
            "try: A.Device('00000000:01:00.0')\n"
            "except A.CudaError as e: print(e.code)\n"
            "except OSError as e: print(e)\n"
            "print(sorted({l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if 'ptxjit' in l}))")


def test_the_jit_beside_libcuda_is_loaded_by_its_checked_path_where_the_search_finds_none(tree):
    """The driver's directory holds libcuda and its PTX JIT (a link to its versioned file, as the driver
    links it); ld.so.cache lists neither (Debian's nvidia/current). A plain load of libcuda: its cuInit's
    dlopen by soname finds no JIT. rigup-burnin's Device loads the JIT by its checked path first: the
    dlopen finds it loaded, and the one mapped is that file."""
    ran = tree / "ran"
    driver = tree / "driver"
    driver.mkdir()
    cuda = libcuda(driver)
    jit = ptxjit(driver / f"libnvidia-ptxjitcompiler.so.{VERSION}", ran)
    (driver / PTXJIT).symlink_to(jit.name)
    cache = cache_of(tree)
    plain = in_namespace(f"print(ctypes.CDLL({str(cuda)!r}).cuInit(0))", cache)
    print(f"a plain load: cuInit {plain.stdout.strip()}\n{plain.stderr}")
    assert plain.stdout.strip() == "999", plain.stderr
    r = in_namespace(device(driver), cache)
    print(f"rigup-burnin: {r.stdout}{r.stderr}")
    assert r.stdout.splitlines() == ["100", str([str(jit)])], r.stderr
    assert ran.read_text().split() == [str(jit)]
    pinned, why = acceptance.runtime(str(cuda), acceptance.runtime_names(str(cuda)))
    assert (pinned, why) == ((str(jit),), None)
    assert f"libnvidia-gpucomp.so.{VERSION}" in acceptance.runtime_names(str(cuda))


def test_a_jit_another_user_planted_where_ld_so_cache_looks_refuses_libcuda_and_runs_nothing(tree):
    """Round 10/11 BU1 as it ran: no JIT beside libcuda, and a staff user's libnvidia-ptxjitcompiler.so.1
    in a 2775 root:staff directory ld.so.conf lists (Debian's /usr/local/lib). The hole first: a plain
    load's cuInit runs its constructor as root. rigup-burnin refuses libcuda, naming the file, before
    loading anything (its Device raises the refusal: the card's error, as every refusal of libcuda);
    the JIT beside libcuda, loaded by its path, takes the soname first and the planted one never runs."""
    ran = tree / "ran"
    staff = staff_dir(tree / "usr-local-lib")
    evil = ptxjit(staff / PTXJIT, ran, owner=NOBODY)
    driver = tree / "driver"
    driver.mkdir()
    cuda = libcuda(driver)
    cache = cache_of(tree, staff)
    plain = in_namespace(f"print(ctypes.CDLL({str(cuda)!r}).cuInit(0))", cache)
    print(f"a plain load: cuInit {plain.stdout.strip()}, constructors run: {ran.read_text().split()}")
    assert plain.stdout.strip() == "100" and ran.read_text().split() == [str(evil)], plain.stderr
    ran.unlink()
    r = in_namespace(device(driver), cache)
    print(f"rigup-burnin: {r.stdout}{r.stderr}")
    assert r.stdout.splitlines() == [
        f"not loaded: {cuda} loads {PTXJIT}, which the loader finds at {evil}: {staff} is 2775: writable by its "
        f"group or others {SKIPPED}", "[]"], r.stderr
    assert not ran.exists()
    jit = ptxjit(driver / f"libnvidia-ptxjitcompiler.so.{VERSION}", ran)
    (driver / PTXJIT).symlink_to(jit.name)
    r = in_namespace(device(driver), cache)
    print(f"the JIT beside libcuda: {r.stdout}{r.stderr}")
    assert r.stdout.splitlines() == ["100", str([str(jit)])], r.stderr
    assert ran.read_text().split() == [str(jit)]


def test_a_jit_beside_libcuda_linking_to_another_users_file_refuses_libcuda(tree, monkeypatch):
    """The driver's directory is root's, but its libnvidia-ptxjitcompiler.so.1 links to a file another
    user owns: libcuda is refused, the link named, nothing loaded."""
    driver = tree / "driver"
    driver.mkdir()
    cuda = libcuda(driver)
    other = tree / "other"
    other.mkdir()
    theirs = ptxjit(other / "libjit.so", tree / "ran", owner=NOBODY)
    (driver / PTXJIT).symlink_to(theirs)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(acceptance, "DRIVER_DIRS", (str(driver),))
    acceptance.libcuda.cache_clear()
    try:
        got = acceptance.libcuda()
    finally:
        acceptance.libcuda.cache_clear()
    print(got)
    assert got == (None, f"not loaded: {cuda} loads {PTXJIT} (beside it): {theirs} is owned by uid {NOBODY} {SKIPPED}")
    assert not (tree / "ran").exists()


def cublas_pair(tree: Path) -> tuple[Path, Path, Path, str]:
    """cuBLAS and its libcublasLt (of soname 13) in a directory of root's, and rigup-burnin's look for them:
    (cuBLAS, cuBLASLt, the code printing what find_cublas found)."""
    good = tree / "cuda"
    good.mkdir()
    return built(good / "libcublas.so.13"), built(good / "libcublasLt.so.13"), \
        f"A.CUBLAS_DIRS = ({str(good)!r},); print(A.find_cublas()[1])"


def skipped(cublas: Path, lt: Path, name: str, planted: Path) -> list[str]:
    """rigup-burnin's line for a cuBLAS whose cuBLASLt loads ``name``, found in ``planted``'s 2775 directory."""
    return [f"rigup-burnin: cuBLAS {cublas} skipped: {lt} loads {name}, which the loader finds at {planted}: "
            f"{planted.parent} is 2775: writable by its group or others {SKIPPED}"]


def test_a_cublas_whose_nvrtc_the_cache_finds_in_a_staff_directory_is_skipped(tree):
    """cuBLASLt may dlopen NVRTC (libnvrtc.so.<its major>) by soname: one another user put where
    ld.so.cache looks skips that cuBLAS, named; the same file root's alone is no reason."""
    staff = staff_dir(tree / "usr-local-lib")
    nvrtc = built(staff / "libnvrtc.so.13", soname="libnvrtc.so.13")
    os.chown(nvrtc, NOBODY, NOBODY)
    cublas, lt, code = cublas_pair(tree)
    cache = cache_of(tree, staff)
    r = in_namespace(code, cache)
    print(f"rigup-burnin: {r.stdout}{r.stderr}")
    assert r.stderr.splitlines() == skipped(cublas, lt, "libnvrtc.so.13", nvrtc)
    staff.chmod(0o755)
    os.chown(staff, 0, 0)
    os.chown(nvrtc, 0, 0)
    r = in_namespace(code, cache)
    assert r.stdout.strip() == str(cublas) and r.stderr == "", r.stderr


def test_the_backstop_names_a_mapped_library_another_user_writes_and_nothing_on_a_clean_process(tree):
    """After a run, /proc/self/maps: a library no check named (here loaded by hand from a 2775 directory)
    is the worker's error, named; a process that mapped only root's libraries has none."""
    staff = staff_dir(tree / "staff")
    lib = built(staff / "libstray.so")
    code = ("print(A.mapped_refused()); ctypes.CDLL({!r}); fig = {{'error': 'CUDA error 100'}}; A.backstop(fig); "
            "print(A.mapped_refused()); print(fig['error'])").format(str(lib))
    r = in_namespace(code, cache_of(tree))
    print(r.stdout, r.stderr)
    why = f"{lib}: {staff} is 2775: writable by its group or others"
    assert r.stdout.splitlines() == [
        "[]", str([why]), f"CUDA error 100; mapped where another user writes (root ran its code): {why}"], r.stderr


def test_the_backstop_judges_every_executable_mapping_whatever_its_name_and_a_deleted_one_by_its_inode(tree):
    """Round 13 BU3: the backstop judged only paths ending in .so[.N]: another user's library named evil.bin
    (or libx.so.1a), or one removed once loaded, was not named. Now every executable file mapping is judged,
    a deleted one by the mapped inode (/proc/self/map_files): root's own and written by no one else, or named."""
    staff = staff_dir(tree / "staff")
    odd = built(staff / "evil.bin")
    gone = built(staff / "libgone.so")
    os.chown(gone, NOBODY, NOBODY)
    code = (f"ctypes.CDLL({str(odd)!r}); ctypes.CDLL({str(gone)!r}); os.unlink({str(gone)!r}); "
            "print(A.mapped_refused())")
    r = in_namespace(code, cache_of(tree))
    print(r.stdout, r.stderr)
    out = r.stdout.strip()
    assert f"{odd}: {staff} is 2775" in out and f"{gone} (deleted): a deleted file of uid {NOBODY}" in out, r.stderr


# -- round 13 BU2: libnvrtc dlopens its builtins, libnvrtc-builtins.so.MAJOR.MINOR, by soname -----------------

BUILTINS = "libnvrtc-builtins.so.13.0"


def nvrtc(where: Path) -> Path:
    """NVRTC's stand-in as the toolkit installs it: libnvrtc.so.13.0.48 (soname libnvrtc.so.13, and that link
    beside it), whose constructor dlopens BUILTINS by soname, as libnvrtc does while it compiles."""
    src = where / "nvrtc.c"
    src.write_text('#include <dlfcn.h>\n__attribute__((constructor)) static void compiles(void) '
                   f'{{ dlopen("{BUILTINS}", RTLD_NOW | RTLD_GLOBAL); }}\n')
    real = where / "libnvrtc.so.13.0.48"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvrtc.so.13", "-o", str(real), str(src), "-ldl"],
                   check=True)
    src.unlink()
    (where / "libnvrtc.so.13").symlink_to(real.name)
    return where / "libnvrtc.so.13"


def test_bu2_nvrtcs_builtins_another_user_planted_refuse_that_cublas_and_those_beside_libnvrtc_are_loaded_by_path(tree):
    """Round 13 BU2: NVRTC's builtins were no name rigup-burnin checked. Root's libnvrtc (ld.so.cache finds
    it, a 0755 directory) dlopens libnvrtc-builtins.so.13.0 by soname, which the cache finds in a 2775 staff
    directory, nobody's file. The hole first: loading libnvrtc runs the planted constructor. rigup-burnin
    works the name out from libnvrtc's real file (libnvrtc.so.13.0.48), skips that cuBLAS naming the file,
    and runs nothing; with root's builtins beside libnvrtc, they are loaded by their path before cuBLASLt,
    and libnvrtc's dlopen by soname finds them loaded: the planted one never runs."""
    ran = tree / "ran"
    staff = staff_dir(tree / "usr-local-lib")
    evil = built(staff / BUILTINS, mark=ran, soname=BUILTINS)
    os.chown(evil, NOBODY, NOBODY)
    home = tree / "nvrtc"
    home.mkdir()
    link = nvrtc(home)
    cublas, lt, find = cublas_pair(tree)
    cache = cache_of(tree, staff, home)
    plain = in_namespace(f"ctypes.CDLL({str(link)!r})", cache)
    print(f"a plain load of libnvrtc: constructors run {ran.read_text().split()} {plain.stderr}")
    assert ran.read_text().split() == [str(evil)], plain.stderr
    ran.unlink()
    r = in_namespace(find, cache)
    print(f"rigup-burnin: {r.stdout}{r.stderr}")
    assert r.stderr.splitlines() == skipped(cublas, lt, BUILTINS, evil)
    assert r.stdout.startswith("no cuBLAS") and not ran.exists()
    theirs = built(home / BUILTINS, mark=ran, soname=BUILTINS)
    # then cuBLASLt's dlopen of libnvrtc, whose own dlopen of its builtins by soname finds the ones loaded by path
    r = in_namespace(f"{find}; ctypes.CDLL({str(link)!r}); print(sorted({{l.split(None, 5)[5].strip() "
                     "for l in open('/proc/self/maps') if 'builtins' in l}))", cache)
    print(f"NVRTC's builtins beside libnvrtc: {r.stdout}{r.stderr}")
    assert r.stdout.splitlines() == [str(cublas), str([str(theirs)])] and r.stderr == "", r.stderr
    assert ran.read_text().split() == [str(theirs)]


def test_bu2_the_builtins_version_comes_from_libnvrtcs_real_file_or_what_lies_beside_a_wheels(tree, monkeypatch):
    """libnvrtc.so.13 -> libnvrtc.so.13.0.48 (the toolkit): libnvrtc-builtins.so.13.0; a wheel's file is
    libnvrtc.so.12 itself, and its builtins (libnvrtc-builtins.so.12.4) lie beside it; no libnvrtc: none."""
    home, wheel = tree / "nvrtc", tree / "wheel"
    home.mkdir()
    wheel.mkdir()
    nvrtc(home)
    built(wheel / "libnvrtc.so.12", soname="libnvrtc.so.12")
    built(wheel / "libnvrtc-builtins.so.12.4", soname="libnvrtc-builtins.so.12.4")
    (wheel / "libnvrtc-builtins.so.12.4.x").write_text("not one")   # no MAJOR.MINOR: not a name libnvrtc asks
    lt = built(tree / "libcublasLt.so.13")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{home}:{wheel}")
    acceptance.nvrtc_builtins.cache_clear()
    try:
        got = [acceptance.nvrtc_builtins(str(lt), (f"libnvrtc.so.{v}",)) for v in (13, 12, 11)]
    finally:
        acceptance.nvrtc_builtins.cache_clear()
    assert got == [((BUILTINS,), str(home)), (("libnvrtc-builtins.so.12.4",), str(wheel)), ((), "")]
