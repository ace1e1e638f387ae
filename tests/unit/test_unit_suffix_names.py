"""A name that becomes a unit name never ends in a systemd unit type (issue 61, round 4 C40): a model
called m.timer had its download job run as ``systemd-run --unit=rigup-fetch-m.timer``, which systemd
takes as a timer (it keeps a name's own suffix, as cd885b3 found for the drain lease), so the job never
started, naming no key. One validator (rigup.boundary.fields.NAME) refuses every such name, for models,
instances and users alike."""

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary import fields
from rigup.boundary.core import Unreadable
from roles.model_fetch.facts import unit_name
from tests.unit.hosts import REV, answered, data, host, refusals


@pytest.mark.parametrize("suffix", fields.UNIT_TYPES)
def test_C40_a_model_named_with_a_unit_suffix_is_refused_naming_its_key(suffix):
    plan, facts = host("a100")
    d = data(models={f"m.{suffix}": {"repo": "org/m-GGUF", "revision": REV, "size_gib": 4.0}})
    lines = [r.line("h") for r in refusals(plan, facts, answered(d, {}))]
    print(suffix, "->", lines[:1])
    assert any(f"models.m.{suffix}" in ln and "systemd unit type" in ln for ln in lines), lines


@settings(max_examples=300, deadline=1000)
@given(st.text(alphabet="abcm._-019", min_size=1, max_size=12) | st.sampled_from(
    [f"{a}.{t}" for a in ("m", "m.x", "9") for t in fields.UNIT_TYPES] + ["m.timers", "m.Timer", "timer", "m-timer"]))
def test_a_name_the_validator_takes_makes_units_of_the_type_rigup_names(name):
    try:
        fields.name(name, "n")
    except Unreadable:
        assert not fields.NAME.fullmatch(name)
        return
    for unit in (unit_name(name), f"rigup-llama@{name}", f"rigup-vllm@{name}"):
        assert unit.rsplit(".", 1)[-1] not in fields.UNIT_TYPES or "." not in unit, unit
