"""The health gate of a serving unit (llama_server, vllm): /health 200, then one real chat
completion; on failure, the unit's journal. Runs on the controller at execution time
(``python.call``), one SSH command per probe (each with a timeout), retried with tenacity until
the gate's deadline.

Each poll reads the unit's state (``systemctl show``: :data:`SHOW`) and /health in one command, so
that a server that died is named at once, never waited out: a crash with its signal (and any
known trap that may match it, ``traps``), a plain exit with its status, how long after its start
and whether while loading or during its first inference, followed by the journal of that start
(its invocation). The wording is made by pure functions (:func:`parse_show`, :func:`ended`,
:func:`main_exit`, :func:`journal_exit`, :func:`stopped_reason`, :func:`trap_hints`).

With ``record`` (a path, rigup.names.gate_record) the completion's tok/s (llama-server's
``timings.predicted_per_second``) is kept on the host, root-owned JSON written by the gate's own
command: the throughput watchdog's default floor is half of it (roles/watchdog)."""

from __future__ import annotations

import json
import math
import re
import shlex
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api import OperationError, StringCommand
from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

from rigup.boundary.core import loads
from rigup.boundary.numbers import whole
from rigup.names import bind_scope
from rigup.text import shown, shown_lines

# The unit's properties each poll reads (``systemctl show -p ...``).
SHOW = ("ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "ExecMainStartTimestampMonotonic",
        "ExecMainExitTimestampMonotonic", "InvocationID", "NRestarts")
PROBE_TIMEOUT = 30       # s, a state probe, /health, a journal read
COMPLETION_MARGIN = 15   # s, the completion's SSH command beyond its curl's own -m
AFTER_COMPLETION = 5     # probes, 1 s apart, for a server that died under the completion
# An ActiveState or SubState of a unit whose process of this start is gone (auto-restart-queued: systemd 254+).
DEAD = frozenset({"failed", "inactive", "auto-restart", "auto-restart-queued"})
CODES = {1: "exited", 2: "killed", 3: "dumped"}   # ExecMainCode: CLD_EXITED, CLD_KILLED, CLD_DUMPED
# Signals that stop a server on purpose (an operator, systemd's stop, the OOM killer): "killed", not "crashed".
STOPS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGPIPE", "SIGKILL", "SIGQUIT"})
LOADING, INFERENCE = "while loading", "during its first inference"
SERVERS = {"rigup-llama@": "llama-server", "rigup-vllm@": "vllm"}
_EXITED = re.compile(r"\b(Main|Control) process exited, code=(\w+), status=([0-9]+)(?:/(\S+))?")
_INVOCATION = re.compile(r"[0-9a-f]{32}")


def endpoint(bind: str, port: int) -> str:
    """The URL a client on the host reaches a server bound to ``bind`` at: its own address, or
    loopback for a wildcard bind; IPv6 in brackets."""
    wildcard = bind_scope(bind) == "wildcard"
    address = "::1" if wildcard and ":" in bind else "127.0.0.1" if wildcard or bind == "localhost" else bind
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def record_command(path: str, unit: str, tps: float, at: float) -> str:
    """The shell command that keeps the gate's measured ``tps`` of ``unit`` in ``path`` on the
    host (its directory 0755, the file 0644, replaced whole by a rename)."""
    text = json.dumps({"unit": unit, "tps": round(tps, 3), "at": round(at, 3)}, sort_keys=True)
    folder, tmp = path.rsplit("/", 1)[0], f"{path}.tmp"
    return (f"install -d -m 0755 {shlex.quote(folder)} && printf '%s\\n' {shlex.quote(text)} > {shlex.quote(tmp)} "
            f"&& chmod 0644 {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}")


def measured_tps(answer: dict) -> float | None:
    """The generation tok/s of a completion as llama-server reports it (vLLM does not: None)."""
    tps = (answer.get("timings") or {}).get("predicted_per_second")
    return float(tps) if isinstance(tps, (int, float)) and tps > 0 else None


def server_of(unit: str) -> str:
    """What serves in ``unit``, as a message names it: llama-server, vllm, else the unit's name."""
    return next((name for prefix, name in SERVERS.items() if unit.startswith(prefix)), unit.removesuffix(".service"))


def probe_command(unit: str, base: str) -> str:
    """One poll's shell command: the unit's :data:`SHOW` properties, ``Jobs=`` (its queued or
    running jobs) and ``Health=`` (the HTTP code of ``base``/health, 000 when nothing answers)."""
    u = shlex.quote(unit)
    return (f"systemctl show {' '.join(f'-p {p}' for p in SHOW)} {u}; "
            f"printf 'Jobs=%s\\n' \"$(systemctl list-jobs --no-legend {u} 2>/dev/null | grep -c .)\"; "
            f"printf 'Health=%s\\n' \"$(curl -s -m 10 -o /dev/null -w '%{{http_code}}' {base}/health)\"")


def parse_show(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``systemctl show``'s, and the probe's own) as a dict; {} for no answer."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _int(value) -> int:
    """A count or time ``systemctl show`` printed (NRestarts, ExecMainCode, a monotonic timestamp): a whole
    number (rigup.boundary.numbers.whole: int() took ``١`` and ``1_0``), 0 when it is none."""
    return whole(value) or 0


def ended(now: Mapping[str, str], first: Mapping[str, str]) -> bool:
    """Whether the server of this start is gone, from a probe (``now``) and the gate's first one
    (``first``). systemd restarted it since the gate started (NRestarts grew), whatever runs now;
    else, with no start job queued or running (a start --no-block may not have begun: the state
    is then the previous start's), a unit in a dead state (failed, inactive, auto-restart) or whose
    main process exited (systemd zeroes ExecMain* at each start, so an exit time is this start's)."""
    if not now.get("ActiveState"):
        return False   # no answer: one failed poll
    if _int(now.get("NRestarts")) > _int(first.get("NRestarts")):
        return True
    if _int(now.get("Jobs")):
        return False
    return bool(DEAD & {now.get("ActiveState"), now.get("SubState")}) or _int(now.get("ExecMainExitTimestampMonotonic")) > 0


def signal_name(number: int) -> str:
    """SIGSEGV for 11 (Python's signal.Signals), else ``signal N``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signal(text: str) -> str:
    """A signal as systemd or a trap writes it (SEGV, SIGSEGV, sigsegv, 11) as signal.Signals names it."""
    text = str(text).strip(" \t\r\n\f\v").upper()   # ASCII's blanks alone (str.strip() takes U+0085)
    number = whole(text)   # str.isdigit() took "²", which int() refuses
    return signal_name(number) if number is not None else text if text.startswith("SIG") else f"SIG{text}"


@dataclass(frozen=True)
class Exit:
    """How a process of the unit ended: ``code`` (exited, killed, dumped), ``status`` (an exit
    status, or a signal's number), ``name`` (systemd's name of the status: FAILURE, SEGV; may be
    empty), ``after`` (seconds from its start, when known), ``result`` (the unit's Result) and
    ``main`` (the main process; False: a start-up command, ExecStartPre)."""

    code: str
    status: int
    name: str = ""
    after: float | None = None
    result: str = ""
    main: bool = True

    @property
    def signal(self) -> str | None:
        """The signal that ended it (SIGSEGV), or None for an exit."""
        if self.code == "exited":
            return None
        return _signal(self.name) if self.name else signal_name(self.status)


def main_exit(props: Mapping[str, str]) -> Exit | None:
    """The main process's end from ``systemctl show`` properties, or None while it runs (or
    before it started: systemd zeroes ExecMain* when a start begins)."""
    code, started, exited = (_int(props.get(k)) for k in ("ExecMainCode", "ExecMainStartTimestampMonotonic",
                                                        "ExecMainExitTimestampMonotonic"))
    if code not in CODES or not exited:
        return None
    after = (exited - started) / 1e6 if 0 < started <= exited else None
    return Exit(CODES[code], _int(props.get("ExecMainStatus")), after=after, result=props.get("Result", ""))


def journal_exit(text: str) -> Exit | None:
    """The last process end systemd logged in a unit's journal (``Main process exited,
    code=dumped, status=11/SEGV``; ``Control process exited, ...`` for a start-up command), or
    None. For a start whose record systemd already replaced (it restarted the unit)."""
    found = _EXITED.findall(text)
    if not found:
        return None
    which, code, status, name = found[-1]
    return Exit(code, int(status), name, main=which == "Main")


def _seconds(s: float) -> str:
    return f"{s:.1f}" if s < 100 else f"{s:.0f}"


def _what(exit_: Exit, who: str) -> str:
    """``llama-server crashed (SIGSEGV, core dumped) 0.6 s after start``, ``... exited with status 1``."""
    after = f" {_seconds(exit_.after)} s after start" if exit_.after is not None else ""
    if exit_.code == "exited":
        name = f" ({exit_.name})" if exit_.name and not exit_.name.isdigit() else ""
        return f"{who} exited with status {exit_.status}{name}{after}"
    details = [exit_.signal] + ["core dumped"] * (exit_.code == "dumped" or exit_.result == "core-dump") \
        + ["out of memory"] * (exit_.result == "oom-kill") + ["watchdog"] * (exit_.result == "watchdog")
    verb = "was killed" if exit_.signal in STOPS else "crashed"
    return f"{who} {verb} ({', '.join(details)}){after}"


def stopped_reason(unit: str, server: str, props: Mapping[str, str], exit_: Exit | None, phase: str,
                   restarts: int = 0) -> str:
    """The first line of the gate's failure for a server that is gone (``props``: the probe that
    saw it; ``exit_``: how it ended, None when unknown; ``phase``: :data:`LOADING` or
    :data:`INFERENCE`; ``restarts``: how many times systemd restarted it since the gate started)."""
    again = f"; systemd restarted it ({restarts}x since the gate started)" if restarts else ""
    if exit_ is not None and exit_.main:
        return f"{unit}: {_what(exit_, server)}, {phase}{again}"
    if exit_ is not None:
        return f"{unit}: /health did not answer 200 (the unit failed: {_what(exit_, 'a start-up command')}{again})"
    if restarts:
        return f"{unit}: {server} stopped {phase}{again}"
    state = f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
    result = props.get("Result", "")
    return f"{unit}: /health did not answer 200 (the unit failed: {state}" + \
        (f", result {result})" if result and result != "success" else ")")


def _field(trap, name: str, index: int | None):
    if isinstance(trap, (tuple, list)):
        return trap[index] if index is not None and index < len(trap) else None
    if isinstance(trap, Mapping):
        return trap.get(name)
    return getattr(trap, name, None)


def trap_hints(traps, crash_signal: str | None) -> list[str]:
    """``known trap that may match: ID (REF): SUMMARY; fix: FIX`` for each of ``traps`` that may
    match a crash on ``crash_signal`` (SIGSEGV): a trap whose ``condition`` has ``signals`` (as
    the traps.yml catalogues write it) or ``signal`` equal to it (SEGV, SIGSEGV or 11; a list of them), or one given without a condition (a tuple
    ``(id, summary, fix)``: the caller chose it for this unit). ``traps``: tuples, mappings or
    objects with ``id``, ``ref``, ``summary``, ``condition`` and ``remedy.fix`` (or ``fix``),
    as rigup.traps.Trap; read duck-typed. None for an exit that is not a signal's."""
    if not crash_signal:
        return []
    hints = []
    for trap in traps or ():
        condition = _field(trap, "condition", 3)
        if condition is not None:
            wanted = condition.get("signals", condition.get("signal")) if isinstance(condition, Mapping) else None
            wanted = wanted if isinstance(wanted, (list, tuple)) else [] if wanted is None else [wanted]
            if crash_signal not in {_signal(w) for w in wanted}:
                continue
        remedy = _field(trap, "remedy", None)
        fix = _field(trap, "fix", 2) or (_field(remedy, "fix", None) if remedy is not None else None)
        ref = _field(trap, "ref", None)
        hints.append(f"known trap that may match: {_field(trap, 'id', 0)}{f' ({ref})' if ref else ''}: "
                     f"{_field(trap, 'summary', 1)}" + (f"; fix: {fix}" if fix else ""))
    return hints


def journal_command(unit: str, invocation: str | None = None) -> str:
    """The journal of the unit's start ``invocation`` (its last 60 lines), else (none, or no lines
    under it) the unit's last 40 lines."""
    fallback = f"journalctl -u {shlex.quote(unit)} -n 40 --no-pager -o cat"
    if not invocation or not _INVOCATION.fullmatch(invocation):
        return fallback
    return (f"out=$(journalctl -q _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager -n 60); "
            f"if [ -n \"$out\" ]; then printf '%s\\n' \"$out\"; else {fallback}; fi")


def log_search_command(unit: str, invocation: str | None, text: str) -> str:
    """The first line with ``text`` in the whole journal of the unit's start ``invocation`` (the
    unit's last 40 lines when it has none, or the journal has no lines under it)."""
    fallback = f"journalctl -u {shlex.quote(unit)} -n 40 --no-pager -o cat"
    source = fallback
    if invocation and _INVOCATION.fullmatch(invocation):
        whole = f"journalctl -q _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager"
        source = f"if [ -n \"$({whole} -n 1)\" ]; then {whole}; else {fallback}; fi"
    return f"{{ {source}; }} | grep -F -m1 -- {shlex.quote(text)}"


def exits_command(unit: str) -> str:
    """The last process end systemd logged for the unit (for :func:`journal_exit`)."""
    return (f"journalctl -u {shlex.quote(unit)} -n 2000 --no-pager -o cat "
            "| grep -E '(Main|Control) process exited, code=' | tail -n 1")


def gate(host, unit: str, port: int, model: str, prompt: str, timeout: int, auth: str = "",
         poll: float = 1, fail_on_log: str | None = None, bind: str = "127.0.0.1", record: str | None = None,
         traps=(), server: str | None = None) -> str:
    """The text of one completion from the unit's endpoint (at ``bind``:``port``), or
    OperationError: the reason on its first line, then the journal. ``auth`` is curl arguments
    read on the host (a key never passes through here); ``fail_on_log`` fails the gate when the
    journal of this start has that text even though it answered (llama-server's "no usable GPU
    found": it fell back to the CPU); ``record``: the host path that keeps the completion's
    tok/s; ``traps``: known traps a crash may be (:func:`trap_hints`); ``server``: what a message
    calls the server (:func:`server_of` the unit)."""
    base, server = endpoint(bind, port), server or server_of(unit)
    deadline = time.monotonic() + timeout
    seen: dict = {"first": {}, "last": {}, "healthy": False}

    def shell(command: str, limit: float = PROBE_TIMEOUT) -> str:
        # coreutils' timeout ends the command on the host too; pyinfra's own stops the wait for it
        limit = max(1, math.ceil(limit))
        try:
            ok, output = host.run_shell_command(
                StringCommand("timeout", "-k", "5", str(limit), "bash", "-c", shlex.quote(command)),
                print_output=False, print_input=False, _timeout=limit + 5)
        except TimeoutError:
            logger.debug(shown(f"{unit}: a probe did not answer within {limit} s"))
            return ""
        return output.stdout if ok else ""

    def probe(limit: float = PROBE_TIMEOUT) -> dict[str, str]:
        now = parse_show(shell(probe_command(unit, base), limit))
        if now.get("ActiveState"):
            seen["first"] = seen["first"] or now
            seen["last"] = now
            seen["healthy"] = seen["healthy"] or now.get("Health") == "200"
        return now

    def invocation() -> str | None:
        return seen["last"].get("InvocationID") or None

    def stopped(now: dict[str, str], phase: str) -> OperationError:
        exit_ = main_exit(now)
        start = invocation() if exit_ else None   # the record is this invocation's: its journal
        restarts = max(0, _int(now.get("NRestarts")) - _int(seen["first"].get("NRestarts")))
        if exit_ is None and (restarts or now.get("Result", "success") != "success"):
            # systemd replaced the record (it restarted the unit), or a start-up command failed:
            # the end it logged last is this start's (a start that failed logs one)
            exit_ = journal_exit(shell(exits_command(unit)))
        reason = stopped_reason(unit, server, now, exit_, phase, restarts)
        if exit_ is not None and exit_.main:
            reason = "; ".join([reason, *trap_hints(traps, exit_.signal)])
        return OperationError(f"{reason}\n{shown_lines(shell(journal_command(unit, start)))}")

    @retry(stop=stop_after_delay(timeout), wait=wait_fixed(poll), retry=retry_if_result(lambda r: r is None))
    def health() -> str | None:
        now = probe(max(5, min(PROBE_TIMEOUT, deadline - time.monotonic())))   # the deadline holds
        if ended(now, seen["first"]):
            return "ended"   # it exited: waiting is no use
        return "200" if now.get("Health") == "200" else None

    try:
        code = health()
    except RetryError:
        code = "timeout"
    if code == "ended":
        raise stopped(seen["last"], INFERENCE if seen["healthy"] else LOADING)
    if code != "200":
        raise OperationError(f"{unit}: /health did not answer 200 within {timeout} s ({code}); "
                             f"last journal lines:\n{shown_lines(shell(journal_command(unit, invocation())))}")
    body = json.dumps({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]})
    answer = shell(f"curl -s -m {timeout} {auth} -H 'Content-Type: application/json' "
                   f"-d {shlex.quote(body)} {base}/v1/chat/completions", timeout + COMPLETION_MARGIN)
    try:
        doc = loads(answer, "the health completion")   # Unreadable (a ValueError): nested too deep too
        text = doc["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):  # empty, not JSON, or not a completion
        for n in range(AFTER_COMPLETION):   # did it die under the completion?
            if n:
                time.sleep(1)
            now = probe()
            if ended(now, seen["first"]):
                raise stopped(now, INFERENCE) from None
            if now.get("Health") == "200":
                break   # it runs: the completion's own failure
        raise OperationError(f"{unit}: the health completion failed: {answer[:300] or 'no answer'!r}; "
                             f"last journal lines:\n{shown_lines(shell(journal_command(unit, invocation())))}") from None
    if fail_on_log and shell(log_search_command(unit, invocation(), fail_on_log)).strip():
        raise OperationError(f"{unit}: {server} fell back to the CPU: its log says {fail_on_log!r}; "
                             f"last journal lines:\n{shown_lines(shell(journal_command(unit, invocation())))}")
    tps = measured_tps(doc)
    if record and tps:
        shell(record_command(record, unit, tps, time.time()))
    return text


def answered(state, host, unit: str, port: int, model: str, prompt: str, timeout: int, traps=(), **options) -> bool:
    """:func:`gate` as a ``python.call`` after a (re)start: notes the answer, or logs the reason and
    the journal and fails the host (a failed gate is a result, not a traceback). ``traps``: known
    traps a crash may be, named with it (:func:`trap_hints`)."""
    try:
        text = gate(host, unit, port, model, prompt, timeout, traps=traps, **options)
    except OperationError as e:
        # the journal first, the reason last: the run's summary (rigup.summary) quotes the last lines
        reason, _, journal = str(e).partition("\n")
        if journal.strip():
            host.log_styled(shown_lines(journal, 4000, None), fg="red", log_func=logger.error)
        host.log_styled(shown(reason, 4000), fg="red", log_func=logger.error)
        return False
    host.noop(f"{unit} answered: {text!r}")
    return True
