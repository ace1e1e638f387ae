"""roles/gpu_guard on a lab a100 host: a sustained draw and a temperature trip the guard, which
stops the serving unit with the reason in the journal and stays tripped across a reboot until
it is cleared."""

import time

import pytest

from tests.conftest import on_host
from tests.roles.power_lab import TRIPPED, data, install_serving_unit, play

pytestmark = pytest.mark.lab
FAST = data(gpu_guard_interval_s=2, gpu_guard_window_s=6, gpu_guard_thresholds={"a100": {"draw_w": 250}})


@pytest.fixture(scope="module")
def host(lab):
    """A host of its own (a trip stops every serving unit of a host), removed afterwards."""
    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    name = f"lab{first}"
    lab.up(1, "a100", first=first)
    try:
        play(name, *FAST)
        install_serving_unit(lab, name)
        yield name
    finally:
        lab.remove(name)


def active(lab, host, unit="rigup-llama@test.service"):
    return lab.ssh(host, f"systemctl is-active {unit}").stdout.strip()


def wait_for(predicate, timeout=40):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return False


def test_guard_config_and_timer(lab, host):
    assert active(lab, host, "rigup-gpu-guard.timer") == "active"
    conf = on_host(lab, host, "cat /etc/rigup/gpu-guard.json")
    assert '"10de:20b2": {' in conf and '"draw_w": 250' in conf and '"temp_c": 72' in conf   # a100 override; cmp170hx
    again = play(host, *FAST)
    assert again.totals["changed"] == 0, again.changed_operations()


def test_a_single_peak_does_not_trip_but_a_sustained_draw_does(lab, host):
    assert active(lab, host) == "active"
    on_host(lab, host, "rigup-gpu-sim set -i 1 --draw 390")          # 2x-cap style peak...
    time.sleep(2.5)
    on_host(lab, host, "rigup-gpu-sim set -i 1 --draw 70")           # ...gone before the window fills
    time.sleep(6)
    assert lab.ssh(host, f"test -e {TRIPPED}").returncode != 0
    assert active(lab, host) == "active"
    on_host(lab, host, "rigup-gpu-sim set -i 1 --draw 330")
    assert wait_for(lambda: active(lab, host) != "active"), "the serving unit still runs"
    journal = on_host(lab, host, "journalctl -u rigup-gpu-guard -o cat --no-pager")
    assert "rigup-gpu-guard: TRIPPED: GPU 1 (" in journal and "a100): average draw " in journal
    assert "> 250 W; stopped serving units: rigup-llama@test.service" in journal
    assert "average draw" in on_host(lab, host, f"cat {TRIPPED}")


def test_tripped_survives_a_reboot_and_serving_stays_down_until_cleared(lab, host):
    lab.reboot(host)                                                   # the draw resets with the cards
    assert on_host(lab, host, f"cat {TRIPPED}")
    assert active(lab, host) != "active"
    lab.ssh(host, "systemctl start rigup-llama@test.service")          # the condition keeps it down
    assert active(lab, host) != "active"
    assert "tripped at " in lab.ssh(host, "/opt/rigup/bin/rigup-gpu-guard status").stdout
    run = play(host, *FAST, *data(gpu_guard_clear=True))
    assert "gpu_guard | gpu_guard: clear the tripped guard" in run.changed_operations()
    assert lab.ssh(host, f"test -e {TRIPPED}").returncode != 0
    assert "cleared by an operator (was: GPU 1" in on_host(lab, host, "journalctl -t rigup-gpu-guard -o cat --no-pager")
    on_host(lab, host, "systemctl start rigup-llama@test.service")
    assert active(lab, host) == "active"


def test_temperature_trips_at_once(lab, host):
    on_host(lab, host, "rigup-gpu-sim set -i 0 --temp 91")
    assert wait_for(lambda: active(lab, host) != "active")
    assert "temperature 91 C > 85 C" in on_host(lab, host, f"cat {TRIPPED}")
    on_host(lab, host, "rigup-gpu-sim set -i 0 --temp 40; /opt/rigup/bin/rigup-gpu-guard clear")
    on_host(lab, host, "systemctl start rigup-llama@test.service")
    assert active(lab, host) == "active"


def test_lost_telemetry_trips(lab, host):
    on_host(lab, host, "rigup-gpu-sim set -i 4 --lost")
    assert wait_for(lambda: active(lab, host) != "active")
    assert "telemetry lost: Unable to determine the device handle for GPU" in on_host(lab, host, f"cat {TRIPPED}")
    on_host(lab, host, "rigup-gpu-sim set -i 4 --found; /opt/rigup/bin/rigup-gpu-guard clear")
