"""The gateway's reader of a request's JSON (roles/balancer, a router's frontend: HAProxy's json_query
of the body's top-level "model", issue 61 round 8): a request's model is read from the top-level key
only; a body whose ``metadata.model`` (nested) differs from or shadows the top-level model answers 400,
and so does a body that is not a JSON object, each with a short reason. The rendered gateway under
the real HAProxy, two routers (127.0.0.1, 127.0.0.2) answering their names; the bodies' shapes as a
Hypothesis property over the regexes (HAProxy's PCRE and Python's re read them alike)."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings, strategies as st

from roles.balancer.config import MODEL_KEY, MODEL_TWICE, OBJECT, gateway_backends, haproxy_cfg
from tests.unit.hosts import data
from tests.unit.test_held_off import free_port, runnable


def answering(name: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(name)))
            self.end_headers()
            self.wfile.write(name.encode())
        do_GET = do_POST = _any

        def log_message(self, *args):
            pass
    return Handler


# (body, (status, what the answer's text holds)): lab1 serves a, lab2 serves b
CASES = [
    ('{"model": "b", "messages": []}', (200, "lab2")),
    ('{"model": "a", "metadata": {"user": "x"}}', (200, "lab1")),
    # metadata.model differs from, or shadows, the top-level model (before it or after it; escaped)
    ('{"model": "a", "metadata": {"model": "b"}}', (400, "model")),
    ('{"metadata": {"model": "b"}, "model": "a"}', (400, "model")),
    ('{"model": "a", "metadata": {"mod\\u0065l": "b"}}', (400, "model")),
    ('{"metadata": {"model": "b"}}', (400, "model")),
    ('{"model": null, "metadata": {"model": "b"}}', (400, "model")),
    ('{"model": "a", "metadata": {"model": "a"}}', (400, "model")),   # the same name twice: one is asked for
    ('{"metadata": {"model": "b"}, "model": 5}', (400, "model")),     # json_query reads 5, a reader the nested b
    ('{"model": "a", "model": 5}', (400, "model")),                    # json_query reads a, the router 5
    # not a JSON object
    ('[{"model": "b"}]', (400, "not a JSON object")),
    ('[1, 2]', (400, "not a JSON object")),
    ('"model"', (400, "not a JSON object")),
    ('42', (400, "not a JSON object")),
    ('null', (400, "not a JSON object")),
    ('{"model": "a"', (400, "not a JSON object")),
    ('{"model": "a"} {"model": "b"}', (400, "model")),
    ('\ufeff{"model": "b"}', (400, "")),
    # a tool's schema naming a "model" property, and a message quoting one, are no model
    ('{"model": "a", "tools": [{"parameters": {"model": {"type": "string"}}}]}', (200, "lab1")),
    ('{"model": "b", "messages": [{"content": "\\"model\\": \\"a\\""}]}', (200, "lab2")),
]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
def test_the_gateway_reads_the_top_level_model_only_and_refuses_other_shapes_with_a_reason():
    port, gateway_port = free_port(), free_port()
    servers = [http.server.ThreadingHTTPServer((f"127.0.0.{i}", port), answering(f"lab{i}")) for i in (1, 2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    duo = {"model": "a", "also": ["b"], "port": port}
    hosts = {"gw": {"balancer_gateway": True}, **{f"lab{i}": {"ssh_hostname": f"127.0.0.{i}",
                                                              "llama_server_instances": {"duo": duo}} for i in (1, 2)}}
    backends = [dict(b, port=gateway_port) for b in gateway_backends("gw", hosts, "127.0.0.1")]
    text = runnable(haproxy_cfg(backends, data(balancer_stats_port=free_port(), balancer_check_interval_ms=100)))

    def post(raw: str) -> tuple[int, str]:
        deadline = time.monotonic() + 10
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                                                 data=raw.encode(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode(errors="replace")
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(text)
        f.flush()
        proc = subprocess.Popen(["haproxy", "-db", "-f", f.name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            seen = [(raw, post(raw)) for raw, _ in CASES]
            get = urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/v1/models", timeout=5).status
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            for s in servers:
                s.shutdown()
    for (raw, (code, answer)), (_, (want, holds)) in zip(seen, CASES):
        print(f"{raw[:60]!r:64} {code} {answer.strip()[:90]!r}  (wanted {want}, {holds!r})")
    assert [(raw, code) for raw, (code, _) in seen] == [(raw, want) for raw, (want, _) in CASES]
    assert all(holds in answer for (_, (_, answer)), (_, (_, holds)) in zip(seen, CASES))
    assert get == 200                                                    # a GET has no body to read


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["model", "metadata", "messages", "x"]), inner, max_size=3), max_leaves=8))
def test_a_body_is_refused_unless_an_object_naming_model_at_most_once(doc):
    """Over any JSON document: the gateway's rules (OBJECT, MODEL_TWICE, and a model named in text where
    the top level names none) let through exactly the objects whose "model" keys, at any depth, hold a
    value a reader takes for a name (text, a number, true or false) at most once, and a text one only at
    the top level (where json_query and the router read it)."""
    raw = json.dumps(doc)
    texts, scalars = [], []

    def walk(node, depth):
        if isinstance(node, dict):
            texts.extend(depth for k, v in node.items() if k == "model" and isinstance(v, str))
            scalars.extend(depth for k, v in node.items() if k == "model" and isinstance(v, (str, int)))
            for v in node.values():
                walk(v, depth + 1)
        elif isinstance(node, list):
            for v in node:
                walk(v, depth + 1)
    walk(doc, 0)
    top = isinstance(doc, dict) and isinstance(doc.get("model"), (str, int, float, bool))   # what json_query reads
    refused = bool(not re.search(OBJECT, raw) or re.search(MODEL_TWICE, raw)
                   or (not top and re.search(MODEL_KEY, raw)))
    passes = isinstance(doc, dict) and len(scalars) <= 1 and texts in ([], [0])
    assert refused is not passes, (raw, texts, scalars)
