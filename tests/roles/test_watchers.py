"""Watchers that look twice (issue 65), on one lab host of its own (lab22, an ``hgx-h100``: 8 cards
and 4 NVSwitch chips on its PCI bus, the lab's nvidia-smi stand-in; booted by this module alone,
removed after it; no model, no llama.cpp build). The fabric manager is the lab's stand-in daemon
(tests/lab/fabric_debs.py), installed as its unit; every server is the engine stand-in
(tests/lab/engine_stub.py) as a serving unit ``rigup-llama@NAME``. The GPU guard, the metrics relay
and the watchdog as their roles install them, converged once; the guard and the watchdog are run
one check at a time (``systemctl start`` of their oneshot; their timers stopped), but for the wedged
instance, which the watchdog's timer restarts (every EVERY_S s).

- the guard's fabric check: one ``systemctl is-active nvidia-fabricmanager`` slower than the guard's
  timeout (a shim in /usr/local/sbin that sleeps while a flag file exists) drains nothing; two in a
  row trip the guard, naming the fabric manager as not answering; the fabric back clears it;
- speeds that are no number (``Infinity``, ``NaN``, ``1e308`` as the server's
  ``timings.predicted_per_second``) are never the watchdog's figure: the wall-clock rate stands,
  finite, and nothing restarts; a gate record whose tps is Infinity gives no floor;
- the relay's 10 s bound per scrape: a router of three loaded models, each /metrics 4 s, answers
  503 naming the bound within it; an event of a router's /models/sse whose data is a string is
  left out, the follower stays up and counts the next valid load;
- a sleeping instance (``sleep_idle_s``) idle is left asleep (no completion sent); wedged (a request
  held, no token, no decode) it is restarted within about three intervals;
- a router's model that fails to load is named and the router restarted once; failing again after
  that restart it is named, not restarted again, and the other model still answers.

The play is preflight + base + gpu_guard + metrics + watchdog."""

import json
import math
import os
import re
import shlex
import time

import pytest

from rigup.gate import record_command
from rigup.names import WATCHDOG_METRICS
from tests.conftest import on_host
from tests.roles.watch_lab import play, serve_stub, unserve_stub, until

pytestmark = pytest.mark.lab
HOST, EVERY_S, K, FLOOR, SMI_TIMEOUT_S = 22, 2, 2, 5, 3
STATE = "/var/lib/rigup/watchdog.json"
TRIPPED = "/var/lib/rigup/gpu-guard.tripped"
PORTS = {"inf": 8082, "nan": 8083, "huge": 8084, "gated": 8085, "sleepy": 8086, "router": 8087, "three": 8088,
         "events": 8089}
FABRIC_STUB, FABRIC_PORT = "fabric", 8090        # a serving unit the guard stops, watched by nobody
ROUTERS = {"router": ["alpha", "beta"], "three": ["m1", "m2", "m3"], "events": ["e1", "e2"]}
INSTANCES = {name: {"model": ROUTERS[name][0] if name in ROUTERS else "gemma-270m", "port": port,
                    # gated: its floor from its gate record; three and events: the relay's, not watched (0)
                    "min_tokens_per_s": None if name == "gated" else 0 if name in ("three", "events") else FLOOR,
                    **({"also": ROUTERS[name][1:]} if name in ROUTERS else {}),
                    **({"sleep_idle_s": 2} if name == "sleepy" else {})}
             for name, port in PORTS.items()}
SETTINGS = {"llama_server_instances": INSTANCES, "metrics_address": "127.0.0.1",
            "gpu_guard_interval_s": EVERY_S, "gpu_guard_smi_timeout": SMI_TIMEOUT_S,
            "watchdog_interval_s": EVERY_S, "watchdog_bad_checks": K, "watchdog_max_tokens": 8,
            "watchdog_timeout_s": 10, "watchdog_grace_s": 20}
# The fabric manager's stand-in as its package installs it (tests/lab/fabric_debs.py), at the
# profile's driver version, which the stand-in checks against nvidia-smi's.
DRIVER = "580.105.08"
SHIM, SLOW_FLAG = "/usr/local/sbin/systemctl", "/run/rigup-lab-slow-fabric"
# systemctl for everyone (first on systemd's PATH), but `is-active nvidia-fabricmanager*` hangs while
# SLOW_FLAG exists: a probe slower than the guard's timeout (it kills it: "not answering")
SHIM_TEXT = f"""#!/bin/sh
# rigup lab (tests/roles/test_watchers.py): is-active of the fabric manager hangs while {SLOW_FLAG} exists
if [ -e {SLOW_FLAG} ] && [ "$1" = is-active ]; then
    case "$2" in nvidia-fabricmanager*) sleep {SMI_TIMEOUT_S + 20};; esac
fi
exec /usr/bin/systemctl "$@"
"""
WEDGE, SLEEPY_LOG = "/run/rigup-lab-wedged", "/run/rigup-lab-sleepy.log"


def unit(name: str) -> str:
    return f"rigup-llama@{name}.service"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """lab<HOST> booted alone (next to the session's lab hosts, if any), its fabric manager running,
    the three roles converged once, the guard's and the watchdog's timers stopped; removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (systemd-nspawn, network namespaces)")
    from tests.lab import fabric_debs, lab

    name = f"lab{HOST}"
    try:
        started = time.monotonic()
        lab.up(1, "hgx-h100", first=HOST)
        booted = time.monotonic() - started
        daemon = fabric_debs.DAEMON.replace("@VERSION@", DRIVER)
        on_host(lab, name, f"printf %s {shlex.quote(daemon)} > /usr/bin/nv-fabricmanager && chmod 755 "
                           f"/usr/bin/nv-fabricmanager && printf %s {shlex.quote(fabric_debs.UNIT)} > "
                           "/etc/systemd/system/nvidia-fabricmanager.service && systemctl daemon-reload && "
                           "systemctl enable -q --now nvidia-fabricmanager")
        play(tmp_path_factory.mktemp("watchers"), ["gpu_guard", "metrics", "watchdog"], {name: SETTINGS})
        on_host(lab, name, f"systemctl stop rigup-gpu-guard.timer rigup-watchdog.timer && rm -f {STATE} "
                           "/var/lib/rigup/gate/*.json")
        print(f"\n{name} (hgx-h100) booted in {booted:.0f} s; converged in {time.monotonic() - started - booted:.0f} s")
        yield lab, name
        lab.ssh(name, f"systemctl disable --now rigup-watchdog.timer rigup-gpu-guard.timer; rm -f {SHIM} {WEDGE}")
    finally:
        if {h["name"] for h in lab.hosts()} <= {name}:
            lab.down()
        else:
            lab.remove(name)


def journal(lab, name: str, program: str, since: int) -> str:
    """``program``'s journal lines since ``since``, found by their own prefix (``rigup-watchdog:``),
    not by their unit: journald names the unit of a line from its sender's cgroup, which it may read
    only after a short-lived oneshot has ended (then ``-u`` misses the line: a watchdog's restart
    line, logged just before it exited, under a router's load)."""
    return on_host(lab, name, f"journalctl -q -o cat --since @{since} --grep {shlex.quote('^' + program + ':')}; true")


def watchdog_check(lab, name: str, times: int = 1) -> None:
    """``times`` runs of the watchdog, one after the other, as its timer starts it (one ssh call)."""
    on_host(lab, name, " && ".join(["systemctl start rigup-watchdog.service"] * times))


def guard_check(lab, name: str) -> float:
    """One run of the guard as its timer starts it; its seconds."""
    started = time.monotonic()
    on_host(lab, name, "systemctl start rigup-gpu-guard.service")
    return time.monotonic() - started


def state(lab, name: str) -> dict:
    return json.loads(on_host(lab, name, f"cat {STATE}"))


def exported(lab, name: str) -> dict:
    """The watchdog's metrics file, as the node exporter serves it: {series: value}."""
    text = on_host(lab, name, f"cat {WATCHDOG_METRICS}")
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith("rigup_watchdog_")}


def series(metric: str, inst: str) -> str:
    """The watchdog's series ``rigup_watchdog_METRIC`` of server ``inst``."""
    return f'rigup_watchdog_{metric}{{llama_instance="{inst}"}}'


def pid(lab, name: str, inst: str) -> str:
    return on_host(lab, name, f"systemctl show -p MainPID --value {unit(inst)}").strip()


def ask(lab, name: str, port: int, model: str | None = None) -> tuple[int, str]:
    """One chat completion on the host: (HTTP status, body)."""
    doc = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                      **({"model": model} if model else {})})
    out = on_host(lab, name, f"curl -s -m 30 -w '\\n%{{http_code}}' http://127.0.0.1:{port}/v1/chat/completions "
                             f"-H 'Content-Type: application/json' -d {shlex.quote(doc)}")
    body, _, code = out.rstrip("\n").rpartition("\n")
    return int(code), body


def fresh(lab, name: str) -> None:
    """The watchdog's state and the gate's records gone: its next check is its first sight of every server."""
    on_host(lab, name, f"rm -f {STATE} /var/lib/rigup/gate/*.json")


# ----------------------------------------------------------------------------- 1. the fabric, slow once
def test_a_slow_fabric_probe_answered_once_drains_nothing_twice_drains(host):
    lab, name = host
    serve_stub(lab, name, FABRIC_STUB, FABRIC_PORT, tps=200)
    on_host(lab, name, f"rm -f {SLOW_FLAG} && printf %s {shlex.quote(SHIM_TEXT)} > {SHIM} && chmod 755 {SHIM} && "
                       f"/opt/rigup/bin/rigup-gpu-guard clear >/dev/null; systemctl is-active nvidia-fabricmanager")
    svc = unit(FABRIC_STUB)
    try:
        since = int(time.time())
        guard_check(lab, name)                          # the fabric up: a clean sample first
        seconds, serving = [], []
        for slow in (True, False, False):               # slow once, then answered twice
            on_host(lab, name, f"touch {SLOW_FLAG}" if slow else f"rm -f {SLOW_FLAG}")
            seconds.append(guard_check(lab, name))
            serving.append(lab.ssh(name, f"systemctl is-active {svc}").stdout.strip())
        once = journal(lab, name, "rigup-gpu-guard", since)
        untripped = lab.ssh(name, f"test -e {TRIPPED}").returncode != 0
        looked = [ln for ln in once.splitlines() if "NVSwitch fabric" in ln]
        print(f"\nslow once: checks {', '.join(f'{s:.1f}' for s in seconds)} s (timeout {SMI_TIMEOUT_S} s); "
              f"{svc} {serving}; tripped: {not untripped}; journal: {looked}")
        assert untripped and serving == ["active"] * 3
        assert any("nvidia-fabricmanager.service is not answering (1 of 2 checks in a row" in ln for ln in looked)
        assert seconds[0] >= SMI_TIMEOUT_S and "TRIPPED" not in once

        since = int(time.time())
        on_host(lab, name, f"touch {SLOW_FLAG}")
        seconds = [guard_check(lab, name) for _ in range(2)]     # slow twice in a row
        record = json.loads(on_host(lab, name, f"cat {TRIPPED}"))
        after = lab.ssh(name, f"systemctl is-active {svc}").stdout.strip()
        twice = journal(lab, name, "rigup-gpu-guard", since)
        print(f"slow twice: checks {', '.join(f'{s:.1f}' for s in seconds)} s; tripped: {record['reason']!r}; "
              f"{svc} {after}; " + "; ".join(ln for ln in twice.splitlines() if "TRIPPED" in ln))
        assert record["reason"] == "the NVSwitch fabric: nvidia-fabricmanager.service is not answering"
        assert record.get("fabric") is True and after != "active"

        on_host(lab, name, f"rm -f {SLOW_FLAG}")       # answered again: the fabric is back, the trip cleared
        guard_check(lab, name)
        back = lab.ssh(name, f"test -e {TRIPPED}").returncode != 0
        resumed = until(lambda: lab.ssh(name, f"systemctl is-active {svc}").stdout.strip() == "active", 20)
        print(f"answered again: cleared {back}, {svc} active again: {bool(resumed)}")
        assert back and resumed
    finally:
        lab.ssh(name, f"rm -f {SLOW_FLAG} {SHIM}; /opt/rigup/bin/rigup-gpu-guard clear >/dev/null")
        unserve_stub(lab, name, FABRIC_STUB)


# ----------------------------------------------------------------------------- 2. speeds that are no number
REPORTED = {"inf": "Infinity", "nan": "NaN", "huge": "1e308"}


def test_speeds_that_are_no_number_never_become_a_figure_or_a_floor(host):
    lab, name = host
    fresh(lab, name)
    try:
        for inst, text in REPORTED.items():
            serve_stub(lab, name, inst, PORTS[inst], tps=200, extra=("--report-tps", text))
            on_host(lab, name, record_command(f"/var/lib/rigup/gate/{unit(inst)}.json", unit(inst), 200.0, time.time()))
        code, body = ask(lab, name, PORTS["inf"])
        assert code == 200 and '"predicted_per_second": Infinity' in body, body    # the fault is real
        before = {inst: pid(lab, name, inst) for inst in REPORTED}
        since, checks = int(time.time()), 5
        watchdog_check(lab, name, checks)
        log = journal(lab, name, "rigup-watchdog", since)
        figures, records = exported(lab, name), state(lab, name)
        for inst, text in REPORTED.items():
            tps = figures[series("tokens_per_second", inst)]
            restarts = figures[series("restarts_total", inst)]
            good = re.findall(rf"{inst}: ([\d.]+) tok/s, at or above its floor {FLOOR} tok/s", log)
            print(f"{inst} (reports {text}): {checks} checks, {len(good)} good at {', '.join(good)} tok/s; metrics "
                  f"{tps} tok/s, {restarts:g} restarts; floor {figures[series('floor_tokens_per_second', inst)]:g}")
            assert math.isfinite(tps) and 0 < tps < 1e7 and restarts == 0 and not records[inst].get("bad")
            assert len(good) == checks and all(0 < float(t) < 1e7 for t in good)
            assert pid(lab, name, inst) == before[inst]
        assert "restarting" not in log and "Traceback" not in log
    finally:
        for inst in REPORTED:
            unserve_stub(lab, name, inst)


def test_a_gate_record_of_infinity_gives_no_floor(host):
    lab, name = host
    fresh(lab, name)
    inst = "gated"
    try:
        serve_stub(lab, name, inst, PORTS[inst], tps=200)
        path = f"/var/lib/rigup/gate/{unit(inst)}.json"
        text = f'{{"unit": "{unit(inst)}", "tps": Infinity, "at": {time.time():.3f}}}'   # json.dumps' own spelling
        on_host(lab, name, f"install -d -m 755 /var/lib/rigup/gate && printf '%s\\n' {shlex.quote(text)} > {path}")
        written = on_host(lab, name, f"cat {path}").strip()
        before, since, checks = pid(lab, name, inst), int(time.time()), 3
        watchdog_check(lab, name, checks)
        log = journal(lab, name, "rigup-watchdog", since)
        ignored = [ln for ln in log.splitlines() if f"{inst}" in ln]
        figures = exported(lab, name)
        print(f"gate record {written}: {checks} checks; journal: {ignored[:2]}; restarts "
              f"{figures.get(series('restarts_total', inst), 0):g}")
        assert '"tps": Infinity' in written
        assert log.count("is not one (ignored: no floor from it") >= checks
        assert log.count(f"{inst}: no floor yet") == checks and "restarting" not in log
        assert not figures.get(series("restarts_total", inst))
        assert series("floor_tokens_per_second", inst) not in figures
        assert pid(lab, name, inst) == before
    finally:
        unserve_stub(lab, name, inst)


# ----------------------------------------------------------------------------- 5. the relay, per scrape
def relay(lab, name: str, inst: str) -> tuple[int, float, str]:
    """The relay's scrape of ``inst`` asked on the host: (HTTP status, seconds, body)."""
    out = on_host(lab, name, f"curl -s -m 60 -w '\\n%{{http_code}} %{{time_total}}' http://127.0.0.1:9101/metrics/{inst}")
    body, _, tail = out.rstrip("\n").rpartition("\n")
    code, seconds = tail.split()
    return int(code), float(seconds), body


ONE = "/run/rigup-lab-one-metrics"   # one model's /metrics, its seconds


def test_a_slow_three_model_scrape_ends_within_the_bound(host):
    lab, name = host
    inst, delay = "three", 4
    try:
        serve_stub(lab, name, inst, PORTS[inst], tps=200,
                   extra=("--router", ",".join(ROUTERS[inst]), "--all-loaded", "--metrics-delay", str(delay)))
        # one model's /metrics timed while the relay scrapes (the stand-in answers each request in a
        # thread of its own): its 4 s within the relay's 10, not before them
        timed = (f"curl -s -o /dev/null -w '%{{time_total}}' 'http://127.0.0.1:{PORTS[inst]}/metrics?model=m1"
                 f"&autoload=false' > {ONE}.new && mv {ONE}.new {ONE}")
        on_host(lab, name, f"rm -f {ONE} {ONE}.new; setsid -f sh -c {shlex.quote(timed)} >/dev/null 2>&1 </dev/null")
        loaded = on_host(lab, name, f"curl -s http://127.0.0.1:{PORTS[inst]}/models")
        code, seconds, body = relay(lab, name, inst)
        one = until(lambda: on_host(lab, name, f"cat {ONE} 2>/dev/null; true").strip(), 30) or "0"
        print(f"\nrouter of {len(ROUTERS[inst])} loaded models, one model's /metrics {float(one):.1f} s: the relay "
              f"answered {code} after {seconds:.2f} s: {body.strip()[:200]}")
        assert loaded.count('"loaded"') == 3 and float(one) >= delay
        assert code == 503 and seconds <= 10.5 and "within the scrape's 10 s" in body, (code, seconds, body)
    finally:
        lab.ssh(name, f"rm -f {ONE} {ONE}.new")
        unserve_stub(lab, name, inst)


def test_a_router_event_of_a_string_leaves_the_follower_up(host):
    lab, name = host
    inst = "events"
    url = f"http://127.0.0.1:{PORTS[inst]}/stub/event"
    try:
        serve_stub(lab, name, inst, PORTS[inst], tps=200, extra=("--router", ",".join(ROUTERS[inst])))
        # the relay follows a router's stream from its own start, again every 5 s when it ends
        on_host(lab, name, "systemctl restart rigup-metrics-relay")
        assert until(lambda: "rigup_router_events_up 1" in relay(lab, name, inst)[2], 30), relay(lab, name, inst)
        sent = [{"model": "e2", "event": "status_change", "data": "loading"},        # data a string
                {"model": "e2", "event": "status_change", "data": {"status": "loading"}},
                {"model": "e2", "event": "status_change", "data": {"status": "loaded"}}]
        for event in sent:
            on_host(lab, name, f"curl -sf {url} -d {shlex.quote(json.dumps(event))}")
            time.sleep(0.3)
        scraped = until(lambda: (r := relay(lab, name, inst)) and 'rigup_router_model_loads_total{model="e2"} 1' in r[2]
                        and r, 15)
        code, seconds, body = scraped or relay(lab, name, inst)
        shown = [ln for ln in body.splitlines() if ln.startswith(("rigup_router_events_up", "rigup_router_model_loads",
                                                                   "rigup_router_model_last_load"))]
        log = on_host(lab, name, "journalctl -q -o cat -u rigup-metrics-relay --since '-1 min'")
        print(f"\nevents sent: {[json.dumps(e) for e in sent]}\nrelay ({code}, {seconds:.2f} s): {shown}")
        assert code == 200 and "rigup_router_events_up 1" in body
        assert 'rigup_router_model_loads_total{model="e2"} 1' in body and 'rigup_router_model_loads_total{model="e1"} 0' in body
        assert "Traceback" not in log and "AttributeError" not in log
    finally:
        unserve_stub(lab, name, inst)


# ----------------------------------------------------------------------------- 3. a sleeping instance
def sleeping(lab, name: str) -> str:
    """``sleepy`` (sleep_idle_s) served, not wedged, recording its requests, seen once by a fresh
    watchdog (its first sight: its figures kept, and its gate's completion); its name."""
    fresh(lab, name)
    on_host(lab, name, f"rm -f {WEDGE}")
    serve_stub(lab, name, "sleepy", PORTS["sleepy"], tps=200, extra=("--wedge-file", WEDGE, "--record", SLEEPY_LOG))
    watchdog_check(lab, name)
    on_host(lab, name, f": > {SLEEPY_LOG}")
    return "sleepy"


def test_an_idle_sleeping_instance_is_left_asleep(host):
    lab, name = host
    try:
        inst = sleeping(lab, name)
        since, checks = int(time.time()), 5
        watchdog_check(lab, name, checks)
        asked = on_host(lab, name, f"cat {SLEEPY_LOG}").splitlines()
        completions = [ln for ln in asked if ln.startswith("/v1/chat/completions")]
        log = journal(lab, name, "rigup-watchdog", since)
        record = state(lab, name)[inst]
        print(f"\nidle, sleep_idle_s: {checks} checks, {len(completions)} completions sent to it, "
              f"{sum(ln.startswith('/metrics') for ln in asked)} /metrics reads; "
              f"{log.count(f'{inst}: not judged: no request served since the last check')} 'not judged'; "
              f"{record.get('restarts', 0)} restarts")
        assert completions == [] and not record.get("restarts") and not record.get("bad")
        assert log.count(f"{inst}: not judged: no request served since the last check") == checks
    finally:
        unserve_stub(lab, name, "sleepy")


def test_a_wedged_sleeping_instance_is_restarted(host):
    lab, name = host
    try:
        inst = sleeping(lab, name)
        on_host(lab, name, f"touch {WEDGE}")
        doc = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        on_host(lab, name, f"setsid -f curl -s -m 120 http://127.0.0.1:{PORTS[inst]}/v1/chat/completions "
                           f"-H 'Content-Type: application/json' -d {shlex.quote(doc)} >/dev/null 2>&1 </dev/null")
        metrics = f"curl -s http://127.0.0.1:{PORTS[inst]}/metrics"
        assert until(lambda: "llamacpp:requests_deferred 1" in on_host(lab, name, metrics), 10)
        held = on_host(lab, name, metrics).split("\n")
        before, since = pid(lab, name, inst), int(time.time())
        on_host(lab, name, "systemctl start rigup-watchdog.timer")
        queued = time.monotonic()
        try:
            restarted = until(lambda: pid(lab, name, inst) not in (before, "0"), 6 * EVERY_S + 20, poll=0.3)
            took = time.monotonic() - queued
        finally:
            on_host(lab, name, "systemctl stop rigup-watchdog.timer")
        log = journal(lab, name, "rigup-watchdog", since)
        wedged = re.findall(rf"{inst}: wedged: (\d+) requests waiting and no token generated since the last check"
                            rf"[^\n]*\((\d) of {K} checks in a row\)", log)
        why = [ln for ln in log.splitlines() if "restarting" in ln]
        figures = until(lambda: (f := exported(lab, name)) and f.get(series("restarts_total", inst))
                        and f, 10) or exported(lab, name)
        print(f"\nwedged ({', '.join(ln for ln in held if ln)}): restarted {took:.1f} s after the timer started "
              f"(every {EVERY_S} s, {K} bad checks); wedged checks {wedged}; journal: {why}; restarts_total "
              f"{figures.get(series('restarts_total', inst))}")
        assert restarted and took <= 3 * EVERY_S + 4     # about three intervals (each check takes its time)
        assert [n for _, n in wedged][:K] == [str(i) for i in range(1, K + 1)] and wedged[0][0] == "1"
        assert any(f"restarting {unit(inst)}" in ln and "wedged: 1 requests waiting" in ln for ln in why), why
        assert figures[series("restarts_total", inst)] == 1
    finally:
        lab.ssh(name, f"rm -f {WEDGE}")
        unserve_stub(lab, name, "sleepy")


# ----------------------------------------------------------------------------- 4. a router's model failing
def statuses(lab, name: str, port: int) -> dict:
    """A router's /models: each model's status, without its command line and preset."""
    listed = json.loads(on_host(lab, name, f"curl -s http://127.0.0.1:{port}/models"))["data"]
    return {m["id"]: {k: v for k, v in m["status"].items() if k not in ("args", "preset")} for m in listed}


def failing_twice(lab, name: str, inst: str, good: str, bad: str, ready) -> dict:
    """Router ``inst`` asked for ``bad`` (its load fails), then K checks of the watchdog; once
    restarted and ``ready()``, asked for it again, K checks more; then asked for ``good``. What each
    step gave: the answers, /models after the first, the pids, the journal, the watchdog's record."""
    port, since, first = PORTS.get(inst, DUO_PORT), int(time.time()), pid(lab, name, inst)
    code, answer = ask(lab, name, port, bad)
    shown = statuses(lab, name, port)
    watchdog_check(lab, name, K)
    restarted = until(lambda: pid(lab, name, inst) not in (first, "0"), 30)
    assert restarted and ready(), statuses(lab, name, port)
    second = pid(lab, name, inst)
    again, _ = ask(lab, name, port, bad)                # asked again after the restart: fails again
    watchdog_check(lab, name, K)
    time.sleep(2)                                       # a restart (--no-block) would have begun by now
    answered, body = ask(lab, name, port, good)
    return {"code": code, "answer": answer, "shown": shown, "pids": [first, second, pid(lab, name, inst)],
            "again": again, "answered": answered, "body": body, "log": journal(lab, name, "rigup-watchdog", since),
            "record": state(lab, name)[inst]}


def test_a_router_model_that_fails_to_load_is_restarted_once(host):
    lab, name = host
    inst, (good, bad) = "router", ROUTERS["router"]
    port = PORTS[inst]
    fresh(lab, name)
    try:
        serve_stub(lab, name, inst, port, tps=200, extra=("--router", f"{good},{bad}", "--fail-model", bad))
        got = failing_twice(lab, name, inst, good, bad,
                            lambda: until(lambda: lab.ssh(name, f"curl -sf http://127.0.0.1:{port}/health").returncode == 0, 20))
        lines = [ln for ln in got["log"].splitlines() if f"model {bad}" in ln]
        record, (first, second, third) = got["record"], got["pids"]
        print(f"\n{bad}: HTTP {got['code']}, /models {got['shown']}\n" + "\n".join(lines)
              + f"\npids {first} -> {second} -> {third}; restarts {record.get('restarts')}, escalations "
                f"{record.get('escalations')}; {bad} asked again: HTTP {got['again']}; {good}: HTTP {got['answered']}")
        assert got["code"] == 500 and got["shown"][bad] == {"value": "unloaded", "failed": True, "exit_code": 1}
        assert any(f"model {bad} failed to load (exit code 1) (1 of {K} checks in a row)" in ln for ln in lines)
        assert any(f"model {bad} failed to load (exit code 1) in {K} checks in a row; restarting {unit(inst)}" in ln
                   for ln in lines)
        assert any(f"model {bad} still fails to load (exit code 1) after its restart by the watchdog: not restarting "
                   "it again" in ln for ln in lines)
        assert record["restarts"] == 1 and record["escalations"] == 1 and third == second
        assert got["again"] == 500 and got["answered"] == 200 and json.loads(got["body"])["usage"]["completion_tokens"] == 8
    finally:
        unserve_stub(lab, name, inst)


# ----------------------------------------------------------------------------- 4, for real: a truncated GGUF
DUO_PORT = 8091
DUO = {"model": "gemma-270m", "also": ["tiny"], "models_max": 1, "port": DUO_PORT, "ctx": 2048, "parallel": 1,
       "ngl": 0, "min_tokens_per_s": 1, "per_model": {"tiny": {"ctx": 512}}}


@pytest.fixture(scope="module")
def duo(host, tmp_path_factory):
    """The lab's real llama-server as a router (test_router.py's ``duo``: Gemma 3 270M and the smoke
    model rigup ships, published on the lab's hub as ``tiny``) converged on the host by deploy.py (the
    llama.cpp build, the models' fetch); the watchdog watches it alone. Only the test that uses it
    pays for the build."""
    import yaml

    from tests.converge import ROOT
    from tests.lab import hub, models, sources
    from tests.roles.watch_lab import run_play

    lab, name = host
    sources.llama_cpp_mirror()
    sources.serve()
    hub.serve()
    models.publish_gemma()
    revision = hub.publish("rigup-lab/smoke-tiny-GGUF", {"smoke.gguf": ROOT / "roles/llama_cpp/smoke.gguf"})
    catalog = {**yaml.safe_load((ROOT / "group_vars/lab.yml").read_text())["models"],
               "tiny": {"repo": "rigup-lab/smoke-tiny-GGUF", "revision": revision, "include": ["*.gguf"],
                        "size_gib": 0.01, "wait": True}}
    data = {**SETTINGS, "models": catalog, "llama_server_instances": {"duo": DUO}}
    run = run_play(tmp_path_factory.mktemp("duo"), "deploy.py", {name: data})
    print(f"\n{name}: duo (llama-server's router: gemma-270m + tiny) converged by deploy.py in {run.seconds:.0f} s")
    on_host(lab, name, "systemctl stop rigup-watchdog.timer")
    return lab, name


def loaded(lab, name: str, port: int, model: str) -> dict | None:
    """The router's /models once ``model`` reads loaded (within 120 s), else None."""
    return until(lambda: (seen := statuses(lab, name, port)).get(model, {}).get("value") == "loaded" and seen, 120)


def test_a_real_router_whose_model_file_is_truncated_is_restarted_once(duo):
    """A swap first (tiny whole): not a failure, nothing restarted. Then tiny's GGUF cut to half and
    the router restarted, asked for tiny once Gemma has loaded (a model evicted while it still loads
    reads failed too, exit code 1: see the report of issue 65)."""
    lab, name = duo
    svc, port, (good, bad) = unit("duo"), DUO_PORT, ("gemma-270m", "tiny")
    on_host(lab, name, f"rm -f {STATE}")
    assert loaded(lab, name, port, good), statuses(lab, name, port)
    swapped, _ = ask(lab, name, port, bad)              # a swap: Gemma evicted, tiny loaded
    after_swap = statuses(lab, name, port)
    watchdog_check(lab, name, K)
    swaps_restarts = state(lab, name)["duo"].get("restarts", 0)
    print(f"\nswap (tiny whole): HTTP {swapped}; /models {after_swap}; {K} checks: {swaps_restarts} restarts")
    assert swapped == 200 and not after_swap[good].get("failed") and swaps_restarts == 0

    gguf = on_host(lab, name, "grep -h '^model *= *.*smoke.gguf' /etc/rigup/llama-server/duo.models.ini "
                              "| head -n 1 | sed 's/^model *= *//'").strip()
    size = int(on_host(lab, name, f"stat -L -c %s {shlex.quote(gguf)}"))
    # cut to half (its header whole, its tensors not), then a fresh router: nothing of it mapped
    on_host(lab, name, f"truncate -s {size // 2} {shlex.quote(gguf)} && systemctl restart {svc} && rm -f {STATE}")
    assert loaded(lab, name, port, good), statuses(lab, name, port)
    got = failing_twice(lab, name, "duo", good, bad, lambda: loaded(lab, name, port, good))
    code, shown, log, record, (first, second, third) = got["code"], got["shown"], got["log"], got["record"], got["pids"]
    lines = [ln for ln in log.splitlines() if "model " in ln]
    print(f"{bad}'s GGUF cut from {size} to {size // 2} bytes: HTTP {code} ({got['answer'][:100]}); /models {shown}\n"
          + "\n".join(lines) + f"\npids {first} -> {second} -> {third}; restarts {record.get('restarts')}, "
          f"escalations {record.get('escalations')}; {bad} asked again: HTTP {got['again']}; {good}: HTTP {got['answered']}")
    assert code == 500 and shown[bad]["failed"] is True and shown[bad]["exit_code"] == 1 and not shown[good].get("failed")
    assert any(f"model {bad} failed to load (exit code 1) in {K} checks in a row; restarting {svc}" in ln for ln in lines)
    assert any(f"model {bad} still fails to load (exit code 1) after its restart by the watchdog: not restarting it "
               "again" in ln for ln in lines), lines
    assert f"model {good}" not in log
    assert record["restarts"] == 1 and record["escalations"] == 1 and third == second
    assert got["again"] == 500 and got["answered"] == 200 and json.loads(got["body"])["usage"]["completion_tokens"] > 0
