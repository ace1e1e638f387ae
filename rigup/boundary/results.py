"""Typed readers of what the tuner and the llama.cpp builds leave behind (issue 61, classes 2 and 3):

- a sweep's result (plays/shipped/tune.py's RESULT, written by the rigup user on the host): it becomes the
  host's data (``host_vars/<host>.yml``, ``llama_server_tuned``), so every field that reaches it is
  typed and bounded before anything is written (:func:`sweep`);
- a build's stamp (``builds/<id>/rigup-build.json``, templates/llama_cpp-build.sh.j2): a bad one
  makes that build unknown on that host, never a crash of the run (:func:`stamp`);
- a build's smoke result (``builds/<id>/rigup-smoke.json``, roles/llama_cpp/shipped/smoke.py): a bad one
  makes that build's smoke unknown (smoked again), never a crash (:func:`smoke`);
- the controller's record of an artifact in ``llama_cpp_artifacts`` (roles/llama_cpp/artifact.py):
  the hash a receiving host must match and the host that offers it (:func:`artifact_record`);
- roll.py's journal of the roll in progress: what a roll killed midway left (:func:`roll_journal`);
- what bench.py reads back from a host: shipped/throughput.py's line (:func:`throughput`), llama-bench's
  JSON (:func:`llama_bench`) and a model's completion marker (:func:`marker`): one that does not read
  is that instance or model not measured, never a crash of the run.

Each record may say its format (``"schema": N``); one without it is the format written before
rigup wrote one, read as :data:`SCHEMA`; a larger one (a newer rigup's) is refused. Fields a reader
does not know are kept as they are (nothing reads them). A record that does not read is
:class:`rigup.boundary.core.Unreadable` naming ``where`` (the host and the file) and the field.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from rigup.boundary import fields
from rigup.boundary.core import Crossing, Unreadable, loads
from rigup.boundary.hosttext import MAX_BYTES as MODEL_BYTES
from rigup.boundary.numbers import SHARES as TENSOR_SPLIT, json_whole, number, shares
from rigup.contract.llama_server import CACHE_TYPES

SCHEMA = 1   # the format of the records these readers read and rigup writes

INT32 = 2**31 - 1     # llama.cpp reads its integer flags with std::stoi
TPS_MAX = 1e7         # tok/s: far above what a whole host's GPUs generate
TPS_FLOOR = 0.01      # tok/s: the least non-zero figure plays/shipped/tune.py score() gives (2 places)
SECONDS_MAX = 1e7     # a sweep's or a build's seconds (115 days)
LEVEL_MAX = 65536     # a concurrency level of the sweep's client
LIST_MAX = 4096       # the points of a sweep, the levels of a point, the CPU flags of a runtime
TEXT_MAX = 2000       # a free text field (why a sweep stopped, a compiler's version line)
SIZE_MAX = 1 << 40    # an artifact's bytes

# the sweep's statuses of a point (plays/shipped/tune.py measure)
STATUSES = ("ok", "no-fit", "crash", "cpu-fallback", "failed-requests", "timeout")
# a build's resolved commit: a git object id, or "archive" (llama_cpp_archive)
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}|archive")
KEY = re.compile(r"[0-9a-f]{16}")                      # an artifact key (roles/llama_cpp/artifact.py key)
CPU_FLAG = re.compile(r"[a-z0-9_.]{1,32}")             # /proc/cpuinfo's flag names
# a trap's id and a remedy's flag as a smoke result records them (rigup/traps.py takes its ID and
# REMEDY_FLAG from here: rigup.traps reads YAML, which the boundary does not import)
TRAP_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
REMEDY_FLAG = re.compile(r"--[a-z][a-z0-9-]{0,40}")
HOST = re.compile(r"@?[A-Za-z0-9][A-Za-z0-9_.:@/+-]{0,252}")   # an inventory host's name


def _loaded(value: Any, where: str) -> Any:
    """``value`` parsed when it is JSON text (:func:`rigup.boundary.core.loads`: no NaN or Infinity, no
    key given twice)."""
    return loads(value, where) if isinstance(value, (str, bytes)) else value


def _record(value: Any, where: str) -> dict:
    """A JSON object of a format this rigup reads (``schema``: absent, or at most :data:`SCHEMA`)."""
    doc = _loaded(value, where)
    if not isinstance(doc, dict):
        raise Unreadable(where, f"not a JSON object: {type(doc).__name__}")
    if "schema" in doc and _int(doc["schema"], f"{where}: schema", 1, 10**6) > SCHEMA:
        raise Unreadable(where, f"written by a newer rigup (schema {doc['schema']}; this one reads {SCHEMA})")
    return doc


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    """A whole number (a JSON int, an integral float or digits) within ``lo``..``hi``."""
    got = number(value, float, lo, hi)
    if got is None or not got.is_integer():
        raise Unreadable(where, f"not a whole number in {lo}..{hi}: {str(value)[:40]!r}")
    return int(got)


def _float(value: Any, where: str, lo: float, hi: float) -> float:
    got = number(value, float, lo, hi)
    if got is None:
        raise Unreadable(where, f"not a finite number in {lo:g}..{hi:g}: {str(value)[:40]!r}")
    return got


def _text(value: Any, where: str, limit: int = TEXT_MAX) -> str:
    """Text of at most ``limit`` characters with no control character (it is shown and written)."""
    if not isinstance(value, str) or len(value) > limit or fields.CONTROL.search(value):
        raise Unreadable(where, f"not text of at most {limit} characters: {str(value)[:40]!r}")
    return value


def _prose(value: Any, where: str) -> str:
    """Free text a party wrote (why a sweep stopped: a server's last log line, escapes and all),
    at most :data:`TEXT_MAX` characters; shown only through rigup.text.shown."""
    if not isinstance(value, str) or len(value) > TEXT_MAX:
        raise Unreadable(where, f"not text of at most {TEXT_MAX} characters: {str(value)[:40]!r}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def read(value: Any, where: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise Unreadable(where, f"not one of {'|'.join(choices)}: {str(value)[:40]!r}")
        return value
    return read


def _whole(lo: int, hi: int) -> Callable[[Any, str], int]:
    return lambda value, where: _int(value, where, lo, hi)


def _optional(read: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda value, where: None if value is None else read(value, where)


def _list(read: Callable[[Any, str], Any], limit: int = LIST_MAX) -> Callable[[Any, str], list]:
    def items(value: Any, where: str) -> list:
        if not isinstance(value, list) or len(value) > limit:
            raise Unreadable(where, f"not a list of at most {limit}: {str(value)[:40]!r}")
        return [read(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return items


def _typed(doc: dict, where: str, known: dict[str, tuple[Callable[[Any, str], Any], bool]]) -> dict:
    """``doc`` with each ``known`` field (name -> (reader, required)) read, the others kept."""
    out = dict(doc)
    for name, (read, needed) in known.items():
        if name in doc:
            out[name] = read(doc[name], f"{where}: {name}")
        elif needed:
            raise Unreadable(where, f"no {name}")
    return out


# ----------------------------------------------------------------------------- a sweep's result
# the swept flags (rigup/contract/llama_server.py SWEPT) as their instance keys take them
FLAGS: dict[str, Callable[[Any, str], Any]] = {
    "ctx": _whole(1, INT32),
    "parallel": _whole(1, 256),          # llama_server_tune_max_parallel's bound
    "ngl": _whole(-1, INT32),
    "flash_attn": _choice(("on", "off", "auto")),
    "split_mode": _choice(("none", "layer", "row", "tensor")),
    "batch": _whole(1, INT32),
    "ubatch": _whole(1, INT32),
    "cache_type_k": _choice(CACHE_TYPES),
    "cache_type_v": _choice(CACHE_TYPES),
    "cache_ram": _whole(-1, INT32),
    "n_cpu_moe": _whole(0, INT32),
    "main_gpu": _whole(0, 255),
    "tensor_split": lambda value, where: _shares(value, where),
}


def _shares(value: Any, where: str) -> str:
    """``-ts``: shares per GPU (numbers and commas), at least one of them above 0 (all zero gives
    llama.cpp no card to put a layer on)."""
    text = fields.matched(TENSOR_SPLIT, value, where, "shares per GPU (numbers and commas)")
    if shares(text) is None:
        raise Unreadable(where, f"no share above 0: {text[:60]!r}")
    return text


def _on_gpus(doc: dict, where: str, gpus: int) -> None:
    """Every point's ``main_gpu`` one of the ``gpus`` the sweep's servers see, and its
    ``tensor_split`` at most one share per GPU: plays/shipped/tune.py sets them only so (split_stages); a
    main GPU 255 on a host of one card was written into host_vars as measured."""
    chosen = [("best", doc["best"]), ("baseline", doc["baseline"])]
    for name, point in [*((f"points[{i}]", p) for i, p in enumerate(doc["points"])), *chosen]:
        flags = (point or {}).get("flags") or {}
        if flags.get("main_gpu") is not None and flags["main_gpu"] >= gpus:
            raise Unreadable(f"{where}: {name}: flags.main_gpu", f"{flags['main_gpu']}: the sweep's servers see {gpus} GPU(s)")
        if flags.get("tensor_split") is not None and flags["tensor_split"].count(",") + 1 > gpus:
            raise Unreadable(f"{where}: {name}: flags.tensor_split",
                             f"{flags['tensor_split'][:60]!r}: more shares than the {gpus} GPU(s) the sweep's servers see")


def _flags(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(where, f"not a map of flags: {str(value)[:40]!r}")
    unknown = [k for k in value if k not in FLAGS]
    if unknown:
        raise Unreadable(where, f"not a flag the sweep sets: {str(unknown[0])[:40]!r} (it sets {', '.join(FLAGS)})")
    return {k: FLAGS[k](v, f"{where}.{k}") for k, v in value.items()}


def _level(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(where, "not a map")
    return _typed(value, where, {"concurrency": (_whole(1, LEVEL_MAX), True),
                                 "total_tps": (lambda v, w: _float(v, w, 0, TPS_MAX), True)})


def _point(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(where, "not a map")
    point = _typed(value, where, {"flags": (_flags, True), "status": (_choice(STATUSES), True),
                                  "tps": (_optional(lambda v, w: _float(v, w, 0, TPS_MAX)), False),
                                  "levels": (_list(_level, 64), False)})
    if point["status"] == "ok" and point.get("tps") is None:
        raise Unreadable(where, "a point that served has no tps")
    # plays/shipped/tune.py score() rounds to 2 places: a measured tps is 0 or at least 0.01, so a best
    # over a baseline is finite (5e-324 made it inf: 'tuned infx')
    if point.get("tps") is not None and 0 < point["tps"] < TPS_FLOOR:
        raise Unreadable(f"{where}.tps", f"{point['tps']} tok/s: neither 0 nor at least {TPS_FLOOR} as the tuner measures")
    return point


def _served(value: Any, where: str) -> dict | None:
    """The baseline or the best: a point that served, or None."""
    if value is None:
        return None
    point = _point(value, where)
    if point["status"] != "ok":
        raise Unreadable(where, f"the best or baseline point did not serve ({point['status']})")
    return point


def sweep(value: Any, where: str, gpus: int | None = None) -> dict:
    """A sweep's result (JSON text, or what it parsed to), its fields typed and bounded: tok/s
    finite within 0..:data:`TPS_MAX`, each flag one the sweep sets and of its form (ctx a whole
    number llama.cpp takes, ``tensor_split`` numbers and commas, one above 0), levels whole; the
    best one of the points and the ratio its best over its baseline (:func:`_agrees`); with
    ``gpus`` (the GPUs the sweep's servers see: its spec's), ``main_gpu`` below it and no more
    shares than it (:func:`_on_gpus`); or :class:`Unreadable` naming ``where`` and the field."""
    seconds = _optional(lambda v, w: _float(v, w, 0, SECONDS_MAX))
    doc = _typed(_record(value, where), where, {
        "concurrency": (_whole(1, LEVEL_MAX), True),
        "levels": (_optional(_list(_whole(1, LEVEL_MAX), 64)), False),
        "points": (_list(_point), True),
        "baseline": (_served, True),
        "best": (_served, True),
        "ratio": (_optional(lambda v, w: _float(v, w, 0, 1e6)), True),
        "spent_s": (seconds, True),
        "budget_s": (seconds, False),
        "stopped": (_optional(_prose), True),
        "layers": (_optional(_whole(0, 1 << 20)), False),
    })
    _agrees(doc, where)
    if gpus is not None:
        _on_gpus(doc, where, gpus)
    return doc


def _agrees(doc: dict, where: str) -> None:
    """A sweep's best is one of its measured points, and its ratio the one its best and baseline
    give; else :class:`Unreadable`. plays/shipped/tune.py makes the best a point that served and rounds
    the ratio to 3 places; a best no point measured (ctx 131072 at 500 tok/s among points all at
    ctx 4096 and 10 tok/s) would be written into host_vars as measured. A ratio that disagrees is
    refused, not replaced by the reader's own: the record is then not what the tuner wrote, and
    nothing else in it is believed (round 3 of issue 61, items 2 and 3). The baseline too is a
    measured point (round 4: a baseline of 0.5 tok/s no point measured gave 'tuned 20.00x')."""
    best, baseline, ratio = doc["best"], doc["baseline"], doc["ratio"]
    for name, chosen in (("best", best), ("baseline", baseline)):   # a baseline no point measured makes any ratio
        if chosen is not None and not any(p["status"] == "ok" and p["flags"] == chosen["flags"]
                                          and p["tps"] == chosen["tps"] for p in doc["points"]):
            raise Unreadable(f"{where}: {name}", f"flags {str(chosen['flags'])[:80]} at {chosen['tps']} tok/s: "
                                                 "not one of the points the sweep measured")
    if ratio is None:
        return   # a sweep written while running, or whose baseline served nothing
    if best is None or baseline is None or not baseline["tps"]:
        raise Unreadable(f"{where}: ratio", f"{ratio} with no best and baseline tok/s to give one")
    if abs(ratio - best["tps"] / baseline["tps"]) > 0.0005 + 1e-9 * ratio:   # plays/shipped/tune.py rounds to 3 places
        raise Unreadable(f"{where}: ratio", f"{ratio}, while the best's {best['tps']} tok/s over the baseline's "
                                            f"{baseline['tps']} is {best['tps'] / baseline['tps']:.3f}")


# ----------------------------------------------------------------------------- bench.py's readings
COUNT_MAX = 1 << 31   # a level's requests, failures and tokens

def _cell(limit: int) -> Callable[[Any, str], str]:
    """Text that becomes a cell of a report's Markdown table: :func:`_text` without a ``|``."""
    def read(value: Any, where: str) -> str:
        text = _text(value, where, limit)
        if "|" in text:
            raise Unreadable(where, f"a '|' (a report's table cell): {text[:40]!r}")
        if not text.isprintable():   # a format character (a soft hyphen, U+00AD) hides in a table too
            raise Unreadable(where, f"not printable text: {text[:40]!r}")
        return text
    return read


def _measured(value: Any, where: str) -> dict:
    """One level of shipped/throughput.py's sweep (its ``level``), its tok/s backed by its counts: a
    rate above 0 needs a request answered and tokens (requests 0, tokens 0 and 9999999 tok/s was
    read as measured: rerun 2 of issue 61, N4), and its total tok/s is its tokens over its seconds
    as throughput.py gives them (seconds rounded to 3 places, tok/s to 2)."""
    if not isinstance(value, dict):
        raise Unreadable(where, "not a map")
    count, tps = _whole(0, COUNT_MAX), lambda v, w: _float(v, w, 0, TPS_MAX)
    level = _typed(value, where, {"concurrency": (_whole(1, LEVEL_MAX), True), "requests": (count, True),
                                  "failed": (count, True), "tokens": (count, False),
                                  "seconds": (lambda v, w: _float(v, w, 0, SECONDS_MAX), False),
                                  "total_tps": (tps, True), "per_request_tps": (tps, True),
                                  "errors": (_list(_prose, 16), False)})
    rates, tokens, seconds = (level["total_tps"], level["per_request_tps"]), level.get("tokens"), level.get("seconds")
    if any(rates) and (not level["requests"] or tokens == 0):
        raise Unreadable(where, f"{max(rates)} tok/s of {level['requests']} request(s) and {tokens} token(s)")
    if tokens is not None and seconds is not None:
        lo, hi = tokens / (seconds + 0.0005), tokens / (seconds - 0.0005) if seconds > 0.0005 else float("inf")
        if not lo - 0.005 <= level["total_tps"] <= hi + 0.005:
            raise Unreadable(f"{where}: total_tps", f"{level['total_tps']}, while its {tokens} tokens over "
                                                    f"{seconds} s are {tokens / seconds if seconds else float('inf'):.2f} tok/s")
    return level


def throughput(value: Any, where: str) -> dict:
    """shipped/throughput.py's line (``sweep``: JSON text or what it parsed to) as ``{"levels": [level]}``
    (each level's counts whole, its tok/s finite within 0..:data:`TPS_MAX`) or ``{"error": why it
    measured nothing}``; or :class:`Unreadable` naming ``where`` and the field. Only those two keys
    are returned: the line's others (``url``...) never stand over what the controller knows."""
    doc = _typed(_record(value, where), where, {"levels": (_list(_measured, 64), False), "error": (_prose, False)})
    if "levels" in doc:
        return {"levels": doc["levels"]}
    if "error" in doc:
        return {"error": doc["error"]}
    raise Unreadable(where, "neither levels nor an error")


def llama_bench(value: Any, where: str) -> dict:
    """llama-bench's ``-o json`` of one test (JSON text or what it parsed to: a list of one
    result), the figures of a report's row: ``avg_ts`` and ``stddev_ts`` finite within
    0..:data:`TPS_MAX` (never a bool: true was 1 tok/s, 1e999 infinite), ``backends`` (or
    ``backend``), ``build_commit``, ``model_type`` text for a table cell, ``n_threads`` whole; or
    :class:`Unreadable` naming ``where`` and the field."""
    doc = _loaded(value, where)
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict):
        raise Unreadable(where, f"not a list of llama-bench results: {str(doc)[:40]!r}")
    tps = lambda v, w: _float(v, w, 0, TPS_MAX)   # noqa: E731
    text = _optional(_cell(200))
    got = _typed(doc[0], f"{where}[0]", {"avg_ts": (tps, True), "stddev_ts": (tps, True), "backends": (text, False),
                                         "backend": (text, False), "n_threads": (_optional(_whole(0, 1 << 16)), False),
                                         "build_commit": (text, False), "model_type": (text, False)})
    return {"tps": got["avg_ts"], "stddev": got["stddev_ts"], "backend": got.get("backends") or got.get("backend"),
            "threads": got.get("n_threads"), "build": got.get("build_commit"), "model": got.get("model_type")}


# ----------------------------------------------------------------------------- a model's completion marker
FILES_MAX = 1 << 16   # the files of one model repository


def marker(value: Any, where: str) -> dict:
    """A model's completion marker (``<dest>/.rigup-complete.json``, roles/model_fetch/shipped/fetcher.py
    writes it as the rigup user: JSON text or what it parsed to): ``files`` relative paths that stay
    in the model's directory (rigup.boundary.fields.inside), ``repo`` and ``revision`` text,
    ``bytes`` whole; or :class:`Unreadable` naming ``where`` and the field (that model is then not
    complete to its reader: a list, or JSON nested 200000 deep, ended bench.py's run for every host)."""
    return _typed(_record(value, where), where, {
        "files": (_list(fields.inside, FILES_MAX), False),
        "repo": (lambda v, w: _text(v, w, 400), False),
        "revision": (lambda v, w: _text(v, w, 200), False),
        # a JSON int alone, as rigup-fetch writes and its own reader (marker_of) takes it: "1000" or 1.0
        # read as complete here and as no marker there (issue 61, re-round 6 NM1)
        "bytes": (_json_int(0, 1 << 60), False),
    })


def _map(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(where, f"not a map: {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------- a model's probe line
def model_probe(value: Any, where: str) -> dict:
    """One model's line of the fetch probe (roles/model_fetch/shipped/fetcher.py ``probe_one``, or
    ``probe``'s ``probe_error``), the fields the plan reads typed: the switches true or false, paths
    text, byte counts JSON whole numbers within :data:`MODEL_BYTES`, ``damaged`` and ``previous``
    lists, ``planted`` (path, what) pairs, ``reusable`` path -> bytes, ``hub_error`` a status, a code
    and its message; the others (marker, serving, progress, job, hub_files) are their own readers'.
    Else :class:`Unreadable` naming the field (round 34 M34a: a list for ``damaged`` or text for
    ``free_bytes`` raised inside the plan, and the run ended for every host)."""
    doc = _map(value, where)
    if not isinstance(doc.get("name"), str):
        raise Unreadable(where, "no model's name")
    flag, path, said = _optional(_bool), _optional(lambda v, w: _text(v, w, 4096)), _optional(_prose)
    size = _json_int(0, MODEL_BYTES)

    def pair(v: Any, w: str) -> list:
        if not isinstance(v, list) or len(v) != 2:
            raise Unreadable(w, f"not a (path, what) pair: {str(v)[:40]!r}")
        return [_prose(v[0], f"{w}[0]"), _prose(v[1], f"{w}[1]")]

    def error(v: Any, w: str) -> dict:
        return _typed(_map(v, w), w, {"status": (_optional(_json_int(0, 999)), False),
                                      "code": (_optional(lambda x, y: _text(x, y, 64)), False), "message": (_prose, True)})

    return _typed(doc, where, {
        "running": (flag, False), "complete": (flag, False), "staged": (flag, False),
        "dest": (path, False), "where": (path, False), "unsafe_parent": (said, False), "probe_error": (said, False),
        "have_bytes": (_optional(size), False), "free_bytes": (_optional(size), False),
        "damaged": (_optional(_list(_prose)), False), "previous": (_optional(_list(_prose)), False),
        "planted": (_optional(_list(pair)), False), "hub_error": (_optional(error), False),
        "reusable": (_optional(lambda v, w: {k: size(n, f"{w}.{k[:60]}") for k, n in _map(v, w).items()}), False),
    })


def _json_int(lo: int, hi: int) -> Callable[[Any, str], int]:
    def read(value: Any, where: str) -> int:
        got = json_whole(value, hi, lo)
        if got is None:
            raise Unreadable(where, f"not a JSON whole number in {lo}..{hi}: {str(value)[:40]!r}")
        return got
    return read


# ----------------------------------------------------------------------------- a build's stamp
def stamp(value: Any, where: str, build: str | None = None) -> dict:
    """A build's stamp (JSON text or what it parsed to): ``id`` an id (and ``build``, its
    directory's name, when given), ``commit`` a git object id or "archive", ``seconds`` whole,
    the version lines text; or :class:`Unreadable` naming ``where``."""
    doc = _typed(_record(value, where), where, {
        "id": (fields.ident, True),
        "ref": (lambda v, w: _text(v, w, 200), False),
        "commit": (lambda v, w: fields.matched(COMMIT, v, w, "a commit id or 'archive'"), False),
        "seconds": (_whole(0, int(SECONDS_MAX)), False),
        "compiler": (lambda v, w: _text(v, w, 200), False),
        "cmake": (lambda v, w: _text(v, w, 200), False),
    })
    if build is not None and doc["id"] != build:
        raise Unreadable(where, f"the stamp of another build ({doc['id']!r})")
    return doc


# ----------------------------------------------------------------------------- a build's smoke result
def smoke(value: Any, where: str) -> dict:
    """A build's smoke result (roles/llama_cpp/shipped/smoke.py's ``builds/<id>/rigup-smoke.json``, JSON
    text or what it parsed to): ``ok`` a bool, ``key`` the spec's key (16 hex digits), ``seconds``
    finite, ``traps`` trap ids and ``server_args`` bare ``--flags`` (they reach the instances'
    units), ``runs`` maps whose ``ok`` is a bool and figures numbers, ``compare`` a map whose ``ok`` is
    a bool and figures finite; or
    :class:`Unreadable` naming ``where`` and the field (the build's smoke is then unknown: run again)."""
    def flag(pattern: re.Pattern, what: str) -> Callable[[Any, str], str]:
        return lambda v, w: fields.matched(pattern, v, w, what)

    seconds = _optional(lambda v, w: _float(v, w, 0, SECONDS_MAX))
    rates = _list(lambda v, w: _float(v, w, 0, TPS_MAX), 64)
    trap = flag(TRAP_ID, "a trap's id (roles/llama_cpp/traps.yml)")

    def compared(v: Any, w: str) -> dict:
        return _typed(_map(v, w), w, {"ok": (_bool, False), "ratio": (_optional(lambda x, y: _float(x, y, 0, TPS_MAX)), False),
                                       "new_tps": (rates, False), "current_tps": (rates, False),
                                       "rounds": (_whole(1, 10**6), False), "tolerance": (lambda x, y: _float(x, y, 0, 1), False),
                                       "skipped": (_prose, False), "reason": (_prose, False)})

    def run(v: Any, w: str) -> dict:   # each printed by the controller (roles/llama_cpp/build.py _smoked; round 33 S33a)
        return _typed(_map(v, w), w, {"ok": (_bool, True), "name": (_prose, False), "model": (_prose, False),
                                       "reason": (_prose, False), "tail": (_list(_prose, 200), False),
                                       "tokens": (_whole(0, INT32), False), "seconds": (seconds, False),
                                       "remedy": (_optional(trap), False), "first": (_prose, False)})

    return _typed(_record(value, where), where, {
        "ok": (_bool, True),
        "key": (_optional(flag(KEY, "a smoke spec's key (16 hex digits)")), False),
        "seconds": (seconds, False),
        "traps": (_list(trap), False),
        "server_args": (_list(flag(REMEDY_FLAG, "a bare --flag")), False),
        "runs": (_list(run), False),
        "compare": (_optional(compared), False),
    })


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Unreadable(where, f"not true or false: {str(value)[:40]!r}")
    return value


# ----------------------------------------------------------------------------- an artifact's record
def _runtime(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Unreadable(where, "not a map")
    short = _optional(lambda v, w: _text(v, w, 64))
    return _typed(value, where, {"os": (short, False), "glibc": (short, False), "machine": (short, False),
                                 "toolkit": (short, False),
                                 "cpu_flags": (_optional(_list(lambda v, w: fields.matched(CPU_FLAG, v, w, "a CPU flag"))),
                                               False)})


def artifact_record(value: Any, where: str, key: str) -> dict:
    """The controller's record of artifact ``key`` (JSON text or what it parsed to): its own key,
    the sha256 (64 hex) and size of the bytes it received, the host that offers it, the path there
    (``.../artifacts/<key>.tar.gz``), the build id, commit and runtime; or :class:`Unreadable`."""
    def path(v: Any, w: str) -> str:
        text = _text(v, w, 4096)
        if not text.startswith("/") or not text.endswith(f"/artifacts/{key}.tar.gz") or "/../" in text:
            raise Unreadable(w, f"not the path of artifact {key} on its host: {text[:60]!r}")
        return text

    doc = _typed(_record(value, where), where, {
        "key": (lambda v, w: fields.matched(KEY, v, w, "an artifact key (16 hex digits)"), True),
        "sha256": (fields.sha256, True),
        "size": (_whole(1, SIZE_MAX), True),
        "host": (_optional(lambda v, w: fields.matched(HOST, v, w, "a host's name")), False),
        "path": (_optional(path), False),
        "build_id": (_optional(fields.ident), False),
        "ref": (_optional(lambda v, w: _text(v, w, 200)), False),
        "commit": (_optional(lambda v, w: fields.matched(COMMIT, v, w, "a commit id or 'archive'")), False),
        "runtime": (_optional(_runtime), False),
        "time": (_whole(0, 1 << 40), False),
    })
    if doc["key"] != key:
        raise Unreadable(where, f"the record of another artifact (key {doc['key']!r})")
    return doc


# ----------------------------------------------------------------------------- a roll's journal
STEPS = ("draining", "converging", "readying")   # where roll.py is in a batch (roll.py's journal)


def roll_journal(value: Any, where: str) -> dict:
    """roll.py's journal of the roll in progress (``$RIGUP_CACHE_DIR/roll.json``, JSON text or what
    it parsed to): ``pid`` and ``started`` of the roll, its ``inventory``, the ``batch`` (host names)
    it was at, the ``step`` there (:data:`STEPS`) and ``at``; or :class:`Unreadable` naming
    ``where`` and the field (the next roll then says the journal does not read and rolls as usual)."""
    return _typed(_record(value, where), where, {
        "pid": (_whole(1, 1 << 22), True),
        "started": (lambda v, w: _float(v, w, 0, 4102444800), True),
        "at": (lambda v, w: _float(v, w, 0, 4102444800), True),
        "inventory": (lambda v, w: _text(v, w, 4096), True),
        "batch": (_list(lambda v, w: fields.matched(HOST, v, w, "a host's name"), 4096), True),
        "step": (_choice(STEPS), True),
    })


CROSSINGS = (
    Crossing("a sweep's result (tune_out's JSON on the host)", "the rigup user (plays/shipped/tune.py)",
             "rigup/boundary/results.py:sweep", "plays/tuning.py:record, tune.py:sweep"),
    Crossing("shipped/throughput.py's sweep line (bench.py's Throughput fact)",
             "the host (its python3, the servers measured)", "rigup/boundary/results.py:throughput",
             "plays/bench.py:Throughput"),
    Crossing("llama-bench's JSON of one test (bench.py's LlamaBench fact)", "the host (llama-bench as the model's owner)",
             "rigup/boundary/results.py:llama_bench", "plays/bench.py:llama_bench_row"),
    Crossing("a model's line of the fetch probe (switches, paths, byte counts, what the hub answered)",
             "the host (rigup-fetch probe as the owner of each model's directory)",
             "rigup/boundary/results.py:model_probe", "roles/model_fetch/facts.py:parse_probe"),
    Crossing("a model's completion marker (<dest>/.rigup-complete.json)", "the rigup user (the fetch job)",
             "rigup/boundary/results.py:marker", "plays/bench.py:Serving, roles/model_fetch/facts.py:read_markers, "
             "rigup/units.py:parse_instances"),
    Crossing("the cmpunlocker role's stamp (rigup_state_dir/cmpunlocker.json: an object, else none)",
             "root on the host (roles/cmpunlocker)", "rigup/boundary/core.py:loads",
             "roles/cmpunlocker/facts.py:parse_unlock_state"),
    Crossing("a llama.cpp build's stamp (builds/<id>/rigup-build.json)", "root on the host (the build script)",
             "rigup/boundary/results.py:stamp", "roles/llama_cpp/facts.py:parse_state"),
    Crossing("a llama.cpp build's smoke result (builds/<id>/rigup-smoke.json)",
             "root on the host (roles/llama_cpp/shipped/smoke.py), its servers running as the rigup user",
             "rigup/boundary/results.py:smoke", "roles/llama_cpp/facts.py:parse_state, rigup/traps.py:load, "
             "roles/llama_server/facts.py:remedy_flags"),
    Crossing("the controller's record of a build artifact (llama_cpp_artifacts/<key>.json)",
             "the controller (roles/llama_cpp/artifact.py kept)",
             "rigup/boundary/results.py:artifact_record", "roles/llama_cpp/artifact.py:checked_record"),
    Crossing("roll.py's journal of the roll in progress ($RIGUP_CACHE_DIR/roll.json)",
             "the controller (roll.py, the operator's user)", "rigup/boundary/results.py:roll_journal",
             "plays/roll.py:left_behind"),
)
