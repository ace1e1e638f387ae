"""tensor_split's shares are read by one rule (rigup.boundary.numbers.shares) wherever they cross: an
instance's and a router model's tensor_split (rigup/instances/llama_server.py split_problems) and a
sweep's point (rigup/boundary/results.py). llama.cpp reads each share with std::stof, which throws past a
float, and puts no layer anywhere for all zero (issue 61, re5 N24)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from rigup.boundary.numbers import shares
from rigup.instances.llama_server import split_problems

WHERE = "llama_server_instances.g.tensor_split"


def test_N24_a_share_past_a_float_or_all_zero_is_refused():
    for text in ["9" * 60 + ",1", "0,0", "1234567,1", "1,1.1234567", "1,1\n", "1.,1", "\u0661,1", ",1", "1,,1", ""]:
        got = split_problems(text, WHERE, 2)
        print(f"{text[:20]!r}: {got}")
        assert got and "expected numbers" in got[0][1]
    for text in ["16,16", "999999.999999,0", "0,1", "1, 2", "0.5"]:
        assert split_problems(text, WHERE, 2) == [], text
    assert split_problems(",".join(["1"] * 65), WHERE, None)   # more shares than any host's cards


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1e9, allow_nan=False), st.integers(0, 10**9), st.text(max_size=8)),
                min_size=1, max_size=70))
def test_any_shares_read_are_floats_llama_cpp_reads(parts):
    text = ",".join(p if isinstance(p, str) else (f"{p:.6f}" if isinstance(p, float) else str(p)) for p in parts)
    got = shares(text)
    if got is not None:
        assert len(got) == len(parts) <= 64 and all(0 <= g < 1e6 for g in got) and any(got)
        assert text.isascii() and set(text) <= set("0123456789.,")
    assert (split_problems(text, WHERE, None) == []) is (shares(text.replace(" ", "")) is not None)
