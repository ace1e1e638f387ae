"""roles/burnin on a lab a100 host (8 simulated cards): the acceptance run's CUDA side is the lab's
stand-in for libcuda.so.1 (tests/lab/cuda_standin.c), driven by faults injected per card, so
rigup-burnin's own ctypes code runs as written. Four cards are made bad (VRAM that corrupts, a
link trained down to x1, a card that throttles, a card that falls off the bus under load) and
one hangs: each is found, named and quarantined, the converge that found them fails before any
serving change, and the next one leaves them out of the plan while the GPU guard, which would
trip on a card off the bus, leaves them alone and the serving unit keeps running; a clean retest
brings them back; a card in use is never tested; the second converge changes 0."""

import json
import re
import time

import pytest

from tests.conftest import on_host
from tests.roles.power_lab import TRIPPED, data, install_serving_unit, own_host, play

pytestmark = pytest.mark.lab
RESULTS = "/var/lib/rigup/burnin.json"
ON = data(burnin_enabled=True, burnin_level="quick", burnin_after_change="quick", burnin_soak_s=3,
          burnin_timeout_s=20, gpu_guard_interval_s=2, gpu_guard_window_s=6, gpu_guard_xid_source="lab")
FAULTS = {1: "--vram-bad 12", 2: "--pcie-width 1", 3: "--throttle 0x40", 4: "--lost-under-load 1", 5: "--cuda-hang 1"}


def burn(host, *more, check=True):
    return play(host, *ON, *more, check=check)


@pytest.fixture(scope="module")
def host(lab):
    with own_host(lab) as name:
        yield name


def records(lab, host) -> dict:
    return json.loads(on_host(lab, host, f"cat {RESULTS}"))


def test_a_card_in_use_is_never_tested(lab, host):
    install_serving_unit(lab, host)      # a serving unit without CUDA_VISIBLE_DEVICES: every card
    run = burn(host)
    print(run.output[-1500:])
    assert run.output.count(" waits: first sight: in use by rigup-llama@test.service") == 8
    assert lab.ssh(host, f"test -e {RESULTS}").returncode != 0
    on_host(lab, host, "systemctl stop rigup-llama@test.service")


def test_bad_cards_are_found_named_and_quarantined_before_anything_serves_on_them(lab, host):
    for index, fault in FAULTS.items():
        on_host(lab, host, f"rigup-gpu-sim set -i {index} {fault}")
    start = time.monotonic()
    run = burn(host, check=False)
    took = time.monotonic() - start
    out = run.output
    assert run.returncode != 0, out[-3000:]
    print(f"converge with the acceptance of 8 cards: {took:.0f} s; its verdicts:")
    for line in out.splitlines():
        if "quick: " in line and "GPU " in line:
            print("   ", line.strip()[-260:])
    assert re.search(r"GPU 1 \(.*FAILED: VRAM: 24 mismatched words", out)
    assert re.search(r"GPU 2 \(.*FAILED: PCIe: [0-9.]+ GB/s, 0\.0[0-9]+ of the 31\.5 GB/s its x16 Gen4 link allows "
                     r"\(link now x1 Gen4", out)
    assert re.search(r"GPU 3 \(.*FAILED: soak: hardware thermal slowdown in 100% of", out)
    assert re.search(r"GPU 4 \(.*FAILED: fell off the bus under load", out)
    assert re.search(r"GPU 4 \(.*FAILED: fell off the bus under load.*; Xid 79 during the test", out)   # its own Xid line
    assert re.search(r"GPU 5 \(.*FAILED: hung: no answer within 20 s \(killed; the card was not reset\)", out)
    recs = records(lab, host)
    passed = sorted(r["index"] for r in recs.values() if r["passed"])
    assert passed == [0, 6, 7], passed
    for r in recs.values():
        if r["passed"]:
            print(f"    GPU {r['index']}: PCIe {r['figures']['pcie']['gbps']} GB/s = {r['figures']['pcie']['ratio']} "
                  f"of its link, VRAM {r['figures']['vram']['mib']} MiB, {r['figures']['soak']['launches']} launches")
            assert r["figures"]["pcie"]["ratio"] > 0.25 and r["figures"]["compute"]["wrong"] == 0


def test_the_next_converge_serves_on_the_others_and_the_guard_leaves_the_quarantined_alone(lab, host):
    on_host(lab, host, "rigup-gpu-sim set -i 5 --cuda-hang 0")    # the hung card's test is over (killed)
    run = burn(host)
    quarantined = sorted(set(re.findall(r"burn-in:   GPU (\d) \(.*QUARANTINED", run.output)))
    print("quarantined:", quarantined)
    assert quarantined == ["1", "2", "3", "4", "5"]
    plan = [ln.strip() for ln in run.output.splitlines() if "] cards:" in ln or "] vram:" in ln]
    print("\n".join(plan))
    assert any(ln.endswith("cards:     3 x a100 (+1 lost)") for ln in plan)    # 4 quarantined, 1 off the bus
    assert any(ln.endswith("vram:      3 x 81920 MiB = 245760 MiB") for ln in plan)
    conf = json.loads(on_host(lab, host, "cat /etc/rigup/gpu-guard.json"))
    assert conf["burnin"]["results"] == RESULTS
    install_serving_unit(lab, host)
    on_host(lab, host, "systemctl restart rigup-llama@test.service")
    time.sleep(8)    # four guard checks, with a card off the bus
    assert lab.ssh(host, f"test -e {TRIPPED}").returncode != 0, on_host(lab, host, f"cat {TRIPPED}")
    assert on_host(lab, host, "systemctl is-active rigup-llama@test.service").strip() == "active"
    metrics = on_host(lab, host, "cat /var/lib/prometheus/node-exporter/rigup_burnin.prom 2>/dev/null || true")
    if metrics:
        assert metrics.count("rigup_gpu_quarantined{") == 8 and len(re.findall(r"rigup_gpu_quarantined\{.*\} 1", metrics)) == 5
    on_host(lab, host, "systemctl stop rigup-llama@test.service")
    again = burn(host)
    assert again.totals["changed"] == 0, again.changed_operations()


def test_a_clean_retest_brings_the_cards_back(lab, host):
    on_host(lab, host, "rigup-gpu-sim reset && rigup-gpu-sim set -i 4 --found")
    run = burn(host, *data(burnin_retest=True))
    print(run.output[-1200:])
    recs = records(lab, host)
    assert sorted(r["index"] for r in recs.values() if r["passed"]) == list(range(8))
    after = burn(host)
    assert "QUARANTINED" not in after.output and "burn-in:   8 card(s) accepted" in after.output
    assert after.totals["changed"] == 0, after.changed_operations()


def test_in_a_roll_the_units_that_hold_the_cards_stop_for_the_run_and_start_again(lab, host):
    """roll.py's converge (rigup_rolling: the host drained at the gateways) tests a card a serving
    unit holds: the unit is stopped for the run and started again after it."""
    on_host(lab, host, f"rm -f {RESULTS} && systemctl start rigup-llama@test.service")
    since = on_host(lab, host, "date +%s").strip()
    run = burn(host, *data(rigup_rolling=True))
    assert "burn-in:   a roll: rigup-llama@test.service stopped for the run" in run.output, run.output[-3000:]
    assert sorted(r["index"] for r in records(lab, host).values() if r["passed"]) == list(range(8))
    assert on_host(lab, host, "systemctl is-active rigup-llama@test.service").strip() == "active"
    journal = on_host(lab, host, f"journalctl -u rigup-llama@test.service --since @{since} -o cat --no-pager")
    print(journal)
    assert "Stopped" in journal and journal.rfind("Started") > journal.rfind("Stopped")
    again = burn(host)
    assert again.totals["changed"] == 0, again.changed_operations()
