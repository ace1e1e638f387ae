"""Several models behind one port on a lab host (issue 49): the session's first host gets a second
instance, ``duo``, llama-server's router (roles/llama_server with ``also``) serving Gemma 3 270M and
the smoke model rigup ships (roles/llama_cpp/smoke.gguf, a tiny random llama published on the
lab's hub) on one port, one model loaded at a time (models_max 1: the lab's budget; its layers
stay on the CPU, ngl 0, so the VRAM plan of the a100 profile's stand-in cards is not asked until
the refusal's ngl 99). Requests alternate between the two models and each is answered by the
model it names, the swap seconds printed; the second converge changes nothing; a set whose two
largest models cannot be held together is refused at preflight, before any change, naming the
models and the VRAM. The host is left as group_vars/lab.yml serves it."""

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from rigup.files import beside_name, program_text
from tests.conftest import on_host
from tests.converge import ROOT, converge, pyinfra

pytestmark = pytest.mark.lab
THROUGHPUT = "shipped/throughput.py"   # the relay's and the watchdog's key rule, beside each
LAB_VARS = yaml.safe_load((ROOT / "group_vars/lab.yml").read_text())
SMOKE = ROOT / "roles/llama_cpp/smoke.gguf"
PORT = 8091


# the relay's Swaps (roles/metrics/shipped/relay.py, beside it) following the router while ARGV[2:] are asked in turn
SWAPS = """import json, sys, threading, time, urllib.request
import relay
inst = json.loads(sys.argv[1])
swaps = relay.Swaps(inst)
threading.Thread(target=swaps.run, daemon=True).start()
for _ in range(100):
    if swaps.up:
        break
    time.sleep(0.1)
time.sleep(1)   # the stream's headers came; the router may add its listener after them (a load's "loading" once missed)
for model in sys.argv[2:]:
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 2}).encode()
    request = urllib.request.Request(inst["url"] + "/v1/completions", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=300).read()
time.sleep(1)
print("\\n".join(swaps.lines()))"""


def data(models: dict, duo: dict) -> tuple[str, ...]:
    instances = {**LAB_VARS["llama_server_instances"], "duo": duo}
    return ("--data", f"models={json.dumps(models)}", "--data", f"llama_server_instances={json.dumps(instances)}")


def models_with_tiny() -> dict:
    """group_vars/lab.yml's models and ``tiny``: the smoke model, published on the lab's hub."""
    from tests.lab import hub

    revision = hub.publish("rigup-lab/smoke-tiny-GGUF", {"smoke.gguf": SMOKE})
    return {**{k: {**v, "warm": True} for k, v in LAB_VARS["models"].items()},   # kept in the page cache
            "tiny": {"repo": "rigup-lab/smoke-tiny-GGUF", "revision": revision,
                     "include": ["*.gguf"], "size_gib": 0.01, "wait": True, "warm": True}}


@pytest.fixture(scope="module")
def duo(lab):
    name = lab.hosts()[0]["name"]
    models = models_with_tiny()
    router = {"model": "gemma-270m", "also": ["tiny"], "models_max": 1, "port": PORT, "ctx": 2048, "parallel": 1,
              "ngl": 0, "min_tokens_per_s": 0, "per_model": {"tiny": {"ctx": 512}}}   # tiny's own context
    try:
        first = converge("inventory/lab.py", "--limit", name, *data(models, router))
        again = converge("inventory/lab.py", "--limit", name, *data(models, router))
        print(f"\n{name}: duo (router: gemma-270m + tiny) in {first.seconds:.1f} s; again {again.seconds:.1f} s, "
              f"{again.totals['changed']} changed")
        yield name, models, router, first, again
    finally:   # the host as group_vars/lab.yml serves it: duo retired
        restored = pyinfra("inventory/lab.py", "deploy.py", "--limit", name)
        assert restored.returncode == 0, restored.output[-3000:]


def complete(lab, name: str, model: str) -> tuple[dict, float]:
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    start = time.monotonic()
    out = on_host(lab, name, f"curl -s -m 300 http://127.0.0.1:{PORT}/v1/completions -H 'Content-Type: "
                             f"application/json' -d '{body}'")
    return json.loads(out), time.monotonic() - start


def test_one_port_serves_both_models_each_from_its_own(lab, duo):
    name, _, _, _, again = duo
    assert again.totals["changed"] == 0, again.changed_operations()
    preset = on_host(lab, name, "f=/etc/rigup/llama-server/duo.models.ini; grep -c ctx-size $f; stat -c '%U:%G %a' $f; "
                                "grep -c '^\\[' $f").split()
    seen = []
    for model in ["gemma-270m", "tiny", "gemma-270m", "tiny"]:
        answer, seconds = complete(lab, name, model)
        seen.append((model, answer.get("model"), round(seconds, 2), bool(answer.get("choices"))))
    listed = json.loads(on_host(lab, name, f"curl -s http://127.0.0.1:{PORT}/models"))
    status = {m["id"]: m["status"]["value"] for m in listed["data"]}
    props = json.loads(on_host(lab, name, f"curl -s 'http://127.0.0.1:{PORT}/props?model=tiny&autoload=false'"))
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    print(f"preset {preset}; requests (asked, answered by, seconds with its swap, text): {seen}; /models: {status}; "
          f"tiny's context (per_model): {n_ctx}")
    assert preset == ["2", "root:rigup", "640", "3"]   # ctx-size in [*] (moved by per_model) and [tiny]; 3 sections
    assert n_ctx == 512
    assert [(asked, by, ok) for asked, by, _, ok in seen] == [(m, m, True) for m in ("gemma-270m", "tiny") * 2]
    assert (status["gemma-270m"], status["tiny"]) == ("unloaded", "loaded")   # models_max 1: the last one asked
    assert set(status) == {"gemma-270m", "tiny"}     # nothing of a hub cache (LLAMA_CACHE: none)


def test_the_metrics_relay_reads_the_loaded_model_and_loads_none(lab, duo):
    """roles/metrics's relay (its router part, run on the host as the relay would) after the
    alternation: the loaded model's metrics labelled, the set's loaded gauge; the scrape loaded
    nothing (the other model stays unloaded)."""
    name = duo[0]
    complete(lab, name, "tiny")   # the state it reads, set up here: tiny loaded, gemma-270m evicted (models_max 1)
    relay, measuring = program_text("roles/metrics/shipped/relay.py"), program_text(THROUGHPUT)
    on_host(lab, name, f"cat > /root/relay.py <<'EOF'\n{relay}\nEOF\n"      # with its key rule beside it, as installed
                       f"cat > /root/{beside_name(THROUGHPUT)} <<'EOF'\n{measuring}\nEOF")
    inst = json.dumps({"url": f"http://127.0.0.1:{PORT}", "key": None, "models": ["gemma-270m", "tiny"]})
    text = on_host(lab, name, "cd /root && python3 -c 'import json, sys, relay; "
                              f"sys.stdout.write(relay.router_metrics(json.loads(sys.argv[1])).decode())' '{inst}'")
    listed = json.loads(on_host(lab, name, f"curl -s http://127.0.0.1:{PORT}/models"))
    loaded = sorted(line for line in text.splitlines() if line.startswith("rigup_router_model_loaded"))
    samples = [line for line in text.splitlines() if line.startswith("llamacpp:")]
    print(f"relay: {len(samples)} samples of llama-server's, e.g. {samples[:2]}; {loaded}")
    assert loaded == ['rigup_router_model_loaded{model="gemma-270m"} 0', 'rigup_router_model_loaded{model="tiny"} 1']
    assert samples and all('model="tiny"' in line for line in samples)
    assert {m["id"]: m["status"]["value"] for m in listed["data"]}["gemma-270m"] == "unloaded"
    # its loads, from the router's /models/sse followed while two requests swap the models twice
    on_host(lab, name, f"cat > /root/swaps.py <<'EOF'\n{SWAPS}\nEOF")
    counted = on_host(lab, name, f"cd /root && timeout 600 python3 swaps.py '{inst}' gemma-270m tiny").splitlines()
    got = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in counted if line.startswith("rigup_router")}
    print(f"relay's loads from /models/sse: {got}")
    assert got["rigup_router_events_up"] == 1
    for model in ("gemma-270m", "tiny"):
        assert got[f'rigup_router_model_loads_total{{model="{model}"}}'] == 1
        assert got[f'rigup_router_model_unloads_total{{model="{model}"}}'] == 1
        # the seconds between the relay's receipt of the two events: tiny loads in about 7 ms, and a
        # relay thread that waited for a core (lab 8 beside other labs) read both at once (0.0)
        last = got[f'rigup_router_model_last_load_seconds{{model="{model}"}}']
        assert 0 <= last < 120 and last == got[f'rigup_router_model_load_seconds_total{{model="{model}"}}']


def test_a_warm_model_is_read_into_the_page_cache(lab, duo):
    """models.NAME.warm: rigup-model-warm.timer runs; its pass (as the rigup user) reads gemma's file
    (not loaded now: a loaded model's mapped pages cannot be evicted) back into the page cache after
    vmtouch -e evicted it."""
    name = duo[0]
    complete(lab, name, "tiny")   # gemma-270m unloaded, set up here (models_max 1)
    path = on_host(lab, name, "readlink -f $(find -L /srv/models/gemma-270m -maxdepth 2 -name '*.gguf' -type f "
                              "| head -n 1)").strip()
    timer = on_host(lab, name, "systemctl is-active rigup-model-warm.timer; systemctl is-enabled rigup-model-warm.timer; "
                               "systemctl show -p User --value rigup-model-warm.service").split()
    resident = f"vmtouch {path} | grep -o 'Resident Pages: .*' | tr -s ' '"
    evicted = on_host(lab, name, f"vmtouch -q -e {path}; {resident}").strip()
    ran = on_host(lab, name, "systemctl start rigup-model-warm.service; journalctl -q -o cat -n 8 -u rigup-model-warm.service")
    warm = on_host(lab, name, resident).strip()
    print(f"{path}: timer {timer}; evicted: {evicted}; after the warm pass: {warm}; its journal: {ran.strip()!r}")
    assert timer == ["active", "enabled", "rigup"]
    assert not evicted.endswith(" 100%") and warm.endswith(" 100%")
    assert "gemma-270m: 1 file(s) in the page cache" in ran


def test_the_watchdog_times_the_loaded_model_and_loads_none(lab, duo):
    """The throughput watchdog (roles/watchdog/shipped/watchdog.py, run on the host as its timer runs it)
    with the router as watchdog_config makes it for a router with its own floor: it times the
    model loaded after the alternation (tiny) and asks for no other (gemma-270m stays unloaded)."""
    from roles.watchdog import watchdog_config

    name, models, router = duo[:3]
    complete(lab, name, "tiny")   # the state it reads, set up here: tiny loaded, gemma-270m evicted (models_max 1)
    config = watchdog_config({"llama_server_instances": {"duo": {**router, "min_tokens_per_s": 0.5}}, "models": models,
                              "watchdog_interval_s": 300, "watchdog_bad_checks": 3, "watchdog_max_tokens": 8,
                              "watchdog_timeout_s": 60, "watchdog_grace_s": 300, "rigup_maintenance": False,
                              "rigup_state_dir": "/root/wd", "rigup_watchdog_reboot": False,
                              "rigup_watchdog_max_reboots": 1})
    assert config["instances"]["duo"]["models"] == ["gemma-270m", "tiny"]
    config["metrics_file"] = "/root/wd/rigup_watchdog.prom"
    program, measuring = program_text("roles/watchdog/shipped/watchdog.py"), program_text(THROUGHPUT)
    on_host(lab, name, f"mkdir -p /root/wd && cat > /root/wd/watchdog.py <<'EOF'\n{program}\nEOF\n"
                       f"cat > /root/wd/{beside_name(THROUGHPUT)} <<'EOF'\n{measuring}\nEOF\n"
                       f"cat > /root/wd/config.json <<'EOF'\n{json.dumps(config)}\nEOF")
    log = on_host(lab, name, "cd /root/wd && python3 watchdog.py --config config.json check 2>&1")
    listed = json.loads(on_host(lab, name, f"curl -s http://127.0.0.1:{PORT}/models"))
    state = json.loads(on_host(lab, name, "cat /root/wd/watchdog.json"))
    print(log.strip().splitlines()[-3:], state["duo"].get("last_tps"))
    assert "duo: timed tiny, the model it has loaded" in log and state["duo"]["last_tps"] > 0.5
    assert {m["id"]: m["status"]["value"] for m in listed["data"]} == {"gemma-270m": "unloaded", "tiny": "loaded"}
    shown = pyinfra("inventory/lab.py", "status.py", "--limit", name, *data(models, router), timeout=120)
    row = [ln for ln in shown.output.splitlines() if " duo " in ln]
    size = on_host(lab, name, f"curl -s http://127.0.0.1:{PORT}/models | wc -c").strip()
    print(row, f"(/models: {size} bytes)")
    assert shown.returncode == 0 and row and "duo active :8091 200 " in row[0]
    assert re.search(r"\[loaded: tiny; \d+ loads?, last up to [0-9.]+ s\]", row[0]), row   # the relay's counts


def test_a_set_that_cannot_fit_is_refused_before_any_change(lab, duo):
    name, models, router, _, _ = duo
    big = {**models, "big-a": {**models["tiny"], "size_gib": 330, "warm": False},
           "big-b": {**models["tiny"], "size_gib": 330, "warm": False}}
    before = on_host(lab, name, "sha256sum /etc/rigup/llama-server/duo.models.ini")
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", name,
                  *data(big, {**router, "also": ["big-a", "big-b"], "models_max": 2, "ngl": 99, "per_model": {}}))
    lines = [ln.strip() for ln in run.output.splitlines() if "refused:" in ln]
    print("\n".join(lines))
    assert run.returncode != 0
    assert any(f"[{name}] refused: the 2 largest models of llama_server_instances.duo do not fit the VRAM together"
               in ln and "big-a 338.0 GiB + big-b 338.0 GiB" in ln and "GiB of VRAM (8 x 80.0 GiB)" in ln
               for ln in lines), lines
    assert on_host(lab, name, "sha256sum /etc/rigup/llama-server/duo.models.ini") == before


def test_an_idle_model_sleeps_and_a_request_wakes_it(lab, duo):
    """sleep_idle_s 2 on the router (each child inherits it): the loaded model sleeps once idle and
    a request wakes it (the wake's seconds printed: a load from the page cache). The watchdog's side
    (it never wakes a sleeping server): tests/unit/test_watchdog.py."""
    name, models, router, _, _ = duo
    converge("inventory/lab.py", "--limit", name, *data(models, {**router, "sleep_idle_s": 2}))
    complete(lab, name, "gemma-270m")
    status = f"curl -s 'http://127.0.0.1:{PORT}/models' | python3 -c 'import json, sys; " \
             "print({m[\"id\"]: m[\"status\"][\"value\"] for m in json.load(sys.stdin)[\"data\"]})'"
    time.sleep(5)
    asleep = on_host(lab, name, status).strip()
    answer, seconds = complete(lab, name, "gemma-270m")
    awake = on_host(lab, name, status).strip()
    print(f"after 5 s idle: {asleep}; a request woke gemma-270m in {seconds:.2f} s: {awake}")
    assert "'gemma-270m': 'sleeping'" in asleep and answer.get("model") == "gemma-270m"
    assert "'gemma-270m': 'loaded'" in awake


CLIENT = r'''
import json, sys, threading, time, urllib.error, urllib.request
n, port = int(sys.argv[1]), int(sys.argv[2])
models, out = ["gemma-270m", "tiny"], []
def one(i):
    body = json.dumps({"model": models[i % 2], "prompt": "The capital of France is", "max_tokens": 4}).encode()
    start = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                    {"Content-Type": "application/json"}), timeout=120) as r:
            by = json.load(r).get("model")
            out.append({"code": r.status, "ok": by == models[i % 2], "s": time.monotonic() - start})
    except urllib.error.HTTPError as e:
        out.append({"code": e.code, "retry_after": e.headers.get("Retry-After"), "s": time.monotonic() - start})
    except Exception as e:
        out.append({"code": 0, "error": repr(e)[:200], "s": time.monotonic() - start})
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
'''


def test_a_bounded_queue_serves_what_it_holds_and_answers_429_beyond(lab, duo):
    """``queue: 20``: HAProxy takes the router's port (the router behind it on port+1), 1 request at
    the router (parallel 1 x models_max 1), 20 more waiting. 20 concurrent requests over both models:
    every one answered by its own model, the longest wait printed; 40 at once: those beyond the
    queue get 429 with Retry-After, counted, the others are answered."""
    name, models, router, _, _ = duo
    queued = {**router, "queue": 20}
    run = converge("inventory/lab.py", "--limit", name, *data(models, queued))
    again = converge("inventory/lab.py", "--limit", name, *data(models, queued))
    owners = on_host(lab, name, f"ss -Htlnp 'sport = :{PORT}' | grep -o 'users:((\"[a-z-]*' | sort -u; "
                                f"ss -Htlnp 'sport = :{PORT + 1}' | grep -o 'users:((\"[a-z-]*' | sort -u")
    # the router's event stream through the queue: refused (it would hold a slot for as long as it lasts)
    sse = on_host(lab, name, f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://127.0.0.1:{PORT}/models/sse || true")
    on_host(lab, name, f"cat > /root/client.py <<'EOF'\n{CLIENT}\nEOF")
    results = {}
    for n in (20, 40):
        start = time.monotonic()
        got = json.loads(on_host(lab, name, f"python3 /root/client.py {n} {PORT}").strip().splitlines()[-1])
        results[n] = {"seconds": round(time.monotonic() - start, 1), "codes": sorted({r["code"] for r in got}),
                      "answered": sum(r["code"] == 200 for r in got), "right_model": sum(bool(r.get("ok")) for r in got),
                      "429": sum(r["code"] == 429 for r in got),
                      "retry_after": sorted({r.get("retry_after") for r in got if r["code"] == 429}),
                      "longest_wait_s": round(max((r["s"] for r in got if r["code"] == 200), default=-1), 2),
                      "errors": [r for r in got if r["code"] not in (200, 429)][:3]}
    print(f"\nqueue 20: converge {run.seconds:.1f} s, again {again.totals['changed']} changed; listeners {owners.split()}; "
          f"GET /models/sse through the queue: {sse}; 20 concurrent: {results[20]}; 40 at once: {results[40]}")
    if results[20]["answered"] < 20:   # who held the router's one slot (a stall seen 3 times in CI, never alone)
        print(on_host(lab, name, "for a in $(ss -Htlnp | grep haproxy | grep -o '127.0.0.1:[0-9]*'); do "
                                 "curl -s -m 5 \"http://$a/stats;csv\" | grep -i duo; done; "
                                 f"echo '-- connections to the router (:{PORT + 1})'; ss -Htnp state established "
                                 f"'( dport = :{PORT + 1} )'; echo '-- its models'; curl -s -m 5 http://127.0.0.1:{PORT + 1}/models; "
                                 "echo; journalctl -q --no-pager -n 25 -u rigup-llama@duo -u rigup-metrics-relay -u haproxy "
                                 "-u rigup-watchdog || true"))
    assert again.totals["changed"] == 0, again.changed_operations()
    assert owners.split() == ['users:(("haproxy', 'users:(("llama-server']
    assert sse == "403", sse
    assert results[20]["answered"] == results[20]["right_model"] == 20 and results[20]["errors"] == []
    assert results[40]["429"] >= 1 and results[40]["retry_after"] == ["5"] and results[40]["errors"] == []
    assert results[40]["answered"] == results[40]["right_model"] == 40 - results[40]["429"] >= 20
    # the relay's queue figures: HAProxy's own, the most that waited at once during the bursts
    relayed = on_host(lab, name, "curl -s -m 5 \"http://$(hostname -I | cut -d' ' -f1):9101/metrics/duo\" "
                                 "| grep '^rigup_router_queue'").split("\n")
    queue = {line.split()[0]: int(line.split()[1]) for line in relayed if line.strip()}
    print(f"the relay's queue figures: {queue}")
    assert queue["rigup_router_queue_limit"] == 20 and queue["rigup_router_queue_waiting"] == 0
    assert queue["rigup_router_queue_waited_max"] >= 10
