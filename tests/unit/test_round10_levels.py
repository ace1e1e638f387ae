"""Round 10, B3: the concurrency levels bench.py and tune.py start that many client threads for
are bounded by their forms (1..4096), refused before any host is touched."""

import pytest

from rigup.config import declared

LEVEL_KEYS = ("bench_levels", "llama_server_tune_levels")


@pytest.mark.parametrize("key", LEVEL_KEYS)
@pytest.mark.parametrize("value", [[0], [-3], [10**6], [2**31 - 1], [1, 4097]])
def test_levels_out_of_range_refused(key, value):
    why = declared()[key].form.problem(value)
    print(f"{key}={value!r}: refused: {why}")
    assert why and "out of range" in why


@pytest.mark.parametrize("key", LEVEL_KEYS)
def test_levels_in_range_taken(key):
    for value in ([1], [1, 4, 8, 16], [4096], []):
        why = declared()[key].form.problem(value)
        print(f"{key}={value!r}: {why}")
        assert why is None
