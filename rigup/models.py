"""The ``models`` map: the form of an entry, its defaults, and what the serving roles read of a
model. roles/model_fetch fetches the models; roles/llama_server and roles/vllm serve them; each
reads the entries through :func:`models` so that all see the same defaults and ``dest``.

``models`` and ``models_dir`` are declared in roles/model_fetch/defaults.yml.

What the hub says of an entry (a branch or tag's commit, the included files' size, the GGUF
header's layers and KV size) is read on the controller by roles/model_fetch/hub.py, once per
run, and kept in the host's configuration (rigup.config.Config ``hub``): :func:`models` of a
Config pins each entry with it, so that every role reads the same entry.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import NotRequired, TypedDict

from rigup.boundary.core import Unreadable, loads
from rigup.config import once
from rigup.contract import SERVING
from rigup.entries import Key, normalise, unknown_reference
from rigup.gpu.catalogue import family_keys, family_of
from rigup.names import revision_dir
from rigup.text import LONG_RUN, carries_credentials, long_run, named_secret, special_token


class ModelEntry(TypedDict):
    """One entry of ``models``, normalised (every key present)."""

    repo: str
    revision: str
    include: list[str]
    dest: str
    size_gib: float | None
    warm: bool
    family: str | None
    fetch_from: str | None
    wait: bool
    allow_unhashed: bool
    pinned_from: NotRequired[str]   # the branch or tag typed as revision (models_allow_unpinned)
    gguf: NotRequired[dict]         # {"layers", "kv_gib_per_1k_tokens", "file"}: an unknown family's header


MODEL: dict[str, Key] = {
    "repo": Key("str", doc="the hub repository, owner/name"),
    "revision": Key("str", doc="a full 40-hex commit id (a branch or tag moves: it is resolved and "
                               "refused unless models_allow_unpinned)"),
    "include": Key("list of str", [], "glob patterns of the files to fetch (default: all files)"),
    "dest": Key("path or null", None, "where the files go (default: models_dir/<name>)"),
    "size_gib": Key("float 0.. or null", None, "GiB on disk, for preflight's disk and VRAM checks "
                                               "(default: the included files' sizes on the hub)"),
    "family": Key("str or null", None, "a family of rigup/gpu/models.yml (default: matched from repo)"),
    "fetch_from": Key("str or null", None, "a host of the inventory to copy the completed model from"),
    "wait": Key("bool", False, "block the converge until the model is complete"),
    "warm": Key("bool", False, "keep the model's files in the page cache (rigup-model-warm.timer, as the service "
                               "user, every model_fetch_warm_interval_s: vmtouch reads the pages not cached): a "
                               "router's swap to it then loads from RAM"),
    "allow_unhashed": Key("bool", False, "fetch files the hub lists without a hash, unverified "
                                         "(default: such a listing is refused)"),
}

class ServingInstance(TypedDict):
    """What every entry of a serving map (llama_server_instances, vllm_instances) has."""

    model: str
    port: int
    host: str
    api_key: bool
    extra_args: list[str]


# The keys every serving instance has (rigup/contract SERVING); a serving role's schema adds its own.
SERVING_KEYS: dict[str, Key] = {r.key: Key(r.form, r.default, r.doc) for r in SERVING}

_FLAG = re.compile(r"(\S*?)(=|\s+|$)(.*)", re.S)   # an item of extra_args: flag, "=" or blanks, value


def flag_values(args: list[str], flags, abbrev: bool = False, exact=frozenset()) -> list[tuple[str, str | None]]:
    """(flag, value) for each of ``flags`` in ``args`` (extra_args), in order, spelled ``-sm row``
    (two items), ``--split-mode=row`` or ``-sm row`` (one item); value None when none follows.
    ``abbrev``: as vLLM's argparse reads them too, ``--served_model_name`` and ``--serv``; but a flag
    of ``exact`` (the program's own, which argparse takes as it is) is no abbreviation of a longer one."""
    found = []
    for i, arg in enumerate(args):
        head, sep, tail = _FLAG.fullmatch(str(arg)).groups()
        if abbrev and head.startswith("--") and head not in flags and "--" + head[2:].replace("_", "-") not in exact:
            head = "--" + head[2:].replace("_", "-")
            head = head if head in flags else next((f for f in flags if len(head) > 3 and f.startswith(head)), head)
        if head in flags:
            found.append((head, tail.strip() if sep else (args[i + 1] if i + 1 < len(args) else None)))
    return found


def owned_flag_problems(args: list[str], owned: dict, where: str, abbrev: bool = False,
                        exact=frozenset()) -> list[tuple[str, str]]:
    """(``WHERE.extra_args``, why) for each flag of ``owned`` (flag -> the key rigup sets it from;
    None: the instance's name) given in ``args``: the last one given wins, so it would undo what
    rigup set and checked (the bind, the port, the model, the key)."""
    return [(f"{where}.extra_args", f"gives {flag}, which rigup sets from "
             + (f"{where}.{owned[flag]}: drop it from extra_args and set {owned[flag]}" if owned[flag] else
                "the instance's name: drop it from extra_args")) for flag, _ in flag_values(args, owned, abbrev, exact)]


def credential_problems(value, where: str) -> list[tuple[str, str]]:
    """(key path, why) for each string in ``value`` (a serving instance, vllm_env) that carries credentials
    (rigup.text.carries_credentials: a URL's password or token, a secret parameter, a tab or line break):
    an extra_args value (``--otlp-traces-endpoint http://u:TOKEN@collector``, ``--model-url ...?token=``)
    stands in the server's command line (ps, the unit, the journal), a variable in its env file, either in
    the plan (issue 61, round 15 V48)."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in credential_problems(item, f"{where}.{key}")]
    if isinstance(value, list):   # each item, and each flag with the item after it (round 25 V25a: ["--x-password", S])
        pairs = [(f"{where}[{i + 1}]", f"is the value of {a[:40]}, a flag named for a secret, and would stand in the "
                  "server's command line, which any local user reads in ps or the unit, the plan and the journal")
                 for i, (a, b) in enumerate(zip(value, value[1:])) if secret_flag(a) and isinstance(b, str)]
        return [p for i, item in enumerate(value) for p in credential_problems(item, f"{where}[{i}]")] + pairs
    if not isinstance(value, str):
        return []
    pieces = _json_pieces(value)   # a JSON document (--json-schema, --hf-overrides): each scalar with its key, too
    if pieces is not None:
        found = [p for piece in pieces for p in _text_problems(piece, f"{where} (JSON)")]
        return found[:1] or ([] if long_run(value) else _text_problems(value, where))
    return _text_problems(value, where)


def secret_flag(arg) -> bool:
    """Whether ``arg`` is a flag named for a secret that takes its value as the next item (``--redis-password``,
    ``--api-key``; not ``--api-key=S``, one item, read as text)."""
    return isinstance(arg, str) and arg.startswith("-") and "=" not in arg and named_secret(arg)


def _text_problems(text: str, where: str) -> list[tuple[str, str]]:
    """:func:`credential_problems` of one text, read as it stands."""
    if long_run(text):
        return [(where, f"holds a run of over {LONG_RUN} characters without a blank, which rigup does not read for "
                        "credentials (round 20 R20a: its readers' time grows with the run's square): split it, or name "
                        "a file (llama-server's --json-schema-file)")]
    return [(where, "carries credentials (a URL's user:password@ or token@, a secret parameter such as ?token=, "
                    "or a tab or line break, which a URL parser drops): they would stand in the server's command "
                    "line or environment, which any local user reads in ps or the unit, the plan and the journal; "
                    "give the URL without them")] if carries_credentials(text) else []


def _json_pieces(text: str) -> list[str] | None:
    """Each scalar of ``text`` read as a JSON object or array, as JSON text with its key where it has one
    (``{"password": "S"}`` read as the pair it is; a list's items with the key over the list: ``{"password":
    ["S"]}`` is ``{"password": "S"}``, round 23 J23a; a number under a secret's key as text), and each key alone, so that each piece is read for
    credentials alone, within the long-run bound (round 21 F21: a minified --json-schema of 3,325 characters
    was refused as a run); None for text that is no such document (rigup.boundary.core.loads: a key given twice,
    NaN, nesting deeper than Python recurses: then the text is read whole, or refused as a run)."""
    def pieces(value, key) -> list[str]:
        if isinstance(value, dict):   # (a map's own keys name what is under them: a JSON Schema's "password":
            # {"type": "string"} is no secret; round 24 F24a)
            return [p for k, item in value.items() for p in pieces(item, k)] + list(map(json.dumps, value))
        if isinstance(value, list):
            return [p for item in value for p in pieces(item, key)]
        if key is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and named_secret(key) \
                and not special_token(key, "<id>"):   # (image_token: 151655 is a token's id: round 25 F25a)
            value = str(value)   # a number given for a secret is one (round 24 J24a: {"api_key": 84731122903})
        return [json.dumps({key: value}) if key is not None else json.dumps(value)]
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        parsed = loads(text, "a value")
        return pieces(parsed, None) if isinstance(parsed, (dict, list)) else None
    except (Unreadable, RecursionError):
        return None


_HEX40 = re.compile(r"[0-9a-f]{40}")
_SHARD = re.compile(r"-([0-9]{5})-of-([0-9]{5})\.gguf$")
# a file name of a marker that may become a unit's argument: relative, no '..' component, no
# control character (a newline would start a line of the drop-in), no backslash
_PLAIN_FILE = re.compile(r"(?!/)(?!(?:.*/)?\.\.(?:/|$))[^\x00-\x1f\x7f\\]+")
DEFAULT_ENDPOINT = "https://huggingface.co"
def hub_endpoint(data: dict) -> str:
    """The hub of this host's models: ``hf_endpoint``, else ``HF_ENDPOINT`` of the controller's
    environment (as huggingface_hub reads it), else the Hugging Face hub."""
    return str(data.get("hf_endpoint") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_key(endpoint: str, entry: ModelEntry) -> tuple:
    """The key of an entry's hub facts: the same repo, revision and include on the same hub."""
    return endpoint, entry["repo"], entry["revision"], tuple(entry["include"])


def _with_hub(entry: ModelEntry, facts: dict, allow_unpinned: bool, where: str,
              endpoint: str = "the hub") -> list[tuple[str, str]]:
    """Fill ``entry`` from the hub's ``facts``: the commit of a branch or tag (when
    ``allow_unpinned``; else a problem that says the pin to write), the size when absent, and
    the GGUF header's figures when the family is unknown; a problem when the hub's answer was
    refused (``facts["refused"]``: a hostile listing or header)."""
    rev, commit = entry["revision"], facts.get("commit")
    if not _HEX40.fullmatch(rev):
        if not commit:
            why = facts.get("error") or "the hub was not asked"
            return [(f"{where}.revision", f"expected a full 40-hex commit id, got {rev!r}, which the hub could "
                                          f"not resolve ({why})")]
        if not (isinstance(commit, str) and _HEX40.fullmatch(commit)):   # it becomes paths and unit lines
            return [(f"{where}.revision", f"the hub at {endpoint} answered {commit!r} as the "
                                          f"commit of {entry['repo']}@{rev}, not 40 lowercase hex; refused")]
        if not allow_unpinned:
            return [(f"{where}.revision", f"{rev} is {commit}; pin it (revision: {commit}): a branch or tag "
                                          "moves; or --data models_allow_unpinned=true to fetch that commit")]
        entry["pinned_from"], entry["revision"] = rev, commit
    if facts.get("refused"):   # a hostile answer (roles/model_fetch/hub.py HubRefused)
        return [(f"{where}.repo", f"{facts['refused']} before any byte: check hf_endpoint (a mirror you trust) "
                                  "and the repo")]
    if entry.get("size_gib") is None and facts.get("size_gib") is not None:
        entry["size_gib"] = facts["size_gib"]
    if facts.get("gguf") and entry.get("family") is None and family_of(entry) is None:
        entry["gguf"] = dict(facts["gguf"])
    return []


@lru_cache(maxsize=1024)
def repo_id(repo: str) -> bool:
    """Whether ``repo`` is a hub repo id ``org/name``, as huggingface_hub validates one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return repo.count("/") == 1 and repo.isascii()


def models(data: dict) -> tuple[dict[str, ModelEntry], list[tuple[str, str]]]:
    """The host's ``models``, normalised with their ``dest``, and (key path, problem) for each
    entry that is wrong; an entry with a problem is left out of the result. Made once per run for
    a host's configuration (rigup.config.once): read it, never change it."""
    return once(data, "models", lambda: _models(data))


def _models(data: dict) -> tuple[dict[str, ModelEntry], list[tuple[str, str]]]:
    families = family_keys()
    hub = getattr(data, "hub", None) or {}   # a rigup.config.Config: the hub's answers (a dict: none)
    models_dir = str(data.get("models_dir") or "/srv/models").rstrip("/")  # "/" -> "": dest "/<name>"
    out: dict[str, ModelEntry] = {}
    problems: list[tuple[str, str]] = []
    for name, raw in (data.get("models") or {}).items():
        where = f"models.{name}"
        entry, found = normalise(raw, MODEL, where, name=name)
        if "repo" in entry and not repo_id(entry["repo"]):
            found.append((f"{where}.repo", f"expected the hub's org/name (ASCII letters, digits, '-', '_', '.'; "
                                           f"no '--' or '..'; not starting or ending with '-' or '.'), "
                                           f"got {entry['repo']!r}"))
        for i, pattern in enumerate(entry.get("include") or []):   # patterns match paths inside dest only
            if isinstance(pattern, str) and (pattern.startswith("/") or ".." in pattern.split("/")):
                found.append((f"{where}.include[{i}]", f"{pattern[:120]!r}: an absolute pattern or one with a '..' "
                                                       "part matches no file (the files are paths inside dest)"))
        if entry.get("family") is not None and entry["family"] not in families:
            found.append((f"{where}.family", f"{entry['family']!r} is not a family of rigup/gpu/models.yml "
                                             f"(its families: {', '.join(families)})"))
        facts = hub.get(hub_key(hub_endpoint(data), entry)) if not found else None
        if facts is not None:
            found += _with_hub(entry, facts, data.get("models_allow_unpinned") is True, where, hub_endpoint(data))
        elif "revision" in entry and not _HEX40.fullmatch(entry["revision"]):
            found.append((f"{where}.revision", f"expected a full 40-hex commit id, got {entry['revision']!r} "
                                               "(a branch or tag moves; pin the commit)"))
        problems += found
        if not found:
            entry["dest"] = entry["dest"] or f"{models_dir}/{name}"
            out[name] = entry
    return out, problems


def model_dests(data: dict) -> list[str]:
    """Where this host's models go (their ``dest``), for the free-disk facts."""
    return sorted({m["dest"] for m in models(data)[0].values()})


def model_places(data: dict) -> list[tuple[str, str | None]]:
    """Where each model's wanted revision may already lie, for the disk check: ``(dest,
    revision)`` (counted only while dest holds that revision, or none yet) and the revision's own
    directory next to it, where a revision change fetches (rigup.names.revision_dir)."""
    entries = models(data)[0].values()
    return sorted({p for m in entries for p in ((m["dest"], m["revision"]),
                                                 (revision_dir(m["dest"], m["revision"]), None))},
                  key=lambda p: p[0])


def first_gguf(files: list[str]) -> str | None:
    """The GGUF file llama-server is given for a model whose marker lists ``files``: the first
    shard of a split model (``…-00001-of-0000N.gguf``; the others are found by llama.cpp), else
    the single ``.gguf`` (mmproj files, vision projectors, are not the model). With several
    unsplit GGUFs (quants side by side) the first by name; None without any. A name that is not a
    plain relative path (:data:`_PLAIN_FILE`: a marker written by hand) is never chosen."""
    ggufs = sorted(f for f in files if isinstance(f, str) and f.endswith(".gguf") and _PLAIN_FILE.fullmatch(f))
    firsts = [f for f in ggufs if (m := _SHARD.search(f)) and int(m.group(1)) == 1]
    if firsts:
        return firsts[0]
    whole = [f for f in ggufs if not _SHARD.search(f) and "mmproj" not in f.rsplit("/", 1)[-1].lower()]
    return whole[0] if whole else None


def instances(data: dict, var: str, schema: dict[str, Key], entry_problems=None,
              raw: dict | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """The entries of the serving map ``var`` (``llama_server_instances``, ``vllm_instances``),
    normalised against ``schema``, and (key path, problem) for each wrong one: an unknown or
    mistyped key, a ``model`` that is not a key of ``models``, a value that carries credentials
    (:func:`credential_problems`), or what ``entry_problems(entry,
    where, model)`` finds (the role's own rules; ``model`` is the valid entry of ``models`` or
    None). An entry with a problem, or whose model has one, is left out of the result. ``raw``:
    the entries to read instead of ``data[var]`` (llama_server's, with the tuned flags laid over)."""
    valid, _ = models(data)
    declared = data.get("models") or {}
    out: dict = {}
    problems: list[tuple[str, str]] = []
    for name, given in (data.get(var) or {} if raw is None else raw).items():
        where = f"{var}.{name}"
        entry, found = normalise(given, schema, where, name=name)
        model = entry.get("model")
        if model is not None and model not in declared:
            found.append((f"{where}.model", unknown_reference(model, declared, "models")))
        carried = [] if found else credential_problems(entry, where)
        if entry_problems is not None and not found:   # the role's own refusals too: a held-off or owned flag
            found += entry_problems(entry, where, valid.get(model))   # whose value holds a secret is both
        found += carried
        problems += found
        if not found and model in valid:
            out[name] = entry
    return out, problems


def of_form(var: str, raw: dict, schema: dict[str, Key]) -> tuple[dict, list[tuple[str, str]]]:
    """The entries ``raw`` of the serving map ``var`` that are each of ``schema``'s form,
    normalised, by name in order, and (key path, problem) for the others, left out (the rules
    across entries and ``models`` are :func:`instances`', which preflight checks before a
    converge reads a peer's data or a host's)."""
    found, problems = {}, []
    for name, entry in raw.items():
        inst, wrong = normalise(entry, schema, f"{var}.{name}", name=name)
        problems += wrong
        if not wrong:
            found[name] = inst
    return {name: found[name] for name in sorted(found)}, problems
