"""What every reader and writer of the boundary shares: :class:`Unreadable` (a record or value from
outside that does not parse, naming where), :class:`Crossing` (one row of the boundary's table) and
:func:`loads`, the boundary's one JSON parser of a record from outside, and :func:`keys_as_read`, the keys a
program that reads with json.loads takes from a value handed to it."""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple


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


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")


def _finite(digits: str) -> float:
    # json reads 1e400 as inf (Infinity by another spelling, which json.dumps writes back as Infinity:
    # a record rewritten so no longer read; issue 61 round 9 CORE1); the text is JSON's number grammar
    value = float(digits)
    if not math.isfinite(value):
        raise ValueError(f"{digits[:40]} is past a float's range")
    return value


def _once(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:   # json keeps the last: two readers (jq, another rigup) could take different ones
            raise ValueError(f"the key {str(key)[:60]!r} twice")
        out[key] = value
    return out


def loads(text: str | bytes, where: str) -> Any:
    """JSON ``text`` parsed, or :class:`Unreadable` naming ``where``: a key given twice in one object,
    NaN or Infinity (json takes them; JSON has none), a number past a float's range (``1e400``: json's
    inf) and nesting deeper than Python's stack are refused."""
    try:
        return json.loads(text, object_pairs_hook=_once, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise Unreadable(where, f"not JSON ({str(e)[:200] or type(e).__name__})") from None


def keys_as_read(text: str, where: str) -> list[str]:
    """Every key of every object in JSON ``text``, at every depth and each time it is given, as json.loads
    reads them (a key given twice: the last kept; ``\\u0065``: ``e``; NaN taken): what a program that reads
    a value with json.loads takes from it (vLLM's JSON options: issue 61, round 16 V49, a held key spelled
    ``back\\u0065nd`` beside a key given twice, which :func:`loads` refuses), for a caller that judges each
    key. Text json.loads refuses, and nesting deeper than Python's stack, are :class:`Unreadable` naming
    ``where``: the caller refuses it whole, never searching the text."""
    found: list[str] = []

    def pairs(items: list) -> dict:
        found.extend(str(key) for key, _ in items)
        return dict(items)
    try:
        json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError) as e:
        raise Unreadable(where, f"not JSON ({str(e)[:200] or type(e).__name__})") from None
    return found
