"""Round 9 of issue 61 on rigup-burnin (roles/burnin/shipped/acceptance.py).

H3: nvidia-smi's cells were read with int() and float(): "٣" was 3, "1_0" 10, "0350" 350 and "1.0e999"
inf (a card's memory.total inf: its time bound inf, burnin.json's Infinity). _num is now
rigup.boundary.numbers's rule by hand (the program ships alone), held to it here.

LH1: searched() walked the files of an LD_LIBRARY_PATH directory but none of its subdirectories, which
the loader searches first (glibc-hwcaps/x86-64-v2/, the legacy tls/, haswell/, x86_64/...): another
user's glibc-hwcaps/x86-64-v2/libdemo.so in root's directory ran as root. Every directory under a
searched one is walked now."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rigup.boundary.numbers import number
from roles.burnin.shipped import acceptance
from tests.unit.test_burnin_cublas import NOBODY, alone_scratch
from tests.unit.test_burnin_round8 import planted

BLANK = " \t\r\n\f\v"
HOSTILE = ["\u0663", "1_0", "0350", "+5", "1.0e999", "-1.0e999", "0x7fffffffffffffffffff", " 3\x85", "350\xa0",
           "\u2003350", "350\u2028", "nan", "inf", "True", "0x20C210DE", "0x0000000000000004", "81559", "-1", "350.5",
           "9" * 19, "[N/A]", "", "0X1F", "0x", "0x_1"]
TEXT = st.one_of(st.text(st.sampled_from(list("0123456789abcdefxX+-._ \t\r\n\x0b\x0c\x85\xa0\u2003\u2028\u0663\u00b2")),
                         max_size=22), st.text(max_size=8), st.sampled_from(HOSTILE))


def test_h3_a_cell_that_is_no_number_of_the_boundarys_is_none():
    """H3: each of the round's cells, and what _num reads now (None where int()/float() read a number)."""
    for text in ["\u0663", "1_0", "0350", "1.0e999", "-1.0e999", "0x7fffffffffffffffffff", " 3\x85", "350\xa0"]:
        print(f"_num({text!r}) -> {acceptance._num(text)!r} (numbers.number: {number(text, float)!r})")
        assert acceptance._num(text) is None
    assert [acceptance._num(t) for t in ("81559", "350.5", "+5", "-1", "0x20C210DE", "0x0000000000000004")] == \
        [81559, 350.5, 5, -1, 0x20C210DE, 4]
    # a name's cell is its text; a number's cell that is no number is None, never the text (the time bound's input)
    assert acceptance._cell("name", " NVIDIA H100 ") == "NVIDIA H100" and acceptance._cell("uuid", "[N/A]") is None
    assert acceptance._cell("memory.total", "1.0e999") is None and acceptance._cell("driver_version", "580.105.08") == \
        "580.105.08"
    assert acceptance.expected_mib("GPU-a=81559") == {"GPU-a": 81559}
    assert [acceptance.expected_mib(f"GPU-a={m}") for m in ("\u0663", "0350", "+5", "1_0", "")] == [None] * 5


@settings(max_examples=400, deadline=None)
@given(text=TEXT)
def test_h3_num_is_the_boundarys_number_or_a_hex_word(text):
    """_num is numbers.number on any text (the same number, int where no point), but for nvidia-smi's hex
    words (0x and 1-16 hex digits), which the boundary has no form for."""
    got = acceptance._num(text)
    bare = text.strip(BLANK)
    if acceptance.HEX_WORD.fullmatch(bare):
        assert got == int(bare, 16)
    else:
        want = number(text, float)
        assert got == want and (got is None or type(got) is (float if "." in bare else int)), (text, got, want)


# ---------------------------------------------------------------- LH1: every directory under a searched one
def tree_of(base, layout: dict) -> None:
    """``layout``: {relative path: kind}: "dir" root's 755, "theirs" nobody's 755 directory, "0777" root's
    0777 directory, "file" root's 644, "their file" nobody's 644, "link theirs" a link to a directory of nobody's."""
    for rel, kind in sorted(layout.items()):
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if kind in ("dir", "theirs", "0777"):
            p.mkdir(exist_ok=True)
            os.chown(p, NOBODY if kind == "theirs" else 0, NOBODY if kind == "theirs" else 0)
            p.chmod(0o777 if kind == "0777" else 0o755)
        elif kind in ("file", "their file"):
            p.write_text("")
            os.chown(p, NOBODY if kind == "their file" else 0, 0)
        else:
            target = base.parent / f"theirs-{base.name}"
            target.mkdir(exist_ok=True)
            os.chown(target, NOBODY, NOBODY)
            p.symlink_to(target)


LOADER_DIRS = ["glibc-hwcaps", "glibc-hwcaps/x86-64-v2", "glibc-hwcaps/x86-64-v3", "tls", "tls/haswell", "haswell",
               "x86_64", "avx512_1", "tls/x86_64/haswell", "any"]


@pytest.mark.parametrize("kind", ["theirs", "0777", "link theirs"])
@pytest.mark.parametrize("sub", ["glibc-hwcaps/x86-64-v2", "tls/haswell", "x86_64", "avx512_1/x", "deep/er/still"])
def test_lh1_a_directory_of_anothers_anywhere_under_a_searched_one_refuses_it(kind, sub):
    if os.geteuid() != 0:
        pytest.skip("another user's directory needs root")
    with alone_scratch() as scratch:
        lib = scratch / "lib"
        lib.mkdir()
        tree_of(lib, {"libok.so": "file", "glibc-hwcaps/x86-64-v3": "dir", sub: kind})
        kept, out = acceptance.library_path(str(lib))
        print(f"{sub} ({kind}) -> kept {kept}, left out {out}")
        assert kept == [] and out and out[0].startswith(f"{str(lib)!r} left out: its ")


def test_lh1_roots_nested_directories_pass():
    if os.geteuid() != 0:
        pytest.skip("root's files in a scratch of root's")
    with alone_scratch() as scratch:
        lib = scratch / "lib"
        lib.mkdir()
        tree_of(lib, {**{d: "dir" for d in LOADER_DIRS}, "glibc-hwcaps/x86-64-v2/libdemo.so": "file"})
        (lib / "tls" / "up").symlink_to(lib)   # a link back up is walked once
        assert acceptance.library_path(str(lib)) == ([str(lib)], [])


def test_lh1_the_loader_maps_nobodys_hwcaps_library_and_rigup_burnin_leaves_the_directory_out():
    """The round's reproduction: root's lib/ holding nobody's glibc-hwcaps/x86-64-v2/libdemo.so. The loader
    maps it through LD_LIBRARY_PATH=lib (the hole, shown where this CPU has x86-64-v2); library_path keeps
    nothing, so the restarted program's loader never searches it."""
    if os.geteuid() != 0 or not shutil.which("gcc"):
        pytest.skip("needs root (another user's directory) and gcc")
    with alone_scratch() as scratch:
        lib, ran = scratch / "lib", scratch / "ran"
        lib.mkdir()
        theirs = lib / "glibc-hwcaps" / "x86-64-v2"
        theirs.mkdir(parents=True)
        os.chown(theirs, NOBODY, NOBODY)
        planted(theirs / "libdemo.so", ran)
        load = [sys.executable, "-sES", "-c", "import ctypes; ctypes.CDLL('libdemo.so')"]
        subprocess.run(load, env={"LD_LIBRARY_PATH": str(lib)}, capture_output=True, timeout=60)
        hole = ran.exists()
        kept, out = acceptance.library_path(str(lib))
        if hole:
            ran.unlink()
        r = subprocess.run(load, env={"LD_LIBRARY_PATH": ":".join(kept)}, capture_output=True, text=True, timeout=60)
        print(f"unchecked: nobody's constructor ran as root: {hole}; library_path -> kept {kept}, left out {out}; "
              f"with the kept path: {r.stderr.strip()[-80:]}")
        assert kept == [] and f"{theirs} is owned by uid {NOBODY}" in out[0] and not ran.exists()


NODE = st.sampled_from(["dir", "theirs", "0777", "file", "their file", "link theirs"])


@pytest.fixture(scope="module")
def scratch9():
    if os.geteuid() != 0:
        pytest.skip("another user's files need root")
    with alone_scratch() as base:
        yield base


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.dictionaries(st.sampled_from(LOADER_DIRS + ["a.so", "tls/b.so", "glibc-hwcaps/x86-64-v2/c.so"]),
                              NODE, max_size=5))
def test_lh1_searched_passes_exactly_where_nothing_under_it_is_anothers(scratch9, layout):
    """A tree of any of these entries, at any depth the loader searches, is passed exactly where none of
    them (nor a directory made above one) is another user's or writable by others."""
    d = scratch9 / f"t{len(list(scratch9.iterdir()))}"
    d.mkdir()
    # a path under a file or a link cannot be made: keep the entries whose parents are directories of the layout
    layout = {rel: kind for rel, kind in layout.items()
              if all(layout.get(str(p), "dir") in ("dir", "theirs", "0777")
                     for p in [type(d)(rel).parents[i] for i in range(len(type(d)(rel).parents) - 1)])}
    tree_of(d, layout)
    real, why = acceptance.searched(str(d))
    bad = [rel for rel, kind in layout.items() if kind != "dir" and kind != "file"]
    assert (why is None) == (not bad), (layout, why)
