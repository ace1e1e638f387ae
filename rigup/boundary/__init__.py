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

Each module's ``CROSSINGS`` is its rows of the table of what crosses (who writes it, its reader or
writer, who uses it): :func:`table`, rendered to docs/boundary.md by ``make docs``;
tests/unit/test_boundary_table.py holds it to the code in both directions.
"""

from __future__ import annotations

import importlib

from rigup.boundary.core import Crossing, Unreadable   # noqa: F401  (the names callers use)

# the boundary's modules, each with its own CROSSINGS (tests/unit/test_boundary_table.py holds every
# row to the code: each reader named exists, and each module's readers and writers have a row)
MODULES = ("numbers", "fields", "owned", "burnin", "results", "hosttext", "formats")


def crossings() -> list[Crossing]:
    """Every module's :data:`CROSSINGS`, in :data:`MODULES` order (a module not written yet has none)."""
    rows: list[Crossing] = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"rigup.boundary.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"rigup.boundary.{name}":
                raise
            continue
        rows += getattr(module, "CROSSINGS", ())
    return rows


def _ref(ref: str) -> str:
    path, name = ref.split(":")
    return f"`{path}` {name}"


def table() -> str:
    """:func:`crossings` as a Markdown table (docs/boundary.md)."""
    rows = ["| what crosses | who can write it | its reader or writer | who uses it |", "| --- | --- | --- | --- |"]
    rows += [f"| {c.what} | {c.writer} | {_ref(c.reader)} | {', '.join(_ref(r) for r in c.users.split(', '))} |"
             for c in crossings()]
    return "\n".join(rows) + "\n"
