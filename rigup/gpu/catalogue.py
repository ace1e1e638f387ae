"""The GPU catalogue (rigup/gpu/catalogue.yml) and lookups in it.

:func:`card_for` takes one card of the ``NvidiaGpus`` fact and finds its catalogue entry by PCI
id first, then by compute capability (its family), never by name: a locked CMP 170HX reports
"NVIDIA Graphics Device". Entries are plain dicts::

    {"key": "cmp170hx-8gb", "class": "cmp170hx", "name": "NVIDIA CMP 170HX",
     "pci_ids": ["10de:20c2"], "compute_capability": (8, 0), "cmake_arch": "80",
     "min_cuda": "11.0", "power_w": {"min": 100, "default": 250, "max": 250},
     "vram_mib": 65536, "vram_locked_mib": 8192, "pcie": {"gen": 1, "width": 4},
     "quirks": {"fp8": False, "fma_throttled": True, "needs_unlock": True},
     "matched_by": "pci_id"}           # or "compute_capability", when found by family

``vram_mib`` is the memory the card has once usable (unlocked), ``vram_locked_mib`` what a
locked card shows (None for cards without a lock).
"""

from __future__ import annotations

import re

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

from rigup import yamlfile
from rigup.boundary.numbers import whole

CATALOGUE_FILE = Path(__file__).resolve().with_name("catalogue.yml")
XID_FILE = CATALOGUE_FILE.with_name("xid.yml")
QUIRKS = ("fp8", "fma_throttled", "needs_unlock")


# The newest compute capability NVIDIA has shipped a family of (Blackwell's 12.x; a minor is one digit):
# past it a card is one rigup knows nothing of, so it gets no CUDA architecture (the plan says so) rather
# than one made of what the host printed (issue 61: "99.99" was CMAKE_CUDA_ARCHITECTURES=9999). Raise it
# with the catalogue's families when a newer generation ships.
CC_MAX = (12, 9)


def parse_cc(value: Any) -> tuple[int, int] | None:
    """``"12.0"``, ``(12, 0)`` or ``[12, 0]`` -> ``(12, 0)``; None when it is none of those, or no
    compute capability up to :data:`CC_MAX` (a major of 1 or more, a one-digit minor)."""
    if isinstance(value, str):
        major, dot, minor = value.strip(" \t\r\n\f\v").partition(".")   # ASCII's blanks alone, as numbers
        value = (whole(major), whole(minor)) if dot else None   # ASCII digits: isdigit() takes "²"
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(type(v) is int for v in value):
        cc = (value[0], value[1])
        return cc if 1 <= cc[0] and 0 <= cc[1] <= 9 and cc <= CC_MAX else None
    return None


def cuda_version(text: str | None) -> tuple[int, ...]:
    """``"12.8"`` -> ``(12, 8)``, for comparing toolkit versions; ``()`` for None."""
    return tuple(int(x) for x in text.split(".")) if text else ()


def _entry(key: str, raw: dict, cc: tuple[int, int]) -> dict:
    vram = raw.get("vram_mib")
    locked = None
    if isinstance(vram, dict):
        vram, locked = vram.get("unlocked"), vram.get("locked")
    quirks = {q: False for q in QUIRKS}
    quirks["fp8"] = cc >= (8, 9)
    quirks.update(raw.get("quirks") or {})
    return {
        "key": key,
        "class": raw.get("class", key),
        "name": raw.get("name"),
        "pci_ids": [p.lower() for p in raw.get("pci_ids", [])],
        "compute_capability": cc,
        "cmake_arch": str(raw["cmake_arch"]),
        "min_cuda": str(raw["min_cuda"]) if raw.get("min_cuda") is not None else None,
        "power_w": dict(raw.get("power_w") or {}),
        "vram_mib": vram,
        "vram_locked_mib": locked,
        "pcie": dict(raw.get("pcie") or {}),
        "quirks": quirks,
    }


@lru_cache(maxsize=None)
def _parsed(path: str) -> dict:
    """The catalogue file, parsed once (the cards and the CUDA table are both in it); read only."""
    return yamlfile.safe_load(Path(path).read_text())


@lru_cache(maxsize=None)
def _load(path: str) -> tuple[dict[str, dict], dict[tuple[int, int], dict]]:
    doc = _parsed(path)
    cards = {}
    for key, raw in doc["cards"].items():
        cc = parse_cc(raw["compute_capability"])
        if cc is None:
            raise ValueError(f"{path}: {key}: compute_capability {raw['compute_capability']!r} is not 'major.minor'")
        cards[key] = _entry(key, raw, cc)
    families = {}
    for cc_text, raw in (doc.get("families") or {}).items():
        cc = parse_cc(str(cc_text))
        families[cc] = _entry(f"sm{raw['cmake_arch']}", raw, cc)
    return cards, families


def cards(path: Path = CATALOGUE_FILE) -> dict[str, dict]:
    """Every catalogue card by key (copies: change them freely)."""
    return copy.deepcopy(_load(str(path))[0])


def card_by_pci_id(pci_id: str | None, path: Path = CATALOGUE_FILE) -> dict | None:
    """The card with PCI id ``pci_id`` ("10de:20c2"), or None."""
    if not pci_id:
        return None
    pci_id = pci_id.lower()
    for card in _load(str(path))[0].values():
        if pci_id in card["pci_ids"]:
            return dict(copy.deepcopy(card), matched_by="pci_id")
    return None


def family_for(cc: Any, path: Path = CATALOGUE_FILE) -> dict | None:
    """The family entry for compute capability ``cc``; for a capability the catalogue does not
    list, a generic one (arch from the capability, min_cuda None). None when ``cc`` is unreadable."""
    cc = parse_cc(cc)
    if cc is None:
        return None
    fam = _load(str(path))[1].get(cc)
    if fam is None:
        arch = f"{cc[0]}{cc[1]}"
        fam = _entry(f"sm{arch}", {"class": f"sm{arch}", "cmake_arch": arch, "min_cuda": None}, cc)
    return dict(copy.deepcopy(fam), matched_by="compute_capability")


def card_for(gpu: dict, path: Path = CATALOGUE_FILE) -> dict | None:
    """The catalogue entry for one card of the ``NvidiaGpus`` fact: by ``pci_device_id`` first,
    then by ``compute_capability`` (family fallback). Never by name. None when neither is known
    (a lost card)."""
    return card_by_pci_id(gpu.get("pci_device_id"), path) or family_for(gpu.get("compute_capability"), path)


def is_locked(gpu: dict, card: dict | None) -> bool:
    """Whether ``gpu`` (an ``NvidiaGpus`` card) still shows only its locked memory."""
    if not card or not card["quirks"].get("needs_unlock") or card.get("vram_locked_mib") is None:
        return False
    total = gpu.get("memory_total_mib")
    return total is not None and total <= card["vram_locked_mib"]


# ----------------------------------------------------------------------------- drivers for CUDA
def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"570.124.06"`` or ``"12.8"`` -> ``(570, 124, 6)`` / ``(12, 8)``; None when not dotted digits."""
    parts = str(text).strip(" \t\r\n\f\v").split(".") if text is not None else []   # ASCII's blanks alone
    # ASCII digits, a few of them ("٥٨٠", "²" and a 5000-digit part are no version: issue 47)
    if not parts or len(parts) > 6 or not all(re.fullmatch(r"[0-9]{1,9}", p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


@lru_cache(maxsize=None)
def _cuda_min_driver(path: str) -> tuple[tuple[tuple[int, ...], str, str], ...]:
    doc = _parsed(path)
    table = [(version_tuple(str(v)), str(v), str(d)) for v, d in (doc.get("cuda_min_driver") or {}).items()]
    return tuple(sorted(table))


def min_driver_for_cuda(version: str, path: Path = CATALOGUE_FILE) -> tuple[str, str] | None:
    """``(listed_version, min_driver)`` for CUDA ``version`` ("12.8" -> ("12.8", "570.26")): the
    entry for it, or for the nearest lower version listed (a lower bound); None when ``version``
    is below the table or not "major.minor"."""
    wanted = version_tuple(version)
    if wanted is None:
        return None
    below = [(listed, driver) for vt, listed, driver in _cuda_min_driver(str(path)) if vt <= wanted]
    return below[-1] if below else None


def newest_cuda_for_driver(driver: str, path: Path = CATALOGUE_FILE) -> str | None:
    """The newest CUDA version listed whose minimum driver ``driver`` meets ("580.105.08" -> "13.0")."""
    have = version_tuple(driver)
    ok = [listed for _, listed, need in _cuda_min_driver(str(path))
          if have is not None and version_tuple(need) <= have]
    return ok[-1] if ok else None


def branch_cuda(branch: str, path: Path = CATALOGUE_FILE) -> str | None:
    """The newest CUDA a driver of ``branch`` ("580") runs: every CUDA's minimum is its branch's
    first release, so any release of the branch at least that one ("580" -> "13.0")."""
    return newest_cuda_for_driver(f"{branch}.9999.9999", path)


def driver_branches(path: Path = CATALOGUE_FILE) -> list[int]:
    """The driver branches NVIDIA released (catalogue.yml ``driver_branches``)."""
    return sorted(int(b) for b in _parsed(str(path)).get("driver_branches") or [])


def oldest_cc(kind: str, version: str, path: Path = CATALOGUE_FILE) -> tuple[tuple[int, int], str] | None:
    """The oldest compute capability ``kind`` ("cuda": a toolkit version, "driver": a branch) of
    ``version`` still supports, and the version that set it: (cc, "13.0"); None when every card is
    (catalogue.yml ``oldest_cc``)."""
    table = (_parsed(str(path)).get("oldest_cc") or {}).get(kind) or {}
    have = version_tuple(str(version))
    found = [(version_tuple(str(v)), str(v), parse_cc(cc)) for v, cc in table.items()]
    below = sorted(f for f in found if have is not None and f[0] <= have)
    return (below[-1][2], below[-1][1]) if below else None


def modules_for(cc: Any, path: Path = CATALOGUE_FILE) -> tuple[str, ...]:
    """The kernel module flavours a card of compute capability ``cc`` runs, best first:
    ("open", "proprietary"), ("open",) or ("proprietary",) (catalogue.yml ``driver_modules``);
    both when ``cc`` is unknown."""
    rule = _parsed(str(path)).get("driver_modules") or {}
    cc = parse_cc(cc)
    if cc is None:
        return ("open", "proprietary")
    found = []
    if cc >= parse_cc(rule.get("open_min_cc", "7.5")):
        found.append("open")
    if cc <= parse_cc(rule.get("proprietary_max_cc", "9.0")):
        found.append("proprietary")
    return tuple(found)


def class_problem(cls) -> str | None:
    """Why ``cls`` is not a card class of the catalogue (e.g. "a100", "cmp170hx"), or None."""
    classes = sorted({c["class"] for c in cards().values()})
    return None if cls in classes else f"not a card class of rigup/gpu/catalogue.yml (its classes: {', '.join(classes)})"


# ----------------------------------------------------------------------------- model families
MODELS_FILE = CATALOGUE_FILE.with_name("models.yml")


@lru_cache(maxsize=None)
def _families(path: str) -> dict[str, dict]:
    doc = yamlfile.safe_load(Path(path).read_text()) or {}
    out = {}
    for key, raw in (doc.get("families") or {}).items():
        cc = raw.get("vllm_min_cc")
        out[key] = {
            "key": key,
            "name": raw.get("name", key),
            "match": [m.lower() for m in raw.get("match", [])],
            "kv_gib_per_1k_tokens": raw.get("kv_gib_per_1k_tokens"),
            "vllm_min_cc": parse_cc(cc) if cc is not None else None,
            "split_mode_row_fails": bool(raw.get("split_mode_row_fails", False)),
            "split_mode_row_error": raw.get("split_mode_row_error"),
            "sources": list(raw.get("sources", [])),
        }
    return out


def model_families(path: Path = MODELS_FILE) -> dict[str, dict]:
    """The model-family catalogue (rigup/gpu/models.yml) by key (copies)."""
    return copy.deepcopy(_families(str(path)))


def family_keys(path: Path = MODELS_FILE) -> tuple[str, ...]:
    """The model families' keys, in the catalogue's order (no copy: every model entry asks)."""
    return tuple(_families(str(path)))


def family_of(model: dict, path: Path = MODELS_FILE) -> dict | None:
    """The family of one entry of ``models``: its ``family`` key, or else the first family whose
    ``match`` strings occur in its ``repo`` (lowercase); None when neither names one."""
    families = _families(str(path))
    if model.get("family"):
        fam = families.get(model["family"])
        return copy.deepcopy(fam) if fam else None
    repo = str(model.get("repo") or "").lower()
    for fam in families.values():
        if any(m in repo for m in fam["match"]):
            return copy.deepcopy(fam)
    return None


def xid_codes() -> dict[int, dict]:
    """The Xid catalogue (rigup/gpu/xid.yml): {code: {"class", "action", "meaning"}}, what
    shipped/xid.py ``events`` classifies by (the guard gets it in its config: no host reads YAML)."""
    return {int(code): dict(entry) for code, entry in yamlfile.safe_load(XID_FILE.read_text()).items()}
