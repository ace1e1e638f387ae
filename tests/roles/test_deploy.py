"""The whole play on the lab: a converge that has nothing to do changes nothing, quickly."""

import re

import pytest

pytestmark = pytest.mark.lab


def test_second_converge_changes_nothing(second_converge):
    totals = second_converge.totals
    assert totals["changed"] == 0, second_converge.changed_operations()
    assert totals["errors"] == 0
    print(f"\nsecond converge of the whole play: {second_converge.seconds:.1f} s")


def test_a_fleet_run_says_what_happened_to_each_host(lab, second_converge, tmp_path):
    """4 hosts: two converged ones, one whose link is cut (unreachable) and one whose llama.cpp
    build fails (a ref that does not exist). The two go on; the last lines name the other two
    with their reasons; pyinfra exits non-zero."""
    import json

    from tests.converge import ROOT, pyinfra
    from tests.roles.test_model_fetch import INVENTORY   # the lab's inventory with per-host data
    good = [h["name"] for h in lab.hosts()[:2]]
    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    cut, broken = f"lab{first}", f"lab{first + 1}"
    lab.up(2, "a100", first=first)
    try:
        lab.run("ip", "link", "set", f"{lab.VETH}{cut}", "down")
        inventory = tmp_path / "fleet.py"
        inventory.write_text(INVENTORY.format(lab_inventory=str(ROOT / "inventory/lab.py"),
                                              extra=json.dumps({broken: {"llama_cpp_ref": "no-such-ref"}})))
        run = pyinfra(str(inventory), "deploy.py", *(a for h in [*good, cut, broken] for a in ("--limit", h)),
                      timeout=1500)
        summary = run.output.split("--> rigup: what happened to each host", 1)[-1]
        print(f"\nfleet run in {run.seconds:.0f} s, exit {run.returncode}:{summary}")
        assert run.returncode != 0
        for name in good:
            assert f"[{name}] unchanged" in summary, (summary, run.changed_on(name))
        assert re.search(rf"\[{cut}\] unreachable: .*(timed out|No route|Unable to connect|refused)", summary), summary
        assert re.search(rf"\[{broken}\] failed at .*llama.cpp.*no-such-ref", summary, re.S), summary
    finally:
        lab.remove(cut)
        lab.remove(broken)


def test_the_converge_lock_is_a_lease(lab, second_converge):
    """Another controller holds the host's converge lock (its own SSH channel, as rigup/lock.py
    takes it, from a network namespace of its own on the lab bridge, renewing every second with a
    10 s lease): a converge is refused, naming it, and changes nothing. Its link is cut (``ip link
    set ... down``): the next converge takes the lock within the lease, naming the stale holder. A
    holder killed with -9: the next converge proceeds at once."""
    import subprocess
    import threading
    import time

    from rigup.lock import holder_command
    from tests.converge import converge, pyinfra
    host = lab.hosts()[0]["name"]
    netns, veth, address = f"{lab.NETNS}ctl", f"{lab.VETH}ctl", str(lab.SUBNET[250])
    for cmd in (["netns", "add", netns], ["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns],
                ["link", "set", veth, "master", lab.BRIDGE, "up"],
                ["-n", netns, "addr", "add", f"{address}/{lab.SUBNET.prefixlen}", "dev", "eth0"],
                ["-n", netns, "link", "set", "eth0", "up"], ["-n", netns, "link", "set", "lo", "up"]):
        lab.run("ip", *cmd)

    def holder(owner, netns=None, lease=10):
        argv = (["ip", "netns", "exec", netns] if netns else []) + lab.ssh_argv(host) + [
            "--", holder_command(owner, lease=lease)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("locked")
        return proc

    def renewing(proc):
        def loop():
            while proc.poll() is None:
                try:
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                except OSError:
                    return
                time.sleep(1)
        threading.Thread(target=loop, daemon=True).start()

    refused = "another controller converges this host"
    partitioned = holder("ops@partitioned-controller (pid 4242)", netns)
    try:
        renewing(partitioned)
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
        assert run.returncode != 0
        assert (f"[{host}] refused: {refused}: ops@partitioned-controller (pid 4242) holds its lock") in run.output, \
            run.output[-3000:]
        assert "Starting operation" not in run.output
        print(f"\na live holder (renewing): refused in {run.seconds:.1f} s")

        lab.run("ip", "link", "set", veth, "down")      # its renewals stop arriving; its TCP stays open
        cut = time.monotonic()
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
        waited = time.monotonic() - cut
        assert run.returncode == 0, run.output[-3000:]
        took = re.search(rf"\[{host}\] took the converge lock from ops@partitioned-controller \(pid 4242\), "
                         r"whose lease lapsed \(no renewal for 10 s since [^)]+\)", run.output)
        assert took, run.output[-3000:]
        assert waited < 10 + 30, waited      # the lease, and a converge with nothing to do
        print(f"a holder cut off: the next converge took the lock and ended {waited:.1f} s after the cut: "
              f"{took.group(0)}")
    finally:
        partitioned.kill()
        lab.run("ip", "netns", "del", netns, check=False)
        lab.run("ip", "link", "del", veth, check=False)

    killed = holder("ops@killed-controller (pid 4343)")
    killed.kill()                                       # kill -9 of the controller's side of the channel
    killed.wait(timeout=10)
    again = converge("inventory/lab.py", "--limit", host)
    assert again.totals["changed"] == 0
    assert "took the converge lock" not in again.output
    print(f"a holder killed with -9: the next converge proceeded at once ({again.seconds:.1f} s, nothing to do)")
