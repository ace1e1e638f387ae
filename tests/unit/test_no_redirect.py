"""Issue 47: a server that a host-side client sends an API key to redirects to another origin (a
second port of 127.0.0.1): the watchdog's and bench's completion (rigup/throughput.py) and the
metrics relay (roles/metrics/relay.py) fail on the redirect, and the other origin sees no request
with the key. Real HTTP servers on loopback."""

import http.server
import threading
import time
import urllib.request

import pytest

from rigup import throughput
from roles.metrics import relay

KEY = "sk-lab-0123456789abcdef"


def serve(handler) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def origins(tmp_path):
    """(the redirecting server's URL, the headers the other origin received)."""
    seen = []

    class Other(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"# metrics\n")

        do_POST = do_GET

    other = serve(Other)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

    first = serve(Redirect)
    yield f"http://127.0.0.1:{first.server_port}", seen
    first.shutdown()
    other.shutdown()


def drip(pause: float):
    """A server that answers GET or POST with a chunked body that never ends: a byte each ``pause``
    s, or (a path starting /big) 1 MiB pieces at once."""

    class Drip(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            big = self.path.startswith("/big")
            for _ in range(10_000):
                piece = b"#" * (1 << 20) if big else b"#"
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0 if big else pause)

        do_POST = do_GET

    return Drip


def test_the_completion_refuses_a_redirect_and_the_key_stays(origins):
    url, seen = origins
    with pytest.raises(urllib.error.HTTPError) as failed:
        throughput.completion(url, KEY, max_tokens=4, timeout=5)
    print(f"\ncompletion through a 302 to another origin: HTTP {failed.value.code}; the other origin saw {len(seen)} request(s)")
    assert failed.value.code == 302 and seen == []


def test_the_metrics_relay_refuses_a_redirect_and_the_key_stays(origins, tmp_path):
    url, seen = origins
    key = tmp_path / "k.key"
    key.write_text(KEY)
    front = serve(relay.handler({"instances": {"g": {"url": url, "key": str(key)}}}, {"127.0.0.1"}))
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"http://127.0.0.1:{front.server_port}/metrics/g", timeout=5)
    finally:
        front.shutdown()
    print(f"\nrelay of an instance whose /metrics redirects: HTTP {failed.value.code}; "
          f"the other origin saw {len(seen)} request(s)")
    assert failed.value.code == 502 and seen == []
    assert not any(KEY in str(h) for h in seen)


def test_a_never_ending_chunked_answer_ends_at_the_timeout_and_a_huge_one_at_its_size():
    """A server that drips a chunked answer forever (each piece well within the socket's timeout)
    or sends more than a completion's worth: the completion ends at its timeout, or at
    MAX_ANSWER bytes, never holding the watchdog's check."""
    server = serve(drip(pause=0.2))
    url = f"http://127.0.0.1:{server.server_port}"
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="still coming at its deadline"):
        throughput.completion(url, KEY, timeout=2)
    took = time.monotonic() - start
    with pytest.raises(ValueError, match="larger than"):
        throughput.completion(url + "/big", KEY, timeout=30)
    print(f"\na dripping answer ended after {took:.1f} s (timeout 2 s); a huge one at {throughput.MAX_ANSWER} bytes")
    assert took < 5
    server.shutdown()


def test_the_relay_ends_a_dripping_or_huge_metrics_answer_naming_why(monkeypatch):
    """An instance whose /metrics drips forever (503: not answered within the scrape's bound, one
    deadline per scrape, issue 65) or answers more than MAX_BODY (502): the relay answers naming
    why within its timeout, never holding a thread or its memory."""
    monkeypatch.setattr(relay, "TIMEOUT_S", 1)
    monkeypatch.setattr(relay, "MAX_BODY", 4 << 20)
    instance = serve(drip(pause=0.1))
    url = f"http://127.0.0.1:{instance.server_port}"
    front = serve(relay.handler({"instances": {"drip": {"url": url}, "big": {"url": url + "/big"}}}, {"127.0.0.1"}))
    try:
        for name, code, why in (("drip", 503, "did not answer within the scrape's 1 s"),
                                ("big", 502, "answered more than 4194304 bytes")):
            start = time.monotonic()
            with pytest.raises(urllib.error.HTTPError) as failed:
                urllib.request.urlopen(f"http://127.0.0.1:{front.server_port}/metrics/{name}", timeout=10)
            text = failed.value.read().decode()
            print(f"\nrelay of {name}: HTTP {failed.value.code} after {time.monotonic() - start:.1f} s: {text.strip()}")
            assert failed.value.code == code and why in text and time.monotonic() - start < 4
    finally:
        front.shutdown()
        instance.shutdown()
