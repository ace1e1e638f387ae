"""Long work on a host as a background job whose progress the converge prints: the job is started
(a transient unit, or setsid where systemd is missing) so that it outlives the SSH session, then
``waited`` (run with ``python.call``) polls it, printing one line per host every ``interval``
seconds taken from the last progress line of its log, until it ends. Used by roles/llama_cpp (the
build: make's ``[ 27%]`` or ninja's ``[123/456]``) and roles/vllm (pip's ``Downloading ...``)."""

from __future__ import annotations

import os
import re
import shlex
import time

from pyinfra import host
from pyinfra.api import OperationError
from rigup.boundary.numbers import whole
from rigup.text import say, shown_lines

# seconds between two progress lines of a host (RIGUP_PROGRESS_INTERVAL_S in the controller's environment)
INTERVAL_S = float(os.environ.get("RIGUP_PROGRESS_INTERVAL_S") or 15)
# lines of a log that say how far a job is: make/ninja counters, pip's steps
PROGRESS = r"^\[ *[0-9]+(/[0-9]+|%)\]|^ *(Collecting|Downloading|Building|Installing|Successfully|Processing) "
# the counters of a build's log line, ASCII digits (rigup.boundary.numbers reads them: a host's log is its text)
_NINJA = re.compile(r"^\[([0-9]+)/([0-9]+)\]")
_MAKE = re.compile(r"^\[ *([0-9]+)%\]")


def _pid_file(log: str) -> str:
    return f"{log}.pid"


def start_command(unit: str, command: str, log: str, systemd: bool, unless: str | None = None,
                  nice: int = 10) -> str:
    """Shell text starting ``command`` (its output goes to ``log``, emptied first; the command may
    also write it itself) as the transient unit ``unit`` once no other run of that unit is active,
    unless the file ``unless`` exists by then; or, without systemd, as a setsid process whose pid
    is kept next to the log. Either way it outlives the SSH session."""
    q = shlex.quote
    job = f"{command} >> {q(log)} 2>&1"
    if systemd:
        start = (f"systemctl reset-failed {q(unit)} 2>/dev/null; : > {q(log)}; systemd-run --unit={q(unit)} "
                 f"--collect --quiet --property=Nice={int(nice)} /bin/sh -c {q(job)}")
        wait = f"while systemctl is-active -q {q(unit)}; do sleep 5; done; "
    else:
        start = (f": > {q(log)}; setsid nohup nice -n {int(nice)} sh -c {q(job)} >/dev/null 2>&1 </dev/null & "
                 f"echo $! > {q(_pid_file(log))}")
        wait = ""
    return wait + (f"[ -e {q(unless)} ] || {{ {start}; }}" if unless else start)


def exists(path: str) -> str:
    """The shell test ``waited`` takes as ``done``: ``path`` exists."""
    return f"[ -e {shlex.quote(path)} ]"


def _probe(unit: str, log: str, done: str, systemd: bool) -> str:
    """Shell text printing ``running=1|0``, ``done=1|0`` (the shell test ``done``), the log's
    last progress line and its last line (before the first progress line: cloning, configuring)."""
    q = shlex.quote
    running = (f"systemctl is-active -q {q(unit)}" if systemd
               else f"kill -0 \"$(cat {q(_pid_file(log))} 2>/dev/null)\" 2>/dev/null")
    return (f"{running} && echo running=1 || echo running=0; {{ {done}; }} && echo done=1 || echo done=0; "
            f"tail -c 262144 {q(log)} 2>/dev/null | tr '\\r' '\\n' | RIGUP_RE={q(PROGRESS)} awk "
            "'$0 ~ ENVIRON[\"RIGUP_RE\"] {line = $0} NF {last = $0} END {print \"line=\" line; print \"last=\" last}'")


def progress_text(line: str, high: int = 0) -> str:
    """``[123/456] 27%`` from ninja's line, ``27%`` from make's (at least ``high``: make -j prints
    each target's own percent, so parallel jobs' lines come out of order and a printed percent
    would go back), else the line itself (shortened)."""
    m = _NINJA.match(line)
    n, total = (whole(m[1]), whole(m[2])) if m else (None, None)
    if n is not None and total is not None:
        return f"[{n}/{total}] {100 * n // max(total, 1)}%"
    m = _MAKE.match(line)
    percent = whole(m[1], 100) if m else None
    if percent is not None:
        return f"{max(percent, high)}%"
    line = " ".join(line.split())
    return line if len(line) <= 100 else line[:97] + "..."


def parse_probe(lines: list[str]) -> dict:
    """``{running, done, line, last}`` from the output of ``_probe``."""
    state = {"running": False, "done": False, "line": "", "last": ""}
    for raw in lines:
        key, _, value = raw.partition("=")
        if key in ("running", "done"):
            state[key] = value.strip() == "1"
        elif key in ("line", "last"):
            state[key] = value
    return state


def waited(label: str, unit: str, log: str, done: str, systemd: bool, timeout: int,
           interval: float = INTERVAL_S) -> None:
    """Block until the job ``unit`` ends, printing ``[host] label: progress`` every ``interval``
    seconds; it succeeded when the shell test ``done`` passes (e.g. ``exists(stamp)``), else fail
    with the log's last lines.
    Run with ``python.call`` (in the host's context)."""
    me = host
    started = last = time.monotonic()
    high = 0   # the highest make percent printed so far
    while True:
        ok, output = me.run_shell_command(command=_probe(unit, log, done, systemd), print_output=False,
                                          print_input=False)
        if not ok:
            raise OperationError(f"{label}: cannot read the state of {unit}")
        state = parse_probe(list(output.stdout_lines))
        if not state["running"]:
            break
        now = time.monotonic()
        if now - last >= interval:
            last = now
            text = progress_text(state["line"] or state["last"], high)
            high = max(high, whole(text[:-1], 100) or 0) if text.endswith("%") else high
            say(f"    [{me.name}] {label}: {text or 'starting'} ({now - started:.0f} s)")
        if now - started > timeout:
            raise OperationError(f"{label}: not finished after {timeout} s; {unit} goes on (log: {log})")
        time.sleep(min(2.0, interval / 2))
    if state["done"]:
        say(f"    [{me.name}] {label}: done in {time.monotonic() - started:.0f} s")
        return
    _, output = me.run_shell_command(command=f"tail -n 30 {shlex.quote(log)}", print_output=False,
                                     print_input=False)
    tail = "\n".join(output.stdout_lines)   # the job's output (a compiler quoting source text): escaped
    raise OperationError(shown_lines(f"{label} failed; last lines of its log ({log}):\n{tail}", 300, None))
