"""Issue 65: a converge killed (SIGKILL of its pyinfra, the controller) mid-switch of a llama.cpp
build, between the new build's install and the switch: the host keeps serving the build it had;
the next converge names the switch it found cut short, carries it on (the new build proven,
current switched, the instance restarted on it and gated) and the one after changes 0."""

import json
import signal
import subprocess
import time

import pytest

from tests.conftest import on_host
from tests.converge import PYINFRA, ROOT, converge

pytestmark = [pytest.mark.lab, pytest.mark.faults]   # make bench-faults
DIR = "/opt/rigup/llama.cpp"
REF = ("--data", "llama_cpp_ref=lab-bump")   # tests/lab/sources.py's second tag: a build of its own
RUNS = "readlink /proc/$(systemctl show -p MainPID --value rigup-llama@gemma)/exe"   # the build serving


def killed_when(host: str, play: str, args: list[str], begun, seconds: int, after: float, env: dict | None = None) -> float:
    """``pyinfra -y inventory/lab.py PLAY --limit HOST ARGS`` started, then killed with SIGKILL (the
    controller, its SSH connections with it) ``after`` seconds once ``begun()`` holds (within
    ``seconds``, the play still running); the seconds from its start to the kill."""
    proc = subprocess.Popen([PYINFRA, "-y", "inventory/lab.py", play, "--limit", host, *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    start = time.monotonic()
    try:
        while not begun():
            assert time.monotonic() - start < seconds and proc.poll() is None, f"{play}: what was to be cut short never began"
            time.sleep(0.5)
        time.sleep(after)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return time.monotonic() - start


def test_a_converge_killed_mid_switch_of_a_build_is_carried_on_by_the_next(lab, second_converge):
    host = lab.hosts()[0]["name"]
    converge("inventory/lab.py", "--limit", host)   # group_vars/lab.yml's instance, on the default build
    before = on_host(lab, host, f"readlink {DIR}/current").strip()
    # built (or received) and switching, its smoke under way
    killed = killed_when(host, "deploy.py", list(REF), lambda: lab.ssh(host, f"test -s {DIR}/switching").returncode == 0,
                         900, 1)
    left = on_host(lab, host, f"readlink {DIR}/current; cat {DIR}/switching; {RUNS}").split()
    answered = json.loads(on_host(lab, host, "curl -s -m 120 http://127.0.0.1:8081/v1/completions -H "
                                             "'Content-Type: application/json' -d '{\"prompt\": \"Hi\", \"max_tokens\": 4}'"))
    try:
        run = converge("inventory/lab.py", "--limit", host, *REF)
        found = [ln.strip() for ln in run.output.splitlines() if "found a switch to" in ln]
        after = on_host(lab, host, f"readlink {DIR}/current; test -e {DIR}/switching && echo left || echo gone; "
                                   f"{RUNS}").split()
        chat = on_host(lab, host, "curl -s -o /dev/null -w '%{http_code}' -m 120 http://127.0.0.1:8081/v1/completions "
                                  "-H 'Content-Type: application/json' -d '{\"prompt\": \"Hi\", \"max_tokens\": 4}'")
        again = converge("inventory/lab.py", "--limit", host, *REF)
        print(f"\nkilled {killed:.0f} s into the converge, mid-switch: current {left[0]}, switching to {left[1]}, "
              f"serving {left[2]} ({answered['usage']['completion_tokens']} tokens answered); the next converge "
              f"({run.totals['changed']} changed, {run.seconds:.0f} s): {found[:1]}; then current {after[0]}, the mark "
              f"{after[1]}, serving {after[2]}, a completion {chat}; the converge after: {again.totals['changed']} changed")
        assert left[0] == before and left[1].startswith("builds/lab-bump-") and left[2].startswith(f"{DIR}/{before}/")
        assert answered["usage"]["completion_tokens"] > 0
        assert found and f"found a switch to {left[1]} cut short" in found[0] and f"current stayed {before}" in found[0]
        assert after[0] == left[1] and after[1] == "gone" and after[2] == f"{DIR}/{left[1]}/bin/llama-server"
        assert chat == "200"
        assert again.totals["changed"] == 0, again.changed_operations()
    finally:
        converge("inventory/lab.py", "--limit", host)   # back to the default build for the modules after
