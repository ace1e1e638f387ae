"""The llama.cpp build's smoke (roles/llama_cpp/smoke.py, run as root) picks the served model only
from a marker whose size is a JSON int, as the boundary's marker reader takes it (issue 61, round 4's
note on F1's class): ``"1_000"``, ``true``, ``1.5`` and nesting past Python's stack (which raised
RecursionError out of the smoke) give the tiny model instead."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from roles.llama_cpp import smoke

SPEC = {"tiny": "/opt/tiny.gguf", "max_model_bytes": 1 << 40}


def model_for(tmp_path, text: str) -> str:
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
