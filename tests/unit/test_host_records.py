"""The records the host programs read and the files they write (issue 61, second red team, items
6-13, 29, 30): roles/watchdog/shipped/watchdog.py's gate record, reboots file and state file, each read by
one typed reader in bounds (a record that does not read: the program's safe choice), the guard's
and the fetcher's JSON loads under any text, and the one writer each program carries (``replace``:
a random temp name opened O_EXCL|O_NOFOLLOW, then a rename), never writing through a link another
user planted in the directory. Hypothesis holds the watchdog's number rule to rigup.boundary.numbers
and runs every reader over arbitrary JSON and text."""

import inspect
import json
import math
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rigup.boundary.numbers import number
from roles.gpu_guard.shipped import guard
from roles.model_fetch.shipped import fetcher
from roles.watchdog.shipped import watchdog as wd

DEEP = "[" * 200000 + "]" * 200000
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from([1e300, -1e300, 10 ** 30, -1000, 0, 1e7, 1e7 + 1, "1", "12.5", None]))
JSON = st.recursive(st.one_of(st.none(), NUMBERS, st.text(max_size=20)),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
FIELDS = st.sampled_from(["bad", "restarts", "escalations", "failed", "unjudged", "command_failures", "restarted_at",
                          "escalated_at", "started", "passed_at", "last_tps", "restart_tps", "served", "starting",
                          "after_restart", "unit", "other", "decodes", "failing", "failing_restarts",
                          "failing_model"])
SETTINGS = settings(max_examples=60, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])


def said(text, value):
    print(f"{text}: {value!r}")
    return value


def gate_config(tmp_path, text):
    (tmp_path / "u.json").write_text(text)
    return {"gate_record": str(tmp_path / "{}.json")}


@pytest.mark.parametrize("text, why", [
    ('{"unit": "u", "tps": 1e300, "at": 1}', "tps 1e300: a floor of 5e299, every check below it"),
    ('{"unit": "u", "tps": true, "at": 1}', "tps true: a bool as tok/s (floor 0.5)"),
    ('{"unit": "u", "tps": 10, "at": 1e300}', "at 1e300: 'passed its gate' forever"),
    ('{"tps": ' + DEEP + '}', "nested 200000 deep (RecursionError)"),
    ('{"tps": ' + "9" * 5000 + ', "at": 1}', "tps a 5000-digit int (int's digit limit)"),
    ('{"tps": NaN, "at": 1}', "tps NaN"),
])
def test_a_gate_record_that_does_not_read_gives_no_floor_and_no_gate_passed(tmp_path, capsys, text, why):
    config = gate_config(tmp_path, text)
    floor = wd.floor_of({"unit": "u"}, {"floor": None}, config)
    passed = wd.passed_gate({"unit": "u"}, {}, config, time.time() - 60)
    assert (floor, passed) == (None, False), why
    assert "is not one" in capsys.readouterr().out
    print(f"{why}: no floor, not passed its gate")


def test_a_gate_record_in_bounds_gives_half_its_tps_and_its_time(tmp_path):
    config = gate_config(tmp_path, json.dumps({"unit": "u", "tps": 80, "at": time.time()}))
    assert said("floor of tps 80", wd.floor_of({"unit": "u"}, {"floor": None}, config)) == 40
    assert said("passed since a start a minute ago", wd.passed_gate({"unit": "u"}, {}, config, time.time() - 60))


@pytest.mark.parametrize("kept", [{"count": -1000}, {"count": True}, {"count": 1.5}, {"count": "0"}, {"count": 1e300},
                                  {"day": 5, "count": 0}, DEEP])
def test_a_reboots_file_that_does_not_read_leaves_no_reboot_today(tmp_path, capsys, kept):
    path = tmp_path / "reboots.json"
    path.write_text(kept if isinstance(kept, str) else json.dumps({"day": time.strftime("%Y-%m-%d"), **kept}))
    got = wd.reboots_today({"reboots_file": str(path), "max_reboots": 2})
    assert said(f"reboots of {str(kept)[:40]}", got["count"]) == 2
    assert "no reboot left today" in capsys.readouterr().out


def test_a_reboots_file_of_today_or_another_day_or_none(tmp_path):
    path = tmp_path / "reboots.json"
    assert wd.reboots_today({"reboots_file": str(path)})["count"] == 0
    path.write_text(json.dumps({"day": time.strftime("%Y-%m-%d"), "count": 1}))
    assert said("today's count 1", wd.reboots_today({"reboots_file": str(path)})["count"]) == 1
    path.write_text(json.dumps({"day": "2001-01-01", "count": 1}))
    assert said("another day's count", wd.reboots_today({"reboots_file": str(path)})["count"]) == 0


@pytest.mark.parametrize("text", ['{"x": {"restarts": "1"}}', '{"x": {"bad": false}}', '{"x": {"restarts": Infinity}}',
                                  '{"x": {"passed_at": 1e300}}', '{"x": {"unit": "--force"}}', '{"x": [1]}', DEEP])
def test_a_state_file_that_does_not_read_is_a_fresh_state_said_in_the_journal(tmp_path, capsys, text):
    path = tmp_path / "state.json"
    path.write_text(text)
    state = wd.load_state({"state_file": str(path)})
    assert said(f"state of {text[:40]}", state) == {}
    assert "starting from a fresh state" in capsys.readouterr().out


def test_a_state_file_in_bounds_is_kept_and_its_metrics_hold_numbers_only(tmp_path):
    path = tmp_path / "state.json"
    record = {"bad": 1, "restarts": 2, "after_restart": True, "last_tps": None, "started": time.time() - 5,
              "unit": "rigup-llama@glm-1.service", "unknown": "dropped"}
    path.write_text(json.dumps({"glm-1": record}))
    state = wd.load_state({"state_file": str(path)})
    assert said("kept", state) == {"glm-1": {k: v for k, v in record.items() if k != "unknown"}}
    wd.count(state["glm-1"], "restarts")
    assert state["glm-1"]["restarts"] == 3
    text = wd.metrics_text({"glm-1": {**state["glm-1"], "weird": False}}, {"glm-1": 10},
                           {"maintenance": False, "interval_s": 60, "max_reboots": 1, "reboot": False}, 0.0, {"count": 0})
    assert not [ln for ln in text.splitlines() if ln.endswith((" True", " False", " None"))]


@SETTINGS
@given(value=st.one_of(NUMBERS, JSON), lo=st.sampled_from([0, -5, 1]), hi=st.sampled_from([1, 1e7, 10 ** 12]))
def test_the_watchdogs_number_rule_is_the_boundarys_for_json_values(value, lo, hi):
    try:
        got = wd.figure(value, lo, hi, "x")
    except wd.Unreadable:
        got = None
    expected = None if isinstance(value, str) else number(value, float, lo, hi)
    assert (got is None) == (expected is None)
    assert got is None or (lo <= got <= hi and not isinstance(got, bool) and math.isfinite(got))


@SETTINGS
@given(doc=JSON, text=st.text(max_size=60))
def test_every_watchdog_record_under_any_json_or_text_reads_in_bounds_or_not_at_all(tmp_path, doc, text):
    now = time.time()
    for body in (json.dumps(doc), text):
        (tmp_path / "f.json").write_text(body)
        config = {"gate_record": str(tmp_path / "f.json"), "reboots_file": str(tmp_path / "f.json"),
                  "state_file": str(tmp_path / "f.json"), "max_reboots": 1}
        tps = wd.gate_of({"unit": "f"}, config).get("tps")
        assert tps is None or 0 < tps <= wd.MAX_TPS
        assert 0 <= wd.reboots_today(config)["count"] <= wd.MAX_COUNT
        for record in wd.load_state(config).values():
            for key, value in record.items():
                assert not isinstance(value, float) or math.isfinite(value)
                assert key not in ("passed_at", "started") or value <= now + wd.SKEW_S + 1


@SETTINGS
@given(record=st.dictionaries(FIELDS, NUMBERS | st.text(max_size=30), max_size=6))
def test_a_state_record_of_any_fields_is_in_bounds_or_refused(record):
    try:
        got = wd.state_record("s", record)
    except wd.Unreadable:
        return
    for key in ("bad", "restarts", "escalations", "failed", "unjudged", "command_failures", "failing", "failing_restarts"):
        assert key not in got or (type(got[key]) is int and got[key] >= 0)
    assert got.get("failing_model") is None or (isinstance(got["failing_model"], str) and got["failing_model"].isprintable())
    assert "unit" not in got or got["unit"].startswith("rigup-llama@")
    wd.count(got, "restarts")


@SETTINGS
@given(text=st.one_of(st.text(max_size=80), st.sampled_from([DEEP, "9" * 5000, "[1e400]", "{\"a\": NaN}"])))
def test_the_guards_and_the_fetchers_loads_never_raise(tmp_path, text):
    (tmp_path / "s.json").write_text(text)
    assert guard.load(str(tmp_path / "s.json"), "default") is not None
    fetcher.read_json(str(tmp_path / "s.json"), "default")


WRITERS = {"watchdog": wd.replace, "guard": guard.replace, "fetcher": fetcher.replace}


def test_the_writer_is_one_function_copied_into_each_host_program():
    sources = {name: inspect.getsource(fn) for name, fn in WRITERS.items()}
    assert len(set(sources.values())) == 1, "the three copies of replace() differ"


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_link_planted_at_any_temp_name_is_never_written_through(tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    target = tmp_path / "rigup_x.prom"
    for planted in (f".{target.name}.{os.getpid()}.tmp", f"{target.name}.{os.getpid()}.tmp"):
        os.symlink(victim, tmp_path / planted)
    os.symlink(victim, target)          # the target itself a link: replaced by the rename, not followed
    WRITERS[name](str(target), "# HELP rigup_x\n")
    assert victim.read_text() == "root's file\n" and oct(victim.stat().st_mode & 0o777) == "0o600"
    assert not target.is_symlink() and target.read_text() == "# HELP rigup_x\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    print(f"{name}: the planted links left alone, the target replaced (0o644), the victim untouched")


@SETTINGS
@given(text=st.text(max_size=200), mode=st.sampled_from([0o644, 0o600, None]))
def test_the_writer_round_trips_and_leaves_no_temp_file(tmp_path, text, mode):
    path = tmp_path / "out.json"
    for fn in WRITERS.values():
        fn(str(path), text, mode=mode, fsync=True)
        assert path.read_bytes().decode("utf-8") == text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_write_that_fails_leaves_no_temp_file(tmp_path):
    (tmp_path / "dir").mkdir()
    for fn in WRITERS.values():
        with pytest.raises(OSError):
            fn(str(tmp_path / "dir"), "x")      # the rename over a directory fails
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


@SETTINGS
@given(counts=st.dictionaries(st.sampled_from(["bad", "restarts", "escalations", "failed", "unjudged", "failing",
                                               "failing_restarts"]), st.integers(0, 10 ** 9), max_size=7),
       tps=st.one_of(st.none(), st.floats(0, 1e17)), served=st.one_of(st.none(), st.integers(0, 10 ** 17)),
       ago=st.floats(0, 1e6), flag=st.booleans(),
       model=st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Zs", "Cf", "Co", "Cn")),
                                          max_size=40)))
def test_every_state_the_watchdog_writes_reads_back_whole(tmp_path, counts, tps, served, ago, flag, model):
    record = {**counts, "last_tps": tps, "restart_tps": tps or 0, "served": served, "decodes": served,
              "failing_model": model, "after_restart": flag,
              "starting": int(flag), "unit": "rigup-llama@m-0.service",
              **{k: round(time.time() - ago, 3) for k in ("restarted_at", "escalated_at", "started", "passed_at")}}
    config = {"state_file": str(tmp_path / "s" / "state.json"), "metrics_file": str(tmp_path / "none" / "m.prom")}
    assert wd.save(config, {"m-0": record}, {}, {"count": 0})
    assert wd.load_state(config) == {"m-0": record}
