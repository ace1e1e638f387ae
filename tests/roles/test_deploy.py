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


def test_a_second_controller_is_refused_naming_the_first(lab, second_converge):
    """Another controller's run holds the host's converge lock (its own SSH channel, as rigup/lock.py
    takes it): a converge of that host is refused, naming it, and changes nothing; once that run's
    connection is gone the lock is free (nothing stale)."""
    import subprocess

    from rigup.lock import holder_command
    from tests.converge import converge, pyinfra
    host = lab.hosts()[0]["name"]
    other = subprocess.Popen(lab.ssh_argv(host) + ["--", holder_command("ops@other-controller (pid 4242)")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "locked"
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
        assert run.returncode != 0
        assert (f"[{host}] refused: another controller converges this host: ops@other-controller (pid 4242) "
                "holds its lock") in run.output, run.output[-3000:]
        assert "Starting operation" not in run.output
    finally:
        other.stdin.close()          # that run ends: its channel closes, the lock is free
        other.wait(timeout=30)
    again = converge("inventory/lab.py", "--limit", host)
    assert again.totals["changed"] == 0
    print(f"\nrefused while another controller held the lock; {again.seconds:.1f} s converge after it let go")
