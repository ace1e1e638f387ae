#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-metrics-relay: each local llama-server instance's /metrics, for the fleet's Prometheus.

Installed by rigup (roles/metrics) as RIGUP_PREFIX/bin/rigup-metrics-relay and run by
rigup-metrics-relay.service as the service user (who may read the instances' API keys).
Standard library only (it runs on bare hosts), and shipped/throughput.py, installed beside it as
``rigup_throughput.py`` (its key rule, :func:`listener_may_read`, and the opener of every HTTP
read are that file's: one of each).

``GET /metrics/NAME`` fetches instance NAME's /metrics at its own bind address (loopback by
default), sending its API key as a bearer token when it has one (read from its key file at each
request: the key never leaves the host, and goes only to a listener whose user may read that file
already: :func:`listener_may_read`), and answers with llama-server's own series of it (the
``llamacpp:`` names, :func:`own`: no other exporter's series forged). An instance that does not
answer gives 503 and one that answers an error gives 502, so Prometheus's ``up`` for the
instance's target is 0 while it is down. Only the addresses in ``allow`` (loopback and the
monitoring hosts) are answered; everything else gets 403, any other path 404. One scrape ends
within :data:`TIMEOUT_S`, however many fetches it makes (a router's models, HAProxy's stats): they
share one deadline, and a scrape still fetching at it answers 503.

A router instance (llama-server's router mode, ``models`` in its entry: roles/llama_server's
``also``) has no /metrics of its own: the relay reads its /models, then the /metrics of each
loaded model with ``autoload=false`` (a scrape never loads a model), each sample labelled
``model``, and adds ``rigup_router_model_loaded{model}`` (1 loaded, 0 not) for each model of the
set. It also follows each router's ``/models/sse`` (the router's own event stream of each model's
status) from its start, and counts per model the loads it completed (``rigup_router_model_loads_total``:
a swap, or a first load), their seconds from ``loading`` to ``loaded``
(``rigup_router_model_load_seconds_total``, the last one's in ``rigup_router_model_last_load_seconds``)
and its unloads; ``rigup_router_events_up`` is 1 while it follows the stream (its thread alive, the
stream open; an event it cannot read is left out, never the end of the thread). A router with a
bounded queue (HAProxy on its port) adds the requests waiting there (``rigup_router_queue_waiting``,
HAProxy's own figure from its stats on loopback), the most that waited and the limit. A model the
router pins (``per_model: {M: {pinned: true}}``) is out of its set: a server of its own,
rigup-llama@NAME.M, relayed at ``GET /metrics/NAME.M`` (``model`` in its entry), its samples
labelled ``model`` as the router's models' are.

    rigup-metrics-relay [--config /etc/rigup/metrics-relay.json]
"""

from __future__ import annotations

import ctypes
import http.server
import ipaddress
import itertools
import json
import math
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request


def beside(name: str, tree: str, me: str):
    """The module of the host program ``name`` that its role installs next to this one, read by that
    file's path; else, where this program is ``me`` of a source tree (the controller, unit tests,
    tests/gpu), the tree's file ``tree`` as its package module (imported as the rest of the tree is);
    else None (the caller names the file and ends). The file beside it is run only when it is a
    regular file, not a link, owned by root or by whoever runs this, that neither its group nor others
    may write: never code another user could have written, nor a module of that name from wherever
    sys.path finds one (round 8 R1: a rigup_xid.py in the prefix's parent ran as root). Raises
    ImportError, naming the file and why, for one that is there but not so. One function, copied
    into each host program that imports another (tests/unit/test_host_programs.py)."""
    import importlib
    import os
    import stat
    import sys
    import types
    mine = os.path.abspath(__file__)
    path, module_name = os.path.join(os.path.dirname(mine), name), name.removesuffix(".py")
    top = mine[:-len(me) - 1] if mine.endswith(os.sep + me) else None
    if top is not None and not os.path.lexists(path):   # the source tree: its package's module
        if not os.path.isfile(os.path.join(top, tree)):
            return None
        if top not in sys.path:
            sys.path.insert(0, top)
        module = importlib.import_module(tree.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        if os.path.abspath(getattr(module, "__file__", None) or "") != os.path.join(top, tree):
            raise ImportError(f"{module.__name__} is {getattr(module, '__file__', None)}, not {os.path.join(top, tree)}")
        return module
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:   # ELOOP: a link
        raise ImportError(f"{path} is not run: {'a link' if os.path.islink(path) else e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise ImportError(f"{path} is not run: {stat.filemode(st.st_mode)}, uid {st.st_uid} (only a regular "
                              f"file of root's or this user's, that no group or other user may write)")
        source = f.read()
    if module_name not in sys.modules:
        module = sys.modules[module_name] = types.ModuleType(module_name)
        module.__file__ = path
        try:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            del sys.modules[module_name]
            raise
    module = sys.modules[module_name]
    if os.path.abspath(getattr(module, "__file__", None) or "") != path:
        raise ImportError(f"{module_name} is {getattr(module, '__file__', None)}, not {path}")
    return module


# The measuring and the key rule, shipped/throughput.py: on a host installed beside this program as
# rigup_throughput.py (roles/metrics installs the two), read by that file's path (beside); in the source
# tree (unit tests) rigup's own module; else this program does not run.
throughput = beside("rigup_throughput.py", "shipped/throughput.py", "roles/metrics/shipped/relay.py")
if throughput is None:
    print("rigup-metrics-relay: rigup_throughput.py is not beside it (roles/metrics installs the two): not started", file=sys.stderr)
    raise SystemExit(2)

CONFIG = "/etc/rigup/metrics-relay.json"
TIMEOUT_S = 10        # one whole scrape of an instance (every fetch it makes), not each fetch or each read
MAX_BODY = 32 << 20   # llama-server's /metrics is a few KiB: a larger answer is refused (issue 47)
PR_SET_NAME = 15     # prctl: the process name ss and ps show (preflight tells the relay's port by it)


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def allowed(config: dict) -> set[str]:
    """The client addresses answered: ``allow``, host names resolved now (IPv4-mapped too)."""
    out = set()
    for entry in config.get("allow", []):
        try:
            infos = socket.getaddrinfo(entry, None)
        except OSError:
            continue
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split("%")[0])
            out |= {str(address), f"::ffff:{address}"} if address.version == 4 else {str(address)}
    return out


def bearer(path: str | None) -> dict:
    """The Authorization header of the key in ``path`` (none without a key)."""
    if not path:
        return {}
    with open(path) as f:
        return {"Authorization": f"Bearer {f.read().strip()}"}


def left(deadline: float, what: str) -> float:
    """The seconds left to the scrape's ``deadline`` (monotonic) for ``what``; TimeoutError (an
    OSError: 503) when none are."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"{what}: the scrape's {TIMEOUT_S:g} s had passed")
    return remaining


def body(response, deadline: float) -> bytes:
    """``response``'s body, at most :data:`MAX_BODY` bytes and until ``deadline`` (monotonic: the
    opener's, whose socket ends a read at it, TimeoutError: 503), so that an instance that drips its
    answer never holds a thread of the relay. ValueError beyond either."""
    got = bytearray()
    while True:
        if deadline - time.monotonic() <= 0:
            raise ValueError(f"was still answering after the scrape's {TIMEOUT_S:g} s ({len(got)} bytes)")
        piece = response.read1(65536)
        if not piece:
            return bytes(got)
        got += piece
        if len(got) > MAX_BODY:
            raise ValueError(f"answered more than {MAX_BODY} bytes")


def label(value) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the copy of
    rigup/boundary/formats.py's prom_label this program carries: it ships alone; a unit test holds the two equal)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# llama-server's own metric names; any other series a server's /metrics holds (rigup_gpu_guard_tripped 0,
# up 1) would stand for another exporter's under the relay's target (issue 61): left out
OWN_PREFIX = "llamacpp:"
# a sample line as Prometheus's text format reads it, by hand (the host has the standard library alone):
# a name, its labels (a value escapes only \\, \" and \n), a number, an optional timestamp; a line that
# is not one (a \r inside, a label given twice) would fail the relay's whole scrape: left out
# (each part matches one way only: "1" * 8000 + "x" split between two runs of digits took seconds a
# line, holding the GIL from the relay's other scrapes; round 1 of issue 61, F05)
SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\})?'
                    r'[ \t]+(NaN|[-+]Inf|[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?))'
                    r'(?:[ \t]+(-?[0-9]{1,19}))?[ \t]*')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)",?')
HEADER = re.compile(r"# (?:HELP [a-zA-Z_:][a-zA-Z0-9_:]*(?: .*)?|TYPE [a-zA-Z_:][a-zA-Z0-9_:]* "
                    r"(?:counter|gauge|histogram|summary|untyped))")
INT64 = 2**63   # a sample's timestamp is an int64 of milliseconds to Prometheus
MAX_LINE = 4096   # a line of llama-server's /metrics is under 200 characters: a longer one is left out


def own(text: str) -> list[str]:
    """The lines of ``text`` (an instance's /metrics) of llama-server's own metrics: each sample,
    HELP and TYPE line whose metric name begins with :data:`OWN_PREFIX`; every other line left out.
    Lines end at a newline alone, as Prometheus reads them (str.splitlines also ends one at \r, \x85
    or U+2028 inside a label value). A line longer than :data:`MAX_LINE` is left out."""
    return [line for line in text.split("\n") if len(line) <= MAX_LINE
            and (line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line).startswith(OWN_PREFIX)]


def sample(line: str) -> re.Match | None:
    """``line`` as a sample Prometheus takes (:data:`SAMPLE`), or None: each label once and none of
    Prometheus's reserved ``__`` names (``{__name__="up"}`` names the series twice; llama-server
    writes none, and dropping only the label could make the sample another series'), the value
    finite or spelled ``NaN``, ``+Inf`` or ``-Inf`` (``1e400`` is out of a float's range, which
    Prometheus refuses), the timestamp an int64. Any other line fails the relay's whole scrape."""
    found = SAMPLE.fullmatch(line)
    if not found:
        return None
    names = [n for n, _ in LABEL.findall(found[2] or "")]
    if len(set(names)) < len(names) or any(n.startswith("__") for n in names):
        return None
    if found[3] not in ("NaN", "+Inf", "-Inf") and not math.isfinite(float(found[3])):
        return None
    if found[4] and not -INT64 <= int(found[4]) < INT64:
        return None
    return found


def checked(text: str) -> list[str]:
    """:func:`own`'s lines that Prometheus reads: a HELP or TYPE line (:data:`HEADER`), a sample
    (:func:`sample`); any other line would fail the relay's whole scrape."""
    return [line for line in own(text) if (HEADER.fullmatch(line) if line.startswith("# ") else sample(line))]


def labelled(text: str, model: str | None, seen: set[str]) -> list[str]:
    """Prometheus text ``text`` (:func:`checked`: its own metrics, as Prometheus reads them) with
    ``model="MODEL"`` added to each sample (a plain server's, ``model`` None: its samples as they
    are); a HELP or TYPE line of a metric in ``seen`` (already
    given) is left out, so that several models' texts join into one. The server's own ``model``
    label (two would fail the relay's whole scrape) is dropped where it names the same model, and
    kept as ``server_model`` where it names another: dropped, the server's samples of two models
    became one series twice (rerun 2 of issue 61, N16). A sample with a ``server_model`` of its own
    (the relay's name: ``{model="a"}`` and ``{server_model="a"}`` would be one series), or whose
    series is given already (in ``seen``: the server's own ``x`` and ``x{model="M"}``, one series
    to the relay) is left out: each series once, as Prometheus takes a scrape whole. A series is its
    name and its labels of a value: Prometheus drops a label whose value is empty, so ``x{model="m"}``
    and ``x{model="m",slot=""}`` are one (round 4 of issue 61, R1), as a plain server's ``x 1`` and
    ``x 2`` are (R2)."""
    out = []
    for line in checked(text):
        if line.startswith("# "):
            key = line[:7] + line[7:].split(" ", 1)[0]
            if key not in seen:
                seen.add(key)
                out.append(line)
            continue
        found = sample(line)
        own_labels = LABEL.findall(found[2] or "")
        kept = own_labels if model is None else [("model", label(model))] + [
            ("server_model" if n == "model" else n, v) for n, v in own_labels if (n, v) != ("model", label(model))]
        series = f"{found[1]} {sorted(pair for pair in kept if pair[1])}"
        if series in seen or model is not None and any(n == "server_model" for n, _ in own_labels):
            continue
        seen.add(series)
        labels = ",".join('%s="%s"' % pair for pair in kept)
        out.append(line if model is None else f"{found[1]}{{{labels}}} {found[3]}" + (f" {found[4]}" if found[4] else ""))
    return out


# the key rule of the watchdog and of bench.py's and tune.py's runs, one function (shipped/throughput.py's);
# their opener too, throughput._OPENER, for every HTTP read of the relay's: no redirect followed (an
# instance's key never goes to another origin, issue 47), no proxy, each answer whole by its timeout, its
# status line and headers too (tests/unit/test_no_redirect.py)
listener_may_read = throughput.listener_may_read


def keyed(inst: dict, path: str) -> urllib.request.Request:
    """GET ``path`` of the instance, with its key (never sent on to a redirect's origin), only where its
    listener's user may read the key already (:func:`listener_may_read`; else the request goes without)."""
    request = urllib.request.Request(inst["url"] + path)
    if inst.get("key") and not listener_may_read(inst["url"], inst["key"]):
        return request
    for header, value in bearer(inst.get("key")).items():
        request.add_unredirected_header(header, value)
    return request


def fetch(inst: dict, path: str, deadline: float | None = None) -> bytes:
    """GET ``path`` of the instance with its key, by the scrape's ``deadline`` (monotonic, shared by
    all its fetches: :func:`left`, :func:`body`; none: TIMEOUT_S from now); HTTPError, ValueError or
    OSError as urllib raises them."""
    deadline = time.monotonic() + TIMEOUT_S if deadline is None else deadline
    with throughput._OPENER.open(keyed(inst, path), timeout=left(deadline, path)) as response:
        return body(response, deadline)


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")


def _once(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:   # json keeps the last: which of the two is the server's?
            raise ValueError(f"the key {str(key)[:60]!r} twice")
        out[key] = value
    return out


def _finite(digits: str) -> float:
    value = float(digits)   # json's parse_float: JSON's number grammar (ASCII digits); 1e400 is inf to json
    if not math.isfinite(value):
        raise ValueError(f"{digits[:40]} is past a float's range")
    return value


def json_answer(raw: bytes | str):
    """A server's JSON answer, or ValueError: rigup.boundary.core.loads's rule by hand (a host
    program ships alone; tests/unit/test_metrics.py holds the two equal): NaN and Infinity, a key
    twice in one object, a number past a float's range (1e400), nesting deeper than Python's stack
    (RecursionError) refused."""
    try:
        return json.loads(raw, object_pairs_hook=_once, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("not JSON (nested deeper than this reader goes)") from None


def model_statuses(listed) -> dict[str, str | None]:
    """A router's /models (``{"data": [{"id", "status": {"value"}}]}``) as {model id: its status
    word, None when it gives none}; ValueError for any other shape (a list, a status that is text,
    an id that is no text, a model listed twice: which entry is it?), which the scrape answers 502
    (round 1 of issue 61, F01: each of these ended the handler's thread with no answer)."""
    data = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(data, list):
        raise ValueError("/models: not an object with a list of models (data)")
    out: dict[str, str | None] = {}
    for m in data:
        status = m.get("status") if isinstance(m, dict) else None
        value = status.get("value") if isinstance(status, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not isinstance(status, (dict, type(None))) \
                or not isinstance(value, (str, type(None))):
            raise ValueError(f"/models: not a model with a text id and a status object: {shown(str(m), 120)}")
        if m["id"] in out:
            raise ValueError(f"/models: the model {shown(m['id'], 120)} listed twice")
        out[m["id"]] = value
    return out


def router_metrics(inst: dict, deadline: float | None = None) -> bytes:
    """A router instance's metrics: each loaded model's, labelled, and which of the set are loaded;
    every fetch by the scrape's ``deadline`` (none: TIMEOUT_S from now)."""
    deadline = time.monotonic() + TIMEOUT_S if deadline is None else deadline
    status = model_statuses(json_answer(fetch(inst, "/models", deadline)))
    lines, seen = [], set()
    for model in inst["models"]:
        if status.get(model) == "loaded":
            try:
                text = fetch(inst, f"/metrics?model={urllib.parse.quote(model)}&autoload=false",
                             deadline).decode(errors="replace")
            except urllib.error.HTTPError:   # unloaded since /models (a swap): not loaded now
                status[model] = "unloaded"
                continue
            lines += labelled(text, model, seen)
    lines += ["# HELP rigup_router_model_loaded 1 while the model of the router's set is loaded",
              "# TYPE rigup_router_model_loaded gauge"]
    lines += [f'rigup_router_model_loaded{{model="{label(m)}"}} {int(status.get(m) == "loaded")}' for m in inst["models"]]
    return ("\n".join(lines + queue_lines(inst.get("queue"), deadline)) + "\n").encode()


WHOLE = re.compile(r"0|[1-9][0-9]{0,17}")


def whole(text: str) -> int | None:
    """A whole number written in ASCII digits (no sign, no leading zero), or None: the rule of
    rigup.boundary.numbers.whole for text (a host program has the standard library only; a
    Hypothesis test in test_metrics.py holds the two equal). str.isdigit also takes '²' and '٣',
    which would reach the exposition and fail the relay's whole scrape."""
    text = text.strip(" \t\r\n\f\v")   # ASCII blanks only, as numbers._BLANK: str.strip() also drops '\x85'
    return int(text) if WHOLE.fullmatch(text) else None


def queue_lines(queue: dict | None, deadline: float | None = None) -> list[str]:
    """A queued router's waiting requests (HAProxy's qcur of its backend, from the stats CSV on
    loopback), the most that waited (qmax) and the limit; nothing without a queue or an answer by
    the scrape's ``deadline``."""
    if not queue:
        return []
    deadline = time.monotonic() + TIMEOUT_S if deadline is None else deadline
    try:
        with throughput._OPENER.open(queue["stats"], timeout=left(deadline, "HAProxy's stats")) as response:
            rows = body(response, deadline).decode(errors="replace").splitlines()
    except (OSError, ValueError):
        return []
    header = rows[0].lstrip("# ").split(",") if rows else []
    for row in rows[1:]:
        cells = dict(zip(header, row.split(",")))
        if cells.get("pxname") == queue["backend"] and cells.get("svname") == "BACKEND":
            waiting, most = whole(cells.get("qcur") or "0"), whole(cells.get("qmax") or "0")
            if waiting is not None and most is not None:
                return ["# HELP rigup_router_queue_waiting requests waiting for the router at its HAProxy queue",
                        "# TYPE rigup_router_queue_waiting gauge", f"rigup_router_queue_waiting {waiting}",
                        "# HELP rigup_router_queue_waited_max the most that waited at once (since HAProxy started)",
                        "# TYPE rigup_router_queue_waited_max gauge", f"rigup_router_queue_waited_max {most}",
                        "# HELP rigup_router_queue_limit the queue's bound (beyond it: 429)",
                        "# TYPE rigup_router_queue_limit gauge", f"rigup_router_queue_limit {int(queue['limit'])}"]
    return []


class Swaps:
    """A router's loads, from its ``/models/sse`` events (llama-server's router broadcasts each
    model's status change as ``data: {"model", "event", "data": {"status"}}``), counted since the
    relay started (Prometheus takes a counter's reset). A load whose ``loading`` the relay did not
    see (it started meanwhile) counts without seconds."""

    RETRY_S = 5
    IDLE_S = 600    # a stream silent this long is opened again (a half-open connection ends)

    def __init__(self, inst: dict):
        self.inst, self.lock, self.up, self.loading = inst, threading.Lock(), False, {}
        self.thread: threading.Thread | None = None
        self.models = {m: {"loads": 0, "seconds": 0.0, "last": None, "unloads": 0} for m in inst["models"]}

    def start(self) -> None:
        """Follow the stream in a thread of its own (:meth:`run`), kept to tell whether it lives."""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def event(self, message: dict, now: float) -> None:
        """One event: a model of the set (text) and its status (text) in ``data``; any other shape
        (data a string, a model a list: what a router may send) is left out."""
        data = message.get("data")
        model, status = message.get("model"), data.get("status") if isinstance(data, dict) else None
        if not isinstance(model, str) or not isinstance(status, str):
            return
        with self.lock:
            if model not in self.models:
                return
            m = self.models[model]
            if status == "loading":
                self.loading[model] = now
            elif status == "loaded":
                start = self.loading.pop(model, None)
                m["loads"] += 1
                if start is not None:
                    m["last"] = round(float(now - start), 3)
                    m["seconds"] += now - start
            elif status == "unloaded":
                self.loading.pop(model, None)
                m["unloads"] += 1

    def follow(self) -> None:
        """The stream, line by line (each bounded), until it ends or fails: its status line and
        headers within IDLE_S, and each line within IDLE_S of the one before (the opener's deadline,
        moved on: the stream lasts as long as the router)."""
        with throughput._OPENER.open(keyed(self.inst, "/models/sse"), timeout=self.IDLE_S) as response:
            self.up = True
            # the opener's socket (http.client's file of it; none once an empty answer is read), its deadline
            sock = getattr(getattr(response.fp, "raw", None), "_sock", None)
            while line := response.readline(65536):
                sock.deadline = time.monotonic() + self.IDLE_S
                if not line.endswith(b"\n"):   # longer than the bound: left out whole, to its end (its tail
                    while (rest := response.readline(65536)) and not rest.endswith(b"\n"):   # is no event: R9)
                        pass
                    continue
                if line.startswith(b"data: "):
                    try:   # the relay's JSON rule: 30000 '[' raised RecursionError, which ended the follower
                        message = json_answer(line[6:])
                    except ValueError:
                        continue
                    if isinstance(message, dict):
                        self.event(message, time.monotonic())

    def run(self) -> None:
        """:meth:`follow`, again after RETRY_S whenever it ends: whatever ends it (urllib's HTTPError,
        an OSError: not a router, a bad key; a fault of the relay's own, said in the journal) never
        ends the thread."""
        self.thread = threading.current_thread()   # however it was started
        while True:
            try:
                self.follow()
            except (OSError, ValueError):
                pass
            except Exception as e:
                print(shown(f"rigup-metrics-relay: {self.inst.get('url')}/models/sse: {type(e).__name__}: {e}; "
                            f"following it again in {self.RETRY_S} s", 4000), flush=True)
            finally:
                self.up = False
            time.sleep(self.RETRY_S)

    def lines(self) -> list[str]:
        up = self.up and self.thread is not None and self.thread.is_alive()   # a thread that ended follows nothing
        out = ["# HELP rigup_router_events_up 1 while the relay follows the router's /models/sse",
               "# TYPE rigup_router_events_up gauge", f"rigup_router_events_up {int(up)}"]
        with self.lock:
            for metric, kind, text, key in (
                    ("loads_total", "counter", "loads of the model the router completed (a swap, or a first load)", "loads"),
                    ("load_seconds_total", "counter", "seconds of those loads, from loading to loaded", "seconds"),
                    ("last_load_seconds", "gauge", "seconds of the model's last load", "last"),
                    ("unloads_total", "counter", "unloads of the model (evicted, idle or stopped)", "unloads")):
                out += [f"# HELP rigup_router_model_{metric} {text}", f"# TYPE rigup_router_model_{metric} {kind}"]
                out += [f'rigup_router_model_{metric}{{model="{label(m)}"}} {round(v[key], 3)}'
                        for m, v in self.models.items() if v[key] is not None]
        return out


def handler(config: dict, clients: set[str], swaps: dict[str, Swaps] | None = None):
    class Relay(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.removeprefix("/metrics/")
            inst = config["instances"].get(name) if self.path.startswith("/metrics/") else None
            if self.client_address[0] not in clients:
                return self.answer(403, "forbidden\n")
            if inst is None:
                return self.answer(404, f"no instance {name!r} here\n")
            deadline = time.monotonic() + TIMEOUT_S   # the whole scrape's, shared by its every fetch
            try:
                if inst.get("models"):   # a router: its loaded models', and its loads counted by the relay
                    text = router_metrics(inst, deadline) + "".join(f"{line}\n" for line in
                                                          (swaps[name].lines() if name in (swaps or {}) else [])).encode()
                else:   # a server of one model; a model a router pins (``model``) labelled as the router's are
                    text = fetch(inst, "/metrics", deadline).decode(errors="replace")
                    text = "".join(f"{line}\n" for line in labelled(text, inst.get("model"), set())).encode()
                return self.answer(200, text, "text/plain; version=0.0.4; charset=utf-8")
            except urllib.error.HTTPError as e:
                return self.answer(502, f"{name}: /metrics answered {e.code}\n")
            except ValueError as e:
                return self.answer(502, f"{name}: /metrics {e}\n")
            except TimeoutError as e:   # the socket's too: the scrape's bound reached
                return self.answer(503, f"{name}: /metrics did not answer within the scrape's {TIMEOUT_S:g} s: {e}\n")
            except OSError as e:
                return self.answer(503, f"{name}: /metrics did not answer: {e}\n")
            except Exception as e:  # noqa: BLE001 (whatever a server's answer makes the relay raise, the
                # scrape gets an answer: a thread that died closed it with none, its traceback in the journal)
                return self.answer(502, f"{name}: /metrics unreadable: {type(e).__name__}: {shown(str(e), 300)}\n")

        def answer(self, code: int, body, content_type: str | None = None):
            data = body if isinstance(body, bytes) else body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type or "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_request(self, code="-", size="-"):   # the journal: failures only (a scrape every few s)
            if str(getattr(code, "value", code)) != "200":
                super().log_request(code, size)

        def log_message(self, fmt, *args):
            print(shown(f"{self.client_address[0]} {fmt % args}", 4000), flush=True)   # a client's request line

    return Relay


def main(argv: list[str]) -> int:
    path = argv[1] if argv[:1] == ["--config"] else CONFIG
    with open(path) as f:
        config = json.load(f)
    address, port = config["listen"]
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"rigup-metrics", 0, 0, 0)
    except (OSError, AttributeError):
        pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        daemon_threads = True

    swaps = {name: Swaps(inst) for name, inst in config["instances"].items() if inst.get("models")}
    for watcher in swaps.values():
        watcher.start()
    server = Server((address, port), handler(config, allowed(config), swaps))
    print(shown(f"rigup-metrics-relay: {len(config['instances'])} instance(s) on {address}:{port}"), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
