"""A balancer's backends file (/etc/rigup/balancer/NAME.json, rigup.serving.backends_file) is read
by its typed reader (roles/balancer/facts.py backends_record): one not of its form is refused by
config.problems naming the file, never a TypeError, KeyError or IndexError out of the balancer's
operation (issue 61, round 9 B1), and a key rigup never writes there (``allow``, ``route``) is not
taken."""

import json

import pytest
from hypothesis import given, strategies as st

from roles.balancer.__init__ import wanted_backends
from roles.balancer.config import problems
from roles.balancer.facts import BalancerState, backends_record

GOOD = {"bind": "127.0.0.1", "port": 8080, "servers": [["x-0", "127.0.0.1", 8081]]}


def read(text: str) -> list[str]:
    return problems(wanted_backends(BalancerState().process([f"backend=llama-x {text}"]), []))


@pytest.mark.parametrize("doc, why", [
    ([1, 2], "not a map"),
    ({"bind": "127.0.0.1", "port": 8080}, "are not bind, port, servers"),
    ({**GOOD, "servers": [["h1"]]}, "is not [unit, address, port]"),
    ({**GOOD, "servers": "x"}, "servers is not a list"),
    ({**GOOD, "servers": [["h1", "127.0.0.1", "8081"]]}, "is not [unit, address, port]"),
    ({**GOOD, "servers": [["h1", "127.0.0.1", 8081, True]]}, "is not [unit, address, port]"),
    ({**GOOD, "port": True}, "not an address and a port"),
    ({**GOOD, "port": 0}, "not an address and a port"),
    ({**GOOD, "bind": None}, "not an address and a port"),
    ({**GOOD, "slots": 2.5}, "slots 2.5 is not a count"),
    ({**GOOD, "allow": ["slots"]}, "are not bind, port, servers"),
    ({**GOOD, "route": {"of": "x", "model": "m"}}, "are not bind, port, servers"),
])
def test_a_backends_file_not_of_its_form_is_refused_naming_it(doc, why):
    found = read(json.dumps(doc))
    print(f"\n{json.dumps(doc)[:90]} -> {found}")
    assert len(found) == 1 and found[0].startswith("/etc/rigup/balancer/llama-x.json: ") and why in found[0]


def test_a_backends_file_as_rigup_writes_it_is_read():
    limited = {**GOOD, "slots": 4, "queue": 8, "wait_s": 30}
    state = BalancerState().process([f"backend=llama-x {json.dumps(limited)}"])
    print(f"\n{state['backends']}")
    assert state["backends"] == {"llama-x": limited} and read(json.dumps(limited)) == []


def test_a_file_name_reaches_the_operator_escaped():
    state = BalancerState().process(['backend=x\x1b]0;t\x07 [1]'])
    (entry,) = state["backends"].values()
    print(f"\n{entry}")
    assert "\x1b" not in entry["refused"] and "\\x1b" in entry["refused"]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2, 70000) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["bind", "port", "servers", "slots", "queue", "wait_s", "x"]),
                                      inner, max_size=6), max_leaves=20)


@given(JSON)
def test_any_json_is_a_backend_of_the_form_or_one_refusal(doc):
    found = read(json.dumps(doc))
    if found and found[0].startswith("/etc/rigup/balancer/llama-x.json: "):
        assert len(found) == 1
    else:   # read: of the form, and only HAProxy's own checks of names and addresses remain
        record = backends_record(doc, "x")
        assert set(record) <= {"bind", "port", "servers", "slots", "queue", "wait_s"}
        assert all(len(s) == 3 and type(s[2]) is int for s in record["servers"])
