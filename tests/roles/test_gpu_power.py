"""roles/gpu_power on the lab's a100 hosts: limits by UUID and bus id, refused values, the boot
unit before serving after a reboot, never a bare -pl, and plan mode."""

import re

import pytest

from rigup.gpu.facts import GPU_QUERY
from tests.conftest import on_host
from tests.roles.power_lab import calls, cards, data, install_serving_unit, play

pytestmark = pytest.mark.lab
SETTERS = ("-pl", "--power-limit", "-pm", "--persistence-mode", "-lgc", "--lock-gpu-clocks", "-rgc",
           "--reset-gpu-clocks")


# nvidia-smi calls on a host before this module's first play (another module's test may have set
# a limit by hand, as tests/test_lab.py's reboot test does): not rigup's
BEFORE: dict[str, int] = {}


@pytest.fixture(scope="module")
def host(lab):
    name = lab.hosts()[0]["name"]
    BEFORE[name] = len(calls(lab, name))
    first = play(name)        # base, and the power unit with no cap (persistence only)
    assert "GPU power limits by UUID" in first.output
    install_serving_unit(lab, name)
    return name


@pytest.fixture(scope="module")
def policy(lab, host):
    """gpu_power_watts 200 for the group, card 3 by UUID at 150 W, card 5 by bus id at 120 W."""
    c = cards(lab, host)
    bus = "0000:" + c[5]["bus_id"].split(":", 1)[1].lower()          # short domain, lower case
    return {"gpu_power_watts": 200, "gpu_power_overrides": {c[3]["uuid"]: 150, bus: 120},
            "expected": {**{x["uuid"]: "200.00" for x in c}, c[3]["uuid"]: "150.00", c[5]["uuid"]: "120.00"}}


@pytest.fixture
def applied(lab, host, policy):
    """The policy's limits on the cards (what test_policy_by_uuid_and_bus_id_applies_and_reads_back
    leaves): applied here, so that a test asserting on top of them passes alone too."""
    if {c["uuid"]: c["limit"] for c in cards(lab, host)} != policy["expected"]:
        play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=policy["gpu_power_overrides"]))
    return policy


def snapshot(lab, host):
    return on_host(lab, host, "nvidia-smi --query-gpu=uuid,power.limit,persistence_mode --format=csv,noheader; "
                              "cat /etc/rigup/gpu-power.conf 2>&1")


def test_out_of_range_watts_are_refused_and_nothing_changes(lab, host):
    before, n_calls = snapshot(lab, host), len(calls(lab, host))
    run = play(host, *data(gpu_power_watts=450), check=False)
    assert run.returncode != 0
    assert f"[{host}] refused: gpu_power_watts 450 W is outside the power range of this host's cards: " \
           "GPU 0-7 (a100) accept 100-400 W" in run.output
    c = cards(lab, host)
    run = play(host, *data(gpu_power_overrides={c[2]["uuid"]: 60}), check=False)
    assert run.returncode != 0 and f"gpu_power_overrides.{c[2]['uuid']} 60 W is outside its card's power range" \
        in run.output
    assert snapshot(lab, host) == before
    setters = [a for a in calls(lab, host)[n_calls:] if set(a) & set(SETTERS)]
    assert setters == []


def test_a_psu_budget_gives_each_card_its_share_and_one_too_small_is_refused(lab, host):
    """gpu_psu_watts 700 on 8 A100s (100-400 W each) is refused before any change, naming the 800 W
    they need; 2000 gives each card 250 W, and again changes nothing."""
    before, n_calls = snapshot(lab, host), len(calls(lab, host))
    short = play(host, *data(gpu_psu_watts=700), check=False)
    # the refusal's own line (preflight's power plan lines name the problem too: "[lab1] power: refused: ...")
    said = [ln.strip() for ln in short.output.splitlines() if f"[{host}] refused: gpu_psu_watts" in ln]
    print("\n" + "\n".join(said))
    assert short.returncode != 0 and said and "gpu_psu_watts 700 W is below the 800 W this host's cards need" in said[0]
    assert "fix: set gpu_psu_watts to at least 800" in said[0]
    assert snapshot(lab, host) == before and not [a for a in calls(lab, host)[n_calls:] if set(a) & set(SETTERS)]
    run = play(host, *data(gpu_psu_watts=2000))
    got = {c["uuid"]: c["limit"] for c in cards(lab, host)}
    print(f"gpu_psu_watts 2000: limits {sorted(set(got.values()))} on {len(got)} cards")
    assert len(got) == 8 and set(got.values()) == {"250.00"}, got
    again = play(host, *data(gpu_psu_watts=2000))
    assert again.totals["changed"] == 0, again.changed_operations()


def test_policy_by_uuid_and_bus_id_applies_and_reads_back(lab, host, policy):
    run = play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=policy["gpu_power_overrides"]))
    assert "gpu_power | GPU power limits by UUID (set what differs, read back)" in run.changed_operations()
    got = {c["uuid"]: c["limit"] for c in cards(lab, host)}
    assert got == policy["expected"]
    assert all(c["persistence"] == "Enabled" for c in cards(lab, host))
    journal = on_host(lab, host, "journalctl -u rigup-gpu-power -o cat --no-pager")
    assert "rigup-gpu-power: applied: 8 card(s) verified" in journal
    n = len(calls(lab, host))
    again = play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=policy["gpu_power_overrides"]))
    assert again.totals["changed"] == 0, again.changed_operations()
    # preflight's read of the cards serves gpu_power too: nvidia-smi starts once (seconds each on
    # cards without persistence)
    queries = [a for a in calls(lab, host)[n:]     # the hardware read's (with the fabric's fields), not the guard's
               if any(x.startswith(f"--query-gpu={GPU_QUERY}") for x in a)]
    print(f"nvidia-smi card queries in a converge with nothing to do: {len(queries)}")
    assert len(queries) == 1, queries


def test_only_cards_that_differ_are_set(lab, host, policy):
    c = cards(lab, host)
    overrides = {**policy["gpu_power_overrides"], c[3]["uuid"]: 175}
    n = len(calls(lab, host))
    play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=overrides))
    set_pl = [a for a in calls(lab, host)[n:] if "-pl" in a]
    assert set_pl == [["-i", c[3]["uuid"], "-pl", "175"]]
    play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=policy["gpu_power_overrides"]))


def sm_clocks(lab, host):
    return on_host(lab, host, "nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits").split()


LOCK = {"a100": "1200,1275"}


@pytest.fixture(scope="module")
def rebooted(lab, host, policy):
    """The policy's limits on the cards, then clocks locked by class (gpu_power_clocks) on top of
    them, then one reboot: what the locking plays did, and what the host showed after the reboot.
    One reboot serves both the clock-lock test and the after-reboot test (a boot takes its time)."""
    limits = {"gpu_power_watts": policy["gpu_power_watts"], "gpu_power_overrides": policy["gpu_power_overrides"]}
    if {c["uuid"]: c["limit"] for c in cards(lab, host)} != policy["expected"]:
        play(host, *data(**limits))
    locked = data(**limits, gpu_power_clocks=LOCK)
    n = len(calls(lab, host))
    run = play(host, *locked)
    seen = {"limits": limits, "locked": locked, "run": run, "calls": calls(lab, host)[n:],
            "clocks": sm_clocks(lab, host), "again": play(host, *locked)}
    lab.reboot(host)                                                        # the driver forgets limits and locks
    seen["after"] = {
        "clocks": sm_clocks(lab, host),
        "power journal": on_host(lab, host, "journalctl -b -u rigup-gpu-power -o cat"),
        "limits": {c["uuid"]: c["limit"] for c in cards(lab, host)},
        "journal": on_host(lab, host, "journalctl -b -o short-monotonic --no-pager "
                                      "-u rigup-gpu-power.service -u rigup-llama@test.service").splitlines(),
        "serving": on_host(lab, host, "systemctl is-active rigup-llama@test.service").strip()}
    return seen


def test_clock_locks_by_class_hold_through_a_reboot_and_are_released(lab, host, rebooted):
    limits, locked, run, after = rebooted["limits"], rebooted["locked"], rebooted["run"], rebooted["after"]
    uuids = sorted(c["uuid"] for c in cards(lab, host))
    assert "gpu_power | GPU power limits by UUID (set what differs, read back)" in run.changed_operations()
    assert sorted(a for a in rebooted["calls"] if "-lgc" in a) == [["-i", u, "-lgc", "1200,1275"] for u in uuids]
    assert [a for a in rebooted["calls"] if "-pl" in a] == []              # the limits were right already
    assert rebooted["clocks"] == ["1275"] * 8
    assert rebooted["again"].totals["changed"] == 0

    # after the reboot (the driver forgot the locks)
    assert after["clocks"] == ["1275"] * 8                                 # the boot unit locked them again
    assert "GPU clocks locked at 1200,1275 MHz" in after["power journal"]
    assert play(host, *locked).totals["changed"] == 0

    n = len(calls(lab, host))
    released = play(host, *data(**limits))                                 # the lock leaves the policy
    assert "gpu_power | GPU power limits by UUID (set what differs, read back)" in released.changed_operations()
    assert sorted(a for a in calls(lab, host)[n:] if "-rgc" in a) == [["-i", u, "-rgc"] for u in uuids]
    assert sm_clocks(lab, host) == ["210"] * 8
    assert "GPU clocks reset (were locked at 1200,1275 MHz)" in on_host(lab, host, "journalctl -u rigup-gpu-power -o cat")
    assert play(host, *data(**limits)).totals["changed"] == 0


def test_a_cap_that_leaves_the_policy_goes_back_to_the_card_default(lab, host, policy):
    c = cards(lab, host)
    bus5 = next(k for k in policy["gpu_power_overrides"] if ":" in k)
    only5 = data(gpu_power_overrides={bus5: 120})                          # no group cap, no card-3 override
    run = play(host, *only5)
    assert "gpu_power | GPU power limits by UUID (set what differs, read back)" in run.changed_operations()
    assert {x["uuid"]: x["limit"] for x in cards(lab, host)} == {**{x["uuid"]: "400.00" for x in c},
                                                                 c[5]["uuid"]: "120.00"}
    journal = on_host(lab, host, "journalctl -u rigup-gpu-power -o cat --no-pager")
    assert f"{c[3]['uuid']}: power limit 150.00 -> default 400 W (no longer in the policy)" in journal
    assert play(host, *only5).totals["changed"] == 0
    play(host, *data(gpu_power_watts=policy["gpu_power_watts"], gpu_power_overrides=policy["gpu_power_overrides"]))
    assert {x["uuid"]: x["limit"] for x in cards(lab, host)} == policy["expected"]


def test_after_a_reboot_limits_are_applied_before_the_serving_unit_starts(lab, host, policy, rebooted):
    after = rebooted["after"]
    assert after["limits"] == policy["expected"]                          # the driver forgot them
    journal = after["journal"]
    applied = next(i for i, ln in enumerate(journal) if "rigup-gpu-power: applied: 8 card(s) verified" in ln)
    serving = next(i for i, ln in enumerate(journal) if "serving starts; limits:" in ln)
    assert applied < serving, "\n".join(journal)
    assert "400.00" not in journal[serving] and "150.00" in journal[serving]
    assert after["serving"] == "active"


def test_no_bare_power_limit_ever(lab, host, applied):
    for h in [host]:
        log = calls(lab, h)
        setters = [a for a in log[BEFORE[h] if len(log) >= BEFORE[h] else 0:] if set(a) & set(SETTERS)]
        assert setters, "the tests set limits, so the log has setters"
        for argv in setters:
            assert argv[0] in ("-i", "--id") and re.fullmatch(r"GPU-[0-9a-f-]{36}", argv[1]), argv


def test_plan_mode_shows_the_diff_and_changes_nothing(lab, host, applied):
    policy = applied
    before, n = snapshot(lab, host), len(calls(lab, host))
    run = play(host, *data(gpu_power_watts=300, gpu_power_overrides=policy["gpu_power_overrides"]),
               file="preflight.py")
    c = cards(lab, host)
    out = run.output
    assert f"[{host}] power: GPU 0 {c[0]['uuid']} {c[0]['bus_id']} a100: limit 200 W (min 100, max 400, " \
           "default 400), persistence on" in out
    assert f"[{host}] power:     policy: 300 W from gpu_power_watts -> power limit 200 -> 300 W" in out
    assert f"[{host}] power:     policy: 150 W from gpu_power_overrides.{c[3]['uuid']} -> no change" in out
    assert f"[{host}] power: 6 change(s) would be made" in out
    refused = play(host, *data(gpu_power_watts=450), file="preflight.py", check=False)
    assert refused.returncode != 0 and f"[{host}] power: refused: gpu_power_watts: 450 W is outside GPU 0" in refused.output
    assert snapshot(lab, host) == before
    assert [a for a in calls(lab, host)[n:] if set(a) & set(SETTERS)] == []
