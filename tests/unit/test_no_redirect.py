"""Issue 47: a server that a host-side client sends an API key to redirects to another origin (a
second port of 127.0.0.1): the watchdog's and bench's completion (shipped/throughput.py), the
metrics relay (roles/metrics/shipped/relay.py) and the tuner's wait for its server (plays/shipped/tune.py) fail on
the redirect, and the other origin sees no request with the key; and (issue 61) each answer is
whole by its timeout, a status line and headers trickled past it too. Real HTTP servers on loopback."""

import http.server
import socketserver
import subprocess
import threading
import time
import urllib.request

import pytest

from plays.shipped import tune
from shipped import throughput
from roles.metrics.shipped import relay

from tests.unit.world import remade

_remade = remade(throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)

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


class Trickle(socketserver.BaseRequestHandler):
    """A status line, then a header line every 0.3 s for 6 s (each well within a socket's per-read
    timeout), then a 200's end."""

    def handle(self):
        self.request.recv(65536)
        try:
            self.request.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(20):
                time.sleep(0.3)
                self.request.sendall(b"X-a: b\r\n")
            self.request.sendall(b"Content-Length: 0\r\n\r\n")
        except OSError:
            pass


@pytest.fixture
def trickle():
    """The URL of a :class:`Trickle` server."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_measurings_reads_end_at_their_timeout_while_headers_trickle(trickle):
    """throughput's completion, /metrics and /models reads (the watchdog's, bench's): a server
    trickling its headers is cut at the read's timeout, not each header line's."""
    took = {}
    for name, read in (("completion", lambda: throughput.completion(trickle, KEY, timeout=1)),
                       ("server_figures", lambda: throughput.server_figures(trickle, KEY, timeout=1)),
                       ("model_statuses", lambda: throughput.model_statuses(trickle, KEY, timeout=1))):
        start = time.monotonic()
        try:
            got = read()
        except OSError as e:
            got = f"{type(e).__name__}: {e}"
        took[name] = (round(time.monotonic() - start, 1), got)
    print(f"\nheaders trickled 0.3 s apart for 6 s, each read's timeout 1 s: {took}")
    assert took["completion"][1].startswith("TimeoutError")
    assert took["server_figures"][1] is None and took["model_statuses"][1] is None
    assert all(seconds < 2 for seconds, _ in took.values())


def test_the_relay_answers_503_at_its_scrapes_bound_while_headers_trickle(trickle, monkeypatch):
    monkeypatch.setattr(relay, "TIMEOUT_S", 1)
    front = serve(relay.handler({"instances": {"t": {"url": trickle}}}, {"127.0.0.1"}))
    try:
        start = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"http://127.0.0.1:{front.server_port}/metrics/t", timeout=10)
        took = time.monotonic() - start
        text = failed.value.read().decode()
    finally:
        front.shutdown()
    print(f"\nrelay of an instance trickling its headers (scrape bound 1 s): HTTP {failed.value.code} "
          f"after {took:.1f} s: {text.strip()}")
    assert failed.value.code == 503 and "within the scrape's 1 s" in text and took < 2.5


def sse(lines: list[bytes], pause: float):
    """A router whose /models/sse sends ``lines`` ``pause`` s apart, each its own event, then holds."""

    class Router(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for line in lines:
                    time.sleep(pause)
                    self.wfile.write(line + b"\n\n")
                    self.wfile.flush()
                time.sleep(30)
            except OSError:
                pass

    return Router


def test_the_relays_event_stream_lives_on_its_lines_and_ends_on_silence_or_trickled_headers(trickle, monkeypatch):
    """The follower of a router's /models/sse (relay.Swaps.follow): its headers trickled past
    IDLE_S end it; a stream whose events come within IDLE_S of each other is followed past IDLE_S
    (the opener's deadline moved on at each line), and ended once it is silent IDLE_S."""
    monkeypatch.setattr(relay.Swaps, "IDLE_S", 1)
    swaps = relay.Swaps({"url": trickle, "models": ["a"]})
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        swaps.follow()
    cut = time.monotonic() - start
    events = [b'data: {"model": "a", "data": {"status": "unloaded"}}'] * 5
    router = http.server.ThreadingHTTPServer(("127.0.0.1", 0), sse(events, 0.5))
    router.daemon_threads = True   # its handler holds the stream open 30 s: never waited for
    threading.Thread(target=router.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    swaps = relay.Swaps({"url": f"http://127.0.0.1:{router.server_port}", "models": ["a"]})
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            swaps.follow()
        took = time.monotonic() - start
    finally:
        router.shutdown()
        router.server_close()
    print(f"\nIDLE_S 1: trickled headers cut after {cut:.1f} s; 5 events 0.5 s apart, then silence: "
          f"{swaps.models['a']['unloads']} counted, ended after {took:.1f} s")
    assert cut < 2 and swaps.models["a"]["unloads"] == 5 and 3 < took < 4.5


@pytest.fixture
def server_process():
    """A process standing for the tuner's llama-server (alive while _healthy waits)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_tuners_wait_for_its_server_follows_no_redirect_and_ends_while_headers_trickle(
        origins, trickle, server_process):
    url, seen = origins
    redirected = tune._healthy(int(url.rpartition(":")[2]), server_process, 1)
    start = time.monotonic()
    trickled = tune._healthy(int(trickle.rpartition(":")[2]), server_process, 1)
    took = time.monotonic() - start
    print(f"\nthe tuner's wait (1 s) on a /health 302 to another origin's 200: {redirected!r}, the other "
          f"origin saw {len(seen)} request(s); on trickled headers: {trickled!r} after {took:.1f} s")
    assert redirected == "no /health 200 in 1 s" and seen == []
    assert trickled == "no /health 200 in 1 s" and took < 3   # one 1-s read, one 0.5-s pause


# Every HTTP read of rigup's, in a host program or the controller (rigup/, roles/, the top-level
# programs), goes through the one opener that follows no redirect and bounds the whole answer, its
# status line and headers too, by its timeout (issue 61, round 9 D2/D3: rigup-balancer-drain's
# urlopen followed a replica's 302 to another server's 200, and its per-read timeout let a header
# trickled every 3 s hold a 2-s wait 18 s): rigup-balancer-drain's _NoRedirect, _Deadline,
# _connected, _WholeRead and _Within, copied to the letter into each program that reads HTTP (a host
# program ships alone) and built into its _OPENER; never urlopen, never an http.client connection
# of its own, every open() given its timeout. Held on the syntax tree; a file not yet there is named
# with why, and the list only goes down.
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "roles/balancer/shipped/drain.py"
SHARED = ("_NoRedirect", "_Deadline", "_connected", "_WholeRead", "_Within")
NOT_YET = {
    "roles/model_fetch/shipped/fetcher.py": "its hub and the hub's CDN are https (huggingface.co), which _Within (http_open) "
                                    "does not open and _Deadline cannot bound (TLS wraps its socket in an SSLSocket "
                                    "that reads the descriptor itself); a file's stream lasts hours, bounded by "
                                    "its stall window (bytes per stall_s between one-recv reads), never by a "
                                    "whole deadline; and the hub answers a file with a redirect to its CDN by "
                                    "design (the token unredirected)",
}


def _sources(root: Path) -> list[Path]:
    return sorted([p for d in ("rigup", "roles", "plays", "shipped") for p in (root / d).rglob("*.py")] + list(root.glob("*.py")))


def _named(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain ('' for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _bare(node: ast.AST) -> str:
    """``node``'s dump without its docstrings (copies may say why in their own words)."""
    node = ast.parse(ast.unparse(node))
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            n.body = body[1:] or [ast.Pass()]
    return ast.dump(node)


def _shared(tree: ast.Module) -> dict[str, str]:
    return {n.name: _bare(n) for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in SHARED}


def http_problems(root: Path = ROOT) -> dict[str, list[str]]:
    """file -> what keeps its HTTP reads from the one opener (none for a file that reads no HTTP)."""
    reference = _shared(ast.parse((root / REFERENCE).read_text()))
    assert set(reference) == set(SHARED), f"{REFERENCE} lacks {set(SHARED) - set(reference)}"
    found = {}
    for path in _sources(root):
        text = path.read_text()
        if "urllib" not in text and "http.client" not in text:
            continue
        tree, problems = ast.parse(text), []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("urllib.request", "http.client"):
                problems.append(f"line {node.lineno}: from {node.module} import (use the module's opener)")
            if not isinstance(node, ast.Call):
                continue
            name = _named(node.func)
            if name.endswith("urlopen"):
                problems.append(f"line {node.lineno}: urlopen (follows redirects; per-read timeout)")
            elif name in ("http.client.HTTPConnection", "http.client.HTTPSConnection"):
                problems.append(f"line {node.lineno}: a connection of its own ({name})")
            elif name.endswith("build_opener"):
                given = {_named(a.func) for a in node.args if isinstance(a, ast.Call)}
                if not {"_NoRedirect", "_Within"} <= given:
                    problems.append(f"line {node.lineno}: an opener without _NoRedirect() and _Within()")
            elif name.endswith("_OPENER.open") and not any(k.arg == "timeout" for k in node.keywords):
                problems.append(f"line {node.lineno}: _OPENER.open without its timeout (the whole answer's bound)")
        uses = any(isinstance(n, ast.Call) and _named(n.func).endswith(("build_opener", "urlopen")) for n in ast.walk(tree))
        own = _shared(tree)
        if uses and own != reference:
            problems.append(f"not the reference's copy of {[n for n in SHARED if own.get(n) != reference[n]]} "
                            f"({REFERENCE})")
        if problems:
            found[str(path.relative_to(root))] = problems
    return found


def test_every_http_read_goes_through_the_one_whole_read_opener_that_follows_no_redirect():
    found = http_problems()
    print(f"\nHTTP reads not yet through the one opener, each named: {sorted(found)}")
    unexplained = {p: v for p, v in found.items() if p not in NOT_YET}
    assert not unexplained, f"an HTTP read past the one opener (copy {SHARED} from {REFERENCE}): {unexplained}"
    assert not set(NOT_YET) - set(found), f"through the opener now (drop them from NOT_YET): {set(NOT_YET) - set(found)}"


def test_the_guard_finds_urlopen_a_redirecting_opener_and_an_open_without_its_timeout(tmp_path):
    """The guard on a program written the old way: each use named."""
    (tmp_path / "rigup").mkdir()
    (tmp_path / REFERENCE).parent.mkdir(parents=True)
    (tmp_path / REFERENCE).write_text((ROOT / REFERENCE).read_text())
    (tmp_path / "rigup" / "old.py").write_text(
        "import urllib.request, http.client\n"
        "def a(url):\n    return urllib.request.urlopen(url, timeout=5)\n"
        "_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
        "def b(url):\n    return _OPENER.open(url)\n"
        "def c():\n    return http.client.HTTPConnection('h', 80)\n")
    found = http_problems(tmp_path)
    print(f"\nthe guard on an old-style program: {found}")
    problems = " | ".join(found["rigup/old.py"])
    for what in ("urlopen", "without _NoRedirect() and _Within()", "without its timeout", "a connection of its own",
                 "not the reference's copy"):
        assert what in problems
    assert REFERENCE not in found
