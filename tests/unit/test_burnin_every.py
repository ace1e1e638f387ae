"""Issue 65's re-acceptance on a schedule (burnin_every_days): a card whose last passing run is
older is due (the plan, status.py), tested again at burnin_level where nothing serves from it or
in a roll, and its record keeps the runs before (roles/burnin/shipped/acceptance.py history)."""

import json
import time

from hypothesis import given, settings, strategies as st

from plays import fleet
from rigup.boundary import burnin
from roles.burnin.shipped.acceptance import HISTORY, history
from roles.burnin.facts import parse_burnin_state
from roles.burnin.quarantine import lines, sort_cards

U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(2)]
NOW = time.time()
DATA = {"burnin_level": "standard", "burnin_after_change": "quick", "burnin_retest": False, "burnin_clear": [],
        "burnin_every_days": 28}


def rec(i, days_ago, passed=True):
    return {"passed": passed, "failed": [] if passed else ["VRAM: 3 mismatched words"], "index": i,
            "bus_id": f"00000000:0{i}:00.0", "level": "standard", "at": NOW - days_ago * 86400,
            "key": {"driver": "580.105.08", "memory_mib": 81920, "power_limit_w": 400.0},
            "figures": {"vram": {"mismatches": 0 if passed else 3}}}


def gpus():
    return [{"index": i, "uuid": U[i], "bus_id": f"00000000:0{i}:00.0", "memory_total_mib": 81920,
             "power_limit_w": 400.0} for i in range(2)]


def state(records, units=()):
    return parse_burnin_state(["##rigup-burnin:records", "|" + json.dumps(records), "", "##rigup-burnin:units",
                               *[f"Id={u}\nEnvironment=" for u in units]])


def test_a_card_past_burnin_every_days_is_due_and_runs_where_idle_or_in_a_roll():
    records = {U[0]: rec(0, 30), U[1]: rec(1, 3)}
    part = sort_cards(gpus(), state(records), "580.105.08", DATA, now=NOW)
    print(lines(part))
    assert part["run"] == {"standard": [U[0]]}
    assert part["why"][U[0]] == "re-acceptance: its last run was 30 days ago (burnin_every_days 28)"
    assert part["accepted"] == 2    # it serves meanwhile
    held = sort_cards(gpus(), state(records, ["rigup-llama@main.service"]), "580.105.08", DATA, now=NOW)
    assert held["run"] == {} and "re-acceptance: its last run was 30 days ago" in held["waiting"][0]["why"]
    rolled = sort_cards(gpus(), state(records, ["rigup-llama@main.service"]), "580.105.08",
                        {**DATA, "rigup_rolling": True}, now=NOW)
    assert rolled["run"] == {"standard": [U[0]]} and rolled["stop"] == ["rigup-llama@main.service"]
    assert sort_cards(gpus(), state(records), "580.105.08", {**DATA, "burnin_every_days": None}, now=NOW)["run"] == {}


def test_a_new_record_keeps_the_runs_before_it_bounded_and_readable():
    first = rec(0, 30)
    second = {**rec(0, 0, passed=False), "history": history(first)}
    third = {**rec(0, 0), "history": history(second)}
    print(third["history"])
    assert [h["passed"] for h in third["history"]] == [False, True]
    assert third["history"][0]["failed"] == ["VRAM: 3 mismatched words"] and third["history"][1]["at"] == first["at"]
    many = first
    for _ in range(20):
        many = {**rec(0, 0), "history": history(many)}
    assert len(many["history"]) == HISTORY and history(None) == [] and history({"x": 1}) == []
    read = burnin.records(json.dumps({U[0]: third}), "lab1:burnin.json")
    assert read.cards[U[0]]["history"][0]["passed"] is False


def test_status_names_a_due_card():
    records = {U[0]: rec(0, 30), U[1]: rec(1, 3)}
    lines_ = ["|" + json.dumps(records)]
    part = fleet.burnin_part("lab1", {"burnin": lines_}, "/var/lib/rigup/burnin.json", every_days=28)
    assert part["burnin_due"] == {"0000:00:00": {"index": 0, "days": 30, "every": 28}}
    row = {"cards": [{"index": 0, "bus": next(iter(part["burnin_due"])), "draw_w": 60, "temp_c": 30}],
           "guard": {"xid": {}}, "lost_cards": [], **part}
    (card,) = fleet.attention_cards(row)
    print(card)
    assert card["problems"] == [("DUE", "burn-in DUE: its last run was 30 days ago (burnin_every_days 28); "
                                        "a roll tests it again")]
    assert fleet.burnin_part("lab1", {"burnin": lines_}, "/x", every_days=None)["burnin_due"] == {}


def test_a_pass_dated_in_the_future_is_due_now_in_the_plan_and_in_status():
    """Round 3's B16: a pass whose time is after now (2099: a host's clock ahead, or a hand edit) was
    never due again; beyond a day of clock skew it is no past run: due now, in both callers of the
    one rule (rigup.boundary.burnin.due)."""
    future = {**rec(0, 0), "at": 4102000000}
    skewed = {**rec(1, 0), "at": NOW + 3600}             # an hour ahead: within the skew, a run of today
    part = sort_cards(gpus(), state({U[0]: future, U[1]: skewed}), "580.105.08", DATA, now=NOW)
    assert part["run"] == {"standard": [U[0]]} and "dated" in part["why"][U[0]] and "in the future" in part["why"][U[0]]
    status = fleet.burnin_part("lab1", {"burnin": ["|" + json.dumps({U[0]: future, U[1]: skewed})]}, "/x", every_days=28)
    assert list(status["burnin_due"]) == ["0000:00:00"] and status["burnin_due"]["0000:00:00"]["days"] < 0
    assert burnin.due(future, None, NOW) is None and burnin.due({**future, "passed": False}, 28, NOW) is None


def test_the_plan_and_status_share_one_due_rule():
    """Issue 65: roles/burnin/quarantine.py overdue and plays/fleet.py _due call
    rigup.boundary.burnin.due and agree on every age (before, at and after the limit, and ahead)."""
    for days in (-2, -1.1, -0.5, 0, 27.9, 28.1, 30, 400):   # status reads the clock itself: no edge to the second
        r = {**rec(0, days)}
        plan = sort_cards(gpus()[:1], state({U[0]: r}), "580.105.08", DATA, now=NOW)["run"] != {}
        shown = bool(fleet.burnin_part("lab1", {"burnin": ["|" + json.dumps({U[0]: r})]}, "/x", every_days=28)["burnin_due"])
        assert plan == shown == (burnin.due(r, 28, NOW) is not None), days
    import inspect
    from roles.burnin import quarantine
    assert "burnin.due(" in inspect.getsource(quarantine.overdue) and "burnin.due(" in inspect.getsource(fleet._due)



@settings(max_examples=300, deadline=1000)
@given(at=st.one_of(st.floats(0, burnin.AT_MAX), st.integers(0, burnin.AT_MAX), st.booleans(), st.none(), st.text(max_size=5)),
       now=st.floats(1e9, 4e9), every=st.one_of(st.none(), st.integers(1, 400)), passed=st.sampled_from([True, False, None]))
def test_the_due_rule_is_a_past_run_older_than_every_days_or_none_at_all(at, now, every, passed):
    """rigup.boundary.burnin.due over any time: due exactly when a believed pass's number time is
    older than ``every`` days, or after now beyond the skew; never raises."""
    got = burnin.due({"passed": passed, "at": at}, every, now)
    number = isinstance(at, (int, float)) and not isinstance(at, bool)
    want = bool(every) and passed is True and number and (at > now + burnin.SKEW_S or now - at > every * burnin.DAY_S)
    assert (got is not None) == want
    assert got is None or (isinstance(got[0], int) and got[1].startswith("re-acceptance: "))
