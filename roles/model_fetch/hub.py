"""roles/model_fetch on the controller: what the hub says of each entry of ``models``, asked with
huggingface_hub (the project's chosen client; the host-side fetcher stays its own: huggingface_hub
2.x does not resume a download across processes).

- the hub token: ``model_fetch_hf_token_src``, else ``HF_TOKEN`` or the ``hf auth login`` store
  (``huggingface_hub.get_token()``);
- a branch or tag typed as ``revision``: its commit (``HfApi.model_info``);
- ``size_gib`` when absent: the included files' sizes (the tree listing, with the host's own
  client fetcher.hub_files: a timeout on every request, bounded pages, the token only to the
  endpoint's origin: a next page on another origin is refused);
- a model whose family rigup/gpu/models.yml does not know: the layer count and KV size from the
  GGUF header of its first shard (the first MiB, an HTTP Range request, ``Accept-Encoding:
  identity``, at most HEAD_BYTES read, never decompressed), and whether it has a chat template
  (``tokenizer.chat_template``, after the tokenizer's arrays: the header is read to its end, at
  most HEAD_BYTES); a model without one is named in the plan (llama-server answers chat through
  its fallback template: a base model answers nonsense).

Everything the hub says is data, checked before use like configuration (HubRefused, naming the
hub, the repo and the value): a commit is 40 lowercase hex (:func:`checked_commit`); the listing
is read by rigup.boundary.hosttext.hub_listing (:func:`checked_files`: fetcher.listing_problems,
then each path inside the model's directory and each size whole) after fetcher.hub_files' checks
(a page too long, not JSON, compressed, or a next page on another origin: fetcher.HOSTILE_CODES);
the GGUF header is read uncompressed (:func:`read_capped`), its reader refuses bad bytes and
values with gguf.GGUFRefused, and its figures, fresh or kept in the cache, are read by
hosttext.gguf_figures. A model the hub answered such a thing for is refused (rigup/models.py):
its host is refused by preflight, before anything changes.

Each answer is asked once per run (one listing per repo@commit, whatever the hosts). The role's
``resolve`` is handed to rigup.config, which asks it the first time a host's configuration is read
and keeps the answers in that configuration (``Config.hub``), which every role reads the entries
through (rigup/models.py); nothing here is kept elsewhere. Entries that need nothing of the hub (a
commit, size_gib and a known family typed) are not asked about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import os
from pathlib import Path

from pyinfra.context import ctx_state

from rigup import run as run_state
from rigup.boundary import owned
from rigup.boundary.core import Unreadable, loads
from rigup.boundary.hosttext import gguf_figures, hub_listing
from rigup.entries import normalise
from rigup.models import MODEL, ModelEntry, _HEX40, first_gguf, hub_endpoint, hub_key
from rigup.gpu.catalogue import family_of
from roles.model_fetch.shipped.fetcher import HOSTILE_CODES, HubError, hub_files, listing_problems, select
from shipped.gguf import GGUFRefused, chat_template, header, kv_figures, split_problem, unsized

if TYPE_CHECKING:
    from rigup.config import Config

__all__ = ["token", "resolve", "lines", "HEAD_BYTES", "HubRefused"]

GIB = 1 << 30
# the GGUF header is read from the first MiB, else the first 16 or 64 MiB: its chat template comes after the
# tokenizer's arrays (262k tokens with their scores and types: about 6 MiB; 280k merges: about 6 more)
HEAD_BYTES = (1 << 20, 16 << 20, 64 << 20)
TIMEOUT_S = 20
CACHE_FORMAT = 2   # 2: listings with their hashes (those kept by 1 had none: asked again)


def token(data: Config) -> str | None:
    """The hub token the hosts get: ``model_fetch_hf_token_src`` (a file on the controller), else
    ``HF_TOKEN`` or the token ``hf auth login`` stored (huggingface_hub's own order); none with
    ``hf_endpoint_insecure`` (a token never travels in clear; preflight refuses a token file with it)."""
    if data.get("hf_endpoint_insecure") is True:
        return None
    if data.get("model_fetch_hf_token_src"):   # only a file no other user could have written, a token alone
        return owned.key(owned.read(data["model_fetch_hf_token_src"], "model_fetch_hf_token_src", secret=True),
                         "model_fetch_hf_token_src")
    from huggingface_hub import get_token

    return get_token()


class HubRefused(Exception):
    """What a hub answered is not what rigup accepts (a commit that is not 40 hex, a hostile
    listing, a compressed or oversized header): the hub's answer is data, checked before use."""


def _kept(key: tuple) -> Path | None:
    """Where the answer for ``key`` is kept between runs: only what is said of a commit (its
    listing, a file's header), which never changes; a branch or tag's commit is asked each run.
    ``RIGUP_CACHE_DIR``, else ~/.cache/rigup, then hub/."""
    if key[0] == "commit" or not _HEX40.fullmatch(key[3]):
        return None
    root = Path(os.environ.get("RIGUP_CACHE_DIR") or Path.home() / ".cache" / "rigup") / "hub"
    return root / (hashlib.sha256(json.dumps([CACHE_FORMAT, *key]).encode()).hexdigest() + ".json")


def _run() -> run_state.Run:
    """The run that asks (rigup/run.py: the State pyinfra runs): its ``hub_answers``, (what,
    endpoint, repo, revision[, path]) -> answer or exception, and ``hub_calls``, what was asked of
    the hub, in order. Outside a pyinfra run, a run of this question alone."""
    state = ctx_state.get()
    return run_state.of(state) if state is not None else run_state.Run()


def _once(key: tuple, ask, current=None):
    """``ask()``, asked once per run for ``key`` (once ever for a commit's listing or header: a
    no-op converge asks the hub nothing); an exception is remembered and raised again. The kept
    answer is read and written only in a cache directory no other user can write
    (rigup.boundary.owned: read, write): else HubRefused naming it and the fix. A kept answer
    for which ``current(answer)`` is false (kept before rigup read more of it) is asked again,
    and used still when the hub fails."""
    kept, older = _kept(key), None
    run = _run()
    answers = run.hub_answers
    try:
        if key not in answers and kept and os.path.lexists(kept):
            try:
                answers[key] = loads(owned.read(kept, "the hub's answers kept on the controller"), kept)
            except owned.NotOwned:
                raise
            except ValueError:   # Unreadable too: nested too deep, a key twice
                pass   # not JSON (a write cut short): asked again
            if current and key in answers and not current(answers[key]):
                older = answers.pop(key)
        if key not in answers:
            run.hub_calls.append(key)
            try:
                answers[key] = ask()
            except Exception as e:  # noqa: BLE001 - any failure of the hub is a reason to show
                answers[key] = e if older is None else older
            if kept and not isinstance(answers[key], Exception):
                owned.write(kept, json.dumps(answers[key]), "the hub's answers kept on the controller")
    except owned.NotOwned as e:
        raise HubRefused(f"{e}; refused") from None
    if isinstance(answers[key], Exception):
        raise answers[key]
    return answers[key]


def _api(endpoint: str, secret: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=secret or False)


def checked_commit(endpoint: str, repo: str, revision: str, sha) -> str:
    """``sha``, the commit the hub at ``endpoint`` answered for ``repo``@``revision``, once checked
    to be 40 lowercase hex (it becomes a directory name, the marker and a unit's comment); else
    HubRefused naming the hub, the repo and the value."""
    if isinstance(sha, str) and _HEX40.fullmatch(sha):
        return sha
    raise HubRefused(f"the hub at {endpoint} answered {sha!r} as the commit of {repo}@{revision}: "
                     "not 40 lowercase hex; refused")


def _commit(endpoint: str, repo: str, revision: str, secret: str | None) -> str:
    return _once(("commit", endpoint, repo, revision), lambda: checked_commit(
        endpoint, repo, revision, _api(endpoint, secret).model_info(repo, revision=revision, timeout=TIMEOUT_S).sha))


def _files(endpoint: str, repo: str, commit: str, secret: str | None) -> list[dict]:
    """[{path, size, oid, sha256}] of ``repo`` at ``commit``: one listing per repo@commit per run,
    with the host's own client (fetcher.hub_files: a timeout on every request, a bounded page and
    length, the token only to the endpoint's origin: a next page elsewhere is refused)."""
    def ask():
        try:
            return hub_files(endpoint, repo, commit, secret or None)
        except HubError as e:
            if e.code in HOSTILE_CODES:   # a page too long, not JSON, compressed, or a next page elsewhere
                raise HubRefused(f"{e}; refused") from None
            raise
    return _once(("tree", endpoint, repo, commit), ask)


def checked_files(files, endpoint: str, repo: str, commit: str, allow_unhashed: bool) -> list[dict]:
    """``files`` once checked like configuration (rigup.boundary.hosttext.hub_listing: typed, each
    path inside the model's directory); else HubRefused naming the hub, the repo and the first
    offending paths."""
    try:   # fresh or kept between runs: read the same way
        return hub_listing(files, f"the hub at {endpoint} lists in {repo}@{commit[:12]}",
                           lambda f: listing_problems(f, allow_unhashed))
    except Unreadable as e:
        raise HubRefused(f"{e}; refused") from None


def read_capped(resp, n: int) -> bytes:
    """At most ``n`` bytes of ``resp``'s body as sent (no decompression): a ``Content-Encoding``
    other than identity is refused (a gzip bomb inflates a MiB to GiBs)."""
    encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise HubRefused(f"{resp.url} answered with Content-Encoding {encoding!r}; rigup asked for identity "
                         "(a gzip bomb inflates a MiB to GiBs); refused")
    body = bytearray()
    for chunk in resp.iter_raw():
        body += chunk[:n - len(body)]
        if len(body) >= n:
            break
    return bytes(body)


def _head(endpoint: str, repo: str, commit: str, path: str, secret: str | None, size: int) -> dict:
    """The GGUF header figures of ``path`` (kv_figures), from its first bytes (a Range request)."""
    def ask():
        # imported only when the hub is asked (0.1 s): a kept answer needs none of it
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session

        url = hf_hub_url(repo, path, revision=commit, endpoint=endpoint)
        for n in HEAD_BYTES:
            headers = {**build_hf_headers(token=secret or False), "Range": f"bytes=0-{n - 1}",
                       "Accept-Encoding": "identity"}
            # a server that ignores Range sends it all: n bytes of it are read, then the stream closed
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S) as resp:
                resp.raise_for_status()
                body = read_capped(resp, n)
            try:   # the tokenizer's arrays stepped over, never built: only whether a template follows them
                got = header(body, lambda k: not k.startswith("tokenizer."))
                figures = kv_figures(got.meta)
                split = split_problem(got.meta, path)   # the first file of a set: its count against its name
                if split:
                    raise GGUFRefused(split)
            except GGUFRefused as e:
                raise HubRefused(f"the GGUF header of {url}: {e}; refused") from None
            figures["read_bytes"], figures["chat_template"] = len(body), chat_template(got)
            why = unsized(got, figures, size, n >= size or n == HEAD_BYTES[-1])
            if why:   # a header llama.cpp would not load: the model refused, never "KV cache not counted"
                raise HubRefused(f"the GGUF header of {url}: {why}; refused")
            if got.complete or n >= size:
                return figures
        return figures
    try:   # fresh or kept between runs (a cache file is no more trusted than the hub): read the same way
        # figures kept before the chat template was read (no key): asked again once, for it
        return gguf_figures(_once(("gguf", endpoint, repo, commit, path), ask,
                                  lambda kept: not isinstance(kept, dict) or "chat_template" in kept),
                            f"the GGUF header of {path} in {repo}@{commit[:12]} at {endpoint}")
    except Unreadable as e:
        raise HubRefused(f"{e}; refused") from None


def _why(e: Exception) -> str:
    """One line of a hub failure: huggingface_hub's error class and its first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def _needs(entry: ModelEntry) -> tuple[bool, bool, bool]:
    """(commit, size, gguf): what the hub must say of ``entry``."""
    return (not _HEX40.fullmatch(entry["revision"]), entry["size_gib"] is None,
            entry["family"] is None and family_of(entry) is None)


def _ask(entry: ModelEntry, endpoint: str, secret: str | None) -> dict:
    """What the hub says of one normalised entry: {"commit", "size_gib", "files", "gguf", "error"}."""
    want_commit, want_size, want_gguf = _needs(entry)
    facts: dict = {}
    try:
        commit = _commit(endpoint, entry["repo"], entry["revision"], secret) if want_commit else entry["revision"]
        facts["commit"] = commit
        if not (want_size or want_gguf):
            return facts
        listed = checked_files(_files(endpoint, entry["repo"], commit, secret), endpoint, entry["repo"], commit,
                               entry.get("allow_unhashed") is True)
        chosen, _ = select(listed, entry["include"])
        facts["files"] = len(chosen)
        facts["size_gib"] = sum(f["size"] for f in chosen) / GIB if chosen else None
        first = first_gguf([f["path"] for f in chosen]) if want_gguf else None
        if first:
            size = next(f["size"] for f in chosen if f["path"] == first)
            facts["gguf"] = dict(_head(endpoint, entry["repo"], commit, first, secret, size), file=first)
    except Exception as e:  # noqa: BLE001 - shown on the plan's line and in the refusal
        facts["error"] = f"{_why(e)} (at {endpoint})"
        if isinstance(e, HubRefused):   # a hostile answer: the model is refused (rigup/models.py)
            facts["refused"] = str(e)
    return facts


def _line(name: str, entry: ModelEntry, facts: dict, allowed: bool) -> list[str]:
    """The plan's lines for one entry: the pin to write, the size and the header's figures."""
    where, lines = f"models.{name}", []
    if facts.get("error"):
        return [f"{where}: the hub did not answer what preflight needs: {facts['error']}"]
    if facts.get("commit") and facts["commit"] != entry["revision"]:
        lines.append(f"{where}.revision: {entry['revision']} is {facts['commit']}; pin it" +
                     (" (models_allow_unpinned: fetching that commit)" if allowed else ""))
    if entry["size_gib"] is None:
        lines.append(f"{where}.size_gib: {facts['size_gib']:.3f} GiB from the hub ({facts['files']} file(s))"
                     if facts.get("size_gib") is not None else f"{where}.size_gib: unknown (no file included); "
                     "the disk and VRAM checks need it: set it")
    gguf = facts.get("gguf")
    if gguf:
        kv = gguf["kv_gib_per_1k_tokens"]
        lines.append(f"{where}: family unknown; GGUF header of {gguf['file']} ({gguf['architecture']}): "
                     f"{gguf['layers']} layers, KV cache " +
                     (f"{kv:g} GiB per 1k tokens (f16)" if kv is not None else "not in the header (not counted)"))
        if gguf.get("chat_template") is False:
            lines.append(f"{where}: its GGUF ({gguf['file']}) has no chat template (tokenizer.chat_template): chat "
                         "requests use llama-server's fallback template, and a base model answers them with "
                         "nonsense; serve an instruct model, or give the instance a template (extra_args: "
                         "--chat-template NAME, or --chat-template-file PATH with llama_server_allow: [files]: "
                         "GET /props answers the file's text to any client)")
    elif _needs(entry)[2] and facts.get("files") is not None:
        lines.append(f"{where}: family unknown and no GGUF file included: KV cache not counted; set "
                     f"{where}.family")
    return lines


def _asked_entries(data):
    """(name, normalised entry) of each entry of ``data``'s ``models`` the hub must be asked about."""
    for name, raw in (data.get("models") or {}).items():
        entry, problems = normalise(raw, MODEL, f"models.{name}", name=name)
        if not problems and any(_needs(entry)):   # a wrong entry is refused; a complete one needs no hub
            yield name, entry


def resolve(data) -> dict[tuple, dict]:
    """What the hub says of this host's ``models`` (see the module docstring), by
    rigup.models.hub_key: rigup.config calls it (the role's ``resolve``) the first time a host's
    configuration is read, before any plan, line or refusal reads the entries."""
    endpoint, secret, answers = hub_endpoint(data), None, {}
    for _, entry in _asked_entries(data):
        if secret is None:
            secret = (token(data) or "").strip()
        answers[hub_key(endpoint, entry)] = _ask(entry, endpoint, secret)
    return answers


def lines(data) -> list[str]:
    """The lines preflight prints of what the hub said of this host's models (the pin to write,
    sizes): ``data`` is the host's configuration (rigup.config.Config), whose ``hub`` holds the
    answers; nothing is asked here."""
    endpoint, allowed = hub_endpoint(data), data.get("models_allow_unpinned") is True
    answers = getattr(data, "hub", None) or {}
    return [line for name, entry in _asked_entries(data)
            for line in _line(name, entry, answers.get(hub_key(endpoint, entry)) or
                              {"error": "the hub was not asked"}, allowed)]
