"""Issue 62's pulse of a host's power delivery on the controller: its record read whole or refused
(rigup/boundary/burnin.py pulse; Hypothesis), when it is due, runs, waits or refuses the host
(roles/burnin/quarantine.py pulse_part, roles/burnin/checks.py check_pulse), the plan's lines and
the command a converge runs (roles/burnin)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary import Unreadable, burnin
from roles.burnin import pulse_argv
from roles.burnin.checks import check_pulse
from roles.burnin.facts import parse_burnin_state
from roles.burnin.quarantine import lines, sort_cards

U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(3)]
DATA = {"burnin_level": "standard", "burnin_after_change": "quick", "burnin_retest": False, "burnin_clear": [],
        "burnin_pulse": True, "gpu_psu_watts": 1000}
WHERE = "lab1:/var/lib/rigup/burnin-pulse.json"


def gpus(cap=300.0):
    return [{"index": i, "uuid": U[i], "bus_id": f"00000000:0{i}:00.0", "memory_total_mib": 81920,
             "power_limit_w": cap} for i in range(3)]


def record(passed=True, **key):
    return {"schema": 1, "at": 1780000000, "seconds": 33.1, "passed": passed,
            "failed": [] if passed else ["pulse: the host's power delivery did not hold 3 card(s) ...: GPU 1 "
                                         "(00000000:01:00.0) fell off the bus (Xid 79); ... gpu_psu_watts 1000 W)"],
            "key": {"driver": "580.105.08", "cards": U, "caps_w": 900.0, "psu_watts": 1000.0, **key},
            "figures": {"hz": 4, "seconds": 30, "peak_w": 871.5, "caps_w": 900.0, "lost": [], "xids": {}}}


def accepted(i):
    return {"passed": True, "failed": [], "index": i, "bus_id": f"00000000:0{i}:00.0", "level": "standard",
            "at": 1780000000, "key": {"driver": "580.105.08", "memory_mib": 81920, "power_limit_w": 400.0},
            "figures": {"vram": {"mismatches": 0}}}


def state(rec=None, units=(), text=None):
    body = text if text is not None else (json.dumps(rec, indent=1) if rec else "")
    shown = [f"Id={u}\nEnvironment=" for u in units]
    records = json.dumps({u: accepted(i) for i, u in enumerate(U)})
    return parse_burnin_state(["##rigup-burnin:records", "|" + records, "", "##rigup-burnin:pulse",
                               *("|" + ln for ln in body.splitlines()), "", "##rigup-burnin:units", *shown])


def part(rec=None, data=None, units=(), cap=300.0, text=None):
    return sort_cards(gpus(cap), state(rec, units, text), "580.105.08", {**DATA, **(data or {})})


def test_the_pulse_is_due_at_first_sight_and_after_a_change_and_runs_only_where_nothing_serves_or_in_a_roll():
    first = part()
    print(lines(first))
    assert first["pulse"]["run"] and first["pulse"]["due"] == "the host's first pulse" and first["stop"] == []
    assert lines(first)[0] == "burn-in:   pulse of the host's power delivery, 3 card(s) at once (the host's first pulse)"
    held = part(record())
    assert not held["pulse"]["run"] and held["pulse"]["held"]["peak_w"] == 871.5
    assert lines(held) == ["burn-in:   the host's power delivery held its pulse (871.5 W at its peak, caps 900.0 W)"]
    for why, rec, data, cap in (("gpu_psu_watts 1000.0 -> 1200", record(), {"gpu_psu_watts": 1200}, 300.0),
                                ("driver 550.54 -> 580.105.08", record(driver="550.54"), {}, 300.0),
                                ("its cards changed", record(cards=U[:2]), {}, 300.0),
                                ("the cards' caps 900 -> 1050 W", record(), {}, 350.0)):
        got = part(rec, data, cap=cap)["pulse"]
        assert (got["due"], got["run"]) == (why, True), got
    assert not part(record(), cap=250.0)["pulse"]["run"]    # a lower cap was pulsed already
    waits = part(units=["rigup-llama@main.service"])
    assert not waits["pulse"]["run"] and waits["pulse"]["waiting"] == "rigup-llama@main.service"
    assert "pulse due (the host's first pulse) waits: in use by rigup-llama@main.service" in lines(waits)[0]
    rolling = part(units=["rigup-llama@main.service"], data={"rigup_rolling": True})
    assert rolling["pulse"]["run"] and rolling["stop"] == ["rigup-llama@main.service"]
    assert part(data={"burnin_pulse": False})["pulse"] is None


def test_a_failed_pulse_refuses_the_host_with_its_figures_until_a_retest_or_another_psu_budget():
    failed = part(record(passed=False))
    (refused,) = check_pulse({"burnin": failed}, {}, DATA)
    print(refused)
    assert refused.what == "the host's power delivery failed its pulse test (burnin_pulse)"
    assert "fell off the bus (Xid 79)" in refused.why and "gpu_psu_watts 1000 W" in refused.why
    assert "burnin_retest" in refused.fix and "lower gpu_psu_watts" in refused.fix
    assert not failed["pulse"]["run"] and "FAILED its pulse" in lines(failed)[0]
    # the card that fell off is quarantined: the cards changed, and that does not lift the verdict
    assert part(record(passed=False, cards=U))["pulse"]["failed"]
    retest = part(record(passed=False), {"burnin_retest": True})
    assert retest["pulse"]["run"] and check_pulse({"burnin": retest}, {}, DATA) == []
    lower = part(record(passed=False), {"gpu_psu_watts": 800})
    assert lower["pulse"]["run"] and lower["pulse"]["due"] == "gpu_psu_watts 1000.0 -> 800"


def test_a_pulse_record_that_does_not_read_refuses_the_host_naming_it():
    bad = part(text='{"schema": 1, "passed": "yes"}')
    (refused,) = check_pulse({"burnin": bad}, {}, DATA)
    print(refused)
    assert refused.what.startswith("the burn-in pulse record") and "passed" in refused.why and not bad["pulse"]["run"]


def test_the_command_a_converge_runs():
    data = {**DATA, "burnin_pulse_s": 30, "burnin_pulse_hz": 4, "rigup_state_dir": "/var/lib/rigup",
            "gpu_guard_xid_source": "kernel"}
    argv = pulse_argv("/opt/rigup/bin/rigup-burnin", data)
    assert argv[:6] == ["/opt/rigup/bin/rigup-burnin", "pulse", "--seconds", "30", "--hz", "4"]
    assert argv[argv.index("--pulse-results") + 1] == "/var/lib/rigup/burnin-pulse.json" and argv[-2:] == ["--psu-watts", "1000"]


def read_or_refused(text):
    try:
        rec = burnin.pulse(text, WHERE)
    except Unreadable as e:
        assert e.where == WHERE and e.why
        return
    if rec is not None:
        assert isinstance(rec["passed"], bool) and all(isinstance(f, str) for f in rec["failed"])
        assert isinstance(rec["key"]["caps_w"], float) and all(isinstance(c, str) for c in rec["key"]["cards"])
        if rec["passed"] and not rec["untested"]:   # a believed pass: its figures, and no failure named
            assert all(isinstance(rec["figures"][n], float) for n in ("peak_w", "hz", "seconds")) and not rec["failed"]


SCALARS = st.none() | st.booleans() | st.integers(-10, 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=20)


@settings(max_examples=80, deadline=1000)
@given(st.fixed_dictionaries({}, optional={"schema": SCALARS | st.just(1), "passed": SCALARS, "at": SCALARS,
                                           "failed": st.lists(SCALARS, max_size=3) | SCALARS,
                                           "key": st.fixed_dictionaries({}, optional={
                                               "cards": st.lists(st.sampled_from(U) | st.text(max_size=8), max_size=3)
                                               | SCALARS, "caps_w": SCALARS, "psu_watts": SCALARS, "driver": SCALARS})
                                           | SCALARS, "figures": st.dictionaries(st.text(max_size=5), SCALARS) | SCALARS}))
def test_any_pulse_record_is_read_typed_or_refused_naming_where(doc):
    read_or_refused(json.dumps(doc))


@settings(max_examples=60, deadline=1000)
@given(st.text(max_size=200) | st.sampled_from(['{"a": 1, "a": 2}', "[" * 5000, '{"at": NaN}']))
def test_any_text_is_a_pulse_record_or_refused(text):
    read_or_refused(text)


def test_a_good_record_reads_and_each_fault_is_named_by_its_field():
    assert burnin.pulse(json.dumps(record()), WHERE)["key"]["cards"] == U and burnin.pulse("", WHERE) is None
    for field, rec in (("schema", {**record(), "schema": 2}), ("key.cards[0]", record(cards=["../x"])),
                       ("key.caps_w", record(caps_w=-1)), ("passed", {**record(), "passed": 1})):
        with pytest.raises(Unreadable) as e:
            burnin.pulse(json.dumps(rec), WHERE)
        assert e.value.where == WHERE and e.value.why.startswith(field), (field, e.value.why)


def test_a_pass_without_its_figures_or_naming_a_failure_is_not_believed_and_the_pulse_is_due_again():
    """Round 3's P4: ``passed`` with a failure named and no figures was believed (held, never due
    again). Now, as a card's pass: not believed, the pulse due again, naming why."""
    reported = {"schema": 1, "passed": True, "at": 1780000000, "failed": [f"{U[0]} fell off the bus"],
                "key": {"driver": "580.105.08", "cards": U, "caps_w": 900.0, "psu_watts": 1000.0}}
    got = part(reported)["pulse"]
    print(got["due"])
    assert got["run"] and got["held"] is None and "not believed" in got["due"] and "figures" in got["due"]
    for fault, rec in (("failures", {**record(), "failed": ["GPU 1 fell off the bus"]}),
                       ("faults", {**record(), "faults": True}),
                       ("cards off the bus", {**record(), "figures": {**record()["figures"], "lost": [U[1]]}}),
                       ("hung cards", {**record(), "figures": {**record()["figures"], "cards": {U[1]: {"hung": True}}}}),
                       ("a power brake", {**record(), "figures": {**record()["figures"], "brake": 3}}),
                       ("Xids", {**record(), "figures": {**record()["figures"], "xids": {U[1]: [79]}}}),
                       ("figures (peak_w as a pulse runs them)", {**record(), "figures": {**record()["figures"], "peak_w": None}}),
                       # rerun3's NP1: a pulse that held 0 W at 0 Hz for 0 s held nothing
                       ("figures (peak_w, hz, seconds as a pulse runs them)",
                        {**record(), "figures": {**record()["figures"], "peak_w": 0, "hz": 0, "seconds": 0}}),
                       ("figures (seconds as a pulse runs them)", {**record(), "figures": {**record()["figures"], "seconds": 0.0}}),
                       # re-round 6 NB4: 0.001 Hz for 0.001 s is no pulse rigup-burnin runs (1..50 Hz, 1..3600 s)
                       ("figures (hz, seconds as a pulse runs them)",
                        {**record(), "figures": {**record()["figures"], "hz": 0.001, "seconds": 0.001}})):
        got = part(rec)["pulse"]
        assert got["run"] and got["held"] is None and fault in got["due"], (fault, got["due"])
    assert part(record())["pulse"]["due"] is None and burnin.pulse(json.dumps(record()), WHERE)["untested"] is None
    assert burnin.pulse(json.dumps(record(passed=False)), WHERE)["untested"] is None   # a failure is believed as it is
