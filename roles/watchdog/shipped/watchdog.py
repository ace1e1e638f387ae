#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-watchdog: the host side of roles/watchdog, run by rigup-watchdog.timer. Python 3
standard library only (it runs on bare hosts); the measuring is shipped/throughput.py, installed
next to this script as rigup_throughput.py.

    rigup-watchdog --config /etc/rigup/watchdog.json check

Each check sends one short real completion to every server of every watched llama-server
instance: the instance's own unit ``rigup-llama@NAME`` at its port, or each replica's
``rigup-llama@NAME-K`` at 127.0.0.1:port+1+K (a model a router pins is an instance ``NAME.M`` of
the config, its unit ``rigup-llama@NAME.M``: a server of one model, judged as any). Its floor is
the instance's ``floor`` (``min_tokens_per_s``) or, when that is null, :data:`DEFAULT_FLOOR_SHARE` of the tok/s the health
gate measured at the server's last (re)start (``gate_record``, written by rigup/gate.py; a server
without one is not judged). A router (``models``) is timed on the model it has loaded; a model of
its set whose load failed (its /models) in ``bad_checks`` checks in a row is named and the router
restarted, once until that model has loaded (failing again: named, an escalation, no restart).
A server below its floor, or without a usable answer (none within the
timeout, an HTTP error, an answer cut off or malformed: ``usage.completion_tokens`` null or
missing, not JSON), counts one bad check; ``bad_checks`` in a row restart its unit (an instance
with ``sleep_idle_s`` is judged only when it served since the last check, or when requests wait
with nothing generated since: wedged, a bad check), with the reason in the journal (priority crit) and in the metrics file
(``rigup_watchdog_restarts_total{llama_instance}``, the tok/s that caused it). Still
``bad_checks`` in a row below after that restart: escalation, as HiveOS's watchdog does: the
reason in the journal, ``rigup_watchdog_escalations_total``, and with ``reboot`` a reboot of the
host, at most ``max_reboots`` a day (``reboots_file`` keeps the day's count across the reboot);
without it, with the budget spent, or when the server has not passed its gate since its last
start (a server that never came up is not a reason to reboot), the unit is restarted again.

A server is not judged after a (re)start (by anyone: the watchdog, systemd, a converge) until it
passed its gate again or ``grace_s`` passed since the start (systemd's ActiveEnterTimestamp and
ExecMainStartTimestamp, the later). Passed its gate: rigup's health gate recorded a completion
after that start (the gate record's ``at``), or this watchdog got a whole completion from it
since (``passed_at`` in its state: nothing runs rigup's gate after the watchdog's own restart);
that first completion is the gate's, not judged. Until then its answers (HTTP 503 "Loading
model", a refused connection, anything) are "not judged", never bad checks.

Each server is judged on its own: whatever one answers, or fails to, is one sample of that
server, never the end of the check. Every systemctl call has a timeout (``command_timeout_s``);
one that fails or hangs is logged and counted for its server
(``rigup_watchdog_command_failures_total``), which is then not judged (its state unknown) or not
restarted this time. A server whose unit is not active is left alone (the GPU guard, an operator
or a failed start stopped it: LlamaServerDown says so). With ``maintenance`` (rigup_maintenance)
it checks, restarts and reboots nothing, and says so. State (bad checks in a row, restarts, the
last start seen, the watchdog's own gate passes) is kept in ``state_file`` across runs, written
whatever happens (also on SIGTERM: the unit's timeout), each file replaced whole by a rename.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse


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
# rigup_throughput.py (roles/watchdog installs the two), read by that file's path (beside); in the source
# tree (unit tests) rigup's own module; else this program does not run.
throughput = beside("rigup_throughput.py", "shipped/throughput.py", "roles/watchdog/shipped/watchdog.py")
if throughput is None:
    print("rigup-watchdog: rigup_throughput.py is not beside it (roles/watchdog installs the two): not run", file=sys.stderr)
    raise SystemExit(2)

# The floor of an instance without min_tokens_per_s: this share of the gate's tok/s at its start.
DEFAULT_FLOOR_SHARE = 0.5
# Seconds after a (re)start a server is not judged unless it passed its gate (watchdog_grace_s).
DEFAULT_GRACE_S = 300
# Seconds one systemctl call may take (the config's command_timeout_s).
COMMAND_TIMEOUT_S = 30
# A unit's last start: the later of these (systemd's CLOCK_MONOTONIC microseconds; 0: none).
STARTS = ("ActiveEnterTimestampMonotonic", "ExecMainStartTimestampMonotonic")


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def log(priority: int, text: str) -> None:
    """A journal line with its syslog priority (systemd reads the <N> prefix)."""
    print(shown(f"<{priority}>{text}", 4000), flush=True)


# A record's largest file (the state of a few dozen servers is a few KiB), and the seconds a time in
# a record may be ahead of this clock (another writer's, a clock stepped back) before it is refused.
MAX_RECORD = 1 << 20
SKEW_S = 300
# A server's tok/s, at most (shipped/throughput.py's bound on a server's own figure).
MAX_TPS = 1e7
MAX_COUNT = 10 ** 12
_UNIT = re.compile(r"rigup-llama@[A-Za-z0-9_.:-]{1,200}\.service")


class Unreadable(ValueError):
    """A record that is not one of ours (the reader's safe choice follows)."""


def load(path: str, default):
    """The JSON of ``path``; ``default`` when it is not there or not JSON of a sane size and depth
    (RecursionError: nested too deep; ValueError: not JSON, an int over Python's digit limit)."""
    try:
        return read_record(path)
    except (FileNotFoundError, Unreadable):
        return default


def read_record(path: str):
    """The JSON of ``path``; FileNotFoundError when it is not there, :class:`Unreadable` (why) when
    it cannot be read or is not JSON of at most MAX_RECORD characters."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_RECORD + 1)
        if len(text) > MAX_RECORD:
            raise Unreadable(f"larger than {MAX_RECORD} characters")
        return json.loads(text)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, RecursionError) as e:
        raise Unreadable(f"{type(e).__name__}: {e}") from None


def figure(value, lo: float, hi: float, where: str) -> float | int:
    """A number of a record: shipped/throughput.py's figure (a JSON int or float, never a bool, finite,
    within ``lo``..``hi``; the boundary's rule, tests/unit/test_host_records.py), never text."""
    got = None if isinstance(value, str) else throughput.figure(value, lo, hi)
    if got is None:
        raise Unreadable(f"{where}: not a number in {lo:g}..{hi:g}: {shown(value, 40)}")
    return got


def moment(value, where: str) -> float:
    """A time of a record (Unix seconds): not before 1970, not ahead of this clock by SKEW_S."""
    return figure(value, 0, time.time() + SKEW_S, where)


def replace(path: str, text: str, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write ``path`` atomically: a new temp file beside it (a random dot-name, O_EXCL|O_NOFOLLOW: a
    link or file another user planted in the directory is never opened), chmod'ed to ``mode`` (None:
    the umask's), then renamed over ``path`` (a rename replaces a link there, never follows it); the
    temp file never outlives a failure. Each host program carries this copy (it ships alone)."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def command(argv: list[str], config: dict) -> tuple[bool, str]:
    """Run ``argv`` within the config's ``command_timeout_s``: (True, its stdout), or (False, why
    it failed: its status and stderr, or that it hung and was killed, with anything it started)."""
    limit = config.get("command_timeout_s", COMMAND_TIMEOUT_S)
    shown = " ".join(argv)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as e:
        return False, f"`{shown}` could not run: {e}"
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        return False, f"`{shown}` did not return within {limit:g} s (killed)"
    if proc.returncode != 0:
        return False, f"`{shown}` failed with status {proc.returncode}: {(err or out).strip()[:300]}"
    return True, out


def systemctl(*args: str, config: dict) -> tuple[bool, str]:
    return command(["systemctl", *args], config)


def servers(name: str, inst: dict, units: list[str]) -> list[dict]:
    """The servers of instance ``name`` among the host's active ``units``: its own unit at its
    address, or its replicas (NAME-K at 127.0.0.1:port+1+K)."""
    found = []
    for unit in units:
        m = re.fullmatch(rf"rigup-llama@{re.escape(name)}(?:-([0-9]+))?\.service", unit)
        if m and m.group(1) is None:
            found.append({"server": name, "unit": unit, "url": inst["url"]})
        elif m:
            found.append({"server": f"{name}-{m.group(1)}", "unit": unit,
                          "url": f"http://127.0.0.1:{inst['port'] + 1 + int(m.group(1))}"})
    return found


def active_units(config: dict, state: dict) -> list[str]:
    """The host's active serving units; when systemctl cannot list them (it failed or hung),
    those of the last run's state, each then asked on its own whether it is active."""
    ok, out = systemctl("list-units", "--state=active", "--plain", "--no-legend", "rigup-llama@*", config=config)
    if ok:
        return [line.split()[0] for line in out.splitlines() if line.strip()]
    known = sorted({r["unit"] for r in state.values() if isinstance(r.get("unit"), str)})
    log(3, f"rigup-watchdog: the serving units could not be listed: {out}; checking the {len(known)} "
           "of the last run")
    return known


def _int(value) -> int:
    """systemctl's whole number (a monotonic time), by the boundary's rule (throughput.figure: int()
    took "١٢", "1_0" and " 12\x85"); else 0."""
    got = throughput.figure(value, 0, 10**18) if isinstance(value, str) else None
    return got if type(got) is int else 0


def unit_state(unit: str, config: dict) -> tuple[dict | None, str]:
    """``{"active": bool, "started": Unix time of its last start or None}`` of ``unit`` from
    ``systemctl show``, or (None, why systemctl failed)."""
    ok, out = systemctl("show", "-p", "ActiveState", *(a for p in STARTS for a in ("-p", p)), unit, config=config)
    if not ok:
        return None, out
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if "ActiveState" not in props:
        return None, f"`systemctl show {unit}` said nothing of it: {out.strip()[:200]!r}"
    mono = max(_int(props.get(p)) for p in STARTS)
    started = time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - mono / 1e6) if mono > 0 else None
    return {"active": props["ActiveState"] == "active", "started": started}, ""


def gate_record(path: str) -> dict:
    """The health gate's record (rigup/gate.py: ``{"unit", "tps", "at"}``) as ``{"tps", "at"}``: tok/s
    in (0, MAX_TPS], a time not ahead of this clock; :class:`Unreadable` otherwise."""
    doc = read_record(path)
    if not isinstance(doc, dict):
        raise Unreadable("not a JSON object")
    tps = figure(doc.get("tps"), 0, MAX_TPS, "tps")
    if not tps > 0:
        raise Unreadable("tps: not above 0")
    return {"tps": float(tps), "at": float(moment(doc.get("at"), "at"))}


def gate_of(server: dict, config: dict) -> dict:
    """The health gate's record of the server's unit (``{"tps", "at"}``), {} without one or when it
    does not read (no floor from it, and not "passed its gate"), said in the journal."""
    path = config["gate_record"].format(server["unit"])
    try:
        return gate_record(path)
    except FileNotFoundError:
        return {}
    except Unreadable as e:
        log(4, f"rigup-watchdog: {server['unit']}: the gate record {path} is not one (ignored: no floor from it, "
               f"no gate passed): {e}")
        return {}


def floor_of(server: dict, inst: dict, config: dict) -> float | None:
    """The server's floor: the instance's min_tokens_per_s, else DEFAULT_FLOOR_SHARE of the tok/s
    the health gate recorded at its unit's last (re)start; None without either. Each is read as a
    figure in 0..MAX_TPS (:func:`figure`): a configured floor that is none (a YAML .inf or .nan, a
    negative, text) judges nothing, said in the journal, where it would be below every tok/s and
    restart the unit at each ``bad_checks``-th check (issue 65)."""
    if inst["floor"] is not None:
        try:
            return figure(inst["floor"], 0, MAX_TPS, "min_tokens_per_s")
        except Unreadable as e:
            log(4, f"rigup-watchdog: {server['server']}: not judged: its floor is none ({e})")
            return None
    tps = gate_of(server, config).get("tps")
    return round(DEFAULT_FLOOR_SHARE * tps, 3) if tps else None


def passed_gate(server: dict, record: dict, config: dict, started: float | None) -> bool:
    """Whether the server passed its gate since its last start (``started``): rigup's gate
    recorded a completion after it (its record's ``at``), or this watchdog got a whole
    completion from it since (``passed_at``). A start systemd cannot date: any pass counts.
    Both times are read in bounds (gate_record, state_record): none is ahead of this clock."""
    times = [t for t in (gate_of(server, config).get("at"), record.get("passed_at")) if t is not None]
    return any(t > started for t in times) if started is not None else bool(times)


def judge(server: dict, floor: float, tps: float | None, record: dict, config: dict,
          problem: str | None = None) -> str | None:
    """Update ``record`` (bad, last_tps, after_restart) with one check (``problem``: what was
    wrong with an answer that gave no tok/s); the reason to act (``bad_checks`` in a row below
    ``floor``), or None."""
    record["last_tps"] = tps
    k = config["bad_checks"]
    if tps is not None and tps >= floor:
        log(6, f"rigup-watchdog: {server['server']}: {tps:.1f} tok/s, at or above its floor {floor:g} tok/s")
        record["bad"], record["after_restart"] = 0, False
        return None
    record["bad"] = record.get("bad", 0) + 1
    seen = f"{tps:.1f} tok/s" if tps is not None else problem or "no answer"
    log(4, f"rigup-watchdog: {server['server']}: {seen}, below its floor {floor:g} tok/s "
           f"({record['bad']} of {k} checks in a row)")
    if record["bad"] < k:
        return None
    record["bad"] = 0
    return f"{k} checks in a row below the floor of {floor:g} tok/s (last: {seen})"


def _error_message(e: urllib.error.HTTPError) -> str:
    """The message of an HTTP error's body (llama-server: ``{"error": {"message": "Loading
    model"}}``), else its first characters; "" when it cannot be read."""
    try:
        body = e.read(2000).decode("utf-8", "replace")
    except Exception:       # a body cut off: the status is what counts
        return ""
    try:   # throughput.loads: nesting past the stack is a ValueError (3000 '[' raised RecursionError, which
        # made an answer that is a bad check "the check failed", so that server was never restarted)
        error = throughput.loads(body).get("error")
        return str(error.get("message") if isinstance(error, dict) else error or "")[:200]
    except (ValueError, AttributeError):
        return body.strip()[:200]


def failure(e: BaseException, config: dict) -> tuple[str, str]:
    """What a completion that raised ``e`` says: ("starting", why) for what a server that is still
    starting answers (HTTP 503, llama-server's "Loading model"; a refused connection), else
    ("bad", why)."""
    if isinstance(e, urllib.error.HTTPError):
        message = _error_message(e)
        return ("starting" if e.code == 503 else "bad"), f"HTTP {e.code}" + (f" ({message})" if message else "")
    reason = e.reason if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException) else e
    if isinstance(reason, ConnectionRefusedError):
        return "starting", "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "bad", f"no answer within {config['timeout_s']} s"
    if isinstance(reason, (ConnectionError, http.client.HTTPException)):
        return "bad", f"the answer was cut off: the connection closed mid-answer ({type(reason).__name__}: {reason})"
    if isinstance(e, json.JSONDecodeError):
        return "bad", f"an answer that is not JSON ({e})"
    if isinstance(e, (ValueError, KeyError, TypeError, AttributeError, IndexError)):
        return "bad", f"a malformed answer (no usable usage.completion_tokens: {type(e).__name__}: {e})"
    if isinstance(e, OSError):
        return "bad", f"no answer: {e}"
    return "bad", f"the check failed: {type(e).__name__}: {e}"


listener_may_read = throughput.listener_may_read   # shipped/throughput.py's, installed beside


def _key(inst: dict, server: dict) -> str | None:
    """The instance's key for a request to ``server``'s URL: None when its file cannot be read, or when
    a listener there is of a user who may not read it (:func:`listener_may_read`: the key is not sent)."""
    try:
        key = throughput.read_key(inst.get("key"))
    except OSError:
        return None
    if key and not listener_may_read(server["url"], inst["key"]):
        log(4, f"rigup-watchdog: {server['server']}: a process of a user who may not read its key listens at "
               f"{shown(server['url'])}: its key is not sent")
        return None
    return key


def router_model(server: dict, inst: dict, statuses: dict | None) -> tuple[bool, str | None]:
    """A router's model to time, from its /models (``statuses``: :func:`throughput.model_statuses`):
    (False, None) when it has none of its set loaded (not judged: a check must not load one);
    (True, None) when /models could not be read (the completion then says what is wrong); else
    (True, the first loaded model of its set)."""
    if statuses is None:
        return True, None
    model = next((m for m in inst["models"] if (statuses.get(m) or {}).get("value") == "loaded"), None)
    return model is not None, model


def failing_model(server: dict, models: list[str], statuses: dict | None, record: dict,
                  config: dict) -> tuple[str | None, bool]:
    """A model of a router's set (``models``) whose last load failed (its /models: ``failed``), looked at twice:
    (why to act, whether to restart). ``bad_checks`` checks in a row that find the same model failed:
    named, and its router restarted (a fresh router has no failed load; ``failing_restarts``
    counts it); failing again after that restart (it, or another of the set), before the model named
    last ever loaded: named at priority crit and counted (an escalation), never restarted again (a
    model whose file or flags fail would restart the router, and the models it serves, in a loop)
    until that model has loaded once."""
    if statuses is None:
        return None, False
    if record.get("failing_model") in statuses and statuses[record["failing_model"]]["value"] == "loaded":
        record["failing_restarts"], record["failing_model"] = 0, None     # it loaded: a new failure is a new one
    failed = [(m, statuses[m]) for m in models if m in statuses and statuses[m]["failed"]
              and statuses[m]["value"] != "loaded"]   # loaded since: that failure is over
    if not failed:
        record["failing"] = 0
        return None, False
    model, status = failed[0]
    record["failing"] = record.get("failing", 0) + 1 if record.get("failing_model") == model else 1
    record["failing_model"] = model   # failing_restarts stays: another model's failure after the restart is bounded too
    code = f" (exit code {status['exit_code']})" if status["exit_code"] is not None else ""
    k = config["bad_checks"]
    if record["failing"] < k:
        log(4, f"rigup-watchdog: {server['server']}: model {shown(model, 100)} failed to load{code} "
               f"({record['failing']} of {k} checks in a row)")
        return None, False
    record["failing"] = 0
    if record.get("failing_restarts", 0) >= 1:
        count(record, "escalations")
        record["escalated_at"] = round(time.time(), 3)
        log(2, f"rigup-watchdog: {server['server']}: model {shown(model, 100)} still fails to load{code} after its "
               "restart by the watchdog: not restarting it again until the model has loaded once")
        return None, False
    return f"model {shown(model, 100)} failed to load{code} in {k} checks in a row", True


TOKENS, DECODES = "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total"
WAITING = ("llamacpp:requests_processing", "llamacpp:requests_deferred")


def idle(server: dict, inst: dict, record: dict, model: str | None = None) -> tuple[bool, str | None]:
    """A server that may sleep (its instance's ``sleep_idle_s``), from its /metrics (which neither
    wakes it nor resets its idle timer): (whether it is judged, why it is wedged or None). Its
    tokens served and decodes where the last check left them: nothing happened since. Then with
    no request waiting (requests processing or deferred) it is idle, not judged (a completion would
    wake it, or keep it from sleeping, and its load would look like a slow server); with requests
    waiting it is wedged (a bad check, judged without a completion: one would only wait too). A
    long generation decodes on (llama-server counts a request's tokens when it ends): not wedged."""
    seen = throughput.server_figures(server["url"], _key(inst, server), model=model) or {}
    served, decodes = seen.get(TOKENS), seen.get(DECODES)
    waiting = sum(seen.get(name) or 0 for name in WAITING)
    if served is not None and served == record.get("served") and decodes == record.get("decodes"):
        if waiting:
            return True, (f"wedged: {waiting:g} requests waiting and no token generated since the last check "
                          f"(tokens served {served:g})")
        log(6, f"rigup-watchdog: {server['server']}: not judged: no request served since the last check "
               "(it may be asleep: sleep_idle_s)")
        return False, None
    record["served"], record["decodes"] = served, decodes
    return True, None


def measure(server: dict, inst: dict, config: dict, model: str | None = None) -> dict:
    """One sample of the server: ``{"tps"}`` from a whole completion (of ``model``: a router's loaded
    one), else ``{"tps": None, "kind": "starting" or "bad", "why"}`` (:func:`failure`); never raises
    for what a server answers."""
    try:
        throughput.read_key(inst.get("key"))
    except OSError as e:
        return {"tps": None, "kind": "bad", "why": f"its key file cannot be read: {e}"}
    key = _key(inst, server)
    try:
        return {"tps": throughput.completion(server["url"], key, config["max_tokens"], config["timeout_s"], model)["tps"]}
    except Exception as e:
        kind, why = failure(e, config)
        return {"tps": None, "kind": kind, "why": why}


def label(value) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the copy of
    rigup/boundary/formats.py's prom_label this program carries: it ships alone; a unit test holds the two equal)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(records: dict, floors: dict, config: dict, now: float, reboots: dict) -> str:
    """rigup_watchdog_* in the text format, labelled llama_instance (the server: NAME or NAME-K; as
    roles/metrics labels llama-server's own series: ``instance`` is Prometheus's target label)."""
    series = [("tokens_per_second", "tok/s of the last check (absent: no answer)", "last_tps"),
              ("floor_tokens_per_second", "The server's floor (min_tokens_per_s, or half the gate's tok/s)", "floor"),
              ("bad_checks", "Checks in a row below the floor", "bad"),
              ("restarts_total", "Restarts by the watchdog (counter)", "restarts"),
              ("last_restart_tokens_per_second", "tok/s of the check that restarted it (0: no answer)",
               "restart_tps"),
              ("last_restart_timestamp_seconds", "When the watchdog last restarted it", "restarted_at"),
              ("escalations_total", "Times it was still below its floor after a restart (counter)", "escalations"),
              ("last_escalation_timestamp_seconds", "When it was last still below after a restart", "escalated_at"),
              ("failed_checks_total", "Checks without a usable answer: none, an HTTP error, cut off, malformed "
                                      "(counter)", "failed"),
              ("unjudged_checks_total", "Checks not judged: started less than watchdog_grace_s ago and not "
                                        "through its gate since (counter)", "unjudged"),
              ("starting", "1 while it is not judged (in its grace after a start, not through its gate)", "starting"),
              ("last_start_timestamp_seconds", "When its unit last started (systemd)", "started"),
              ("command_failures_total", "systemctl calls for it that failed or timed out (counter)",
               "command_failures")]
    lines = []
    for metric, text, field in series:
        kind = "counter" if metric.endswith("_total") else "gauge"
        rows = [(s, {**r, "floor": floors.get(s)}.get(field)) for s, r in sorted(records.items())]
        rows = [(s, v) for s, v in rows if throughput.figure(v, -1e18, 1e18) is not None and not isinstance(v, str)]
        if rows:
            lines += [f"# HELP rigup_watchdog_{metric} {text}", f"# TYPE rigup_watchdog_{metric} {kind}"]
            lines += [f'rigup_watchdog_{metric}{{llama_instance="{label(s)}"}} {v}' for s, v in rows]
    for metric, text, value in (("maintenance", "1 while rigup_maintenance holds the watchdog", int(config["maintenance"])),
                                ("last_run_timestamp_seconds", "When the watchdog last ran", round(now, 3)),
                                ("interval_seconds", "The watchdog's period", config["interval_s"]),
                                ("grace_seconds", "Seconds after a start a server is not judged unless it passed "
                                                  "its gate", config.get("grace_s", DEFAULT_GRACE_S)),
                                ("reboots_today", "Reboots by the watchdog today", reboots["count"]),
                                ("max_reboots", "Reboots allowed a day (0 with rigup_watchdog_reboot false)",
                                 config["max_reboots"] if config["reboot"] else 0)):
        lines += [f"# HELP rigup_watchdog_{metric} {text}", f"# TYPE rigup_watchdog_{metric} gauge",
                  f"rigup_watchdog_{metric} {value}"]
    return "\n".join(lines) + "\n"


def count(record: dict, field: str) -> None:
    record[field] = record.get(field, 0) + 1


def restart(server: dict, record: dict, why: str, config: dict) -> bool:
    """Restart the server's unit (not waiting for its start), saying why; count it; whether systemctl
    took it. A restart systemctl refused or did not answer: logged, counted as a command failure,
    and asked again at the next bad check."""
    log(2, f"rigup-watchdog: {server['server']}: {why}; restarting {server['unit']}")
    asked = time.time()         # before: its new start is later, however soon systemd runs the job
    ok, out = systemctl("restart", "--no-block", server["unit"], config=config)
    if not ok:
        log(3, f"rigup-watchdog: {server['server']}: restart of {server['unit']} failed: {out}")
        count(record, "command_failures")
        record["bad"] = config["bad_checks"] - 1
        return False
    count(record, "restarts")
    record["restart_tps"] = record.get("last_tps") or 0
    record["restarted_at"] = round(asked, 3)
    record["after_restart"] = True
    return True


def escalate(server: dict, record: dict, why: str, config: dict, reboots: dict, gated: bool) -> tuple[bool, str]:
    """Still below after the watchdog's restart: say so, count it; (True, the reason) to reboot the
    host when ``reboot`` is on, the server passed its gate since its last start (``gated``: its
    bad checks are a running server's, not one that never came up) and the day's budget allows,
    else (False, why the unit is restarted again instead)."""
    count(record, "escalations")
    record["escalated_at"] = round(time.time(), 3)
    record["after_restart"] = False
    reason = f"{server['server']}: still {why} after its restart by the watchdog"
    log(2, f"rigup-watchdog: {reason}")
    if not config["reboot"]:
        return False, "not rebooting (rigup_watchdog_reboot is false)"
    if not gated:
        return False, "not rebooting (it has not passed its gate since its last start: no whole completion since)"
    if reboots["count"] >= config["max_reboots"]:
        return False, f"not rebooting ({reboots['count']} of {config['max_reboots']} reboots today already)"
    return True, reason


def reboots_today(config: dict) -> dict:
    """The watchdog's reboots of the host's local day: {"day", "count"} (none kept, or a new day: 0).
    A file that does not read (not JSON, a count not a whole number in 0..MAX_COUNT, a day not
    text): no reboot left today (count: max_reboots), said in the journal."""
    day, path = time.strftime("%Y-%m-%d"), config["reboots_file"]
    try:
        kept = read_record(path)
        if not isinstance(kept, dict) or not isinstance(kept.get("day"), str):
            raise Unreadable("not {\"day\": text, \"count\": a whole number}")
        count = figure(kept.get("count", 0), 0, MAX_COUNT, "count")
        if not isinstance(count, int):
            raise Unreadable(f"count: not a whole number: {shown(count, 40)}")
    except FileNotFoundError:
        return {"day": day, "count": 0}
    except Unreadable as e:
        spent = config.get("max_reboots", 0)
        spent = spent if isinstance(spent, int) and not isinstance(spent, bool) and spent > 0 else 0
        log(3, f"rigup-watchdog: the count of reboots in {path} does not read ({e}): no reboot left today")
        return {"day": day, "count": spent}
    return {"day": day, "count": count if kept["day"] == day else 0}


def save(config: dict, state: dict, floors: dict, reboots: dict) -> bool:
    """The state file and the metrics file (when the node exporter's directory exists), each on
    its own (one that cannot be written does not keep the other); False when one failed."""
    saved = True
    try:
        os.makedirs(os.path.dirname(config["state_file"]), exist_ok=True)
        replace(config["state_file"], json.dumps(state, sort_keys=True), fsync=True)
    except Exception as e:
        log(3, f"rigup-watchdog: the state could not be saved to {config['state_file']}: {type(e).__name__}: {e}")
        saved = False
    try:
        if os.path.isdir(os.path.dirname(config["metrics_file"])):
            records = {s: state[s] for s in floors if s in state}
            replace(config["metrics_file"], metrics_text(records, floors, config, time.time(), reboots), fsync=True)
    except Exception as e:
        log(3, f"rigup-watchdog: the metrics could not be written to {config['metrics_file']}: "
               f"{type(e).__name__}: {e}")
        saved = False
    return saved


def reboot(config: dict, reboots: dict, reasons: list[str]) -> None:
    """Reboot the host (already counted in ``reboots``), saying why."""
    log(2, f"rigup-watchdog: rebooting the host ({reboots['count']} of {config['max_reboots']} today): "
           + "; ".join(reasons))
    ok, out = systemctl("reboot", config=config)
    if not ok:
        log(3, f"rigup-watchdog: reboot failed: {out}")


def examine(server: dict, inst: dict, floor: float, record: dict, config: dict, reboots: dict) -> str | None:
    """One check of one server (its unit's state, one completion, the judgement, a restart);
    the reason to reboot the host, or None."""
    unit, name = server["unit"], server["server"]
    seen, why = unit_state(unit, config)
    if seen is None:
        count(record, "command_failures")
        log(3, f"rigup-watchdog: {name}: not judged: its unit's state is unknown: {why}")
        return None
    if not seen["active"]:
        return None         # stopped or (re)starting: left alone
    started, now = seen["started"], time.time()
    if started is not None and abs(started - record.get("started", 0)) > 1:
        if record.get("started"):
            record["bad"] = 0           # a new start: a new server (its bad checks were the last one's)
        record["started"] = round(started, 3)
    grace = config.get("grace_s", DEFAULT_GRACE_S)
    if started is not None and record.get("after_restart") and started < (record.get("restarted_at") or 0) \
            and now - record["restarted_at"] < grace:
        log(5, f"rigup-watchdog: {name}: not judged: its restart by the watchdog has not begun yet")
        return None
    gated = passed_gate(server, record, config, started)
    model = None
    if inst.get("models"):   # a router: judged by the model it has loaded (issue 49), and its failed loads
        statuses = throughput.model_statuses(server["url"], _key(inst, server))
        failing, restarting = failing_model(server, inst["models"], statuses, record, config)
        if restarting:   # asked once before the restart: a model evicted while it loaded reads failed too
            probe = measure(server, inst, config, record.get("failing_model"))
            if probe["tps"] is not None:
                log(5, f"rigup-watchdog: {name}: model {shown(record.get('failing_model'), 100)} read failed, but "
                       f"loads and answers now ({probe['tps']:.1f} tok/s): not restarted (a load cut short by an "
                       "eviction reads failed too)")
                record["failing"], record["failing_model"] = 0, None
                return None
            if restart(server, record, failing, config):
                count(record, "failing_restarts")
            return None
        judged, model = router_model(server, inst, statuses)
        if not judged:
            count(record, "unjudged")
            log(6, f"rigup-watchdog: {name}: not judged: none of its models is loaded (a check loads none)")
            return None
    judged, wedged = idle(server, inst, record, model) if inst.get("sleeps") else (True, None)
    if not judged:   # sleep_idle_s: a check must not wake it
        return None
    sample = {"tps": None, "kind": "bad", "why": wedged} if wedged else measure(server, inst, config, model)
    if model and not wedged:
        log(6, f"rigup-watchdog: {name}: timed {model}, the model it has loaded")
    if inst.get("sleeps") and not wedged:   # its own completion is not a request of a client's
        seen = throughput.server_figures(server["url"], _key(inst, server), model=model) or {}
        record["served"], record["decodes"] = seen.get(TOKENS), seen.get(DECODES)
    if not gated and sample["tps"] is not None:
        record["passed_at"] = round(now, 3)     # its first whole completion since its start: its gate
    if not gated and started is not None and now - started < grace:
        record["starting"], record["last_tps"] = 1, sample["tps"]
        if sample["tps"] is not None:
            log(6, f"rigup-watchdog: {name}: a whole completion ({sample['tps']:.1f} tok/s) {now - started:.0f} s "
                   "after its start: passed its gate; judged from the next check")
        else:
            count(record, "unjudged")
            log(5, f"rigup-watchdog: {name}: {sample['why']}, {now - started:.0f} s after its start: not judged "
                   f"(until it passes its gate, at most {grace:g} s after its start)")
        return None
    record["starting"] = 0
    if sample["tps"] is None:
        count(record, "failed")
    why = judge(server, floor, sample["tps"], record, config, sample.get("why"))
    if not why:
        return None
    if record.get("after_restart"):
        rebooting, why = escalate(server, record, why, config, reboots, gated)
        if rebooting:
            return why
    restart(server, record, why, config)
    return None


# The fields of a server's record in the state file, each with its reader (a count, a tok/s, a time).
_COUNTS = ("bad", "restarts", "escalations", "failed", "unjudged", "command_failures", "failing", "failing_restarts")
_TIMES = ("restarted_at", "escalated_at", "started", "passed_at")


def state_record(server: object, record: object) -> dict:
    """One server's record of the state file, each known field read in bounds (an unknown one is
    dropped): counts whole numbers >= 0, tok/s and tokens served >= 0 or null, times not ahead of this clock,
    ``after_restart`` a bool, ``starting`` 0 or 1, ``unit`` a serving unit's name; Unreadable else."""
    if not isinstance(server, str) or not server.isascii() or not server.isprintable() or not 0 < len(server) <= 200:
        raise Unreadable(f"not a server's name: {shown(server, 40)}")
    if not isinstance(record, dict):
        raise Unreadable(f"{server}: not a JSON object")
    out = {}
    for key, value in record.items():
        where = f"{server}.{key}"
        if key in _COUNTS:
            out[key] = figure(value, 0, MAX_COUNT, where)
            if not isinstance(out[key], int):
                raise Unreadable(f"{where}: not a whole number: {shown(value, 40)}")
        elif key in _TIMES:
            out[key] = moment(value, where)
        elif key in ("last_tps", "restart_tps", "served", "decodes"):   # as measured: any figure (below 1e18) reads back
            out[key] = None if value is None else figure(value, 0, float("inf"), where)
        elif key == "starting":
            out[key] = figure(value, 0, 1, where)
        elif key == "after_restart":
            if not isinstance(value, bool):
                raise Unreadable(f"{where}: not true or false: {shown(value, 40)}")
            out[key] = value
        elif key == "unit":
            if not isinstance(value, str) or not _UNIT.fullmatch(value):
                raise Unreadable(f"{where}: not a serving unit: {shown(value, 40)}")
            out[key] = value
        elif key == "failing_model":   # a router's model's name, as its /models said it (or null)
            if value is not None and (not isinstance(value, str) or not value.isprintable() or len(value) > 1000):
                raise Unreadable(f"{where}: not a model's name: {shown(value, 40)}")
            out[key] = value
    return out


def load_state(config: dict) -> dict:
    """The last run's state: server -> its record (state_record). A file that does not read, or
    holds one record that does not: a fresh state (no bad checks, no restarts kept), said in the
    journal."""
    path = config["state_file"]
    try:
        state = read_record(path)
        if not isinstance(state, dict):
            raise Unreadable("not a JSON object")
        return {server: state_record(server, record) for server, record in state.items()}
    except FileNotFoundError:
        return {}
    except Unreadable as e:
        log(4, f"rigup-watchdog: the state file {path} does not read ({e}): starting from a fresh state")
        return {}


def check(config: dict) -> int:
    """One check of every server, each on its own; restarts those below their floor ``bad_checks``
    times in a row, escalates those still below after that restart (and reboots the host, once,
    when allowed). The state is saved whatever happens; 1 when it could not be."""
    state, reboots, floors, reasons = load_state(config), reboots_today(config), {}, []
    try:
        if config["maintenance"]:
            log(5, "rigup-watchdog: rigup_maintenance is on: no check, no restart, no reboot")
        units = active_units(config, state)
        for name, inst in sorted(config["instances"].items()):
            try:
                found = servers(name, inst, units)
            except Exception as e:
                log(3, f"rigup-watchdog: {name}: not checked: {type(e).__name__}: {e}")
                continue
            for server in found:
                record = state.setdefault(server["server"], {"bad": 0, "restarts": 0})
                record["unit"] = server["unit"]
                try:
                    floor = floors[server["server"]] = floor_of(server, inst, config)
                    if config["maintenance"]:
                        continue
                    if floor is None:
                        log(6, f"rigup-watchdog: {server['server']}: no floor yet (no min_tokens_per_s, and the "
                               f"health gate has not recorded its tok/s at "
                               f"{config['gate_record'].format(server['unit'])})")
                        continue
                    why = examine(server, inst, floor, record, config, reboots)
                    if why:
                        reasons.append(why)
                except Exception as e:      # this server's check, not the others'
                    count(record, "failed")
                    log(3, f"rigup-watchdog: {server['server']}: the check failed: {type(e).__name__}: {e}")
        if reasons:     # counted first: the count survives the reboot (and no count kept: no reboot)
            reboots["count"] += 1
            try:
                replace(config["reboots_file"], json.dumps(reboots), fsync=True)
            except OSError as e:
                log(3, f"rigup-watchdog: not rebooting: the count of reboots cannot be kept in "
                       f"{config['reboots_file']}: {e}")
                reboots["count"] -= 1
                reasons = []
    finally:
        saved = save(config, state, floors, reboots)
    if reasons:
        reboot(config, reboots, reasons)
    return 0 if saved else 1


def _stopped(signum, frame):
    raise SystemExit(f"rigup-watchdog: stopped by signal {signum}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rigup-watchdog")
    parser.add_argument("--config", required=True)
    parser.add_argument("command", choices=["check"])
    args = parser.parse_args(argv)
    config = load(args.config, None)
    if not isinstance(config, dict):
        log(3, f"rigup-watchdog: no configuration in {args.config}")
        return 2
    signal.signal(signal.SIGTERM, _stopped)     # the unit's timeout: the state is still saved (finally)
    return check(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
