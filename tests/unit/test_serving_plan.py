"""rigup.serving ``serving_plan``: every serving instance of a host normalised, tuned and sized,
with its servers (unit, port, environment), made once by preflight and kept on the plan
(``serving``) for the serving walk and the readers (issue 64)."""

from __future__ import annotations

from rigup.serving import Served, serving_plan
from roles import in_order
from roles.llama_server import LLAMA
from roles.vllm import VLLM
from tests.unit.hosts import REV, data, glm_llama, host

GEMMA = {"repo": "rigup-lab/gemma-3-270m-GGUF", "revision": REV, "size_gib": 0.25}
ENGINES = [LLAMA, VLLM]


def test_an_instance_left_auto_is_sized_and_served_by_one_unit_on_its_port():
    plan, _ = host("h100")
    found = serving_plan(ENGINES, data(models={"gemma": GEMMA},
                                       llama_server_instances={"gemma": {"model": "gemma", "port": 8080}}), plan)
    gemma = found["llama-server"]["gemma"]
    assert isinstance(gemma, Served) and found["vllm"] == {}
    assert isinstance(gemma.inst["ctx"], int) and isinstance(gemma.inst["parallel"], int)   # no auto left
    assert [(s["unit"], s["inst"]["port"], s["env"]) for s in gemma.servers] == [("gemma", 8080, {})]
    assert gemma.servers[0]["inst"]["ctx"] == gemma.inst["ctx"]


def test_replicas_are_servers_of_their_own_on_loopback_pinned_to_their_cards():
    plan, _ = host("h100")
    d = data(models={"gemma": GEMMA}, llama_server_instances={"gemma": {
        "model": "gemma", "port": 8090, "replicas": 2, "gpus_per_replica": 1, "ctx": 8192, "parallel": 2}})
    servers = serving_plan(ENGINES, d, plan)["llama-server"]["gemma"].servers
    assert [(s["unit"], s["inst"]["host"], s["inst"]["port"]) for s in servers] == \
        [("gemma-0", "127.0.0.1", 8091), ("gemma-1", "127.0.0.1", 8092)]
    assert all(set(s["env"]) == {"CUDA_VISIBLE_DEVICES"} for s in servers)


def test_tuned_flags_are_laid_over_the_instance_once():
    plan, _ = host("a100")
    d = data(**glm_llama(), llama_server_tuned={"glm": {"flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on"}}})
    glm = serving_plan(ENGINES, d, plan)["llama-server"]["glm"]
    assert (glm.inst["ctx"], glm.inst["parallel"], glm.inst["flash_attn"]) == (16384, 4, "on")


def test_a_vllm_instance_and_an_engine_with_problems():
    plan, _ = host("h100")
    d = data(models={"glm": {"repo": "org/glm-4.5-air", "revision": REV, "size_gib": 60.0}},
             vllm_instances={"glm": {"model": "glm", "port": 8000, "tp": 2, "replicas": "auto"}},
             llama_server_instances={"bad": {"model": "nowhere", "port": 8080}})
    found = serving_plan(ENGINES, d, plan)
    assert found["llama-server"] is None   # preflight refuses the host: the walk touches nothing
    assert [(s["unit"], s["inst"]["port"]) for s in found["vllm"]["glm"].servers] == [("glm-0", 8001), ("glm-1", 8002)]


def test_the_serving_roles_declare_their_engines_to_preflight():
    assert [r.engine for r in in_order() if r.engine] == [LLAMA, VLLM]
