"""rigup-burnin's records, read whole or refused (issue 61): the host's file of records per card
UUID (``rigup_state_dir/burnin.json``, written by roles/burnin/shipped/acceptance.py as root, and by anyone
root on the host by hand) and the controller's copy of it (``$RIGUP_CACHE_DIR/burnin/HOST.json``,
rigup.names.burnin_copy, that roles/burnin keeps at each preflight).

A file is read as a whole: JSON (no NaN, no Infinity, no key twice), a mapping of card ids
(rigup.boundary.fields.ident) to records; each record's known fields typed (numbers through
rigup.boundary.numbers), the fields it does not know kept as written (rigup-burnin adds figures
of its own, issue 62). Anything else is :class:`Unreadable` naming where (``HOST:PATH``) and the
field: its callers fail closed for that host alone (roles/burnin: a quarantine in the last good
copy stays; the host refused, naming the file).

A record carries its format's version (``"schema": N``, at most :data:`SCHEMA`; one without it
is this format as older rigup wrote it). A ``passed`` record is believed only with its level,
the time it finished, the key it was tested under and figures that name no fault; else its
card counts as untested (:attr:`Records.untested`: tested again before it is accepted). A
failed record is believed as it is: its card stays out of serving.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from rigup.boundary import owned
from rigup.boundary.core import Crossing, Unreadable, loads
from rigup.boundary.fields import CONTROL, ident
from rigup.boundary.numbers import json_whole, required

SCHEMA = 2                       # the records' format this rigup reads and rigup-burnin writes (2: issue 62's gemm, power, flagged)
LEVELS = ("quick", "standard", "long")
MAX_CHARS = 1 << 20              # a host's records: a few KiB per card
MAX_CARDS = 1024
MAX_DEPTH = 16                   # figures nest three deep
TEXT_MAX = 4096                  # a failure's text (shown() cuts it for the terminal)
AT_MAX = 4102444800              # 2100-01-01: a record's time, seconds since the epoch
DAY_S = 86400
SKEW_S = DAY_S                   # a host's clock ahead of the controller's by up to this: still a past run
CARD_W = 2000                    # a card's power cap at most (the largest boards' are 1000-1200 W)
GENERIC = ("due",)               # a rule over a record already read (not a reader of its own)

# figures with a meaning of their own: (section, field) -> (kind, lo, hi); None where unknown
FIGURES = {("vram", "mib"): (int, 0, 1 << 24), ("vram", "total_mib"): (int, 0, 1 << 24),
           ("vram", "free_mib"): (int, 0, 1 << 24), ("vram", "patterns"): (int, 0, 1024),
           ("vram", "mismatches"): (int, 0, 1 << 48), ("pcie", "gbps"): (float, 0, 1e5),
           ("pcie", "ratio"): (float, 0, 1e3), ("compute", "wrong"): (int, 0, 1 << 56),
           ("compute", "checked"): (int, 0, 1 << 56), ("soak", "samples"): (int, 0, 1 << 40),
           ("soak", "throttled_ratio"): (float, 0, 1), ("soak", "seconds"): (float, 0, 1e7),
           ("soak", "temp_max_c"): (float, -100, 300), ("soak", "power_max_w"): (float, 0, 1e5)}


# The sizes of a test: none of them 0 in a believed pass (a VRAM test of 0 MiB tested nothing: round 11 B1)
RAN = (("vram", "mib"), ("vram", "patterns"), ("pcie", "gbps"), ("compute", "checked"), ("soak", "samples"),
       ("soak", "seconds"))
# schema 2's GEMM and power (rigup-burnin's record beside its figures): their numbers typed as FIGURES'
SCHEMA2 = {("gemm", "tflops"): (float, 0, 1e7), ("gemm", "repeats"): (int, 0, 1 << 40),
           ("gemm", "differ"): (int, 0, 1 << 40), ("power", "mean_w"): (float, 0, 1e5),
           ("power", "cap_w"): (float, 0, 1e5), ("power", "ratio"): (float, 0, 1e3), ("power", "samples"): (int, 0, 1 << 40)}


class Records(NamedTuple):
    """What a file of records says: ``cards``, card id -> its record (believed: a failure, or a
    pass with its level, time, key and figures), known fields typed and the others kept;
    ``untested``, card id -> why its record is not believed (its card is tested again)."""
    cards: dict
    untested: dict


def _text(value: object, field: str, limit: int = 256, control: bool = False) -> str:
    if not isinstance(value, str) or len(value) > limit or (not control and CONTROL.search(value)):
        raise Unreadable(field, f"not text of at most {limit} characters: {str(value)[:60]!r}")
    return value


def _mapping(value: object, field: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(field, f"not a mapping: {str(value)[:60]!r}")
    return value


def _optional(rec: dict, name: str, read, field: str):
    return None if rec.get(name) is None else read(rec[name], f"{field}.{name}")


def _checked(value: object, field: str, depth: int = 0) -> None:
    """Every number in ``value`` finite and of our size, every text bounded, no deeper than
    :data:`MAX_DEPTH` (what a record keeps that this reader does not know, too)."""
    if depth > MAX_DEPTH:
        raise Unreadable(field, f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for key, item in value.items():
            _checked(item, f"{field}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _checked(item, f"{field}[{i}]", depth + 1)
    elif isinstance(value, str):
        _text(value, field, TEXT_MAX, control=True)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        required(value, field)


def _figures(value: object, field: str) -> dict:
    figures = _mapping(value, field)
    _checked(figures, field)
    for (section, name), (kind, lo, hi) in FIGURES.items():
        part = figures.get(section)
        if isinstance(part, dict) and part.get(name) is not None:
            part[name] = required(part[name], f"{field}.{section}.{name}", kind, lo, hi)
    return figures


def _key(value: object, field: str) -> dict:
    key = dict(_mapping(value, field))
    _checked(key, field)
    driver = key.get("driver")   # nvidia-smi's 550.54 reaches the record as a number
    if driver is not None:
        kind = int if isinstance(driver, int) else float
        key["driver"] = str(required(driver, f"{field}.driver", kind, 0)) if isinstance(driver, (int, float)) \
            else ident(driver, f"{field}.driver")
    key["memory_mib"] = _optional(key, "memory_mib", lambda v, f: required(v, f, int, 0, 1 << 24), field)
    key["power_limit_w"] = _optional(key, "power_limit_w", lambda v, f: required(v, f, float, 0, 1e5), field)
    return key


def _cleared(value: object, field: str) -> dict | None:
    """The operator's clearing of a failed record (``rigup-burnin clear`` writes ``{"at", "by"}``),
    typed; None, no clearing, without its time: ``{}`` or ``{"note": "x"}`` read as a clearing here
    while rigup-burnin and the guard kept the card quarantined (issue 61, round 6 BA6, BA7)."""
    cleared = dict(_mapping(value, field))
    _checked(cleared, field)
    cleared["at"] = _optional(cleared, "at", lambda v, f: required(v, f, float, 0, AT_MAX), field)
    cleared["by"] = _optional(cleared, "by", _text, field)
    return cleared if cleared["at"] is not None else None


def _fault(rec: dict) -> str | None:
    """What a ``passed`` record's own figures say failed, or None: each judgment of rigup-burnin's
    ``judge`` that needs no threshold the record lacks (schema 2's GEMM repeats that differ and its
    error, an Xid during the soak, a worse health reading, a failed DCGM diag: round 11 B1)."""
    figures, gemm = rec["figures"] or {}, rec.get("gemm") if isinstance(rec.get("gemm"), dict) else {}
    for name in ("error", "hung", "lost"):
        if figures.get(name):
            return name
    for section, name, what in (("vram", "mismatches", "VRAM mismatches"), ("compute", "wrong", "wrong answers")):
        part = figures.get(section)
        if isinstance(part, dict) and (part.get(name) or 0) > 0:
            return what
    if (gemm.get("differ") or 0) > 0 or gemm.get("error"):
        return "GEMM repeats that differ" if (gemm.get("differ") or 0) > 0 else "a GEMM error"
    for section, name, what in (("soak", "xids", "an Xid during the soak"), ("health", "worse", "a worse health reading"),
                                ("dcgm", "failed", "a failed DCGM diag")):
        part = figures.get(section)
        if isinstance(part, dict) and part.get(name):
            return what
    return None


def _record(value: object, field: str) -> tuple[dict, str | None]:
    """One card's record, typed, and why a pass in it is not believed (None: believed)."""
    rec = dict(_mapping(value, field))
    if rec.get("schema") is not None:
        schema = required(rec["schema"], f"{field}.schema", int, 1, 1 << 31)
        if schema > SCHEMA:
            raise Unreadable(f"{field}.schema", f"{schema}: a newer rigup-burnin's format (this rigup reads {SCHEMA})")
        rec["schema"] = schema
    if not isinstance(rec.get("passed"), bool):
        raise Unreadable(f"{field}.passed", f"neither true nor false: {str(rec.get('passed'))[:60]!r}")
    failed = rec.get("failed") if rec.get("failed") is not None else []
    if not isinstance(failed, list) or len(failed) > 256:
        raise Unreadable(f"{field}.failed", "not a list of at most 256 texts")
    rec["failed"] = [_text(f, f"{field}.failed[{i}]", TEXT_MAX, control=True) for i, f in enumerate(failed)]
    rec["level"] = rec.get("level")
    if rec["level"] is not None and rec["level"] not in LEVELS:
        raise Unreadable(f"{field}.level", f"not one of {', '.join(LEVELS)}: {str(rec['level'])[:60]!r}")
    rec["at"] = _optional(rec, "at", lambda v, f: required(v, f, float, 0, AT_MAX), field)
    rec["seconds"] = _optional(rec, "seconds", lambda v, f: required(v, f, float, 0, 1e8), field)
    rec["index"] = _optional(rec, "index", _index, field)
    rec["bus_id"] = _optional(rec, "bus_id", ident, field)
    rec["name"] = _optional(rec, "name", _text, field)
    rec["key"] = _optional(rec, "key", _key, field)
    rec["figures"] = _optional(rec, "figures", _figures, field)
    rec["cleared"] = _optional(rec, "cleared", _cleared, field)
    for (section, name), (kind, lo, hi) in SCHEMA2.items():
        part = rec.get(section)
        if part is not None and not isinstance(part, dict):
            raise Unreadable(f"{field}.{section}", f"not a mapping: {str(part)[:60]!r}")
        if part and part.get(name) is not None:
            part[name] = required(part[name], f"{field}.{section}.{name}", kind, lo, hi)
    if rec["cleared"] and rec["at"] is not None and rec["cleared"]["at"] < rec["at"]:
        rec["cleared"] = None   # a clearing older than the run it would clear (re-round 6 NB5): a new failure
    for name, item in rec.items():
        if name not in ("key", "figures", "cleared"):
            _checked(item, f"{field}.{name}")
    if not rec["passed"]:
        return rec, None
    # a key names what the card was tested under, figures a test that ran: {"note": "x"} names
    # neither (issue 61, round 6 BA3, BA4: such a pass was believed, and never due on a key change)
    # rigup-burnin's key holds the driver and the memory at least (the cap is null where nvidia-smi has
    # none), its figures one of FIGURES' measures: one of them, or {"soak": {}}, was believed (re-round 6 NB1, NB2)
    key = all((rec["key"] or {}).get(name) is not None for name in ("driver", "memory_mib"))
    parts = [(name, part) for section, name in FIGURES for part in [(rec["figures"] or {}).get(section)]
             if isinstance(part, dict)]
    ran = any(part.get(name) is not None for name, part in parts) and \
        not any(part.get(name) == 0 for section, name in RAN for part in [(rec["figures"] or {}).get(section)]
                if isinstance(part, dict))
    lacks = [what for what, has in (("level", rec.get("level")), ("finished time", rec["at"]),
                                    ("key", key), ("figures", ran)) if not has]
    if lacks:
        return rec, f"a pass without its {', '.join(lacks)}: not believed"
    fault = _fault(rec) or ("failures" if rec["failed"] else None)
    return rec, f"a pass whose own record names {fault}: not believed" if fault else None


def due(rec: dict, every_days, now: float) -> tuple[int, str] | None:
    """The one re-acceptance rule (``burnin_every_days``; issue 65; roles/burnin/quarantine.py and
    plays/fleet.py both call it): a believed pass is due again when its run finished more than
    ``every_days`` days before ``now``, or when it is dated after ``now`` by more than
    :data:`SKEW_S` (a host's clock ahead, or a hand edit: no past run, else never due before
    :data:`AT_MAX`). ``(days since the run, why)``, or None when not due."""
    at = rec.get("at")
    if not every_days or rec.get("passed") is not True or not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    days = int((now - at) // DAY_S)
    if at > now + SKEW_S:
        return days, (f"re-acceptance: its last run is dated {-days} days in the future (a host's clock ahead, or "
                      f"edited): no past run (burnin_every_days {every_days})")
    if now - at <= every_days * DAY_S:
        return None
    return days, f"re-acceptance: its last run was {days} days ago (burnin_every_days {every_days})"


def _index(value: object, field: str) -> int:
    n = json_whole(value, 1023)   # a JSON int: "3" is text the program never writes
    if n is None:
        raise Unreadable(field, f"not a card index 0..1023: {str(value)[:40]!r}")
    return n


def records(text: str, where: str) -> Records:
    """The records of ``text`` (a file's whole content; empty: no records yet), or
    :class:`Unreadable` naming ``where`` (``HOST:PATH``) and the field that does not read."""
    if not isinstance(text, str):
        raise Unreadable(where, f"not text: {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise Unreadable(where, f"larger than {MAX_CHARS} characters ({len(text)})")
    if not text.strip():
        return Records({}, {})
    doc = loads(text, where)
    if not isinstance(doc, dict):
        raise Unreadable(where, f"not a mapping of card ids to records: {type(doc).__name__}")
    if len(doc) > MAX_CARDS:
        raise Unreadable(where, f"more than {MAX_CARDS} records ({len(doc)})")
    cards, untested = {}, {}
    try:
        for uuid, value in doc.items():
            ident(uuid, "a card id")
            rec, doubt = _record(value, uuid)
            if doubt:
                untested[uuid] = doubt
            else:
                cards[uuid] = rec
    except (Unreadable, RecursionError) as e:
        raise Unreadable(where, f"{e.where}: {e.why}" if isinstance(e, Unreadable) else "nested too deep") from None
    return Records(cards, untested)


def cached(path: str | Path, where: str | None = None) -> Records | None:
    """The controller's copy at ``path`` (:func:`records`), None when there is none yet, or
    :class:`Unreadable` naming ``where`` (default ``controller:PATH``): read only when no other user
    could have written it (rigup.boundary.owned.read: a copy another user wrote could keep a card
    out, or, while the host's own records do not read, let one in), in a directory only you or root
    can write, checked even while it holds no copy yet (roles/burnin kept writes there next)."""
    where = where or f"controller:{path}"
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(parent):   # checked first: a directory another user can write holds no copy of ours
        owned.directory(parent, where)
    if not os.path.lexists(path):
        return None
    return records(owned.read(path, where, limit=MAX_CHARS * 4), where)


PULSE_SCHEMA = 1                 # the pulse record's format (rigup-burnin pulse)


def pulse(text: str, where: str) -> dict | None:
    """The host's pulse record (``rigup_state_dir/burnin-pulse.json``, rigup-burnin pulse), read
    whole: None when there is none yet (empty), else ``{"passed", "at", "failed": [text],
    "key": {"driver", "cards": [card id], "caps_w", "psu_watts"}, "figures": {...}, "untested": why a
    pass is not believed (no figures, or naming a failure: the pulse is due again) or None}`` typed,
    the rest kept as checked; or :class:`Unreadable` naming ``where`` and the field (the host is refused:
    the controller keeps no copy of it; moved aside, the pulse is due again)."""
    if not isinstance(text, str):
        raise Unreadable(where, f"not text: {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise Unreadable(where, f"larger than {MAX_CHARS} characters ({len(text)})")
    if not text.strip():
        return None
    try:
        rec = dict(_mapping(loads(text, where), "the record"))
        schema = required(rec.get("schema"), "schema", int, 1, 1 << 31)
        if schema > PULSE_SCHEMA:
            raise Unreadable("schema", f"{schema}: a newer rigup-burnin's format (this rigup reads {PULSE_SCHEMA})")
        if not isinstance(rec.get("passed"), bool):
            raise Unreadable("passed", f"neither true nor false: {str(rec.get('passed'))[:60]!r}")
        failed = rec.get("failed") if rec.get("failed") is not None else []
        if not isinstance(failed, list) or len(failed) > 256:
            raise Unreadable("failed", "not a list of at most 256 texts")
        rec["failed"] = [_text(f, f"failed[{i}]", TEXT_MAX, control=True) for i, f in enumerate(failed)]
        rec["at"] = required(rec.get("at"), "at", float, 0, AT_MAX)
        key = dict(_mapping(rec.get("key"), "key"))
        _checked(key, "key")
        cards = key.get("cards")
        if not isinstance(cards, list) or len(cards) > MAX_CARDS:
            raise Unreadable("key.cards", f"not a list of at most {MAX_CARDS} card ids")
        key["cards"] = sorted(ident(c, f"key.cards[{i}]") for i, c in enumerate(cards))
        # the figures within what rigup-burnin pulse runs and cards hold (0.5..50 Hz, <= 3600 s, CARD_W a
        # card): 1e7 W of caps was believed, and a cap raised later never made the pulse due (round 6 BA11)
        # per card listed: one card at 2,000,000 W was believed (re-round 6 NB3)
        most = CARD_W * max(1, len(key["cards"]))
        key["caps_w"] = required(key.get("caps_w"), "key.caps_w", float, 0, most)
        key["psu_watts"] = _optional(key, "psu_watts", lambda v, f: required(v, f, float, 0, 1e7), "key")
        key["driver"] = _optional(key, "driver", lambda v, f: ident(str(v) if isinstance(v, (int, float))
                                                                   and not isinstance(v, bool) else v, f), "key")
        rec["key"] = key
        figures = rec["figures"] = _figures(rec.get("figures") or {}, "figures")
        for name, hi in (("peak_w", most), ("hz", 50), ("seconds", 3600)):
            figures[name] = _optional(figures, name, lambda v, f, hi=hi: required(v, f, float, 0, hi), "figures")
        for name, item in rec.items():
            if name not in ("key", "figures"):
                _checked(item, name)
    except (Unreadable, RecursionError) as e:
        raise Unreadable(where, f"{e.where}: {e.why}" if isinstance(e, Unreadable) else "nested too deep") from None
    rec["untested"] = _pulse_doubt(rec) if rec["passed"] else None
    return rec


def _pulse_doubt(rec: dict) -> str | None:
    """Why a ``passed`` pulse record is not believed (as a card's pass, :func:`_record`): without
    its figures (the peak draw, the rate and the time it held: each above 0, as rigup-burnin pulse
    runs one; a pulse of 0 W at 0 Hz for 0 s held nothing, rerun3's NP1), or naming a failure, a
    card off the bus or hung, a power brake or an Xid; None when believed."""
    figures = rec["figures"]
    # as rigup-burnin pulse runs one (burnin_pulse_hz 1..50, burnin_pulse_s 1..3600): 0.001 Hz for 0.001 s
    # held nothing (re-round 6 NB4); half of the least allowed leaves room for what was measured
    lacks = [name for name, least in (("peak_w", 0), ("hz", 0.5), ("seconds", 0.5)) if not (figures.get(name) or 0) > least]
    if lacks:
        return f"a pulse passed without its figures ({', '.join(lacks)} as a pulse runs them): not believed"
    cards = figures.get("cards") if isinstance(figures.get("cards"), dict) else {}
    faults = [what for what, has in (
        ("failures", rec["failed"]), ("faults", rec.get("faults")), ("cards off the bus", figures.get("lost")),
        ("hung cards", figures.get("hung") or any(isinstance(c, dict) and (c.get("hung") or c.get("cuda_lost"))
                                                  for c in cards.values())),
        ("a power brake", figures.get("brake")), ("Xids", figures.get("xids"))) if has]
    return f"a pulse passed whose own record names {', '.join(faults)}: not believed" if faults else None


CROSSINGS = (
    Crossing("rigup-burnin's records of a host's cards (rigup_state_dir/burnin.json)",
             "the host (rigup-burnin as root; root by hand)", "rigup/boundary/burnin.py:records",
             "roles/burnin/facts.py:parse_burnin_state, plays/fleet.py:parse_burnin, "
             "roles/burnin/__init__.py:judged, roles/burnin/quarantine.py:sort_cards, roles/preflight/__init__.py:run"),
    Crossing("the controller's copy of a host's burn-in records ($RIGUP_CACHE_DIR/burnin/HOST.json)",
             "rigup on the controller (roles/burnin: kept), the operator's user",
             "rigup/boundary/burnin.py:cached", "roles/burnin/__init__.py:judged, plays/fleet.py:burnin_part, "
             "roles/burnin/fleetwide.py:other_copies"),
    Crossing("rigup-burnin's pulse record of a host's power delivery (rigup_state_dir/burnin-pulse.json)",
             "the host (rigup-burnin pulse as root; root by hand)", "rigup/boundary/burnin.py:pulse",
             "roles/burnin/facts.py:parse_burnin_state, roles/burnin/quarantine.py:pulse_part"),
)
