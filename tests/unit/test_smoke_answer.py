"""The build smoke's one HTTP read (roles/llama_cpp/shipped/smoke.py _request, run as root on a loopback
server it started): an answer nested past Python's stack, one too large or a redirect is no JSON
answer, never a RecursionError out of the smoke (issue 61, round 9 S1); the whole answer, its
headers too, within the timeout. Real HTTP servers on loopback."""

import http.server
import threading
import time

import pytest

from roles.llama_cpp.shipped import smoke

from tests.unit.world import remade

_remade = remade(smoke)   # made again after any gevent patch (tests/unit/world.py)


def answering(code: int, body: bytes, headers: dict | None = None, pause: float = 0):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(code)
            for name, value in (headers or {}).items():
                time.sleep(pause)
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.mark.parametrize("code, body, headers, expected", [
    (200, b"[" * 200_000, None, (200, {})),                                # nested past the stack
    (200, b"{" * 200_000, None, (200, {})),
    (200, b'{"a": ' + b"1" * (2 << 20) + b"}", None, (200, {})),           # past MAX_ANSWER
    (200, b"[1, 2]", None, (200, {})),                                     # JSON, not an object
    (200, b'{"tokens_predicted": 3}', None, (200, {"tokens_predicted": 3})),
    (302, b"", {"Location": "http://127.0.0.1:9/elsewhere"}, (302, {})),   # never followed
])
def test_an_answer_that_is_no_json_object_is_none_never_a_traceback(code, body, headers, expected):
    server = answering(code, body, headers)
    try:
        got = smoke._request(f"http://127.0.0.1:{server.server_address[1]}/completion", {"prompt": "x"}, 10)
    finally:
        server.shutdown()
    print(f"\nHTTP {code}, {body[:12]!r}... ({len(body)} bytes): _request gives {got}")
    assert got == expected


def test_a_trickled_header_ends_at_the_timeout():
    server = answering(200, b"{}", {f"X-{i}": "b" for i in range(20)}, pause=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(OSError) as failed:
            smoke._request(f"http://127.0.0.1:{server.server_address[1]}/health", None, 1.5)
    finally:
        server.shutdown()
    took = time.monotonic() - start
    print(f"\na header line every 0.5 s (10 s in all), timeout 1.5 s: {type(failed.value).__name__} after {took:.1f} s")
    assert took < 3
