"""roles/llama_cpp's smoke inference on the lab: a build that crashes on its first inference is
not switched to (the instance goes on serving the previous build, no request fails), and a build
that crashes only while repacking (llama.cpp's AMX/repack crash, made to happen on any CPU by the
lab's tag lab-repack-crash: tests/lab/sources.py) serves with the remedy, named in the plan and
the summary. Figures printed: requests answered and failed, seconds the smoke added."""

import json
import subprocess
import time

import pytest

from tests.conftest import on_host
from tests.converge import ROOT, pyinfra

pytestmark = pytest.mark.lab
DIR = "/opt/rigup/llama.cpp"
LOAD = (ROOT / "tests/roles/load.py").read_text()


@pytest.fixture(scope="module")
def host(lab, second_converge):
    name = lab.hosts()[-1]["name"]
    # as group_vars/lab.yml serves it (no key: the client below has none), whatever a module before left
    ready = pyinfra("inventory/lab.py", "deploy.py", "--limit", name)
    assert ready.returncode == 0, ready.output[-3000:]
    on_host(lab, name, f"cat > /root/load.py <<'EOF'\n{LOAD}\nEOF\necho none > /root/key")
    yield name
    pyinfra("inventory/lab.py", "deploy.py", "--limit", name)    # back to the default build


def current(lab, host):
    return on_host(lab, host, f"readlink {DIR}/current").strip()


def answered(lab, host) -> int:
    """The tokens of one completion from the host's instance."""
    answer = on_host(lab, host, "curl -s http://127.0.0.1:8081/v1/completions -H 'Content-Type: application/json' "
                                "-d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 4}'")
    return json.loads(answer)["usage"]["completion_tokens"]


# the speed comparison (off in group_vars/lab.yml): on, with a tolerance wide enough for the lab's
# noise, which goes both ways (an equal build measured 0.69x once, 4.9x another time), for the
# builds as fast as lab-base (refused below 0.25x)
COMPARE_ON = ("--data", "llama_cpp_compare=true")      # at the role's own tolerance (0.1)
COMPARE = (*COMPARE_ON, "--data", "llama_cpp_slower_tolerance=0.75")
# each tag's build and smoke made small: llama-server alone (the smoke starts nothing else; the
# other targets' objects and static links cost each build), and the smoke's sessions on the tiny
# model rigup ships (llama_cpp_smoke_max_model_gib 0: the served model's 72 tokens a comparison
# session took 21 s with lab-slow-decode); the crashes and the slow decode are the build's, not the model's
SMALL = ("--data", 'llama_cpp_targets=["llama-server"]', "--data", "llama_cpp_smoke_max_model_gib=0")


def converge_under_load(lab, host, ref):
    """Converge ``host`` to llama.cpp ``ref`` while a client loops on its instance, the new build
    compared with the serving one: (run, load)."""
    on_host(lab, host, "rm -f /root/stop")
    loop = subprocess.Popen(lab.ssh_argv(host) + ["--", "python3 /root/load.py http://127.0.0.1:8081 4 2 8 "
                                                  "/root/key /root/stop"], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    try:
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, "--data", f"llama_cpp_ref={ref}", *SMALL, *COMPARE)
    finally:
        on_host(lab, host, "touch /root/stop")
        out, _ = loop.communicate(timeout=120)
    return run, json.loads(out)


def test_a_build_that_crashes_on_its_first_inference_is_not_switched_to(lab, host):
    before = current(lab, host)
    run, load = converge_under_load(lab, host, "lab-crash")
    print(f"\nconverge to lab-crash: {load['ok']} requests answered, {load['failed']} failed; "
          f"exit {run.returncode} after {run.seconds:.0f} s")
    assert run.returncode != 0
    assert current(lab, host) == before
    assert load["failed"] == 0 and load["ok"] > 0, load
    summary = run.output[run.output.index("--> rigup: what happened"):]
    assert f"[{host}] failed" in summary and "lab-crash-" in summary and "SIGSEGV" in summary, summary
    assert "during its first inference" in summary
    build = on_host(lab, host, f"ls -d {DIR}/builds/lab-crash-*/").split()[0]
    on_host(lab, host, f"test -x {build}bin/llama-server")     # kept for inspection
    assert "crashed (SIGSEGV)" in on_host(lab, host, f"cat {build}rigup-smoke.json")
    assert on_host(lab, host, "systemctl is-active rigup-llama@gemma").strip() == "active"


def test_a_build_slower_than_the_serving_one_is_refused_with_its_ratio(lab, host):
    """issue 51: lab-slow-decode answers its smoke, but each generated token takes 5x its time
    (measured new, then current, on the tiny smoke model (SMALL): one round; the remedy test
    below measures the role's two), judged at the
    role's own tolerance (default 0.1: refused below 0.9x): no switch, the instance untouched, the
    host's line names the ratio. Measured with no client on the instance: on the lab's 2 shared
    cores a client's load made the measurement noise (its CPU threads against the measured
    server's): this very build measured 1.44x the serving one's rate under it, 0.113x to 0.183x
    without; with the other lane's converges on the same cores, 0.58x once (which a tolerance of
    0.6, used here before, let through: CI failed on it)."""
    before = current(lab, host)
    pid = on_host(lab, host, "systemctl show -p MainPID --value rigup-llama@gemma").strip()
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, "--data", "llama_cpp_ref=lab-slow-decode", *SMALL,
                  *COMPARE_ON, "--data", "llama_cpp_compare_rounds=1")
    assert run.returncode != 0, run.output[-3000:]
    build = on_host(lab, host, f"ls -d {DIR}/builds/lab-slow-decode-*/").split()[0]
    cmp = json.loads(on_host(lab, host, f"cat {build}rigup-smoke.json"))["compare"]
    print(f"\nconverge to lab-slow-decode: {cmp['ratio']}x lab-base's decode ({cmp['new_tps']} against "
          f"{cmp['current_tps']} tok/s, {cmp['model']}), tolerance {cmp['tolerance']}; "
          f"exit {run.returncode} after {run.seconds:.0f} s")
    assert not cmp["ok"] and cmp["tolerance"] == 0.1 and cmp["ratio"] < 0.9
    assert cmp["rounds"] == 1 and len(cmp["current_tps"]) == 1
    assert current(lab, host) == before
    assert on_host(lab, host, "systemctl show -p MainPID --value rigup-llama@gemma").strip() == pid
    assert answered(lab, host) > 0
    summary = run.output[run.output.index("--> rigup: what happened"):]
    assert f"[{host}] failed" in summary and f"{cmp['ratio']:.2f}x the current build's decode" in summary, summary
    assert "is slower than the current build" in run.output


def test_a_crash_that_the_remedy_avoids_serves_with_it_and_is_named(lab, host):
    """With no client on the instance (the crash test above shows that a smoke disturbs none; a
    client here made the comparison noise and this test 2.5x as long: 374 s in one CI run)."""
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, "--data", "llama_cpp_ref=lab-repack-crash", *SMALL, *COMPARE)
    assert run.returncode == 0, run.output[-3000:]
    assert current(lab, host).startswith("builds/lab-repack-crash-")
    result = json.loads(on_host(lab, host, f"cat {DIR}/current/rigup-smoke.json"))
    assert result["traps"] == ["cpu-repack-crash"] and result["server_args"] == ["--no-repack"]
    assert "--no-repack" in on_host(lab, host, "systemctl cat rigup-llama@gemma | grep ^ExecStart=/")
    assert f"[{host}] converged" in run.output and "trap cpu-repack-crash: --no-repack" in run.output
    # as fast as lab-base (the same code where it does not crash): measured, and it switched
    assert result["compare"]["ok"] and result["compare"]["ratio"] >= 0.25, result["compare"]
    assert result["compare"]["rounds"] == 2 and len(result["compare"]["new_tps"]) == 2   # the role's default
    assert f"{result['compare']['ratio']:.2f}x the current build's decode" in run.output
    print(f"\nconverge to lab-repack-crash: smoke {result['seconds']} s (crash, then --no-repack), "
          f"{result['compare']['ratio']}x lab-base's decode; exit 0 after {run.seconds:.0f} s")
    again = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, "--data", "llama_cpp_ref=lab-repack-crash", *SMALL)
    assert again.returncode == 0 and again.totals["changed"] == 0, again.changed_operations()
    assert f"llama.cpp {current(lab, host).split('/')[1]}: trap cpu-repack-crash met by its smoke inference" in again.output
    assert f"[{host}] unchanged; trap cpu-repack-crash: --no-repack" in again.output
    assert answered(lab, host) > 0


def test_back_to_a_proven_build_switches_without_a_smoke_and_drops_the_remedy(lab, host):
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
    assert run.returncode == 0, run.output[-3000:]
    assert current(lab, host).startswith("builds/lab-base-")
    # lab-base was proven by the first converge; smoked again only when an earlier module changed
    # what the smoke is tried with (another instance, an RPC worker): either way it serves
    # the remedy goes unless lab-base's own smoke needed it: a CPU whose AMX repack crashes (a VM
    # that lists amx_tile: SIGILL while loading) keeps --no-repack for every build
    base = json.loads(on_host(lab, host, f"cat {DIR}/current/rigup-smoke.json"))
    print(f"\nback to lab-base: {'smoked again' if 'answered (' in run.output else 'no smoke (proven)'}; "
          f"its own smoke's traps: {base.get('traps')}")
    kept = "--no-repack" in on_host(lab, host, "systemctl cat rigup-llama@gemma | grep ^ExecStart=/")
    assert kept == ("cpu-repack-crash" in (base.get("traps") or []))
