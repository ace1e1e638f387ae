"""shards.py's pure parts: the arguments, the hosts dealt into shards, rigup's summary lines and
status.py's JSON merged from the shards' outputs. On the lab: tests/bench_fleet.py --shards."""

import json

import pytest

import shards
from rigup import fleet


def test_arguments_jobs_and_limits():
    assert shards.parse(["-j", "4", "inv.py", "deploy.py", "--data", "x=1"]) == (4, "inv.py", "deploy.py", ["--data", "x=1"])
    assert shards.parse(["-j3", "inv.py", "status.py"])[0] == 3
    with pytest.raises(SystemExit, match="-j wants a number"):
        shards.parse(["-j", "0", "inv.py", "deploy.py"])
    with pytest.raises(SystemExit, match="usage"):
        shards.parse(["inv.py"])
    assert shards.limits_of(["--limit", "lab1,lab2", "--limit=gpu", "-v"]) == (["lab1", "lab2", "gpu"], ["-v"])
    with pytest.raises(SystemExit, match="--exclude"):
        shards.limits_of(["--exclude", "lab3"])


def test_hosts_are_dealt_round_robin_none_twice_none_empty():
    names = [f"rig-{i:02}" for i in range(10)]
    dealt = shards.deal(names, 4)
    assert dealt == [names[0::4], names[1::4], names[2::4], names[3::4]]
    assert sorted(n for s in dealt for n in s) == names
    assert shards.deal(names[:2], 8) == [["rig-00"], ["rig-01"]]


def test_the_summary_and_status_rows_of_each_shard():
    out = ("...\n--> rigup: what happened to each host\n    [lab1] unchanged (every role converged (...))\n"
           "    [lab3] failed at base | x: boom\n")
    assert shards.summary_lines(out) == {"lab1": "[lab1] unchanged (every role converged (...))",
                                         "lab3": "[lab3] failed at base | x: boom"}
    assert shards.summary_lines("no summary") == {}
    doc = fleet.render_json([fleet.unreachable_row("lab2", "timed out")], {"lab1": 0.44})
    rows, energy = shards.status_rows(f"--> Loading...\n{doc}\n--> rigup: ...\n")
    assert rows == [{"host": "lab2", "reachable": False, "reason": "timed out"}] and energy == {"lab1": 0.44}
    assert json.loads(fleet.render_json([]))== {"hosts": []}
