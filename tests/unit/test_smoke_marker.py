"""The llama.cpp build's smoke (roles/llama_cpp/shipped/smoke.py, run as root) picks the served model only
from a marker whose size is a JSON int, as the boundary's marker reader takes it (issue 61, round 4's
note on F1's class): ``"1_000"``, ``true``, ``1.5`` and nesting past Python's stack (which raised
RecursionError out of the smoke) give the tiny model instead; and only where the files themselves,
as they lie on disk, are within the bound (re5 N23 = re4 N45: the marker's ``bytes`` is the rigup
user's word)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from roles.llama_cpp.shipped import smoke

SPEC = {"tiny": "/opt/tiny.gguf", "max_model_bytes": 1 << 40}


def model_for(tmp_path, text: str, size: int = 1) -> str:
    """The model of a marker ``text`` beside an ``m.gguf`` of ``size`` bytes (sparse)."""
    with open(tmp_path / "m.gguf", "wb") as f:
        f.truncate(size)
    marker = tmp_path / ".rigup-complete"
    marker.write_text(text)
    return smoke.model_of({"marker": str(marker)}, SPEC)


def test_a_deep_or_untyped_size_gives_the_tiny_model(tmp_path):
    for text in ["[" * 100000, json.dumps({"files": ["m.gguf"], "bytes": "1"}),
                 json.dumps({"files": ["m.gguf"], "bytes": True}), json.dumps({"files": ["m.gguf"], "bytes": 1.5}),
                 json.dumps({"files": ["m.gguf"], "bytes": -1})]:
        got = model_for(tmp_path, text)
        print(f"{text[:50]!r}: {got}")
        assert got == SPEC["tiny"]
    assert model_for(tmp_path, json.dumps({"files": ["m.gguf"], "bytes": 1})) == str(tmp_path / "m.gguf")


@settings(max_examples=150, deadline=None)
@given(size=st.one_of(st.integers(-5, 1 << 41), st.booleans(), st.floats(allow_nan=True), st.text(max_size=5), st.none()))
def test_the_served_model_only_for_a_json_int_within_the_bound(tmp_path_factory, size):
    tmp = tmp_path_factory.mktemp("m")
    got = model_for(tmp, json.dumps({"files": ["m.gguf"], "bytes": size}))
    ok = type(size) is int and 0 <= size <= SPEC["max_model_bytes"]
    assert (got == str(tmp / "m.gguf")) is ok


def test_the_bound_is_the_files_own_size_not_the_markers_word(tmp_path):
    """N23 / N45: ``bytes`` 0 or 1 beside a file past max_model_bytes chose the served model."""
    spec = {"tiny": "/opt/tiny.gguf", "max_model_bytes": 1 << 30}
    marker = tmp_path / ".rigup-complete"

    def got(files: list[str], sizes: dict[str, int], claim: int = 0) -> str:
        for name, size in sizes.items():
            with open(tmp_path / name, "wb") as f:
                f.truncate(size)
        marker.write_text(json.dumps({"files": files, "bytes": claim}))
        return smoke.model_of({"marker": str(marker)}, spec)

    big = got(["m.gguf"], {"m.gguf": 40 << 30})
    print(f"bytes 0 beside a 40 GiB m.gguf, bound 1 GiB: {big}")
    assert big == spec["tiny"]
    assert got(["m.gguf"], {"m.gguf": 1 << 20}) == str(tmp_path / "m.gguf")
    # a set: its shards, which llama.cpp opens by name whatever the marker lists
    shards = {"s-00001-of-00002.gguf": 600 << 20, "s-00002-of-00002.gguf": 600 << 20}
    assert got(["s-00001-of-00002.gguf"], shards) == spec["tiny"]
    assert got(["s-00001-of-00001.gguf"], {"s-00001-of-00001.gguf": 1 << 20}) == str(tmp_path / "s-00001-of-00001.gguf")
    assert got(["s-00001-of-00000.gguf"], {"s-00001-of-00000.gguf": 1}) == spec["tiny"]
    assert got(["s-00001-of-00003.gguf"], {"s-00001-of-00003.gguf": 1, "s-00002-of-00003.gguf": 1}) == spec["tiny"]
    # missing, a link, a FIFO: no size to trust
    assert got(["none.gguf"], {}) == spec["tiny"]
    (tmp_path / "l.gguf").symlink_to(tmp_path / "m.gguf")
    assert got(["l.gguf"], {}) == spec["tiny"]
    import os
    os.mkfifo(tmp_path / "f.gguf")
    assert got(["f.gguf"], {}) == spec["tiny"]
    # the marker's word still counts where it says more than the file
    assert got(["m.gguf"], {"m.gguf": 1}, claim=2 << 30) == spec["tiny"]


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, 1 << 42), claim=st.integers(0, 1 << 42))
def test_the_served_model_only_where_file_and_word_are_within_the_bound(tmp_path_factory, size, claim):
    tmp = tmp_path_factory.mktemp("m")
    got = model_for(tmp, json.dumps({"files": ["m.gguf"], "bytes": claim}), size)
    assert (got == str(tmp / "m.gguf")) is (max(size, claim) <= SPEC["max_model_bytes"])
