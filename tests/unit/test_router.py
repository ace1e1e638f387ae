"""Several models behind one port (issue 49): an instance with ``also`` is llama-server's router
(--models-preset, --models-max); its preset, the rules of its entry and the VRAM plan of its set.
The router itself serving two models on a lab host: tests/roles/test_router.py."""

import pytest

from roles.llama_server.checks import check_set_vram
from roles.llama_server.command import argv, preset_text
from roles.llama_server.schema import instances
from tests.unit.hosts import REV, data, host, refusals

MODELS = {"a": {"repo": "org/a-GGUF", "revision": REV, "size_gib": 300.0},
          "b": {"repo": "org/b-GGUF", "revision": REV, "size_gib": 330.0},
          "c": {"repo": "org/c-GGUF", "revision": REV, "size_gib": 330.0},
          "huge": {"repo": "org/huge-GGUF", "revision": REV, "size_gib": 700.0}}


def router(**inst) -> dict:
    return data(models=MODELS, llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 4096, "parallel": 1,
                                                              "also": ["b"], **inst}})


def test_a_set_is_served_by_one_router_from_its_preset():
    found, problems = instances(router(models_max=2))
    assert problems == []
    args = argv("x", found["x"], "/b/llama-server", "/m/a.gguf")
    print(" ".join(args))
    assert args[1:5] == ["--models-preset", "/etc/rigup/llama-server/x.models.ini", "--models-max", "2"]
    assert "-m" not in args and "--alias" not in args and args[args.index("-c") + 1] == "4096"
    text = preset_text("x", found["x"], {"a": "/srv/models/a/a.gguf", "b": "/srv/models/b/b-00001-of-00002.gguf"})
    sections = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
    assert sections == ["version = 1", "[a]", "model = /srv/models/a/a.gguf", "load-on-startup = true",
                        "[b]", "model = /srv/models/b/b-00001-of-00002.gguf"]
    # each model's revision in a comment: a new revision of any model of the set restarts the router
    revised = preset_text("x", found["x"], {"a": "/a.gguf", "b": "/b.gguf"}, {"a": REV, "b": "x\n[evil]"})
    assert f"; revision {REV}" in revised.splitlines() and "; revision unreadable" in revised.splitlines()
    assert revised != preset_text("x", found["x"], {"a": "/a.gguf", "b": "/b.gguf"}, {"a": "1" * 40, "b": "x"})
    for hostile in ("/srv/x\n[evil]\nmodel = /etc/shadow", "/srv/a]b.gguf", "relative.gguf", "/srv/a;b.gguf"):
        with pytest.raises(ValueError, match="x: the model file of b has a path the preset cannot hold"):
            preset_text("x", found["x"], {"a": "/srv/a.gguf", "b": hostile})


@pytest.mark.parametrize("inst, problem", [
    ({"also": ["zz"]}, ("llama_server_instances.x.also", "zz")),
    ({"also": ["a"]}, ("llama_server_instances.x.also", "names a model twice")),
    ({"also": ["b", "b"]}, ("llama_server_instances.x.also", "names a model twice")),
    ({"models_max": 3}, ("llama_server_instances.x.models_max", "3 for a set of 2 models")),
    ({"also": [], "models_max": 2}, ("llama_server_instances.x.models_max", "router mode only")),
    ({"replicas": 2}, ("llama_server_instances.x.also", "no replicas, no rpc_workers")),
    ({"also": ["b; rm -rf /"]}, ("llama_server_instances.x.also", "")),
])
def test_a_set_that_cannot_be_is_refused_by_key_path(inst, problem):
    _, problems = instances(router(**inst))
    print(problems)
    assert any(p[0] == problem[0] and problem[1] in p[1] for p in problems), problems


def test_a_set_is_planned_against_the_vram_its_largest_models_need_together():
    plan, facts = host("a100")          # 8 x 80 GB
    ok = refusals(plan, facts, router(also=["b", "c"], models_max=1))
    assert [r for r in ok if r.check == "vram"] == []   # one loaded at a time: each fits alone
    together = check_set_vram(plan, facts, router(also=["b", "c"], models_max=2))
    print(together[0].line("h"))
    assert len(together) == 1 and together[0].what.startswith("the 2 largest models of llama_server_instances.x")
    assert together[0].why.startswith("b 338.0 GiB + c 338.0 GiB") and \
        together[0].why.endswith("= 676.0 GiB > 640.0 GiB of VRAM (8 x 80.0 GiB)")
    alone = check_set_vram(plan, facts, router(also=["huge"]))
    assert alone[0].what == "model huge of llama_server_instances.x.also does not fit the VRAM alone"
    assert check_set_vram(plan, facts, router(also=["b", "c"], models_max=2, ngl=0)) == []   # layers on the CPU
