"""issue 64, the instance's one shape: both engines' instances as the readers beyond their roles
read them (rigup.instances ``every``: the balancer, plays/bench.py, status.py), and what
status.py says of an entry that is not of its form (plays/fleet.py ``configured``)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from plays import fleet
from rigup.instances import every, left_out
from rigup.instances.llama_server import normalised as llama_normalised
from rigup.instances.vllm import normalised as vllm_normalised


def test_every_is_each_engines_normalised_llama_server_first_each_by_name():
    data = {"llama_server_instances": {"b": {"model": "m", "port": 8082}, "a": {"model": "m", "port": 8081,
                                                                             "replicas": 2, "api_key": True}},
            "vllm_instances": {"v": {"model": "q", "port": 8000, "served_model_name": "Q"}}}
    found = every(data)
    assert [(var, name) for var, name, _ in found] == [("llama_server_instances", "a"), ("llama_server_instances", "b"),
                                                       ("vllm_instances", "v")]
    assert [inst for _, _, inst in found] == [*llama_normalised(data).values(), *vllm_normalised(data).values()]
    a, b, v = (inst for _, _, inst in found)
    assert (a["replicas"], a["api_key"], b["replicas"], b["host"], b["also"]) == (2, True, 1, "127.0.0.1", [])
    assert (v["replicas"], v["tp"], v["served_model_name"]) == (1, 1, "Q")
    assert left_out(data) == []


def test_status_says_an_entry_not_of_its_form_naming_host_and_key_and_leaves_it_out(capsys):
    """status.py reads the inventory's data as it is: an entry preflight would refuse is said on
    stderr (the host, the key path, why) and left out of the host's row; never a traceback."""
    data = {"llama_server_instances": {"ok": {"model": "m", "port": 8081}, "nomodel": {"port": 8082},
                                       "badport": {"model": "m", "port": "80"}, "flat": "gemma"},
            "vllm_instances": {"v": {"model": "q", "port": 8000, "tp": 0}}}
    found = fleet.configured("lab1", data)
    assert [name for _, name, _ in found] == ["ok"]
    said = capsys.readouterr().err
    print(said)
    for where in ("llama_server_instances.nomodel.model", "llama_server_instances.badport.port",
                  "llama_server_instances.flat", "vllm_instances.v.tp"):
        assert f"[lab1] {where}: " in said, where
    assert said.count("left out of status") == 4
    assert fleet.served_models(found) == {"ok": "m"}


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.text(max_size=8), st.floats(allow_nan=True))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)
keys = st.sampled_from(["model", "port", "host", "api_key", "replicas", "also", "per_model", "tp", "extra_args", "x"])
entries = st.one_of(values, st.dictionaries(keys, values, max_size=5))
names = st.one_of(st.text(alphabet="ab_- ", max_size=6), st.integers(5, 7))   # no ".": one name no prefix of another
maps = st.one_of(st.none(), st.dictionaries(names, entries, max_size=4))


@settings(max_examples=300, deadline=None)
@given(llama=maps, vllm=maps)
def test_any_serving_maps_read_into_instances_or_named_problems_never_a_traceback(llama, vllm):
    """Whatever an inventory holds: each entry either an instance of every key (its port a port) or
    named by its key path among the problems; status.py's row and its lines never raise."""
    data = {"llama_server_instances": llama, "vllm_instances": vllm}
    found, problems = every(data), left_out(data)
    for var, raw in data.items():
        for name in raw or {}:
            kept = [inst for v, n, inst in found if (v, n) == (var, name)]
            named = [w for w, _ in problems if w == f"{var}.{name}" or w.startswith(f"{var}.{name}.")]
            assert bool(kept) != bool(named), (var, name, kept, problems)
            for inst in kept:
                assert type(inst["port"]) is int and 1 <= inst["port"] <= 65535 and isinstance(inst["model"], str)
    fleet.served_models(found)
