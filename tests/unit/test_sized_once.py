"""Sizing once per host (issue 64): preflight's refusals and plan lines read each llama-server
instance's sizing (roles/llama_server/replicas.py ``Sized``: ctx, parallel, models_max, layout, a
router's set plan) from the serving plan the converge installs (rigup.serving ``serving_plan``,
``Served.sized``), so that what preflight prints is what the host runs; without a serving plan
(the no-preflight path) or on a host whose instances have problems (the serving plan leaves the
engine unsized) the checks size the valid instances themselves, with the same refusals and lines."""

from __future__ import annotations

import pytest

from rigup.refusal import Fleet
from rigup.serving import serving_plan
from roles import in_order, preflight
from roles.llama_server import ROLE, replicas
from roles.llama_server.checks import fleet_plan_lines, layouts, plan_lines
from tests.unit.hosts import REV, data, glm_llama, host
from tests.unit.test_serving_snapshot import LLAMA, MODELS

ENGINES = [r.engine for r in in_order() if r.engine]
TWO_AND_A_ROUTER = {"gemma": {"model": "c", "port": 8080},
                    "a": {"model": "a", "port": 8085, "replicas": 2, "gpus_per_replica": 2},
                    "x": {"model": "a", "port": 8090, "also": ["b", "c"]}}   # ctx, parallel, models_max auto
# cases beyond the snapshot's: what the checks refuse, and a host refused for its instances' problems
BIG = {**MODELS, "big": {"repo": "org/big-GGUF", "revision": REV, "size_gib": 400.0}}   # beyond 4 x 80 GB
ROUTER = {"model": "a", "port": 8090, "also": ["b", "big"], "models_max": 1,
          "per_model": {"b": {"load_on_startup": True}}}
REFUSED = {
    "router-set-too-large": lambda: (host("h100")[0], data(models=BIG, llama_server_instances={"x": ROUTER})),
    "router-set-too-large-auto": lambda: (host("h100")[0], data(models=BIG, llama_server_instances={
        "x": {**ROUTER, "models_max": "auto"}})),
    "replicas-beyond-the-cards": lambda: (host("h100")[0], data(**glm_llama(replicas=8, gpus_per_replica=1))),
    "problems-beside-valid-ones": lambda: (host("h100")[0], data(models=BIG, llama_server_instances={
        "bad": {"model": "nowhere", "port": 8080}, "many": {"model": "a", "port": 8082, "replicas": 8}, "x": ROUTER})),
    "tensor-split-beyond-the-cards": lambda: (host("h100")[0], data(**glm_llama(tensor_split="1,1,1,1,1,1"))),
}
CASES = {**{k: (lambda f=f: f()[:2]) for k, f in LLAMA.items()}, **REFUSED}


def preflighted(plan: dict, d: dict) -> dict:
    """``plan`` with its serving plan, as preflight makes it (roles/preflight ``run``)."""
    return {**plan, "serving": serving_plan(ENGINES, d, plan)}


def printed_and_refused(plan: dict, d: dict) -> tuple[list[str], list[str]]:
    """llama_server's plan lines (with the fleet's) and every role's refusals, as preflight runs them."""
    _, facts = host("h100")
    fleet = Fleet("h", {"h": d}, lambda name: None)
    lines = plan_lines(plan, d) + fleet_plan_lines(plan, d, fleet)
    return lines, [r.line("h") for r in preflight.refusals(in_order(), plan, facts, d, fleet)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_checks_read_the_serving_plan_and_say_what_they_said_when_they_sized(case):
    plan, d = CASES[case]()
    assert printed_and_refused(preflighted(plan, d), d) == printed_and_refused(plan, d)


def test_a_host_is_sized_once_for_its_plan_its_refusals_and_its_plan_lines(monkeypatch):
    plan, facts = host("h100")
    d = data(models=MODELS, llama_server_instances=TWO_AND_A_ROUTER)
    calls = {"sizing": 0, "set_plan": 0}

    def counted(name):
        real = getattr(replicas, name)

        def count(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        monkeypatch.setattr(replicas, name, count)
    counted("sizing")
    counted("set_plan")
    plan = preflighted(plan, d)
    lines = ROLE.plan_lines(plan, d) + ROLE.fleet_plan_lines(plan, d, Fleet("h", {"h": d}, lambda name: None))
    found = preflight.refusals([ROLE], plan, facts, d, Fleet("h", {"h": d}, lambda name: None))
    assert calls == {"sizing": 3, "set_plan": 1}   # each instance once, the router's set once
    assert found == [] and "llama:     x: router models_max 3 from VRAM" in " ".join(lines)
    served = plan["serving"]["llama-server"]
    assert all(layouts(plan, d)[name][0] is served[name].inst for name in TWO_AND_A_ROUTER)   # printed: installed


def test_a_host_whose_instances_have_problems_is_refused_for_all_of_them():
    plan, d = REFUSED["problems-beside-valid-ones"]()
    plan = preflighted(plan, d)
    assert plan["serving"]["llama-server"] is None   # nothing sized for the converge: the host is refused
    _, refused = printed_and_refused(plan, d)
    assert [r for r in refused if "llama_server_instances.bad.model" in r]
    assert [r for r in refused if "llama_server_instances.many cannot be laid out" in r]
    assert [r for r in refused if "model big of llama_server_instances.x.also does not fit the VRAM alone" in r]
    assert [r for r in refused if "2 models of llama_server_instances.x load at its start" in r]
