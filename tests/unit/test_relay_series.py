"""The metrics relay gives each series once and counts only whole events (issue 61, round 4): a
label whose value is empty is none to Prometheus (R1: x{model="m"} and x{model="m",slot=""} were
relayed as two samples of one series), a plain server's samples had no dedupe at all (R2: x 1 and
x 2), and the /models/sse follower read the tail of a line longer than its bound as an event (R9)."""

import http.server
import threading
import time
import urllib.request

from roles.metrics.shipped import relay

from tests.unit.world import remade

_remade = remade(relay.throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)


def serving(handler_class):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_R1_an_empty_label_makes_no_other_series():
    got = relay.labelled('llamacpp:x{model="m"} 1\nllamacpp:x{model="m",slot=""} 2\n', "m", set())
    print(got)
    assert got == ['llamacpp:x{model="m"} 1']


def test_R2_a_plain_servers_series_given_twice_is_relayed_once():
    text = "# HELP llamacpp:x n\n# HELP llamacpp:x n\nllamacpp:x 1\nllamacpp:x 2\nllamacpp:y{slot=\"\"} 1\nllamacpp:y 3\n"

    class Instance(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text.encode())

    server = serving(Instance)
    relayed = serving(relay.handler({"instances": {"g": {"url": f"http://127.0.0.1:{server.server_port}"}}},
                                    {"127.0.0.1"}))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{relayed.server_port}/metrics/g", timeout=5) as answer:
            got = answer.read().decode()
    finally:
        server.shutdown(), relayed.shutdown()
    print(got)
    assert got == '# HELP llamacpp:x n\nllamacpp:x 1\nllamacpp:y{slot=""} 1\n'


def test_R9_the_tail_of_an_over_long_sse_line_is_no_event():
    tail = b'data: {"model": "m", "data": {"status": "loaded"}}\n\n'
    whole = b'data: {"model": "m", "data": {"status": "loading"}}\n\n' + tail

    class Router(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"data: " + b"x" * (65536 * 2 - 6) + tail + whole
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = serving(Router)
    swaps = relay.Swaps({"url": f"http://127.0.0.1:{server.server_port}", "models": ["m"]})
    swaps.RETRY_S = 60
    swaps.start()
    try:
        for _ in range(50):
            if swaps.models["m"]["loads"] and not swaps.up:   # the stream read to its end
                break
            time.sleep(0.1)
    finally:
        server.shutdown()
    print(swaps.models["m"])
    assert swaps.models["m"]["loads"] == 1   # the whole loading-loaded pair after it, not the long line's tail
