"""roles/metrics on the lab: the session's 2 lab hosts (serving Gemma with llama-server) run the
node exporter and the relay; the first is also in the group `monitoring` (tests/roles/lab_monitoring.py)
and runs Prometheus on its inventory address, which scrapes both: the simulated GPUs' power draw
per card (written by the GPU guard) and llama-server's token counters come back from its HTTP API;
stopping a serving unit fires LlamaServerDown within its `for:`; an Xid 79 (the lab's stand-in
for the driver's line) trips a host's guard, fires GpuGuardTripped and shows in status.py; the other host, outside the
monitoring group, gets a TCP reset on the monitoring host's node exporter, relay and Prometheus
(their nftables allow-lists) while Prometheus scrapes both hosts, also after `nft flush ruleset`
and a restart, and after a reboot; turned off or back on loopback the tables go; a configuration
promtool rejects never goes live; a second converge changes nothing."""

import json
import time

import pytest

from roles.metrics import promote_command
from tests.conftest import on_host
from tests.converge import converge
from tests.roles.watch_lab import api, until  # one copy: the watch tests share them

pytestmark = pytest.mark.lab
INVENTORY = "tests/roles/lab_monitoring.py"
FOR_S, EVERY_S = 5, 2
FAST = ["--data", f"prometheus_alert_for_s={FOR_S}", "--data", f"prometheus_scrape_interval_s={EVERY_S}"]
UNIT = "rigup-llama@gemma.service"
# One check of the GPU guard now, as its timer runs it (every gpu_guard_interval_s, 10 s on the session's
# hosts, which later modules converge as they are): what it writes reaches Prometheus at the next scrape.
GUARD_NOW = "systemctl start rigup-gpu-guard.service"
ASK = ("curl -sf http://127.0.0.1:8081/v1/chat/completions -H 'Content-Type: application/json' "
       "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Count to five.\"}],\"max_tokens\":12}'")


@pytest.fixture(scope="module")
def hosts(lab, second_converge):
    """(monitoring host, other host), converged twice with the monitoring inventory."""
    first = converge(INVENTORY, *FAST)
    again = converge(INVENTORY, *FAST)
    print(f"\nmonitoring converge {first.seconds:.1f} s ({first.totals['changed']} changed); "
          f"again {again.seconds:.1f} s: {again.totals['changed']} changed")
    assert again.totals["changed"] == 0, again.changed_operations()
    names = [h["name"] for h in lab.hosts()]
    return names[0], names[1]


def test_bound_to_the_inventory_address_never_every_interface(lab, hosts):
    for h in lab.hosts():
        listening = on_host(lab, h["name"], "ss -Hltn")
        for port in (9100, 9101):
            assert f"{h['address']}:{port} " in listening and f"0.0.0.0:{port} " not in listening
    monitor, other = hosts
    assert f"{lab.hosts()[0]['address']}:9090 " in on_host(lab, monitor, "ss -Hltn")


def test_prometheus_has_every_card_and_the_token_counters(lab, hosts):
    monitor, other = hosts
    on_host(lab, other, f"rigup-gpu-sim set -i 0 --draw 180 --temp 70 && {GUARD_NOW}")
    query = 'rigup_gpu_power_draw_watts{host="%s",gpu="0"} == 180' % other
    started = time.monotonic()
    assert until(lambda: api(lab, monitor, "query", query=query)["result"]), "180 W never reached Prometheus"
    print(f"GPU 0 of {other} at 180 W seen through Prometheus after {time.monotonic() - started:.1f} s")
    # every host's cards: each host's guard writes its own file, on its own timer
    def every_host():
        found = api(lab, monitor, "query", query="rigup_gpu_power_draw_watts")["result"]
        return found if {x["metric"]["host"] for x in found} == set(hosts) else None
    draws = until(every_host) or []
    per_host = {}
    for series in draws:
        per_host.setdefault(series["metric"]["host"], {})[series["metric"]["gpu"]] = float(series["value"][1])
    print("power draw per card (W): " + "; ".join(f"{h}: {sorted(c.items())}" for h, c in sorted(per_host.items())))
    assert sorted(per_host) == sorted(hosts) and all(len(cards) == 8 for cards in per_host.values())
    labels = draws[0]["metric"]
    assert labels["class"] == "a100" and labels["uuid"].startswith("GPU-")
    for name in ("temperature_celsius", "sm_clock_hertz", "memory_used_bytes", "pcie_link_width", "guard_tripped"):
        assert api(lab, monitor, "query", query=f"rigup_gpu_{name}")["result"], name
    for h in hosts:
        on_host(lab, h, ASK)
    tokens = until(lambda: (r := api(lab, monitor, "query", query="llamacpp:tokens_predicted_total > 0")["result"])
                   and len(r) == 2 and r)
    assert tokens, "llama-server's token counters of both hosts never reached Prometheus"
    print("llamacpp:tokens_predicted_total: " + ", ".join(f"{t['metric']['instance']} {t['value'][1]}" for t in tokens))
    for h in hosts:   # more tokens after the counters were scraped: a rate above 0
        on_host(lab, h, ASK)
    energy = until(lambda: api(lab, monitor, "query", query="rigup:host_joules_per_token")["result"])
    print("rigup:host_joules_per_token (the cards' draw over the tokens generated per second): "
          + ", ".join(f"{e['metric']['host']} {float(e['value'][1]):,.0f} J" for e in energy or []))
    assert energy and all(float(e["value"][1]) > 0 for e in energy)
    # status.py reads the figure from the monitoring host's Prometheus, into every host's row
    from tests.converge import pyinfra
    table = pyinfra(INVENTORY, "status.py", *FAST, timeout=120).output
    out = pyinfra(INVENTORY, "status.py", *FAST, "--data", "status_format=json", timeout=120).output
    start = out.index('{\n "hosts"')
    rows = json.loads(out[start:out.index("\n}\n", start) + 2])["hosts"]
    shown = {r["host"]: r.get("joules_per_token") for r in rows}
    print(f"status.py:\n{table}\njoules per token in status.py's rows: {shown}")
    assert {e["metric"]["host"] for e in energy} <= {h for h, j in shown.items() if j and j > 0}
    assert all("J/tok" in ln for ln in table.splitlines() if ln.split() and ln.split()[0] in
               {e["metric"]["host"] for e in energy})
    on_host(lab, other, "rigup-gpu-sim set -i 0 --draw 60 --temp 35")


def firing(lab, monitor: str, name: str, instance: str) -> bool:
    return any(a["labels"]["alertname"] == name and a["labels"].get("instance") == instance and a["state"] == "firing"
               for a in api(lab, monitor, "alerts")["alerts"])


def test_a_stopped_instance_fires_llama_server_down_within_its_for(lab, hosts):
    monitor, other = hosts
    instance = f"{other}/gemma"
    up = f'up{{job="llama-server",instance="{instance}"}} == 1'
    assert until(lambda: api(lab, monitor, "query", query=up)["result"])
    on_host(lab, other, f"systemctl stop {UNIT}")
    stopped = time.monotonic()
    try:
        assert until(lambda: firing(lab, monitor, "LlamaServerDown", instance), timeout=60), "no alert within 60 s"
        took = time.monotonic() - stopped
        print(f"LlamaServerDown for {instance} fired {took:.1f} s after the unit stopped "
              f"(for: {FOR_S} s, scrape and evaluation every {EVERY_S} s)")
        assert took <= FOR_S + 3 * EVERY_S + 5
        assert not firing(lab, monitor, "LlamaServerDown", f"{monitor}/gemma")
    finally:
        on_host(lab, other, f"systemctl start {UNIT}")
    assert until(lambda: not firing(lab, monitor, "LlamaServerDown", instance), timeout=90)


def test_an_xid_79_trips_the_guard_fires_its_alert_and_shows_in_status(lab, hosts):
    """A card of the other host falls off the bus (the driver's Xid 79 line, from the lab's
    stand-in): its guard trips at once; Prometheus has the card's Xid count and fires
    GpuGuardTripped for that host; status.py names the Xid."""
    from tests.converge import pyinfra

    monitor, other = hosts
    line = on_host(lab, other, "rigup-gpu-sim xid 79 -i 2 --lost").strip()
    since = time.monotonic()
    on_host(lab, other, GUARD_NOW)
    try:
        fired = until(lambda: any(a["labels"]["alertname"] == "GpuGuardTripped" and a["labels"].get("host") == other
                                  and a["state"] == "firing" for a in api(lab, monitor, "alerts")["alerts"]), timeout=60)
        assert fired, api(lab, monitor, "alerts")
        took = time.monotonic() - since
        bus = api(lab, monitor, "query", query=f'rigup_gpu_xid_events{{host="{other}",class="bus"}}')["result"]
        table = pyinfra("inventory/lab.py", "status.py", "--limit", other, timeout=120).output
        print(f"Xid 79 on {other}'s GPU 2: GpuGuardTripped firing {took:.1f} s after the line; "
              f"rigup_gpu_xid_events {[(r['metric'].get('gpu'), r['value'][1]) for r in bus]}\n{table}")
        # this boot's count: 1, or more when an earlier module of the session did the same to this card
        assert len(bus) == 1 and int(bus[0]["value"][1]) >= 1 and bus[0]["metric"]["bus"] == "0000:47:00"
        assert "TRIPPED" in table and "Xid 79 (bus: GPU has fallen off the bus) on GPU 2" in table
        assert line.endswith("GPU has fallen off the bus.")
    finally:
        on_host(lab, other, f"rigup-gpu-sim set -i 2 --found; /opt/rigup/bin/rigup-gpu-guard clear >/dev/null; "
                            f"systemctl start {UNIT}; {GUARD_NOW}")
    assert until(lambda: not any(a["labels"]["alertname"] in ("GpuGuardTripped", "LlamaServerDown")
                                 and a["state"] == "firing" for a in api(lab, monitor, "alerts")["alerts"]), timeout=90)


PORTS = {"node exporter": (9100, "/metrics"), "relay": (9101, "/metrics/gemma"), "Prometheus": (9090, "/-/healthy")}
TABLES = {"rigup_metrics": ("prometheus-node-exporter", "rigup-metrics-relay"), "rigup_prometheus": ("prometheus",)}


def probe(lab, source: str, target: str, what: str) -> str:
    """What ``source`` gets from ``target``'s listener ``what`` (PORTS): HTTP CODE, or curl's exit
    (7: connection refused, the TCP reset of an allow-list; 56: reset later)."""
    port, path = PORTS[what]
    address = next(h["address"] for h in lab.hosts() if h["name"] == target)
    result = lab.ssh(source, f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://{address}:{port}{path}")
    return f"HTTP {result.stdout.strip()}" if result.returncode == 0 else f"curl exit {result.returncode}"


def outside_gets_resets(lab, hosts, when: str) -> None:
    """The host outside the monitoring group gets a reset on each of the monitoring host's
    listeners (all three listen on its inventory address), and Prometheus scrapes both hosts."""
    monitor, other = hosts
    got = {what: probe(lab, other, monitor, what) for what in PORTS}
    print(f"{when}: {other} (not monitoring) -> {monitor}: "
          + ", ".join(f"{what} :{PORTS[what][0]} {answer}" for what, answer in got.items()))
    assert all(answer in ("curl exit 7", "curl exit 56") for answer in got.values()), got
    scraped = {what: probe(lab, monitor, other, what) for what in ("node exporter", "relay")}
    print(f"{when}: {monitor} (monitoring) -> {other}: "
          + ", ".join(f"{what} :{PORTS[what][0]} {answer}" for what, answer in scraped.items()))
    assert set(scraped.values()) == {"HTTP 200"}

    # the targets now (a target of an earlier address keeps its last sample a while after a restart)
    targets = {("node", f"{h['address']}:9100") for h in lab.hosts()} | {("llama-server", f"{n}/gemma") for n in hosts}

    def all_up():
        try:      # Prometheus may still be starting (after a restart or a boot)
            series = api(lab, monitor, "query", query='up{job=~"node|llama-server"}')["result"]
        except (AssertionError, ValueError):
            return None
        found = {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in series}
        return found if all(found.get(t) == "1" for t in targets) else None
    up = until(all_up, timeout=90)
    assert up, api(lab, monitor, "query", query="up")["result"]
    print(f"{when}: Prometheus up: " + ", ".join(f"{job} {i} {up[job, i]}" for job, i in sorted(targets)))


def test_outside_the_monitoring_group_the_metrics_ports_reset(lab, hosts):
    for name in hosts:
        tables = on_host(lab, name, "nft list tables")
        print(f"{name}: {' '.join(tables.split())}")
        assert "table inet rigup_metrics" in tables
    assert "table inet rigup_prometheus" in on_host(lab, hosts[0], "nft list tables")
    outside_gets_resets(lab, hosts, "converged")


def test_a_flushed_ruleset_comes_back_with_the_next_start(lab, hosts):
    """`nft flush ruleset` takes the tables away (the ports are open then); each unit's drop-in
    loads its table again at its next start."""
    monitor, other = hosts
    on_host(lab, monitor, "nft flush ruleset")
    try:
        opened = {what: probe(lab, other, monitor, what) for what in PORTS}
        print(f"flushed: {other} -> {monitor}: " + ", ".join(f"{w} {a}" for w, a in opened.items()))
        # the fault is real: every port takes the connection (the relay's own check answers 403)
        assert opened == {"node exporter": "HTTP 200", "relay": "HTTP 403", "Prometheus": "HTTP 200"}, opened
    finally:
        on_host(lab, monitor, "systemctl restart prometheus-node-exporter prometheus")
    outside_gets_resets(lab, hosts, "restarted")


def test_the_allow_lists_are_loaded_at_boot_before_the_units_listen(lab, hosts):
    monitor, _ = hosts
    started = time.monotonic()
    lab.reboot(monitor)
    print(f"{monitor} rebooted in {time.monotonic() - started:.1f} s")
    assert until(lambda: lab.ssh(monitor, "systemctl is-active prometheus prometheus-node-exporter "
                                          "rigup-metrics-relay").returncode == 0, timeout=120)
    tables = on_host(lab, monitor, "nft list tables")
    assert "table inet rigup_metrics" in tables and "table inet rigup_prometheus" in tables
    for table, units in TABLES.items():
        for unit in units:     # each unit's start loaded it (no other unit loads rigup's tables)
            pre = on_host(lab, monitor, f"systemctl show -p ExecStartPre {unit}")
            assert f"/etc/rigup/{table.removeprefix('rigup_')}.nft" in pre, pre
    outside_gets_resets(lab, hosts, "after a reboot")


def rigup_state(lab, name: str) -> str:
    """Host ``name``'s rigup tables, drop-ins and the three units' states, in one line."""
    units = "prometheus-node-exporter rigup-metrics-relay prometheus"
    return " ".join(lab.ssh(name, f"nft list tables | grep -o 'rigup_[a-z]*'; ls /etc/systemd/system/*.d/rigup-allow-list.conf "
                                  f"2>/dev/null; systemctl is-active {units}; ss -Hltn | grep -Eo '[^ ]+:(9100|9101|9090) '"
                            ).stdout.split())


def test_off_or_back_on_loopback_the_allow_lists_go(lab, hosts):
    """Turned off, the listeners stop and their tables, files and drop-ins go; back on loopback
    they listen there with no table; then back as they were (the next test's converge: 0 changes)."""
    off = converge(INVENTORY, *FAST, "--data", "metrics_enabled=false", "--data", "prometheus_enabled=false")
    print(f"off: {off.seconds:.1f} s ({off.totals['changed']} changed)")
    for name in hosts:
        state = rigup_state(lab, name)
        print(f"off: {name}: {state}")
        assert state == "inactive inactive inactive"
    loopback = converge(INVENTORY, *FAST, "--data", "metrics_address=127.0.0.1", "--data", "prometheus_address=127.0.0.1")
    print(f"on loopback: {loopback.seconds:.1f} s ({loopback.totals['changed']} changed)")
    for name in hosts:
        state = rigup_state(lab, name)
        print(f"on loopback: {name}: {state}")
        assert state.startswith("active active ") and "rigup_" not in state
        assert all(a.startswith("127.0.0.1:") for a in state.split()[3:]) and "127.0.0.1:9100" in state
    back = converge(INVENTORY, *FAST)
    print(f"back: {back.seconds:.1f} s ({back.totals['changed']} changed); {hosts[0]}: {rigup_state(lab, hosts[0])}")
    outside_gets_resets(lab, hosts, "back")


def test_a_configuration_promtool_rejects_never_goes_live(lab, hosts):
    """The role's own promote command on a broken candidate: it stops at promtool, the live files
    stay, Prometheus keeps running them."""
    monitor, _ = hosts
    live = on_host(lab, monitor, "sha256sum /etc/prometheus/rigup-rules.yml /etc/prometheus/prometheus.yml")
    on_host(lab, monitor, "cp /etc/prometheus/*.yml /etc/prometheus/*.json /etc/prometheus/rigup-candidate/ && "
                          "echo '  - alert: Broken' >> /etc/prometheus/rigup-candidate/rigup-rules.yml && "
                          "echo '    expr: up ==' >> /etc/prometheus/rigup-candidate/rigup-rules.yml")
    names = ["prometheus.yml", "rigup-llama.json", "rigup-node.json", "rigup-rules.yml"]
    result = lab.ssh(monitor, promote_command(names))
    print(f"promote with a broken rule: exit {result.returncode}: {(result.stdout + result.stderr).strip()[-200:]}")
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr
    assert on_host(lab, monitor, "sha256sum /etc/prometheus/rigup-rules.yml /etc/prometheus/prometheus.yml") == live
    assert on_host(lab, monitor, "systemctl is-active prometheus").strip() == "active"
    assert api(lab, monitor, "query", query="up")["result"]
    again = converge(INVENTORY, *FAST)
    assert again.totals["changed"] == 0, again.changed_operations()      # the live files are the checked ones
