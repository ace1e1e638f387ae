"""A router's set planned by VRAM (issue 63): a model pinned beside the router (``per_model: {M:
{pinned: true}}``) becomes a server of its own (its own unit and port, the router's cards and key,
answering as M), and ``models_max: auto`` (the default) is written as how many of the router's
models fit at once beside the pinned ones, the largest first; a set whose largest cannot load
beside them, pinned models that do not fit together, and more models loaded at start than fit are
refused at preflight with the figures."""

import pytest
from hypothesis import given, settings, strategies as st

from rigup.gpu.facts import parse_gpus
from rigup.gpu.plan import hardware_plan
from roles.llama_server.checks import check_set_vram, plan_lines, ports
from roles.llama_server.command import argv, dropin_text, fronted, preset_text, servers
from roles.llama_server.replicas import chosen
from rigup.instances.llama_server import instances
from tests.unit.hosts import FIX, REV, data, host, only, refusals

# sizes so that each model's need (weights + no KV cache, its family unknown, + 1 GiB on one card) is
# round: qwen 20.1, a 24.3, c 19.0, b 18.0 GiB
MODELS = {"qwen": {"repo": "org/qwen-GGUF", "revision": REV, "size_gib": 19.1},
          "a": {"repo": "org/a-GGUF", "revision": REV, "size_gib": 23.3},
          "b": {"repo": "org/b-GGUF", "revision": REV, "size_gib": 17.0},
          "c": {"repo": "org/c-GGUF", "revision": REV, "size_gib": 18.0}}
PINNED = {"qwen": {"pinned": True}}


def one_card() -> tuple[dict, dict]:
    """(plan, facts) of a host with one A100 80 GB (the a100 fixture's first card)."""
    plan, facts = host("a100")
    gpus = parse_gpus((FIX / "a100-query-nounits.csv").read_text().splitlines())[:1]
    return hardware_plan(gpus, facts["driver"], []), {**facts, "gpus": gpus}


def router(models=None, **inst) -> dict:
    entry = {"model": "a", "also": ["qwen", "b", "c"], "port": 8081, "ctx": 4096, "parallel": 1,
             "per_model": PINNED, **inst}
    return data(models=models or MODELS, llama_server_instances={"x": entry})


def laid(d: dict, plan: dict) -> tuple[dict, object]:
    """The instance as the role serves it (ctx, parallel and models_max chosen) and its layout."""
    found, problems = instances(d)
    assert problems == []
    keys, lay, _ = chosen(found["x"], MODELS["a"], plan, d, {**MODELS, **d["models"]})
    return {**found["x"], **keys}, lay


def test_a_pinned_model_is_a_server_of_its_own_beside_the_router():
    plan, _ = one_card()
    inst, lay = laid(router(api_key=True, host="0.0.0.0"), plan)
    srv = servers("x", inst, lay)
    assert [(s["unit"], s["inst"]["host"], s["inst"]["port"], s.get("pinned")) for s in srv] == [
        ("x", "0.0.0.0", 8081, None), ("x.qwen", "0.0.0.0", 8083, "qwen")]
    assert srv[0]["env"] == srv[1]["env"]                       # the router's cards
    assert not fronted(inst, srv)                               # no HAProxy for it: its own port
    router_, pin = srv[0]["inst"], srv[1]["inst"]
    assert router_["also"] == ["b", "c"] and router_["per_model"] == {}   # out of the router's set and eviction
    text = preset_text("x", router_, {m: f"/srv/{m}.gguf" for m in ("a", "b", "c")})
    assert "[qwen]" not in text and "pinned" not in text and text.count("load-on-startup") == 1
    args = argv("x", pin, "/b/llama-server", "/srv/qwen.gguf")
    print(" ".join(args))
    assert args[1:9] == ["-m", "/srv/qwen.gguf", "--alias", "qwen", "--host", "0.0.0.0", "--port", "8083"]
    assert "--models-preset" not in args and "--models-max" not in args
    assert args[args.index("--api-key-file") + 1] == "/etc/rigup/llama-server/x.key"   # the router's key
    assert args[args.index("-c") + 1] == "4096"                 # the instance's flags
    drop = dropin_text("x", pin, "/b/llama-server", "/srv/qwen.gguf", "builds/1", "abc", REV, srv[1]["env"])
    assert "--alias qwen" in drop and "--port 8083" in drop
    claimed = [(p.port, p.where) for p in ports(plan, router())]
    assert claimed == [(8081, "llama_server_instances.x"), (8083, "llama_server_instances.x (pinned qwen)")]
    # its own flags: the model's per_model, without the keys that are no flag
    inst, lay = laid(router(per_model={"qwen": {"pinned": True, "ctx": 8192, "cache_type_k": "q8_0"}}), plan)
    pin = servers("x", inst, lay)[1]["inst"]
    args = argv("x", pin, "/b/llama-server", "/srv/qwen.gguf")
    assert args[args.index("-c") + 1] == "8192" and args[args.index("-ctk") + 1] == "q8_0"
    # a queued router: HAProxy fronts the router alone; the pinned model keeps port + 2
    inst, lay = laid(router(queue=4), plan)
    srv = servers("x", inst, lay)
    assert fronted(inst, srv) and [(s["unit"], s["inst"]["port"]) for s in srv] == [("x", 8082), ("x.qwen", 8083)]


def test_without_pinned_models_the_servers_are_as_before():
    """A router without pinned models (models_max set): its one server runs the instance itself,
    so its drop-in and preset are those of before (tests/unit/test_router.py holds their text)."""
    plan, _ = host("a100")
    d = data(models=MODELS, llama_server_instances={"x": {"model": "a", "also": ["b", "c"], "models_max": 2,
                                                          "port": 8081, "ctx": 4096, "parallel": 1}})
    inst, lay = laid(d, plan)
    assert servers("x", inst, lay) == [{"unit": "x", "inst": inst, "env": {}}]


def test_models_max_is_what_fits_beside_the_pinned_ones_the_largest_first():
    plan, facts = one_card()
    inst, _ = laid(router(), plan)
    assert inst["models_max"] == 2            # 80.0 - qwen 20.1 = 59.9: a 24.3 + c 19.0 fit, + b 18.0 does not
    assert argv("x", servers("x", inst, _)[0]["inst"], "/b/llama-server", "/m")[3:5] == ["--models-max", "2"]
    lines = plan_lines(plan, router())
    print("\n".join(lines))
    assert lines[1:] == [
        "llama:     x: router models_max 2 from VRAM (80.0 GiB on 1 card, pinned qwen 20.1 GiB, 59.9 GiB left; "
        "largest 2: a 24.3 + c 19.0 GiB; with b 18.0 GiB 61.3 GiB > 59.9)",
        "llama:     x: pinned qwen on its own server rigup-llama@x.qwen at 127.0.0.1:8083 (the router's cards, "
        "20.1 GiB), never evicted"]
    assert [r for r in refusals(plan, facts, router()) if r.check == "vram"] == []
    # nothing pinned (and no qwen): all three fit
    free = laid(router(per_model={}, also=["b", "c"]), plan)[0]
    assert free["models_max"] == 3            # 24.3 + 19.0 + 18.0 = 61.3 <= 80.0
    assert "(80.0 GiB on 1 card; all 3: a 24.3 + c 19.0 + b 18.0 GiB)" in plan_lines(plan, router(per_model={},
                                                                                              also=["b", "c"]))[1]
    # set by the operator: written as it is, and no line
    inst, _ = laid(router(models_max=1), plan)
    assert inst["models_max"] == 1 and not any("models_max" in ln for ln in plan_lines(plan, router(models_max=1)))


def test_models_max_is_1_where_the_vram_cannot_tell():
    plan, _ = one_card()
    unsized = {**MODELS, "b": {"repo": "org/b-GGUF", "revision": REV}}
    inst, _ = laid(router(models=unsized), plan)
    assert inst["models_max"] == 1
    assert "router models_max 1 (the VRAM need of b is not known (its size, or ngl): rigup counts the set's " \
           "models from the VRAM only)" in plan_lines(plan, router(models=unsized))[1]
    cpu = hardware_plan([], {"loaded": False}, [])
    assert laid(router(), cpu)[0]["models_max"] == 1


def test_a_set_whose_largest_cannot_load_beside_the_pinned_is_refused_with_the_figures():
    plan, facts = one_card()
    big = {**MODELS, "qwen": {**MODELS["qwen"], "size_gib": 60.0}}   # 61.0 GiB pinned: 19.0 GiB left
    found = only(refusals(plan, facts, router(models=big)), "vram")
    for r in found:
        print(r.line("h"))
    assert [r.what for r in found] == ["model a of llama_server_instances.x does not fit beside its pinned qwen"]
    assert found[0].why == ("weights 23.3 GiB + KV cache 0.0 GiB + 1.0 GiB overhead = 24.3 GiB > 80.0 GiB of VRAM "
                            "(1 x 80.0 GiB) - pinned qwen 61.0 GiB = 19.0 GiB")
    assert found[0].fix.startswith("unpin qwen (llama_server_instances.x.per_model), drop a from the set")
    # the plan line says so too
    assert "its largest, a 24.3 GiB, does not fit: refused" in plan_lines(plan, router(models=big))[1]
    alone = {**MODELS, "qwen": {**MODELS["qwen"], "size_gib": 90.0}}
    found = only(refusals(plan, facts, router(models=alone)), "vram")
    assert [(r.what, r.why) for r in found] == [(
        "pinned model qwen of llama_server_instances.x does not fit the VRAM",
        "weights 90.0 GiB + KV cache 0.0 GiB + 1.0 GiB overhead = 91.0 GiB > 80.0 GiB of VRAM (1 x 80.0 GiB)")]
    # pinned models that do not fit together
    big["b"] = {**MODELS["b"], "size_gib": 30.0}
    two = router(models=big, per_model={"qwen": {"pinned": True}, "b": {"pinned": True}})
    found = only(refusals(plan, facts, two), "vram")
    assert [(r.what, r.why) for r in found] == [(
        "the pinned models of llama_server_instances.x do not fit the VRAM together",
        "qwen 61.0 GiB + b 31.0 GiB = 92.0 GiB > 80.0 GiB of VRAM (1 x 80.0 GiB)")]
    # models_max set: its largest together beside the pinned
    found = only(refusals(plan, facts, router(models_max=3)), "vram")
    assert [(r.what, r.why) for r in found] == [(
        "the 3 largest models of llama_server_instances.x do not fit the VRAM together (models_max 3)",
        "a 24.3 GiB + c 19.0 GiB + b 18.0 GiB (weights, KV cache, 1 GiB per GPU for each child's CUDA context) = "
        "61.3 GiB > 80.0 GiB of VRAM (1 x 80.0 GiB) - pinned qwen 20.1 GiB = 59.9 GiB")]


def test_more_models_loaded_at_start_than_fit_is_refused_naming_them():
    plan, facts = one_card()
    startup = {**PINNED, "b": {"load_on_startup": True}, "c": {"load_on_startup": True}}
    found = only(refusals(plan, facts, router(per_model=startup)), "vram")
    print(found[0].line("h"))
    assert [(r.what, r.why) for r in found] == [(
        "3 models of llama_server_instances.x load at its start (a, b, c), more than it holds at once",
        "models_max 2 from VRAM (80.0 GiB on 1 card, pinned qwen 20.1 GiB, 59.9 GiB left; largest 2: a 24.3 + c "
        "19.0 GiB; with b 18.0 GiB 61.3 GiB > 59.9): the router would evict one of them as the next loads")]
    assert found[0].fix.startswith("drop load_on_startup from llama_server_instances.x.per_model of b or c")
    # two of them fit: written in the preset, the instance's own first
    ok = {**PINNED, "c": {"load_on_startup": True}}
    assert [r for r in refusals(plan, facts, router(per_model=ok)) if r.check == "vram"] == []
    inst, lay = laid(router(per_model=ok), plan)
    text = preset_text("x", servers("x", inst, lay)[0]["inst"], {m: f"/srv/{m}.gguf" for m in ("a", "b", "c")})
    sections = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
    assert sections == ["version = 1", "[a]", "model = /srv/a.gguf", "load-on-startup = true",
                        "[b]", "model = /srv/b.gguf", "[c]", "model = /srv/c.gguf", "load-on-startup = true"]
    # set by the operator: the same rule
    found = only(refusals(plan, facts, router(per_model=ok, models_max=1)), "vram")
    assert found[0].why.startswith("models_max 1 is set: ")


@pytest.mark.parametrize("inst, problem", [
    ({"per_model": {"a": {"pinned": True}}}, ("llama_server_instances.x.per_model.a.pinned", "the instance's own")),
    ({"also": ["qwen"]}, ("llama_server_instances.x.per_model", "pins every model of also (qwen)")),
    ({"models_max": 4}, ("llama_server_instances.x.models_max", "4 for a set of 3 models (its pinned qwen aside)")),
    ({"per_model": {"qwen": {"pinned": "yes"}}}, ("llama_server_instances.x.per_model.qwen.pinned", "expected bool")),
    ({"per_model": {"b": {"load_on_startup": 1}}}, ("llama_server_instances.x.per_model.b.load_on_startup",
                                                    "expected bool")),
    ({"also": [], "per_model": {}, "models_max": 2}, ("llama_server_instances.x.models_max", "router mode only")),
    ({"ctx": "auto"}, ("llama_server_instances.x.ctx", "auto with pinned models")),
])
def test_a_pin_that_cannot_be_is_refused_by_key_path(inst, problem):
    _, problems = instances(router(**inst))
    print(problems)
    assert any(p[0] == problem[0] and problem[1] in p[1] for p in problems), problems


def test_a_pinned_models_unit_may_not_be_another_instances():
    plan, facts = one_card()
    d = router()
    d["llama_server_instances"]["x.qwen"] = {"model": "b", "port": 9000, "ctx": 4096, "parallel": 1}
    found = [r for r in refusals(plan, facts, d) if r.check == "replicas"]
    assert [r.what for r in found] == ["llama_server_instances.x and llama_server_instances.x.qwen would both be "
                                       "rigup-llama@x.qwen"]
    found = [r for r in refusals(plan, facts, router(port=65534)) if r.check == "ports"]
    assert [(r.what, r.why) for r in found] == [("llama_server_instances.x.per_model: pinned qwen from port 65534",
                                                 "a pinned model listens on port + 2 + i: 65536, past 65535")]


CLASH_MODELS = {k: {"repo": f"org/{k.replace('.', '')}-GGUF", "revision": REV, "size_gib": 1.0}
                for k in ("m0", "m1", "b.c", "c", "b-0", "z")}


@pytest.mark.parametrize("insts, unit", [
    # rerun1 N02, rerun2 N1, rerun3 NX1: two routers' pinned models, both a.b.c
    ({"a": {"model": "m0", "also": ["b.c", "z"], "per_model": {"b.c": {"pinned": True}}, "port": 8081},
      "a.b": {"model": "m1", "also": ["c", "z"], "per_model": {"c": {"pinned": True}}, "port": 9081}}, "a.b.c"),
    # rerun1 N04, rerun3 NX2: a pinned model and another instance's replica, both a.b-0
    ({"a": {"model": "m0", "also": ["b-0", "z"], "per_model": {"b-0": {"pinned": True}}, "port": 8081},
      "a.b": {"model": "m1", "replicas": 2, "port": 9081}}, "a.b-0"),
    # rerun1 N03: a replica and an instance, both x-1
    ({"x": {"model": "m0", "replicas": 2, "port": 8081}, "x-1": {"model": "m1", "port": 9081}}, "x-1"),
])
def test_two_instances_whose_servers_share_a_unit_are_refused(insts, unit):
    plan, facts = host("a100")
    gpus = parse_gpus((FIX / "a100-query-nounits.csv").read_text().splitlines())
    plan, facts = hardware_plan(gpus, facts["driver"], []), {**facts, "gpus": gpus}
    d = data(models=CLASH_MODELS, llama_server_instances={n: {"ctx": 4096, "parallel": 1, **i} for n, i in insts.items()})
    found = [r for r in refusals(plan, facts, d) if r.check == "replicas"]
    first, second = sorted(insts)
    assert [r.what for r in found] == [f"llama_server_instances.{first} and llama_server_instances.{second} would "
                                       f"both be rigup-llama@{unit}"]


def test_a_gateway_sends_a_pinned_model_to_its_own_server():
    from roles.balancer.config import gateway_backends
    duo = {"model": "a", "also": ["qwen", "b"], "port": 8091, "per_model": PINNED}
    hosts = {"gw": {"balancer_gateway": True},
             **{f"lab{i}": {"ssh_hostname": f"10.0.0.1{i}", "llama_server_instances": {"duo": duo}} for i in (1, 2)}}
    routes = {b["name"]: [(s[0], s[2], *s[4:]) for s in b["servers"]] for b in gateway_backends("gw", hosts, "0.0.0.0")}
    assert routes == {"gateway-duo": [("lab1", 8091), ("lab2", 8091)],
                      "gateway-duo.a": [("lab1", 8091, False), ("lab2", 8091, True)],
                      "gateway-duo.qwen": [("lab1", 8093, False), ("lab2", 8093, False)],   # loaded on both: no backup
                      "gateway-duo.b": [("lab1", 8091, True), ("lab2", 8091, False)]}


def test_a_new_builds_smoke_runs_the_router_with_the_models_max_chosen():
    from rigup.serving import serving_plan
    from roles.llama_server import LLAMA
    from roles.llama_server.smoke import smoke_runs
    plan, _ = one_card()
    (run,) = smoke_runs({**plan, "serving": serving_plan([LLAMA], router(), plan)}, router())   # as preflight plans it
    assert run["name"] == "x" and run["args"][:2] == ["--models-max", "2"]


_ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)


@settings(max_examples=60, deadline=1000)
@given(entry=st.dictionaries(st.sampled_from(["model", "also", "port", "per_model", "host"]), _ANY, max_size=5),
       pins=st.lists(st.text(max_size=6), max_size=3), port=st.one_of(st.integers(1, 65535), _ANY))
def test_the_gateway_reads_any_entry_for_its_pinned_models_without_a_traceback(entry, pins, port):
    """The contract's ``pinned`` reads a host's entry as the gateway finds it (not validated: another
    host's data): whatever it holds, a map of model keys of also to ports, never a traceback."""
    from rigup.contract.llama_server import pinned
    entry = {**entry, "port": port, "also": pins + [m for m in entry.get("also") or [] if isinstance(m, str)]
             if isinstance(entry.get("also"), list) else entry.get("also"),
             "per_model": {**({m: {"pinned": True} for m in pins}),
                           **(entry["per_model"] if isinstance(entry.get("per_model"), dict) else {})}}
    found = pinned(entry)
    assert all(m in entry["also"] and isinstance(p, int) for m, p in found.items())
    if type(port) is int and isinstance(entry["also"], list) and len(set(map(str, entry["also"]))) == len(entry["also"]):
        assert list(found.values()) == list(range(port + 2, port + 2 + len(found)))


def test_on_a_cpu_build_the_set_is_planned_on_the_hosts_cards_as_check_vram_counts_them():
    """llama_cpp_backend cpu on a host with cards (the lab): every layer asked on the GPUs (ngl 99)
    is planned against the host's VRAM, as check_vram and check_set_vram always did (the lab's
    refusal test relies on it); ngl 0: nothing to plan, models_max 1."""
    plan, facts = one_card()
    cpu = dict(llama_cpp_backend="cpu")
    assert laid({**router(), **cpu}, plan)[0]["models_max"] == 2
    assert laid({**router(ngl=0), **cpu}, plan)[0]["models_max"] == 1
    big = {**MODELS, "qwen": {**MODELS["qwen"], "size_gib": 60.0}}
    assert [r.what for r in refusals(plan, facts, {**router(models=big), **cpu}) if r.check == "vram"] == [
        "model a of llama_server_instances.x does not fit beside its pinned qwen"]
