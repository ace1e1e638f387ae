"""What every reader and writer of the boundary shares: :class:`Unreadable` (a record or value from
outside that does not parse, naming where) and :class:`Crossing` (one row of the boundary's table)."""

from __future__ import annotations

from typing import NamedTuple


class Unreadable(ValueError):
    """A record from outside that does not parse: ``where`` (the host and file, or the key), ``why``."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class Crossing(NamedTuple):
    """One thing that crosses a trust line: ``what`` crosses, ``writer`` (who can write it), ``reader``
    (``path/to/file.py:function``, its typed reader or writer) and ``users`` (the code that uses what
    the reader returns, or calls the writer: ", "-separated ``path:name``)."""
    what: str
    writer: str
    reader: str
    users: str
