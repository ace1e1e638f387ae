"""Configuration a role wrote into a file at apply, checked at preflight as the role's own keys are
(issue 61, round 4): a router's per_model tensor_split (C34: its preset writer raised ValueError
inside the converge, ending the run for every host) and a host-wide vllm_env key (C31: ConfigError
at apply). Each is refused at preflight naming the key; nothing runs."""

from rigup.instances.llama_server import instances
from tests.unit.hosts import REV, answered, data, host, refusals

MODELS = {k: {"repo": f"org/{k}-GGUF", "revision": REV, "size_gib": 4.0} for k in "mnp"}


def test_C34_a_routers_per_model_tensor_split_is_held_to_the_instances_rule():
    plan, facts = host("a100")
    for split, why in (("1,1 #x", "expected numbers separated by commas"), ("1,1,1,1,1,1,1,1,1", "9 shares for 8")):
        d = data(models=MODELS, llama_server_instances={"x": {"model": "m", "port": 8081, "also": ["n", "p"],
                                                              "ctx": 4096, "per_model": {"n": {"tensor_split": split}}}})
        lines = [r.line("h") for r in refusals(plan, facts, answered(d, {}))]
        print(split, "->", lines)
        assert any("llama_server_instances.x.per_model.n.tensor_split" in ln and why in ln for ln in lines), lines
    ok = data(models=MODELS, llama_server_instances={"x": {"model": "m", "port": 8081, "also": ["n"], "ctx": 4096,
                                                           "per_model": {"n": {"tensor_split": "1, 1"}}}})
    assert instances(ok, 8)[1] == []


def test_C31_a_vllm_env_key_that_is_no_name_is_refused_at_preflight():
    plan, facts = host("a100")
    d = data(models={"m": MODELS["m"]}, vllm_instances={"v": {"model": "m", "port": 8000}}, vllm_env={"A B": "x"})
    lines = [r.line("h") for r in refusals(plan, facts, answered(d, {}))]
    print(lines)
    assert any("vllm_env.A B: expected NAME" in ln for ln in lines), lines
    alone = data(vllm_env={"A B": "x"})   # no vLLM instance on the host: vllm_env is written nowhere
    assert not any("vllm_env" in r.line("h") for r in refusals(plan, facts, answered(alone, {})))
