"""Issue 61, round 9: numbers that were not numbers (class 3) and a process name that ended ss's line
(PT1). Each case prints its input and what rigup now makes of it; the Hypothesis properties hold each
reader to rigup.boundary.numbers (or rigup.boundary.core.loads) on arbitrary text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary.core import Unreadable, loads
from rigup.boundary.numbers import number
from rigup.gpu.facts import _value, parse_listening_ports
from roles.preflight.checks import port_refusals
from rigup.refusal import Port

# Unicode blanks str.strip() takes and the boundary does not; non-ASCII digits; the forms int() and float() take
HOSTILE = ["350\x85", "\u2003350", "350\u2028", "350\xa0", "\u0663\u0665\u0660", "3_5", "0350", "1e999", "nan", "inf",
           "+5", "-0", " 350\t", "350\r\n", "\x0b350\x0c", "350.5", "0x15e", "\u00b2", "", " "]
TEXT = st.one_of(st.text(st.sampled_from(list("0123456789+-.eE_x \t\r\n\x0b\x0c\x85\xa0\u2003\u2028\u0661\u00b2")),
                         max_size=16), st.text(max_size=8), st.sampled_from(HOSTILE))


def test_X1_a_cell_with_a_unicode_blank_is_no_reading():
    """X1: nvidia-smi's power.draw "350\\x85" was 350.0 (_value's str.strip() took U+0085 off)."""
    for text in ("350\x85", "\u2003350", "350\u2028", "350\xa0"):
        got = _value("float", text)
        print(f"_value('float', {text!r}) -> {got}")
        assert got is None
    assert _value("float", " 350.5 ") == 350.5 and _value("int", "\t81559\n") == 81559


@settings(max_examples=300, deadline=None)
@given(text=TEXT, kind=st.sampled_from(["int", "float"]))
def test_a_facts_cell_is_numbers_number(text, kind):
    """_value of a number is numbers.number's verdict, but for nvidia-smi's words for no value."""
    want = number(text, int if kind == "int" else float)
    assert _value(kind, text) == want


def ss_lines(name: str, uid: int) -> list[str]:
    """What ss -Hltnpe prints for ``name``'s socket on 8080 (a line break in the name printed as it is)."""
    line = (f'LISTEN 0 128 127.0.0.1:8080 0.0.0.0:* users:(("{name}",pid=4242,fd=5))'
            + (f" uid:{uid}" if uid else "") + " ino:18793851 sk:2105 cgroup:/ <->")
    return ["ss", *line.split("\n"), "--- users", "nobody:65534", "rigup:997"]


def test_PT1_a_name_ending_in_a_quote_and_a_line_break_is_not_roots():
    """PT1: nobody's listener named 'llama-server"\\n' (prctl) printed its uid on a line of its own,
    which was dropped: the socket read as root's llama-server, the instance's own port."""
    claim = Port(8080, "llama_server_instances.g", ("llama-server",))
    for name in ('llama-server"\n', 'llama-server"\n ', 'vllm"\nLISTEN x', 'a"\nino:1 x'):
        lines = ss_lines(name, 65534)
        ports = parse_listening_ports(lines)
        found = [r.line("h") for r in port_refusals([claim], {"listening_ports": ports}, "rigup")]
        print(f"{name!r}: {lines[1:-3]} -> {ports} -> {found}")
        assert ports[8080] != "llama-server" and found and ports.get(1) is None
    # a line cut short (no inode column after the process) is no one's name: never root's
    assert parse_listening_ports(["ss", 'LISTEN 0 5 127.0.0.1:8080 0.0.0.0:* users:(("llama-server"']) == {8080: None}
    assert parse_listening_ports(ss_lines("llama-server", 0)) == {8080: "llama-server"}
    assert parse_listening_ports(ss_lines("llama-server", 997)) == {8080: "llama-server (user rigup)"}


@settings(max_examples=300, deadline=None)
@given(name=st.text(st.sampled_from(list('ab"\n )(,:=LISTENuidno0-\x85\u2028')), min_size=1, max_size=15),
       uid=st.sampled_from([0, 997, 65534]))
def test_any_process_name_of_another_account_is_never_read_as_roots(name, uid):
    """Whatever a process names itself (15 characters, as the kernel keeps), a socket of uid 65534 or 997
    is read with its account, or unnamed; never a bare name (root's)."""
    ports = parse_listening_ports(ss_lines(name, uid))
    account = {997: "rigup", 65534: "nobody"}.get(uid)
    assert uid == 0 or all(got is None or got.endswith(f" (user {account})") for got in ports.values()), (name, ports)


def test_CORE1_a_number_past_a_floats_range_is_refused():
    """CORE1: '{"a": 1e400}' read {'a': inf}, which json.dumps writes back as Infinity (no JSON)."""
    for text in ('{"a": 1e400}', "[-1e400]", '{"a": 1.0e999}', "1e309"):
        with pytest.raises(Unreadable) as e:
            loads(text, "w")
        print(f"loads({text!r}) -> refused: {e.value}")
    assert loads('{"a": 1.7976931348623157e308, "b": 1e-400}', "w") == {"a": 1.7976931348623157e308, "b": 0.0}


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=8), st.sampled_from(["", "1e400", "-1e999", "NaN"]))
def test_loads_reads_a_finite_document_and_refuses_any_non_finite_number(doc, extra):
    """What json.dumps writes of a document holding only finite numbers reads back equal; one holding a
    non-finite one (Infinity, NaN, or 1e400 spelled as digits) is refused."""
    def finite(value) -> bool:
        if isinstance(value, float):
            return value == value and abs(value) != float("inf")
        if isinstance(value, list):
            return all(map(finite, value))
        return all(map(finite, value.values())) if isinstance(value, dict) else True

    text = json.dumps(doc)
    finite = finite(doc)
    if finite:
        assert loads(text, "w") == doc or text == json.dumps(loads(text, "w"))
    else:
        with pytest.raises(Unreadable):
            loads(text, "w")
    if extra:
        with pytest.raises(Unreadable):
            loads(f"[{extra}]", "w")


def preset_of(split: str) -> str:
    from roles.llama_server.command import preset_text
    inst = {"model": "a", "also": ["b"], "per_model": {"b": {"tensor_split": split}}, "tensor_split": None}
    return preset_text("r", inst, {"a": "/m/a/x.gguf", "b": "/m/b/y.gguf"})


def test_N2_a_share_list_with_a_blank_at_an_end_is_refused_at_preflight():
    """N2: a router's per_model.b.tensor_split ' 1,1' passed preflight (blanks removed before the check)
    and preset_text's ini_line raised ValueError at converge, after earlier roles ran."""
    from rigup.instances.llama_server import split_problems
    for value in (" 1,1", "1,1 ", "1,1\t", "\u00a01,1"):
        found = split_problems(value, "llama_server_instances.r.per_model.b.tensor_split", 2)
        print(f"{value!r} -> {found}")
        assert found and found[0][0].endswith("per_model.b.tensor_split")
    assert split_problems("1, 1", "w", 2) == [] and "tensor-split = 1, 1" in preset_of("1, 1")


@settings(max_examples=300, deadline=None)
@given(value=st.text(st.sampled_from(list("0123456789,. \t;#\u00a0\x85")), max_size=12))
def test_what_preflight_passes_the_preset_writes(value):
    """Every tensor_split split_problems passes is one preset_text writes (the two read one value one way)."""
    from rigup.instances.llama_server import split_problems
    if not split_problems(value, "w", 64):
        assert f"tensor-split = {value}" in preset_of(value)


def test_the_class_sites_the_guard_found_read_ascii_blanks_alone():
    """The widened guard (test_boundary_readers_numbers) found a bare strip or split before the rule in
    fleet's serving lines, gate's signal, the catalogue's compute capability and versions, the NVLink
    speeds, and int() of systemctl's text in the watchdog: each now reads "\\x85"-bearing text as no number."""
    from plays.fleet import parse_serving
    from rigup.gpu import fabric
    from rigup.gpu.catalogue import parse_cc, version_tuple
    from roles.watchdog.shipped import watchdog
    served = parse_serving(["@@ rigup-llama@g.service", "port=8080\x85", "health=200\u2028"])[0]
    links = fabric.parse_nvlinks(["nvl GPU 0: X (UUID: GPU-x)", "nvl \t Link 0: 25\x85 GB/s", "nvl \t Link 1: 25  GB/s"])
    got = {"port": served["port"], "health": served["health"], "cc": parse_cc("8.0\x85"), "version": version_tuple("580.1\x85"),
           "links up": links["most"], "systemctl": [watchdog._int(v) for v in ("12", "\u0661\u0662", "1_2", "12\x85", None)]}
    print(got)
    assert got == {"port": None, "health": None, "cc": None, "version": None, "links up": 1, "systemctl": [12, 0, 0, 0, 0]}
    assert parse_cc(" 8.0\t") == (8, 0) and version_tuple("580.105.08\n") == (580, 105, 8)
