"""Catalogues of known traps (an upstream bug or limit that a setting walks into), as data, and
their loader. A role keeps its catalogue beside its checks (``roles/<role>/traps.yml``) and its
checks turn each trap that a host's settings meet into a refusal (rigup/refusal.py).

A catalogue is a YAML list of entries (or a map whose only key is ``traps``, holding that list)::

    - id: quantized-v-without-fa               # [a-z0-9][a-z0-9-]*, unique in the file
      ref: https://github.com/ggml-org/llama.cpp/issues/28524   # or a report's file name
      summary: a quantized V cache without flash attention stops llama-server at load
      condition:                               # when the trap is met: keys the owning role
        flash_attn: ["off"]                    #   documents at the top of its traps.yml
        v_type_not_in: [f16, f32, bf16]
      remedy:
        kind: refuse                           # refuse | server_flag | build_option
        value: null                            # the flag (--no-repack) or NAME=VALUE
        fix: set flash_attn on, or an f16 V cache   # what the operator changes

Every key is required, and none other is allowed. ``ref`` is an ``https://`` URL (the upstream
issue or pull request) or a report's file name (``001_62f01b4e828dcb29.txt``). ``summary`` and
``fix`` are one line each. ``remedy.kind`` says what avoids the trap: ``refuse``, only a change of
the settings (``value`` is null); ``server_flag``, the server flag ``value`` (``--no-repack``);
``build_option``, the CMake cache entry ``value`` (``GGML_CUDA_FA_ALL_QUANTS=ON``). What the
owning role does with a remedy (refuse until it is set, or set it) is the role's to say.

:func:`load` validates strictly: a bad catalogue is a bug in rigup, so it raises ValueError naming
the file and the entry, never a half-read catalogue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import yaml

from rigup import yamlfile
# a trap's id and a remedy flag as a build's rigup-smoke.json records them (server_args: bare, nothing
# else enters a unit): the boundary's patterns, which read that record back
from rigup.boundary.results import REMEDY_FLAG, TRAP_ID as ID  # noqa: F401  (callers import them from here)

URL = re.compile(r"https://[^\s\"'<>]+")
REPORT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.[A-Za-z0-9]+")
FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9-]*")
CMAKE_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S+")
KINDS = ("refuse", "server_flag", "build_option")
ENTRY_KEYS = ("id", "ref", "summary", "condition", "remedy")
REMEDY_KEYS = ("kind", "value", "fix")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Remedy:
    """What avoids a trap: ``kind`` (refuse|server_flag|build_option), ``value`` (the flag or the
    CMake NAME=VALUE; None for refuse) and ``fix`` (what the operator changes)."""

    kind: str
    value: str | None
    fix: str


@dataclass(frozen=True)
class Trap:
    """One entry of a catalogue; ``condition`` is read-only (its keys are the owning role's)."""

    id: str
    ref: str
    summary: str
    condition: Mapping[str, Any]
    remedy: Remedy


def _line(value: Any, what: str) -> str:
    """``value`` as a one-line, non-empty string, or ValueError saying why not."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what}: expected a non-empty string, got {value!r}")
    if _CONTROL.search(value):
        raise ValueError(f"{what}: expected one line (no newline or control character), got {value!r}")
    return value.strip()


def _keys(raw: Any, keys: tuple[str, ...], what: str) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a map of {', '.join(keys)}, got {raw!r}")
    unknown = [str(k) for k in raw if k not in keys]
    missing = [k for k in keys if k not in raw]
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(keys)}")
    if missing:
        raise ValueError(f"{what}: missing key(s) {', '.join(missing)}")
    return raw


def _remedy(raw: Any) -> Remedy:
    raw = _keys(raw, REMEDY_KEYS, "remedy")
    kind, value = raw["kind"], raw["value"]
    if kind not in KINDS:
        raise ValueError(f"remedy.kind: expected one of {'|'.join(KINDS)}, got {kind!r}")
    if kind == "refuse" and value is not None:
        raise ValueError(f"remedy.value: expected null for kind refuse, got {value!r}")
    if kind == "server_flag" and not (isinstance(value, str) and FLAG.fullmatch(value)):
        raise ValueError(f"remedy.value: expected a server flag (--no-repack) for kind server_flag, got {value!r}")
    if kind == "build_option" and not (isinstance(value, str) and CMAKE_ENTRY.fullmatch(value)):
        raise ValueError("remedy.value: expected a CMake cache entry NAME=VALUE (GGML_CUDA_FA_ALL_QUANTS=ON) for "
                         f"kind build_option, got {value!r}")
    return Remedy(kind, value, _line(raw["fix"], "remedy.fix"))


def _trap(raw: Any, condition_keys: frozenset | None) -> Trap:
    raw = _keys(raw, ENTRY_KEYS, "the entry")
    trap_id = raw["id"]
    if not (isinstance(trap_id, str) and ID.fullmatch(trap_id)):
        raise ValueError(f"id: expected [a-z0-9][a-z0-9-]*, got {trap_id!r}")
    ref = _line(raw["ref"], "ref")
    if not (URL.fullmatch(ref) or REPORT.fullmatch(ref)):
        raise ValueError(f"ref: expected an https:// URL or a report's file name (001_62f01b4e828dcb29.txt), "
                         f"got {ref!r}")
    condition = raw["condition"]
    if not isinstance(condition, dict) or not condition or not all(isinstance(k, str) for k in condition):
        raise ValueError(f"condition: expected a non-empty map of the role's condition keys, got {condition!r}")
    unknown = sorted(set(condition) - condition_keys) if condition_keys is not None else []
    if unknown:
        raise ValueError(f"condition: unknown key(s) {', '.join(unknown)}; the role's keys are "
                         f"{', '.join(sorted(condition_keys))}")
    return Trap(trap_id, ref, _line(raw["summary"], "summary"), MappingProxyType(dict(condition)),
                _remedy(raw["remedy"]))


def load(path: str | Path, condition_keys: Iterable[str] | None = None) -> tuple[Trap, ...]:
    """The traps of the catalogue at ``path``, in the file's order; ``condition_keys`` (when
    given) are the only condition keys the owning role knows. ValueError, naming the file and the
    entry (its position and id), for anything that is not as the module docstring says."""
    path = Path(path)
    try:
        raw = yamlfile.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot be read as YAML: {e}") from e
    if isinstance(raw, dict) and list(raw) == ["traps"]:
        raw = raw["traps"]
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{path}: expected a non-empty list of traps (or a map with only the key traps), got {raw!r}")
    keys = frozenset(condition_keys) if condition_keys is not None else None
    traps: list[Trap] = []
    for n, entry in enumerate(raw, 1):
        name = entry.get("id") if isinstance(entry, dict) else None
        where = f"{path}: entry {n}" + (f" ({name})" if isinstance(name, str) else "")
        try:
            trap = _trap(entry, keys)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if any(t.id == trap.id for t in traps):
            raise ValueError(f"{where}: id {trap.id!r} is already the id of an earlier entry")
        traps.append(trap)
    return tuple(traps)
