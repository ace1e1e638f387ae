"""Issue 61, round 11 (an independent hostile round against HEAD, 2026-12-07): each case it found not
refused, refused now, named by its id in the round's report."""
import pytest

from tests.unit.hosts import data, host

MODEL = {"repo": "org/model-GGUF", "revision": "0" * 40}


@pytest.mark.parametrize("bad", [{"dest": "/srv/models/a;b"}, {"repo": "../x"}, {"revision": "main;x"}])
def test_p2_a_router_whose_set_names_a_wrong_model_entry_is_refused_not_a_crash(bad):
    """P2: a router (also: [n]) whose model n is itself wrong was kept, and the set's VRAM plan read
    n's entry: KeyError in preflight, which pyinfra turns into the end of the run for every host."""
    from rigup.instances.llama_server import instances
    from rigup.serving import serving_plan
    from roles import in_order

    d = data(models={"m": MODEL, "n": {**MODEL, **bad}},
             llama_server_instances={"x": {"model": "m", "port": 8081, "also": ["n"]}})
    found, problems = instances(d)
    print(bad, "->", problems)
    assert found == {} and ("llama_server_instances.x.also",
                            "names n, whose entry of models is wrong (models.n: see its own problem)") in problems
    plan, _ = host("a100")
    assert serving_plan([r.engine for r in in_order() if r.engine], d, plan)["llama-server"] is None


@pytest.mark.parametrize("args", [["--control-vector", "/tmp/x.gguf"], ["--control-vector-scaled", "/tmp/x.gguf", "0.8"],
                                  ["--control_vector=/tmp/x.gguf"], ["--control-vector-layer-range", "1", "9"]])
def test_c4_a_control_vector_is_held_off_until_allowed(args):
    """C4: llama-server's --control-vector read a file of any host path into every client's answers."""
    from rigup.instances.llama_server import instances

    entry = {"model": "m", "port": 8081, "extra_args": args}
    refused = instances(data(models={"m": MODEL}, llama_server_instances={"x": entry}))[1]
    allowed = instances(data(models={"m": MODEL}, llama_server_instances={"x": entry},
                             llama_server_allow=["control_vectors"]))[1]
    print(args, "->", refused)
    assert [p for p, _ in refused] == ["llama_server_instances.x.extra_args"] and "control_vectors" in refused[0][1]
    assert allowed == []
