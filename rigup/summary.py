"""One line per host at the end of a play: converged (n changed), unchanged, failed (which
operation, the last lines of its error), unreachable (why), refused (the reasons). pyinfra's own
results table counts operations; this says what happened to each host, unreachable ones too.

The inventory helpers (rigup.config.all_group) call :func:`watch` when pyinfra loads the
inventory, before it connects, so that connection errors are heard; a play calls :func:`track`
with its state. The lines print when the play exits (pyinfra exits non-zero when any host is
not fine).
"""

from __future__ import annotations

import logging
import re

import click
from pyinfra.context import ctx_state

from rigup import run as run_state
from rigup.text import guard_terminal, say

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"^\s*\[([^\]]+)\]\s*(.*)$", re.S)


class _Recorder(logging.Handler):
    """Keeps the warnings and errors pyinfra logs for each host (``[name] message``)."""

    def emit(self, record: logging.LogRecord) -> None:
        match = _PREFIX.match(_ANSI.sub("", record.getMessage()))
        if match and record.levelno >= logging.WARNING and ctx_state.isset():
            run_state.now().heard.setdefault(match.group(1), []).append(match.group(2).strip())


def watch() -> None:
    """Listen to pyinfra's log from now on (once) and print the summary at exit; every record pyinfra
    prints is escaped for the terminal from now on (rigup.text.guard_terminal: each call, for a
    handler added since)."""
    guard_terminal()
    log = logging.getLogger("pyinfra")
    if not any(isinstance(h, _Recorder) for h in log.handlers):
        log.addHandler(_Recorder(logging.WARNING))


def track(state) -> None:
    """The run whose hosts the summary reports."""
    watch()
    run_state.of(state).at_end(report, state)


def refused(host, reasons: list[str]) -> None:
    """Preflight refused ``host`` for ``reasons``."""
    run_state.host_run(host).refused[host.name] = reasons


def fail(host, reasons: list[str]) -> None:
    """``host`` refused for ``reasons`` and failed for the rest of the run: the inventory's own Host
    object, not pyinfra's context proxy (which equals the host only while it is the current host,
    so a set of failed hosts holding it would hold none later)."""
    refused(host, reasons)
    host.state.fail_hosts({host.state.inventory.get_host(host.name)})


def converged_without_operations(host, text: str) -> None:
    """Every role of ``host`` was found converged and registered no operation (rigup/probe.py):
    ``text`` says how many were checked."""
    run_state.host_run(host).quiet[host.name] = text


def note(host, text: str) -> None:
    """Something the host's line should say whatever happened (a trap a remedy avoided)."""
    notes = run_state.host_run(host).notes.setdefault(host.name, [])
    if text not in notes:
        notes.append(text)


# pyinfra's own words around a failure, which say nothing of its reason
_GENERIC = re.compile(r"^(Error(: executed [0-9]+/[0-9]+ commands)?|Error in nested operation|Traceback)")


def _last(run, host_name: str, n: int = 3) -> str:
    lines = [ln for msg in run.heard.get(host_name, []) for ln in msg.splitlines()
             if ln.strip() and not _GENERIC.match(ln.strip())]
    return " | ".join(lines[-n:]) or "no reason was logged"


def host_line(state, host) -> str:
    """What happened to ``host`` in this run, in one line, with its notes."""
    notes = "".join(f"; {n}" for n in run_state.of(state).notes.get(host.name, []))
    return _outcome(state, host) + notes


def _outcome(state, host) -> str:
    name, run = host.name, run_state.of(state)
    reasons = run.refused.get(name)
    if reasons is not None:
        return f"[{name}] refused ({len(reasons)} reason{'s' if len(reasons) > 1 else ''}): " + "; ".join(reasons)
    if host not in state.activated_hosts:
        return f"[{name}] unreachable: {_last(run, name, 1)}"
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
        return f"[{name}] failed at {failed or 'a fact or the deploy code'}: {_last(run, name)}"
    return f"[{name}] converged ({changed} changed)" if changed else f"[{name}] unchanged"


def report(state) -> None:
    """Print one line per host of ``state``'s run (nothing for a run that executed nothing)."""
    quiet = run_state.of(state).quiet
    hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
    executed = any(d.operation_meta.is_complete() for h in hosts for d in state.ops.get(h, {}).values()) or \
        any(h.name in quiet for h in hosts)
    if not executed and not state.failed_hosts:
        return
    click.echo("--> rigup: what happened to each host", err=True)
    for host in hosts:
        line = host_line(state, host)
        ok = _outcome(state, host).endswith(("unchanged", "changed)"))
        say(f"    {line}", fg=None if ok else "red")
