"""roles/watchdog against faulty servers, on one lab host of its own (lab21: booted by this module
alone, removed after it; no model, no llama.cpp build): the engine stand-in
(tests/lab/engine_stub.py) as four serving units, ``good`` (healthy), ``nulls`` (its answers'
``usage`` all null), ``die`` (its answers cut off mid-body, the connection closed) and ``loading``
(HTTP 503 "Loading model" while a file exists: restarted into it). The watchdog as the role installs
it, run one check at a time (``systemctl start rigup-watchdog.service``; its timer stopped), with
``rigup_watchdog_reboot: true``:

- the healthy one is judged in every check and left alone;
- the faulty ones, gated since their start, are one bad check each time, restarted after
  ``watchdog_bad_checks``; right after that restart not judged (no gate passed since); past the
  grace still faulty: escalated, and restarted again, never a reboot (they have not passed their
  gate since that restart);
- the loading one is not judged, never restarted; once loaded, its first whole completion passes
  its gate and the next checks judge it (good);
- ``moved`` (an API key; its completions answer 302 to another origin, ``other``, a stand-in
  that records every request): each check's completion fails on "HTTP 302" (judged as the faulty
  ones once its start's grace is over: a loaded machine may start it late), and the other origin
  sees no request at all (issue 47: the key never crosses origins);
- no check fails (the unit's oneshot succeeds each time), the state file says all of it, the host
  never reboots.

The play is preflight + base + watchdog."""

import json
import os
import re
import shlex
import time

import pytest

from rigup.gate import record_command
from tests.conftest import on_host
from tests.roles.test_watchdog import journal
from tests.roles.watch_lab import play, serve_stub, unserve_stub

pytestmark = pytest.mark.lab
# GRACE: well over the 3 checks (each a few s on a loaded machine) a server started by the test
# meets inside it, and all the test sleeps through to see them judged past it
HOST, K, FLOOR, GRACE = 21, 2, 50, 20
PORTS = {"good": 8081, "nulls": 8082, "die": 8083, "loading": 8084, "moved": 8085}
OTHER, OTHER_PORT, OTHER_LOG = "other", 8086, "/run/rigup-lab-other.log"   # the origin moved sends to
KEY = "sk-lab-moved-0123456789abcdef"
LOADING = "/run/rigup-lab-loading"        # the loading stand-in answers 503 while it exists
BOOT = "/run/rigup-test-boot"             # /run is new on every boot
STATE = "/var/lib/rigup/watchdog.json"
SETTINGS = {"llama_server_instances": {name: {"model": "gemma-270m", "port": port, "min_tokens_per_s": FLOOR,
                                              "api_key": name == "moved"} for name, port in PORTS.items()},
            "watchdog_interval_s": 3600, "watchdog_bad_checks": K, "watchdog_max_tokens": 8,
            "watchdog_timeout_s": 10, "watchdog_grace_s": GRACE, "rigup_watchdog_reboot": True,
            "rigup_watchdog_max_reboots": 1}
MODES = {"good": (), "nulls": ("--mode", "nulls"), "die": ("--mode", "die"), "loading": ("--loading-file", LOADING),
         "moved": ("--redirect-to", f"http://127.0.0.1:{OTHER_PORT}")}   # another origin: another port


def unit(name: str) -> str:
    return f"rigup-llama@{name}.service"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """lab<HOST> booted alone (next to the session's lab hosts, if any), the stand-ins served, the
    watchdog installed by its role with its timer stopped; removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (systemd-nspawn, network namespaces)")
    from tests.lab import lab

    name = f"lab{HOST}"
    try:
        lab.up(1, "a100", first=HOST)
        serve_stub(lab, name, OTHER, OTHER_PORT, tps=200, extra=("--record", OTHER_LOG))
        for inst, port in PORTS.items():
            serve_stub(lab, name, inst, port, tps=200, extra=MODES[inst])
        started = time.monotonic()
        play(tmp_path_factory.mktemp("watchdog_faults"), ["watchdog"], {name: SETTINGS})
        print(f"\nwatchdog converge on {name}: {time.monotonic() - started:.1f} s")
        # moved's key where roles/llama_server makes it (root:rigup 0640; a lab test's own key)
        on_host(lab, name, "install -d -m 750 -g rigup /etc/rigup/llama-server && "
                           f"install -m 640 -g rigup /dev/null /etc/rigup/llama-server/moved.key && "
                           f"printf %s {KEY} > /etc/rigup/llama-server/moved.key")
        on_host(lab, name, f"systemctl stop rigup-watchdog.timer && rm -f {STATE} /var/lib/rigup/gate/*.json")
        yield lab, name
        lab.ssh(name, f"systemctl disable --now rigup-watchdog.timer; rm -f {LOADING}")
        for inst in (*PORTS, OTHER):
            unserve_stub(lab, name, inst)
    finally:
        if {h["name"] for h in lab.hosts()} <= {name}:
            lab.down()
        else:
            lab.remove(name)


def pids(lab, name) -> dict[str, str]:
    out = on_host(lab, name, " ; ".join(f"systemctl show -p MainPID --value {unit(i)}" for i in PORTS))
    return dict(zip(PORTS, out.split()))


def check(lab, name) -> None:
    """One run of the watchdog as its timer starts it (the oneshot fails when the script does)."""
    on_host(lab, name, "systemctl start rigup-watchdog.service")


def test_faulty_servers_are_judged_each_on_its_own(host):
    lab, name = host
    since = int(time.time())
    on_host(lab, name, f"touch {BOOT}")
    for inst in ("good", "nulls", "die"):           # the health gate passed after their start
        on_host(lab, name, record_command(f"/var/lib/rigup/gate/{unit(inst)}.json", unit(inst), 200.0, time.time()))
    on_host(lab, name, f"touch {LOADING} && systemctl restart {unit('loading')}")   # still loading its model
    before = pids(lab, name)
    for _ in range(K):
        check(lab, name)
    restarted_at = time.monotonic()
    check(lab, name)                                # the restarted ones: not through their gate yet
    after_restart = pids(lab, name)
    on_host(lab, name, f"rm -f {LOADING}")          # loaded: its next completion is its gate
    check(lab, name)
    time.sleep(max(0.0, restarted_at + GRACE + 2 - time.monotonic()))
    for _ in range(K):                              # past the grace: the faulty ones judged again
        check(lab, name)
    check(lab, name)
    checks = 2 * K + 3
    after = pids(lab, name)
    log = journal(lab, name, since)
    state = json.loads(on_host(lab, name, f"cat {STATE}"))
    print(f"{checks} checks; pids {before} -> {after_restart} -> {after}\n"
          + "\n".join(ln for ln in log.splitlines() if "rigup-watchdog:" in ln and "good:" not in ln))
    print("counted: " + "; ".join(f"{s}: {r.get('restarts', 0)} restarts, {r.get('escalations', 0)} escalations, "
                                  f"{r.get('failed', 0)} failed, {r.get('unjudged', 0)} not judged, last "
                                  f"{r.get('last_tps')} tok/s" for s, r in sorted(state.items()))
          + f"; reboots: {on_host(lab, name, 'cat /var/lib/rigup/watchdog-reboots.json 2>/dev/null || echo none')}")
    # the healthy one: judged in every check, left alone
    assert len(re.findall(r"good: [\d.]+ tok/s, at or above its floor 50 tok/s", log)) == checks
    assert after["good"] == before["good"] and not state["good"].get("restarts") and state["good"]["last_tps"] > FLOOR
    # the faulty ones: K bad checks, a restart; not judged after it; past the grace K more, no reboot
    for inst, why in (("nulls", "a malformed answer (no usable usage.completion_tokens"),
                      ("die", "the answer was cut off: the connection closed mid-answer")):
        assert log.count(f"{inst}: {why}") >= 2 * K, inst
        assert len({before[inst], after_restart[inst], after[inst]}) == 3, (inst, before, after_restart, after)
        assert state[inst]["restarts"] == 2 and state[inst]["escalations"] == 1 and state[inst]["failed"] == 2 * K
        assert re.search(rf"{inst}: .*, \d+ s after its start: not judged", log), inst
        assert f"{inst}: still {K} checks in a row below the floor of 50 tok/s" in log
    # the faulty ones' escalations (moved's come as its start's grace allows: not counted here)
    assert sum(log.count(f"{inst}: not rebooting (it has not passed its gate since its last start")
               for inst in ("nulls", "die")) == 2
    # the loading one: not judged while loading, never restarted; loaded: through its gate, judged good
    assert re.search(r"loading: HTTP 503 \(Loading model\), \d+ s after its start: not judged", log)
    assert "loading: a whole completion" in log and "passed its gate; judged from the next check" in log
    assert after["loading"] == before["loading"] and not state["loading"].get("restarts")
    assert state["loading"]["unjudged"] == K + 1 and state["loading"]["bad"] == 0
    assert state["loading"]["starting"] == 0 and state["loading"]["last_tps"] > FLOOR
    assert re.search(r"loading: [\d.]+ tok/s, at or above its floor", log)
    # moved: each check failed on the redirect; the other origin never saw its key
    other = on_host(lab, name, f"cat {OTHER_LOG} 2>/dev/null; true").split("\n")[:-1]
    print(f"moved: {log.count('moved: ')} lines; the other origin: {len(other)} request(s) "
          f"({sum(ln.endswith(' key') for ln in other)} with a key; /health from serve_stub)")
    assert "moved: HTTP 302" in log and not any(ln.endswith(" key") for ln in other), other
    assert [ln for ln in other if not ln.startswith("/health")] == []
    # nothing rebooted the host, nothing was asked to
    assert "rebooting the host" not in log and lab.ssh(name, f"test -e {BOOT}").returncode == 0
    assert lab.ssh(name, "test -e /var/lib/rigup/watchdog-reboots.json").returncode != 0
    assert "Traceback" not in log and "the check failed" not in log
    assert on_host(lab, name, "systemctl show -p Result --value rigup-watchdog.service").strip() == "success"
    assert shlex.split(on_host(lab, name, f"stat -c '%U %a' {STATE}")) == ["root", "644"]
