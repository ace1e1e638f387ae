"""rigup/boundary/hosttext.py and the host-side readers its table names (issue 61, classes 3 and 4):
whatever a host or a hub prints or writes, each reader answers typed values within bounds or
refuses with Unreadable naming where (GGUFRefused in the host programs), never another exception;
the callers fail closed for that host or model alone."""

import json
import math
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary.core import Unreadable
from rigup.boundary import hosttext, results
from rigup.boundary.hosttext import MAX_BYTES, download_progress, gguf_figures, hub_listing
from shipped.gguf import GGUFRefused, MAX_LAYERS, kv_figures, metadata
from shipped import xid
from rigup.gpu.catalogue import xid_codes
from rigup.gpu.facts import parse_cpu, parse_listening_ports
from rigup.progress import progress_text
from roles.gpu_guard.shipped import guard
from roles.model_fetch import hub as hub_module
from roles.model_fetch.facts import parse_probe, parse_progress
from roles.model_fetch.shipped.fetcher import Progress, listing_problems
from roles.model_fetch.plan import progress_line, short_progress
from tests.runs import fresh_run  # noqa: F401 (a fixture: a test of its own run)

SETTINGS = settings(max_examples=60, deadline=1000)
# text as hosts print it: control characters, newlines, quotes, digits of other scripts
TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('\n\r\x1b"\'\\٧٩0079'), max_size=40)
NUMBERS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from(["12", "0079", "1e3", " 7 ", "nan", "inf", "-1", "١٢", "1_000", ""]))
JSON = st.recursive(st.none() | NUMBERS | TEXT, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
WHERE = "/srv/models/m/.rigup-fetch/progress.json"


def read(reader, value, where: str, *more):
    """``reader(value, where, *more)``, or None when it refuses with Unreadable naming ``where``; any
    other exception fails the test."""
    try:
        return reader(value, where, *more)
    except Unreadable as e:
        assert e.where.startswith(where), e
        return None


# ---------------------------------------------------------------- a download's progress.json

GOOD = {"state": "running", "bytes": 50 << 20, "total": 100 << 20, "rate": 10 << 20, "eta": 5, "error": None,
        "detail": "", "source": "http://hub"}


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["pid"]), JSON, max_size=6) | JSON)
def test_a_progress_record_is_typed_or_unreadable_naming_where(record):
    p = read(download_progress, record, WHERE)
    assert p is None or (type(p["bytes"]) is int and type(p["total"]) is int
                         and 0 <= p["bytes"] <= MAX_BYTES and 0 <= p["total"] <= MAX_BYTES
                         and (not p["total"] or p["bytes"] <= p["total"])
                         and math.isfinite(p["rate"]) and p["rate"] >= 0
                         and (p["eta"] is None or 0 <= p["eta"] <= 1e9)
                         and all(v is None or (isinstance(v, str) and v.isprintable()) for v in
                                 (p["error"], p["detail"], p["source"], p["state"])))


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(GOOD)), JSON, max_size=6), st.booleans())
def test_status_and_the_converge_show_any_progress_record_never_a_traceback(record, running):
    """A progress.json whose total is a string crashed status's table line (``100 * done / total``)."""
    blob = json.dumps({**GOOD, **record}, allow_nan=True)
    spec = {"name": "m", "dest": "/srv/models/m", "repo": "org/m", "revision": "a" * 40}
    states = parse_progress(["@@ m", "marker=", f"progress={blob}"] + (["running=1"] if running else []), [spec])
    line = short_progress("m", states["m"])
    assert line.startswith("m ") and line.isprintable()
    probed = parse_probe([f"##rigup-model {json.dumps({'name': 'm', 'running': running, 'progress': json.loads(blob)})}"])
    assert progress_line("m", probed["models"]["m"]).isprintable()


PROBED = ("running", "complete", "staged", "dest", "where", "unsafe_parent", "probe_error", "damaged", "previous",
          "planted", "have_bytes", "free_bytes", "hub_error", "reusable")


@SETTINGS
@given(st.dictionaries(st.sampled_from(PROBED), JSON, max_size=5))
def test_a_probe_line_is_typed_or_refused_naming_its_field(fields):
    """results.model_probe (round 34 M34a): each field the plan reads is of its type, or Unreadable names it."""
    try:
        got = results.model_probe({"name": "m", **fields}, "model m")
    except Unreadable as e:
        assert any(str(e).startswith(f"model m: {key}") for key in fields), e
        return
    for key in ("running", "complete", "staged"):
        assert got.get(key) is None or type(got[key]) is bool
    for key in ("have_bytes", "free_bytes"):
        assert got.get(key) is None or (type(got[key]) is int and 0 <= got[key] <= MAX_BYTES)
    assert all(isinstance(p, str) for p in got.get("damaged") or [])
    assert all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in got.get("planted") or [])
    assert all(type(n) is int for n in (got.get("reusable") or {}).values())


def test_a_total_written_as_text_is_unreadable_for_that_model_alone():
    spec = {"name": "m", "dest": "/srv/models/m", "repo": "org/m", "revision": "a" * 40}
    other = dict(spec, name="n", dest="/srv/models/n")
    bad, good = json.dumps(dict(GOOD, total="100")), json.dumps(GOOD)
    states = parse_progress(["@@ m", f"progress={bad}", "running=1", "@@ n", f"progress={good}", "running=1"],
                            [spec, other])
    assert short_progress("m", states["m"]).startswith("m progress unreadable: /srv/models/m/.rigup-fetch/progress.json.total")
    assert short_progress("n", states["n"]) == "n 50.0% running"


@SETTINGS
@given(st.integers(0, MAX_BYTES), st.integers(0, MAX_BYTES))
def test_more_bytes_done_than_the_whole_is_unreadable(done, total):
    """A record of 10**15 bytes done of 10 read as 10**16 %: bytes at most the total where one is known."""
    got = read(download_progress, dict(GOOD, bytes=done, total=total), WHERE)
    assert (got is not None) == (not total or done <= total)


def test_the_red_teams_progress_is_refused_naming_the_field():
    with pytest.raises(Unreadable) as refused:
        download_progress({"state": "running", "bytes": 10**15, "total": 10}, WHERE)
    print(f"\nbytes 10**15 of 10: {refused.value}")
    assert refused.value.where == WHERE + ".bytes"


def test_the_fetchers_own_record_reads_back():
    """The writer (fetcher.py Progress.snapshot) round-trips through json and the reader."""
    p = Progress("/nonexistent", 1000, 250, "http://hub")
    snap = json.loads(json.dumps(p.snapshot()))
    read = download_progress(snap, WHERE)
    assert (read["state"], read["bytes"], read["total"], read["source"]) == ("running", 250, 1000, "http://hub")


# ---------------------------------------------------------------- a GGUF header

def _value(v) -> bytes:
    """One typed GGUF value: bool (7), float (12, f64), int (11, i64), text (8), list of ints (9 of i64)."""
    if isinstance(v, bool):
        return struct.pack("<I?", 7, v)
    if isinstance(v, float):
        return struct.pack("<Id", 12, v)
    if isinstance(v, int):
        return struct.pack("<Iq", 11, v)
    if isinstance(v, list):
        return struct.pack("<IIQ", 9, 11, len(v)) + b"".join(struct.pack("<q", i) for i in v)
    b = str(v).encode()
    return struct.pack("<IQ", 8, len(b)) + b


def header(kv: dict) -> bytes:
    """A GGUF v3 header of ``kv``, built by hand (every value type the sizing keys may come as)."""
    body = b"".join(struct.pack("<Q", len(k.encode())) + k.encode() + _value(v) for k, v in kv.items())
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + body


LLAMA = {"general.architecture": "llama", "llama.block_count": 22, "llama.embedding_length": 2048,
         "llama.attention.head_count": 32, "llama.attention.head_count_kv": 4, "llama.context_length": 2048}
GGUF_VALUES = st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-8, 70000), st.booleans(),
                        st.floats(allow_nan=True, allow_infinity=True), TEXT,
                        st.lists(st.integers(-2**63, 2**63 - 1), max_size=4))


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(LLAMA)[1:] + ["llama.attention.key_length", "llama.attention.value_length"]),
                       GGUF_VALUES, max_size=4))
def test_a_header_sizes_vram_only_with_whole_numbers(changed):
    """A layer count as a bool or a float, negative KV lengths: refused naming the key, before sizing."""
    meta = metadata(header({**LLAMA, **changed}))
    try:
        figures = kv_figures(meta)
    except GGUFRefused as e:
        assert any(key in str(e) for key in changed), (e, changed)
        return
    read = gguf_figures(dict(figures, read_bytes=4096), "m.gguf")
    assert read["layers"] is None or (type(read["layers"]) is int and 0 <= read["layers"] <= MAX_LAYERS)
    kv = read["kv_gib_per_1k_tokens"]
    assert kv is None or (math.isfinite(kv) and kv >= 0)


@pytest.mark.parametrize("key, value", [("llama.block_count", True), ("llama.block_count", 22.0),
                                        ("llama.attention.key_length", -64), ("llama.attention.head_count_kv", [4, -4])])
def test_the_attackers_headers_are_refused_naming_the_field(key, value):
    with pytest.raises(GGUFRefused, match=key):
        kv_figures(metadata(header({**LLAMA, key: value})))


@SETTINGS
@given(st.dictionaries(st.sampled_from(["architecture", "layers", "kv_gib_per_1k_tokens", "context_length",
                                        "read_bytes", "chat_template"]), JSON | st.booleans(), max_size=6) | JSON)
def test_kept_figures_are_typed_or_unreadable_naming_the_file(figures):
    """The hub's cache keeps figures between runs: read like the hub's own answer."""
    got = read(gguf_figures, figures, "the GGUF header of m.gguf") or {}
    assert got.get("layers") is None or type(got["layers"]) is int
    assert got.get("chat_template") in (True, False, None)


@pytest.mark.parametrize("kv, got", [(5e-324, None), (1e-5, None), ("0.5", None), ("8192", None), (math.nan, None),
                                     (math.inf, None), (True, None), ([1], None), (1e10, None), (-1e-4, None),
                                     (0, 0.0), (-0.0, 0.0), (0.0001, 0.0001), (0.5, 0.5), (3, 3.0)])
def test_the_kv_figure_is_a_json_number_0_or_one_gguf_writes(kv, got):
    """Round 7 S1, S2: 5e-324 (finite, in 0..1e9) sized int(inf) slots, a traceback for the run; the JSON string
    "0.5" was a number where context_length's "8192" is refused. A figure is a JSON number, 0 (no KV cache) or
    at least KV_MIN (shipped/gguf.py rounds to 4 places)."""
    figures = {"architecture": "llama", "layers": 32, "kv_gib_per_1k_tokens": kv}
    if got is None:
        with pytest.raises(Unreadable, match="m.gguf: kv_gib_per_1k_tokens"):
            gguf_figures(figures, "m.gguf")
    else:
        read = gguf_figures(figures, "m.gguf")["kv_gib_per_1k_tokens"]
        assert type(read) is float and read == got and math.copysign(1, read) == 1


@SETTINGS
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10, 10**20), st.floats(0, 2000))
def test_any_kv_figure_read_sizes_slots_within_bounds(kv, vram):
    """The kv figure gguf_figures reads (or refuses) sizes a server's slots without raising (replicas.sizing: a
    rate near 0 gave int(inf)); its ctx and parallel are whole numbers within MAX_SLOTS slots."""
    from roles.llama_server import replicas

    try:
        rate = gguf_figures({"layers": 32, "kv_gib_per_1k_tokens": kv}, "m.gguf")["kv_gib_per_1k_tokens"]
    except Unreadable:
        return
    assert rate == 0 or hosttext.KV_MIN <= rate <= 1e9
    inst = {"ctx": "auto", "parallel": "auto", "ngl": 999, "rpc_workers": [], "cache_ram": None}
    for figure in (rate, 5e-324, math.nan):   # the division guarded as well, whatever reaches it
        got = replicas.sizing(inst, {"size_gib": 1.0, "gguf": {"kv_gib_per_1k_tokens": figure}}, [vram])
        assert 1 <= got.parallel <= replicas.MAX_SLOTS and type(got.ctx) is int and got.ctx >= 1


@pytest.mark.parametrize("said, got", [(True, True), (False, False), (None, None), ("absent", None)])
def test_the_chat_template_is_a_bool_or_not_known_and_a_stamp_kept_before_still_reads(said, got):
    """Issue 63: figures kept before rigup read the template have no key: read, the template not known."""
    figures = {"architecture": "gemma3", "layers": 18, "kv_gib_per_1k_tokens": 0.01, "read_bytes": 1 << 20}
    if said != "absent":
        figures["chat_template"] = said
    assert gguf_figures(figures, "m.gguf")["chat_template"] is got
    for bad in ("false", 0, 1, [], {}):
        with pytest.raises(Unreadable, match="m.gguf: chat_template"):
            gguf_figures(dict(figures, chat_template=bad), "m.gguf")


def test_a_kept_header_with_a_bool_layer_count_refuses_the_model(tmp_path, monkeypatch, fresh_run):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path))
    key = ("gguf", "http://hub.test", "org/x", "a" * 40, "m.gguf")
    kept = hub_module._kept(key)
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"architecture": "llama", "layers": True, "kv_gib_per_1k_tokens": -1.0,
                                "chat_template": None}))   # read as kept: not asked again for the template
    with pytest.raises(hub_module.HubRefused, match="m.gguf in org/x@aaaaaaaaaaaa at http://hub.test: layers"):
        hub_module._head("http://hub.test", "org/x", "a" * 40, "m.gguf", None, 10)


# ---------------------------------------------------------------- a hub's listing

ENTRY = {"path": "m.gguf", "size": 10, "oid": "1" * 40, "sha256": "b" * 64}
PATHS = st.one_of(TEXT, st.sampled_from(["a/../b", "/etc/x", "./m", "a//b", "a\nb", "..", "m.gguf", "d/m.gguf", "a\\b"]))


@SETTINGS
@given(st.lists(st.fixed_dictionaries({"path": PATHS, "size": NUMBERS, "oid": st.sampled_from(["1" * 40, None, 5]),
                                       "sha256": st.sampled_from(["b" * 64, "B" * 64, "x", None])}), max_size=4) | JSON)
def test_every_listed_path_stays_inside_its_directory(files):
    for f in read(hub_listing, files, "the hub lists", listing_problems) or []:
        parts = f["path"].split("/")
        assert not f["path"].startswith("/") and ".." not in parts and "" not in parts
        assert not any(ord(c) < 32 or ord(c) == 127 for c in f["path"])
        assert type(f["size"]) is int and 0 <= f["size"] <= MAX_BYTES
        assert f["sha256"] is None or (len(f["sha256"]) == 64 and set(f["sha256"]) <= set("0123456789abcdef"))


def test_a_size_beyond_any_disk_is_refused():
    with pytest.raises(Unreadable, match="over"):
        hub_listing([dict(ENTRY, size=1 << 70)], "the hub lists", listing_problems)


# ---------------------------------------------------------------- Xid lines, build logs, sysfs, the guard

@SETTINGS
@given(TEXT, st.sampled_from(["79", "0079", "٧٩", "+79", "79.0", "007", "0", "13", "99999"]), TEXT)
def test_an_xid_code_is_plain_decimal_or_no_event(before, code, after):
    """The kernel prints Xid codes as plain decimal; ``0079`` read as 79 tripped a drain."""
    # one journal line each (the journal's lines hold no newline: a line that did is no event)
    line = f"NVRM: Xid (PCI:0000:01:00): {code}, pid=1, {after}".replace("\n", " ")
    found = xid.events([before, line], xid_codes())
    codes = [e["code"] for e in found if e["line"] == line]
    assert codes == ([int(code)] if code in ("79", "0", "13") else [])
    assert all(type(e["code"]) is int and 0 <= e["code"] < 10**5 for e in found)


@SETTINGS
@given(TEXT, st.integers(0, 100))
def test_a_build_log_line_never_ends_the_wait(line, high):
    for text in (line, f"[{line}/12] x", f"[{line}%] y", f"[1{'0' * 5000}/3] z"):
        shown = progress_text(text, high)
        assert isinstance(shown, str) and len(shown) <= 120


@SETTINGS
@given(st.lists(TEXT | st.sampled_from(["0 1", "-1 2", "1" * 5000 + " 3", "٣ 4", "MemTotal: 0079 kB"]), max_size=6))
def test_sysfs_and_proc_text_never_ends_preflight(lines):
    """A 5000-digit CPU topology id ended parse_cpu with int()'s ValueError (its 4300-digit limit)."""
    cpu = parse_cpu(["--- topology", *lines, "--- memory", *lines[:1]])
    assert cpu["cores"] is None or cpu["cores"] >= 1
    ports = parse_listening_ports(["ss", *(f"LISTEN 0 128 0.0.0.0:{t} x" for t in lines)]) or {}
    assert all(type(p) is int and 0 <= p <= 65535 for p in ports)


@SETTINGS
@given(JSON)
def test_the_guards_reboot_count_never_ends_the_check(count):
    """A reboots file whose count is not an int (``"x"``, ``1e400``) ended the check before its drain."""
    path = Path(tempfile.mkdtemp()) / "reboots.json"
    day = guard.reboots_today(str(path), 0.0)[0]
    path.write_text(json.dumps({"day": day, "count": count}))
    got = guard.reboots_today(str(path), 0.0)[1]
    assert type(got) is int and got >= 0 and (got == count or got == 1 << 30)


def test_a_json_records_whole_number_is_a_json_int_and_a_float64_in_full_reads_only_where_asked():
    """rigup.boundary.numbers.json_whole, the rule of every JSON record's count and index (burnin.py's
    index, hosttext.py's bytes and layers): "3" as text, 3.0, True and -1 are none (red team, issue 61);
    number(places=17) reads a float64 as Prometheus prints it, the default 12 places does not."""
    from rigup.boundary.numbers import json_whole, number
    got = {repr(v): json_whole(v, 1023) for v in (3, "3", 3.0, True, -1, 1024, None)}
    full = "0.4166666666666667"
    print(f"\n{got}; {full}: {number(full)} / {number(full, places=17)}")
    assert got == {"3": 3, "'3'": None, "3.0": None, "True": None, "-1": None, "1024": None, "None": None}
    assert number(full) is None and number(full, places=17) == 0.4166666666666667 and number("1_0", places=17) is None
