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
plan says ``tuned``); the figures are for status.py and the reader.

A router (an instance with ``also``) is tuned a model at a time (tune.py: each model loaded alone):
its entry holds ``models``, one entry as above per model of its set, whose flags are laid over
that model's ``per_model`` entry (the router's preset serves each model with its own):

    llama_server_tuned:
      x:                           # a router: model a, also [b]
        models:
          a: {flags: {parallel: 4, ctx: 16384}, tok_s: 142.1, baseline_tok_s: 98.0, ...}
          b: {flags: {flash_attn: "on"}, tok_s: 61.0, baseline_tok_s: 55.2, ...}

A model no longer of the set is ignored, and the plan says so (:func:`tuned_lines`). Pure: data in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.config import ConfigError
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
# a router's entry: each model of its set measured alone, laid over its per_model entry
ROUTER_ENTRY = {**ENTRY, "models": Key("map", {}, "a router's (also) models: each one's entry as above, "
                                                  "its flags laid over that model's per_model")}


def mapping(data: Config, key: str) -> dict:
    """``data``'s map ``key`` ({} when unset), or ConfigError naming the host and the key when it is
    no map: a peer's host_vars typo (``llama_server_tuned: [x]``) read by another host's role (a
    worker's rigup/rpc.py heads_of, a monitoring host's Prometheus targets) was an AttributeError
    naming neither (issue 61, round 9 TU1); the host's own configure refuses it first, naming its file."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        host = getattr(data, "name", None)
        raise ConfigError(f"{f'host {host}: ' if host else ''}{key} is a {type(value).__name__}, not a map of "
                          "name -> entry: fix it in that host's host_vars or group_vars")
    return value


def _set(entry) -> list:
    """The models of a router ``entry`` of llama_server_instances (model and also); [] for one server."""
    also = entry.get("also") if isinstance(entry, dict) else None
    return [entry.get("model"), *also] if isinstance(also, list) and also else []


def tuned(data: Config, instance_keys: dict[str, Key]) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """{instance: its tuned flags} and (key path, problem) for each wrong entry of
    ``llama_server_tuned``: an instance not in llama_server_instances, an unknown key, a flag
    that is not one of FLAG_KEYS or not of the instance key's form (``instance_keys``); ConfigError
    when either map is no map (:func:`mapping`). A router's
    tuned models (``models``) come as its ``per_model`` with each model's flags laid over its own
    entry; a model no longer of the set is left out (:func:`tuned_lines` says so)."""
    raw, serving = mapping(data, "llama_server_tuned"), mapping(data, "llama_server_instances")
    out, problems = {}, []
    for name, entry in raw.items():
        where = f"llama_server_tuned.{name}"
        if name not in serving:
            problems.append((where, f"{name!r} is not an instance of llama_server_instances: tune it again or "
                                    "remove the entry"))
            continue
        norm, found = normalise(entry, ROUTER_ENTRY, where)
        flags = norm.get("flags") or {}
        checked, bad = normalise(flags, {k: instance_keys[k] for k in FLAG_KEYS}, f"{where}.flags")
        own, wrong = _models(norm.get("models") or {}, serving[name], instance_keys, where) if not found else ({}, [])
        problems += found + bad + wrong
        if not found + bad + wrong:
            out[name] = {k: checked[k] for k in flags}   # the flags set, not the keys' defaults
            if own:
                out[name]["per_model"] = own
    return out, problems


def _models(models: dict, inst, instance_keys: dict[str, Key], where: str) -> tuple[dict, list[tuple[str, str]]]:
    """A router's ``per_model`` with each tuned model's flags over its own entry (the operator's
    other keys of it kept), and the problems of ``models``' entries of the set (a flag of the
    wrong form: ctx and parallel numbers, as per_model takes them). Nothing for an instance whose
    ``per_model`` is not a map (refused as it is)."""
    keys = {k: Key("int 1..", None) if k in ("ctx", "parallel") else instance_keys[k] for k in FLAG_KEYS}
    per_model = inst.get("per_model") if isinstance(inst, dict) else None
    own = dict(per_model or {}) if isinstance(per_model or {}, dict) else None
    problems, members = [], _set(inst)
    for model, entry in models.items():
        if model not in members:
            continue   # no longer of the set: ignored (tuned_lines)
        at = f"{where}.models.{model}"
        norm, found = normalise(entry, ENTRY, at)
        checked, bad = normalise(norm.get("flags") or {}, keys, f"{at}.flags") if not found else ({}, [])
        problems += found + bad
        if not found + bad and own is not None and isinstance(own.get(model) or {}, dict):
            own[model] = {**(own.get(model) or {}), **{k: checked[k] for k in norm.get("flags") or {}}}
    return (own or {}) if own != (per_model or {}) else {}, problems


def tuned_lines(data: Config) -> list[str]:
    """The plan's lines for tuned router models that are no longer served: a model of an entry's
    ``models`` not in its instance's set (model and also), or an instance that is no router."""
    raw, serving = mapping(data, "llama_server_tuned"), mapping(data, "llama_server_instances")
    lines = []
    for name, entry in sorted(raw.items()):
        models = entry.get("models") if isinstance(entry, dict) else None
        if name not in serving or not isinstance(models, dict):
            continue
        members = _set(serving[name])
        for model in sorted(m for m in models if m not in members):
            lines.append(f"llama:     {name}: llama_server_tuned.{name}.models.{model}: ignored, {model} is not "
                         + (f"a model of its set ({', '.join(map(str, members))})" if members else "served by a router "
                            f"({name} has no also)") + "; remove the entry, or tune it again")
    return lines

