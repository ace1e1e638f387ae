"""Typed readers for what hosts and hubs print or write for the controller (issue 61, classes 3
and 4): a download's progress.json, a GGUF header's figures and a hub's file listing. Each returns
typed values within bounds or raises :class:`Unreadable` naming where the record came from; its
caller fails closed for that host or that model alone (status shows the record as unreadable,
sizing refuses the model naming the file and the field).

Numbers go through :mod:`rigup.boundary.numbers`, names and paths through
:mod:`rigup.boundary.fields`. The host programs that read such text themselves (the Xid lines in
shipped/xid.py, the GGUF bytes in shipped/gguf.py) run with the standard library alone, so they
hold their own checks; their rows are here, beside the controller's readers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rigup.boundary import fields
from rigup.boundary.core import Crossing, Unreadable
from rigup.boundary.numbers import json_whole, number, required
from rigup.text import shown

MAX_BYTES = 1 << 56          # a model's bytes, at most (64 PiB)
MAX_ETA_S = 10 ** 9          # seconds left, at most (30 years)
TEXT_LIMIT = 300             # a progress record's error or detail, as status shows it
STATE = re.compile(r"[a-z]{1,16}")   # fetcher.py's states: running, verifying, waiting, failed, stopped


def _text(record: dict, key: str, where: str) -> str | None:
    """A text field of ``record``: None when absent, else a string cut and escaped for a terminal."""
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unreadable(f"{where}.{key}", f"not text: {type(value).__name__}")
    return shown(value, TEXT_LIMIT)


def download_progress(record: object, where: str) -> dict | None:
    """A model's ``.rigup-fetch/progress.json`` (roles/model_fetch/shipped/fetcher.py ``Progress``), as the
    JSON it parsed to: None for no record, else ``{"state", "bytes", "total", "rate", "eta",
    "error", "detail", "source"}`` typed (whole bytes, a rate and an ETA of finite non-negative
    numbers, a lowercase state word, text escaped and cut; the bytes done at most the total where
    one is known, not 0); :class:`Unreadable` naming ``where`` and the field for anything else (a
    total written as text, NaN, a negative count, a list, more bytes done than the whole)."""
    if record is None:
        return None
    if not isinstance(record, dict):
        raise Unreadable(where, f"not a JSON object: {type(record).__name__}")
    state = record.get("state")
    if state is not None and not (isinstance(state, str) and STATE.fullmatch(state)):
        raise Unreadable(f"{where}.state", f"not a state word: {str(state)[:40]!r}")
    out: dict = {"state": state}
    for key in ("bytes", "total"):   # JSON ints: a total written as text is not one
        value = record.get(key, 0)
        out[key] = json_whole(value, MAX_BYTES)
        if out[key] is None:
            raise Unreadable(f"{where}.{key}", f"not a whole number of bytes: {str(record.get(key))[:40]!r}")
    if out["total"] and out["bytes"] > out["total"]:   # the fetcher reads no file past its listed size
        raise Unreadable(f"{where}.bytes", f"{out['bytes']} bytes done of a total of {out['total']}")
    rate, eta = record.get("rate"), record.get("eta")
    out["rate"] = 0.0 if rate is None else required(rate, f"{where}.rate", float, 0, MAX_BYTES)
    out["eta"] = None if eta is None else required(eta, f"{where}.eta", float, 0, MAX_ETA_S)
    for key in ("error", "detail", "source"):
        out[key] = _text(record, key, where)
    out["detail"] = out["detail"] or ""
    return out


KV_MIN = 1e-4   # GiB of KV cache per 1k tokens, the least shipped/gguf.py writes but 0 (it rounds to 4 places)


def gguf_figures(figures: object, where: str) -> dict:
    """The figures of a GGUF header (shipped/gguf.py ``kv_figures``, fresh or kept between runs in
    the hub's cache) that size a model's VRAM: ``{"architecture", "layers", "kv_gib_per_1k_tokens",
    "context_length", "read_bytes", "chat_template"}`` with the layer count a whole number (none:
    refused, rigup cannot size the model), the KV size a JSON number, 0 or :data:`KV_MIN`..1e9, or None
    where the header has none (each figure a JSON number, never text); ``chat_template`` a bool
    (shipped/gguf.py ``chat_template``), or None: not known (the header longer than the bytes read, or
    figures kept before rigup read it: still read); :class:`Unreadable` naming ``where`` (the file)
    and the field otherwise."""
    from shipped.gguf import MAX_CONTEXT, MAX_LAYERS

    if not isinstance(figures, dict):
        raise Unreadable(where, f"not the header's figures: {type(figures).__name__}")
    arch = figures.get("architecture")
    if arch is not None:
        fields.ident(arch, f"{where}: general.architecture")
    out = {"architecture": arch}
    for key, hi in (("layers", MAX_LAYERS), ("context_length", MAX_CONTEXT), ("read_bytes", MAX_BYTES)):
        value = figures.get(key)
        out[key] = None if value is None else json_whole(value, hi)
        if value is not None and out[key] is None:
            raise Unreadable(f"{where}: {key}", f"not a whole number 0..{hi}: {str(value)[:40]!r}")
    if not out["layers"]:   # kept before rigup refused a header it cannot size (shipped/gguf.py unsized, figures)
        raise Unreadable(f"{where}: layers", f"{'no layer count' if out['layers'] is None else '0 layers'}: rigup "
                         "cannot size the model (llama.cpp's loader needs it)")
    kv = figures.get("kv_gib_per_1k_tokens")
    # a JSON number, as the counts are JSON ints ("0.5" was read, "8192" refused), 0 (no KV cache) or at least
    # KV_MIN: what shipped/gguf.py's round(.., 4) gives (5e-324 sized int(inf) slots: a traceback, round 7 S1)
    rate = number(kv, float, 0, 1e9) if type(kv) in (int, float) else None
    if kv is not None and (rate is None or 0 < rate < KV_MIN):
        raise Unreadable(f"{where}: kv_gib_per_1k_tokens", f"not 0 or a JSON number in {KV_MIN}..1e9: {str(kv)[:40]!r}")
    out["kv_gib_per_1k_tokens"] = None if rate is None else rate + 0.0   # -0.0: 0.0
    # kept before rigup read it (no key): not known, as a header longer than the bytes read
    template = figures.get("chat_template")
    if template is not None and type(template) is not bool:
        raise Unreadable(f"{where}: chat_template", f"not true, false or null: {str(template)[:40]!r}")
    out["chat_template"] = template
    return out


def hub_listing(files: object, where: str, problems: Callable[[object], list[tuple[str, str]]]) -> list[dict]:
    """A hub's tree listing (roles/model_fetch/shipped/fetcher.py ``hub_files``: ``[{path, size, oid,
    sha256}]``, fresh or kept between runs) as typed entries: ``problems(files)`` first, the (path,
    why) of each thing its owner refuses (roles/model_fetch passes fetcher.py's ``listing_problems``,
    the rules the host's fetcher holds too: a list of objects, a path's characters, rigup's own
    names, a size that is a JSON int, 64 hex of a sha256, 40 of a git blob id, a path listed twice;
    a parameter, so the library imports no role), then each path relative and inside the model's
    directory (:func:`rigup.boundary.fields.inside`) and each size a whole number of bytes within
    :data:`MAX_BYTES`; :class:`Unreadable` naming ``where`` and the paths otherwise."""
    bad = problems(files)
    if bad:
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise Unreadable(where, "; ".join(f"{path[:120]!r}: {why}" for path, why in bad[:3]) + more)
    out = []
    for f in files:   # a list of objects now (problems)
        path = fields.inside(f["path"], f"{where}: {f['path'][:120]!r}")
        size = json_whole(f["size"], MAX_BYTES)
        if size is None:
            raise Unreadable(f"{where}: {path!r}", f"size {f['size']} is over {MAX_BYTES} bytes")
        out.append({"path": path, "size": size, "oid": f.get("oid"), "sha256": f.get("sha256")})
    return out


CROSSINGS = (
    Crossing("a model download's progress.json (bytes, total, rate, state, error)",
             "the host (the fetch job, or whoever can write the model's directory)",
             "rigup/boundary/hosttext.py:download_progress",
             "roles/model_fetch/facts.py:parse_progress, roles/model_fetch/facts.py:parse_probe"),
    Crossing("a model's completion marker as a host printed it (one line of JSON: an object, else none)",
             "the host (whoever can write the model's directory)", "rigup/boundary/core.py:loads",
             "roles/model_fetch/facts.py:parse_progress, "
             "roles/llama_server/facts.py:LlamaServerState, roles/vllm/facts.py:parse_state"),
    Crossing("the cmpunlocker's module probe line (modinfo -n nvidia: an absolute path of plain characters, else none)",
             "root on the host (the kernel module's path)", "roles/cmpunlocker/facts.py:module_path",
             "roles/cmpunlocker/facts.py:parse_unlock_state"),
    Crossing("llama.cpp's current and previous links as readlink printed them (builds/<id>, else none)",
             "root on the host", "roles/llama_cpp/facts.py:build_link", "roles/llama_cpp/facts.py:parse_state"),
    Crossing("a llama.cpp build's smoke result line (roles/llama_cpp/shipped/smoke.py's JSON on its output)",
             "root on the host (smoke.py), its servers", "rigup/boundary/results.py:smoke",
             "roles/llama_cpp/build.py:_smoked"),
    Crossing("a balancer backends file as a host printed it (/etc/rigup/balancer/NAME.json, one line each)",
             "root on the host (the serving roles write it)", "rigup/boundary/core.py:loads",
             "roles/balancer/facts.py:BalancerState"),
    Crossing("a status.py shard's JSON of its hosts' rows (pyinfra's output, host text in it)",
             "the shard's pyinfra (what a host made it print)", "shards.py:status_rows", "shards.py:main"),
    Crossing("a GGUF header's figures (layers, KV size, context, a chat template or none)", "the hub, the hub cache",
             "rigup/boundary/hosttext.py:gguf_figures", "roles/model_fetch/hub.py:_head"),
    Crossing("a hub's file listing (paths, sizes, sha256, git blob ids)", "the hub, the hub cache",
             "rigup/boundary/hosttext.py:hub_listing", "roles/model_fetch/hub.py:checked_files"),
    Crossing("the bytes of a GGUF header (its keys' types and values)", "the hub, the model's file on a host",
             "shipped/gguf.py:figures", "roles/model_fetch/hub.py:_head, plays/shipped/tune.py:model_layers"),
    Crossing("an Xid or SXid line of the kernel log (plain decimal codes, ASCII)", "the kernel (the lab: its stand-in)",
             "shipped/xid.py:events", "roles/gpu_guard/shipped/guard.py:triage"),
    Crossing("the GPU guard's Xid state (XID_STATE: counts and suspect marks per card, links, the journal's cursor)",
             "root (the guard; by hand, or an older guard)", "roles/gpu_guard/shipped/guard.py:xid_state_of",
             "roles/gpu_guard/shipped/guard.py:read_xid_state, roles/gpu_guard/shipped/guard.py:main"),
    Crossing("the GPU guard's samples (SAMPLES: each check's time, cards' draws, lost telemetry, verdict)",
             "root (the guard; by hand)", "roles/gpu_guard/shipped/guard.py:samples_of", "roles/gpu_guard/shipped/guard.py:check"),
    Crossing("the GPU guard's tripped record (its reason, time, the units it stopped, the boot it rebooted from)",
             "root (the guard; by hand)", "roles/gpu_guard/shipped/guard.py:tripped_of",
             "roles/gpu_guard/shipped/guard.py:check, roles/gpu_guard/shipped/guard.py:main"),
    Crossing("a build or install log's progress line (make, ninja, pip)", "the host (the build's output)",
             "rigup/progress.py:progress_text", "rigup/progress.py:waited"),
    Crossing("a count sysfs or /proc printed (CPU topology, MemTotal, a listening port, free disk)", "the host",
             "rigup/boundary/numbers.py:whole",
             "rigup/gpu/facts.py:parse_cpu, rigup/gpu/facts.py:parse_listening_ports, rigup/gpu/facts.py:parse_free_disk"),
)

GENERIC = ()
