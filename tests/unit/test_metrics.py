"""roles/metrics's pure parts (roles/metrics/prometheus.py, checks.py) and the guard's metrics
file (roles/gpu_guard/shipped/guard.py metrics_text), on plain data."""

import http.server
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rigup.config import group_vars
from rigup.firewall import Firewall, dropin_text
from rigup.refusal import Fleet
from roles.metrics import allow, promote_command
from roles.metrics.checks import check_addresses, check_allow_lists, check_systemd, ports
from roles.metrics.prometheus import config_files, inventory_address, relay_config, targets
from roles.gpu_guard.shipped.guard import metrics_text, parse_sample
from roles.metrics.shipped import relay as _relay
from tests.unit.world import remade

_remade = remade(_relay.throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)

DATA = {**group_vars("all"), "llama_server_instances": {
    "glm": {"model": "m", "port": 8081},
    "quiet": {"model": "m", "port": 8082, "metrics": False},
    "keyed": {"model": "m", "port": 8083, "host": "10.0.0.5", "api_key": True}}}
FLEET = [("rig-1", {**DATA, "ssh_hostname": "10.0.0.5", "prometheus_enabled": True}),
         ("rig-2", {**DATA, "ssh_hostname": "rig-2.example"}),
         ("local", {**DATA, "ssh_hostname": "@local"}),
         ("off", {**DATA, "ssh_hostname": "10.0.0.9", "metrics_enabled": False})]


def test_addresses_come_from_the_inventory_or_loopback():
    assert [inventory_address(n, d) for n, d in FLEET] == ["10.0.0.5", "rig-2.example", "127.0.0.1", "10.0.0.9"]


def test_relay_reaches_each_instance_with_metrics_and_answers_monitors_only():
    config = relay_config("rig-2", FLEET[1][1], FLEET)
    assert config["listen"] == ["rig-2.example", 9101]
    assert config["allow"] == ["10.0.0.5", "127.0.0.1", "::1", "rig-2.example"]
    assert config["instances"] == {"glm": {"url": "http://127.0.0.1:8081", "key": None},
                                   "keyed": {"url": "http://10.0.0.5:8083", "key": "/etc/rigup/llama-server/keyed.key"}}


def test_targets_cover_every_host_with_metrics_except_others_loopback():
    node, llama = targets("rig-1", FLEET).values()
    assert [g["targets"] for g in node] == [["10.0.0.5:9100"], ["rig-2.example:9100"]]
    assert [(g["labels"]["instance"], g["labels"]["__metrics_path__"], g["targets"][0]) for g in llama] == [
        ("rig-1/glm", "/metrics/glm", "10.0.0.5:9101"), ("rig-1/keyed", "/metrics/keyed", "10.0.0.5:9101"),
        ("rig-2/glm", "/metrics/glm", "rig-2.example:9101"), ("rig-2/keyed", "/metrics/keyed", "rig-2.example:9101")]
    assert [g["labels"]["host"] for g in targets("local", FLEET)["rigup-node.json"]] == ["local", "rig-1", "rig-2"]


def test_prometheus_files_are_relative_and_the_alerts_hold_for_the_setting():
    files = config_files("rig-1", {**FLEET[0][1], "prometheus_alert_for_s": 7}, FLEET)
    assert sorted(files) == ["prometheus.yml", "rigup-llama.json", "rigup-node.json", "rigup-rules.yml"]
    conf = yaml.safe_load(files["prometheus.yml"])
    assert conf["rule_files"] == ["rigup-rules.yml"] and conf["global"]["scrape_interval"] == "15s"
    listed = yaml.safe_load(files["rigup-rules.yml"])["groups"][0]["rules"]
    rules = {r["alert"]: r for r in listed if "alert" in r}
    assert [r for r in listed if "record" in r] == [{
        "record": "rigup:host_joules_per_token", "expr": "sum by (host) (rigup_gpu_power_draw_watts) / (sum by (host) "
                                                          "(rate(llamacpp:tokens_predicted_total[5m])) > 0)"}]
    assert rules["LlamaServerDown"] == {**rules["LlamaServerDown"], "expr": 'up{job="llama-server"} == 0', "for": "7s"}
    assert set(rules) == {"LlamaServerDown", "NodeExporterDown", "GpuGuardTripped", "GpuSuspect", "GpuTelemetryLost", "GpuGuardSilent",
                          "ThroughputBelowFloor", "ModelDownloadFailed", "ModelDownloadStalled"}
    assert rules["ModelDownloadFailed"]["for"] == "0s" and "failed" in rules["ModelDownloadFailed"]["expr"]
    assert json.loads(files["rigup-node.json"])[0]["labels"] == {"host": "rig-1"}
    command = promote_command(sorted(files))
    assert command.index("promtool check rules") < command.index("cp ") < command.index("reload-or-restart")


def test_refusals_and_ports():
    assert check_addresses({}, {}, {"metrics_address": "0.0.0.0", "prometheus_address": "127.0.0.1"})[0].what \
        == "metrics_address is 0.0.0.0"
    assert check_systemd({}, {"systemd": False}, {"prometheus_enabled": True})
    assert not check_systemd({}, {"systemd": False}, {"prometheus_enabled": False})
    assert [p.port for p in ports({"systemd": True}, FLEET[0][1])] == [9100, 9101, 9090]
    assert ports({"systemd": False}, {**DATA, "prometheus_enabled": False}) == []


def test_the_guard_metrics_file_labels_each_card():
    cards, lost = parse_sample(["0, GPU-a, 00000000:07:00.0, 0x20B210DE, 61.50, 400.00, 40, 1024, 1410, 45, 4, 16, 4, 16",
                                "Unable to determine the device handle for GPU 0000:0A:00.0: Unknown Error"], 15)
    config = {"by_pci_id": {"10de:20b2": {"class": "a100"}}, "interval_s": 10}
    text = metrics_text(cards, lost, False, config, 1796030000.125)
    assert 'rigup_gpu_power_draw_watts{gpu="0",uuid="GPU-a",class="a100"} 61.5' in text
    assert 'rigup_gpu_memory_used_bytes{gpu="0",uuid="GPU-a",class="a100"} 1073741824' in text
    assert 'rigup_gpu_sm_clock_hertz{gpu="0",uuid="GPU-a",class="a100"} 1410000000' in text
    assert 'rigup_gpu_utilization_ratio{gpu="0",uuid="GPU-a",class="a100"} 0.45' in text
    assert "rigup_gpu_telemetry_lost 1\n" in text and "rigup_gpu_guard_tripped 0\n" in text
    assert "rigup_gpu_guard_last_run_timestamp_seconds 1796030000.125\n" in text
    tripped = metrics_text([], None, True, config, 5)
    assert "rigup_gpu_guard_tripped 1\n" in tripped and "telemetry_lost" not in tripped and "power" not in tripped


def test_the_allow_lists_admit_loopback_the_monitoring_hosts_and_the_declared_ones():
    fleet = [*FLEET, ("mon-2", {**DATA, "ssh_hostname": "fd00::2", "prometheus_enabled": True})]
    text = allow.metrics_text({**DATA, "metrics_allow": ["192.0.2.7"]}, fleet)
    print(text)
    assert 'iifname "lo" tcp dport { 9100, 9101 } accept' in text
    assert "tcp dport { 9100, 9101 } ip saddr { 10.0.0.5, 192.0.2.7 } accept" in text
    assert "tcp dport { 9100, 9101 } ip6 saddr { fd00::2 } accept" in text
    assert text.index("accept") < text.index("tcp dport { 9100, 9101 } reject with tcp reset")
    assert "10.0.0.9" not in text and "rig-2" not in text      # hosts that only export are not let in
    assert text.splitlines()[3:5] == ["table inet rigup_metrics", "delete table inet rigup_metrics"]
    prom = allow.prometheus_text({**DATA, "prometheus_allow": ["198.51.100.3"]}, fleet)
    assert "tcp dport { 9090 } ip saddr { 10.0.0.5, 198.51.100.3 } accept" in prom
    assert "tcp dport { 9090 } ip6 saddr { fd00::2 } accept" in prom and "inet rigup_prometheus {" in prom
    # the relay answers whom its allow-list admits
    assert "192.0.2.7" in relay_config("rig-2", {**FLEET[1][1], "metrics_allow": ["192.0.2.7"]}, FLEET)["allow"]


def test_an_allow_list_only_for_a_bind_beyond_loopback():
    assert allow.exposed("rig-1", FLEET[0][1], "metrics_address")                     # its inventory address
    assert allow.exposed("rig-2", FLEET[1][1], "metrics_address")                     # a name: beyond
    assert not allow.exposed("local", FLEET[2][1], "metrics_address")                 # @local: 127.0.0.1
    assert not allow.exposed("rig-1", FLEET[0][1], "prometheus_address")              # 127.0.0.1 by default
    assert allow.exposed("rig-1", {**FLEET[0][1], "prometheus_address": None}, "prometheus_address")


def test_each_unit_loads_its_allow_list_before_it_starts_and_after_nftables():
    text = dropin_text("/etc/rigup/metrics.nft")
    assert "ExecStartPre=+/usr/sbin/nft -f /etc/rigup/metrics.nft" in text.splitlines()
    assert "After=nftables.service" in text.splitlines()     # a ruleset nftables.service flushes comes first
    fact = Firewall()
    fact.command("/etc/rigup/metrics.nft", "rigup_metrics", ("a.service", "b.service"))
    assert fact.process(["sha=ab", "loaded=1", "dropin a.service=cd", "dropin b.service="]) == {
        "sha": "ab", "loaded": True, "dropins": {"a.service": "cd", "b.service": ""}}


def test_a_monitoring_host_the_allow_list_cannot_name_is_refused_on_the_hosts_it_scrapes():
    hosts = {"mon": {**DATA, "ssh_hostname": "mon.example", "prometheus_enabled": True, "prometheus_address": None},
             "rig": {**DATA, "ssh_hostname": "10.0.0.7"}, "quiet": {**DATA, "ssh_hostname": "10.0.0.8",
                                                                   "metrics_address": "127.0.0.1"}}
    found = check_allow_lists({}, {"systemd": True}, hosts["rig"], Fleet("rig", hosts))
    print(found[0].line("rig"))
    assert [r.what for r in found] == ["metrics_address (the node exporter and the relay, no key) listens on "
                                       "10.0.0.7 without an allow-list"]
    assert "mon.example" in found[0].why and "set mon's ssh_hostname" in found[0].fix
    assert [r.what.split(" (")[0] for r in check_allow_lists({}, {}, hosts["mon"], Fleet("mon", hosts))] == [
        "metrics_address", "prometheus_address"]
    assert check_allow_lists({}, {}, hosts["quiet"], Fleet("quiet", hosts)) == []          # loopback: no list
    assert check_allow_lists({}, {"systemd": False}, hosts["rig"], Fleet("rig", hosts)) == []   # no exporter
    named = {**hosts, "mon": {**hosts["mon"], "ssh_hostname": "10.0.0.5"}}
    assert check_allow_lists({}, {}, named["rig"], Fleet("rig", named)) == []


def test_a_routers_models_are_scraped_labelled_and_never_loaded_by_a_scrape():
    """issue 49: a router instance (also) is relayed as its set's models: each loaded one's /metrics
    with autoload=false, labelled model (HELP and TYPE once), and rigup_router_model_loaded. The
    relay against a real router on a lab host: tests/roles/test_router.py."""
    from roles.metrics.shipped import relay
    d = {**FLEET[1][1], "llama_server_instances": {"duo": {"model": "a", "also": ["b"], "port": 8091}}}
    assert relay_config("rig-2", d, FLEET)["instances"]["duo"]["models"] == ["a", "b"]
    text = "# HELP llamacpp:tokens_predicted_total Tokens\n# TYPE llamacpp:tokens_predicted_total counter\n" \
           "llamacpp:tokens_predicted_total 12\nllamacpp:requests{slot=\"0\"} 1 1700000000\n"
    seen = set()
    first, second = relay.labelled(text, "a", seen), relay.labelled(text, "b", seen)
    assert first == ["# HELP llamacpp:tokens_predicted_total Tokens", "# TYPE llamacpp:tokens_predicted_total counter",
                     'llamacpp:tokens_predicted_total{model="a"} 12', 'llamacpp:requests{model="a",slot="0"} 1 1700000000']
    assert second == ['llamacpp:tokens_predicted_total{model="b"} 12', 'llamacpp:requests{model="b",slot="0"} 1 1700000000']


def test_a_routers_loads_are_counted_from_its_event_stream():
    """issue 49: the relay follows the router's /models/sse: per model the loads it completed, their
    seconds from loading to loaded, the last one's, the unloads; a load whose start it did not see
    counts without seconds; a model not of the set and an event without a status change nothing."""
    from roles.metrics.shipped import relay
    swaps = relay.Swaps({"url": "http://127.0.0.1:1", "models": ["a", "b"]})
    for t, model, status in ((0, "a", "loaded"), (10, "a", "unloaded"), (10, "b", "loading"), (13.5, "b", "loaded"),
                             (20, "b", "unloaded"), (20, "a", "loading"), (22, "a", "loaded"), (23, "x", "loading")):
        swaps.event({"model": model, "event": "status_change", "data": {"status": status}}, t)
    swaps.event({"model": "a", "event": "download_progress"}, 24)
    lines = [ln for ln in swaps.lines() if not ln.startswith("#")]
    print(lines)
    assert lines == ["rigup_router_events_up 0",
                     'rigup_router_model_loads_total{model="a"} 2', 'rigup_router_model_loads_total{model="b"} 1',
                     'rigup_router_model_load_seconds_total{model="a"} 2.0',
                     'rigup_router_model_load_seconds_total{model="b"} 3.5',
                     'rigup_router_model_last_load_seconds{model="a"} 2.0',
                     'rigup_router_model_last_load_seconds{model="b"} 3.5',
                     'rigup_router_model_unloads_total{model="a"} 1', 'rigup_router_model_unloads_total{model="b"} 1']


def test_a_queued_routers_waiting_requests_come_from_haproxys_stats():
    """issue 49: a router with a bounded queue (HAProxy on its port): the relay reads HAProxy's own
    qcur and qmax of the router's backend from its stats CSV on loopback, with the limit; a backend
    not there, or no answer, adds nothing."""
    import http.server
    import threading

    from roles.metrics.shipped import relay
    csv = ("# pxname,svname,qcur,qmax,scur\nllama-duo,duo-0,0,0,1\nllama-duo,BACKEND,3,7,1\n"
           "llama-other,BACKEND,9,9,0\n")

    class Stats(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(csv.encode())

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/stats;csv"
    try:
        lines = [ln for ln in relay.queue_lines({"stats": url, "backend": "llama-duo", "limit": 20})
                 if not ln.startswith("#")]
        print(lines)
        assert lines == ["rigup_router_queue_waiting 3", "rigup_router_queue_waited_max 7", "rigup_router_queue_limit 20"]
        assert relay.queue_lines({"stats": url, "backend": "llama-gone", "limit": 20}) == []
    finally:
        server.shutdown()
    # nothing answers (the socket still listens, so it is the scrape's deadline that ends the wait:
    # a short one here, TIMEOUT_S's 10 s on a host)
    assert relay.queue_lines({"stats": url, "backend": "llama-duo", "limit": 20}, time.monotonic() + 0.5) == []
    assert relay.queue_lines(None) == []
    d = {**FLEET[1][1], "llama_server_instances": {"duo": {"model": "a", "also": ["b"], "port": 8091, "queue": 20}}}
    relayed = relay_config("rig-2", d, FLEET)["instances"]["duo"]
    assert relayed["queue"] == {"stats": "http://127.0.0.1:8404/stats;csv", "backend": "llama-duo", "limit": 20}
    # the router itself (port+1), never through HAProxy's queue: the relay's event stream would hold
    # its one slot for good (the lab's 20 queued requests waited behind it)
    assert relayed["url"] == "http://127.0.0.1:8092"


def test_a_monitoring_hosts_zoned_address_is_refused_at_preflight_and_by_the_writer():
    """issue 61 (red team item 13): ipaddress keeps an IPv6 zone verbatim, so a monitoring host's
    ssh_hostname 'fe80::1%x } accept<NL>tcp dport 22 accept #' wrote a rule line of its own into the
    nft file; preflight refuses it naming the host and key, and the writer refuses it too."""
    zoned = "fe80::1%x } accept\n\t\ttcp dport 22 accept #"
    hosts = {"mon": {**DATA, "ssh_hostname": zoned, "prometheus_enabled": True, "prometheus_address": None},
             "rig": {**DATA, "ssh_hostname": "10.0.0.7"}}
    found = check_allow_lists({}, {"systemd": True}, hosts["rig"], Fleet("rig", hosts))
    print(found[0].line("rig"))
    assert len(found) == 1 and "monitoring host mon" in found[0].why and "set mon's ssh_hostname" in found[0].fix
    with pytest.raises(ValueError, match="^inet rigup_metrics: an allowed address: not the IP address of one host"):
        allow.metrics_text(hosts["rig"], sorted(hosts.items()))
    plain = allow.metrics_text(hosts["rig"], [("mon", {**hosts["mon"], "ssh_hostname": "fe80::1"})])
    assert "fe80::1" in plain and "%" not in plain and "dport 22" not in plain   # the address alone is written


def test_a_servers_own_model_label_and_a_line_separator_in_a_value_are_relayed_as_prometheus_reads_them():
    """Round 2 of issue 61: a server's sample with its own model="other" was relayed as
    {model="m",model="other"}, which fails Prometheus's whole scrape of the relay (item 27); now its
    own is server_model (rerun 2, N16: dropped, it made two series one); a label
    value holding U+2028 was split there by str.splitlines, where Prometheus reads one line (item 28)."""
    from roles.metrics.shipped import relay
    text = 'llamacpp:requests{model="other",slot="0"} 5\nllamacpp:busy{why="a\u2028b\x85c"} 1\n'
    got = relay.labelled(text, "m", set())
    print(f"{text!r} -> {got!r}")
    assert got == ['llamacpp:requests{model="m",server_model="other",slot="0"} 5',
                   'llamacpp:busy{model="m",why="a\u2028b\x85c"} 1']


def test_the_relay_passes_on_llama_servers_own_metrics_only():
    """issue 61 (red team item 22): a server's /metrics naming rigup_gpu_guard_tripped or up was
    relayed (with a model label for a router): another exporter's series, forged. Now only the
    llamacpp: names, on a router's path and on a plain instance's."""
    from roles.metrics.shipped import relay
    forged = ('# HELP llamacpp:requests n\n# TYPE llamacpp:requests counter\nllamacpp:requests 5\n'
              '# HELP rigup_gpu_guard_tripped x\n# TYPE up gauge\nrigup_gpu_guard_tripped 0\nup{job="node"} 1\n'
              ' llamacpp:x 1\nllamacpp:y 2\rup 1\n# EOF\n')
    # "llamacpp:y 2\rup 1" is one line to Prometheus (a newline alone ends one), and no sample: left out
    assert relay.labelled(forged, "m", set()) == ["# HELP llamacpp:requests n", "# TYPE llamacpp:requests counter",
                                                  'llamacpp:requests{model="m"} 5']

    class Instance(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(forged)))
            self.end_headers()
            self.wfile.write(forged.encode())

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Instance,)]
    servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", 0), relay.handler(
        {"instances": {"g": {"url": f"http://127.0.0.1:{servers[0].server_port}"}}}, {"127.0.0.1"})))
    for s in servers:
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{servers[1].server_port}/metrics/g", timeout=5) as answer:
            text = answer.read().decode()
    finally:
        for s in servers:
            s.shutdown()
    print(f"relayed:\n{text}")
    assert text == "# HELP llamacpp:requests n\n# TYPE llamacpp:requests counter\nllamacpp:requests 5\n"


def test_a_sample_prometheus_would_refuse_is_left_out_not_relayed():
    """Round 3 of issue 61, items 9-11: a value out of a float's range (1e400), a timestamp past int64
    and a reserved label ({__name__="up"}: the name twice) were relayed, and each fails Prometheus's
    whole scrape of the relay. NaN, +Inf and -Inf as the text format spells them are kept."""
    from roles.metrics.shipped import relay
    for line in ("llamacpp:x 1e400", "llamacpp:x -1e400", "llamacpp:x Inf", "llamacpp:x -NaN", "llamacpp:x 1 9999999999999999999",
                 "llamacpp:x 1 -9999999999999999999", 'llamacpp:x{__name__="up"} 1', 'llamacpp:x{slot="0",__x="y"} 1',
                 "llamacpp:x \u0663", "llamacpp:x 1 \u0661\u0662"):
        got = (relay.labelled(line + "\n", "m", set()), relay.checked(line + "\n"))
        print(f"{line!r} -> {got}")
        assert got == ([], []), line
    kept = ["llamacpp:x NaN", "llamacpp:x +Inf", "llamacpp:x -Inf", "llamacpp:x 1.5e308", "llamacpp:x 1 9223372036854775807",
            "llamacpp:x 1 -9223372036854775808", 'llamacpp:x{slot="0"} 2']
    print(relay.labelled("\n".join(kept) + "\n", "m", set()))
    assert relay.checked("\n".join(kept) + "\n") == kept
    assert relay.labelled("\n".join(kept) + "\n", "m", set())[-1] == 'llamacpp:x{model="m",slot="0"} 2'


def test_haproxys_queue_figures_in_other_digits_are_no_figures():
    """Round 3 of issue 61, item 12: qcur '²' and qmax '٣' passed str.isdigit and were written as
    'rigup_router_queue_waiting ²', which fails the relay's whole scrape."""
    from roles.metrics.shipped import relay
    for csv, want in (("# pxname,svname,qcur,qmax\nr,BACKEND,\u00b2,\u0663\n", []),
                      ("# pxname,svname,qcur,qmax\nr,BACKEND,\uff13,1\n", []),
                      ("# pxname,svname,qcur,qmax\nr,BACKEND,2,03\n", []),
                      ("# pxname,svname,qcur,qmax\nr,BACKEND,2,3\n", ["rigup_router_queue_waiting 2",
                                                                      "rigup_router_queue_waited_max 3",
                                                                      "rigup_router_queue_limit 8"])):
        class Stats(http.server.BaseHTTPRequestHandler):
            def do_GET(self, body=csv.encode()):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stats)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            got = relay.queue_lines({"stats": f"http://127.0.0.1:{server.server_address[1]}/s", "backend": "r", "limit": 8})
        finally:
            server.shutdown()
        print(f"{csv.splitlines()[1]!r} -> {[ln for ln in got if not ln.startswith('#')]}")
        assert [ln for ln in got if not ln.startswith("#")] == want


@settings(max_examples=60, deadline=1000)
@given(st.one_of(st.text(max_size=24), st.integers(0, 10**19).map(str), st.sampled_from(["\u00b2", "\u0663", "007", " 3\n", "+1", "1e3"])))
@example("0\x85")   # found by this property (2026-12-06): str.strip() took NEL as a blank, the boundary does not
def test_the_relays_whole_number_rule_is_rigup_boundary_numbers_whole(text):
    """The relay carries its own copy (a host program: standard library only); held to the boundary's."""
    from rigup.boundary.numbers import whole
    from roles.metrics.shipped import relay
    assert relay.whole(text) == whole(text)


class SlowRouter(http.server.BaseHTTPRequestHandler):
    """A router whose every model is loaded and whose /metrics?model= answers after ``delay`` s each,
    and whose /models/sse sends ``server.events`` (raw ``data:`` lines), then holds the stream open."""

    def do_GET(self):
        if self.path == "/models":
            body = json.dumps({"data": [{"id": m, "status": {"value": "loaded"}} for m in self.server.models]}).encode()
        elif self.path.startswith("/metrics?model="):
            time.sleep(self.server.delay)
            body = b"llamacpp:tokens_predicted_total 5\n"
        elif self.path == "/models/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for line in self.server.events:
                self.wfile.write(line + b"\n\n")
                self.wfile.flush()
            time.sleep(self.server.hold)
            return
        else:
            body = b"{}"
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:   # the relay gave up on it (its bound): nobody reads
            pass

    def log_message(self, *args):
        pass


def slow_router(models, delay=0.0, events=(), hold=5.0):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowRouter)
    server.models, server.delay, server.events, server.hold, server.daemon_threads = models, delay, list(events), hold, True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_the_relays_bound_holds_per_scrape_not_per_fetch(monkeypatch):
    """issue 65: a router of three loaded models whose /metrics each answer in 0.4 s, under a bound of
    1 s (TIMEOUT_S, 10 s on a host; three models took 12 s there): the scrape ends within the bound,
    answered 503 naming it, not after 1.2 s with 200; a router whose models answer in time is
    relayed whole; the HAProxy stats' fetch shares the same deadline."""
    from roles.metrics.shipped import relay
    monkeypatch.setattr(relay, "TIMEOUT_S", 1.0)
    slow, slow_url = slow_router(["a", "b", "c"], delay=0.4)
    fast, fast_url = slow_router(["a", "b", "c"], delay=0.05)
    config = {"instances": {"slow": {"url": slow_url, "models": ["a", "b", "c"]},
                            "fast": {"url": fast_url, "models": ["a", "b", "c"]}}}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), relay.handler(config, {"127.0.0.1"}, {}))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/metrics/"
    try:
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(base + "slow", timeout=10)
        took = time.monotonic() - started
        why = failed.value.read().decode()
        print(f"three models at 0.4 s each, bound 1 s: {failed.value.code} after {took:.2f} s: {why.strip()}")
        assert failed.value.code == 503 and took < 1.0 + 0.25 and "slow: /metrics did not answer within the scrape's 1 s" in why
        started = time.monotonic()
        with urllib.request.urlopen(base + "fast", timeout=10) as ok:
            text = ok.read().decode()
        print(f"three models at 0.05 s each: 200 after {time.monotonic() - started:.2f} s")
        assert [ln for ln in text.splitlines() if ln.startswith("rigup_router_model_loaded")] == [
            f'rigup_router_model_loaded{{model="{m}"}} 1' for m in "abc"]
        with pytest.raises(TimeoutError):   # a deadline already past: nothing is asked
            relay.fetch(config["instances"]["fast"], "/models", time.monotonic() - 1)
        assert relay.queue_lines({"stats": fast_url + "/stats", "backend": "x", "limit": 1}, time.monotonic() - 1) == []
    finally:
        for s in (server, slow, fast):
            s.shutdown()
            s.server_close()


def test_a_router_event_that_is_not_an_object_does_not_end_its_follower():
    """issue 65: an event whose data is a JSON string (or a model that is a list) ended the follower
    thread with AttributeError while rigup_router_events_up stayed 1; now such an event is left
    out, the stream followed on, the events after it counted."""
    events = [b'data: {"model": "a", "event": "status_change", "data": "loaded"}',
              b'data: {"model": ["a"], "data": {"status": "loaded"}}', b'data: "just text"',
              b'data: {"model": "a", "data": {"status": ["loaded"]}}',
              b'data: {"model": "a", "event": "status_change", "data": {"status": "loaded"}}']
    alive, lines = followed(events, lambda m: m["loads"])
    assert alive and "rigup_router_events_up 1" in lines
    assert 'rigup_router_model_loads_total{model="a"} 1' in lines


def followed(events: list[bytes], done) -> tuple[bool, list[str]]:
    """Model a's follower (relay.Swaps) on a router sending ``events``, once ``done(its counts)`` (or
    2 s): whether its thread lives, and its sample lines."""
    from roles.metrics.shipped import relay
    router, url = slow_router(["a"], events=events, hold=5.0)
    swaps = relay.Swaps({"url": url, "models": ["a"]})
    swaps.start()
    try:
        for _ in range(100):
            if done(swaps.models["a"]):
                break
            time.sleep(0.02)
        lines = [ln for ln in swaps.lines() if not ln.startswith("#")]
        print(lines)
        return swaps.thread.is_alive(), lines
    finally:
        router.shutdown()
        router.server_close()


def test_a_router_event_nested_deep_is_left_out_and_the_follower_goes_on():
    """Rerun 1 of issue 61, N37: one event line of 30000 '[' raised RecursionError out of the follower
    (json.loads; it caught ValueError alone): rigup_router_events_up 0 and the next events uncounted
    until its retry. Now read by the relay's own JSON reader (json_answer): left out, as any event
    that does not read."""
    events = [b"data: " + b"[" * 30000, b'data: {"model": "a", "data": {"status": "unloaded"}, "x": NaN}',
              b'data: {"model": "a", "data": {"status": "unloaded"}}', b'data: {"model": "a", "data": {"status": "unloaded"}}']
    alive, lines = followed(events, lambda m: m["unloads"] >= 2)
    assert alive and "rigup_router_events_up 1" in lines
    assert 'rigup_router_model_unloads_total{model="a"} 2' in lines


def test_a_pinned_servers_samples_of_two_models_stay_two_series():
    """Rerun 2 of issue 61, N16: a pinned server's samples model="other" and model="third" both became
    llamacpp:tokens_predicted_total{model="tiny"} (its own label dropped): one series twice, which
    Prometheus refuses. Its own model label is now server_model where it names another model, dropped
    where it names this one; a series given already, or a sample with a server_model of its own, is
    left out."""
    from roles.metrics.shipped import relay
    text = ('# HELP llamacpp:tokens_predicted_total n\n# TYPE llamacpp:tokens_predicted_total counter\n'
            'llamacpp:tokens_predicted_total{model="other"} 5\nllamacpp:tokens_predicted_total{model="third"} 7\n'
            'llamacpp:kv{model="x",slot="1"} 1\nllamacpp:busy 1\nllamacpp:busy{model="tiny"} 2\n'
            'llamacpp:odd{model="x",server_model="y"} 1\nllamacpp:busy 3\n')
    got = relay.labelled(text, "tiny", set())
    print(got)
    assert got == ["# HELP llamacpp:tokens_predicted_total n", "# TYPE llamacpp:tokens_predicted_total counter",
                   'llamacpp:tokens_predicted_total{model="tiny",server_model="other"} 5',
                   'llamacpp:tokens_predicted_total{model="tiny",server_model="third"} 7',
                   'llamacpp:kv{model="tiny",server_model="x",slot="1"} 1', 'llamacpp:busy{model="tiny"} 1']


@settings(max_examples=200, deadline=1000)
@given(lines=st.lists(st.tuples(st.sampled_from(["llamacpp:a", "llamacpp:b"]),
                                st.dictionaries(st.sampled_from(["model", "server_model", "slot"]),
                                                st.sampled_from(["tiny", "other", 'q"\\', "0", ""]), max_size=3),
                                st.integers(0, 9)), max_size=8), model=st.sampled_from(["tiny", None]))
def test_a_pinned_servers_relayed_samples_are_each_series_once_and_keep_their_own(lines, model):
    """Whatever model labels a server writes, its relayed samples are each series once (Prometheus
    refuses a series twice in a scrape; a label whose value is empty is none to it: round 4 R1), each
    labelled model="tiny" (a plain server's, model None: as written, R2), and two of its series are never
    made one: a sample is left out only where its series (model dropped when it is "tiny") came before,
    or where it has a server_model label of its own (the relay's name for its model label)."""
    from roles.metrics.shipped import relay
    text = "".join(f"{n}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}}} {value}\n"
                   for n, labels, value in lines)
    got = relay.labelled(text, model, set())
    series = [(m[1], tuple(sorted(p for p in relay.LABEL.findall(m[2] or "") if p[1]))) for m in map(relay.sample, got)]
    assert len(set(series)) == len(series) and all(model is None or ("model", "tiny") in labels for _, labels in series)
    distinct = {(n, tuple(sorted((k, v) for k, v in labels.items() if v and (k, v) != ("model", model))))
                for n, labels, _ in lines if model is None or "server_model" not in labels}
    assert len(got) == len(distinct)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # its end, on purpose
def test_a_dead_follower_thread_is_shown_down(monkeypatch):
    """issue 65: rigup_router_events_up is 1 only while the follower thread lives and follows: a
    thread ended by anything (here SystemExit inside the stream, which no except of its own takes)
    shows 0, whatever it had set."""
    from roles.metrics.shipped import relay
    swaps = relay.Swaps({"url": "http://127.0.0.1:1", "models": ["a"]})

    def dies():
        swaps.up = True
        raise SystemExit("gone")

    monkeypatch.setattr(swaps, "follow", dies)
    swaps.start()
    swaps.thread.join(5)
    lines = [ln for ln in swaps.lines() if ln.startswith("rigup_router_events_up")]
    print(f"thread alive: {swaps.thread.is_alive()}; {lines}")
    assert not swaps.thread.is_alive() and lines == ["rigup_router_events_up 0"]


class OneModel(http.server.BaseHTTPRequestHandler):
    """A server of one model: its /metrics is ``server.text``."""

    def do_GET(self):
        body = self.server.text.encode() if self.path == "/metrics" else b"{}"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_routers_pinned_model_is_relayed_as_a_server_of_its_own():
    """issue 63: a model a router pins (per_model: {M: {pinned: true}}) is out of its set, a server
    of its own (rigup-llama@NAME.M at port + 2 + i, the router's key): the relay reaches it at
    /metrics/NAME.M, its samples labelled model M (as a router's models'; its own model label
    server_model), a Prometheus target of its own (llama_instance NAME.M); the router's scrape no longer
    lists it as an unloaded model of its set."""
    from roles.metrics.shipped import relay
    router = {"model": "a", "also": ["b", "p"], "port": 8091, "api_key": True, "per_model": {"p": {"pinned": True}}}
    d = {**FLEET[1][1], "llama_server_instances": {"duo": router}}
    key = "/etc/rigup/llama-server/duo.key"
    assert relay_config("rig-2", d, FLEET)["instances"] == {
        "duo": {"url": "http://127.0.0.1:8091", "key": key, "models": ["a", "b"]},
        "duo.p": {"url": "http://127.0.0.1:8093", "key": key, "model": "p"}}
    fleet = [(n, d if n == "rig-2" else data) for n, data in FLEET]
    llama = targets("rig-1", fleet)["rigup-llama.json"]
    assert [(g["labels"]["llama_instance"], g["labels"]["instance"], g["labels"]["__metrics_path__"]) for g in llama
            if g["labels"]["host"] == "rig-2"] == [("duo", "rig-2/duo", "/metrics/duo"),
                                                   ("duo.p", "rig-2/duo.p", "/metrics/duo.p")]
    assert relay_config("rig-2", {**d, "llama_server_instances": {"duo": {**router, "metrics": False}}},
                        FLEET)["instances"] == {}
    # the relay itself: the router (a and b loaded) and the pinned server behind it
    routed, routed_url = slow_router(["a", "b"])
    pinned = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneModel)
    pinned.text = ('# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 7\n'
                   'llamacpp:requests_processing{model="alias"} 1\nup 1\n')
    threading.Thread(target=pinned.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    config = {"instances": {"duo": {"url": routed_url, "models": ["a", "b"]},
                            "duo.p": {"url": f"http://127.0.0.1:{pinned.server_address[1]}", "model": "p"}}}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), relay.handler(config, {"127.0.0.1"}, {}))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/metrics/"
    try:
        with urllib.request.urlopen(base + "duo.p", timeout=10) as ok:
            own = ok.read().decode().splitlines()
        with urllib.request.urlopen(base + "duo", timeout=10) as ok:
            set_ = [ln for ln in ok.read().decode().splitlines() if ln.startswith("rigup_router_model_loaded")]
        print(own, set_)
        assert own == ["# TYPE llamacpp:tokens_predicted_total counter", 'llamacpp:tokens_predicted_total{model="p"} 7',
                       'llamacpp:requests_processing{model="p",server_model="alias"} 1']
        assert set_ == ['rigup_router_model_loaded{model="a"} 1', 'rigup_router_model_loaded{model="b"} 1']
    finally:
        for s in (server, routed, pinned):
            s.shutdown()
            s.server_close()


def test_a_sample_line_reads_in_linear_time():
    """Round 1 of issue 61, F05/F11: a value of 8000 digits then 'x' took the sample regex ~8 s (its
    digits split two ways), holding the GIL from the relay's other scrapes; 40000 took ~150 s."""
    from roles.metrics.shipped import relay
    for text in ("llamacpp:x " + "1" * 40000 + "x\n", "llamacpp:x " + "1" * 4000 + "x\n" * 2000,
                 "llamacpp:x 1." + "1" * 3000 + "e" + "1" * 1000 + "x\n", 'llamacpp:x{a="' + "1" * 4000 + '"} 1 ' + " " * 40 + "x\n"):
        started = time.monotonic()
        assert relay.checked(text) == []
        assert time.monotonic() - started < 0.5, len(text)
    # the patterns themselves, past the line bound (MAX_LINE): every shape of a line that almost matches
    n = 40000
    for line in ("llamacpp:x " + "1" * n + "x", "llamacpp:x " + "a" * n + "}", 'llamacpp:x{a="' + "a" * n + "\x00",
                 "llamacpp:x 1" + "e1" * n + "x", "llamacpp:x 1 " + " " * n + "x", 'llamacpp:x{' + 'a="",' * n + "x",
                 "llamacpp:x 1." + "1" * n + "x", "llamacpp:x ." + "1" * n + "e", "llamacpp" + "a" * n + "{",
                 "# HELP llamacpp:x " + "a" * n + "\n", "# TYPE llamacpp:x" + " " * n + "x"):
        started = time.monotonic()
        assert relay.sample(line) is None and not relay.HEADER.fullmatch(line)
        assert time.monotonic() - started < 0.5, line[:40]
    assert relay.checked("llamacpp:x 12.5e3\nllamacpp:x 1.\nllamacpp:x .5\n") == ["llamacpp:x 12.5e3", "llamacpp:x 1.",
                                                                                 "llamacpp:x .5"]


class Models(http.server.BaseHTTPRequestHandler):
    """A router whose /models answers ``server.body``."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"data": [{"id": "m", "status": "loaded"}]}', b'{"data": [{"id": ["m"]}]}',
                                  b"[" * 200000, b'{"data": {"m": 1}}', b'{"data": [{"id": "m", "status": {"value": 1}}]}',
                                  b'{"data": [{"id": "m", "status": {"value": "failed"}}, {"id": "m", "status": {"value": "loaded"}}]}',
                                  b'{"data": [], "data": [{"id": "m", "status": {"value": "loaded"}}]}', b'{"data": [NaN]}'])
def test_a_routers_models_of_another_shape_is_a_502_not_a_scrape_left_unanswered(body):
    """Round 1 of issue 61, F01-F04 (and G01's model listed twice): a list, a status that is text,
    an id that is a list, nesting deeper than Python's stack each ended the handler's thread; the
    scrape's connection closed with no answer and a traceback in the journal."""
    from roles.metrics.shipped import relay
    router = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    router.body = body
    cfg = {"instances": {"r": {"url": f"http://127.0.0.1:{router.server_port}", "models": ["m"], "key": None}}}
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), relay.handler(cfg, {"127.0.0.1"}, {}))
    for s in (router, served):
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{served.server_port}/metrics/r", timeout=5)
        assert e.value.code == 502 and e.value.read().startswith(b"r: /metrics ")
    finally:
        for s in (router, served):
            s.shutdown()
            s.server_close()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["id", "status", "value", "data", "x"]),
                                                                              inner, max_size=3), max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(JSON, st.sampled_from(["", "{", '{"a": 1, "a": 2}', "NaN", "[" * 5000, "1e400", "-Infinity"]))
def test_the_relays_models_reader_answers_or_refuses_and_its_json_is_the_boundarys(doc, extra):
    from rigup.boundary.core import Unreadable, loads
    from roles.metrics.shipped import relay
    try:
        got = relay.model_statuses(doc)
    except ValueError:
        got = None
    if got is not None:
        assert all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in got.items())
    for text in (json.dumps(doc), extra, json.dumps({"data": doc}) + extra):
        try:
            mine = relay.json_answer(text)
        except ValueError:
            mine = "refused"
        try:
            theirs = loads(text, "x")
        except Unreadable:
            theirs = "refused"
        assert json.dumps(mine) == json.dumps(theirs), text[:80]
