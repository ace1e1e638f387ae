"""The forms of the entries of rigup's nested maps, and their validation with key paths.

``models`` (roles/model_fetch), ``llama_server_instances`` (roles/llama_server) and
``vllm_instances`` (roles/vllm) are declared ``[map]`` in their defaults.yml; the form of each
entry is here, in the same form language as rigup/config.py, with the default each key takes.
Preflight validates them; the roles read entries through :func:`normalise` so that they see the
same defaults. Every problem names its key path::

    llama_server_instances.glm.model: 'glm53' is not a key of models (its keys: glm53-q4)
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from rigup.config import parse_form
from rigup.gpu.catalogue import model_families

REQUIRED = object()

# key -> (form, default); REQUIRED marks a key without a default.
MODEL: dict[str, tuple[str, Any]] = {
    "repo": ("str", REQUIRED),
    "revision": ("str", REQUIRED),
    "include": ("list of str", []),
    "dest": ("path or null", None),        # None: models_dir/<name>
    "size_gib": ("float 0.. or null", None),
    "family": ("str or null", None),      # None: matched from repo (rigup/gpu/models.yml)
    "fetch_from": ("str or null", None),  # a peer host of the inventory (roles/model_fetch)
    "wait": ("bool", False),              # block the converge until complete (roles/model_fetch)
}
LLAMA_INSTANCE: dict[str, tuple[str, Any]] = {
    "model": ("str", REQUIRED),
    "port": ("int 1..65535", REQUIRED),
    "host": ("str", "127.0.0.1"),
    "ctx": ("int 1..", 8192),
    "parallel": ("int 1..", 1),
    "ngl": ("int -1..", 99),
    "flash_attn": ("one of on|off|auto", "auto"),
    "split_mode": ("one of none|layer|row|tensor", "layer"),
    "tensor_split": ("str or null", None),
    "jinja": ("bool", True),
    "metrics": ("bool", False),
    "api_key": ("bool", False),
    "extra_args": ("list of str", []),
}
VLLM_INSTANCE: dict[str, tuple[str, Any]] = {
    "model": ("str", REQUIRED),
    "port": ("int 1..65535", REQUIRED),
    "host": ("str", "127.0.0.1"),
    "tp": ("int 1..", 1),
    "pp": ("int 1..", 1),
    "pp_partition": ("str or null", None),
    "gpu_memory_utilization": ("float 0.05..1", 0.9),
    "served_model_name": ("str or null", None),  # None: the instance's name
    "layers": ("int 1.. or null", None),          # num_hidden_layers: pp_partition must sum to it
    "gpus": ("str or null", None),                # CUDA_VISIBLE_DEVICES, e.g. "0,1,2,3"; None: all
    "env": ("map", {}),                           # more environment for this instance
    "extra_args": ("list of str", []),
}
SCHEMAS = {"models": MODEL, "llama_server_instances": LLAMA_INSTANCE, "vllm_instances": VLLM_INSTANCE}
OVERRIDE_WATTS = parse_form("int 50..1000")

_HEX40 = re.compile(r"[0-9a-f]{40}")
_INTS = re.compile(r"\d+(,\d+)*")
_NUMBERS = re.compile(r"\d+(\.\d+)?(,\d+(\.\d+)?)*")


def normalise(entry: Any, schema: dict[str, tuple[str, Any]], where: str) -> tuple[dict, list[tuple[str, str]]]:
    """``entry`` with every default filled in, and (key path, problem) for each key that is
    unknown, missing or not of its form."""
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
        form = parse_form(schema[key][0])
        why = form.problem(value)
        if why:
            problems.append((f"{where}.{key}", f"expected {form.text}, {why}"))
        else:
            out[key] = value
    for key, (form, default) in schema.items():
        if key in out:
            continue
        if default is REQUIRED:
            if key not in entry:
                problems.append((f"{where}.{key}", f"required ({form})"))
        else:
            out[key] = list(default) if isinstance(default, list) else default
    return out, problems


def _family_layers(model: dict | None, families: dict) -> int | None:
    """The layer count rigup/gpu/models.yml gives the model's family (``num_hidden_layers``), if any."""
    if not model:
        return None
    from rigup.gpu.catalogue import family_of
    try:
        family = family_of(model)
    except Exception:  # noqa: BLE001 -- an unknown family is preflight's to report
        return None
    value = (family or {}).get("num_hidden_layers")
    return int(value) if isinstance(value, int) else None


def serving_config(data: dict, gpu_count: int | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """The host's ``models``, ``llama_server_instances`` and ``vllm_instances``, normalised, and
    every problem with its key path. An entry with a problem is left out of the result, so that
    later checks judge only entries they can read; so is an instance whose model has one.
    ``gpu_count`` (when known) bounds tp x pp and tensor_split."""
    problems: list[tuple[str, str]] = []
    families = model_families()
    models_dir = str(data.get("models_dir") or "/srv/models").rstrip("/")  # "/" -> "": dest "/<name>"
    models = {}
    for name, raw in (data.get("models") or {}).items():
        where = f"models.{name}"
        entry, found = normalise(raw, MODEL, where)
        if "revision" in entry and not _HEX40.fullmatch(entry["revision"]):
            found.append((f"{where}.revision", f"expected a full 40-hex commit id, got {entry['revision']!r} "
                                               "(a branch or tag moves; pin the commit)"))
        if entry.get("family") is not None and entry["family"] not in families:
            found.append((f"{where}.family", f"{entry['family']!r} is not a family of rigup/gpu/models.yml "
                                             f"(its families: {', '.join(families)})"))
        problems += found
        if not found:
            entry["dest"] = entry["dest"] or f"{models_dir}/{name}"
            models[name] = entry
    declared = data.get("models") or {}
    result = {"models": models}
    for var, schema in (("llama_server_instances", LLAMA_INSTANCE), ("vllm_instances", VLLM_INSTANCE)):
        result[var] = {}
        for name, raw in (data.get(var) or {}).items():
            where = f"{var}.{name}"
            entry, found = normalise(raw, schema, where)
            model = entry.get("model")
            if model is not None and model not in declared:
                close = difflib.get_close_matches(str(model), declared, n=1)
                keys = f"its keys: {', '.join(declared)}" if declared else "models is empty"
                hint = f"; did you mean {close[0]!r}?" if close else ""
                found.append((f"{where}.model", f"{model!r} is not a key of models ({keys}{hint})"))
            if var == "llama_server_instances" and entry.get("tensor_split") is not None:
                split = entry["tensor_split"].replace(" ", "")
                if not _NUMBERS.fullmatch(split):
                    found.append((f"{where}.tensor_split", f"expected numbers separated by commas "
                                                           f"(e.g. '16,16,17,0'), got {entry['tensor_split']!r}"))
                elif gpu_count is not None and len(split.split(",")) > gpu_count:
                    found.append((f"{where}.tensor_split", f"{len(split.split(','))} shares for "
                                                           f"{gpu_count} GPUs on this host"))
            if var == "vllm_instances" and "tp" in entry and "pp" in entry:
                if gpu_count is not None and entry["tp"] * entry["pp"] > gpu_count:
                    found.append((f"{where}.tp", f"tp {entry['tp']} x pp {entry['pp']} = "
                                                 f"{entry['tp'] * entry['pp']} GPUs, but this host has {gpu_count}"))
                partition = entry.get("pp_partition")
                if partition is not None:
                    parts = partition.replace(" ", "")
                    if not _INTS.fullmatch(parts):
                        found.append((f"{where}.pp_partition", f"expected layer counts separated by commas "
                                                               f"(e.g. '13,11,11,10'), got {partition!r}"))
                    elif len(parts.split(",")) != entry["pp"]:
                        found.append((f"{where}.pp_partition", f"{len(parts.split(','))} stages in "
                                                               f"{partition!r}, but pp is {entry['pp']}"))
                    elif any(int(n) == 0 for n in parts.split(",")):
                        found.append((f"{where}.pp_partition", f"a stage of {partition!r} has no layers"))
                    else:
                        layers = entry.get("layers") or _family_layers(models.get(model), families)
                        total = sum(int(n) for n in parts.split(","))
                        if layers is not None and total != layers:
                            found.append((f"{where}.pp_partition", f"{partition!r} sums to {total} layers, "
                                                                   f"but the model has {layers}"))
                elif entry.get("layers") is not None and entry["pp"] > entry["layers"]:
                    found.append((f"{where}.pp", f"pp {entry['pp']} stages for {entry['layers']} layers"))
                if entry.get("gpus") is not None:
                    gpus = entry["gpus"].replace(" ", "")
                    if not _INTS.fullmatch(gpus):
                        found.append((f"{where}.gpus", f"expected GPU indices separated by commas "
                                                       f"(e.g. '0,1'), got {entry['gpus']!r}"))
                    elif len(gpus.split(",")) != entry["tp"] * entry["pp"]:
                        found.append((f"{where}.gpus", f"{len(gpus.split(','))} GPUs for tp {entry['tp']} x "
                                                       f"pp {entry['pp']} = {entry['tp'] * entry['pp']}"))
                for key, value in (entry.get("env") or {}).items():
                    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)) or isinstance(value, (dict, list)) \
                            or "\n" in str(value):
                        found.append((f"{where}.env.{key}", "expected NAME: a one-line string, number or bool"))
            problems += found
            if not found and model in models:
                result[var][name] = entry
    overrides = data.get("gpu_power_overrides") or {}
    for key, watts in overrides.items():
        why = OVERRIDE_WATTS.problem(watts)
        if why:
            problems.append((f"gpu_power_overrides.{key}", f"expected watts, {OVERRIDE_WATTS.text}, {why}"))
    return result, problems
