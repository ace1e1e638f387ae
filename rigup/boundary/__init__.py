"""The one boundary for what crosses into rigup from outside (issue 61): standard library only, so
that the host programs (roles/*/acceptance.py, guard.py, relay.py, watchdog.py, fetcher.py) can
ship the same code beside them as the contracts are.

- :mod:`rigup.boundary.numbers`: the one number parser (ASCII digits, finite, bounded, no bool),
  for text a host printed and for values a JSON record holds.
- :mod:`rigup.boundary.fields`: names, ids and paths through one validator.
- :mod:`rigup.boundary.owned`: files on the controller named by configuration (key files, the
  artifact cache, netrc, the site directory), used only when their owner and mode say that no
  other user could have written them (OpenSSH's StrictModes).
- :mod:`rigup.boundary.records`: a typed reader per record that crosses a trust line; a record
  that does not parse is :class:`Unreadable`, naming the host and file, and its caller fails
  closed for that host alone.
- :mod:`rigup.boundary.formats`: one writer per foreign format (curl config, llama.cpp's preset
  INI, nftables, systemd units and ``Environment=``, netrc, YAML host_vars, the Prometheus
  exposition, HAProxy's config), each refusing or quoting what has meaning in its format.

:data:`CROSSINGS` is the table of what crosses (who writes it, who reads it, its reader),
rendered to docs/boundary.md by ``make docs``; tests/unit/test_boundary_table.py holds it to the
code in both directions.
"""

from __future__ import annotations

from typing import NamedTuple


class Unreadable(ValueError):
    """A record from outside that does not parse: ``where`` (the host and file, or the key), ``why``."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class Crossing(NamedTuple):
    """One thing that crosses a trust line: ``what`` crosses, ``writer`` (who can write it), ``reader``
    (``path/to/file.py:function``, the typed reader) and ``readers`` (the code that uses what it
    returns, ", "-separated ``path:name``)."""
    what: str
    writer: str
    reader: str
    readers: str


# Filled as each reader lands (tests/unit/test_boundary_table.py: every reader named here exists,
# and every function of rigup/boundary/records.py that reads a record is named here).
CROSSINGS: tuple[Crossing, ...] = ()


def table() -> str:
    """:data:`CROSSINGS` as a Markdown table (docs/boundary.md)."""
    rows = ["| what crosses | who can write it | its reader | who uses what it returns |", "| --- | --- | --- | --- |"]
    rows += [f"| {c.what} | {c.writer} | `{c.reader}` | {', '.join(f'`{r}`' for r in c.readers.split(', '))} |"
             for c in CROSSINGS]
    return "\n".join(rows) + "\n"
