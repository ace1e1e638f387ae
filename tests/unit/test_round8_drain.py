"""Issue 61, round 8 D1: rigup-balancer-drain's HTTP reads (roles/balancer/shipped/drain.py ``health``, which
``healthy`` and ``_expired`` both use) take any answer of a replica's port as a status or "no answer":
a malformed status line or a header line over http.client's bound was a traceback out of ``main()``
(which catches Failed alone), failing the replica's ExecStartPost."""

import socket
import threading

import pytest
from hypothesis import given, settings, strategies as st

from roles.balancer.shipped import drain

from tests.unit.world import remade

_remade = remade(drain)   # made again after any gevent patch (tests/unit/world.py)


def answering(payload: bytes) -> int:
    """A loopback port whose one connection gets ``payload`` after the request, then is closed."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    s.settimeout(10)

    def serve():
        try:
            c, _ = s.accept()
        except OSError:
            return
        with c:
            c.settimeout(5)
            try:
                c.recv(65536)
                c.sendall(payload)
            except OSError:   # the client gave up first (a header past its bound)
                pass
        s.close()

    threading.Thread(target=serve, daemon=True).start()
    return s.getsockname()[1]


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/health"


def test_d1_a_malformed_status_line_or_an_overlong_header_is_not_healthy():
    for payload in (b"HTTP/1.1 abc OK\r\n\r\n",                                  # BadStatusLine
                    b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",      # LineTooLong
                    b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * 200 + b"\r\n",        # too many headers
                    b"",                                                          # RemoteDisconnected
                    b"\x00\xff garbage\r\n\r\n"):
        port = answering(payload)
        assert drain.healthy(port) is False, payload[:40]
    got = drain.health(url(answering(b"HTTP/1.1 abc OK\x00\x00\r\n\r\n")))
    assert isinstance(got, str) and got.startswith("no answer")


def test_d1_a_status_is_read_as_before():
    assert drain.healthy(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) is True
    assert drain.health(url(answering(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n"))) == 503
    assert drain.healthy(answering(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n")) is False
    assert drain.health("http://[fe80::1%25eth0:x/health").startswith("no answer")   # no URL urllib takes


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=300) | st.builds(lambda head, body: b"HTTP/1.1 " + head + b"\r\n" + body,
                                           st.binary(max_size=40), st.binary(max_size=200)))
def test_d1_any_answer_is_a_status_or_no_answer_never_an_exception(payload):
    """A replica's port is another program's (any user's, once the replica is gone): whatever it answers,
    ``health`` returns an HTTP status or "no answer (...)", and ``healthy`` a bool."""
    got = drain.health(url(answering(payload)))
    assert (isinstance(got, int) and 100 <= got <= 999) or (isinstance(got, str) and got.startswith("no answer")), got
    assert drain.healthy(answering(payload)) in (True, False)
