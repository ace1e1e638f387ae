"""The whole play on the lab: a converge that has nothing to do changes nothing, quickly."""

import pytest

pytestmark = pytest.mark.lab


def test_second_converge_changes_nothing(second_converge):
    totals = second_converge.totals
    assert totals["changed"] == 0, second_converge.changed_operations()
    assert totals["errors"] == 0
    print(f"\nsecond converge of the whole play: {second_converge.seconds:.1f} s")
