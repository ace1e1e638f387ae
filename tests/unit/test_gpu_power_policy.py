"""Pure parts of gpu_power (policy), gpu_guard (the guard's parsing and decision) and
cmpunlocker (its steps), on fixtures and hand-made values: no hosts."""

from pathlib import Path

import pytest

from roles.cmpunlocker.steps import config_problems, installer_args, next_step, verify
from rigup.gpu.facts import parse_gpus
from roles.gpu_guard import guard_config
from roles.gpu_guard.checks import threshold_problems
from roles.gpu_guard.shipped.guard import evaluate, parse_sample
from roles.gpu_power.facts import parse_applied
from roles.gpu_power.policy import card_named, commands, config_lines, format_plan, parse_clocks, power_plan
from rigup.config import group_vars

FIX = Path(__file__).resolve().parents[1] / "fixtures"
A100 = parse_gpus((FIX / "facts/a100-query-nounits.csv").read_text().splitlines())
CMP_LOCKED = parse_gpus((FIX / "facts/cmp170hx-locked-query-nounits.csv").read_text().splitlines())
CMP_UNLOCKED = parse_gpus((FIX / "facts/cmp170hx-unlocked-query-nounits.csv").read_text().splitlines())
H200 = parse_gpus((FIX / "h200/h200-query-nounits.csv").read_text().splitlines())


def test_cards_are_named_by_uuid_or_bus_id_never_index():
    assert card_named(A100[3]["uuid"].lower(), A100) is A100[3]
    assert card_named("0000:" + A100[5]["bus_id"].split(":", 1)[1].lower(), A100) is A100[5]
    assert card_named("3", A100) is None


def test_plan_sets_only_what_differs_with_overrides_winning():
    plan = power_plan(A100, 200, {A100[2]["uuid"]: 150}, persistence=True)
    assert plan["problems"] == []
    rows = {r["uuid"]: r for r in plan["cards"]}
    assert rows[A100[2]["uuid"]]["want_watts"] == 150
    assert rows[A100[0]["uuid"]]["change"] == ["power limit 400 -> 200 W", "persistence mode -> on"]
    argv = commands(plan)
    assert ["nvidia-smi", "-i", A100[2]["uuid"], "-pl", "150"] in argv
    assert all(a[1] == "-i" and a[2].startswith("GPU-") for a in argv)      # never a bare -pl
    same = [dict(g, power_limit_w=200.0, persistence=True) for g in A100]
    assert all(r["change"] == [] for r in power_plan(same, 200)["cards"])


def test_out_of_range_and_unknown_cards_are_problems_not_changes():
    plan = power_plan(A100, 450, {"GPU-00000000-0000-0000-0000-000000000000": 200, "0": 150})
    text = " ".join(plan["problems"])
    assert "gpu_power_watts: 450 W is outside GPU 0" in text and "range 100-400 W" in text
    assert "no card on this host has that UUID" in text and "keyed by a GPU index" in text
    assert "refused:" in format_plan(plan) and "(none, while refused)" in format_plan(plan)


def test_config_lines_by_uuid_and_clock_locks_by_class():
    plan = power_plan(CMP_LOCKED, 180, {}, {"cmp170hx": "1410,1410"}, True, lambda g: "cmp170hx")
    conf = config_lines(plan)
    lines = [ln for ln in conf.splitlines() if not ln.startswith("#")]
    assert len(lines) == 6 and all(ln.endswith(" 180 1410,1410 1") for ln in lines)
    assert lines == sorted(lines)
    applied = parse_applied(conf)
    again = power_plan([dict(g, power_limit_w=180.0, persistence=True) for g in CMP_LOCKED], 180, {},
                       {"cmp170hx": "1410,1410"}, True, lambda g: "cmp170hx", applied)
    assert all(r["change"] == [] for r in again["cards"])
    capped = [dict(g, power_limit_w=180.0) for g in CMP_LOCKED]
    released = power_plan(capped, None, {}, {}, False, lambda g: "cmp170hx", applied)
    default = CMP_LOCKED[0]["power_default_w"]
    assert all(r["change"] == [f"power limit 180 -> default {default:g} W (no longer in the policy)",
                               "reset GPU clocks (locked at 1410,1410 MHz, no longer in the policy)"]
               for r in released["cards"])
    assert commands(released)[:2] == [["nvidia-smi", "-i", CMP_LOCKED[0]["uuid"], "-pl", f"{default:g}"],
                                      ["nvidia-smi", "-i", CMP_LOCKED[0]["uuid"], "-rgc"]]
    at_default = [dict(g, power_limit_w=g["power_default_w"]) for g in CMP_LOCKED]
    assert all(r["change"] == [] for r in power_plan(at_default, None, {}, {}, False, lambda g: "cmp170hx")["cards"])
    assert parse_clocks("1410,210") is None
    assert "gpu_power_clocks.cmp170hx" in power_plan(CMP_LOCKED, None, {}, {"cmp170hx": "fast"})["problems"][0]


def test_plan_of_the_real_h200_capture():
    text = format_plan(power_plan(H200, None))
    assert "limit 700 W (min 200, max 700, default 700), persistence on" in text
    assert "leave the limit as it is" in text and "0 change(s) would be made" in text


# ----------------------------------------------------------------------------- guard
def sample(t, draw, temp=40, lost=()):
    line = f"0, GPU-a, 00000000:07:00.0, 0x20C210DE, {draw}, 180.00, {temp}"
    cards, problems = parse_sample([line, *lost])
    return {"t": t, "cards": cards, "lost": problems}


CONFIG = {"window_s": 10, "by_pci_id": {"10de:20c2": {"class": "cmp170hx", "draw_w": 200, "temp_c": 72}},
          "default": {"temp_c": 85}}


def test_guard_trips_on_a_sustained_average_not_a_peak():
    peak = [sample(0, 100), sample(2, 360), sample(4, 100), sample(6, 100)]
    assert evaluate(peak, CONFIG, 6) is None
    sustained = [sample(t, 230) for t in (0, 2, 4, 6)]
    assert "average draw 230.0 W over 6 s (4 samples) > 200 W" in evaluate(sustained, CONFIG, 6)
    assert evaluate(sustained[:2], CONFIG, 2) is None                     # less than half the window


def test_guard_trips_when_the_cards_draws_sum_above_the_psu_budget():
    def two(t, a, b):
        lines = [f"0, GPU-a, 00000000:07:00.0, 0x20C210DE, {a}, 180.00, 40",
                 f"1, GPU-b, 00000000:08:00.0, 0x20C210DE, {b}, 180.00, 40"]
        return {"t": t, "cards": parse_sample(lines)[0], "lost": []}
    config = {**CONFIG, "psu_watts": 300}
    within = [two(t, 140, 150) for t in (0, 2, 4, 6)]       # each under its 200 W, 290 W in all
    assert evaluate(within, config, 6) is None
    over = [two(t, 170, 160) for t in (0, 2, 4, 6)]
    why = evaluate(over, config, 6)
    assert why == "the 2 cards' average draws sum to 330.0 W over 6 s > the power supply's budget 300 W (gpu_psu_watts)"
    assert evaluate(over, CONFIG, 6) is None                 # no budget: each card is judged alone
    assert "psu_watts" not in guard_config(group_vars("all")) and guard_config(
        {**group_vars("all"), "gpu_psu_watts": 2000})["psu_watts"] == 2000


def test_guard_trips_on_temperature_and_lost_telemetry():
    assert "temperature 80 C > 72 C" in evaluate([sample(0, 100, 80)], CONFIG, 0)
    lost = sample(0, 100, lost=["Unable to determine the device handle for GPU0000:0A:00.0: Unknown Error"])
    assert evaluate([lost], CONFIG, 0).startswith("telemetry lost: Unable to determine")
    assert evaluate([{"t": 0, **dict(zip(("cards", "lost"), parse_sample(["x"], 9)))}], CONFIG, 0) \
        .startswith("telemetry lost:")
    na = parse_sample(["0, GPU-a, 00000000:07:00.0, 0x20C210DE, [N/A], 180.00, 40"])
    assert "reads power.draw [N/A]" in na[1][0]


def test_guard_thresholds_by_class_with_group_overrides():
    data = {**group_vars("all"), "gpu_guard_thresholds": {"cmp170hx": {"draw_w": 190}}}
    conf = guard_config(data)
    assert conf["by_pci_id"]["10de:20c2"] == {"class": "cmp170hx", "draw_w": 190, "temp_c": 72}
    assert conf["by_pci_id"]["10de:2335"]["draw_w"] == 735
    assert conf["tripped_file"] == "/var/lib/rigup/gpu-guard.tripped"
    assert threshold_problems({"cmp170": {}, "a100": {"watts": 1, "temp_c": "hot"}}) == [
        ("gpu_guard_thresholds.cmp170", "not a card class of rigup/gpu/catalogue.yml (its classes: "
         + ", ".join(sorted({"a10", "a100", "b200", "cmp170hx", "h100", "h200", "l4", "rtx3090", "rtx4090",
                             "rtx5090"})) + ")"),
        ("gpu_guard_thresholds.a100.watts", "unknown key; known keys: draw_w, temp_c"),
        ("gpu_guard_thresholds.a100.temp_c", "expected a number 0..2000 or null, got 'hot'")]


# ----------------------------------------------------------------------------- cmpunlocker
DATA = {**group_vars("all"), "cmpunlocker_enabled": True, "cmpunlocker_source": "http://x/c.git",
        "cmpunlocker_version": "a" * 40}
UNLOCKER = "/lib/modules/6.1/updates/cmpunlocker/nvidia.ko"


def test_installer_args_and_source_checks():
    assert installer_args({**DATA, "cmpunlocker_iommu": False, "cmpunlocker_gen2_service": False}) == \
        ["--profile=8gb", "--no-iommu", "--no-gen2-service"]
    assert config_problems(DATA) == []
    assert [k for k, _ in config_problems({**DATA, "cmpunlocker_version": "main"})] == ["cmpunlocker_version"]
    keys = [k for k, _ in config_problems({**DATA, "cmpunlocker_source": None, "cmpunlocker_version": None,
                                           "cmpunlocker_archive": "/nonexistent.tgz",
                                           "cmpunlocker_archive_sha256": "b" * 64})]
    assert keys == ["cmpunlocker_archive"]


@pytest.mark.parametrize("stamp,boot,gpus,module,step", [
    (None, "b1", CMP_LOCKED, None, "install"),
    ({"state": "installed", "source": "a" * 40, "args": ["--profile=8gb"], "boot_id": "b1"}, "b1", CMP_LOCKED, None,
     "pending"),
    ({"state": "installed", "source": "a" * 40, "args": ["--profile=8gb"], "boot_id": "b1"}, "b2", CMP_UNLOCKED,
     UNLOCKER, "verified-now"),
    ({"state": "installed", "source": "a" * 40, "args": ["--profile=8gb"], "boot_id": "b1"}, "b2", CMP_UNLOCKED,
     "/lib/modules/6.1/updates/dkms/nvidia.ko", "verify-failed"),
    ({"state": "verified", "source": "a" * 40, "args": ["--profile=8gb"], "boot_id": "b1"}, "b2", CMP_UNLOCKED,
     UNLOCKER, "nothing"),
    ({"state": "verified", "source": "b" * 40, "args": ["--profile=8gb"], "boot_id": "b1"}, "b2", CMP_UNLOCKED,
     UNLOCKER, "install"),
])
def test_next_step(stamp, boot, gpus, module, step):
    gpus = [dict(g, pcie_gen=2) if g["memory_total_mib"] == 65536 else g for g in gpus]
    assert next_step({"stamp": stamp, "boot_id": boot, "gpus": gpus, "module": module}, DATA)[0] == step


def test_rollback_steps_and_verify_problems():
    data = {**DATA, "cmpunlocker_rollback": True}
    installed = {"state": "verified", "boot_id": "b1"}
    assert next_step({"stamp": installed, "boot_id": "b1", "gpus": CMP_UNLOCKED}, data)[0] == "rollback"
    back = {"state": "rolled-back", "boot_id": "b2"}
    assert next_step({"stamp": back, "boot_id": "b2", "gpus": CMP_UNLOCKED}, data)[0] == "rollback-pending"
    assert next_step({"stamp": back, "boot_id": "b3", "gpus": CMP_LOCKED}, data)[0] == "stock-now"
    locked, problems = verify(CMP_UNLOCKED, UNLOCKER, DATA)          # the fixture's link is Gen1
    assert not locked and "PCIe link Gen1, expected Gen2" in problems[0]
    assert verify(CMP_UNLOCKED, UNLOCKER, {**DATA, "cmpunlocker_gen2_service": False}) == (False, [])


def test_a_psu_budget_is_shared_within_each_cards_range():
    plan = power_plan(A100, None, psu_watts=2000)
    assert [r["want_watts"] for r in plan["cards"]] == [250] * 8 and {r["source"] for r in plan["cards"]} == {"gpu_psu_watts"}
    assert "power limit 400 -> 250 W" in plan["cards"][0]["change"]
    assert [r["want_watts"] for r in power_plan(A100, None, psu_watts=5000)["cards"]] == [400] * 8   # each at its max
    assert [r["want_watts"] for r in power_plan(A100, 180, psu_watts=2000)["cards"]] == [180] * 8    # gpu_power_watts: the ceiling
    over = power_plan(A100, None, {A100[0]["uuid"]: 390}, psu_watts=2000)
    assert [r["want_watts"] for r in over["cards"]] == [390] + [230] * 7 and over["problems"] == []
    short = power_plan(A100, None, psu_watts=700)
    assert short["problems"] == ["gpu_psu_watts 700 W is below the 800 W this host's cards need: "
                                 "8 card(s) at their minimum limits (800 W)"]
    mixed = [dict(A100[0], power_min_w=200.0, power_max_w=700.0), dict(A100[1], power_min_w=100.0, power_max_w=250.0)]
    assert [r["want_watts"] for r in power_plan(mixed, None, psu_watts=320)["cards"]] == [200, 120]
    assert [r["want_watts"] for r in power_plan(mixed, None, psu_watts=900)["cards"]] == [650, 250]
