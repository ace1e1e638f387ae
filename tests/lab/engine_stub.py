#!/usr/bin/env python3
"""An engine stand-in with a throughput: an OpenAI-compatible server (standard library) that
answers /health, /v1/models, /metrics and /v1/chat/completions, generating ``max_tokens`` tokens
at ``--tps`` tokens a second per request (requests run at once, each at that rate, up to
``--slots``; more wait for a slot, as llama-server's --parallel). For the watchdog's and
bench.py's tests (tests/roles/test_watchdog.py, test_bench.py, tests/unit/test_watchdog.py).

    python3 engine_stub.py --port 8081 [--host 127.0.0.1] [--tps 200] [--slots 4] [--slow-file PATH]
                           [--mode normal|nulls|die|loading] [--loading-s S] [--loading-file PATH]
                           [--redirect-to URL] [--record FILE] [--report-tps TEXT] [--wedge-file PATH]
                           [--router A,B [--loaded NAME] [--all-loaded] [--fail-model NAME]] [--metrics-delay S]

A wedged engine, for real: SIGUSR1 makes this process slow (``--slow-tps``, default 2 tok/s)
until it restarts; SIGUSR2 makes it fast again. One that stays slow across restarts and reboots
(a card gone bad): slow while ``--slow-file`` exists. Its answer carries ``usage`` and, as
llama-server's, ``timings.predicted_per_second``.

Faulty engines (``--mode``; the watchdog's fault tests, tests/roles/test_watchdog_faults.py):
``nulls`` answers its completions 200 with ``usage`` all null and no ``timings`` (as a broken
build or proxy may); ``die`` generates, sends the headers and half the body of its answer, then
closes the connection (an engine that dies under the answer; the process itself keeps serving,
so its unit stays active); ``loading`` answers HTTP 503 ``{"error": {"code": 503, "message":
"Loading model", "type": "unavailable_error"}}`` to everything, /health included, as
llama-server does while it loads, for ``--loading-s`` seconds after its start (default: for
ever), then serves normally. ``--loading-file PATH``: loading (503) while PATH exists, whatever
the mode (touch it, then restart the unit: a server still loading after a restart).
``--redirect-to URL``: its completions answer 302 to URL + the path (an instance that sends its
clients to another origin); ``--record FILE``: each request appends a line to FILE, ``PATH
key`` or ``PATH none`` (whether it came with an Authorization header: the other origin's log).

``--router A,B``: a router of llama-server's (issue 49) with one model loaded at a time (the first,
or ``--loaded NAME``; ``--loaded ""``: none): ``/models`` lists each with its status, a completion
for another model loads it first (``--load-s`` seconds, counted: ``GET /stub/loads``), and
``/metrics?model=NAME&autoload=false`` answers for a loaded model only (404 otherwise).

The watchers' faults (issue 65, tests/roles/test_watchers.py): ``--report-tps TEXT`` writes the
answer's ``timings.predicted_per_second`` as the raw JSON text TEXT (``Infinity``, ``NaN``,
``1e308``: what Python's json writes and reads, no JSON number). ``--wedge-file PATH``: /metrics
also shows ``llamacpp:n_decode_total``, ``requests_processing`` and ``requests_deferred``; while
PATH exists every completion is held before it generates (counted in ``requests_deferred``, the
tokens and decodes frozen: a wedged server whose clients wait), and generates once PATH is gone.
A router's ``--all-loaded``: every model of its set loaded at once (no swap); ``--fail-model NAME``:
each load of NAME fails after ``--load-s`` (its /models status ``{"value": "unloaded", "failed":
true, "exit_code": 1}``, the completion answered 500; the loaded model stays), as llama-server's
router shows a model whose child exits at its load. ``--metrics-delay S``: /metrics (a router's
model's too) answers after S seconds. A router's ``/models/sse`` is an event stream that sends each
body POSTed to ``/stub/event`` as one ``data:`` line, as it is (a test's events, malformed ones too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("normal", "nulls", "die", "loading")
LOADING = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).encode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tps", type=float, default=200.0)
    p.add_argument("--slow-tps", type=float, default=2.0)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--slow-file", default=None)
    p.add_argument("--mode", choices=MODES, default="normal")
    p.add_argument("--loading-s", type=float, default=None)
    p.add_argument("--loading-file", default=None)
    p.add_argument("--redirect-to", default=None)
    p.add_argument("--record", default=None)
    p.add_argument("--router", default=None)
    p.add_argument("--loaded", default=None)
    p.add_argument("--load-s", type=float, default=0.5)
    p.add_argument("--report-tps", default=None)
    p.add_argument("--wedge-file", default=None)
    p.add_argument("--all-loaded", action="store_true")
    p.add_argument("--fail-model", default=None)
    p.add_argument("--metrics-delay", type=float, default=0.0)
    args = p.parse_args()
    models = [m for m in (args.router or "").split(",") if m]
    router = {"loaded": (models[0] if args.loaded is None else args.loaded) if models else None, "loads": 0}
    failed: set[str] = set()           # --fail-model's, once a load of it failed
    events = {"lines": [], "cond": threading.Condition()}   # /stub/event's bodies, for /models/sse
    held = {"deferred": 0, "processing": 0, "decodes": 0}   # --wedge-file's figures
    load_lock = threading.Lock()
    born = time.monotonic()

    def loading() -> bool:
        if args.loading_file and os.path.exists(args.loading_file):
            return True
        return args.mode == "loading" and (args.loading_s is None or time.monotonic() - born < args.loading_s)

    rate = {"tps": args.tps}
    slots = threading.Semaphore(args.slots)
    served = {"tokens": 0}

    def loaded_set() -> set:
        return set(models) if args.all_loaded else {router["loaded"]}

    def status_of(m: str) -> dict:
        if m in loaded_set():
            return {"value": "loaded"}
        return {"value": "unloaded", "failed": True, "exit_code": 1} if m in failed else {"value": "unloaded"}

    def metrics_text() -> bytes:
        time.sleep(args.metrics_delay)
        text = f"llamacpp:tokens_predicted_total {served['tokens']}\n"
        if args.wedge_file:
            text += (f"llamacpp:n_decode_total {held['decodes']}\nllamacpp:requests_processing {held['processing']}\n"
                     f"llamacpp:requests_deferred {held['deferred']}\n")
        return text.encode()
    signal.signal(signal.SIGUSR1, lambda *a: rate.update(tps=args.slow_tps))
    signal.signal(signal.SIGUSR2, lambda *a: rate.update(tps=args.tps))

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def parse_request(self):
            ok = super().parse_request()
            if ok and args.record:
                with open(args.record, "a") as f:
                    f.write(f"{self.path} {'key' if self.headers.get('Authorization') else 'none'}\n")
            return ok

        def do_GET(self):
            if loading() and self.path != "/metrics":
                self.reply(503, LOADING)
            elif self.path == "/health":
                self.reply(200, b'{"status": "ok"}')
            elif self.path == "/v1/models":
                self.reply(200, json.dumps({"object": "list", "data": [{"id": "stub"}]}).encode())
            elif self.path == "/metrics" and not models:
                self.reply(200, metrics_text(), "text/plain")
            elif models and self.path == "/models":
                self.reply(200, json.dumps({"data": [{"id": m, "status": status_of(m)} for m in models]}).encode())
            elif models and self.path == "/models/sse":
                self.stream()
            elif models and self.path.startswith("/metrics?model="):
                asked = self.path.split("=", 1)[1].split("&", 1)[0]
                if asked not in loaded_set():
                    return self.reply(404, b'{"error": "model not loaded"}')
                self.reply(200, metrics_text(), "text/plain")
            elif models and self.path == "/stub/loads":
                self.reply(200, json.dumps(router).encode())
            else:
                self.reply(404, b'{"error": "not found"}')

        def stream(self):
            """/models/sse: each event body POSTed to /stub/event from now on, as a data: line."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            with events["cond"]:
                sent = len(events["lines"])
            try:
                while True:
                    with events["cond"]:
                        events["cond"].wait_for(lambda: len(events["lines"]) > sent, timeout=15)
                        new, sent = events["lines"][sent:], len(events["lines"])
                    for line in new or [b": keep-alive"]:
                        self.wfile.write((line if line.startswith(b":") else b"data: " + line) + b"\n\n")
                    self.wfile.flush()
            except OSError:
                return

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if models and self.path == "/stub/event":
                with events["cond"]:
                    events["lines"].append(raw.replace(b"\n", b" "))
                    events["cond"].notify_all()
                return self.reply(200, b'{"sent": true}')
            doc = json.loads(raw or b"{}")
            if self.path != "/v1/chat/completions":
                return self.reply(404, b'{"error": "not found"}')
            if loading():
                return self.reply(503, LOADING)
            if args.redirect_to:
                self.send_response(302)
                self.send_header("Location", args.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            tokens = int(doc.get("max_tokens") or 16)
            if models:
                if doc.get("model") not in models:
                    return self.reply(400, b'{"error": {"message": "model not found"}}')
                with load_lock:
                    if doc["model"] == args.fail_model:       # its child exits at the load: the loaded one stays
                        time.sleep(args.load_s)
                        failed.add(doc["model"])
                        return self.reply(500, b'{"error": {"code": 500, "message": "model failed to load"}}')
                    if doc["model"] not in loaded_set():      # a swap: the other one unloaded, this one loaded
                        time.sleep(args.load_s)
                        router["loaded"], router["loads"] = doc["model"], router["loads"] + 1
            if args.wedge_file and os.path.exists(args.wedge_file):   # held: waits, nothing generated
                held["deferred"] += 1
                try:
                    while os.path.exists(args.wedge_file):
                        time.sleep(0.1)
                finally:
                    held["deferred"] -= 1
            with slots:
                held["processing"] += 1
                tps = args.slow_tps if args.slow_file and os.path.exists(args.slow_file) else rate["tps"]
                started = time.monotonic()
                time.sleep(tokens / tps)
                seconds = time.monotonic() - started
                held["processing"] -= 1
            served["tokens"] += tokens
            held["decodes"] += tokens
            answer = {"object": "chat.completion", "model": "stub",
                      "choices": [{"index": 0, "finish_reason": "length",
                                   "message": {"role": "assistant", "content": "word " * tokens}}],
                      "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens},
                      "timings": {"predicted_n": tokens, "predicted_per_second": round(tokens / seconds, 3)}}
            if args.mode == "nulls":
                answer["usage"] = {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
                del answer["timings"]
            if args.report_tps is not None and "timings" in answer:   # raw text where the number goes: json.dumps would write a float
                answer["timings"]["predicted_per_second"] = "@REPORTED@"
            body = json.dumps(answer).encode()
            if args.report_tps is not None:
                body = body.replace(b'"@REPORTED@"', args.report_tps.encode())
            if args.mode != "die":
                return self.reply(200, body)
            self.send_response(200)          # the whole answer announced, half of it sent, then gone
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *a):
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128     # http.server's 5 drops the SYNs of a burst of clients (1 s retries)
        daemon_threads = True

    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
