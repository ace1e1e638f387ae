"""Forms of the entries of nested maps (``models``, ``llama_server_instances``, ...), in the form
language of rigup/config.py, with each key's default and doc; validation with key paths::

    llama_server_instances.glm.ctx: expected int 1.., got 'big' (str)

A role that owns a nested map declares its entry form in ``roles/<role>/schema.py`` as a dict of
:class:`Key`; the map itself is declared ``[map]`` in the role's defaults.yml.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from rigup.config import NAME, parse_form
from rigup.contract import REQUIRED   # one sentinel for the contract's rows and the Keys

@dataclass(frozen=True)
class Key:
    """One key of an entry: its form, its default (REQUIRED: none) and what it means."""

    form: str
    default: Any = REQUIRED
    doc: str = ""


_UNNAMED = object()   # normalise's entry has no name of its own (None is a key YAML may give: ``~:``)


def normalise(entry: Any, schema: dict[str, Key], where: str, name: Any = _UNNAMED) -> tuple[dict, list[tuple[str, str]]]:
    """``entry`` with every default filled in, and (key path, problem) for each key that is
    unknown, missing or not of its form; ``name``: the entry's own key, when it becomes a unit,
    file or directory name (it must be a name: rigup.config.NAME)."""
    if name is not _UNNAMED and not (isinstance(name, str) and NAME.fullmatch(name)):
        # YAML 1.1 reads a bare on/off/yes/no as a bool and 1 as an int: a key that is no text is no name
        said = f" ({type(name).__name__}: quote it)" if not isinstance(name, str) else ""
        return {}, [(where, f"{name!r}{said} is not a name: 1-64 letters, digits, '_', '.' or '-', starting with "
                           "a letter or digit, not ending in a systemd unit type such as .timer or .socket (it becomes a unit, "
                           "file or directory name)")]
    if not isinstance(entry, dict):
        return {}, [(where, f"expected a map of {', '.join(schema)}, got {entry!r}")]
    out: dict[str, Any] = {}
    problems = []
    for key, value in entry.items():
        if key not in schema:
            close = difflib.get_close_matches(str(key), schema, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((f"{where}.{key}", f"unknown key{hint}; known keys: {', '.join(schema)}"))
            continue
        form = parse_form(schema[key].form)
        why = form.problem_of(key, value)
        if why:
            problems.append((f"{where}.{key}", f"expected {form.text}, {why}"))
        else:
            out[key] = value
    for key, spec in schema.items():
        if key in out:
            continue
        if spec.default is REQUIRED:
            if key not in entry:
                problems.append((f"{where}.{key}", f"required ({spec.form})"))
        else:
            out[key] = list(spec.default) if isinstance(spec.default, list) else \
                dict(spec.default) if isinstance(spec.default, dict) else spec.default
    return out, problems


def unknown_reference(value: Any, keys, what: str) -> str:
    """The problem text of ``value`` that is not one of ``keys`` (the keys of ``what``)."""
    keys = list(keys)
    close = difflib.get_close_matches(str(value), keys, n=1)
    listed = f"its keys: {', '.join(keys)}" if keys else f"{what} is empty"
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{value!r} is not a key of {what} ({listed}{hint})"
