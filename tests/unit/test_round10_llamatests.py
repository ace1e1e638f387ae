"""Round 10, B4: bench_llama_tests takes ppN and tgN alone (the ``llamatest`` form), refused before
the run naming the key; plays.bench's fact command never raises on one that got past (a
ValueError inside host.get_fact ended bench.py for every host)."""

import pytest

from plays import bench
from rigup.config import declared, problems

RUN = {"name": "g", "dest": "/srv/models/g", "model": "/srv/models/g/g.gguf", "ngl": 99}
BINARY = "/opt/rigup/llama.cpp/current/bin/llama-bench"
BAD = [["pp512", "x"], ["pp"], ["tg-1"], ["pp0"], ["pp 512"], ["pp512;id"], ["tg1234567"], [512], ["PP512"], ["pp٥١٢"]]


@pytest.mark.parametrize("value", BAD)
def test_form_refuses(value):
    why = declared()["bench_llama_tests"].form.problem(value)
    print(f"bench_llama_tests={value!r}: refused: {why}")
    assert why and why.startswith("item ")


def test_problems_name_the_key():
    found = problems({"bench_llama_tests": ["pp512", "x"]})
    print("problems:", found)
    assert found and found[0][0] == "bench_llama_tests" and found[0][1].startswith("bench_llama_tests: expected list of llamatest")


def test_form_takes_tests():
    for value in (["pp512", "pp4096", "tg128"], [], ["tg1"], ["pp999999"]):
        why = declared()["bench_llama_tests"].form.problem(value)
        print(f"bench_llama_tests={value!r}: {why}")
        assert why is None


@pytest.mark.parametrize("value", BAD)
def test_command_never_raises(value):
    command = bench.LlamaBench().command(runs=[RUN], binary=BINARY, tests=["tg128", *value], reps=2, timeout=120)
    print(f"tests tg128+{value!r}: command built, {command.count('##llama-bench ')} marked test(s)")
    assert "##llama-bench g tg128" in command and command.count("'##llama-bench ") == 1 + value.count("pp512")
