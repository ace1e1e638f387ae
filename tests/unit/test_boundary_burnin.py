"""rigup/boundary/burnin.py: rigup-burnin's records read whole or refused (Hypothesis: any JSON
shape, number or text is Unreadable naming where, or typed within bounds, never another
exception), and its callers failing closed for that host alone: a quarantined card whose record
is corrupted stays out, the controller's copy is kept, a pass without its figures is tested again,
the host is refused naming the file (roles/burnin, status's rows)."""

import json
import math
import os

import pytest
from hypothesis import given, settings, strategies as st

from plays import fleet
from rigup.boundary import Unreadable, burnin
from rigup.names import burnin_copy
from roles.burnin import judged
from roles.burnin.checks import check_records
from roles.burnin.facts import parse_burnin_state
from roles.burnin.quarantine import lines, serving, sort_cards
from roles.burnin.shipped import acceptance
from roles.gpu_guard.shipped import guard

WHERE = "lab1:/var/lib/rigup/burnin.json"
DATA = {"burnin_level": "standard", "burnin_after_change": "quick", "burnin_retest": False, "burnin_clear": []}
U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(3)]


def gpus():
    return [{"index": i, "uuid": U[i], "bus_id": f"00000000:0{i}:00.0", "memory_total_mib": 81920,
             "power_limit_w": 300.0} for i in range(3)]


def passed(i=0, **over):
    return {"passed": True, "failed": [], "index": i, "bus_id": f"00000000:0{i}:00.0", "level": "standard",
            "at": 1780000000, "seconds": 131.5, "name": "NVIDIA A100-SXM4-80GB",
            "key": {"driver": "580.105.08", "memory_mib": 81920, "power_limit_w": 300.0},
            "figures": {"vram": {"mib": 73728, "patterns": 4, "mismatches": 0}, "compute": {"wrong": 0, "checked": 9},
                        "soak": {"seconds": 120.0, "throttled_ratio": 0.0}}, **over}


def failed(i=1, **over):
    return {**passed(i), "passed": False, "failed": ["VRAM: 12 mismatched words"], **over}


def state(records: dict | str) -> dict:
    text = records if isinstance(records, str) else json.dumps(records, indent=1)
    return parse_burnin_state(["##rigup-burnin:records", *("|" + ln for ln in text.splitlines()), "",
                               "##rigup-burnin:units"])


# ---------------------------------------------------------------------------- the reader, any input
NUMBERS = (st.integers(min_value=-10**30, max_value=10**30) | st.floats(allow_nan=True, allow_infinity=True)
           | st.booleans() | st.sampled_from(["12", "1e400", "0x10", "٣", " 7", "-1", "NaN", "81920.0"]))
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | st.text(max_size=40),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4),
                    max_leaves=25)
FIELDS = {"passed": st.booleans() | JSON, "failed": st.lists(st.text(max_size=30), max_size=3) | JSON,
          "level": st.sampled_from(burnin.LEVELS) | JSON, "at": NUMBERS, "seconds": NUMBERS, "index": NUMBERS,
          "bus_id": st.text(max_size=20) | JSON, "name": st.text(max_size=20), "schema": NUMBERS,
          "key": st.fixed_dictionaries({}, optional={"driver": st.text(max_size=12) | NUMBERS,
                                                     "memory_mib": NUMBERS, "power_limit_w": NUMBERS}) | JSON,
          "figures": st.fixed_dictionaries({}, optional={"vram": st.fixed_dictionaries(
              {}, optional={"mib": NUMBERS, "mismatches": NUMBERS}), "soak": JSON, "gemm": JSON}) | JSON,
          "cleared": st.fixed_dictionaries({}, optional={"at": NUMBERS, "by": st.text(max_size=12)}) | JSON,
          "digest": JSON}
# a record rigup-burnin wrote (a pass, a failure, a bare pass), some of its fields replaced
RECORD = st.builds(lambda base, over: {**base, **over}, st.sampled_from([passed(0), failed(1), {"passed": True}]),
                   st.fixed_dictionaries({}, optional=FIELDS))
RECORDS = (st.dictionaries(st.sampled_from(U), RECORD, max_size=3)
           | st.dictionaries(st.text(max_size=14), JSON, max_size=3))


def within_bounds(read: burnin.Records) -> None:
    """What :func:`burnin.records` returns holds what its readers rely on."""
    for uuid, rec in read.cards.items():
        assert isinstance(rec["passed"], bool) and all(isinstance(f, str) for f in rec["failed"])
        assert rec["level"] in (None, *burnin.LEVELS)
        for name, hi in (("at", burnin.AT_MAX), ("seconds", 1e8)):
            assert rec[name] is None or (isinstance(rec[name], float) and 0 <= rec[name] <= hi)
        assert rec["index"] is None or (type(rec["index"]) is int and 0 <= rec["index"] <= 1023)
        key = rec["key"] or {}
        assert key.get("memory_mib") is None or (type(key["memory_mib"]) is int and 0 <= key["memory_mib"] <= 1 << 24)
        assert key.get("power_limit_w") is None or math.isfinite(key["power_limit_w"])
        assert key.get("driver") is None or isinstance(key["driver"], str)
        if rec["passed"]:   # believed: its level, time, key and figures, none of them naming a fault
            assert rec["level"] and rec["at"] and rec["key"] and rec["figures"] and not rec["failed"]
            # a key naming what it was tested under, figures of a test that ran (round 6 BA3, BA4)
            assert any(key.get(k) is not None for k in ("driver", "memory_mib", "power_limit_w"))
            assert any(isinstance(rec["figures"].get(s), dict) for s in ("vram", "pcie", "compute", "soak"))
        # a clearing is one with its time, or none (round 6 BA6, BA7)
        assert rec["cleared"] is None or isinstance(rec["cleared"]["at"], float)
    assert not set(read.cards) & set(read.untested)


def read_or_refused(text: str) -> None:
    try:
        read = burnin.records(text, WHERE)
    except Unreadable as e:
        assert e.where == WHERE and e.why and str(e).startswith(WHERE)
        return
    within_bounds(read)


@settings(max_examples=60, deadline=1000)
@given(RECORDS)
def test_any_records_are_read_within_bounds_or_refused_naming_where(doc):
    read_or_refused(json.dumps(doc))


@settings(max_examples=60, deadline=1000)
@given(JSON)
def test_any_json_shape_is_read_or_refused(doc):
    read_or_refused(json.dumps(doc))


@settings(max_examples=60, deadline=1000)
@given(st.text(max_size=200) | st.sampled_from(['{"a": 1, "a": 2}', "[" * 5000, '{"GPU-1": NaN}', "1" * 5000]))
def test_any_text_is_read_or_refused(text):
    read_or_refused(text)


@settings(max_examples=60, deadline=1000)
@given(st.binary(max_size=200))
def test_any_bytes_in_the_controllers_copy_are_read_or_refused(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("copy") / "lab1.json"
    path.write_bytes(raw)
    try:
        within_bounds(burnin.cached(path))
    except Unreadable as e:
        assert e.where == f"controller:{path}"


def test_each_finding_is_named_by_its_field():
    cases = {"not JSON": "{nope", "GPU-x.key.memory_mib": {"GPU-x": failed(key={"memory_mib": "81920 MiB"})},
             # 1e400 (json's inf) refused by core.loads, before any field is read (issue 61 round 9 CORE1)
             "1e400 is past a float's range": '{"GPU-y": {"passed": false, "key": {"memory_mib": 1e400}}}',
             "GPU-z.passed": {"GPU-z": {"passed": "yes"}}, "GPU-s.schema": {"GPU-s": failed(schema=3)},
             "twice": '{"GPU-1": {"passed": false}, "GPU-1": {"passed": true}}', "a card id": {"../x": failed()},
             "GPU-t.figures.vram.mismatches": {"GPU-t": passed(figures={"vram": {"mismatches": -3}})},
             # red team (issue 61): a JSON index is a JSON int; text "3" was taken (json_whole now)
             "GPU-i.index": {"GPU-i": passed(index="3")}, "GPU-j.index": {"GPU-j": passed(index=3.0)}}
    for field, doc in cases.items():
        with pytest.raises(Unreadable) as e:
            burnin.records(doc if isinstance(doc, str) else json.dumps(doc), WHERE)
        print(f"{field}: {e.value}")
        assert e.value.where == WHERE and field in e.value.why, (field, e.value.why)


def test_a_record_of_the_current_format_with_or_without_its_schema_keeps_what_it_does_not_know():
    new = passed(schema=2, digest="845aedc47f055f3e", cublas="12.4.5", tflops=231.4,
                 figures={**passed()["figures"], "gemm": {"tflops": 231.4, "power_ratio": 0.97}})
    read = burnin.records(json.dumps({U[0]: new, U[1]: passed(1), U[2]: passed(2, key={"driver": 550.54, "memory_mib": 81920})}), WHERE)
    assert read.untested == {} and read.cards[U[0]]["digest"] == "845aedc47f055f3e"
    assert read.cards[U[0]]["figures"]["gemm"] == {"tflops": 231.4, "power_ratio": 0.97}
    assert read.cards[U[2]]["key"]["driver"] == "550.54"    # nvidia-smi's number, as key_change compares it


def test_a_pass_without_its_level_time_or_figures_is_not_believed():
    bare = {"passed": True}
    faulty = passed(2, figures={"vram": {"mismatches": 12}})
    read = burnin.records(json.dumps({U[0]: bare, U[1]: passed(1, at=None), U[2]: faulty}), WHERE)
    assert read.cards == {} and "level, finished time, key, figures" in read.untested[U[0]]
    assert "finished time" in read.untested[U[1]] and "VRAM mismatches" in read.untested[U[2]]
    part = sort_cards(gpus(), state({U[0]: bare}), "580.105.08", DATA)
    assert part["run"] == {"standard": U} and "not believed" in part["why"][U[0]] and part["accepted"] == 0


@pytest.mark.parametrize("over", [{"key": {"note": "x"}}, {"figures": {"note": 1}},
                                  {"key": {"note": "x"}, "figures": {"note": 1}}])
def test_a_pass_whose_key_or_figures_name_nothing_is_not_believed(over):
    """Round 6 BA3, BA4: a pass keyed {note: x}, figures {note: 1}, was believed (accepted under any
    driver, never due on a key change); now its card is tested again."""
    read = burnin.records(json.dumps({U[0]: passed(0, **over)}), WHERE)
    print(over, read.untested)
    assert read.cards == {} and "not believed" in read.untested[U[0]]
    part = sort_cards(gpus()[:1], state({U[0]: passed(0, **over)}), "999.1", DATA)
    assert part["accepted"] == 0 and part["run"] == {"standard": [U[0]]}


@pytest.mark.parametrize("cleared", [{}, {"note": "x"}, {"by": "op"}])
def test_a_clearing_without_its_time_is_none(cleared):
    """Round 6 BA6, BA7: ``cleared: {}`` read as {at: None, by: None}, a clearing to the controller,
    while rigup-burnin and the guard kept the card quarantined; the card stays out."""
    read = burnin.records(json.dumps({U[1]: failed(1, cleared=cleared)}), WHERE)
    print(cleared, read.cards[U[1]]["cleared"])
    assert read.cards[U[1]]["cleared"] is None
    part = sort_cards(gpus()[1:2], state({U[1]: failed(1, cleared=cleared)}), "580.105.08", DATA)
    assert [q["uuid"] for q in part["quarantined"]] == [U[1]]
    assert burnin.records(json.dumps({U[1]: failed(1, cleared={"at": 1780000001, "by": "op"})}),
                          WHERE).cards[U[1]]["cleared"] == {"at": 1780000001.0, "by": "op"}


PULSE = {"schema": 1, "passed": True, "at": 1780000000, "failed": [],
         "key": {"cards": [U[0]], "caps_w": 450.0, "psu_watts": 2000.0}, "figures": {"peak_w": 400, "hz": 4, "seconds": 30}}


@pytest.mark.parametrize("field, value", [("key.caps_w", 1e7), ("figures.peak_w", 1e7), ("figures.hz", 1e6),
                                          ("figures.seconds", 1e6), ("figures.hz", 51), ("figures.seconds", 3601)])
def test_pulse_figures_past_what_rigup_burnin_runs_are_refused(field, value):
    """Round 6 BA11, BA15: caps of 1e7 W, 1e6 Hz for 1e6 s were believed (rigup-burnin pulse runs
    0.5..50 Hz for at most 3600 s; a card's cap is at most CARD_W)."""
    section, name = field.split(".")
    rec = json.loads(json.dumps(PULSE))
    rec[section][name] = value
    assert burnin.pulse(json.dumps(PULSE), WHERE)["untested"] is None
    with pytest.raises(Unreadable, match=field.replace(".", r"\.")) as e:
        burnin.pulse(json.dumps(rec), WHERE)
    print(e.value)


# ---------------------------------------------------------------------------- its callers, failing closed
@pytest.fixture
def copy_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_quarantined_card_whose_record_is_corrupted_stays_out_and_the_copy_is_kept(copy_dir):
    good = {U[0]: passed(0), U[1]: failed(1)}
    st0, problems = judged("lab1", state(good), "/var/lib/rigup/burnin.json", DATA)
    assert problems == [] and json.loads(burnin_copy("lab1").read_text()) == json.loads(json.dumps(st0["records"]))
    kept = burnin_copy("lab1").read_text()
    for bad in ('{"' + U[1] + '": {"passed": tru', json.dumps({U[1]: failed(1, key={"memory_mib": "lots"})}),
                '{"' + U[1] + '": {"passed": false, "key": {"memory_mib": 1e400}}}'):
        st1 = state(bad)   # the fact never raises: pyinfra would end the run for every host
        assert st1["unreadable"] and st1["records"] == {}
        st2, problems = judged("lab1", st1, "/var/lib/rigup/burnin.json", DATA)
        part = sort_cards(gpus(), st2, "580.105.08", DATA)
        part["unreadable"] = problems
        assert [q["uuid"] for q in part["quarantined"]] == [U[1]]
        assert U[1] not in [g["uuid"] for g in serving(gpus(), part)]
        (refused,) = check_records({"burnin": part}, {}, DATA)
        assert refused.what == "burn-in records lab1:/var/lib/rigup/burnin.json do not read", refused.what
        assert "controller's copy" in refused.fix and any("does not read" in ln for ln in lines(part))
        assert burnin_copy("lab1").read_text() == kept        # never overwritten by a bad read


def test_without_a_good_copy_every_card_is_untested_and_the_host_refused(copy_dir):
    st2, problems = judged("lab2", state("{nope"), "/var/lib/rigup/burnin.json", DATA)
    part = sort_cards(gpus(), st2, None, DATA)
    assert part["run"] == {"standard": U} and part["accepted"] == 0 and len(problems) == 1
    assert not burnin_copy("lab2").exists()


def test_an_empty_read_keeps_the_copy_and_its_quarantine(copy_dir):
    judged("lab1", state({U[0]: passed(0), U[1]: failed(1)}), "/x/burnin.json", DATA)
    kept = burnin_copy("lab1").read_text()
    st2, problems = judged("lab1", state(""), "/x/burnin.json", DATA)        # the file gone: not {}
    assert problems == [] and burnin_copy("lab1").read_text() == kept
    assert [q["uuid"] for q in sort_cards(gpus(), st2, None, DATA)["quarantined"]] == [U[1]]
    st3, _ = judged("lab1", state({U[0]: passed(0)}), "/x/burnin.json", DATA)   # its record gone by hand
    assert [q["uuid"] for q in sort_cards(gpus(), st3, None, DATA)["quarantined"]] == [U[1]]
    st3, _ = judged("lab1", state({U[1]: {"passed": True}}), "/x/burnin.json", DATA)   # a bare pass written by hand
    assert [q["uuid"] for q in sort_cards(gpus(), st3, None, DATA)["quarantined"]] == [U[1]]
    st4, _ = judged("lab1", state({U[1]: passed(1)}), "/x/burnin.json", DATA)   # a retest passed: it serves
    assert sort_cards(gpus(), st4, "580.105.08", DATA)["quarantined"] == []
    st5, _ = judged("lab1", state(""), "/x/burnin.json", {**DATA, "burnin_clear": [U[1]]})
    assert st5["records"] == {}                                             # the operator's word


def test_a_corrupted_copy_refuses_the_host_and_is_not_overwritten(copy_dir):
    burnin_copy("lab1").parent.mkdir(parents=True)
    burnin_copy("lab1").write_text("{nope")
    st2, problems = judged("lab1", state({U[0]: passed(0)}), "/x/burnin.json", DATA)
    assert [p["where"] for p in problems] == [f"controller:{burnin_copy('lab1')}"] and st2["records"][U[0]]["passed"]
    assert burnin_copy("lab1").read_text() == "{nope"


def test_a_copy_another_user_could_have_written_is_not_read(copy_dir):
    judged("lab1", state({U[1]: failed(1)}), "/x/burnin.json", DATA)
    burnin_copy("lab1").chmod(0o666)
    st2, problems = judged("lab1", state("{nope"), "/x/burnin.json", DATA)
    assert [p["where"] for p in problems] == [f"controller:{burnin_copy('lab1')}", "lab1:/x/burnin.json"]
    assert "only you or root can write" in problems[0]["why"] and st2["records"] == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_copy_directory_another_user_could_write_refuses_the_host_before_any_copy_is_written(copy_dir, tmp_path):
    """The red team's 18 (issue 61): $RIGUP_CACHE_DIR/burnin of nobody's, 0777, no copy yet, a link
    planted at the old temporary name: the host is refused naming the directory; nothing written through."""
    d = burnin_copy("lab1").parent
    d.mkdir()
    os.chown(d, 65534, 65534)
    d.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text("operator's file\n")
    (d / f".lab1.json.{os.getpid()}.tmp").symlink_to(victim)
    st2, problems = judged("lab1", state({U[1]: failed(1)}), "/x/burnin.json", DATA)
    print(problems)
    assert [p["where"] for p in problems] == [f"controller:{burnin_copy('lab1')}"] and "owned by nobody" in problems[0]["why"]
    assert victim.read_text() == "operator's file\n" and not burnin_copy("lab1").exists()
    with pytest.raises(Unreadable, match="owned by nobody"):
        burnin.cached(burnin_copy("lab1"))


def test_a_marker_line_in_the_file_is_part_of_the_records():
    lines_ = ["##rigup-burnin:records", "|{}", "|##rigup-burnin:units", "|Id=rigup-llama@x.service", "",
              "##rigup-burnin:units"]
    st1 = parse_burnin_state(lines_)
    assert st1["unreadable"].startswith("not JSON") and st1["units"] == {}


def test_status_names_the_unreadable_records_and_keeps_the_copys_quarantine(copy_dir):
    judged("lab1", state({U[1]: failed(1)}), "/x/burnin.json", DATA)
    row = fleet.burnin_part("lab1", {"burnin": ["|{nope"]}, "/x/burnin.json")
    assert list(row["quarantined"]) == ["0000:01:00"]
    assert row["burnin_unreadable"].startswith("lab1:/x/burnin.json: not JSON")
    assert fleet.burnin_part("lab1", {"burnin": ["|{}"]}, "/x/burnin.json") == \
        {"quarantined": row["quarantined"], "burnin_due": {}, "burnin_unreadable": None}
    assert fleet.burnin_part("lab3", {}, "/x/burnin.json") == {"quarantined": {}, "burnin_due": {}, "burnin_unreadable": None}


def test_a_pass_names_its_driver_memory_and_a_measure_and_a_clearing_follows_its_failure():
    """Re-round 6 (issue 61): NB1, a key of the driver alone; NB2, figures of an empty section; NB5, a
    clearing older than the failure it would clear; NB3, one card at 2,000,000 W in a pulse."""
    doc = {U[0]: passed(0, key={"driver": "580.105.08"}), U[1]: passed(1, figures={"soak": {}}),
           U[2]: failed(2, at=1780000500, cleared={"at": 1780000000, "by": "ops"})}
    read = burnin.records(json.dumps(doc), WHERE)
    print(read.untested, read.cards[U[2]]["cleared"])
    assert "key" in read.untested[U[0]] and "figures" in read.untested[U[1]] and read.cards[U[2]]["cleared"] is None
    assert acceptance.quarantined(doc[U[2]]) and guard.quarantined(doc[U[2]])
    later = failed(2, at=1780000000, cleared={"at": 1780000500, "by": "ops"})
    assert burnin.records(json.dumps({U[2]: later}), WHERE).cards[U[2]]["cleared"]["at"] == 1780000500
    assert not acceptance.quarantined(later) and not guard.quarantined(later)
    one = {"schema": 1, "at": 1780000000, "passed": True, "failed": [], "figures": {"hz": 4, "seconds": 30, "peak_w": 300},
           "key": {"driver": "580.105.08", "cards": [U[0]], "caps_w": 2_000_000}}
    with pytest.raises(Unreadable) as e:
        burnin.pulse(json.dumps(one), WHERE)
    print(e.value)
    assert "key.caps_w" in str(e.value)


def test_a_lost_cards_verdict_by_its_bus_id_does_not_hang_on_the_records_order():
    """Round 6 BA10: two records of one bus id (an old failed card, the new one that passed) gave a
    verdict by dict order; the quarantined one is taken whatever the order (fail closed)."""
    base = {"level": "standard", "at": 1780000000, "bus_id": "00000000:4E:00.0", "key": {"driver": "1"},
            "figures": {"vram": {"mismatches": 0}}}
    old, new = {**base, "passed": False, "failed": ["x"]}, {**base, "passed": True, "failed": []}
    gpus = [{"index": 0, "uuid": None, "bus_id": "00000000:4E:00.0", "lost": True}]
    got = [len(sort_cards(gpus, state(recs), None, {"burnin_level": "standard"})["quarantined"])
           for recs in ({U[1]: old, U[2]: new}, {U[2]: new, U[1]: old})]
    print(got)
    assert got == [1, 1]
