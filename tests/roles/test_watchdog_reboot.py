"""roles/watchdog's escalation on the lab, with the engine stand-in (tests/lab/engine_stub.py) as
rigup-llama@gemma, enabled at boot: no min_tokens_per_s, so the floor is half the tok/s of the
health gate's record (written on the host by rigup/gate.py's own command, from a real completion);
the stand-in is wedged for good (slow while a file exists: it stays slow after its restart and
after the reboot). With rigup_watchdog_reboot true and rigup_watchdog_max_reboots 1: k bad checks
restart the unit, k more reboot the host for real (systemctl reboot, the lab's nspawn loop boots
it again), and after the boot the same escalation does not reboot it a second time that day.

The play is preflight + base + metrics + watchdog (no llama.cpp build)."""

import json
import re
import shlex
import time

import pytest

from rigup.gate import record_command
from tests.conftest import on_host
from tests.roles.test_watchdog import exported, journal, main_pid
from tests.roles.watch_lab import play, serve_stub, unserve_stub, until

pytestmark = pytest.mark.lab
EVERY_S, K, TPS, SLOW_TPS = 2, 2, 200, 10    # the shortest period the role takes: the same checks, sooner
UNIT = "rigup-llama@gemma.service"
SLOW = "/var/lib/rigup-lab-slow"          # kept across the reboot, as a bad card would be
GATE = f"/var/lib/rigup/gate/{UNIT}.json"
# the host's boot id (each lab container has its own): a file in /run marked the boot before, but a
# host shutting down can lose /run while sshd still answers, and the mark then fell in the old boot
# (a cold run's test saw "rebooted a second time" that way)
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
MARKS: dict[str, str] = {}
SETTINGS = {"llama_server_instances": {"gemma": {"model": "gemma-270m", "port": 8081}},
            "watchdog_interval_s": EVERY_S, "watchdog_bad_checks": K, "watchdog_max_tokens": 8,
            "watchdog_timeout_s": 10, "rigup_watchdog_reboot": True, "rigup_watchdog_max_reboots": 1}
FLOOR_SERIES = 'rigup_watchdog_floor_tokens_per_second{llama_instance="gemma"}'


def mark(lab, name) -> None:
    """This boot of the host, for :func:`booted`."""
    MARKS[name] = on_host(lab, name, BOOT_ID).strip()


def booted(lab, name) -> bool:
    """Whether the host booted since the test marked a boot (None while it cannot be reached)."""
    seen = lab.ssh(name, BOOT_ID, timeout=10)
    return seen.stdout.strip() not in ("", MARKS[name]) if seen.returncode == 0 else None


@pytest.fixture(scope="module")
def host(lab, tmp_path_factory):
    h = lab.hosts()[0]
    name = h["name"]
    serve_stub(lab, name, "gemma", 8081, tps=TPS, extra=("--slow-tps", str(SLOW_TPS), "--slow-file", SLOW),
               enabled=True)
    tmp = tmp_path_factory.mktemp("watchdog_reboot")
    play(tmp, ["metrics", "watchdog"], {name: SETTINGS})
    yield h
    lab.ssh(name, f"systemctl disable --now rigup-watchdog.timer; rm -f {SLOW} {GATE} "
                  "/var/lib/rigup/watchdog-reboots.json /var/lib/rigup/watchdog.json")
    unserve_stub(lab, name, "gemma")


def test_still_slow_after_the_restart_reboots_once_a_day(lab, host):
    name = host["name"]
    # the health gate's record, as rigup/gate.py writes it after a (re)start: one real completion's tok/s
    answer = json.loads(on_host(lab, name, "curl -s http://127.0.0.1:8081/v1/chat/completions -d "
                                           + shlex.quote('{"max_tokens": 16, "messages": []}')))
    gated = answer["timings"]["predicted_per_second"]
    on_host(lab, name, record_command(GATE, UNIT, gated, time.time()))
    # the watchdog reads the record on its next run (a record of an earlier test's instance may be there before)
    floor = until(lambda: (f := exported(lab, host).get(FLOOR_SERIES)) and abs(f - gated / 2) < 0.01 and f, 30) \
        or exported(lab, host).get(FLOOR_SERIES)
    print(f"\ngate: {gated} tok/s; default floor from the node exporter: {floor} tok/s")
    assert floor == pytest.approx(gated / 2, abs=0.01)
    mark(lab, name)
    since, pid = int(time.time()), main_pid(lab, name)
    on_host(lab, name, f"touch {SLOW}")
    wedged = time.monotonic()
    assert until(lambda: main_pid(lab, name) not in (pid, "0"), K * (EVERY_S + 5) + 30), "never restarted"
    restarted = time.monotonic() - wedged
    assert until(lambda: booted(lab, name), K * (EVERY_S + 5) + 120, poll=1), "never rebooted"
    rebooted = time.monotonic() - wedged
    lab.wait_ready(name)
    mark(lab, name)
    first = journal(lab, name, since)
    why = [ln for ln in first.splitlines() if "after its restart by the watchdog" in ln or "rebooting the host" in ln]
    print(f"wedged at {SLOW_TPS} tok/s: restarted after {restarted:.1f} s, rebooted after {rebooted:.1f} s; "
          + " | ".join(why))
    assert re.search(rf"gemma: still {K} checks in a row below the floor of {floor:g} tok/s \(last: [\d.]+ tok/s\) "
                     "after its restart by the watchdog", first)
    assert "rebooting the host (1 of 1 today)" in first
    assert json.loads(on_host(lab, name, "cat /var/lib/rigup/watchdog-reboots.json"))["count"] == 1
    # the same day after the boot: still slow, restarted, escalated again, but the budget is spent
    spent = until(lambda: "not rebooting (1 of 1 reboots today already)" in journal(lab, name, since),
                  2 * K * (EVERY_S + 5) + 90, poll=1)
    assert spent, journal(lab, name, since)[-3000:]
    time.sleep(2 * (EVERY_S + 2))
    metrics = exported(lab, host)
    print("after the boot: " + next(ln for ln in journal(lab, name, since).splitlines() if "not rebooting" in ln)
          + "; metrics: " + ", ".join(f"{k} {v}" for k, v in sorted(metrics.items())
                                      if "escalation" in k or "reboots" in k or "restarts" in k))
    assert booted(lab, name) is False, "rebooted a second time the same day"
    assert metrics["rigup_watchdog_reboots_today"] == 1 and metrics["rigup_watchdog_max_reboots"] == 1
    assert metrics['rigup_watchdog_escalations_total{llama_instance="gemma"}'] >= 2
