"""Issue 61, round 17 (an independent hostile round against 21d0d93): its three, each refused now.

- H17a: llama-server's HTTP library decodes ``%uXXXX`` in a path, HAProxy's ``url_dec`` refuses it, so
  every frontend rule that reads a decoded path (held-off paths, a router's model management, a queued
  router's event stream) matched nothing for ``/%u0073lots`` or ``/models/%u0073se``. Each frontend now
  answers 400 first for a path url_dec cannot read as the server does. Read back by the real HAProxy.
- S17a, S17b: secret names: query names ``hmac``, ``ticket``, ``otp``; env names with a trailing digit
  or plural (``TOKEN1``, ``X_SECRETS``) and ``AUTHORIZATION``."""

import http.server
import shutil
import threading

import pytest

from rigup.instances.vllm import TUNING, secret_variable
from roles.balancer.config import haproxy_cfg
from tests.unit.hosts import data, host, refusals
from tests.unit.test_held_off import Answer, free_port, through_haproxy
from tests.unit.test_round12_vllm import MODEL
from tests.unit.test_round15 import S, hidden_and_refused

# (method, path, status): an undecodable path is 400 whatever the frontend allows; its decodable twin
# is judged by the rules (403 where held off)
QUEUED = [("GET", "/models/sse", 403), ("GET", "/models/%73se", 403), ("GET", "/models/%u0073se", 400),
          ("GET", "/%u006dodels/sse", 400), ("GET", "/models%u002fsse", 400), ("GET", "/models/%U0073se", 400),
          ("GET", "/%u0073lots", 400), ("POST", "/models%u002fload", 400), ("GET", "/%zz", 400), ("GET", "/a%", 400),
          ("GET", "/slots", 403), ("POST", "/models/load", 403), ("GET", "/v1/models", 200), ("GET", "/health", 200),
          ("POST", "/v1/chat/completions", 200), ("GET", "/v1/models?x=%u0073", 200)]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
def test_h17a_a_path_haproxy_cannot_decode_as_the_server_does_is_refused_before_every_rule():
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    port = free_port()
    b = {"name": "llama-x", "bind": "127.0.0.1", "port": port, "allow": [],
         "servers": [["x", "127.0.0.1", backend.server_address[1]]], "slots": 1, "queue": 4, "wait_s": 5}
    text = haproxy_cfg([b], data(balancer_stats_port=free_port(), balancer_check_interval_ms=100))
    try:
        seen = through_haproxy(text, port, QUEUED)
    finally:
        backend.shutdown()
    print(seen)
    assert seen == QUEUED


# -- S17a: query parameters named hmac, ticket, otp ------------------------------------------------------------

@pytest.mark.parametrize("name", ["hmac", "x-hmac", "Ticket", "otp", "auth_otp", "HMAC_SHA256"])
def test_s17a_a_query_secret_named_hmac_ticket_or_otp_is_hidden_and_refused(name):
    assert hidden_and_refused(f"https://pypi.corp/simple?{name}={S}") == f"https://pypi.corp/simple?{name}=***"


@pytest.mark.parametrize("name", ["hotpath", "tickets_page", "botp", "format", "page"])
def test_s17a_other_query_names_stay_shown(name):
    from rigup.text import redacted
    assert redacted(f"https://pypi.corp/simple?{name}=v1") == f"https://pypi.corp/simple?{name}=v1"


# -- S17b: a secret variable numbered or in the plural, AUTHORIZATION ------------------------------------------

@pytest.mark.parametrize("name", ["DB_PASSWORD2", "TOKEN1", "X_SECRETS", "API_PASSWORDS", "X_APIKEYS", "AUTHORIZATION",
                                  "MY_APITOKEN3", "PGPASSWORDS", "X_ACCESSKEYS", "HTTP_AUTHORIZATION"])
def test_s17b_a_secret_numbered_or_plural_is_refused_as_a_secret_in_env(name):
    assert secret_variable(name)
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(models={"m": MODEL}, vllm_instances={
        "a": {"model": "m", "port": 8000, "env": {name: S}}}))]
    assert any(f"vllm_instances.a: {name} in env" in line for line in lines) and S not in str(lines), lines


@pytest.mark.parametrize("name", ["VLLM_MAX_TOKENS", "VLLM_MAX_TOKENS2", "GPT2_X", "NCCL_P2P_LEVEL", "VLLM_KEYBOARDS",
                                  *sorted(TUNING)])
def test_s17b_counts_and_tuning_names_are_no_secret(name):
    assert not secret_variable(name)
