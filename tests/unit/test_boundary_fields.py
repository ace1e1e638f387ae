"""The boundary's one validator of names, addresses and listed paths, and its one number parser
(rigup/boundary/fields.py, numbers.py), under arbitrary input (Hypothesis): each answer is either a
clear refusal naming where, or a value of the pattern within its bounds; never another exception.
And the table holds every reader of the boundary to a property test (a reader named in no
Hypothesis test file fails here)."""

import ipaddress
import math
import posixpath
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import rigup.boundary as boundary
from rigup.boundary import fields, formats, numbers
from rigup.boundary.core import Unreadable

SETTINGS = settings(max_examples=60, deadline=1000)
PIECES = st.sampled_from(["..", ".", "/", "//", "\n", "\r", "\x00", "\x9b", "\u2028", "\u202e", "%", "é", "e\u0301",
                          "١٢", "²", "$(id)", ";", "#", "'", '"', "\\", " ", "0", "007", "-", "_", "fe80::1", "%eth0"])
TEXT = st.lists(st.text(max_size=12) | PIECES, max_size=8).map("".join)
JSONISH = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | TEXT
           | st.binary(max_size=12) | st.lists(st.integers(), max_size=2) | st.dictionaries(TEXT, st.integers(), max_size=2))


@SETTINGS
@given(TEXT | JSONISH)
def test_a_name_is_the_pattern_or_refused_naming_where(value):
    try:
        got = fields.name(value, "models.x")
    except Unreadable as e:
        assert e.where == "models.x"
        return
    assert got == value and fields.NAME.fullmatch(got) and not fields.CONTROL.search(got)


@SETTINGS
@given(TEXT | JSONISH)
def test_a_listed_path_stays_inside_its_directory_or_is_refused(value):
    try:
        got = fields.inside(value, "the hub lists")
    except Unreadable as e:
        assert e.where == "the hub lists"
        return
    joined = posixpath.normpath(posixpath.join("/srv/models/m", got))
    assert joined.startswith("/srv/models/m/") and ".." not in got.split("/") and not fields.CONTROL.search(got)
    assert len(got.encode()) <= fields.PATH_MAX and all(len(p.encode()) <= fields.NAME_MAX for p in got.split("/"))


@SETTINGS
@given(st.integers(1, 300), st.sampled_from(["a", "é", "\u4e2d", "\U0001f600"]), st.integers(1, 20))
def test_a_listed_path_the_host_could_not_create_is_refused(length, char, depth):
    """Linux's NAME_MAX (255 bytes a part) and PATH_MAX (4096 bytes), counted in UTF-8 bytes, not characters."""
    part = char * length
    value = "/".join([part] * depth)
    fits = len(part.encode()) <= 255 and len(value.encode()) <= 4096
    try:
        assert fields.inside(value, "the hub lists") == value and fits
    except Unreadable as e:
        assert not fits and "cannot create" in e.why


@pytest.mark.parametrize("value", ["a" * 300 + ".gguf", "d/" + "é" * 128, "/".join(["a" * 200] * 21), "x\ud800.gguf"])
def test_a_listed_name_too_long_or_not_utf8_is_refused(value):
    with pytest.raises(Unreadable) as refused:
        fields.inside(value, "the hub lists")
    print(f"\n{len(value)} characters: {refused.value}")


@SETTINGS
@given(TEXT | JSONISH | st.sampled_from(["GPU-46c2b1a0-7f3e-4c1d-9a0b-0123456789ab", "MIG-1a2b", "00000000:4E:00.0",
                                         "0000:4e:00.7", "00000000:4E:00.8", "GPU-1'; rm -rf / #\x1b]0;x\x07",
                                         "00000000:4E:00.0/../../../../etc", "00000000:4E:00.0\x1b[2J"]))
def test_a_cards_uuid_and_bus_id_are_the_pattern_or_refused(value):
    """What nvidia-smi prints for a card's UUID and PCI address: hex, dashes, colons and one point,
    never a path, a quote or an escape sequence (each becomes an argv word and a key)."""
    for check, shape in ((fields.gpu_uuid, r"(GPU|MIG)(-[0-9A-Fa-f]{1,32}){1,8}"),
                         (fields.pci_bus_id, r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")):
        try:
            got = check(value, "nvidia-smi")
        except Unreadable as e:
            assert e.where == "nvidia-smi"
            continue
        assert got == value and re.fullmatch(shape, got) and len(got) <= 8 + 8 * 33


@SETTINGS
@given(TEXT)
def test_a_host_ip_is_one_address_nft_takes(value):
    if fields.host_ip(value):
        address = ipaddress.ip_address(value)
        assert "%" not in value and not address.is_unspecified and not fields.CONTROL.search(value)
        assert formats.nft_address(value, "inet rigup_rpc") == value
        assert fields.one_host(address)


@pytest.mark.parametrize("value, taken", [
    ("::ffff:0.0.0.0", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("::127.0.0.1", False),
    ("::0.0.0.0", False), ("0.0.0.0", False), ("::", False), ("::1", True), ("127.0.0.1", True),
    ("10.0.0.1", True), ("fd00::1", True)])
def test_an_ipv6_form_of_an_ipv4_address_is_no_host_ip(value, taken):
    """issue 61 round 3, item 4: '::ffff:0.0.0.0' was a host_ip (is_unspecified is False for it, and
    a socket bound there listens on every IPv4 address); every mapped or compatible form is refused."""
    print(f"\nhost_ip({value!r}) is {fields.host_ip(value)}, expected {taken}")
    assert fields.host_ip(value) is taken


@SETTINGS
@given(TEXT | JSONISH, st.sampled_from([int, float]))
def test_a_number_is_finite_bounded_ascii_or_none(value, kind):
    got = numbers.number(value, kind, -1e6, 1e6)
    if got is None:
        with pytest.raises(Unreadable, match="^lab1:/x.json n: "):
            numbers.required(value, "lab1:/x.json n", kind, -1e6, 1e6)
        return
    assert type(got) is kind and math.isfinite(got) and -1e6 <= got <= 1e6 and not isinstance(value, bool)
    if isinstance(value, str):
        assert re.fullmatch(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?", value.strip())


@SETTINGS
@given(TEXT | JSONISH)
def test_a_whole_number_is_ascii_digits_or_a_json_int_or_none(value):
    got, strict = numbers.whole(value, 65535), numbers.json_whole(value, 65535)
    assert got is None or (type(got) is int and 0 <= got <= 65535 and not isinstance(value, bool))
    assert strict is None or (type(value) is int and strict == value)
    if isinstance(value, str) and got is not None:
        assert re.fullmatch(r"0|[1-9][0-9]*", value.strip())


@SETTINGS
@given(TEXT | JSONISH, st.integers(-5, 70000), st.integers(0, 70000))
def test_a_json_whole_number_is_within_lo_and_hi_or_none(value, lo, hi):
    """json_whole's ``lo`` (roll.py's settings, results.py's JSON ints): an int of max(lo, 0)..hi or None, and
    the default lo of 0 is the 0..hi rule every other caller has."""
    got = numbers.json_whole(value, hi, lo)
    assert got is None or (type(value) is int and got == value and max(lo, 0) <= got <= hi)
    assert got == (None if numbers.json_whole(value, hi) is None or numbers.json_whole(value, hi) < lo
                   else numbers.json_whole(value, hi))
    assert numbers.json_whole(value, hi, 0) == numbers.json_whole(value, hi)


@SETTINGS
@given(TEXT)
def test_an_nftables_comment_is_one_line_or_refused(text):
    try:
        line = formats.nft_comment(text, "inet rigup_rpc")
    except ValueError as e:
        assert str(e).startswith("inet rigup_rpc: ")
        return
    # nft's lexer ends a comment at a newline alone (U+2028 is text to it, and shown() escapes it on a terminal)
    assert line == f"# {text}" and not re.search(r"[\n\r\x00]", line)


@pytest.mark.parametrize("char", ["\u202a", "\u202e", "\u2066", "\u2069", "\u200e", "\u200f", "\u061c",
                                  "\u2028", "\u2029"])
def test_bidi_controls_and_line_separators_are_control_characters(char):
    """Round 4 of issue 61: extra_args ["chatml\u202e--host 0.0.0.0"] reached ExecStart=, shown
    reordered by 'systemctl cat' (Trojan Source); U+2028/2029 break a line in editors."""
    value = {"x": {"extra_args": ["--chat-template", f"chatml{char}--host 0.0.0.0"]}}
    found = fields.control_at(value)
    with pytest.raises(ValueError, match="control character") as e:
        formats.one_line(f"a{char}b", "ExecStart=")
    print(f"U+{ord(char):04X}: control_at -> {found!a}; one_line -> {str(e.value)[:80]!a}")
    assert found == (".x.extra_args[1]", char)


def test_every_reader_and_writer_of_the_table_has_a_property_test():
    """Each reader or writer the boundary's table names is called in a test file that uses
    Hypothesis: a new reader without its property test fails here."""
    tests = [p.read_text() for p in Path(__file__).parent.glob("test_*.py") if "from hypothesis" in p.read_text()]
    names = sorted({c.reader.split(":")[1] for c in boundary.crossings()})
    missing = [n for n in names if not any(re.search(rf"\b{n}\b", t) for t in tests)]
    print(f"{len(names)} readers and writers; without a property test file calling them: {missing}")
    assert not missing
