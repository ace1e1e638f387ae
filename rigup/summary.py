"""One line per host at the end of a play: converged (n changed), unchanged, failed (which
operation, the last lines of its error), unreachable (why), refused (the reasons). pyinfra's own
results table counts operations; this says what happened to each host, unreachable ones too.

The inventory helpers (rigup.config.all_group) call :func:`watch` when pyinfra loads the
inventory, before it connects, so that connection errors are heard; a play calls :func:`track`
with its state. The lines print when the play exits (pyinfra exits non-zero when any host is
not fine).
"""

from __future__ import annotations

import atexit
import logging
import re

import click
from rigup.text import guard_terminal, say

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"^\s*\[([^\]]+)\]\s*(.*)$", re.S)
_heard: dict[str, list[str]] = {}
_refused: dict[str, list[str]] = {}
_notes: dict[str, list[str]] = {}
_quiet: dict[str, str] = {}    # host -> its roles all converged, no operation registered (rigup/probe.py): a run that executed
_state: list = []


class _Recorder(logging.Handler):
    """Keeps the warnings and errors pyinfra logs for each host (``[name] message``)."""

    def emit(self, record: logging.LogRecord) -> None:
        match = _PREFIX.match(_ANSI.sub("", record.getMessage()))
        if match and record.levelno >= logging.WARNING:
            _heard.setdefault(match.group(1), []).append(match.group(2).strip())


def watch() -> None:
    """Listen to pyinfra's log from now on (once) and print the summary at exit; every record pyinfra
    prints is escaped for the terminal from now on (rigup.text.guard_terminal: each call, for a
    handler added since)."""
    guard_terminal()
    if not _state:
        _state.append(None)
        logging.getLogger("pyinfra").addHandler(_Recorder(logging.WARNING))
        atexit.register(report)


def track(state) -> None:
    """The run whose hosts the summary reports."""
    watch()
    _state[0] = state


def refused(host_name: str, reasons: list[str]) -> None:
    """Preflight refused ``host_name`` for ``reasons``."""
    _refused[host_name] = reasons


def converged_without_operations(host_name: str, text: str) -> None:
    """Every role of ``host_name`` was found converged and registered no operation (rigup/probe.py):
    ``text`` says how many were checked."""
    _quiet[host_name] = text


def note(host_name: str, text: str) -> None:
    """Something the host's line should say whatever happened (a trap a remedy avoided)."""
    if text not in _notes.setdefault(host_name, []):
        _notes[host_name].append(text)


# pyinfra's own words around a failure, which say nothing of its reason
_GENERIC = re.compile(r"^(Error(: executed [0-9]+/[0-9]+ commands)?|Error in nested operation|Traceback)")


def _last(host_name: str, n: int = 3) -> str:
    lines = [ln for msg in _heard.get(host_name, []) for ln in msg.splitlines()
             if ln.strip() and not _GENERIC.match(ln.strip())]
    return " | ".join(lines[-n:]) or "no reason was logged"


def host_line(state, host) -> str:
    """What happened to ``host`` in this run, in one line, with its notes."""
    notes = "".join(f"; {n}" for n in _notes.get(host.name, []))
    return _outcome(state, host) + notes


def _outcome(state, host) -> str:
    name = host.name
    if name in _refused:
        return f"[{name}] refused ({len(_refused[name])} reason{'s' if len(_refused[name]) > 1 else ''}): " + "; ".join(_refused[name])
    if host not in state.activated_hosts:
        return f"[{name}] unreachable: {_last(name, 1)}"
    changed, failed = 0, None
    for op_hash in state.get_op_order():
        data = state.ops[host].get(op_hash)
        if data is None or not data.operation_meta.is_complete():
            continue
        if data.operation_meta.did_error():
            failed = failed or ", ".join(sorted(state.op_meta[op_hash].names))
        elif data.operation_meta.did_change():
            changed += 1
    if failed or host in state.failed_hosts:
        return f"[{name}] failed at {failed or 'a fact or the deploy code'}: {_last(name)}"
    return f"[{name}] converged ({changed} changed)" if changed else f"[{name}] unchanged"


def report() -> None:
    """Print one line per host of the run (nothing for a run that executed nothing)."""
    state = _state[0] if _state else None
    if state is None:
        return
    hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
    executed = any(d.operation_meta.is_complete() for h in hosts for d in state.ops.get(h, {}).values()) or \
        any(h.name in _quiet for h in hosts)
    if not executed and not state.failed_hosts:
        return
    click.echo("--> rigup: what happened to each host", err=True)
    for host in hosts:
        line = host_line(state, host)
        ok = _outcome(state, host).endswith(("unchanged", "changed)"))
        say(f"    {line}", fg=None if ok else "red")
