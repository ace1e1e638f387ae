"""roles/gpu_power/checks.py: power caps, overrides and clock locks, as pure functions (no hosts)."""

from tests.unit.hosts import host, data, only, refusals


def test_1_power_limit_above_the_cards_max_names_the_range():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=300)), "power_range")
    assert "gpu_power_watts 300 W" in r.what
    assert "GPU 0-5 (cmp170hx) accept 100-250 W" in r.why
    assert "set gpu_power_watts between 100 and 250" in r.fix


def test_1_power_limit_below_the_cards_min():
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=150)), "power_range")
    assert "200-700 W" in r.why


def test_1_power_limit_in_range_passes():
    plan, facts = host("cmp170hx")
    assert refusals(plan, facts, data(gpu_power_watts=180)) == []


def test_1_override_out_of_its_cards_range():
    plan, facts = host("cmp170hx")
    uuid = facts["gpus"][2]["uuid"]
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={uuid: 280})), "power_range")
    assert f"gpu_power_overrides.{uuid} 280 W" in r.what
    assert "GPU 2 (cmp170hx, 00000000:0D:00.0) accepts 100-250 W" in r.why


def test_2_override_for_a_uuid_not_on_the_host():
    plan, facts = host("a100")
    bad = "GPU-00000000-dead-beef-0000-000000000000"
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={bad: 300})), "power_override_target")
    assert f"gpu_power_overrides.{bad} names a card that is not on this host" in r.what
    assert "00000000:07:00.0" in r.why and "its 8 GPUs" in r.why


def test_2_override_for_a_bus_id_not_on_the_host():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={"0000:c3:00.0": 150})), "power_override_target")
    assert "0000:c3:00.0" in r.what


def test_2_override_keyed_by_index_is_refused():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={"3": 150})), "power_override_target")
    assert "keyed by a GPU index" in r.what and "reorder between boots" in r.why


def test_2_overrides_by_uuid_any_case_or_bus_id_with_short_domain_pass():
    plan, facts = host("cmp170hx")
    overrides = {facts["gpus"][0]["uuid"].lower(): 150, "0000:0a:00.0": 140, "0D:00.0": 180}
    assert refusals(plan, facts, data(gpu_power_overrides=overrides)) == []


def test_config_override_watts_must_be_int():
    plan, facts = host("cmp170hx")
    uuid = facts["gpus"][0]["uuid"]
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={uuid: "high"})), "config")
    assert r.what == f"gpu_power_overrides.{uuid}"


def test_a_psu_budget_below_the_cards_minimums_is_refused_naming_the_minimum():
    plan, facts = host("a100")
    (r,) = only(refusals(plan, facts, data(gpu_psu_watts=700)), "psu_budget")
    assert "gpu_psu_watts 700 W is below the 800 W this host's cards need" in r.what
    assert "8 card(s) at their minimum limits (800 W)" in r.why and "8 x a100 at 100 W" in r.why
    assert "at least 800" in r.fix
    assert refusals(plan, facts, data(gpu_psu_watts=2000)) == []
    uuid = facts["gpus"][0]["uuid"]
    (r,) = only(refusals(plan, facts, data(gpu_psu_watts=1000, gpu_power_overrides={uuid: 350})), "psu_budget")
    assert "below the 1050 W" in r.what and "1 override(s) (350 W)" in r.why
