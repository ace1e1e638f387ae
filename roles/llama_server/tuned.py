"""``llama_server_tuned``: the flags tune.py measured fastest for an instance on a host, as data the
operator commits (tune.py writes it to ``host_vars/<host>.yml``; rigup.config reads that file as
the host's data; the same block in ``group_vars/<group>.yml`` tunes hosts alike). An entry:

    llama_server_tuned:
      gemma:                       # an instance of llama_server_instances
        flags: {parallel: 4, ctx: 16384, flash_attn: "on", batch: 2048, ubatch: 512}
        tok_s: 142.1               # what the sweep measured (its figure), and the instance before it
        baseline_tok_s: 98.0
        concurrency: 4
        levels: [1, 4]
        date: "2026-12-01"
        build: lab-base-6e7ad8c66d

The flags replace the instance's own keys of the same name (the converge serves with them; the
plan says ``tuned``); the figures are for status.py and the reader. Pure: data in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.contract.llama_server import SWEPT
from rigup.entries import Key, normalise

if TYPE_CHECKING:
    from rigup.config import Config

# the instance keys a sweep sets (the contract's rows with ``sweep``), with their forms in schema.LLAMA_INSTANCE
FLAG_KEYS = SWEPT
ENTRY = {
    "flags": Key("map", {}, "the instance keys measured fastest: " + ", ".join(FLAG_KEYS)),
    "tok_s": Key("float 0.. or null", None, "the sweep's figure for the flags (total tok/s, geometric mean over levels)"),
    "baseline_tok_s": Key("float 0.. or null", None, "the same figure for the instance before the sweep"),
    "concurrency": Key("int 1.. or null", None, "the target concurrency of the sweep"),
    "levels": Key("list of int", [], "the concurrencies each point was measured at"),
    "date": Key("str or null", None, "when it was measured"),
    "build": Key("str or null", None, "the llama.cpp build it was measured with"),
}


def tuned(data: Config, instance_keys: dict[str, Key]) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """{instance: its tuned flags} and (key path, problem) for each wrong entry of
    ``llama_server_tuned``: an instance not in llama_server_instances, an unknown key, a flag
    that is not one of FLAG_KEYS or not of the instance key's form (``instance_keys``)."""
    raw, serving = data.get("llama_server_tuned") or {}, data.get("llama_server_instances") or {}
    out, problems = {}, []
    for name, entry in raw.items():
        where = f"llama_server_tuned.{name}"
        if name not in serving:
            problems.append((where, f"{name!r} is not an instance of llama_server_instances: tune it again or "
                                    "remove the entry"))
            continue
        norm, found = normalise(entry, ENTRY, where)
        flags = norm.get("flags") or {}
        checked, bad = normalise(flags, {k: instance_keys[k] for k in FLAG_KEYS}, f"{where}.flags")
        problems += found + bad
        if not found + bad:
            out[name] = {k: checked[k] for k in flags}   # the flags set, not the keys' defaults
    return out, problems


def with_tuned(data: Config, flags: dict[str, dict]) -> dict:
    """``llama_server_instances`` with each tuned instance's entry taking its flags."""
    serving = data.get("llama_server_instances") or {}
    if not flags:
        return serving
    return {name: {**entry, **flags.get(name, {})} if isinstance(entry, dict) else entry
            for name, entry in serving.items()}
