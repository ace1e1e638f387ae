"""rigup/roll.py: which hosts roll, their batches, what a batch's converge said of each host."""

import pytest

from rigup import roll
from rigup.config import declared


def test_serving_hosts_in_inventory_order_without_gateways():
    hosts = {"rig-2": {"llama_server_instances": {"a": {}}}, "gw": {"balancer_gateway": True, "llama_server_instances": {"a": {}}},
             "mon": {"llama_server_instances": {}}, "rig-1": {"vllm_instances": {"v": {}}},
             "rig-3": {"llama_server_instances": {"a": {}}, "rigup_maintenance": True}}
    assert roll.serving_hosts(hosts) == ["rig-2", "rig-1"]


@pytest.mark.parametrize("batch, sizes", [(1, [1, 1, 1, 1, 1]), (2, [2, 2, 1]), (9, [5]), ("25%", [1, 1, 1, 1, 1]),
                                          ("40%", [2, 2, 1]), ("100%", [5]), ("1%", [1, 1, 1, 1, 1])])
def test_batches(batch, sizes):
    assert [len(b) for b in roll.batches(list("abcde"), batch)] == sizes


@pytest.mark.parametrize("bad", [0, -1, True, "0%", "101%", "25", "a%", 2.5])
def test_batch_refused(bad):
    assert declared()["rigup_batch"].form.problem(bad)
    with pytest.raises(ValueError, match="rigup_batch"):
        roll.batches(["a"], bad)


def test_batch_form_takes_counts_and_shares():
    form = declared()["rigup_batch"].form
    assert form.problem(1) is None and form.problem(12) is None and form.problem("25%") is None
    assert declared()["rigup_max_fail"].form.problem(-1)


def test_outcomes_from_the_summary_lines():
    out = ("--> rigup: what happened to each host\n    [lab1] converged (3 changed)\n"
           "\x1b[31m    [lab2] failed at llama-server gemma answers: rigup-llama@gemma.service: /health did not answer\x1b[0m\n"
           "    [lab9] unreachable: timed out\n")
    assert roll.outcomes(out, ["lab1", "lab2"], 1) == {
        "lab1": None, "lab2": "failed at llama-server gemma answers: rigup-llama@gemma.service: /health did not answer"}
    assert roll.outcomes("nothing said", ["lab3"], 1) == {"lab3": "pyinfra exited 1"}
    assert roll.outcomes("    [lab3] unchanged", ["lab3"], 0) == {"lab3": None}


def test_summary_says_done_failed_not_started():
    lines = roll.summary(["a", "b"], {"c": "failed at x: y"}, ["d"])
    assert lines[1:] == ["    [a] done", "    [b] done", "    [c] failed: failed at x: y",
                         "    [d] not started (still serving as before)"]
