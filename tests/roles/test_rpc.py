"""llama.cpp RPC across lab hosts: Gemma 3 270M served by llama-server on lab1 with layers on an
RPC worker (rigup-rpc, roles/rpc_worker) on lab2; a third host cannot reach the worker's port."""

import json
import shlex
import time

import pytest

from tests.conftest import on_host
from tests.converge import converge, pyinfra
from tests.demo import PROMPT

pytestmark = pytest.mark.lab
HEAD, WORKER, OTHER = "lab1", "lab2", "lab3"
HEAD_UNIT = "rigup-llama@gemma.service"
WAIT_S = 15   # the head's wait for its worker: one up answers at once; 5 s failed the healing converge under CI's load (a worker started in the same run, not yet listening)
# lab1's own instance (host data, over group_vars/lab.yml): 10 of Gemma's layers on lab2's CPU, via RPC
ENV = {"RIGUP_LAB_HOST_DATA": json.dumps({HEAD: {
    "llama_server_rpc_wait": WAIT_S,
    "llama_server_instances": {"gemma": {"model": "gemma-270m", "port": 8081, "ctx": 4096, "parallel": 2,
                                         "ngl": 10, "rpc_workers": [WORKER]}}}})}


def run(*hosts, ok=True):
    """deploy.py on ``hosts`` with lab1 as the RPC head."""
    limit = [a for h in hosts for a in ("--limit", h)]
    if ok:
        return converge("inventory/lab.py", *limit, env=ENV)
    return pyinfra("inventory/lab.py", "deploy.py", *limit, env=ENV)


@pytest.fixture(scope="module")
def group(lab):
    """lab2 converged first (the llama.cpp build, its worker), then both hosts; lab3 booted bare."""
    lab.up(1, "none", first=3)
    try:
        first = run(WORKER)
        both = run(HEAD, WORKER)
        print(f"converge lab2 {first.seconds:.0f} s, then lab1 and lab2 {both.seconds:.0f} s")
        yield {h["name"]: h["address"] for h in lab.hosts()}
    finally:
        lab.remove(OTHER)


def ask(lab) -> dict:
    body = json.dumps({"model": "gemma", "temperature": 0, "prompt": PROMPT, "max_tokens": 32, "stop": ["\n"]})
    out = on_host(lab, HEAD, "curl -s -m 120 http://127.0.0.1:8081/v1/completions "
                             f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")
    return json.loads(out)


def test_the_head_serves_with_layers_on_the_worker(lab, group):
    worker = f"{group[WORKER]}:50052"
    args = on_host(lab, HEAD, "ps -eo args | grep [l]lama-server")
    assert f"--rpc {worker}" in args and "-ngl 10" in args
    # the worker holds the head's 10 layers (weights and their KV cache) in its memory
    rss_mib = int(on_host(lab, WORKER, "ps -o rss= -C ggml-rpc-server")) / 1024
    print(f"ggml-rpc-server on {WORKER}: {rss_mib:.0f} MiB resident")
    assert rss_mib > 50
    assert "Accepted client connection" in on_host(lab, WORKER, "journalctl -u rigup-rpc -o cat --no-pager")
    reply = ask(lab)
    text = reply["choices"][0]["text"].strip()
    print(f"answer: {text!r}; {reply['timings']['predicted_per_second']:.1f} tok/s")
    assert "Paris" in text
    served = on_host(lab, WORKER, "ps -eo user:12,args | grep [g]gml-rpc-server")
    assert served.startswith("rigup ") and f"-H {group[WORKER]} -p 50052" in served


def test_only_the_head_reaches_the_worker_port(lab, group):
    probe = f"timeout 5 bash -c ': <>/dev/tcp/{group[WORKER]}/50052' 2>&1; echo rc=$?"
    other = lab.ssh(OTHER, probe).stdout
    head = lab.ssh(HEAD, probe).stdout
    print(f"from {OTHER}: {other.strip()!r}; from {HEAD}: {head.strip()!r}")
    assert "Connection refused" in other and "rc=1" in other
    assert head.strip() == "rc=0"
    table = on_host(lab, WORKER, "nft list table inet rigup_rpc")
    assert f"ip saddr {group[HEAD]} accept" in table and "reject with tcp reset" in table
    port = f"{50052:04X}"   # /proc/net/tcp: listening sockets (state 0A) as hex address:port
    listening = [ln.split()[1] for ln in on_host(lab, WORKER, "cat /proc/net/tcp").splitlines()[1:]
                 if ln.split()[3] == "0A" and ln.split()[1].endswith(":" + port)]
    print(f"listening on port {port}: {listening}")
    assert listening == ["".join(f"{int(b):02X}" for b in reversed(group[WORKER].split("."))) + ":" + port]


def test_converge_twice_changes_nothing(lab, group):
    before = on_host(lab, HEAD, f"systemctl show -p ActiveEnterTimestampMonotonic --value {HEAD_UNIT}")
    again = run(HEAD, WORKER)
    print(f"second converge: {again.totals}, changed: {again.changed_operations()}, {again.seconds:.0f} s")
    assert again.totals["changed"] == 0, again.changed_operations()
    assert on_host(lab, HEAD, f"systemctl show -p ActiveEnterTimestampMonotonic --value {HEAD_UNIT}") == before


def test_a_stopped_worker_fails_the_head_and_its_gate(lab, group):
    worker = f"{group[WORKER]}:50052"
    on_host(lab, WORKER, "systemctl stop rigup-rpc")
    start = time.monotonic()
    lab.ssh(HEAD, "curl -s -m 30 -o /dev/null http://127.0.0.1:8081/v1/completions -H 'Content-Type: "
                  "application/json' -d '{\"prompt\": \"Hi\", \"max_tokens\": 4}'")   # the head meets the gone worker
    reason = f"rigup: RPC worker {worker} does not answer"
    deadline = time.monotonic() + 120
    while reason not in lab.ssh(HEAD, f"journalctl -u {HEAD_UNIT} -o cat --no-pager | tail -n 50").stdout:
        assert time.monotonic() < deadline, on_host(lab, HEAD, f"journalctl -u {HEAD_UNIT} -o cat --no-pager | tail -n 30")
        time.sleep(1)
    state = on_host(lab, HEAD, f"systemctl show -p ActiveState -p SubState --value {HEAD_UNIT}").split()
    print(f"head unit after {time.monotonic() - start:.0f} s: {state}; its journal says {reason!r}")
    failed = run(HEAD, ok=False)
    assert failed.returncode != 0
    assert "/health did not answer 200" in failed.output and reason in failed.output
    said = [ln.strip() for ln in failed.output.splitlines() if "/health did not answer" in ln or reason in ln]
    print(f"converge of {HEAD} alone failed in {failed.seconds:.0f} s: {said}")
    healed = run(HEAD, WORKER)   # the worker comes back, and the head with it
    assert "Paris" in ask(lab)["choices"][0]["text"]
    print(f"converge of both healed it in {healed.seconds:.0f} s")
