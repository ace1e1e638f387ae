"""Text from outside (a host, a hub, a file a host wrote) made safe for the operator's terminal.

No library of the chosen set does this for a single string (rich and click style text, they do not
neutralise it), so: every character that is not printable (C0 and C1 controls, ESC and so every
escape sequence, DEL, line and paragraph separators, bidirectional overrides) is shown as its
Python escape, and the text is cut to ``limit`` characters with a mark of how much was left out.
"""

from __future__ import annotations


def shown(text: object, limit: int = 200) -> str:
    """``text`` as it may reach a terminal: one line, escapes visible, at most ``limit`` characters."""
    raw = str(text)
    safe = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit])
    return safe + (f"... ({len(raw) - limit} more characters)" if len(raw) > limit else "")
