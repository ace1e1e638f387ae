"""roles/gpu_guard on a lab a100 host: a sustained draw and a temperature trip the guard, which
stops the serving unit with the reason in the journal and stays tripped across a reboot until
it is cleared. Faults of the simulated nvidia-smi: a single [N/A] sample does not trip, 2 bad of
the last 3 do; a hung nvidia-smi is killed after its timeout and trips as lost telemetry, each
run of the oneshot bounded well under its TimeoutStartSec."""

import json
import re
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


# A hung nvidia-smi: each check takes its 2 s timeout; the window (12 s) bounds the time to trip.
FAULTS = data(gpu_guard_interval_s=2, gpu_guard_window_s=12, gpu_guard_smi_timeout=2,
              gpu_guard_thresholds={"a100": {"draw_w": 250}})
GUARD = "/opt/rigup/bin/rigup-gpu-guard"


def journal(lab, host, since: float) -> list[tuple[float, str]]:
    """(time, text) of the guard unit's journal lines since ``since`` (epoch seconds)."""
    out = on_host(lab, host, f"journalctl -u rigup-gpu-guard.service -o short-unix --no-pager --since @{since:.0f}")
    lines = (re.match(r"(\d+\.\d+) \S+ (.*)", line) for line in out.splitlines())
    return [(float(m[1]), m[2]) for m in lines if m]


def runs(lines: list[tuple[float, str]]) -> list[float]:
    """Seconds each run of the oneshot took (systemd's Starting .. Finished or Failed lines)."""
    took, start = [], None
    for t, text in lines:
        if "]: Starting rigup" in text:
            start = t
        elif start is not None and re.search(r"\]: (Finished|Failed to start) rigup", text):
            took.append(t - start)
            start = None
    return took


def restart_serving(lab, host):
    on_host(lab, host, "rigup-gpu-sim set --hang 0 -i all --na none; "
                       f"{GUARD} clear >/dev/null; systemctl start rigup-llama@test.service")
    assert active(lab, host) == "active"


def check_once(lab, host, na: bool) -> str:
    """One check of the guard (the timer stopped), card 3 reading power.draw [N/A] or not."""
    on_host(lab, host, f"rigup-gpu-sim set -i 3 --na {'power.draw' if na else 'none'}; "
                       "systemctl start rigup-gpu-guard.service")
    return "N/A" if na else "ok"


def test_one_na_sample_does_not_trip_two_of_three_do(lab, host):
    restart_serving(lab, host)
    on_host(lab, host, f"systemctl stop rigup-gpu-guard.timer; {GUARD} clear >/dev/null")
    since = time.time() - 1
    try:
        seen = [check_once(lab, host, na) for na in (True, False, False)]
        assert lab.ssh(host, f"test -e {TRIPPED}").returncode != 0 and active(lab, host) == "active"
        print(f"\nsamples {seen}: not tripped, serving active")
        seen += [check_once(lab, host, na) for na in (True, False)]
        assert lab.ssh(host, f"test -e {TRIPPED}").returncode != 0
        seen.append(check_once(lab, host, True))                      # N/A, ok, N/A: 2 of the last 3
        state = json.loads(on_host(lab, host, f"cat {TRIPPED}"))
        print(f"samples {seen}: tripped ({state['samples']})")
        assert state["reason"].startswith("telemetry lost: GPU 3 (") and "reads power.draw [N/A]" in state["reason"]
        assert state["samples"] == "2 of the last 3 samples bad" and active(lab, host) != "active"
        text = "\n".join(line for _, line in journal(lab, host, since))
        assert text.count("rigup-gpu-guard: bad sample (1 of the last ") == 2 and "; trips at 2 of 3): " in text
        assert "TRIPPED: telemetry lost: GPU 3 (" in text and "; 2 of the last 3 samples bad; they stay" in text
    finally:
        on_host(lab, host, "systemctl start rigup-gpu-guard.timer")
        restart_serving(lab, host)


def test_a_hung_nvidia_smi_trips_as_lost_telemetry_within_the_window(lab, host):
    play(host, *FAULTS)
    unit_file = on_host(lab, host, "cat /etc/systemd/system/rigup-gpu-guard.service")
    limit = int(re.search(r"^TimeoutStartSec=(\d+)$", unit_file, re.M)[1])
    assert on_host(lab, host, "systemctl show -P TimeoutStartUSec rigup-gpu-guard.service").strip() == f"{limit}s"
    restart_serving(lab, host)
    since = time.time()
    on_host(lab, host, "rigup-gpu-sim set --hang 1")
    hung = time.time()
    try:
        assert wait_for(lambda: lab.ssh(host, f"test -e {TRIPPED}").returncode == 0), "the guard did not trip"
        assert wait_for(lambda: active(lab, host) != "active")
        assert wait_for(lambda: active(lab, host, "rigup-gpu-guard.service") != "activating")
        lines = journal(lab, host, since)
        tripped_at = next(t for t, text in lines if "rigup-gpu-guard: TRIPPED: " in text)
        took = runs(lines)
        timeouts = sum("nvidia-smi did not answer within 2 s; killed it and its process group" in t for _, t in lines)
        print(f"\nhung nvidia-smi: tripped {tripped_at - hung:.1f} s after the hang (window 12 s); "
              f"{timeouts} calls timed out; runs of the oneshot took {', '.join(f'{x:.1f}' for x in took)} s "
              f"(TimeoutStartSec {limit} s)")
        assert tripped_at - hung < 12 and timeouts >= 2
        assert took and max(took) < 2 + 5 < limit                     # bounded by the smi timeout, not systemd
        reason = json.loads(on_host(lab, host, f"cat {TRIPPED}"))["reason"]
        assert reason == "telemetry lost: nvidia-smi did not answer within 2 s"
        text = "\n".join(t for _, t in lines)
        assert "TRIPPED: telemetry lost: nvidia-smi did not answer within 2 s; stopped serving units: " \
               "rigup-llama@test.service" in text
        assert "Failed with result 'timeout'" not in text
        assert on_host(lab, host, "systemctl show -P Result rigup-gpu-guard.service").strip() == "success"
        assert lab.ssh(host, "pgrep -f '[s]leep 86400|[n]vidia-smi --query-gpu'").stdout == ""   # nothing left hanging
    finally:
        restart_serving(lab, host)
