"""plays/roll.py: which hosts roll, their batches, what a batch's converge said of each host."""

import fnmatch

import os

import pytest

from plays import roll
from rigup.config import declared
from tests.unit.forker import close_all, forked


def test_serving_hosts_in_inventory_order_without_gateways():
    hosts = {"rig-2": {"llama_server_instances": {"a": {}}}, "gw": {"balancer_gateway": True, "llama_server_instances": {"a": {}}},
             "mon": {"llama_server_instances": {}}, "rig-1": {"vllm_instances": {"v": {}}},
             "rig-3": {"llama_server_instances": {"a": {}}, "rigup_maintenance": True}}
    assert roll.serving_hosts(hosts) == ["rig-2", "rig-1"]


@pytest.mark.parametrize("batch, sizes", [(1, [1, 1, 1, 1, 1]), (2, [2, 2, 1]), (9, [5]), ("25%", [1, 1, 1, 1, 1]),
                                          ("40%", [2, 2, 1]), ("100%", [5]), ("1%", [1, 1, 1, 1, 1])])
def test_batches(batch, sizes):
    assert [len(b) for b in roll.batches(list("abcde"), batch)] == sizes


def test_a_host_that_pulses_its_power_delivery_rolls_alone():
    assert roll.batches(list("abcde"), "100%", {"b", "d"}) == [["b"], ["d"], ["a", "c", "e"]]
    assert roll.batches(list("ab"), 2, {"a", "b"}) == [["a"], ["b"]]


@pytest.mark.parametrize("bad", [0, -1, True, "0%", "101%", "25", "a%", 2.5])
def test_batch_refused(bad):
    assert declared()["rigup_batch"].form.problem(bad)
    with pytest.raises(ValueError, match="rigup_batch"):
        roll.batches(["a"], bad)


def test_batch_form_takes_counts_and_shares():
    form = declared()["rigup_batch"].form
    assert form.problem(1) is None and form.problem(12) is None and form.problem("25%") is None
    assert declared()["rigup_max_fail"].form.problem(-1)


SAID = ("--> rigup: what happened to each host\n    [lab1] converged (3 changed)\n"
        "\x1b[31m    [lab2] failed at llama-server gemma answers: rigup-llama@gemma.service: /health did not answer\x1b[0m\n"
        "    [lab9] unreachable: timed out\n    [lab4] unchanged; the trap x was avoided\n")


def test_outcomes_from_the_summary_lines():
    assert roll.outcomes(SAID, ["lab1", "lab2", "lab4"], 1) == {
        "lab1": ("done", "converged (3 changed)"),
        "lab2": ("failed", "failed at llama-server gemma answers: rigup-llama@gemma.service: /health did not answer"),
        "lab4": ("done", "unchanged; the trap x was avoided")}
    assert roll.outcomes(SAID, ["lab9"], 1) == {"lab9": ("failed", "unreachable: timed out")}
    refused = "--> rigup: what happened to each host\n    [lab3] refused (2 reasons): a; b\n"
    assert roll.outcomes(refused, ["lab3"], 1)["lab3"] == ("failed", "refused (2 reasons): a; b")


def test_a_host_without_its_own_line_is_unknown_whatever_the_exit_code():
    for code in (0, 1):
        assert roll.outcomes("nothing said", ["lab3"], code) == {
            "lab3": ("unknown", f"pyinfra's output has no result line for it (pyinfra exited {code})")}
        assert roll.outcomes(SAID, ["lab3"], code)["lab3"][0] == "unknown"
    # a line before rigup's summary block (a deploy's own log) is not the host's result
    early = "    [lab3] unchanged\n--> rigup: what happened to each host\n    [lab1] unchanged\n"
    assert roll.outcomes(early, ["lab3", "lab1"], 0) == {
        "lab3": ("unknown", "pyinfra's output has no result line for it (pyinfra exited 0)"), "lab1": ("done", "unchanged")}
    assert roll.outcomes("--> rigup: what happened to each host\n    [lab1] Success\n", ["lab1"], 0)["lab1"][0] == "unknown"
    # round 33 R33a: a host's own output, echoed by pyinfra behind its name, is no summary block: with rigup's own
    # block missing (pyinfra killed), the host is unknown, not done
    echoed = "[lab1] --> rigup: what happened to each host\n[lab1] converged (2 changed)\n"
    assert roll.outcomes(echoed, ["lab1"], 1)["lab1"][0] == "unknown"
    assert roll.outcomes(echoed + SAID, ["lab1"], 1)["lab1"] == ("done", "converged (3 changed)")


def test_dry_runs_print_no_summary():
    assert roll.outcomes("", ["a"], 0, dry=True) == {"a": ("done", "planned (--dry: nothing changed)")}
    assert roll.outcomes("", ["a"], 1, dry=True) == {"a": ("failed", "pyinfra exited 1")}
    assert roll.outcomes(SAID, ["lab2"], 1, dry=True)["lab2"][0] == "failed"


def test_strays_are_the_hosts_outside_the_batch():
    assert roll.strays(SAID, ["lab1", "lab2"]) == {"lab9": "unreachable: timed out",
                                                   "lab4": "unchanged; the trap x was avoided"}
    assert roll.strays(SAID, ["lab1", "lab2", "lab4", "lab9"]) == {}


def test_summary_says_done_failed_not_started():
    lines = roll.summary(["a", "b"], {"c": "failed at x: y"}, ["d"])
    assert lines[1:] == ["    [a] done", "    [b] done", "    [c] failed: failed at x: y",
                         "    [d] not started (still serving as before)"]


def test_summary_says_unknown_not_converged_strayed_and_why_it_stopped():
    lines = roll.summary(["a"], {}, ["e"], unknown={"b": "no line"}, halted={"c": "its drain could not be verified"},
                         strayed={"d": "converged (1 changed)"}, stopped="a drain could not be verified: x")
    assert lines[1:] == ["    [a] done", "    [b] unknown: no line; left out of the pool",
                         "    [c] not converged: its drain could not be verified",
                         "    [d] converged outside its batch, not drained: converged (1 changed)",
                         "    [e] not started (still serving as before)",
                         "    the roll stopped: a drain could not be verified: x"]
    assert roll.summary(["a"], {}, [], planned=True)[1] == "    [a] planned (--dry: nothing changed)"


@pytest.mark.parametrize("args", [["--limit", "lab1"], ["--limit=lab1"], ["--lim", "lab1"], ["--lim=lab1"],
                                  ["--l=lab1"], ["--limi", "x"], ["-y", "--exclude", "lab1"], ["--exclude=gateway"],
                                  ["--ex=lab1"], ["--data", "x=1", "--limit=gateway"]])
def test_every_spelling_of_a_host_pick_is_found(args):
    assert roll.host_options(args) == [a for a in args if a.startswith(("--l", "--e"))]


def test_other_arguments_are_not_host_picks():
    assert roll.host_options(["-y", "--data", "limit=3", "--dry", "--debug", "--", "--data=a=--limit", "-l"]) == []


@pytest.mark.parametrize("name", ["lab2", "rig-07", "a", "gateway", "h.example.org", "x_1", "!odd", "we*rd", "b[r]acket",
                                  "q?", "^caret", "-dash", "@local", "back\\slash", "]close"])
def test_a_limit_pattern_matches_its_host_alone(name):
    pattern = roll.limit_pattern(name)
    others = ["lab", "lab22", "Lab2", "rig-7", "aa", "x_10", "odd", "weird", "b", "qq", "caret", "local", name + "x"]
    assert fnmatch.fnmatch(name, pattern)
    assert not [o for o in others if o != name and fnmatch.fnmatch(o, pattern)]
    assert "[" in pattern and pattern not in (name, "all")
    with pytest.raises(ValueError):
        roll.limit_pattern("!!")


PYINFRA_LIMIT = """
import json, sys
from pyinfra.api import Inventory
from pyinfra_cli.cli import _get_inventory_pattern_matches
names, groups, cases = json.loads(sys.argv[1])
inventory = Inventory((names, {}), **{g: (hosts, {}) for g, hosts in groups.items()})
print(json.dumps([sorted(h.name for h in _get_inventory_pattern_matches(inventory, p, "--limit")) for p in cases]))
"""


def test_limit_reads_like_pyinfra_and_a_host_named_like_a_group_is_picked_alone():
    """pyinfra 3.10's own resolution (pyinfra_cli.cli, in a process of its own: its import patches
    the standard library with gevent) of ``--limit lab2`` when a group is named lab2: the group,
    three hosts; plays.roll.limited says the same, and limit_pattern picks lab2 alone."""
    import json
    import subprocess
    import sys

    names = ["lab1", "lab2", "lab3", "lab4", "lab5"]
    groups = {"lab2": ["lab2", "lab3", "lab4"], "gateway": ["lab5"], "lab": names}
    cases = [["lab2"], ["lab1"], ["lab*"], ["gateway", "lab1"], [roll.limit_pattern("lab2")],
             [roll.limit_pattern("lab5"), roll.limit_pattern("lab1")], ["nothing"]]
    run = subprocess.run([sys.executable, "-c", PYINFRA_LIMIT, json.dumps([names, groups, cases])],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    pyinfras = json.loads(run.stdout.strip().splitlines()[-1])
    assert [sorted(roll.limited(p, groups, names)) for p in cases] == pyinfras
    assert pyinfras[0] == ["lab2", "lab3", "lab4"] and pyinfras[4] == ["lab2"]


INVENTORY = '''
def _rig(n):
    return (f"rig{n}", {"ssh_hostname": f"10.0.0.{n}", "llama_server_instances": {"gemma": {"model": "gemma", "port": 8081}}})

rigs = [_rig(1), _rig(2), _rig(3)]
rig2 = [_rig(2), _rig(3)]   # a group named like a host: pyinfra's --limit rig2 would pick both
gateway = [("gw", {"balancer_gateway": True})]
'''
# roll.py's main() with pyinfra replaced by a fake that resolves --limit as pyinfra 3.10 does (its own
# function, on the inventory as pyinfra reads it) and answers as SCENARIO says; in a process of its
# own (pyinfra_cli's import patches the standard library with gevent)
DRIVER = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import roll
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.cli import _get_inventory_pattern_matches
from pyinfra_cli.inventory import make_inventory

scenario, log, argv = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
ctx_state.set(State())
inventory = make_inventory(argv[0])
calls = []

def fake(*args, **kw):
    calls.append(list(args))
    patterns = [args[i + 1] for i, a in enumerate(args) if a == "--limit"]
    hosts = sorted(h.name for h in _get_inventory_pattern_matches(inventory, patterns, "--limit"))
    if scenario.get("journal shared at") in hosts and "exec" not in args:   # another user may write it now
        import os; os.chmod(os.environ["RIGUP_CACHE_DIR"], 0o777)
    if "exec" in args:
        said = ""
        for step in args[-1].split(" && "):
            action, backend, server = step.split()[1:4]
            if scenario.get("fail") == [action, server]:   # as the helper says it, on stderr (red)
                return 1, said + (f"    [{hosts[0]}] >>> sh -c '{step}'\\n    [{hosts[0]}] \\x1b[31mrigup-balancer-drain: {action} "
                                  f"{backend} {server}: cannot reach HAProxy's admin socket /run/haproxy/admin.sock: No such "
                                  "file\\x1b[0m\\n")
            if not scenario.get("old helper"):
                for done in (["drain"] if action == "maint" else []) + [action]:
                    said += f"    [{hosts[0]}] rigup-balancer-drain: {backend}/{server} is {done} (read back from HAProxy)\\n"
        return 0, said
    lines = [f"    [{h}] converged (2 changed)" for h in hosts + scenario.get("strays", []) if h not in scenario.get("silent", [])]
    return 0, "--> rigup: what happened to each host\\n" + "\\n".join(lines) + "\\n"

roll.pyinfra = fake
code = roll.main(argv)
json.dump({"code": code, "calls": calls}, open(log, "w"))
'''


# DRIVER's imports run once per module (about 0.7 s of CPU each), each roll forked from that
# process (tests/unit/forker.py): a process of its own still, nothing of a roll before it
DRIVER_IMPORTS = ("import roll\nfrom pyinfra.api import State\nfrom pyinfra.context import ctx_state\n"
                  "from pyinfra_cli.cli import _get_inventory_pattern_matches\nfrom pyinfra_cli.inventory import make_inventory\n")


@pytest.fixture(scope="module", autouse=True)
def forker_ends():
    yield
    close_all()


def roll_with(tmp_path, scenario: dict, *args: str, inventory: str = INVENTORY) -> tuple[dict, str]:
    import json

    from tests.converge import ROOT

    (tmp_path / "fleet.py").write_text(inventory)
    log = tmp_path / "log.json"
    run = forked(DRIVER_IMPORTS, DRIVER, ["-c", str(ROOT), json.dumps(scenario), str(log), str(tmp_path / "fleet.py"),
                                         "-y", *args],
                 env={**os.environ, "RIGUP_CACHE_DIR": str(tmp_path / "cache")})   # its own journal
    assert log.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(log.read_text())
    return result, run.stdout + run.stderr


def deploys(result: dict) -> list[list[str]]:
    return [c for c in result["calls"] if "deploy.py" in c]


def test_a_roll_picks_each_host_by_its_exact_name(tmp_path):
    result, out = roll_with(tmp_path, {})
    assert result["code"] == 0, out
    assert [[c[i + 1] for i, a in enumerate(c) if a == "--limit"] for c in deploys(result)] == [["[r]ig1"], ["[r]ig2"], ["[r]ig3"]]
    steps = [c[-1] for c in result["calls"] if "exec" in c]
    assert steps[:2] == ["/opt/rigup/bin/rigup-balancer-drain maint gateway-gemma rig1 120",
                         "/opt/rigup/bin/rigup-balancer-drain ready gateway-gemma rig1"]
    assert all(c[c.index("--limit") + 1] == "[g]w" for c in result["calls"] if "exec" in c)
    assert "    [rig1] done\n    [rig2] done\n    [rig3] done\n" in out and "the roll stopped" not in out


def test_a_host_pyinfra_says_nothing_of_stops_the_roll(tmp_path):
    result, out = roll_with(tmp_path, {"silent": ["rig2"]})
    assert result["code"] == 1 and len(deploys(result)) == 2
    assert "[rig1] done" in out and "[rig3] not started (still serving as before)" in out
    assert ("[rig2] unknown: pyinfra's output has no result line for it (pyinfra exited 0); left out of the pool" in out)
    assert "the roll stopped: pyinfra said nothing of rig2: their state is unknown" in out
    assert not any("ready gateway-gemma rig2" in c[-1] for c in result["calls"] if "exec" in c)


def test_a_drain_not_verified_stops_the_roll_before_its_converge(tmp_path):
    result, out = roll_with(tmp_path, {"fail": ["maint", "rig2"]})
    assert result["code"] == 1 and len(deploys(result)) == 1   # rig1 only
    assert "[rig2] not converged: its drain could not be verified; back ready at the gateways" in out
    assert ("the roll stopped: a drain could not be verified: maint at gateway gw failed: maint gateway-gemma rig2: "
            "cannot reach HAProxy's admin socket /run/haproxy/admin.sock: No such file\n") in out
    assert "[rig3] not started" in out


def test_a_drain_helper_that_confirms_nothing_stops_the_roll(tmp_path):
    """An older helper on the gateway (exit 0 without reading anything back): the roll stops at once."""
    result, out = roll_with(tmp_path, {"old helper": True})
    assert result["code"] == 1 and deploys(result) == []
    assert ("the roll stopped: a drain could not be verified: maint at gateway gw: its drain helper read back no maint "
            "of gateway-gemma/rig1 (an older helper? converge the gateways first)") in out
    assert "[rig1] not converged: its drain could not be verified; and back ready failed: ready at gateway gw: its drain " \
           "helper read back no ready of gateway-gemma/rig1" in out


def test_a_converge_that_reached_other_hosts_stops_the_roll(tmp_path):
    result, out = roll_with(tmp_path, {"strays": ["rig3"]})
    assert result["code"] == 1 and len(deploys(result)) == 1
    assert "[rig3] converged outside its batch, not drained: converged (2 changed)" in out
    assert "the roll stopped: pyinfra's summary speaks of hosts outside batch 1: rig3" in out


@pytest.mark.parametrize("pick", [("--limit=rig1",), ("--lim", "rig1")])   # every spelling: test_every_spelling...
def test_a_roll_refuses_to_be_told_which_hosts(tmp_path, pick):
    result, out = roll_with(tmp_path, {}, *pick)
    assert result == {"code": 2, "calls": []}
    assert "roll.py picks the hosts itself: no --limit or --exclude (got " in out


def test_a_roll_with_play_tune_py_sweeps_one_host_at_a_time_each_drained_first(tmp_path):
    result, out = roll_with(tmp_path, {}, "--play", "tune.py")
    plays = [c for c in result["calls"] if "tune.py" in c]
    assert result["code"] == 0, out
    assert deploys(result) == [] and [[c[i + 1] for i, a in enumerate(c) if a == "--limit"] for c in plays] == [
        ["[r]ig1"], ["[r]ig2"], ["[r]ig3"]]
    steps = [c[-1] for c in result["calls"] if "exec" in c]
    order = [("maint" if "maint" in s else "ready", s.split()[3]) for s in steps]
    assert order == [("maint", "rig1"), ("ready", "rig1"), ("maint", "rig2"), ("ready", "rig2"),
                     ("maint", "rig3"), ("ready", "rig3")]
    assert "--play" not in " ".join(" ".join(c) for c in plays)


def test_a_shared_journal_directory_refuses_the_roll_before_any_drain(tmp_path):
    """Round 3 of issue 61, J7: $RIGUP_CACHE_DIR a directory others can write ended roll.py with a
    NotOwned traceback at its first step; now one line naming it and the fix, exit 2, nothing run."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o1777)
    result, out = roll_with(tmp_path, {})
    assert result["code"] == 2 and result["calls"] == [] and "Traceback" not in out, out
    assert f"roll.py: controller:{tmp_path / 'cache' / 'roll.json'}: {tmp_path / 'cache'} must be a directory" in out
    assert "or set RIGUP_CACHE_DIR to a directory of your own" in out


def test_a_journal_that_cannot_be_written_midway_ends_the_roll_after_its_batch(tmp_path):
    """The directory turns writable by others during rig1's converge: rig1 is put back (never left
    drained by a traceback) and the roll stops there, saying why."""
    result, out = roll_with(tmp_path, {"journal shared at": "rig1"})
    steps = [c[-1] for c in result["calls"] if "exec" in c]
    assert result["code"] == 1 and len(deploys(result)) == 1 and "Traceback" not in out, out
    assert steps == ["/opt/rigup/bin/rigup-balancer-drain maint gateway-gemma rig1 120",
                     "/opt/rigup/bin/rigup-balancer-drain ready gateway-gemma rig1"]
    assert "[rig1] done" in out and "[rig2] not started" in out
    assert "the roll stopped: the roll's journal could not be written during batch 1: controller:" in out


@pytest.mark.parametrize("key, value", [("rigup_drain_lease_s", "2m"), ("rigup_drain_lease_s", "0.5"),
                                        ("rigup_drain_lease_s", "0"), ("rigup_max_fail", "two"),
                                        ("rigup_max_fail", "-1"), ("rigup_batch", "0")])
def test_a_roll_setting_that_is_no_whole_number_ends_the_roll_before_any_drain(tmp_path, key, value):
    """Issue 61, round 6 RL1: ``2m`` was a traceback, ``'2'`` a TypeError at the first batch and
    0.5 a lease of 0 (drained with no lease, its renewals spinning): each is refused, named, before
    a host is drained or converged."""
    result, out = roll_with(tmp_path, {}, "--data", f"{key}={value}")
    print(f"{key}={value}: exit {result['code']}, {len(result['calls'])} call(s): {out.strip()[-200:]}")
    assert result["code"] == 2 and result["calls"] == []
    named = f"{key}: expected" if key == "rigup_batch" else f"rig1: {key}: expected"   # the roll's first host
    assert f"roll.py: {tmp_path / 'fleet.py'}: {named}" in out and "Traceback" not in out


@pytest.mark.parametrize("value, got", [(120, 120), (3, 3), ("120", None), (2.0, None), (True, None), (None, None),
                                        (2, None), (86401, None)])
def test_roll_settings_are_ints_of_the_inventory_in_bounds(value, got):
    try:
        read = roll.setting({"k": value}, "k", 120, 3, 86400)
    except ValueError as e:
        read = None
        assert "k: expected a whole number of 3..86400" in str(e)
    assert read == got


def test_every_rolled_hosts_setting_is_read_and_one_roll_has_one():
    """Re-round 6 NR2: another host's bad or different lease was ignored without a word."""
    assert roll.settings({"a": {}, "b": {"rigup_drain_lease_s": 120}}, ["a", "b"]) == (120, 0)
    assert roll.settings({}, []) == (120, 0)
    for data, said in (({"a": {}, "b": {"rigup_drain_lease_s": "2m"}}, "b: rigup_drain_lease_s: expected"),
                       ({"a": {}, "b": {"rigup_max_fail": 3}}, "rigup_max_fail: the hosts of one roll set it apart (a: 0, b: 3)")):
        with pytest.raises(ValueError) as e:
            roll.settings(data, ["a", "b"])
        print(e.value)
        assert said in str(e.value)


def test_a_peers_port_as_text_ends_the_roll_before_anything_is_drained_naming_it(tmp_path):
    """Round 14 RO2: a peer whose instance port is text ("8081"), in an inventory with a gateway, ended
    roll.py in a traceback (the gateways' backends were read after the up-front checks, and their
    ConfigError was not caught): now a line naming the host and the key, exit 2, nothing drained."""
    bad = INVENTORY.replace('"port": 8081}}})', '"port": 8081 if n != 2 else "8081"}}})')
    result, out = roll_with(tmp_path, {}, inventory=bad)
    print(out[-600:])
    assert result["code"] == 2 and result["calls"] == [] and "Traceback" not in out
    assert "rig2" in out and "llama_server_instances.gemma" in out
