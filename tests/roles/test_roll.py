"""Rolling mode (./roll.py) and maintenance mode on the lab: 4 hosts serving Gemma 3 270M (CPU,
group_vars/lab.yml's model) behind a gateway host (lab5, HAProxy over the 4), while a client loops
through the gateway. The gateway's `show stat` is sampled on it every 0.3 s during each roll."""

import contextlib
import json
import os
import subprocess
import time

import pytest

from tests.conftest import on_host
from tests.converge import ROOT, converge, pyinfra

pytestmark = pytest.mark.lab
KEY = "/etc/rigup/llama-server/gemma.key"
LOAD = (ROOT / "tests/roles/load.py").read_text()
ENV = {"RIGUP_LAB_GATEWAYS": "lab5"}
GATEWAY, SERVING = "lab5", ["lab1", "lab2", "lab3", "lab4"]
HANG = "/etc/systemd/system/rigup-llama@gemma.service.d/zz-test-hang.conf"
# every 0.3 s until /root/stop: "lab1 UP lab2 MAINT lab3 DOWN_1/2 ..." (servers of the gateway's backend
# gateway-gemma and their status; a server is in the pool when its status starts with UP)
SAMPLER = ("while [ ! -e /root/stop ]; do echo 'show stat' | socat stdio /run/haproxy/admin.sock | "
           "awk -F, '$1 == \"gateway-gemma\" && $2 ~ /^lab/ {gsub(/ /, \"_\", $18); printf \"%s %s \", $2, $18} "
           "END {print \"\"}'; sleep 0.3; done")


def data(ctx: int) -> tuple[str, str]:
    recipe = {"gemma": {"model": "gemma-270m", "port": 8081, "ctx": ctx, "parallel": 1, "ngl": 0,
                        "host": "0.0.0.0", "api_key": True}}
    return "--data", f"llama_server_instances={json.dumps(recipe)}"


def ctx_served(lab, name: str) -> str:
    """The -c of the llama-server running on ``name`` ("none" when none runs)."""
    args = on_host(lab, name, "ps -eo args | grep '^/.*[l]lama-server' || true").split()
    return args[args.index("-c") + 1] if "-c" in args else "none"


def pool(lab) -> dict[str, str]:
    out = on_host(lab, GATEWAY, "echo 'show stat' | socat stdio /run/haproxy/admin.sock")
    return {c[1]: c[17] for c in (ln.split(",") for ln in out.splitlines()) if c[0] == "gateway-gemma" and c[1] in SERVING}


def wait_pool(lab, want: dict[str, str], seconds: int = 90) -> dict[str, str]:
    start = time.monotonic()
    while (now := pool(lab)) != want:
        assert time.monotonic() - start < seconds, f"gateway pool {now}, wanted {want}"
        time.sleep(1)
    return now


@pytest.fixture(scope="module")
def rack(lab):
    """lab1-4 serve gemma (-c 2048) with one API key (lab1's, as a rack behind one URL needs);
    lab5 is their gateway (tests/roles/balancer_only.py); a second converge changes nothing."""
    lab.up(2, "a100", first=3)
    lab.up(1, "none", first=5)
    try:
        converge("inventory/lab.py", "--limit", "lab1", *data(2048), env=ENV)
        converge("inventory/lab.py", *[a for n in SERVING[1:] for a in ("--limit", n)], *data(2048), env=ENV)
        key = on_host(lab, "lab1", f"cat {KEY}")
        for name in SERVING[1:]:
            on_host(lab, name, f"printf %s {key} > {KEY} && systemctl restart rigup-llama@gemma")
        for _ in range(2):
            run = pyinfra("inventory/lab.py", "tests/roles/balancer_only.py", "--limit", GATEWAY, env=ENV)
            assert run.returncode == 0, run.output[-5000:]
        assert run.totals["changed"] == 0
        on_host(lab, GATEWAY, f"install -d /etc/rigup/llama-server && printf %s {key} > {KEY}")
        on_host(lab, GATEWAY, f"cat > /root/load.py <<'EOF'\n{LOAD}\nEOF")
        wait_pool(lab, dict.fromkeys(SERVING, "UP"))
        yield lab
    finally:
        for name in ("lab3", "lab4", "lab5"):
            lab.remove(name)


@contextlib.contextmanager
def client(lab):
    """A client looping through the gateway, and the gateway's pool sampled, for the block; then
    {"result": the client's counts, "out": per sample, the servers not UP}."""
    on_host(lab, GATEWAY, "rm -f /root/stop")
    loop = subprocess.Popen(lab.ssh_argv(GATEWAY) + ["--", f"python3 /root/load.py http://127.0.0.1:8081 2 1 8 {KEY} /root/stop"],
                            stdout=subprocess.PIPE, text=True)
    sampler = subprocess.Popen(lab.ssh_argv(GATEWAY) + ["--", SAMPLER], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    seen = {}
    try:
        yield seen
    finally:
        time.sleep(2)
        on_host(lab, GATEWAY, "touch /root/stop")
        seen["result"] = json.loads(loop.communicate(timeout=600)[0].strip().splitlines()[-1])
        samples = [dict(zip(s.split()[::2], s.split()[1::2])) for s in sampler.communicate(timeout=60)[0].splitlines()
                   if s.strip()]
        seen["out"] = [sorted(h for h, st in s.items() if not st.startswith("UP")) for s in samples]


def roll_under_load(lab, *args: str) -> dict:
    """./roll.py with ``args`` while a client loops through the gateway and the gateway's pool is
    sampled: the roll's exit code and output, the client's result, the samples."""
    with client(lab) as seen:
        start = time.monotonic()
        run = subprocess.run([str(ROOT / ".venv/bin/python"), "roll.py", "inventory/lab.py", "-y", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=1500, env={**os.environ, **ENV})
        seconds = time.monotonic() - start
    result, out_of_pool = seen["result"], seen["out"]
    samples = out_of_pool
    summary = run.stdout[run.stdout.rfind("--> rigup roll"):]
    print(f"\nroll.py {' '.join(a[:40] for a in args)}: exit {run.returncode} in {seconds:.1f} s\n{summary}"
          f"client through the gateway: {result['ok']} ok, {result['failed']} failed in {result['seconds']} s; "
          f"{len(samples)} samples of the pool, most hosts out at once: {max(map(len, out_of_pool))}; "
          f"hosts seen out: {sorted({h for o in out_of_pool for h in o})}")
    return {"run": run, "result": result, "out": out_of_pool, "summary": summary, "seconds": seconds}


def test_a_roll_changes_one_host_at_a_time_and_fails_no_request(rack):
    lab = rack
    rolled = roll_under_load(lab, *data(1024))
    assert rolled["run"].returncode == 0, rolled["run"].stdout[-6000:] + rolled["run"].stderr[-3000:]
    assert rolled["result"]["failed"] == 0, rolled["result"]["errors"]
    assert max(map(len, rolled["out"])) == 1
    assert {h for o in rolled["out"] for h in o} == set(SERVING)   # each one went out, one at a time
    served = {name: ctx_served(lab, name) for name in SERVING}
    print(f"ctx served after the roll: {served}")
    assert served == dict.fromkeys(SERVING, "1024")
    assert all(f"[{n}] done" in rolled["summary"] for n in SERVING)
    wait_pool(lab, dict.fromkeys(SERVING, "UP"))


def test_a_failed_gate_stops_the_roll_there(rack):
    """lab3's llama-server is replaced by a stand-in that never answers (a drop-in after rigup's):
    its gate times out; lab1-2 roll to -c 2048, lab3 stays out of the pool, lab4 is not touched."""
    lab = rack
    on_host(lab, "lab3", f"printf '[Service]\\nExecStart=\\nExecStart=/bin/sleep infinity\\n' > {HANG} && systemctl daemon-reload")
    try:
        rolled = roll_under_load(lab, *data(2048), "--data", "llama_server_health_timeout=30")
        served = {name: ctx_served(lab, name) for name in SERVING}
        print(f"ctx served after the stopped roll: {served}; gateway pool: {pool(lab)}")
        assert rolled["run"].returncode != 0
        assert rolled["result"]["failed"] == 0, rolled["result"]["errors"]
        assert max(map(len, rolled["out"])) == 1
        assert served == {"lab1": "2048", "lab2": "2048", "lab3": "none", "lab4": "1024"}
        summary = rolled["summary"]
        assert "[lab1] done" in summary and "[lab2] done" in summary and "[lab4] not started" in summary
        assert "[lab3] failed: failed at llama_server | llama-server gemma answers" in summary
        assert "rigup-llama@gemma.service: /health did not answer 200 within 30 s" in summary
        assert pool(lab) == {"lab1": "UP", "lab2": "UP", "lab3": "MAINT", "lab4": "UP"}
    finally:   # lab3 serves again and is back in the pool
        on_host(lab, "lab3", f"rm -f {HANG} && systemctl daemon-reload && systemctl restart rigup-llama@gemma")
        on_host(lab, GATEWAY, "/opt/rigup/bin/rigup-balancer-drain ready gateway-gemma lab3")


def test_maintenance_takes_a_host_out_and_back(rack):
    """lab4 in maintenance: the gateway's converge takes it out of the pool (disabled), its own
    stops its server and pauses its guard (then again: 0 changes), status shows it; out of
    maintenance: its server starts (gated), the gateway's converge puts it back; no request fails."""
    lab = rack
    maint = {**ENV, "RIGUP_LAB_MAINTENANCE": "lab4"}
    units = "systemctl is-active rigup-llama@gemma rigup-gpu-guard.timer || true"
    gateway = ("inventory/lab.py", "tests/roles/balancer_only.py", "--limit", GATEWAY)
    with client(lab) as seen:
        out = pyinfra(*gateway, env=maint)
        assert out.returncode == 0, out.output[-5000:]
        pool_in = wait_pool(lab, {"lab1": "UP", "lab2": "UP", "lab3": "UP", "lab4": "MAINT"})
        first = converge("inventory/lab.py", "--limit", "lab4", *data(1024), env=maint)
        again = converge("inventory/lab.py", "--limit", "lab4", *data(1024), env=maint)
        stopped = on_host(lab, "lab4", units).split()
        dropin = on_host(lab, "lab4", "ls /etc/systemd/system/rigup-llama@gemma.service.d/").split()
        shown = pyinfra("inventory/lab.py", "status.py", "--limit", "lab4", "--data", "status_format=json", env=maint)
        back = converge("inventory/lab.py", "--limit", "lab4", *data(1024), env=ENV)
        started = on_host(lab, "lab4", units).split()
        out = pyinfra(*gateway, env=ENV)
        assert out.returncode == 0, out.output[-5000:]
        pool_out = wait_pool(lab, dict.fromkeys(SERVING, "UP"))
    status = json.loads(shown.output[shown.output.index('{\n "hosts"'):shown.output.rindex("}") + 1])["hosts"][0]
    print(f"\nmaintenance on lab4: gateway pool {pool_in}; its converge changed {first.changed_operations()}, "
          f"again {again.totals}; units (server, guard timer) {stopped}, drop-ins kept {dropin}; status.py "
          f"maintenance={status['maintenance']}; back: changed {back.changed_operations()}, units {started}, "
          f"pool {pool_out}; client through the gateway: {seen['result']['ok']} ok, {seen['result']['failed']} failed")
    assert first.totals["changed"] > 0 and again.totals["changed"] == 0, again.changed_operations()
    # not running: a server stopped while it still loads exits non-zero ("failed"), one that serves "inactive"
    assert stopped[0] in ("inactive", "failed") and stopped[1] == "inactive" and "rigup.conf" in dropin
    assert status["host"] == "lab4" and status["maintenance"] is True
    assert started == ["active", "active"]
    assert seen["result"]["failed"] == 0, seen["result"]["errors"]
    assert ctx_served(lab, "lab4") == "1024"
