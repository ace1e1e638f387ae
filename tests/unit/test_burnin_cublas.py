"""rigup-burnin loads the host's cuBLAS (ctypes) as root: only a library that it and every directory
up to / are root's alone, links walked the same way (round 7's R5: another user's libcublas.so.13
in Debian's 2775 root:staff /usr/local/lib ran its constructor as uid 0)."""

import glob
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from roles.burnin.shipped import acceptance

NOBODY = 65534
# a real shared object (the loader reads each one's needs before rigup-burnin loads it): the system's libm
ELF = next(iter(sorted(glob.glob("/usr/lib/*-linux-gnu/libm.so.6") + glob.glob("/lib64/libm.so.6"))), None)


@contextmanager
def alone_scratch():
    """A scratch directory where rigup-burnin would load a library: in the home directory (/tmp is
    1777), skipped where that is not this user's or root's alone; removed after."""
    base = Path(tempfile.mkdtemp(prefix=".rigup-test-cublas-", dir=Path.home()))
    try:
        (base / "probe").write_text("")
        why = acceptance.alone(str(base / "probe"))[1]
        if why:
            pytest.skip(f"the home directory is not this user's or root's alone: {why}")
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture
def tree():
    """A scratch tree in a directory only root writes."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    with alone_scratch() as base:
        yield base


def staff_dir(path: Path) -> Path:
    """A directory as Debian's /usr/local/lib: root's, 2775, its group another user's."""
    path.mkdir()
    os.chown(path, 0, NOBODY)
    path.chmod(0o2775)
    return path


def library(path: Path, owner: int = 0, mode: int = 0o644) -> Path:
    path.write_bytes(Path(ELF).read_bytes() if ELF else b"\x7fELF stand-in")
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def test_a_planted_library_is_skipped_and_named_once_and_roots_is_loaded(tree, monkeypatch, capsys):
    staff = staff_dir(tree / "usr-local-lib")
    planted = library(staff / "libcublas.so.13", owner=NOBODY)        # the newest soname: tried first
    root = tree / "cuda" / "lib64"
    root.mkdir(parents=True)
    real = library(root / "libcublas.so.12.8.4.1")
    (root / "libcublas.so.12").symlink_to("libcublas.so.12.8.4.1")   # the toolkit's own link: root's
    lt = library(root / "libcublasLt.so.12")
    # a root link into another user's directory, and another user's link to root's file
    other = tree / "other"
    other.mkdir()
    library(staff / "libcublas.so.11.real", owner=NOBODY)
    (other / "libcublas.so.11").symlink_to(staff / "libcublas.so.11.real")
    (staff / "libcublas.so.12").symlink_to(real)
    writable = tree / "writable"
    writable.mkdir()
    library(writable / "libcublas.so.11", mode=0o664)                  # root's, group-writable
    monkeypatch.setattr(acceptance, "CUBLAS_DIRS", (str(staff), str(root), str(other), str(writable)))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    loaded = []

    class Lib:
        cublasCreate_v2 = object()

    def cdll(path, mode=0):
        loaded.append(path)
        return Lib()

    monkeypatch.setattr(acceptance.ctypes, "CDLL", cdll)
    acceptance.cublas_libraries.cache_clear()
    try:
        lib, path = acceptance.find_cublas()
        assert isinstance(lib, Lib) and path == str(real)
        assert loaded == [str(lt), str(real)]             # its libcublasLt first, then it, by real path: not the planted one
        acceptance.find_cublas()                          # a second worker: nothing named again
    finally:
        acceptance.cublas_libraries.cache_clear()
    err = capsys.readouterr().err.splitlines()
    print("\n".join(err))
    assert err == [
        f"rigup-burnin: cuBLAS {planted} skipped: {staff} is 2775: writable by its group or others "
        "(root loads no library another user can replace)",
        f"rigup-burnin: cuBLAS {staff / 'libcublas.so.12'} skipped: {staff} is 2775: writable by its group or others "
        "(root loads no library another user can replace)",
        f"rigup-burnin: cuBLAS {other / 'libcublas.so.11'} skipped: {staff} is 2775: writable by its group or others "
        "(root loads no library another user can replace)",
        f"rigup-burnin: cuBLAS {writable / 'libcublas.so.11'} skipped: {writable / 'libcublas.so.11'} is 664: writable "
        "by its group or others (root loads no library another user can replace)"]
    assert str(planted) not in loaded


def test_the_walk_checks_owners_modes_and_each_link_hop(tree):
    root = tree / "lib"
    root.mkdir()
    real = library(root / "libx.so")
    assert acceptance.alone(str(real)) == (str(real), None)
    (root / "rel").symlink_to("../lib/./libx.so")
    assert acceptance.alone(str(root / "rel")) == (str(real), None)
    library(root / "theirs.so", owner=NOBODY)
    assert acceptance.alone(str(root / "theirs.so"))[1] == f"{root / 'theirs.so'} is owned by uid {NOBODY}"
    sticky = tree / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)                              # /tmp's: strict, no sticky exception
    (sticky / "link").symlink_to(real)
    assert acceptance.alone(str(sticky / "link"))[1] == f"{sticky} is 1777: writable by its group or others"
    (root / "loop").symlink_to("loop")
    assert acceptance.alone(str(root / "loop"))[1].endswith("more than 40 links")
    assert acceptance.alone(str(root / "missing"))[1] == f"{root / 'missing'}: No such file or directory"
    assert acceptance.alone(str(root))[1] == f"{root} is not a file"
    assert acceptance.alone(str(real) + "/x")[1] == f"{real} is not a directory"


def test_no_cublas_where_only_root_writes_says_so(tree, monkeypatch):
    staff = staff_dir(tree / "usr-local-lib")
    library(staff / "libcublas.so.12", owner=NOBODY)
    monkeypatch.setattr(acceptance, "CUBLAS_DIRS", (str(staff),))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"relative:{staff}")
    acceptance.cublas_libraries.cache_clear()
    try:
        found, skipped = acceptance.cublas_candidates()
        assert found == [] and len(skipped) == 1     # LD_LIBRARY_PATH's and CUBLAS_DIRS' same file: named once
        assert acceptance.find_cublas() == (None, "no cuBLAS: libcublas.so.13/libcublas.so.12/libcublas.so.11 "
                                                  "not found where only root writes")
    finally:
        acceptance.cublas_libraries.cache_clear()
