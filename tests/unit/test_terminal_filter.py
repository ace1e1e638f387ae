"""pyinfra's log to the terminal, escaped (issue 61, round 9: P1, L1, C1, LC1 were host text printed raw
through an OperationError or a no-op's line). rigup.text.TerminalFilter sits on pyinfra's log handlers
from the start of a run (rigup.summary.watch, which the inventory helpers and every play call): every
character shown() escapes is escaped as it does, but newlines, tabs and pyinfra's own colours
(click.style's SGR sequences) stay. tests/unit/test_operation_errors.py keeps the texts escaped where
they are made; this is the one way out to the terminal for what slips by."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import select
import sys
import time
from pathlib import Path

import click
from hypothesis import example, given, settings, strategies as st

from rigup.text import shown, styled, terminal_text

ROOT = Path(__file__).resolve().parents[2]
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
CSI = "\x1b[2J\x1b[H"
# texts click.style wrote for pyinfra through rigup.text.styled (its colours, bold, dim, underline,
# reset): their colours kept; the same sequences a host wrote are not
STYLES = [styled(t, fg=fg, bg=bg, bold=True, dim=True, underline=True, italic=True, reverse=True)
          for t in ("x", "", "[h1]") for fg in ("red", "green", "black", "bright_red") for bg in (None, fg)]
# the SGR parameters click.style writes: what _bare removes
SGR_CODES = frozenset({0, 1, 2, 3, 4, 5, 7, 9, 21, 22, 23, 24, 25, 27, 29, 39, 49, 53, 55,
                       *range(30, 38), *range(40, 48), *range(90, 98), *range(100, 108)})
CONTROLS = [chr(c) for c in (*range(0x20), 0x7f, *range(0x80, 0xa0), *range(0x202a, 0x202f), *range(0x2066, 0x206a),
                             0x2028, 0x2029)]


def _bare(text: str) -> str:
    """``text`` less the SGR sequences of SGR_CODES only (the rule restated, read independently)."""
    def colour(m: re.Match) -> str:
        return "" if all(p and int(p) in SGR_CODES for p in (m[1] or "0").split(";")) else m[0]
    return re.sub(r"\x1b\[([0-9;]*)m", colour, text)


def _on_a_pty(*args: str) -> tuple[subprocess.Popen, str]:
    """pyinfra ``args``, run from the checkout (its config.py) with a pty for a terminal: the
    process and what the terminal got."""
    main, child = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([str(Path(sys.executable).parent / "pyinfra"), *args], cwd=ROOT,
                           stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env)
    os.close(child)
    got, deadline = bytearray(), time.monotonic() + 60
    while time.monotonic() < deadline:   # the terminal's side, read as it comes (a pty holds a few KiB)
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:   # EIO: every writer closed its side
                break
            if not chunk:
                break
            got.extend(chunk)
        elif run.poll() is not None:
            break
    os.close(main)
    run.wait(10)
    return run, got.decode("utf-8", "replace")


pieces = st.one_of(st.text(max_size=8), st.sampled_from(CONTROLS), st.sampled_from(STYLES),
                   st.sampled_from([OSC52, CSI, "\x1b[38;5;1m", "\x1b[8m", "\x1b[31", "\x1b[;m", "\x1b[31;2Jm", "\x1b\x1b[0m",
                                    "\x9b2J", "\r\n", "\x85", "\ud800"]))


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=12).map("".join))
@example(OSC52 + CSI + "\x1b[31mred\x1b[0m")
def test_no_control_character_but_colours_newlines_and_tabs_comes_out(text):
    out = terminal_text(text)
    left = [c for c in _bare(out) if not (c.isprintable() or c in "\n\t")]
    assert not left, (text, out, left)
    assert terminal_text(out) == out   # escaped once is escaped


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp",
                                                                                 "Zs")), max_size=8),
                          st.sampled_from([" ", "\n", "\t", *STYLES])), max_size=12).map("".join))
def test_a_message_without_any_comes_back_as_it_is(text):
    assert terminal_text(text) == text


def test_each_character_is_escaped_as_shown_escapes_it():
    for c in CONTROLS:
        if c not in "\n\t":
            assert terminal_text(f"a{c}b") == shown(f"a{c}b"), repr(c)
    got = terminal_text(f"[h1] {OSC52}{CSI}\x1b[38;5;1m{styled('ok', 'red')}\n\tnext\u202e\u2028")
    print("escaped:", repr(got))
    assert got == ("[h1] \\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x1b[H\\x1b[38;5;1m\x1b[31mok\x1b[0m\n\tnext"
                   "\\u202e\\u2028")


# pyinfra_cli's LogHandler and LogFormatter as its setup_logging installs them, in a process of its own
# (importing pyinfra_cli patches the standard library with gevent), writing to a terminal (click keeps
# colours, and unfiltered every sequence, for a terminal only): a record as pyinfra logs an
# OperationError, its prefix bold and its text red, holding OSC 52 and CSI
HANDLER = """
import io, json, logging, sys
import click
from pyinfra_cli.log import LogFormatter, LogHandler
from rigup.text import TerminalFilter, guard_terminal, styled

class Tty(io.StringIO):
    def isatty(self):
        return True

got = {}
for guarded in (False, True):
    logger = logging.getLogger(f"rigup-test-terminal-{guarded}")
    logger.propagate = False
    handler = LogHandler()
    handler.setFormatter(LogFormatter())
    logger.addHandler(handler)
    if guarded:
        guard_terminal(logger.name)
        guard_terminal(logger.name)   # once: a second call adds none
        got["filters"] = sum(isinstance(f, TerminalFilter) for f in handler.filters)
    sys.stderr = tty = Tty()
    style = styled if guarded else click.style   # guarded: pyinfra's colours through rigup.text.styled
    logger.error("%s%s", style("[h1] ", bold=True), style(sys.argv[1], "red"))
    sys.stderr = sys.__stderr__
    got[str(guarded)] = tty.getvalue()
print(json.dumps(got))
"""


def test_pyinfra_clis_own_handler_prints_the_message_escaped():
    message = f"OperationError: build failed: {OSC52}{CSI}cc1: error"
    run = subprocess.run([sys.executable, "-c", HANDLER, message], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    print(f"input: {message!r}")
    print(f"without the filter the terminal gets: {got['False']!r}")
    print(f"with it (pyinfra's own handler):      {got['True']!r}")
    assert "\x1b]52" in got["False"] and "\x1b[2J" in got["False"]   # the test sees what it guards against
    out = got["True"]
    assert got["filters"] == 1 and "\x1b]52" not in out and "\x1b[2J" not in out
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x1b[H" in out and "\x1b[31m" in out and "\x1b[1m" in out
    assert not [c for c in _bare(out) if not (c.isprintable() or c in "\n\t")]


def test_a_real_pyinfra_run_escapes_an_operation_error_after_rigup_starts_its_summary(tmp_path):
    """`pyinfra -y @local` on a play that starts rigup's summary as deploy.py does (summary.track):
    an OperationError holding OSC 52 and CSI reaches the terminal (a pty: colours kept) escaped."""
    (tmp_path / "play.py").write_text(
        "from pyinfra import host\nfrom pyinfra.api import OperationError\nfrom pyinfra.operations import python\n"
        "from rigup import summary\n\nsummary.track(host.state)\n\n\ndef fail():\n"
        f"    raise OperationError({'build failed: ' + OSC52 + CSI + ' done'!r})\n\n\n"
        "python.call(name='round 9', function=fail)\n")
    run, out = _on_a_pty("-y", "@local", str(tmp_path / "play.py"))
    lines = [ln for ln in out.splitlines() if "build failed" in ln]
    print("rc", run.returncode, "; the lines naming the error, as the terminal got them:")
    for ln in lines:
        print("  ", repr(ln))
    assert run.returncode != 0 and lines
    assert "\x1b]52" not in out and "\x1b[2J" not in out and "\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J" in out
    assert "\x1b[31m" in out   # pyinfra's own colours stay


def test_an_unexpected_exceptions_traceback_pyinfra_cli_prints_is_escaped(tmp_path):
    """round 10, TF2: an exception of a play's own code (a host's or a hub's text in its message) is
    printed by pyinfra_cli with click.echo, traceback and all, beside its log: escaped now."""
    (tmp_path / "play.py").write_text(
        "from pyinfra import host\nfrom rigup import summary\n\nsummary.track(host.state)\n"
        f"raise ValueError({'hub said: ' + OSC52 + CSI + ' done'!r})\n")
    run, out = _on_a_pty("-y", "@local", str(tmp_path / "play.py"))
    lines = [ln for ln in out.splitlines() if "hub said" in ln]
    print("rc", run.returncode, "; the lines naming the error, as the terminal got them:")
    for ln in lines:
        print("  ", repr(ln))
    assert run.returncode != 0 and lines and "Traceback" in out
    assert "\x1b]52" not in out and "\x1b[2J" not in out and "\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J" in out


def test_a_commands_output_pyinfra_echoes_at_vvv_is_escaped(tmp_path):
    """round 10, TF1: at -vvv pyinfra prints each command's output through its own echo
    (pyinfra.api.output.echo, click.echo), not its log: a host's OSC 52 and CSI reach the terminal
    escaped once a play imports rigup (rigup.text.guard_output), pyinfra's colours kept."""
    (tmp_path / "play.py").write_text(
        "import rigup  # noqa: F401\nfrom pyinfra.operations import server\n\n"
        "server.shell(name='host text', commands=[\"printf 'x\\\\033]52;c;ZWNobyBwd25lZA==\\\\007 \\\\033[2J y\\\\n'\"])\n")
    run, out = _on_a_pty("-y", "-vvv", "@local", str(tmp_path / "play.py"))
    lines = [ln for ln in out.splitlines() if "ZWNobyBwd25lZA" in ln and ">>>" not in ln]
    print("rc", run.returncode, "; the command's output as the terminal got it:")
    for ln in lines:
        print("  ", repr(ln))
    assert run.returncode == 0 and lines
    assert "\x1b]52" not in out and "\x1b[2J" not in out
    assert "x\\x1b]52;c;ZWNobyBwd25lZA==\\x07 \\x1b[2J y" in out and "\x1b[1m" in out


def test_a_hosts_colour_sequences_are_escaped_only_pyinfras_kept():
    """round 10, TF3: colour sequences are kept only in a text click.style wrote in this run
    (rigup.text.styled: pyinfra's format_text and pyinfra_cli's click.style once guarded); a host's
    (black on black, reverse and blink, even pyinfra's own red) are escaped, beside a styled text or
    inside one (styled escapes what it is given). A lone reset stays: it only restores the defaults."""
    host = "disk \x1b[30;40mnot \x1b[0mfull \x1b[7;5mx\x1b[31my\x1b[8m"
    line = f"{styled('[h1]', bold=True)} {styled(host, 'red')} {host}"
    got = terminal_text(line)
    print("host text:", repr(host))
    print("the line: ", repr(got))
    quoted = "disk \\x1b[30;40mnot \x1b[0mfull \\x1b[7;5mx\\x1b[31my\\x1b[8m"
    assert got == f"\x1b[1m[h1]\x1b[0m \x1b[31m{quoted}\x1b[0m {quoted}"
    assert terminal_text("\x1b[31mred\x1b[0m") == "\\x1b[31mred\x1b[0m"   # not written by styled


def test_a_failed_commands_colours_reach_the_terminal_escaped(tmp_path):
    """round 10, TF3, through pyinfra itself on a pty: a failed command's stderr holding black on
    black reaches the terminal escaped, pyinfra's own colours around it kept."""
    (tmp_path / "play.py").write_text(
        "import rigup  # noqa: F401\nfrom pyinfra.operations import server\n\n"
        "server.shell(name='fails', commands=[\"printf 'ERROR: disk \\\\033[30;40mnot \\\\033[0mfull\\\\n' >&2; false\"])\n")
    run, out = _on_a_pty("-y", "@local", str(tmp_path / "play.py"))
    lines = [ln for ln in out.splitlines() if "ERROR: disk" in ln and ">>>" not in ln]
    print("rc", run.returncode, "; the error line as the terminal got it:")
    for ln in lines:
        print("  ", repr(ln))
    assert run.returncode != 0 and lines
    assert "\x1b[30;40m" not in out and all("ERROR: disk \\x1b[30;40mnot \x1b[0mfull" in ln for ln in lines)
    assert "\x1b[31m" in out and "\x1b[1m@local\x1b[0m" in out   # pyinfra's own colours stay
