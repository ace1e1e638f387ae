"""The GPU guard's round 5 cases (issue 61): its samples, its trip's record and its own config read
as the check needs them (roles/gpu_guard/shipped/guard.py, a host program)."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings, strategies as st

from roles.gpu_guard.shipped import guard
from roles.gpu_guard.shipped.guard import evaluate, keep, parse_sample, samples_of


def test_two_rows_of_one_uuid_are_lost_telemetry_never_averaged():
    """B4: a 700 W card and a 100 W one printing one UUID were averaged to 400 W under a 650 W limit."""
    cards, lost = parse_sample(["0, GPU-1, 00000000:01:00.0, 0x233510DE, 700, 700, 50",
                                "1, GPU-1, 00000000:02:00.0, 0x233510DE, 100, 700, 50"])
    now = time.time()
    why = evaluate([{"t": now - 40, "cards": cards, "lost": lost}, {"t": now, "cards": cards, "lost": lost}],
                   {"default": {"draw_w": 650}, "window_s": 60}, now)
    print("verdict:", why)
    assert [c["index"] for c in cards] == [0] and "repeats the UUID" in lost[0]
    assert "telemetry lost" in why and "average draw 700.0 W" in why
    _, lost = parse_sample(["0, GPU-1, 00000000:01:00.0, 0x233510DE, 70, 700, 50",    # one bus id, two UUIDs
                            "1, GPU-2, 0000:01:00.0, 0x233510DE, 70, 700, 50"])
    assert len(lost) == 1


def test_a_set_aside_card_with_an_unreadable_draw_in_a_kept_sample_is_no_crash():
    """B5: sum([None, 300.0]) raised TypeError, check() ended before SAMPLES was saved, at every check."""
    now = time.time()
    before, lost = parse_sample(["0, GPU-a, 00000000:01:00.0, 0x233510DE, [N/A], 700, 50"])
    saved = samples_of([{"t": now - 10, "cards": before, "lost": lost, "bad": None}])
    cards, lost = parse_sample(["0, GPU-a, 00000000:01:00.0, 0x233510DE, 300, 700, 50"], 0, ("0000:01:00.0",))
    why = evaluate(saved + [{"t": now, "cards": cards, "lost": lost}],
                   {"default": {"draw_w": 650}, "window_s": 60, "psu_watts": 200}, now)
    print("verdict:", why)
    assert "300.0 W" in why   # judged on its readable draw: above the 200 W supply


@settings(max_examples=100, deadline=None)
@given(ahead=st.floats(guard.CLOCK_SKEW_S + 0.001, 1e12), window=st.integers(1, 3600))
def test_a_sample_dated_after_now_is_neither_kept_nor_judged(ahead, window):
    """B14: a sample at now + 1e9 s was kept by keep() and judged in every window for 31 years."""
    now = 1_700_000_000.0
    hist = samples_of([{"t": now + ahead, "cards": [{"uuid": "GPU-1", "draw": 4999.0}], "lost": [], "bad": "x"}])
    config = {"window_s": window, "default": {"draw_w": 650}}
    assert keep(hist, config, now) == []
    assert evaluate(hist + [{"t": now, "cards": [], "lost": []}], config, now) is None
    assert len(keep(samples_of([{"t": now + guard.CLOCK_SKEW_S / 2, "cards": [], "lost": []}]), config, now)) == 1


def test_a_trips_end_starts_only_serving_units_whatever_its_record_names(monkeypatch):
    """B8: a record's stopped ["ssh.service", "debug-shell.service"] were started at the trip's end."""
    monkeypatch.setattr(guard, "run_bounded", lambda argv, t: (1, ""))   # no systemctl here
    record = guard.tripped_of({"reason": "x", "stopped": ["ssh.service", "debug-shell.service", "rigup-llama@*",
                                                          "rigup-llama@a.service", "rigup-vllm@b.service", 5]})
    started = guard.resumed({"units": ["rigup-llama@*", "rigup-vllm@*"]}, record)
    print("started:", started)
    assert started == ["rigup-llama@a.service", "rigup-vllm@b.service"]


def test_a_config_without_its_state_files_is_one_line_and_exit_1(tmp_path, capsys):
    """B17: a config lacking tripped_file ended status, clear and check in a KeyError traceback."""
    good = {"tripped_file": f"{tmp_path}/t.json", "samples_file": f"{tmp_path}/s.json"}
    for config in ({"samples_file": f"{tmp_path}/s.json"}, {**good, "tripped_file": 5}, {**good, "samples_file": "s"},
                   {**good, "xid": {"reboot": True, "state_file": f"{tmp_path}/x.json"}}, {**good, "xid": {}},
                   {**good, "xid": []}, []):
        path = tmp_path / "guard.json"
        path.write_text(json.dumps(config))
        for command in ("status", "clear", "check"):
            assert guard.main(["--config", str(path), command]) == 1
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "cannot read" in err, err
    print("refused:", err.strip())
    assert guard.config_problem(good) is None
