"""Text from outside (a host, a hub, a file a host wrote) made safe for the operator's terminal.

No library of the chosen set does this for a single string (rich and click style text, they do not
neutralise it), so: every character that is not printable (C0 and C1 controls, ESC and so every
escape sequence, DEL, line and paragraph separators, bidirectional overrides) is shown as its
Python escape, and the text is cut to ``limit`` characters with a mark of how much was left out.
"""

from __future__ import annotations

import itertools


def shown(text: object, limit: int = 200) -> str:
    """``text`` as it may reach a terminal: one line, escapes visible, at most ``limit`` characters
    (escapes counted as shown: ``\\x1b`` is 4), then how many characters of ``text`` were left out."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def shown_lines(text: str, limit: int = 300, last: int | None = 60) -> str:
    """A host's multi-line text (a journal, a table) as :func:`shown` lines: its ``last`` lines (all
    with None), each escaped and cut to ``limit`` (a final newline kept). Lines end at ``\\n`` (or
    ``\\r\\n``) only: the other separators str.splitlines knows (``\\x1c``, ``\\x85``, ``\\u2028``) are
    escaped in their line, so each line shown is a line of ``text``."""
    text = str(text)
    lines = text.replace("\r\n", "\n").split("\n")[:-1 if text.endswith("\n") else None]
    out = "\n".join(shown(line, limit) for line in (lines[-last:] if last is not None else lines))
    return out + "\n" if text.endswith("\n") and out else out


def say(line: str, fg: str | None = None) -> None:
    """One line for the operator (stderr, as pyinfra's own), ``fg`` its colour: built by rigup
    around what hosts said, so escaped whole (:func:`shown`, up to 4000 characters)."""
    import click   # here: the GPU scripts import this module with a plain python3

    text = shown(line, 4000)
    click.echo(click.style(text, fg=fg) if fg else text, err=True)
