"""Several models on a fleet behind one URL (issue 49): the session's two hosts each serve ``duo``,
llama-server's router over Gemma 3 270M and the smoke model rigup ships (one loaded at a time:
models_max 1), behind a gateway host (lab3, HAProxy: tests/roles/balancer_only.py). The gateway
sends each model to the host it stays loaded on (roles/balancer ``homes``: one host per model here,
the other its backup), so requests alternating between the two models are answered without a swap
once each is loaded somewhere; the share is printed (goal: at least 90%), counted from the routers'
own logs (each load is a child process spawned). GET /slots, held off by default, answers once
llama_server_allow names slots, and is held off again when it no longer does (issue 63). The hosts
are left as group_vars/lab.yml serves them and the gateway removed."""

import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rigup.secrets import fleet_api_key
from tests.conftest import on_host
from tests.converge import converge, pyinfra
from tests.roles.test_router import PORT, models_with_tiny

pytestmark = pytest.mark.lab
ENV = {"RIGUP_LAB_GATEWAYS": "lab3"}
# beyond loopback with the fleet's one key (made on the controller on first use; a fresh one per run)
KEY_SRC = Path(tempfile.gettempdir()) / f"rigup-lab{os.environ.get('RIGUP_LAB_ID', '')}-router-fleet-key"
FLEET = ("--data", "fleet_api_key=true", "--data", f"fleet_api_key_src={KEY_SRC}")
GATEWAY = "lab3"
REQUESTS = 40
SPAWNS = "journalctl -q -o cat -u rigup-llama@duo --since @{} | grep -c 'spawning server instance' || true"
ASK = ("curl -s -m 300 http://127.0.0.1:{port}/v1/completions -H @/root/auth.hdr -H 'Content-Type: application/json' "
       "-d '{{\"model\": \"{model}\", \"prompt\": \"The capital of France is\", \"max_tokens\": 4}}'")


@pytest.fixture(scope="module")
def recipe(lab) -> dict:
    """The serving hosts' own data, which the gateway reads of them (--data would set it on the
    gateway too, which then serves nothing itself: group_vars/gateway.yml); duo alone:
    group_vars/lab.yml's gemma binds loopback, which a gateway cannot reach."""
    router = {"model": "gemma-270m", "also": ["tiny"], "models_max": 1, "port": PORT, "ctx": 2048, "parallel": 1,
              "ngl": 0, "min_tokens_per_s": 0, "host": "0.0.0.0", "api_key": True}
    return {"models": models_with_tiny(), "llama_server_instances": {"duo": router}}


def serve(lab, hosts: list[str], recipe: dict, boot: bool = False):
    """The serving hosts converged with ``recipe`` as their data while the gateway converges (booted
    first, with ``boot``): it reads their data of the inventory, not of them, and its frontends' gate
    waits (balancer_health_timeout) until they answer; both runs."""
    env = {**ENV, "RIGUP_LAB_HOST_DATA": json.dumps({h: recipe for h in hosts})}

    def gateway():
        if boot:
            lab.up(1, "none", first=3)
        return pyinfra("inventory/lab.py", "tests/roles/balancer_only.py", "--limit", GATEWAY, *FLEET, env=env)

    with ThreadPoolExecutor(1) as aside:
        running = aside.submit(gateway)
        served = converge("inventory/lab.py", *[a for h in hosts for a in ("--limit", h)], *FLEET, env=env)
        gate = running.result()
    assert gate.returncode == 0, gate.output[-5000:]
    return served, gate


@pytest.fixture(scope="module")
def fleet(lab, recipe):
    hosts = [h["name"] for h in lab.hosts()][:2]
    KEY_SRC.unlink(missing_ok=True)
    fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(KEY_SRC)})   # made once, for both runs at once
    try:
        served, gate = serve(lab, hosts, recipe, boot=True)
        on_host(lab, GATEWAY, f"printf 'Authorization: Bearer %s\\n' {KEY_SRC.read_text().strip()} > /root/auth.hdr")
        print(f"\n{' and '.join(hosts)}: duo in {served.seconds:.1f} s; gateway {GATEWAY} in {gate.seconds:.1f} s")
        yield hosts
    finally:
        with ThreadPoolExecutor(1) as aside:
            removed = aside.submit(lab.remove, GATEWAY)
            restored = pyinfra("inventory/lab.py", "deploy.py", *[a for h in hosts for a in ("--limit", h)])
            removed.result()
        assert restored.returncode == 0, restored.output[-3000:]


def test_each_model_is_answered_where_it_stays_loaded(lab, fleet):
    hosts = fleet
    for model in ("gemma-270m", "tiny"):   # each loaded somewhere first
        on_host(lab, GATEWAY, ASK.format(port=PORT, model=model))
    since = {h: on_host(lab, h, "date +%s").strip() for h in hosts}
    # one shell on the gateway asks them all, one at a time, each answer on a line of its own
    asked = [("gemma-270m", "tiny")[i % 2] for i in range(REQUESTS)]
    start = time.monotonic()
    out = on_host(lab, GATEWAY, "; ".join(f"{ASK.format(port=PORT, model=m)}; echo" for m in asked))
    seconds = time.monotonic() - start
    answers = [(m, json.loads(line).get("model")) for m, line in zip(asked, out.splitlines(), strict=True)]
    spawns = {h: int(on_host(lab, h, SPAWNS.format(since[h])).strip() or 0) for h in hosts}
    loaded = {h: {m["id"]: m["status"]["value"] for m in json.loads(on_host(
        lab, h, f"curl -s -H \"Authorization: Bearer $(cat /etc/rigup/llama-server/duo.key)\" "
                f"http://127.0.0.1:{PORT}/models"))["data"]} for h in hosts}
    share = 1 - sum(spawns.values()) / REQUESTS
    print(f"{REQUESTS} requests through the gateway alternating gemma-270m and tiny in {seconds:.1f} s: "
          f"{share:.0%} answered without a swap (loads per host: {spawns}); loaded: {loaded}")
    assert answers == [(m, m) for m, _ in answers]
    assert share >= 0.9
    assert sorted(next(m for m, v in s.items() if v == "loaded") for s in loaded.values()) == ["gemma-270m", "tiny"]


DROPIN = "/etc/systemd/system/rigup-llama@duo.service.d/rigup.conf"
# a path that llama_server_allow: [slots] opens, and one it does not: (method, path, body)
PATHS = (("GET", "/slots?model=gemma-270m", None), ("POST", "/props", '{"model": "gemma-270m"}'))


def held_codes(lab, hosts: list[str]) -> dict:
    """{where: {"METHOD path": HTTP code}} of PATHS through the gateway and directly at the first
    host's router (its port, no HAProxy there), with the key; and whether the host's drop-in
    carries --no-slots."""
    def ask(host: str, auth: str) -> dict:
        lines = [f"curl -s -o /dev/null -w '%{{http_code}}\\n' -m 300 -X {m} 'http://127.0.0.1:{PORT}{p}' {auth}"
                 + (f" -H 'Content-Type: application/json' -d '{b}'" if b else "") for m, p, b in PATHS]
        return {f"{m} {p}": int(c) for (m, p, _), c in zip(PATHS, on_host(lab, host, "; ".join(lines)).split())}
    return {"gateway": ask(GATEWAY, "-H @/root/auth.hdr"),
            hosts[0]: ask(hosts[0], "-H @<(printf 'Authorization: Bearer %s' \"$(cat /etc/rigup/llama-server/duo.key)\")"),
            "--no-slots": int(on_host(lab, hosts[0], f"grep -c -- ' --no-slots' {DROPIN} || true").strip())}


def test_slots_allowed_by_name_answer_and_the_key_removed_holds_them_off_again(lab, fleet, recipe):
    """Issue 63: llama_server_allow: [slots] on both serving hosts (the gateway opens a path only
    where every host behind it allows it): their drop-ins lose --no-slots, GET /slots answers 200 at
    the router's port and through the gateway, while POST /props (props not allowed) is still 403 at
    the gateway; the key removed, the next converge holds /slots off again, as before (the gateway's
    403, the router's own refusal)."""
    hosts = fleet
    before = held_codes(lab, hosts)
    print(f"\nby default: {before}")
    assert before["gateway"] == {"GET /slots?model=gemma-270m": 403, "POST /props": 403}, before
    assert before[hosts[0]]["GET /slots?model=gemma-270m"] in (403, 404, 501) and before["--no-slots"] == 1, before
    restored = False
    try:
        served, gate = serve(lab, hosts, {**recipe, "llama_server_allow": ["slots"]})
        allowed = held_codes(lab, hosts)
        slots = json.loads(on_host(lab, GATEWAY, f"curl -s -m 300 -H @/root/auth.hdr "
                                                 f"'http://127.0.0.1:{PORT}/slots?model=gemma-270m'"))
        print(f"llama_server_allow [slots]: hosts {served.seconds:.1f} s, gateway {gate.seconds:.1f} s; {allowed}; "
              f"/slots through the gateway: {len(slots)} slot(s), keys {sorted(slots[0])[:6]}")
        assert allowed["--no-slots"] == 0, allowed
        assert allowed["gateway"] == {"GET /slots?model=gemma-270m": 200, "POST /props": 403}, allowed
        assert allowed[hosts[0]]["GET /slots?model=gemma-270m"] == 200, allowed
        assert isinstance(slots, list) and slots and "id" in slots[0], slots
        served, gate = serve(lab, hosts, recipe)
        restored = True
        after = held_codes(lab, hosts)
        print(f"the key removed: hosts {served.seconds:.1f} s, gateway {gate.seconds:.1f} s; {after}")
        assert after == before
    finally:
        if not restored:
            serve(lab, hosts, recipe)
