"""The form of an entry of ``llama_server_instances`` (name -> instance), with each key's
default and meaning; :func:`instances` reads them normalised, with problems by key path.

The keys that become flags, their forms, defaults and policies are rigup/contract/llama_server.py's
rows (adding a flag: a row there and a test, then ``make docs``); the keys here are the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.boundary.numbers import shares, whole
from rigup.config import once
from rigup.contract.llama_server import (FLAGS, HELD_OFF, OTHER, PER_MODEL, PER_MODEL_OWN, doc_line, held_off_flags,
                                        owned, pinned)
from rigup.entries import Key, normalise, unknown_reference
from rigup.models import SERVING_KEYS, ServingInstance, flag_values, of_form, owned_flag_problems
from rigup.models import instances as _entries, models
from rigup.instances.tuned import mapping, tuned

if TYPE_CHECKING:
    from rigup.config import Config



class LlamaInstance(ServingInstance):
    """One entry of ``llama_server_instances``, normalised (every key present)."""

    ctx: int | str
    parallel: int | str
    ngl: int
    n_cpu_moe: int | None
    flash_attn: str
    batch: int | None
    ubatch: int | None
    cache_type_k: str | None
    cache_type_v: str | None
    cache_ram: int | None
    sleep_idle_s: int | None
    split_mode: str
    tensor_split: str | None
    main_gpu: int | None
    jinja: bool
    metrics: bool
    replicas: int | str
    gpus_per_replica: int | str | None
    min_tokens_per_s: float | None
    rpc_workers: list[str]
    also: list[str]
    models_max: int | str
    queue: int | None
    per_model: dict[str, dict]


LLAMA_INSTANCE: dict[str, Key] = {   # rigup/contract/llama_server.py's rows
    **SERVING_KEYS,
    **{f.key: Key(f.form, f.default, doc_line(f)) for f in FLAGS},
    **{r.key: Key(r.form, r.default, r.doc) for r in OTHER},
}

# llama-server flags rigup sets from an instance's keys alone (in extra_args they are refused):
# flag -> the key (None: the instance's name, --alias).
OWNED_FLAGS = owned()


_LONG = re.compile(r"^--[^=\s]*")   # a long flag's name, up to its "=" or a blank


def spelled(args: list[str]) -> list[str]:
    """extra_args as llama.cpp reads their flags: ``_`` in a ``--`` flag's name is ``-``
    (common/arg.cpp: ``--log_prompts_dir`` is ``--log-prompts-dir``), its value as given."""
    return [_LONG.sub(lambda m: m.group(0).replace("_", "-"), str(a)) for a in args]


def held_off_problems(args: list[str], allow, where: str) -> list[tuple[str, str]]:
    """(``WHERE.extra_args``, why) for each flag of a feature beyond inference (contract
    ``HELD_OFF``) that ``allow`` (the host's llama_server_allow) does not name, as
    ``--flag value``, ``--flag=value`` or ``--flag_name``."""
    held = held_off_flags(allow)
    return [(f"{where}.extra_args", f"gives {flag}, llama-server's {held[flag]}, off on a shared endpoint "
             f"({HELD_OFF[held[flag]].opens}): drop it, or add {held[flag]} to llama_server_allow")
            for flag, _ in flag_values(spelled(args), held)]


# an origin of llama_server_cors_origins: scheme://host[:port] (no path), or llama-server's `localhost`
# (a host name: labels of letters, digits and inner '-', joined by single dots: 'a..-.example' names no host)
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ORIGIN = re.compile(rf"https?://(\[[0-9A-Fa-f:.]+\]|(?=[^:]{{1,253}}(:|$)){_LABEL}(\.{_LABEL})*)(:(?P<port>[0-9]+))?"
                     r"|localhost")


def cors_problems(data: Config) -> list[tuple[str, str]]:
    """``llama_server_cors_origins``: each an origin (or ``localhost``), at most one (llama-server
    sends the value as it is in Access-Control-Allow-Origin, which a browser matches against one
    origin: two would admit none)."""
    def origin(o) -> bool:
        m = _ORIGIN.fullmatch(o) if isinstance(o, str) else None
        return bool(m) and (m["port"] is None or (whole(m["port"], 65535) or 0) > 0)

    origins = data.get("llama_server_cors_origins") or []
    if not isinstance(origins, list):
        return [("llama_server_cors_origins", f"expected a list of origins, got {origins!r}")]
    found = [("llama_server_cors_origins", f"{o!r} is not an origin (scheme://host[:port], no path; or localhost)")
             for o in origins if not origin(o)]
    if len(origins) > 1:
        found.append(("llama_server_cors_origins", f"{len(origins)} origins: llama-server sends the value as it is "
                                                   "in Access-Control-Allow-Origin, which admits one origin at most"))
    return found


def router_problems(entry: dict, where: str, declared: dict, valid: dict | None = None) -> list[tuple[str, str]]:
    """Router mode's rules (``also``): every model a key of ``models``, none twice nor the instance's
    own; ``models_max`` at most the models of the set the router loads (its pinned ones aside); one
    server (replicas 1, no rpc_workers); only a model of also pinned (the instance's own is the
    router's: its gate asks it), not every one, and with pinned models ctx set (auto sizes one
    server to fill the cards). A model of also whose own entry is wrong (``valid``: the entries of
    ``models`` of their form) refuses the instance, as its own model's does (round 11 P2: the set's
    sizing read it and ended the run)."""
    also = entry.get("also") or []
    found = [(f"{where}.also", unknown_reference(m, declared, "models")) for m in also if m not in declared]
    found += [(f"{where}.also", f"names {m}, whose entry of models is wrong (models.{m}: see its own problem)")
              for m in also if m in declared and valid is not None and m not in valid]
    if entry.get("sleep_idle_s") is not None and not entry.get("metrics", True):   # the watchdog reads it
        found.append((f"{where}.sleep_idle_s", "needs metrics: true (the watchdog tells a sleeping server from /metrics)"))
    if entry.get("model") in also or len(set(also)) < len(also):
        found.append((f"{where}.also", f"names a model twice ({', '.join(also)}; the instance's own: {entry.get('model')})"))
    if not also:
        return found + [(f"{where}.{k}", "router mode only: give also, the other models of the set")
                        for k, plain in (("models_max", ("auto", 1)), ("queue", (None,)), ("per_model", ({},)))
                        if entry.get(k, plain[0]) not in plain]
    routed = 1 + len(also) - len(pinned(entry))   # the models the router itself loads
    if isinstance(entry.get("models_max"), int) and entry["models_max"] > routed:
        found.append((f"{where}.models_max", f"{entry['models_max']} for a set of {routed} models"
                      + (f" (its pinned {', '.join(pinned(entry))} aside)" if pinned(entry) else "")))
    own = (entry.get("per_model") or {}).get(entry.get("model")) if isinstance(entry.get("per_model"), dict) else None
    if also and len(pinned(entry)) == len(also):
        found.append((f"{where}.per_model", f"pins every model of also ({', '.join(also)}): the router would "
                      "serve its own alone; make each an instance of its own instead"))
    if pinned(entry) and entry.get("ctx", "auto") == "auto":
        found.append((f"{where}.ctx", "auto with pinned models: rigup sizes one server's ctx to fill its cards, "
                      "which leaves nothing beside the pinned ones; set ctx (each model's KV cache is counted at "
                      "it, or at its per_model ctx)"))
    if isinstance(own, dict) and own.get("pinned") is True:
        found.append((f"{where}.per_model.{entry['model']}.pinned", "the instance's own model is the router's (its "
                      "gate asks it): pin a model of also, or make the pinned model an instance of its own"))
    if entry.get("replicas", 1) != 1 or entry.get("rpc_workers"):
        found.append((f"{where}.also", "router mode serves one set from one server: no replicas, no rpc_workers"))
    return found + per_model_problems(entry, where)


# a model's own flags (per_model): the flag rows' forms, ctx and parallel as numbers (no auto: a set's
# models are sized by hand)
PER_MODEL_KEYS = {**{k: Key("int 1.." if k in ("ctx", "parallel") else LLAMA_INSTANCE[k].form, None)
                     for k in PER_MODEL},
                  **{k: Key("bool", False) for k in PER_MODEL_OWN}}   # pinned, load_on_startup


def per_model_problems(entry: dict, where: str) -> list[tuple[str, str]]:
    """``per_model``: a map of the set's model keys to maps of :data:`PER_MODEL_KEYS`."""
    own, found = entry.get("per_model") or {}, []
    models = [entry.get("model"), *(entry.get("also") or [])]
    for model, flags in own.items():
        at = f"{where}.per_model.{model}"
        if model not in models:
            found.append((at, f"{unknown_reference(model, models, 'the set (model and also)')}"))
            continue
        found += normalise(flags, PER_MODEL_KEYS, at)[1]
    return found


def split_problems(value, where: str, gpu_count: int | None) -> list[tuple[str, str]]:
    """(``where``, why) when the tensor_split ``value`` (text, or None for none) is not numbers
    separated by commas, or gives more shares than the host's ``gpu_count`` GPUs (when known)."""
    if not isinstance(value, str):
        return []   # none, or not text: the entry's form says so
    split = value.replace(" ", "")   # blanks between shares are llama.cpp's to skip; at the ends, the preset's
    # reader drops them, so rigup's writer refuses the value (formats.ini_line): refused here, before any role
    # runs (round 9 N2: ' 1,1' passed preflight and ended the converge in preset_text)
    if shares(split) is None or value != value.strip(" "):   # bounded, one above 0: std::stof reads each (re5 N24)
        return [(where, f"expected numbers separated by commas, each under 10^6, one above 0, no blank at either "
                        f"end (e.g. '16,16,17,0'), got {value!r}")]
    if gpu_count is not None and len(split.split(",")) > gpu_count:
        return [(where, f"{len(split.split(','))} shares for {gpu_count} GPUs on this host")]
    return []


def instances(data: Config, gpu_count: int | None = None) -> tuple[dict[str, LlamaInstance], list[tuple[str, str]]]:
    """The host's ``llama_server_instances``, normalised, and (key path, problem) for each wrong
    entry; ``gpu_count`` (when known) bounds tensor_split. Made once per run for each ``gpu_count``
    of a host's configuration (rigup.config.once): read it, never change it."""
    return once(data, ("llama_server_instances", gpu_count), lambda: _instances(data, gpu_count))


def _instances(data: Config, gpu_count: int | None) -> tuple[dict[str, LlamaInstance], list[tuple[str, str]]]:
    def problems(entry: dict, where: str, model) -> list[tuple[str, str]]:
        found = owned_flag_problems(spelled(entry["extra_args"]), OWNED_FLAGS, where) + \
            held_off_problems(entry["extra_args"], data.get("llama_server_allow") or (), where) + \
            router_problems(entry, where, data.get("models") or {}, models(data)[0])
        # a router's per_model tensor_split is its model's -ts in the preset: the instance's own rule
        found += [p for model, own in (entry.get("per_model") or {}).items() if isinstance(own, dict)
                  for p in split_problems(own.get("tensor_split"), f"{where}.per_model.{model}.tensor_split", gpu_count)]
        return found or split_problems(entry.get("tensor_split"), f"{where}.tensor_split", gpu_count)
    laid, wrong = _laid(data)
    found, problems_ = _entries(data, "llama_server_instances", LLAMA_INSTANCE, problems, laid)
    return found, wrong + problems_ + cors_problems(data)


def _laid(data: Config) -> tuple[dict, list[tuple[str, str]]]:
    """The raw entries with each tuned instance's flags laid over (here alone), and the problems
    of ``llama_server_tuned``."""
    flags, wrong = tuned(data, LLAMA_INSTANCE)   # ConfigError, naming the host, for either map that is none
    return {name: {**entry, **flags.get(name, {})} if isinstance(entry, dict) else entry
            for name, entry in mapping(data, "llama_server_instances").items()}, wrong


def normalised(data: Config) -> dict[str, LlamaInstance]:
    """The host's llama-server instances for the readers beyond the role (the metrics, the
    watchdog, rigup/rpc.py, and through :func:`rigup.instances.every` the balancer, plays/bench.py
    and status.py), by name in order: :func:`instances`' shape
    (normalised, tuned; ctx and parallel may still be ``auto``: the serving plan sizes them),
    each entry of its own form. The rules across entries and ``models`` are :func:`instances`'
    (preflight refuses a host that breaks one before anything reads this), so a reader of a
    peer's data, or of a host that preflight refused, sees every entry of its form. Made once per
    run for a host's configuration (rigup.config.once): read it, never change it."""
    return formed(data)[0]


def formed(data: Config) -> tuple[dict[str, LlamaInstance], list[tuple[str, str]]]:
    """:func:`normalised`, and (key path, problem) for each entry it leaves out."""
    return once(data, ("llama_server_instances", "normalised"),
                lambda: of_form("llama_server_instances", _laid(data)[0], LLAMA_INSTANCE))
