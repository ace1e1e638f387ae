"""shards.py's pure parts: the arguments, the hosts dealt into shards, rigup's summary lines and
status.py's JSON merged from the shards' outputs. On the lab: tests/bench_fleet.py --shards."""

import json

import pytest
from hypothesis import given, settings, strategies as st

import shards
from plays import fleet


def test_arguments_jobs_and_limits():
    assert shards.parse(["-j", "4", "inv.py", "deploy.py", "--data", "x=1"]) == (4, "inv.py", "deploy.py", ["--data", "x=1"])
    assert shards.parse(["-j3", "inv.py", "status.py"])[0] == 3
    for bad in ("0", "²", "٣", "-1", "1_0", "04", "99999"):   # round 5 C17: '-j ²' ended in int()'s ValueError
        with pytest.raises(SystemExit, match="-j wants a number") as e:
            shards.parse(["-j", bad, "inv.py", "deploy.py"])
        print(f"-j {bad}: {e.value}".splitlines()[0])
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


def _row(name: str) -> dict:
    return fleet.host_row(name, {}, downloads=[], maintenance=False, models={})


def test_the_last_status_document_counts_and_a_row_fleet_cannot_show_is_refused():
    """Round 1 of issue 61, H01-H03: host text before status.py's JSON (a fake ``{\\n "hosts"``)
    won; a row without ``cards`` ended fleet.render_table with KeyError; JSON that did not read
    ended shards.py for every shard."""
    real = fleet.render_json([_row("a"), fleet.unreachable_row("b", "timed out")], {"a": 0.5})
    fake = '{\n "hosts": [{"host": "a", "reachable": true, "fake": 1}]\n}\n'
    rows, energy = shards.status_rows(fake + real + "\n", ["a", "b"])
    assert [r["host"] for r in rows] == ["a", "b"] and "fake" not in rows[0] and energy == {"a": 0.5}
    rows, _ = shards.status_rows('{\n "hosts": [{"host": "a", "reachable": true}, {"host": "zz"}, 7]\n}\n', ["a"])
    assert rows == [fleet.unreachable_row("a", shards.NO_ROW)]
    fleet.render_table(rows)
    for bad in ('x {\n "hosts": [oops\n}\n', '{\n "hosts": ' + "[" * 100000 + '\n}\n', "nothing", '{\n "hosts": {}\n}\n'):
        rows, energy = shards.status_rows(bad, ["a"])
        assert [r["host"] for r in rows] == ["a"] and not rows[0]["reachable"] and energy == {}
    doc = ('{\n "hosts": ' + json.dumps([_row("a"), _row("a")]) + ', "joules_per_token": '
           + json.dumps({"a": "1", "b": -1, "c": True, "d": 0.25}) + "\n}\n")
    rows, energy = shards.status_rows(doc, ["a"])
    assert len(rows) == 1 and rows[0]["reachable"] and energy == {"d": 0.25}


def test_the_summary_marker_counts_only_at_a_lines_start_and_its_last_time():
    """Round 1 of issue 61, H04: a host's echo of the marker took the summary's place and cut the
    shard's printed output at it."""
    out = ("    [b] echo: --> rigup: what happened to each host\n    [c] Loaded fact x\n"
           "--> rigup: what happened to each host\n    [b] unchanged\n    [zz] changed\n")
    assert shards.summary_lines(out, ["b", "c"]) == {"b": "[b] unchanged"}
    assert "[c] Loaded fact x" in shards.split_summary(out)[0]
    assert shards.summary_lines("    [b] echo: --> rigup: what happened to each host\n    [c] x\n") == {}


@settings(max_examples=100, deadline=2000)
@given(st.lists(st.sampled_from(['{\n "hosts"', ": [", "]", "\n}\n", '{"host": "a"}', '"reachable": true', ", ", "{", "}",
                                 "--> rigup: what happened to each host\n", "    [a] ok\n", "x"]), max_size=20))
def test_any_shard_output_gives_each_host_one_row(parts):
    rows, energy = shards.status_rows("".join(parts), ["a", "b"])
    assert sorted(r["host"] for r in rows) == ["a", "b"]
    fleet.render_table(rows)
    assert set(shards.summary_lines("".join(parts), ["a"])) <= {"a"}
