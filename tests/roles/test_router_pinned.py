"""A router with a pinned model on a lab host (issue 63, its first Done-when): the session's first
host gets ``duo``, llama-server's router over Gemma 3 270M and two copies of the smoke model rigup
ships (roles/llama_cpp/smoke.gguf, published on the lab hub as ``big-a`` and ``big-b``), with a
third copy, ``tiny-p``, pinned: its own server rigup-llama@duo.tiny-p on port + 2. The set is asked
on the GPUs (ngl 99), so the VRAM plan holds (on the lab's CPU build, on the host's stand-in cards)
and ``models_max`` is left ``auto``: the plan chooses 2 (the three routed models do not fit at once
beside the pinned one), writes ``--models-max 2``, and the router holds to it across 20 requests
alternating over its three models, a request to the pinned model between each.

What is simulated: the VRAM. The models' sizes are ``size_gib`` given by --data (the files are the
lab's small GGUFs), and the a100 host's 8 stand-in cards report 8 GiB each for this module
(tests/lab/nvidia_smi.py reads /etc/rigup-lab/gpu-profile.json, rewritten for the module and put
back after): with the profile's 80 GiB cards a set that cannot fit would need models of hundreds
of GiB, which preflight's disk check (roles/model_fetch check_disk, size_gib against the free disk)
refuses first. The lab's llama.cpp is a CPU build, so no model is ever in VRAM: "the pinned model
never leaves VRAM" is shown by its nearest real observables, its server's process (MainPID,
NRestarts, ActiveEnterTimestamp unchanged across the run: a single server never unloads its model)
answering between every swap, and the router never listing it (so it can never evict it). Real:
llama-server's router (its children, LRU eviction at --models-max), systemd, SSH, the hub, the plan
and preflight's refusals, each naming its figures, with the drop-ins and the preset unchanged
(sha256 before and after). The host is left as group_vars/lab.yml serves it."""

import json
import re
import time

import pytest
import yaml

from tests.conftest import on_host
from tests.converge import ROOT, converge, pyinfra

pytestmark = pytest.mark.lab
LAB_VARS = yaml.safe_load((ROOT / "group_vars/lab.yml").read_text())
SMOKE = ROOT / "roles/llama_cpp/smoke.gguf"
PORT, PINNED_PORT = 8091, 8093          # the pinned model's server: port + 2 (contract.pinned)
CARD_MIB = 8192                         # each of the 8 stand-in cards, for this module: 64 GiB in all
# GiB of weights as the plan counts them; each model also needs 1 GiB per card (8) and its KV
# cache at ctx 2048 (well under 0.05 GiB for these files): tiny-p 12 pinned, 52 left; big-a 22 +
# big-b 20 = 42 fit beside it, gemma-270m's 13 more (55) do not: models_max 2
SIZES = {"gemma-270m": 5, "tiny-p": 4, "big-a": 14, "big-b": 12}
ROUTED = ["gemma-270m", "big-a", "big-b"]
ROUTER = {"model": "gemma-270m", "also": ["tiny-p", "big-a", "big-b"], "port": PORT, "ctx": 2048, "parallel": 1,
          "ngl": 99, "min_tokens_per_s": 0, "per_model": {"tiny-p": {"pinned": True}}}
PROFILE = "/etc/rigup-lab/gpu-profile.json"
DROPINS = ("/etc/systemd/system/rigup-llama@duo.service.d/rigup.conf",
           "/etc/systemd/system/rigup-llama@duo.tiny-p.service.d/rigup.conf", "/etc/rigup/llama-server/duo.models.ini")
PINNED_UNIT = "rigup-llama@duo.tiny-p"


def data(models: dict, duo: dict) -> tuple[str, ...]:
    instances = {**LAB_VARS["llama_server_instances"], "duo": duo}
    return ("--data", f"models={json.dumps(models)}", "--data", f"llama_server_instances={json.dumps(instances)}")


def lab_models(**sizes) -> dict:
    """group_vars/lab.yml's models (gemma-270m) and the smoke model under three names, each a repo of
    the lab hub, every one at its size_gib of SIZES (or ``sizes``)."""
    from tests.lab import hub

    out = {**LAB_VARS["models"]}
    for name in ("tiny-p", "big-a", "big-b"):
        revision = hub.publish(f"rigup-lab/smoke-{name}-GGUF", {"smoke.gguf": SMOKE})
        out[name] = {"repo": f"rigup-lab/smoke-{name}-GGUF", "revision": revision, "include": ["*.gguf"], "wait": True}
    return {name: {**entry, "size_gib": {**SIZES, **sizes}[name]} for name, entry in out.items()}


def refusals(run) -> list[str]:
    return [ln.strip() for ln in run.output.splitlines() if "refused:" in ln]


def fingerprint(lab, name: str) -> str:
    return on_host(lab, name, f"sha256sum {' '.join(DROPINS)}")


@pytest.fixture(scope="module")
def duo(lab):
    name = lab.hosts()[0]["name"]
    start = time.monotonic()
    on_host(lab, name, f"cp -n {PROFILE} {PROFILE}.lab && python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); "
                       f"p[\"card\"][\"memory_total_mib\"] = {CARD_MIB}; json.dump(p, open(sys.argv[1], \"w\"))' {PROFILE}")
    models = lab_models()
    try:
        first = converge("inventory/lab.py", "--limit", name, *data(models, ROUTER))
        again = converge("inventory/lab.py", "--limit", name, *data(models, ROUTER))
        print(f"\n{name}: duo (router: gemma-270m, big-a, big-b; tiny-p pinned) in {first.seconds:.1f} s; "
              f"again {again.seconds:.1f} s, {again.totals['changed']} changed")
        yield name, first, again
    finally:   # the host as group_vars/lab.yml serves it: its cards' 80 GiB back, duo and its pinned server retired
        lab.ssh(name, f"[ -e {PROFILE}.lab ] && mv {PROFILE}.lab {PROFILE}")
        restored = pyinfra("inventory/lab.py", "deploy.py", "--limit", name)
        gone = lab.ssh(name, f"systemctl is-active {PINNED_UNIT} rigup-llama@duo").stdout.split()
        print(f"\nthe module's {time.monotonic() - start:.0f} s (restore {restored.seconds:.0f} s; duo and its pinned "
              f"server after it: {gone})")
        assert restored.returncode == 0, restored.output[-3000:]


def test_the_plan_says_models_max_from_vram_and_the_pinned_server(duo):
    _, first, _ = duo
    lines = [ln.strip() for ln in first.output.splitlines() if re.search(r"duo: (router|pinned) ", ln)]
    print("\n".join(lines))
    assert any(re.search(r"duo: router models_max 2 from VRAM \(64\.0 GiB on 8 cards, pinned tiny-p 12\.0 GiB, "
                         r"52\.0 GiB left; largest 2: big-a 22\.0 \+ big-b 20\.0 GiB; with gemma-270m 13\.0 GiB "
                         r"55\.0 GiB > 52\.0\)", ln) for ln in lines), lines
    assert any(re.search(r"duo: pinned tiny-p on its own server rigup-llama@duo\.tiny-p at \S+:8093 \(the router's "
                         r"cards, 12\.0 GiB\), never evicted", ln) for ln in lines), lines


def test_converged_twice_the_pinned_server_and_models_max_are_written(lab, duo):
    name, _, again = duo
    assert again.totals["changed"] == 0, again.changed_operations()
    state = on_host(lab, name, f"systemctl is-active {PINNED_UNIT} rigup-llama@duo").split()
    pinned = on_host(lab, name, f"cat {DROPINS[1]}")
    router = on_host(lab, name, "systemctl show -p ExecStart --value rigup-llama@duo")
    sections = on_host(lab, name, f"grep '^\\[' {DROPINS[2]}").split()
    models_max = re.search(r"--models-max (\S+)", router)
    print(f"units {state}; the router's --models-max {models_max and models_max.group(1)}; its preset's sections "
          f"{sections}; the pinned drop-in's ExecStart: {re.search(r'ExecStart=(/.*)', pinned).group(1)[:400]}")
    assert state == ["active", "active"]
    assert re.search(r"--alias tiny-p( |$)", pinned, re.M) and re.search(rf"--port {PINNED_PORT}( |$)", pinned, re.M)
    assert "--models-preset" not in pinned and "--models-max" not in pinned
    assert models_max and models_max.group(1) == "2"
    assert sections == ["[gemma-270m]", "[big-a]", "[big-b]"]   # tiny-p out of the router's set


# on the host: N requests alternating over the router's models on its port, each followed by the router's
# /models (what it holds) and a request to the pinned model on its own port; the answers and figures as JSON
ALTERNATE = r'''
import json, sys, time, urllib.request
n, port, pinned_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
models, out = sys.argv[4].split(","), []
def ask(port, model):
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 2}).encode()
    start = time.monotonic()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        answer = json.load(r)
    return answer.get("model"), bool(answer.get("choices")), round(time.monotonic() - start, 2)
for i in range(n):
    model = models[i % len(models)]
    by, ok, s = ask(port, model)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=30) as r:
        held = {m["id"]: m["status"]["value"] for m in json.load(r)["data"]}
    p_by, p_ok, p_s = ask(pinned_port, "tiny-p")
    out.append({"asked": model, "by": by, "ok": ok, "s": s, "models": held, "pinned_by": p_by, "pinned_ok": p_ok,
                "pinned_s": p_s})
print(json.dumps(out))
'''


def test_the_pinned_model_stays_while_the_router_swaps_within_models_max(lab, duo):
    name = duo[0]
    show = f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {PINNED_UNIT}"
    on_host(lab, name, f"cat > /root/alternate.py <<'EOF'\n{ALTERNATE}\nEOF")
    before = on_host(lab, name, show).split("\n")
    start = time.monotonic()
    got = json.loads(on_host(lab, name, f"python3 /root/alternate.py 20 {PORT} {PINNED_PORT} {','.join(ROUTED)}")
                     .strip().splitlines()[-1])
    seconds = time.monotonic() - start
    after = on_host(lab, name, show).split("\n")
    loaded = [sum(v != "unloaded" for v in r["models"].values()) for r in got]
    listed = sorted({m for r in got for m in r["models"]})
    swaps = [r["s"] for r in got]
    print(f"20 requests over {ROUTED} with tiny-p asked between each, in {seconds:.1f} s: answered by "
          f"{[r['by'] for r in got]}; the router's loaded models after each {loaded} (at most "
          f"{max(loaded)}); it lists {listed}; seconds per request {min(swaps)}..{max(swaps)}, tiny-p's "
          f"{min(r['pinned_s'] for r in got)}..{max(r['pinned_s'] for r in got)}; the pinned unit before "
          f"{before}, after {after}; last /models {got[-1]['models']}")
    assert [(r["asked"], r["by"], r["ok"]) for r in got] == [(m, m, True) for m in (ROUTED * 7)[:20]]
    assert [(r["pinned_by"], r["pinned_ok"]) for r in got] == [("tiny-p", True)] * 20
    assert max(loaded) == 2 and min(loaded) >= 1      # --models-max 2 holds, and is used
    assert listed == sorted(ROUTED)                   # the router never knows tiny-p
    assert before == after and "MainPID=0" not in before and "NRestarts=0" in before


def test_a_set_that_cannot_fit_beside_its_pinned_model_is_refused(lab, duo):
    """tiny-p at 40 GiB: 48 GiB pinned of 64 leaves 16, where big-a (22) and big-b (20) do not fit."""
    name = duo[0]
    before = fingerprint(lab, name)
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", name, *data(lab_models(**{"tiny-p": 40}), ROUTER))
    lines = refusals(run)
    print(f"exit {run.returncode} in {run.seconds:.1f} s:\n" + "\n".join(lines))
    assert run.returncode != 0
    for model, weights, need in (("big-a", 14, 22), ("big-b", 12, 20)):
        assert any(f"[{name}] refused: model {model} of llama_server_instances.duo does not fit beside its pinned "
                   f"tiny-p" in ln and re.search(rf"weights {weights}\.0 GiB \+ KV cache \d+\.\d GiB \+ 8\.0 GiB overhead "
                                                 rf"= {need}\.0 GiB > 64\.0 GiB of VRAM \(8 x 8\.0 GiB\) - pinned "
                                                 r"tiny-p 48\.0 GiB = 16\.0 GiB", ln) for ln in lines), lines
    assert not any("model gemma-270m " in ln for ln in lines)   # 13 GiB fits in the 16 left
    assert fingerprint(lab, name) == before


def test_more_startup_models_than_fit_are_refused(lab, duo):
    """load_on_startup on big-a and big-b: with the instance's own model, 3 at the start of a router
    that holds 2 (models_max auto, from the VRAM)."""
    name = duo[0]
    before = fingerprint(lab, name)
    startup = {**ROUTER, "per_model": {**ROUTER["per_model"], "big-a": {"load_on_startup": True},
                                       "big-b": {"load_on_startup": True}}}
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", name, *data(lab_models(), startup))
    lines = refusals(run)
    print(f"exit {run.returncode} in {run.seconds:.1f} s:\n" + "\n".join(lines))
    assert run.returncode != 0
    assert any(f"[{name}] refused: 3 models of llama_server_instances.duo load at its start (gemma-270m, big-a, "
               "big-b), more than it holds at once" in ln and "models_max 2 from VRAM (64.0 GiB on 8 cards" in ln
               for ln in lines), lines
    assert fingerprint(lab, name) == before




def test_the_relay_scrapes_the_pinned_server_as_its_own_not_as_the_routers(lab, duo):
    """roles/metrics's relay on the host, as this converge configured it: the pinned server at
    /metrics/duo.tiny-p, llama-server's own samples of it labelled model="tiny-p"; the router's
    scrape names only the models of its set (tiny-p no unloaded model of it)."""
    name = duo[0]
    config = json.loads(on_host(lab, name, "cat /etc/rigup/metrics-relay.json"))["instances"]
    relay = "http://$(hostname -I | cut -d' ' -f1):9101/metrics"
    pinned = on_host(lab, name, f"curl -s -m 15 -w '\\n%{{http_code}}' \"{relay}/duo.tiny-p\"").splitlines()
    router = on_host(lab, name, f"curl -s -m 15 \"{relay}/duo\"").splitlines()
    samples = [ln for ln in pinned[:-1] if ln.startswith("llamacpp:")]
    loaded = sorted(ln.split("}")[0] + "}" for ln in router if ln.startswith("rigup_router_model_loaded{"))
    print(f"relay config: duo {config['duo']}, duo.tiny-p {config.get('duo.tiny-p')}; /metrics/duo.tiny-p: "
          f"{pinned[-1]}, {len(samples)} samples, e.g. {samples[:2]}; /metrics/duo's set: {loaded}")
    assert config["duo.tiny-p"] == {"url": f"http://127.0.0.1:{PINNED_PORT}", "key": None, "model": "tiny-p"}
    assert config["duo"]["models"] == ROUTED
    assert pinned[-1] == "200" and samples and all('model="tiny-p"' in ln for ln in samples)
    assert loaded == [f'rigup_router_model_loaded{{model="{m}"}}' for m in sorted(ROUTED)]
    assert not any('"tiny-p"' in ln for ln in router)


def test_status_shows_the_pinned_server_with_its_model_and_state(lab, duo):
    """status.py: the pinned server's own entry in the serving cell (duo.tiny-p active :8093 200
    tiny-p@REVISION), the router's beside it; tiny-p never among the router's loaded models."""
    name = duo[0]
    shown = pyinfra("inventory/lab.py", "status.py", "--limit", name, *data(lab_models(), ROUTER), timeout=120)
    row = next((ln for ln in shown.output.splitlines() if " duo.tiny-p " in ln), "")
    print(row)
    assert shown.returncode == 0
    assert re.search(rf"(^|; |\s)duo\.tiny-p active :{PINNED_PORT} 200 tiny-p@[0-9a-f]+", row), row
    assert re.search(rf"(^|; |\s)duo active :{PORT} 200 gemma-270m@[0-9a-f]+ \[loaded: [^\]]*\]", row), row
    assert "tiny-p" not in re.search(r"\[loaded: ([^\];]*)", row).group(1)


def test_the_watchdog_asks_the_pinned_server_and_restarts_it_when_wedged(lab, duo):
    """roles/watchdog's program on the host with the configuration watchdog_config makes for duo with
    a floor (min_tokens_per_s 0.5; the module's 0 watches nothing): tiny-p is an instance of its own,
    duo.tiny-p at port + 2 (the router's set without it). Judged as a single-model server: it
    answers above the floor; stopped (SIGSTOP, a wedged server), no answer within 5 s is one bad
    check, and with bad_checks 1 its unit rigup-llama@duo.tiny-p is restarted (a new MainPID that
    answers again), never the router's. Last in the module: it restarts the pinned server."""
    from roles.watchdog import watchdog_config

    name = duo[0]
    config = watchdog_config({"llama_server_instances": {"duo": {**ROUTER, "min_tokens_per_s": 0.5}},
                              "watchdog_interval_s": 300, "watchdog_bad_checks": 1, "watchdog_max_tokens": 8,
                              "watchdog_timeout_s": 5, "watchdog_grace_s": 0, "rigup_maintenance": False,
                              "rigup_state_dir": "/root/wdp", "rigup_watchdog_reboot": False,
                              "rigup_watchdog_max_reboots": 1})
    assert config["instances"]["duo.tiny-p"] == {"url": f"http://127.0.0.1:{PINNED_PORT}", "port": PINNED_PORT,
                                                 "key": None, "floor": 0.5}
    assert config["instances"]["duo"]["models"] == ROUTED
    config["instances"] = {"duo.tiny-p": config["instances"]["duo.tiny-p"]}   # the router is not this test's
    config["metrics_file"] = "/root/wdp/rigup_watchdog.prom"
    program, measuring = (ROOT / "roles/watchdog/shipped/watchdog.py").read_text(), (ROOT / "shipped/throughput.py").read_text()
    on_host(lab, name, f"mkdir -p /root/wdp && cat > /root/wdp/watchdog.py <<'EOF'\n{program}\nEOF\n"
                       f"cat > /root/wdp/rigup_throughput.py <<'EOF'\n{measuring}\nEOF\n"
                       f"cat > /root/wdp/config.json <<'EOF'\n{json.dumps(config)}\nEOF")
    check = "cd /root/wdp && python3 watchdog.py --config config.json check 2>&1"
    pid = f"systemctl show -p MainPID --value {PINNED_UNIT}"
    router_pid = on_host(lab, name, "systemctl show -p MainPID --value rigup-llama@duo").strip()
    healthy = on_host(lab, name, check)
    before = on_host(lab, name, pid).strip()
    on_host(lab, name, f"kill -STOP {before}")
    wedged = on_host(lab, name, check)
    after = ""
    for _ in range(120):   # the restart was asked with --no-block: its new server up and answering
        after = on_host(lab, name, pid).strip()
        code = on_host(lab, name, f"curl -s -o /dev/null -m 2 -w '%{{http_code}}' http://127.0.0.1:{PINNED_PORT}/health; true")
        if after not in ("0", before) and code.strip() == "200":
            break
        time.sleep(1)
    state = json.loads(on_host(lab, name, "cat /root/wdp/watchdog.json"))["duo.tiny-p"]
    metrics = on_host(lab, name, "cat /root/wdp/rigup_watchdog.prom")
    print(f"healthy: {healthy.strip().splitlines()[-1:]}; wedged: {wedged.strip().splitlines()[-2:]}; MainPID "
          f"{before} -> {after}; state {state}")
    assert re.search(r"duo\.tiny-p: [\d.]+ tok/s, at or above its floor 0\.5 tok/s", healthy), healthy
    assert "duo.tiny-p: no answer within 5 s, below its floor 0.5 tok/s" in wedged, wedged
    assert f"restarting {PINNED_UNIT}.service" in wedged, wedged
    assert after not in ("0", before) and code.strip() == "200"
    assert state["restarts"] == 1 and 'rigup_watchdog_restarts_total{llama_instance="duo.tiny-p"} 1' in metrics
    assert on_host(lab, name, "systemctl show -p MainPID --value rigup-llama@duo").strip() == router_pid
