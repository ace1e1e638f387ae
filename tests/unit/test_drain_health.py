"""rigup-balancer-drain's one HTTP read, a replica's /health (issue 61, round 9): a redirect is the
replica's own answer, never followed (D2); the wait under way bounds the whole answer, its headers
too (D3); and its numbers are the boundary's whole numbers, no leading zero (H4). Real HTTP servers
on loopback."""

import http.server
import socketserver
import threading
import time

import pytest
from hypothesis import given, strategies as st

from rigup.boundary import numbers
from roles.balancer.shipped import drain

from tests.unit.world import remade

_remade = remade(drain)   # made again after any gevent patch (tests/unit/world.py)


def serve(server):
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def elsewhere():
    """A server that answers 200 to anything, and the paths it was asked."""
    asked = []

    class Ok(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok))
    yield server.server_address[1], asked
    server.shutdown()


def test_a_replicas_redirect_is_its_own_answer_never_followed(elsewhere):
    port, asked = elsewhere

    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

    replica = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect))
    try:
        got = drain.health(f"http://127.0.0.1:{replica.server_address[1]}/health")
        ok = drain.healthy(replica.server_address[1])
    finally:
        replica.shutdown()
    print(f"\na replica's /health 302 to another server's 200: health {got!r}, healthy {ok}, "
          f"the other server asked {asked}")
    assert got == 302 and ok is False and asked == []
    assert drain.healthy(port) is True   # a 200 is still healthy


def test_a_trickled_header_ends_at_the_waits_deadline():
    class Trickle(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(4096)
            try:
                self.request.sendall(b"HTTP/1.1 200 OK\r\n")
                for _ in range(20):
                    time.sleep(0.5)   # each line well within a socket's per-read timeout
                    self.request.sendall(b"X-a: b\r\n")
                self.request.sendall(b"Content-Length: 0\r\n\r\n")
            except OSError:
                pass

    server = serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trickle))
    try:
        start = time.monotonic()
        waiting = drain.Waiting()
        ok = waiting.wait(lambda: drain.healthy(server.server_address[1], waiting), 2)
        took = time.monotonic() - start
        start = time.monotonic()
        alone = drain.health(f"http://127.0.0.1:{server.server_address[1]}/health", seconds=1)
        took_alone = time.monotonic() - start
    finally:
        server.shutdown()
    print(f"\na header line every 0.5 s (10 s in all): wait(healthy, 2 s) {ok} after {took:.1f} s; "
          f"health(seconds=1) {alone!r} after {took_alone:.1f} s")
    assert ok is False and took < 3.5
    assert isinstance(alone, str) and alone.startswith("no answer") and took_alone < 2


@pytest.mark.parametrize("text", ["0080", "00", "00000000000000065535", "0x50", "+80", "80\n", " 80", "٣", "8_0"])
def test_a_number_with_a_leading_zero_or_not_ascii_digits_is_none(text):
    print(f"\n_count({text!r}) = {drain._count(text)} (the boundary's whole: {numbers.whole(text)})")
    assert drain._count(text) is None


def test_the_drains_number_rule_is_the_boundarys():
    print(f"\ndrain.WHOLE {drain.WHOLE.pattern!r} == rigup.boundary.numbers._WHOLE {numbers._WHOLE.pattern!r}")
    assert drain.WHOLE.pattern == numbers._WHOLE.pattern


@given(st.text(alphabet="0123456789 +-_x\u0663\u00b2", max_size=22))
def test_count_reads_as_the_boundary_does(text):
    expected = numbers.whole(text) if text == text.strip() else None   # drain's texts come stripped
    assert drain._count(text) == expected
