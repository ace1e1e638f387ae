"""Several models behind one port (issue 49): an instance with ``also`` is llama-server's router
(--models-preset, --models-max); its preset, the rules of its entry and the VRAM plan of its set.
The router itself serving two models on a lab host: tests/roles/test_router.py."""

import pytest
from hypothesis import given, settings, strategies as st

from roles.llama_server.checks import check_set_vram
from roles.llama_server.command import argv, preset_text
from rigup.instances.llama_server import instances
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
    ({"sleep_idle_s": 60, "metrics": False}, ("llama_server_instances.x.sleep_idle_s", "needs metrics: true")),
    ({"per_model": {"zz": {"ctx": 1}}}, ("llama_server_instances.x.per_model.zz", "the set (model and also)")),
    ({"per_model": {"b": {"ctx": "auto"}}}, ("llama_server_instances.x.per_model.b.ctx", "expected int 1..")),
    ({"per_model": {"b": {"metrics": False}}}, ("llama_server_instances.x.per_model.b.metrics", "unknown key")),
    ({"per_model": {"b": {"cache_type_k": "q3"}}}, ("llama_server_instances.x.per_model.b.cache_type_k", "expected")),
    ({"per_model": {"b": "ctx=1"}}, ("llama_server_instances.x.per_model.b", "expected a map")),
    ({"also": [], "per_model": {"a": {"ctx": 1}}}, ("llama_server_instances.x.per_model", "router mode only")),
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


def test_a_routers_queue_puts_haproxy_on_its_port_with_a_bound():
    """``queue``: the router on 127.0.0.1:port+1 behind HAProxy (roles/balancer) on the instance's
    port, parallel x models_max at the router, ``queue`` more waiting at most the health
    timeout, beyond them 429 with Retry-After; both ports claimed at preflight."""
    from roles.balancer.config import haproxy_cfg, problems
    from roles.llama_server.checks import ports
    from roles.llama_server.command import queue_limits, queued, servers
    from roles.llama_server.replicas import chosen
    found, _ = instances(router(queue=20, parallel=2, host="0.0.0.0", api_key=True))
    plan, _ = host("a100")
    keys, lay, _ = chosen(found["x"], MODELS["a"], plan, data(), MODELS)   # models_max auto: a and b not together
    inst = {**found["x"], **keys}
    srv = servers("x", inst, lay)
    assert queued(inst) and [(s["unit"], s["inst"]["host"], s["inst"]["port"]) for s in srv] == [("x", "127.0.0.1", 8082)]
    assert queue_limits(inst, 600) == {"slots": 2, "queue": 20, "wait_s": 600}   # parallel 2 x models_max 1
    claimed = [(p.port, p.where, p.owners) for p in ports(plan, router(queue=20))]
    assert claimed == [(8081, "llama_server_instances.x (its queue)", ("haproxy", "llama-server")),
                       (8082, "llama_server_instances.x (its router)", ("llama-server",))]
    backend = {"name": "llama-x", "bind": "0.0.0.0", "port": 8081, "servers": [["x", "127.0.0.1", 8082]],
               **queue_limits(inst, 600)}
    assert problems([backend]) == [] and problems([{**backend, "queue": "20; evil"}]) != []
    text = haproxy_cfg([backend], data())
    print(text[text.index("frontend llama-x"):])
    for line in ('http-request return status 429 content-type text/plain string "queue full" hdr Retry-After 5 '
                 "if { queue(llama-x) ge 20 }", "http-after-response set-header Retry-After 5 if { status 503 }",
                 "timeout queue 600s", "server x 127.0.0.1:8082 check maxconn 2\n",
                 "http-request deny deny_status 403 if { path,url_dec -m sub /models/sse }", "    option abortonclose\n"):
        assert line in text, line
    plain = haproxy_cfg([{k: v for k, v in backend.items() if k not in ("slots", "queue", "wait_s")}], data())
    assert "429" not in plain and "maxconn" not in plain and "timeout queue 600s" not in plain and "/models/sse" not in plain and "abortonclose" not in plain
    _, problems_ = instances(router(also=[], queue=5))
    assert ("llama_server_instances.x.queue", "router mode only: give also, the other models of the set") in problems_


def test_a_gateway_sends_each_model_of_a_router_to_the_hosts_it_stays_loaded_on():
    """A fleet of routers behind a gateway: one backend per model of the set, its home hosts first
    (each model its own hosts where there are as many hosts as models), the others backups (a
    drained or failed home host: the model is still served, with a swap); the frontend reads the
    request's model; roll.py drains a host in every backend that holds it."""
    from roles.balancer.checks import ports
    from roles.balancer.config import gateway_backends, haproxy_cfg, homes
    from rigup.refusal import Fleet
    assert homes({"a": ["h2", "h1"], "b": ["h1", "h2"]}) == {"a": {"h1"}, "b": {"h2"}}
    assert homes({"a": ["h1", "h2", "h3"], "b": ["h1", "h2", "h3"]}) == {"a": {"h1", "h3"}, "b": {"h2"}}
    assert homes({"a": ["h1"], "b": ["h1"], "c": ["h1"]}) == {"a": {"h1"}, "b": {"h1"}, "c": {"h1"}}
    duo = {"model": "a", "also": ["b"], "port": 8091}
    hosts = {"gw": {"balancer_gateway": True}, **{f"lab{i}": {"ssh_hostname": f"10.0.0.1{i}",
                                                              "llama_server_instances": {"duo": duo}} for i in (1, 2)}}
    gateway = gateway_backends("gw", hosts, "0.0.0.0")
    assert [(b["name"], [s[0] for s in b["servers"] if not s[4]] if b.get("route") else None) for b in gateway] == [
        ("gateway-duo", None), ("gateway-duo.a", ["lab1"]), ("gateway-duo.b", ["lab2"])]
    text = haproxy_cfg(gateway, data())
    for line in ("option http-buffer-request", "use_backend gateway-duo.b if { var(txn.model) -m str b }",
                 "http-request set-var(txn.model) req.body,json_query('$.model') if { method POST }",
                 "server lab1 10.0.0.11:8091 check backup\n"):
        assert line in text, line
    assert text.count("frontend gateway-duo") == 1
    fleet = Fleet("gw", hosts)
    assert [p.port for p in ports({}, data(balancer_gateway=True), fleet) if p.port == 8091] == [8091]


def test_each_model_of_a_set_may_have_its_own_flags():
    """per_model: a flag a model sets for itself leaves the command line (llama-server puts its
    command line before a preset) for the preset: the instance's value in [*], the model's own in
    its section; a flag no model sets stays on the command line."""
    found, problems = instances(router(models_max=2, cache_type_k="f16", jinja=True,
                                       per_model={"b": {"ctx": 16384, "cache_type_k": "q8_0", "jinja": False}}))
    assert problems == []
    args = argv("x", found["x"], "/b/llama-server", "/m/a.gguf")
    text = preset_text("x", found["x"], {"a": "/srv/a.gguf", "b": "/srv/b.gguf"})
    print(" ".join(args))
    print(text)
    assert "-c" not in args and "-ctk" not in args and "--jinja" not in args and "--no-jinja" not in args
    assert args[args.index("--parallel") + 1] == "1"
    sections = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
    assert sections == ["version = 1", "[*]", "ctx-size = 4096", "jinja = true", "cache-type-k = f16",
                        "[a]", "model = /srv/a.gguf", "load-on-startup = true",
                        "[b]", "model = /srv/b.gguf", "ctx-size = 16384", "jinja = false", "cache-type-k = q8_0"]


def test_the_vram_plan_counts_each_model_at_its_own_ctx():
    plan, facts = host("a100")          # 8 x 80 GB
    sized = {**MODELS, "b": {**MODELS["b"], "family": "glm-5.3-flash"}}   # KV cache 0.03 GiB per 1k tokens

    def with_b(**inst):
        return data(models=sized, llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 4096, "parallel": 1,
                                                                "also": ["b"], **inst}})
    assert check_set_vram(plan, facts, with_b()) == []       # b at the instance's 4096 tokens: 330 + 0.1 + 8 GiB
    alone = check_set_vram(plan, facts, with_b(per_model={"b": {"ctx": 11_000_000}}))
    print(alone[0].line("h"))
    assert alone[0].what == "model b of llama_server_instances.x.also does not fit the VRAM alone"
    assert "KV cache 330.0 GiB" in alone[0].why and alone[0].fix.endswith("lower llama_server_instances.x.per_model.b.ctx")


# ---------------------------------------------------------------- the gateway routes by the model the router reads
# (issue 61, round 6 FM15): json_query reads a key's first value, llama-server's JSON (nlohmann) its last
SPELLINGS = ["model", "mod\\u0065l", "\\u006Dodel", "\\u006d\\u006f\\u0064\\u0065\\u006c"]


def body(pairs) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SPELLINGS + ["messages", "stream", "modelx", "x"]),
                          st.sampled_from(['"a"', '"b"', '"\\u0062"', '{"model": {"type": "string"}}', "true", "5", "null",
                                           '[{"content": "\\"model\\": \\"b\\""}]'])), max_size=5))
def test_a_body_naming_model_twice_is_refused_and_one_naming_it_once_is_not(pairs):
    """The gateway's regex (config.MODEL_TWICE, HAProxy's PCRE) over a body: it matches exactly when
    two keys that JSON reads as "model" hold text, a number or true/false (what json_query or the
    router reads for a name), in either order, at any depth (round 8: metadata.model); a tool schema's
    "model" property, a message quoting "model" and one model key pass."""
    import json
    import re

    from roles.balancer.config import MODEL_TWICE
    text = body(pairs)
    # two models a reader takes for a name (text, a number, true or false: re4 N30), in either order
    models = [v[0] for k, v in pairs if json.loads(f'"{k}"') == "model"]
    twice = sum(first in '"tf-0123456789' for first in models) >= 2
    print(text, twice)
    assert bool(re.search(MODEL_TWICE, text)) is twice


@pytest.mark.skipif(not __import__("shutil").which("haproxy"), reason="haproxy is not installed here")
def test_the_gateway_refuses_a_model_given_twice_and_routes_none_it_did_not_read_whole():
    """The rendered gateway under the real HAProxy, two routers (127.0.0.1 and 127.0.0.2, one port)
    answering their names: b goes to b's home; a body naming model twice (escaped or not, within the
    buffer) is 400; one whose second model lies past the buffer is not routed by its first."""
    import http.server
    import subprocess
    import tempfile
    import threading
    import time
    import urllib.error
    import urllib.request

    from roles.balancer.config import gateway_backends, haproxy_cfg
    from tests.unit.test_gateway_body import answering
    from tests.unit.test_held_off import free_port, runnable

    port, gateway_port = free_port(), free_port()
    servers = [http.server.ThreadingHTTPServer((f"127.0.0.{i}", port), answering(f"lab{i}")) for i in (1, 2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    duo = {"model": "a", "also": ["b"], "port": port}
    hosts = {"gw": {"balancer_gateway": True}, **{f"lab{i}": {"ssh_hostname": f"127.0.0.{i}",
                                                              "llama_server_instances": {"duo": duo}} for i in (1, 2)}}
    backends = [dict(b, port=gateway_port) for b in gateway_backends("gw", hosts, "127.0.0.1")]
    text = runnable(haproxy_cfg(backends, data(balancer_stats_port=free_port(), balancer_check_interval_ms=100)))

    def post(raw: str):
        deadline = time.monotonic() + 10
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                                                 data=raw.encode(), method="POST")
                with urllib.request.urlopen(request, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, ""
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    pad = '"p": "' + "x" * 40000 + '"'
    cases = [('{"model": "b"}', (200, "lab2")), ('{"model": "a"}', (200, "lab1")),
             ('{"model": "a", "model": "b"}', (400, "")), ('{"model": "a", "mod\\u0065l": "b"}', (400, "")),
             ('{"model": "a", "tools": {"model": {"type": "string"}}}', (200, "lab1")),
             ('{"model": "a", "p": "' + "x" * 8000 + '", "model": "b"}', (400, "")),
             # re4 N30, N31: a first "model" json_query reads no text from, or none at all (a byte order mark)
             ('{"model": null, "model": "b"}', (400, "")), ('{"model": ["a"], "model": "b"}', (400, "")),
             ('{"model": {"x": 1}, "model": "b"}', (400, "")), ('{"model": 5, "model": "b"}', (400, "")),
             ('{"model": true, "model": "b"}', (400, "")), ('\ufeff{"model": "b"}', (400, "")),
             ('{"tools": {"model": {"t": 1}}, "model": "b"}', (200, "lab2"))]
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(text)
        f.flush()
        proc = subprocess.Popen(["haproxy", "-db", "-f", f.name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            seen = [(raw[:60], post(raw)) for raw, _ in cases]
            # past the buffer: never routed by its first model (a's home alone would be lab1 every time)
            far = {post('{"model": "a", ' + pad + ', "model": "b"}') for _ in range(8)}
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            for s in servers:
                s.shutdown()
    print(seen, far)
    assert seen == [(raw[:60], expected) for raw, expected in cases]
    assert far == {(200, "lab1"), (200, "lab2")}
