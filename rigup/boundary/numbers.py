"""The one number parser for what crosses from outside (issue 61): text a host printed (nvidia-smi,
sysfs, a journal line, a curl code) and the values of a JSON or YAML record another party wrote.

No library of the chosen set does this (``int()`` and ``float()`` take ``"١٢"``, ``"1_000"``,
``" inf"``, ``"1e400"`` and ``True``; ``json`` takes ``NaN``), so, by hand:

- text: ASCII digits only, an optional sign and point, at most 18 digits before the point and 12
  after (``places``: up to 17 for text that prints a float64 in full, as Prometheus's API does),
  no leading zero (``0079`` is no Xid code a kernel prints: refused, not 79); no exponent;
- a JSON value: an int or a float, never a bool (``True`` is 1 in Python), finite;
- both: within ``lo``..``hi`` when given; an int from a decimal is truncated.

:func:`number` answers None for what is not a number of ours (a probe's reading: one missing value);
:func:`required` raises :class:`rigup.boundary.Unreadable` naming where it came from (a record's field).
"""

from __future__ import annotations

import math
import re

from rigup.boundary.core import Crossing, Unreadable

_TEXT = re.compile(r"[+-]?(?:0|[1-9][0-9]{0,17})(?:\.([0-9]{1,17}))?")
_WHOLE = re.compile(r"0|[1-9][0-9]{0,17}")
# the blanks around a number that are taken off: ASCII's alone (str.strip() takes U+00A0 and U+2003 too,
# which YAML and JSON keep as text: '0\xa0' was 0 here and text to the YAML loader)
_BLANK = " \t\r\n\f\v"


def number(value: object, kind: type = float, lo: float | None = None, hi: float | None = None,
           places: int = 12):
    """``value`` (text or a JSON number) as ``kind`` (int or float), or None when it is not a finite
    number of the form above within ``lo``..``hi`` (text: at most ``places`` digits after the point)."""
    if isinstance(value, bool) or kind not in (int, float):
        return None
    if isinstance(value, (int, float)):
        parsed = value
    elif isinstance(value, (str, bytes)):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        text = text.strip(_BLANK)
        match = _TEXT.fullmatch(text)
        if not match or len(match.group(1) or "") > places:
            return None
        parsed = float(text) if "." in text else int(text)
    else:
        return None
    if isinstance(parsed, float) and not math.isfinite(parsed):
        return None
    if abs(parsed) >= 1e18 or (lo is not None and parsed < lo) or (hi is not None and parsed > hi):
        return None
    return int(parsed) if kind is int else float(parsed)


def whole(value: object, hi: int | None = None) -> int | None:
    """A whole number (a count, a port, bytes): text of ASCII digits alone (no sign, no point, no
    leading zero) or a JSON int, at most ``hi``; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 10**18 and (hi is None or value <= hi) else None
    if isinstance(value, str) and _WHOLE.fullmatch(value.strip(_BLANK)):
        n = int(value.strip(_BLANK))
        return n if hi is None or n <= hi else None
    return None


def json_whole(value: object, hi: int | None = None, lo: int = 0) -> int | None:
    """A whole number of a JSON record: a JSON int alone (never text, a float or a bool), ``lo``..``hi``
    (``lo`` below 0 is 0: a whole number has no sign); else None. A record rigup's programs write holds
    its counts and indexes as ints: ``"3"`` is not one."""
    got = whole(value, hi) if isinstance(value, int) else None
    return got if got is not None and got >= lo else None


# shares per GPU as llama.cpp takes them (:func:`shares`; a sweep's result is read by it too)
SHARES = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?(?:,[0-9]{1,6}(?:\.[0-9]{1,6})?){0,63}")


def shares(value: object) -> list[float] | None:
    """llama.cpp's ``-ts`` (tensor_split): up to 64 shares per GPU separated by commas, each ASCII digits
    (at most 6 before the point and 6 after, so that llama.cpp's std::stof reads it: past a float it
    throws and the server exits at its arguments), at least one above 0 (all zero puts a layer on no
    card); else None."""
    if not isinstance(value, str) or not SHARES.fullmatch(value):
        return None
    got = [float(share) for share in value.split(",")]
    return got if any(got) else None


def required(value: object, where: str, kind: type = float, lo: float | None = None, hi: float | None = None):
    """:func:`number`, or :class:`rigup.boundary.Unreadable` naming ``where`` and the bounds."""
    got = number(value, kind, lo, hi)
    if got is None:
        bounds = f" in {lo}..{hi}" if lo is not None or hi is not None else ""
        raise Unreadable(where, f"not a finite {kind.__name__}{bounds}: {str(value)[:40]!r}")
    return got


CROSSINGS = (
    Crossing("a number a host printed (nvidia-smi, sysfs, a curl code, a journal line)", "the host",
             "rigup/boundary/numbers.py:number",
             "rigup/gpu/facts.py:parse_gpus, plays/fleet.py:parse_cards, plays/fleet.py:parse_serving, "
             "rigup/gpu/fabric.py:parse_nvlinks"),
    Crossing("the port of a web origin in configuration (llama_server_cors_origins)", "the operator",
             "rigup/boundary/numbers.py:whole", "rigup/instances/llama_server.py:cors_problems"),
    Crossing("a whole number a host printed (a signal in systemd's status, du's bytes, nvidia-smi's compute "
             "capability)", "the host", "rigup/boundary/numbers.py:whole",
             "rigup/gate.py:_signal, rigup/gpu/catalogue.py:parse_cc, roles/preflight/facts.py:parse_path_bytes"),
    Crossing("a flag's value an instance's extra_args gives again (-ngl N)", "the operator",
             "rigup/boundary/numbers.py:number", "roles/llama_server/checks.py:settings"),
    Crossing("a figure a serving instance answers (a completion's usage.completion_tokens, /metrics' "
             "llamacpp:tokens_predicted_total) or nvidia-smi prints to the guard (a draw, a temperature); each host "
             "program carries its own copy of the rule, held to this one by tests", "the server, the host",
             "rigup/boundary/numbers.py:number", "shipped/throughput.py:figure, roles/gpu_guard/shipped/guard.py:reading"),
    Crossing("shares per GPU (tensor_split: an instance's, a router model's, a sweep's point), read by llama.cpp's "
             "std::stof", "the operator, the rigup user (a sweep's result)", "rigup/boundary/numbers.py:shares",
             "rigup/instances/llama_server.py:split_problems, rigup/boundary/results.py:_shares"),
)

GENERIC = ("whole", "required", "json_whole")   # the same parser, for counts and for a record's required field
