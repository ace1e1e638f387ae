#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""Tokens per second of an OpenAI-compatible endpoint (llama-server, vLLM), measured with real
completions. Python 3 standard library only, and no import of the rest of rigup: the throughput
watchdog (roles/watchdog) and the metrics relay (roles/metrics: its key rule, :func:`listener_may_read`)
install this file on hosts as ``rigup_throughput.py`` next to their scripts, bench.py sends it to
each host it measures, and tests/gpu/ runs it with a plain python3.

    python3 throughput.py sweep URL [--levels 1,4,8,16] [--max-tokens 128] [--rounds 2]
                                    [--key-file F] [--model M]     # one JSON line on stdout

One completion's rate (:func:`completion`) is llama-server's own generation rate when it reports
one (``timings.predicted_per_second``: decoding alone, as llama-bench's tg), else the completion
tokens over the request's wall time; its tokens are usage's count, at most the bytes of the text
the answer holds (none for an answer of no text: a count alone is no generation). A concurrency level (:func:`level`) runs N clients at once,
each sending ``rounds`` completions one after the other: total tok/s is every completion token
over the level's wall time, per-request tok/s the mean of the requests' own rates.
"""

from __future__ import annotations

import argparse
import grp
import http.client
import json
import math
import os
import pwd
import re
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request

PROMPT = "Write a long story about a lighthouse keeper, one sentence after another."


# rigup.boundary.numbers's rule (issue 61), by hand here: this file ships alone, with the standard
# library only; tests/unit/test_throughput.py holds figure() to numbers.number
_TEXT = re.compile(r"[+-]?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,12})?")
# the blanks taken off around a number: ASCII's alone (str.strip() takes U+0085, U+00A0 and U+2028 too:
# "350\x85" was 350 here and None to the boundary; issue 61 round 9 H1)
BLANK = " \t\r\n\f\v"


def figure(value, lo: float, hi: float) -> int | float | None:
    """A number a server answered, within ``lo``..``hi``: a JSON int or float (never a bool: True is
    1 in Python), or text of ASCII digits (an optional sign and point, no leading zero, no exponent:
    ``int()`` and ``float()`` take "١٢", "1_0" and " inf"); finite; else None."""
    if isinstance(value, str):
        value = value.strip(BLANK)
        if not _TEXT.fullmatch(value):
            return None
        value = float(value) if "." in value else int(value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    # NaN and the infinities fail the first comparison; an int of any size is compared exactly
    return value if abs(value) < 1e18 and lo <= value <= hi else None


CLAIM_SHARE = 2   # a server's own tok/s is taken up to this many times the wall clock's rate


def _rate(value) -> float | None:
    """The server's own tok/s when it is a plausible one: a JSON number, finite, positive, below 10^7
    (issue 47: a server answering "Infinity" became the watchdog's figure, a 1e308 its floor's
    match); else None, and the wall-clock rate stands."""
    rate = None if isinstance(value, str) else figure(value, 0, 1e7)
    return float(rate) if rate and rate < 1e7 else None


def _tokens(doc, max_tokens: int) -> int:
    """A completion's ``usage.completion_tokens``: a JSON int within 0..``max_tokens`` (what was asked
    for), else ValueError (issue 61: "١٢٨", true, -500 or 10**30 became the watchdog's tok/s)."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens = figure(value, 0, max_tokens) if type(value) is int else None
    if tokens is None:
        raise ValueError(f"usage.completion_tokens is not a whole number in 0..{max_tokens} "
                         f"(max_tokens): {str(value)[:40]!r}")
    return tokens


def _text(doc) -> str:
    """What a completion's answer wrote: each choice's message ``content`` and its reasoning
    (``reasoning_content``: llama-server's and vLLM's; ``reasoning``: vLLM's newer name), the texts
    alone, joined: a thinking model's tokens go to its reasoning."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    messages = [c.get("message") for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
    return "".join(text for m in messages if isinstance(m, dict)
                   for text in (m.get("content"), m.get("reasoning_content"), m.get("reasoning")) if isinstance(text, str))


def _written(tokens: int, text: str) -> int:
    """The tokens of a completion counted: the server's ``tokens`` (usage.completion_tokens), at most
    the UTF-8 bytes of the ``text`` it wrote (:func:`_text`), and none when that text is empty (a
    base model's answer of newlines alone is text: its bytes count, or a healthy server would read
    0 tok/s and be restarted). A token the server decodes shows as at least one byte of its answer (a
    byte-fallback token one byte of a character), so a count beyond the text is a claim no text
    backs: an answer of nothing, at once, "usage": {"completion_tokens": 32} read ~30,000 tok/s
    and passed the watchdog's floor (issue 61, NT1/N2). A real answer (llama-server's, vLLM's: a
    few bytes a token) keeps its count."""
    return min(tokens, len(text.encode(errors="replace")))


def _once(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:   # json keeps the last: a key twice is no answer of a server we measure
            raise ValueError(f"the key {str(key)[:60]!r} twice")
        out[key] = value
    return out


def loads(body: str | bytes):
    """A server's JSON answer parsed, or ValueError: rigup.boundary.core.loads's rule, by hand here
    (this file ships alone; tests/unit/test_throughput.py holds the two equal): a key twice in one
    object, and nesting deeper than Python's stack (json raises RecursionError, which no caller
    caught: the sweep ended in a traceback, a level's client thread died uncounted). NaN,
    Infinity and a number past a float's range (1e400: inf) are read, unlike there: the one
    figure a server may give as a float, its own rate, is
    then not believed (:func:`_rate`) and the wall clock's stands (issue 47)."""
    try:
        return json.loads(body, object_pairs_hook=_once)
    except RecursionError:
        raise ValueError("not JSON (nested deeper than this reader goes)") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (HTTPError 3xx): a server measured here has no reason to send one,
    and following it would carry the API key to another origin (issue 47)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class _Deadline(socket.socket):
    """A socket whose every send and receive waits no later than its ``deadline`` (monotonic), so
    that ``timeout`` bounds a whole answer, its status line and headers too: a socket's own
    timeout bounds each read only, and a server trickling a header line every 3 s held a 2-s wait
    18 s (round 9 D3). TimeoutError (an OSError) once the deadline has passed."""

    deadline = math.inf

    def _left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer was not whole by its deadline")
        self.settimeout(left)

    def recv_into(self, *args, **kwargs):
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._left()
        return super().sendall(*args, **kwargs)


def _connected(address: tuple, timeout: float, source=None, deadline: float = math.inf) -> _Deadline:
    """A :class:`_Deadline` socket connected to ``address`` (host, port), by the deadline."""
    failed: OSError = OSError(f"{address[0]!r} resolves to no address")
    for family, kind, proto, _, where in socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM):
        sock = _Deadline(family, kind, proto)
        sock.deadline = min(deadline, time.monotonic() + timeout)
        try:
            sock._left()
            sock.connect(where)
            return sock
        except OSError as e:
            sock.close()
            failed = e
    raise failed


class _WholeRead(http.client.HTTPConnection):
    """An HTTP connection whose ``timeout`` bounds the whole exchange (:class:`_Deadline`), from its
    start: the connect, the request, the status line, the headers and the body."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        deadline = time.monotonic() + (self.timeout if isinstance(self.timeout, (int, float)) else 60)
        self._create_connection = lambda address, timeout, source=None: _connected(address, timeout, source,
                                                                                  deadline)


class _Within(urllib.request.HTTPHandler):
    """http:// through :class:`_WholeRead`: the opener's ``timeout`` is the answer's, whole."""

    def http_open(self, req):
        return self.do_open(_WholeRead, req)


# no redirect, no proxy (the servers measured are the host's own), each answer whole by its timeout, its
# status line and headers too: every HTTP read of the watchdog, the metrics relay, bench.py's and tune.py's
# runs goes through this opener (tests/unit/test_no_redirect.py)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect(), _Within())


MAX_ANSWER = 4 << 20   # bytes: a completion of a few hundred tokens is a few KiB


def bounded_read(answer, deadline: float) -> bytes:
    """The whole body of ``answer``, read by pieces, at most :data:`MAX_ANSWER` bytes and until
    ``deadline`` (time.monotonic(): the opener's, whose socket ends a read at it, :class:`_Deadline`),
    so that a server that drips a never-ending chunked answer never holds the check (issue 47).
    TimeoutError (an OSError) past the deadline, naming the bytes read, ValueError past the size,
    http.client.IncompleteRead for an answer cut off (as ``read()`` raises it)."""
    pieces, size = [], 0
    while True:
        try:
            if time.monotonic() > deadline:
                raise TimeoutError
            piece = answer.read1(65536)
        except TimeoutError:
            raise TimeoutError(f"the answer was still coming at its deadline ({size} bytes read)") from None
        if not piece:
            if getattr(answer, "length", None):   # the connection closed before its Content-Length: cut off
                raise http.client.IncompleteRead(b"".join(pieces), answer.length)
            return b"".join(pieces)
        size += len(piece)
        if size > MAX_ANSWER:
            raise ValueError(f"the answer is larger than {MAX_ANSWER} bytes")
        pieces.append(piece)


def server_figures(url: str, key: str | None = None, timeout: float = 10, model: str | None = None) -> dict | None:
    """llama-server's /metrics at ``url`` as ``{name: figure}``: the first unlabelled sample of each
    ``llamacpp:`` name, its value a figure >= 0 in ASCII digits (:func:`figure`), else None; None
    when /metrics cannot be read. A /metrics read neither wakes a sleeping server (it answers from
    the last values) nor counts as a request for its idle timer (llama.cpp server-queue.cpp); raises
    nothing for what a server answers. ``model``: a router's model's (``autoload=false``: never
    loads it)."""
    query = f"?model={urllib.parse.quote(model)}&autoload=false" if model else ""
    request = urllib.request.Request(f"{url.rstrip('/')}/metrics{query}")
    if key:
        request.add_unredirected_header("Authorization", f"Bearer {key}")
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            text = bounded_read(answer, time.monotonic() + timeout).decode(errors="replace")
    except (OSError, ValueError, http.client.HTTPException):
        return None
    found = {}
    for line in text.split("\n"):   # the format's lines (str.splitlines() cuts at U+0085 and U+2028 too)
        name, _, value = line.partition(" ")
        if name.startswith("llamacpp:") and name not in found:
            # the sample's value: up to an ASCII blank (str.split() cuts at U+0085 and U+2028 too)
            count = figure(re.split(r"[ \t]+", value.strip(BLANK))[0], 0, math.inf)
            found[name] = None if count is None else float(count)
    return found


def tokens_served(url: str, key: str | None = None, timeout: float = 10, model: str | None = None) -> float | None:
    """``llamacpp:tokens_predicted_total`` of :func:`server_figures`, or None."""
    return (server_figures(url, key, timeout, model) or {}).get("llamacpp:tokens_predicted_total")


def model_statuses(url: str, key: str | None = None, timeout: float = 10) -> dict | None:
    """Each model of a router (llama-server's router mode) as its /models shows it now: id ->
    ``{"value": its status ("loaded", "loading", "unloaded"...), "failed": whether its last load
    failed (llama-server's ``failed``, true only), "exit_code": that load's exit code, a whole
    number or None}``; None when /models cannot be read or is of any other shape, as the metrics
    relay's reader refuses it (roles/metrics/shipped/relay.py model_statuses; tests/unit/test_throughput.py
    holds the two equal): data no list (``{"data": "abc"}`` and ``{}`` read as no model loaded, so
    the watchdog judged nothing), a model that is no map with a text id, a status neither a map nor
    null, its value no text, a model listed twice. Reading it loads nothing."""
    request = urllib.request.Request(f"{url.rstrip('/')}/models")
    if key:
        request.add_unredirected_header("Authorization", f"Bearer {key}")
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            listed = loads(bounded_read(answer, time.monotonic() + timeout))
        data = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(data, list):
            return None
        found = {}
        for m in data:
            status = m.get("status") if isinstance(m, dict) else None
            value = status.get("value") if isinstance(status, dict) else None
            if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not isinstance(status, (dict, type(None))) \
                    or not isinstance(value, (str, type(None))) or m["id"] in found:   # listed twice: which is it?
                return None
            code = (status or {}).get("exit_code")
            found[m["id"]] = {"value": value, "failed": (status or {}).get("failed") is True,
                              "exit_code": figure(code, -(2 ** 31), 2 ** 31) if type(code) is int else None}
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError, http.client.HTTPException):
        return None


def completion(url: str, key: str | None = None, max_tokens: int = 32, timeout: float = 60,
               model: str | None = None) -> dict:
    """One chat completion of ``max_tokens`` (end of sequence ignored) at ``url`` (http://host:port):
    ``{"tokens", "seconds", "tps"}``, the tokens those its text backs (:func:`_written`: none for
    an answer of no text, whatever its usage claims); raises OSError (URLError, timeout), ValueError (an answer
    that is not a completion) or http.client.HTTPException (an answer cut off or not HTTP, which
    urllib lets through: IncompleteRead and BadStatusLine are no OSError)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": False, **({"model": model} if model else {})}
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    if key:
        request.add_unredirected_header("Authorization", f"Bearer {key}")
    started = time.monotonic()
    with _OPENER.open(request, timeout=timeout) as answer:
        doc = loads(bounded_read(answer, started + timeout))
    seconds = time.monotonic() - started
    tokens = _written(_tokens(doc, max_tokens), _text(doc))
    timings = doc.get("timings")
    reported = _rate(timings.get("predicted_per_second") if isinstance(timings, dict) else None)
    clock = tokens / seconds if seconds > 0 else 0.0   # the tokens counted over this client's own clock
    # the server's decode rate leaves out the prompt and HTTP, a small share of the time: a claim beyond
    # CLAIM_SHARE x the clock's is no figure of this completion (round 1 of issue 61, G09: a server that
    # slept 2 s and gave 0 tokens claimed 9999999 tok/s and passed the watchdog's floor)
    tps = reported if reported and tokens and reported <= CLAIM_SHARE * clock else clock
    return {"tokens": tokens, "seconds": round(seconds, 4), "tps": round(tps, 2)}


def level(url: str, concurrency: int, key: str | None = None, max_tokens: int = 128, rounds: int = 2,
          timeout: float = 300, model: str | None = None) -> dict:
    """``concurrency`` clients at once, ``rounds`` completions each: ``{"concurrency", "requests",
    "failed", "tokens", "seconds", "total_tps", "per_request_tps"}``."""
    results, failures, lock = [], [], threading.Lock()

    def client():
        for _ in range(rounds):
            try:
                one = completion(url, key, max_tokens, timeout, model)
            except Exception as e:  # noqa: BLE001 (whatever a server makes it raise is this request's failure,
                one = None          # counted: a thread that died left the level at "failed 0")
                with lock:
                    failures.append(str(e)[:300] or type(e).__name__)
            if one:
                with lock:
                    results.append(one)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    tokens = sum(r["tokens"] for r in results)
    return {"concurrency": concurrency, "requests": len(results), "failed": len(failures),
            "errors": sorted(set(failures))[:3], "tokens": tokens, "seconds": round(seconds, 3),
            "total_tps": round(tokens / seconds, 2) if seconds > 0 else 0.0,
            "per_request_tps": round(sum(r["tps"] for r in results) / len(results), 2) if results else 0.0}


def sweep(url: str, levels: list[int], key: str | None = None, max_tokens: int = 128, rounds: int = 2,
          model: str | None = None) -> list[dict]:
    """:func:`level` at each concurrency of ``levels``, in order, after one warm-up completion."""
    completion(url, key, min(max_tokens, 8), 300, model)
    return [level(url, n, key, max_tokens, rounds, model=model) for n in levels]


def listener_may_read(url: str, key_file: str) -> bool:
    """Whether every socket listening on ``url``'s TCP port (the kernel's tables, /proc/net/tcp and tcp6,
    readable by any user) is owned by a user who may read ``key_file`` already: root, its owner, or one
    its mode lets read it (its group's members); False when none listens or either cannot be read. A
    key goes only to such a listener (issue 61, round 5 C1: a serving unit down, the guard's trip or a
    restart loop, left its port to any local user, who collected the key). plays/fleet.py's SERVING has
    the shell's rule; the watchdog and the metrics relay use this one (this file installed beside each)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        st = os.stat(key_file)
    except (OSError, ValueError):
        return False
    uids = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for cols in rows:
            local = cols[1].rpartition(":")[2] if len(cols) > 7 else ""
            if cols[3:4] == ["0A"] and re.fullmatch(r"[0-9A-F]{4}", local) and int(local, 16) == port \
                    and re.fullmatch(r"[0-9]{1,10}", cols[7]):
                uids.add(int(cols[7]))

    def may(uid: int) -> bool:
        if uid in (0, st.st_uid) or st.st_mode & 0o004:
            return True
        if not st.st_mode & 0o040:
            return False
        try:
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return user.pw_gid == st.st_gid or user.pw_name in grp.getgrgid(st.st_gid).gr_mem
    try:
        return bool(uids) and all(may(uid) for uid in uids)
    except (KeyError, OSError):
        return False


def read_key(path: str | None) -> str | None:
    """The API key in ``path`` (a llama-server key file: the key alone; vLLM's env file: the part
    after ``VLLM_API_KEY=``), or None without a path."""
    if not path:
        return None
    with open(path) as f:
        text = f.read().strip()
    return text.split("VLLM_API_KEY=", 1)[-1].strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="throughput", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep", help="tok/s at each concurrency level, as one JSON line")
    s.add_argument("url")
    s.add_argument("--levels", default="1,4,8,16")
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--key-file")
    s.add_argument("--model")
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.levels.split(",") if n.strip()]
    doc = {"url": args.url, "max_tokens": args.max_tokens, "rounds": args.rounds}
    if args.key_file and not listener_may_read(args.url, args.key_file):   # bench.py's and tune.py's runs
        doc["error"] = (f"the listener on {args.url}'s port is not of a user who may read {args.key_file}: "
                        "the key is not sent to it (the unit down, another user's process on its port?)")
        print(json.dumps(doc))
        return 1
    try:
        doc["levels"] = sweep(args.url, levels, read_key(args.key_file), args.max_tokens, args.rounds, args.model)
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:   # the endpoint down, refusing, or not OpenAI's
        doc["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(doc))
    return 0 if "levels" in doc else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
