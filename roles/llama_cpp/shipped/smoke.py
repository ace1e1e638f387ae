# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""A new llama.cpp build answers before it serves: the host-side smoke inference.

roles/llama_cpp uploads this file (standard library only, Python 3.9+) and runs it as root on
the host after a build, before ``current`` switches to it; tests/gpu/check.py runs it on a real
GPU machine. For each run of the spec it starts the new ``llama-server`` on a free loopback port
as the rigup user, with the flags the host's instances will use, waits for ``/health``, asks for a
short real completion of a prompt long enough to go through the batched matmul (where llama.cpp's
AMX/repack crash struck: upstream #20824), and stops it. A crash (the signal named), a hang (the
timeout) or an answer with no tokens fails the run. A run that crashed on a signal that a remedy
of the spec names (a known trap, roles/llama_cpp/traps.yml) is tried again with the remedy's
server flags; when that passes, the remedy is what the host's instances get. A run with ``"rpc":
true`` (an RPC worker's, roles/rpc_worker) first starts the build's ``ggml-rpc-server`` on a
loopback port with the run's environment (the worker unit's devices), and the server offloads to
it alone; the worker's own crash is named too.

    python3 smoke.py SPEC.json       # or the spec's JSON itself as the argument
                                     # prints the result as JSON on its last line; exit 0 when it passed

The spec (JSON, written by roles/llama_cpp/build.py)::

    {"key": "...", "bin": ".../builds/ID/bin", "log": ".../builds/ID/smoke.log",
     "out": ".../builds/ID/rigup-smoke.json", "tiny": ".../smoke.gguf", "user": "rigup",
     "timeout": 120, "max_model_bytes": 17179869184,
     "runs": [{"name": "gemma", "marker": "/srv/models/gemma/.rigup-complete.json", "args": ["-ngl", "0", ...]}],
     "remedies": [{"id": "repack-crash", "signals": ["SIGSEGV", ...], "args": ["--no-repack"]}],
     "compare": {"bin": ".../builds/CURRENT/bin", "tolerance": 0.1, "rounds": 2}}

With ``compare`` (and its ``bin``: the build that serves now), once every run passed, the new build
must also be no slower than the current one (:func:`compare`: the first run's model and flags,
server sessions interleaved new, current, new, current); beyond the tolerance it fails.

A run's model is the first GGUF (or first shard) of its marker's files when the marker exists and
the files weigh at most ``max_model_bytes`` (their sizes on disk, and the marker's ``bytes``), else
the tiny model. The result, also written to ``out``: ``{"key", "ok", "seconds", "runs": [{name, model,
ok, phase, signal, exit, reason, seconds, tokens, remedy, tail}], "traps": [id], "server_args": [flag],
"compare": {...}}``.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPT = ("The smoke test of a new llama.cpp build reads this sentence, which is long enough to be "
          "computed as one batch of several dozen tokens, and then writes a few tokens of its own: ")
PREDICT = 8
_SHARD = re.compile(r"-([0-9]{5})-of-([0-9]{5})\.gguf$")
_PLAIN_FILE = re.compile(r"(?!/)(?!(?:.*/)?\.\.(?:/|$))[^\x00-\x1f\x7f\\]+")
# flags the smoke sets itself (its own port and a small context); the instance's are dropped
_OWN = {"--log-file": 1, "--api-prefix": 1, "--path": 1, "--ssl-key-file": 1, "--ssl-cert-file": 1,
        "--slot-save-path": 1, "--host": 1, "--port": 1, "-c": 1, "--ctx-size": 1, "--parallel": 1, "-np": 1, "-m": 1,
        "--model": 1, "--alias": 1, "-a": 1, "--api-key-file": 1, "--api-key": 1, "--metrics": 0,
        "--rpc": 1,   # a smoke runs alone: RPC workers are not part of it
        "--models-preset": 1, "--models-dir": 1, "--models-max": 1,   # nor a router's set: one model
        "--models-autoload": 0, "--no-models-autoload": 0}


def first_gguf(files: list[str]) -> str | None:
    """The GGUF llama-server is given: the first shard (``-00001-of-N``), else the single one that
    is no vision projector (mmproj); never a name that is not a plain relative path. The same
    choice as rigup.models.first_gguf (a unit test holds them together: this file runs alone)."""
    ggufs = sorted(f for f in files if isinstance(f, str) and f.endswith(".gguf") and _PLAIN_FILE.fullmatch(f))
    firsts = [f for f in ggufs if _SHARD.search(f) and int(_SHARD.search(f).group(1)) == 1]
    if firsts:
        return firsts[0]
    whole = [f for f in ggufs if not _SHARD.search(f) and "mmproj" not in f.rsplit("/", 1)[-1].lower()]
    return whole[0] if whole else None


def model_of(run: dict, spec: dict) -> str:
    """The model a run loads: its served model when complete on disk and small enough, else the tiny one."""
    marker = run.get("marker")
    try:   # in the model's directory, which the rigup user writes: never through a link, never a FIFO
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return spec["tiny"]
            doc = json.load(f)
        files = [str(p) for p in doc.get("files", [])]
        size = doc["bytes"]             # no size: too big to load twice
    except (TypeError, OSError, ValueError, AttributeError, KeyError, RecursionError):
        return spec["tiny"]
    if type(size) is not int or size < 0:   # the record's rule (results.marker): a JSON int, never "1_000" or true
        return spec["tiny"]
    name = first_gguf(files)
    folder = os.path.dirname(marker)
    path = os.path.normpath(os.path.join(folder, name)) if name else None
    if not path or not path.startswith(folder + os.sep):
        return spec["tiny"]
    on_disk = set_bytes(path)
    if on_disk is None or max(size, on_disk) > int(spec.get("max_model_bytes", 0)):
        return spec["tiny"]
    return path


def set_bytes(path: str) -> int | None:
    """What llama-server loads from ``path`` weighs on disk: the file's own size (fstat of it opened as
    the marker is), and with a first shard (``-00001-of-N``) every shard of its set, which llama.cpp
    opens by name; None when one is missing, a link or not a regular file. The marker's ``bytes`` is the
    rigup user's word (round re5 N23: 0 beside a 40 GiB GGUF passed a 16 GiB bound)."""
    shard = _SHARD.search(path)
    count = int(shard.group(2)) if shard else 1
    if count < 1:
        return None
    paths = [path[:shard.start()] + f"-{k:05d}-of-{count:05d}.gguf" for k in range(1, count + 1)] if shard \
        else [path]
    total = 0
    for each in paths:
        try:
            fd = os.open(each, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        total += info.st_size
    return total


def server_args(args: list[str]) -> list[str]:
    """The instance's flags without those the smoke sets itself (``--port 8081`` or ``--port=8081``)."""
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
            continue
        flag = a.split("=", 1)[0]
        if flag in _OWN:
            skip = 0 if "=" in a else _OWN[flag]
            continue
        out.append(a)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def signal_name(code: int | None) -> str | None:
    """``-11`` (Popen's killed-by-signal) or 139 (a shell's 128 + 11) -> ``SIGSEGV``."""
    if code is None or code == 0:
        return None
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return f"signal {number}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (HTTPError 3xx, its own status): a server asked here has no reason to
    send one, and following it reads another server's answer as this one's (issue 47; round 9 D2:
    a replica's /health 302 to another URL's 200 was the replica healthy, and the gateway's root
    fetched any http URL a replica named)."""

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


# no redirect, no proxy (loopback: the server the smoke started), each answer whole by its timeout: the
# copy of rigup-balancer-drain's opener (tests/unit/test_no_redirect.py holds the copies equal)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect(), _Within())
MAX_ANSWER = 1 << 20   # bytes: a completion of PREDICT tokens is a few KiB


def _request(url: str, body: dict | None, timeout: float) -> tuple[int, dict]:
    """The server's status and its JSON answer ({} when the answer is no JSON object within
    :data:`MAX_ANSWER` bytes: not JSON, cut at the size, or nested deeper than Python's stack, whose
    RecursionError ended the smoke (root's) in a traceback: issue 61, round 9 S1); the whole answer
    within ``timeout`` (OSError past it)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            status, text = r.status, r.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as e:
        e.close()
        return e.code, {}
    if len(text) > MAX_ANSWER:
        return status, {}
    try:
        doc = json.loads(text or b"{}")
    except (ValueError, RecursionError):
        return status, {}
    return status, doc if isinstance(doc, dict) else {}


def _tail(path: str, n: int = 15) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [ln[:300] for ln in lines[-n:]]


def _as_user(user: str | None) -> dict:
    """Popen arguments that run the server as ``user`` (when it exists and we are root)."""
    if not user or os.geteuid() != 0:
        return {}
    try:
        import pwd
        entry = pwd.getpwnam(user)
    except (ImportError, KeyError):
        return {}
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": os.getgrouplist(user, entry.pw_gid)}


_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def run_env(run: dict) -> dict:
    """The environment of a run's server: the smoke's own, plus the instance's (a replica's
    CUDA_VISIBLE_DEVICES); names that are not plain variable names are left out."""
    extra = run.get("env") if isinstance(run.get("env"), dict) else {}
    return {**os.environ, **{k: str(v) for k, v in extra.items() if _ENV_NAME.fullmatch(str(k))}}


def attempt(spec: dict, model: str, args: list[str], log: str, env: dict | None = None, measure: int = 0) -> dict:
    """One server start, one completion, one stop: ``{ok, phase, signal, exit, reason, seconds, tokens}``;
    with ``measure``, that many more completions of :data:`MEASURE_PREDICT` tokens once the first
    answered, and ``tps``: the best decode rate among them (``timings.predicted_per_second``)."""
    port = free_port()
    argv = [os.path.join(spec["bin"], "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "--parallel", "1", *args]
    timeout = float(spec.get("timeout", 120))
    start = time.monotonic()
    result = {"ok": False, "phase": "load", "signal": None, "exit": None, "reason": "", "tokens": 0,
              "argv": argv[1:]}
    with open(log, "ab") as out:
        out.write(("\n# rigup smoke: " + " ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd="/", start_new_session=True, env=env, **_as_user(spec.get("user")))
    base = f"http://127.0.0.1:{port}"
    cut = False
    try:
        while True:
            if proc.poll() is not None:
                break
            if time.monotonic() - start > timeout:
                result["reason"] = f"no /health 200 within {timeout:.0f} s (a hang)"
                break
            try:
                if _request(base + "/health", None, 5)[0] == 200:
                    result["phase"] = "inference"
                    break
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        if result["phase"] == "inference":
            left = max(5.0, timeout - (time.monotonic() - start))
            try:
                code, doc = _request(base + "/completion", {"prompt": PROMPT, "n_predict": PREDICT,
                                                           "temperature": 0, "ignore_eos": True,
                                                           "cache_prompt": False}, left)
                tokens = doc.get("tokens_predicted") if isinstance(doc, dict) else None
                # (a bool is no count: true was one token, round 33 S33c)
                result["tokens"] = tokens if type(tokens) is int and tokens >= 0 else 0
                if code != 200:
                    result["reason"] = f"the completion answered HTTP {code}"
                elif result["tokens"] < 1:
                    result["reason"] = "the completion had no tokens (an empty answer)"
                else:
                    result["ok"] = True
                rates = [_decode_rate(base, left) for _ in range(measure if result["ok"] else 0)]
                result["tps"] = max((r for r in rates if r), default=None)
            except socket.timeout:
                result["reason"] = f"no answer within {left:.0f} s (a hang during the first inference)"
            except (OSError, http.client.HTTPException) as e:
                result["reason"] = f"the completion failed: {type(e).__name__}: {e}"
                cut = True
    finally:
        if cut:
            try:
                proc.wait(5)            # the answer was cut: a crash in flight lands before we stop it
            except subprocess.TimeoutExpired:
                pass
        crashed = proc.poll()
        if crashed is None:
            proc.send_signal(signal.SIGINT)     # llama-server stops on SIGINT, as its unit does
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if crashed is not None:
        result["exit"] = crashed
        result["signal"] = signal_name(crashed)
        result["ok"] = False
        what = f"crashed ({result['signal']})" if result["signal"] else f"exited with status {crashed}"
        when = "during its first inference" if result["phase"] == "inference" else "while loading"
        result["reason"] = f"llama-server {what} {time.monotonic() - start:.1f} s after start, {when}"
    result["seconds"] = round(time.monotonic() - start, 2)
    return result


MEASURE_PREDICT = 32


def _decode_rate(base: str, timeout: float) -> float | None:
    """One completion of :data:`MEASURE_PREDICT` tokens: its decode rate in tokens/s, or None."""
    code, doc = _request(base + "/completion", {"prompt": PROMPT, "n_predict": MEASURE_PREDICT, "temperature": 0,
                                               "ignore_eos": True, "cache_prompt": False}, timeout)
    rate = ((doc.get("timings") or {}) if isinstance(doc, dict) else {}).get("predicted_per_second")
    return round(float(rate), 2) if code == 200 and isinstance(rate, (int, float)) and rate > 0 else None


def compare(spec: dict, model: str, args: list[str], log: str, env: dict) -> dict:
    """The new build's decode speed against the serving one's (``spec["compare"]["bin"]``), same
    model and flags, server sessions interleaved new, current, new, current (``rounds`` pairs),
    each the best of 2 completions after its first: ``{ok, ratio, new_tps, current_tps, tolerance,
    model, rounds}``; ``ok`` is False when the best new rate is below ``1 - tolerance`` of the best
    current one. When the current build gives no rate with these flags, ``skipped`` says why (ok)."""
    cmp = spec["compare"]
    tolerance, rounds = float(cmp.get("tolerance", 0.1)), max(1, int(cmp.get("rounds", 2)))
    rates: dict[str, list] = {"new": [], "current": []}
    for _ in range(rounds):
        for side, binary in (("new", spec["bin"]), ("current", cmp["bin"])):
            try:
                r = attempt({**spec, "bin": binary}, model, args, log, env, measure=2)
            except OSError as e:        # no llama-server there to start
                r = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
            if not r["ok"] or not r.get("tps"):
                why = r["reason"] or "no decode rate in its answers"
                if side == "current":
                    return {"ok": True, "skipped": f"the current build gave no rate with these flags: {why}"}
                return {"ok": False, "reason": f"the new build's measurement failed: {why}"}
            rates[side].append(r["tps"])
    ratio = round(max(rates["new"]) / max(rates["current"]), 3)
    return {"ok": ratio >= 1 - tolerance, "ratio": ratio, "new_tps": rates["new"], "current_tps": rates["current"],
            "tolerance": tolerance, "model": model, "rounds": rounds}


def rpc_server(spec: dict, env: dict, log: str):
    """The build's RPC server on a free loopback port, as the rigup user, with the worker unit's
    devices (``env``): (process, port), once its port answers (or it exited)."""
    binary = next((os.path.join(spec["bin"], b) for b in ("ggml-rpc-server", "rpc-server")
                   if os.path.exists(os.path.join(spec["bin"], b))), os.path.join(spec["bin"], "ggml-rpc-server"))
    port = free_port()
    with open(log, "ab") as out:
        out.write(f"\n# rigup smoke: {binary} -H 127.0.0.1 -p {port}\n".encode())
        out.flush()
        proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd="/", start_new_session=True, env=env,
                                **_as_user(spec.get("user")))
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, port


def _stopped(proc) -> int | None:
    """Stop ``proc`` if it runs; its exit status when it had exited by itself."""
    code = proc.poll()
    if code is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return code


_FLAG_NAME = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")


def help_flags(spec: dict) -> set[str] | None:
    """The flags the build's llama-server lists in its ``--help`` (as the rigup user), or None when
    it gives no usable list (then no flag is judged by it)."""
    try:
        done = subprocess.run([os.path.join(spec["bin"], "llama-server"), "--help"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/", timeout=60,
                              **_as_user(spec.get("user")))
    except (OSError, subprocess.SubprocessError):
        return None
    found = set(re.findall(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)", done.stdout.decode(errors="replace")))
    return found if done.returncode == 0 and len(found) >= 5 else None


def unknown_flags(args: list[str], known: set[str] | None) -> list[str]:
    """The flags of ``args`` (``--flag value`` or ``--flag=value``) that ``known`` does not list."""
    if known is None:
        return []
    names = [a.split("=", 1)[0] for a in args if _FLAG_NAME.fullmatch(a.split("=", 1)[0])]
    return sorted({n for n in names if n not in known})


def smoke(spec: dict) -> dict:
    """Every run of ``spec``, each retried once with a remedy whose signals match its crash. A run
    with a flag this build's ``--help`` does not list fails at once, naming it (a new build that
    dropped a flag, or an old one before it: the instance would not start)."""
    start = time.monotonic()
    log = spec["log"]
    open(log, "wb").close()
    runs, traps, extra = [], [], []
    known = help_flags(spec)
    for run in spec.get("runs") or [{"name": "tiny", "args": []}]:
        model = model_of(run, spec)
        args = server_args([str(a) for a in run.get("args", [])])
        unknown = unknown_flags(extra + args, known)
        if unknown:
            runs.append({"name": run.get("name", "tiny"), "model": model, "ok": False, "phase": "flags", "signal": None,
                         "exit": None, "tokens": 0, "seconds": 0, "tail": [], "argv": args,
                         "reason": f"this build's llama-server does not know {', '.join(unknown)} (not in its "
                                   "--help): the instance would not start with it"})
            break
        env = run_env(run)
        worker = None
        if run.get("rpc"):      # the worker has the devices; llama-server sees none of its own
            worker, port = rpc_server(spec, env, log)
            args += ["--rpc", f"127.0.0.1:{port}"]
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        try:
            result = _tried(spec, model, extra, args, log, env)
        finally:
            code = _stopped(worker) if worker is not None else None
        if worker is not None and code is not None:
            result.update(ok=False, signal=signal_name(code), exit=code,
                          reason=f"ggml-rpc-server {'crashed (' + signal_name(code) + ')' if signal_name(code) else f'exited with status {code}'}"
                                 f" while llama-server used it ({result['reason'] or 'the completion answered'})")
        result.update(name=run.get("name", "tiny"), model=model, tail=[] if result["ok"] else _tail(log))
        runs.append(result)
        if not result["ok"]:
            break
        if result.get("remedy"):
            traps.append(result["remedy"])
            extra += [a for a in result["remedy_args"] if a not in extra]
    doc = {"key": spec.get("key"), "ok": bool(runs) and all(r["ok"] for r in runs),
           "seconds": round(time.monotonic() - start, 2), "runs": runs, "traps": traps, "server_args": extra}
    first = (spec.get("runs") or [{}])[0]
    if doc["ok"] and (spec.get("compare") or {}).get("bin") and not first.get("rpc"):
        doc["compare"] = compare(spec, runs[0]["model"], extra + server_args([str(a) for a in first.get("args", [])]),
                                 log, run_env(first))
        doc["ok"] = doc["compare"]["ok"]
        doc["seconds"] = round(time.monotonic() - start, 2)
    out = spec.get("out")
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump(doc, f, sort_keys=True)
        os.replace(out + ".tmp", out)
    return doc


def _tried(spec: dict, model: str, extra: list[str], args: list[str], log: str, env: dict) -> dict:
    """One run: an attempt, and on a crash whose signal a remedy names, the attempt with it."""
    result = attempt(spec, model, extra + args, log, env)
    for remedy in spec.get("remedies", []):
        if result["ok"] or result["signal"] not in remedy.get("signals", []):
            continue
        again = attempt(spec, model, extra + args + list(remedy["args"]), log, env)
        if again["ok"]:
            again.update(remedy=remedy["id"], remedy_args=list(remedy["args"]), first=result["reason"])
            return again
        # the remedy did not save it: its own failure is the build's (an AMX host's first crash
        # only hid it), the first one said after it
        again["reason"] = (f"{again['reason']}, with {' '.join(remedy['args'])} (trap {remedy['id']}; "
                           f"without it: {result['reason']})")
        result = again
    return result


def main(argv: list[str]) -> int:
    # stopped from outside (the role's timeout): the finally blocks stop the servers it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if argv[1].startswith("{"):
        spec = json.loads(argv[1])
    else:
        with open(argv[1]) as f:
            spec = json.load(f)
    doc = smoke(spec)
    print(json.dumps(doc, sort_keys=True))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
