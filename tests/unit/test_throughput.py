"""shipped/throughput.py's reading of what a server answers (issue 61): a completion's
usage.completion_tokens and /metrics' llamacpp:tokens_predicted_total through rigup.boundary.numbers's
rule, carried in the file (it ships alone to hosts: the watchdog's rigup_throughput.py, bench.py's copy)
and held here to numbers.number; each red-team case against a real loopback server."""

from __future__ import annotations

import http.client
import http.server
import json
import math
import re
import threading

import pytest
from hypothesis import given, settings, strategies as st

from shipped import throughput
from rigup.boundary.numbers import number

from tests.unit.world import remade

_remade = remade(throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)

# numbers as text and as JSON values, hostile ones among them
NUMERIC = st.sampled_from(list("0123456789+-.eE_ \t\n\r\x0b\x0c\x85\xa0\u2003\u2028\u0661\u00b2"))
VALUES = st.one_of(st.text(NUMERIC, max_size=22), st.text(max_size=8), st.integers(-10**20, 10**20), st.floats(),
                   st.booleans(), st.none(), st.from_regex(r"-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,13})?", fullmatch=True),
                   st.sampled_from([10**30, 1e400, "NaN", "Infinity", "1e3", "0079", "1_000", " 12 ", "-0", "+5",
                                    "350\x85", "\u2003350", "350\u2028", "350\xa0", "\u0663\u0665\u0660", "nan",
                                    "1e999", True, False, "3_5", "0350", "\t350\n"]))


@settings(max_examples=60, deadline=1000)
@given(value=VALUES, lo=st.sampled_from([0, -5, 1]), hi=st.sampled_from([128, 1e7, math.inf]))
def test_figure_is_numbers_number(value, lo, hi):
    """The copy's rule is the boundary's: the same answer (or None) for every value and bounds; the copy
    keeps an int an int (a count, an exit code), the same number as a float (Hypothesis: '10000000000000001'
    is that int there, 1e16 as number's float)."""
    got, want = throughput.figure(value, lo, hi), number(value, float, lo, hi)
    assert (got is None) == (want is None) and (got is None or float(got) == want), (got, want)


class Answers(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def log_message(self, *a):
        pass

    def _answer(self):
        if self.command == "POST":
            self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(Answers.body)))
        self.end_headers()
        self.wfile.write(Answers.body)

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize("tokens", ["\u0661\u0662\u0668", 10**30, True, -500, 12.0, "8", None, 129])
def test_a_completions_token_count_that_is_no_json_int_within_max_tokens_is_refused(url, tokens):
    """issue 61 (red team items 7-10): no timings, so the rate is the token count over the wall time:
    Arabic-Indic digits (int() reads them), 10**30, true (1), -500 became the watchdog's tok/s."""
    Answers.body = json.dumps({"usage": {"completion_tokens": tokens}}).encode()
    with pytest.raises(ValueError) as e:
        throughput.completion(url, max_tokens=128, timeout=5)
    print(f"completion_tokens {tokens!r}: refused: {e.value}")
    assert str(e.value).startswith("usage.completion_tokens is not a whole number in 0..128 (max_tokens): ")


@pytest.mark.parametrize("body", [b"[]", b'{"usage": []}', b'{"usage": null}', b'"x"'])
def test_a_completion_that_is_no_object_is_a_value_error(url, body):
    Answers.body = body
    with pytest.raises(ValueError, match="^usage.completion_tokens "):
        throughput.completion(url, max_tokens=8, timeout=5)


def answer(tokens, content="word " * 128, **more) -> bytes:
    """A completion's answer as llama-server writes it (``content`` its text), ``more`` its other keys."""
    return json.dumps({"choices": [{"index": 0, "finish_reason": "length",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"completion_tokens": tokens}, **more}).encode()


def test_a_plain_completion_is_read(url):
    Answers.body = answer(128, timings={"predicted_per_second": 41.5})
    assert throughput.completion(url, max_tokens=128, timeout=5)["tps"] == 41.5
    Answers.body = answer(0, timings={"predicted_per_second": "41.5"})
    assert throughput.completion(url, max_tokens=128, timeout=5)["tps"] == 0.0   # text is no JSON number


# ---------------------------------------------------------------- issue 61, rerun 3 NT1, rerun 2 N2, N32
@pytest.mark.parametrize("choices", [[], [{"message": {"content": ""}}], [{"message": {"content": None}}], [{"message": "word word"}], "word " * 32, None])
def test_a_completion_of_no_text_counts_no_token_whatever_its_usage_claims(url, choices):
    """NT1/N2: a server that answered at once with no text (choices [], content '' or blanks) and
    usage.completion_tokens 32 read 32 tokens over ~1 ms: ~30,000 tok/s, past any watchdog floor;
    with timings.predicted_per_second 9999999, the same (the claim is within 2x that clock)."""
    for timings in ({}, {"timings": {"predicted_per_second": 9999999}}):
        Answers.body = json.dumps({"choices": choices, "usage": {"completion_tokens": 32}, **timings}).encode()
        got = throughput.completion(url, max_tokens=32, timeout=5)
        print(f"{choices!r} {timings}: {got}")
        assert got["tokens"] == 0 and got["tps"] == 0.0


def test_an_answer_of_blanks_counts_its_bytes_not_nothing(url):
    """A base model may answer newlines alone: they are text its server wrote, a byte a token at
    least; counted as none, a healthy server read 0 tok/s and would be restarted."""
    Answers.body = json.dumps({"choices": [{"message": {"content": " \n\t\u3000"}}],
                               "usage": {"completion_tokens": 32}}).encode()
    assert throughput.completion(url, max_tokens=32, timeout=5)["tokens"] == 6   # 3 + the ideographic space's 3


def test_a_completions_count_is_at_most_the_bytes_of_its_text(url):
    """N32: content 'x' with usage.completion_tokens 128 read 128 tokens; a token shows as a byte of
    the text at least (a byte-fallback token: one byte of a character), so 'x' backs one; a real
    answer (a few bytes a token, its thinking under reasoning_content) keeps its count."""
    Answers.body = answer(128, "x")
    assert throughput.completion(url, max_tokens=128, timeout=5)["tokens"] == 1
    Answers.body = answer(4, "\U0001f600")                # 4 byte tokens, one character
    assert throughput.completion(url, max_tokens=128, timeout=5)["tokens"] == 4
    for key in ("reasoning_content", "reasoning"):        # llama-server's and vLLM's; vLLM's newer name
        Answers.body = json.dumps({"choices": [{"message": {"content": "", key: "Let me think " * 10}}],
                                   "usage": {"completion_tokens": 32}}).encode()
        assert throughput.completion(url, max_tokens=32, timeout=5)["tokens"] == 32
    Answers.body = answer(32, "\ud800" * 40)              # a lone surrogate (JSON allows it): no crash
    assert throughput.completion(url, max_tokens=32, timeout=5)["tokens"] == 32


@pytest.mark.parametrize("value, served", [("\u0661\u0662", None), ("1_2", None), ("0012", None), ("-3", None),
                                           ("1e3", None), ("NaN", None), ("", None), ("12", 12.0), ("12.5 1700", 12.5)])
def test_tokens_served_reads_ascii_digits_only(url, value, served):
    """issue 61 (red team item 11): float() read '\u0661\u0662' as 12."""
    Answers.body = f"# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total {value}\n".encode()
    got = throughput.tokens_served(url)
    print(f"tokens_predicted_total {value!r}: {got}")
    assert got == served


STATUS = st.one_of(st.none(), st.text(max_size=8), st.booleans(), VALUES,
                   st.fixed_dictionaries({}, optional={"value": st.one_of(st.sampled_from(["loaded", "unloaded"]), VALUES),
                                                       "failed": st.one_of(st.booleans(), VALUES),
                                                       "exit_code": VALUES}))
MODELS = st.one_of(st.lists(st.one_of(st.fixed_dictionaries({"id": st.one_of(st.text(max_size=6), VALUES)},
                                                            optional={"status": STATUS}), VALUES), max_size=4),
                   VALUES)


@settings(max_examples=100, deadline=2000)
@given(listed=st.one_of(st.fixed_dictionaries({}, optional={"data": MODELS, "object": st.just("list")}), VALUES))
def test_a_routers_models_read_as_statuses_or_none_as_the_relay_reads_them(url, listed):
    """issue 65: /models of a router, any JSON: each model's status text (or None), failed a bool
    (true only for JSON true), exit_code a whole number or None; or None; never raises. Rerun 2 of
    issue 61, N30: None exactly where the metrics relay's reader refuses it ({"data": "abc"} and {}
    read as no model loaded: the watchdog judged nothing), the same statuses where it reads them."""
    from roles.metrics.shipped import relay
    Answers.body = json.dumps(listed).encode()
    got = throughput.model_statuses(url, timeout=5)
    try:
        want = relay.model_statuses(relay.json_answer(Answers.body))
    except ValueError:
        want = None
    assert (got is None) == (want is None), (listed, got, want)
    assert got is None or {m: s["value"] for m, s in got.items()} == want
    assert got is None or all(isinstance(m, str) and set(s) == {"value", "failed", "exit_code"}
                              and type(s["failed"]) is bool and (s["exit_code"] is None or type(s["exit_code"]) is int)
                              for m, s in got.items())


@pytest.mark.parametrize("listed", [{"data": "abc"}, {"object": "list"}, {"data": {"m": 1}}, [], "x",
                                    {"data": [{"id": "m", "status": {"value": "loaded"}}, {"id": "m", "status": "failed"}]},
                                    {"data": [{"id": "m", "status": {"value": ["loaded"]}}]},
                                    {"data": [{"id": "m", "status": ""}]}, {"data": ["m"]}])
def test_a_routers_models_of_another_shape_is_no_answer(url, listed):
    """Rerun 2 of issue 61, N30: these read as {} (no model loaded: 'not judged') or hid a model's
    second listing; the relay's reader refuses each."""
    Answers.body = json.dumps(listed).encode()
    assert throughput.model_statuses(url, timeout=5) is None


@settings(max_examples=60, deadline=2000)
@given(lines=st.lists(st.tuples(st.sampled_from(["llamacpp:requests_deferred", "llamacpp:n_decode_total", "other", ""]),
                                st.one_of(st.text(NUMERIC, max_size=12), st.text(max_size=6))
                                .filter(lambda v: "\n" not in v)), max_size=5))
def test_a_servers_figures_are_the_boundarys_or_none(url, lines):
    """issue 65: each llamacpp: figure of /metrics (the first sample of its name) as numbers.number
    reads it (>= 0, ASCII digits), else None; other names left out; never raises."""
    Answers.body = "".join(f"{n} {v}\n" for n, v in lines).encode()
    got = throughput.server_figures(url, timeout=5)
    first = {}
    for n, v in lines:
        if n.startswith("llamacpp:") and n not in first:
            first[n] = v
    assert got is not None and set(got) <= {n for n, _ in lines if n.startswith("llamacpp:")}
    for n, v in first.items():
        # the first field, up to an ASCII blank (a sample's timestamp may follow)
        want = number(re.split(r"[ \t]+", v.strip(" \t\r\n\f\v"))[0], float, 0)
        assert got.get(n) == (None if want is None else float(want)), (n, v)


def test_a_figure_with_a_unicode_blank_is_none(url):
    """issue 61 round 9 H1: str.strip() took U+0085, U+00A0, U+2003 and U+2028 off a server's figure
    ("350\x85" was 350); the copy strips ASCII's blanks alone, as numbers.number."""
    for text in ("350\x85", "\u2003350", "350\u2028", "350\xa0"):
        got = throughput.figure(text, 0, 1e9)
        print(f"figure({text!r}) -> {got} (numbers.number: {number(text, float, 0, 1e9)})")
        assert got is None and number(text, float, 0, 1e9) is None
    Answers.body = "llamacpp:tokens_predicted_total 350\x85 17\nllamacpp:n_decode_total 12\n".encode()
    got = throughput.server_figures(url, timeout=5)
    print(f"/metrics 'llamacpp:tokens_predicted_total 350\\x85 17' -> {got}")
    assert got == {"llamacpp:tokens_predicted_total": None, "llamacpp:n_decode_total": 12.0}


# ---------------------------------------------------------------- round 2 of issue 61, I1 (I3, I7)
DEEP = b"[" * 100000 + b"]" * 100000


def test_a_routers_models_nested_deep_is_none_not_a_recursion_error(url):
    """I1: /models nested 100000 deep raised RecursionError out of model_statuses (the sweep of
    plays/shipped/tune.py ended in a traceback; its completion caught only OSError, ValueError, KeyError)."""
    Answers.body = DEEP
    assert throughput.model_statuses(url, timeout=5) is None


def test_a_completion_nested_deep_is_a_value_error_and_a_level_counts_it_failed(url):
    """I3/I7: the completion's answer nested deep raised RecursionError: the level's client thread
    died and the level said requests 0, failed 0 (a failure not counted)."""
    Answers.body = DEEP
    with pytest.raises(ValueError, match="not JSON"):
        throughput.completion(url, max_tokens=8, timeout=5)
    got = throughput.level(url, 2, None, 8, 2, 5)
    print(got)
    assert got["requests"] == 0 and got["failed"] == 4 and got["errors"]


def test_a_completion_with_a_key_twice_is_a_value_error(url):
    Answers.body = b'{"usage": {"completion_tokens": 8}, "usage": {"completion_tokens": 1}}'
    with pytest.raises(ValueError, match="twice"):
        throughput.completion(url, max_tokens=8, timeout=5)


@pytest.mark.parametrize("data", [[{"id": "m", "status": {"value": "failed", "failed": True}},
                                   {"id": "m", "status": {"value": "loaded"}}],
                                  [{"id": 1, "status": {"value": "failed"}}, {"id": "1", "status": {"value": "loaded"}}],
                                  [{"id": ["m"], "status": {"value": "loaded"}}]])
def test_a_model_listed_twice_is_no_answer(url, data):
    """Round 1 of issue 61, G01/G04: the last entry won, a failed load hidden from the watchdog."""
    Answers.body = json.dumps({"data": data}).encode()
    assert throughput.model_statuses(url, timeout=5) is None


def test_a_server_that_answers_no_http_is_a_counted_failure():
    """http.client's BadStatusLine is no OSError: urllib lets it through, and the level's client
    thread died with it (the level said failed 0)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"garbage\r\n\r\n")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    bad = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(http.client.HTTPException):   # the watchdog names it: the answer was cut off
            throughput.completion(bad, max_tokens=8, timeout=5)
        got = throughput.level(bad, 1, None, 8, 2, 5)
        assert got["failed"] == 2 and got["requests"] == 0
        assert throughput.model_statuses(bad, timeout=5) is None and throughput.server_figures(bad, timeout=5) is None
    finally:
        listener.close()


JSON_TEXT = st.one_of(st.text(max_size=60), st.sampled_from(['{"a": 1, "a": 2}', "NaN", "[Infinity]", '{"x": -Infinity}',
                                                             "[" * 5000 + "]" * 5000, '{"a": {"b": 1, "b": 1}}', "[1e400]",
                                                             '"\\ud800"', "{}", "[]", "1", '{"a": [1, 2.5, null]}']))


@settings(max_examples=200, deadline=1000)
@given(JSON_TEXT)
def test_the_copys_loads_is_the_boundarys(text):
    """shipped/throughput.py ships alone: its loads is rigup.boundary.core.loads by hand, held equal here
    (but for NaN, Infinity and 1e400, which it reads: see its docstring)."""
    from rigup.boundary.core import Unreadable, loads
    try:
        want = ("ok", loads(text, "x"))
    except Unreadable as e:
        want = ("ok", json.loads(text)) if "is no JSON number" in e.why or "past a float's range" in e.why \
            else ("refused", None)
    try:
        got = ("ok", throughput.loads(text))
    except ValueError:
        got = ("refused", None)
    assert got == want or (got[0] == want[0] == "ok" and json.dumps(got[1]) == json.dumps(want[1]))
