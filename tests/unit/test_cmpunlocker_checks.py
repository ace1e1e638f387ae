"""roles/cmpunlocker/checks.py: Secure Boot, headers, driver, cards (no hosts)."""

from tests.unit.hosts import host, data, only, refusals


def test_11_cmpunlocker_with_secure_boot_on():
    plan, facts = host("cmp170hx", secure_boot=True)
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_secure_boot")
    assert r.what == "cmpunlocker with Secure Boot on" and "unsigned" in r.why
    assert "turn Secure Boot off" in r.fix


def test_11_unknown_secure_boot_state_is_not_refused():
    plan, facts = host("cmp170hx", secure_boot=None)
    assert refusals(plan, facts, data(cmpunlocker_enabled=True)) == []


def test_12_cmpunlocker_without_kernel_headers():
    plan, facts = host("cmp170hx", kernel={"release": "6.8.0-45-generic", "headers": False})
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_headers")
    assert "/lib/modules/6.8.0-45-generic/build is missing" in r.why
    assert "apt-get install linux-headers-6.8.0-45-generic" in r.fix


def test_13_cmpunlocker_on_an_unsupported_driver():
    plan, facts = host("cmp170hx", driver="610.57.04")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_driver")
    assert r.what == "cmpunlocker on NVIDIA driver 610.57.04"
    assert "exactly 610.43.02, 610.43.03" in r.why and "nvidia-driver-610-open" in r.fix


def test_13_cmpunlocker_on_the_proprietary_module():
    plan, facts = host("cmp170hx")
    plan["driver"]["kernel_module"] = "proprietary"
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_driver")
    assert "open kernel modules" in r.why


def test_14_cmpunlocker_on_a100_cards():
    plan, facts = host("a100", driver="610.43.02")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_cards")
    assert r.what == "cmpunlocker on cards that are not CMP 170HX"
    assert "GPU 0-7 are 10de:20b2 (a100-sxm4-80gb)" in r.why
    assert "10de:20c2 (8gb)" in r.why and "10de:2082 (10gb)" in r.why


def test_14_cmpunlocker_profile_must_match_the_cards():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True, cmpunlocker_profile="10gb")),
                "cmpunlocker_cards")
    assert "GPU 0-5 need 8gb" in r.why and "cmpunlocker_profile: 8gb" in r.fix


def test_11_to_14_all_pass_on_a_ready_cmp_host():
    plan, facts = host("cmp170hx", secure_boot=False)
    assert refusals(plan, facts, data(cmpunlocker_enabled=True, gpu_power_watts=180)) == []
