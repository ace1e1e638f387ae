"""What a host prints for its serving instances and model downloads (rigup/units.py parse_instances,
roles/model_fetch/facts.py parse_probe and parse_progress): whatever the lines hold, each reader
answers (a marker an object or None, a model's state under a text name) and never raises, since
one host's exception in a fact's process() or a deploy file's load ends the run for every host
(issue 61, round 1 E11 and E13)."""

import json

from hypothesis import given, settings, strategies as st

from rigup.units import parse_instances
from roles.model_fetch.facts import parse_probe, parse_progress

SPEC = [{"name": "m", "dest": "/srv/models/m", "repo": "o/m", "revision": "0" * 40}]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=8)
LINE = st.one_of(st.text(max_size=40), JSON.map(lambda v: "marker=" + json.dumps(v)),
                 JSON.map(lambda v: "progress=" + json.dumps(v)), JSON.map(lambda v: "marker.x=" + json.dumps(v)),
                 JSON.map(lambda v: "##rigup-model " + json.dumps(v)), st.just("@@ m"))


def test_a_marker_nested_a_million_deep_is_no_marker():
    """E11: the marker's directory is the host's to write; 1,000,000 ``[`` (the progress command
    reads up to 1 MiB) raised RecursionError out of parse_instances, ending status.py."""
    deep = "[" * 1000000
    states = parse_progress(["@@ m", "marker=" + deep, "progress=" + deep], SPEC)
    assert states["m"]["complete"] is False
    _, found = parse_instances(["@@ u", "marker=" + deep, "marker.x=" + deep, "marker.y=[1]"])
    assert found["u"]["marker"] is None and found["u"]["markers"] == {"x": None, "y": None}


def test_a_probe_line_whose_name_is_not_text_is_no_model():
    """E13: a name that is a list raised TypeError (unhashable) out of the fact's process()."""
    assert parse_probe(['##rigup-model {"name": ["a"], "progress": null}'])["models"] == {}
    assert parse_probe(['##rigup-model {"name": 7}', '##rigup-model ' + "[" * 100000])["models"] == {}
    assert list(parse_probe(['##rigup-model {"name": "a", "progress": null}'])["models"]) == ["a"]


@settings(max_examples=150, deadline=2000)
@given(st.lists(LINE, max_size=8))
def test_any_lines_read_without_an_exception(lines):
    _, found = parse_instances(lines)
    for state in found.values():
        assert state.get("marker") is None or isinstance(state["marker"], dict)
        assert all(m is None or isinstance(m, dict) for m in state.get("markers", {}).values())
    parse_progress(lines, SPEC)
    assert all(isinstance(name, str) for name in parse_probe(lines)["models"])
