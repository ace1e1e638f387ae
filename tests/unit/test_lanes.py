"""tests/lanes.py: make test's two lanes hold every lab module once, in a known order."""

from tests import lanes


def test_every_lab_module_runs_in_exactly_one_lane():
    modules = lanes.lab_modules()
    zero, one = lanes.lanes(modules)
    assert sorted(zero + one) == sorted(modules) and not set(zero) & set(one)
    assert one == list(lanes.LANE_1)
    assert zero[:len(lanes.EARLY)] == list(lanes.EARLY)   # what builds nothing goes first
    assert "tests/roles/test_deploy.py" in zero and "tests/test_lab.py" in modules


def test_a_module_named_that_is_not_there_is_an_error():
    import pytest

    with pytest.raises(SystemExit, match="test_roll.py"):
        lanes.lanes([m for m in lanes.lab_modules() if m != "tests/roles/test_roll.py"])
