#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-fetch: the host side of roles/model_fetch. Python 3 standard library only, so it runs on
any host with python3; the role installs it as ``/opt/rigup/bin/rigup-fetch`` and also sends it
inline as the fact that reads every model's state (``probe``).

    rigup-fetch probe SPEC_JSON     state of each model (marker, progress, lock) and, for a model
                                    not complete, the hub's file list and the free disk: one JSON
                                    line per model (the role's fact, one round trip)
    rigup-fetch fetch JOB_JSON      the download job of one model (a transient systemd unit)
    rigup-fetch share CONFIG_JSON   serve completed models to peers (fetch_from)
    rigup-fetch switch SPEC_JSON    (root) point a model's dest at its complete revision directory
    rigup-fetch prune SPEC_JSON     (root) remove a model's revision directories no longer wanted
    rigup-fetch metrics CONFIG_JSON every model's download state as rigup_model_fetch_* lines in the
                                    node exporter's textfile directory (run by a root timer)

Layout under a model's dest::

    <files at their repo paths>
    .rigup-complete.json            {"repo","revision","files","bytes"}: written last, after every
                                    file was verified; removed when a job starts
    .rigup-fetch/job.json           what to fetch: repo, revision, source, files with size + hash
    .rigup-fetch/state.json         files verified: path -> [size, mtime_ns, hash]
    .rigup-fetch/progress.json      bytes, total, rate, eta, state, error (rewritten each second)
    .rigup-fetch/parts/<path>       partial downloads (a prefix of the file); resumed with Range
    .rigup-fetch/ckpt/<path>        each part's checkpoint (apart: no listed name can collide)
    .rigup-fetch/lock               flock held by the running job (one job per model); holds its pid

A revision change never touches the revision being served: the job fetches into a directory of
its own next to dest (``.<name>@<revision[:12]>``, given as the probe spec's ``stage``), with
every file the new revision shares with the current one hard-linked from it (no byte fetched,
no disk used). Once it is complete and verified, ``switch`` makes dest a link to it in one
rename (the first time, when dest is still a directory, the two are exchanged with
renameat2(RENAME_EXCHANGE) and the old directory becomes its own revision directory); the
converge then restarts the instances and ``prune`` removes the old revision.

Resume: a part is a prefix of its file, so a new job asks for ``Range: bytes=<size>-``. After a
reboot (another boot id) the part is cut back to its last fsync'ed checkpoint, since the page
cache may not have reached the disk (zero-filled tails). A checkpoint (fsync the part, then
record its length) is taken every CHECKPOINT bytes or CHECKPOINT_S seconds and when the job is
stopped (SIGTERM, SIGINT: ``systemctl stop``, a clean reboot), so a crash loses little and a
clean stop nothing. Within a job, a stream that ends early, is reset, or stalls (fewer than
``stall_bytes`` bytes, default STALL_MIN_BYTES, in a window of ``stall_s`` s, default STALL_S: a
hub trickling a byte at a time stalls too) is resumed with ``Range`` after a backoff, up to
``retries`` times, default RETRIES, in a row without a stream that brought ``stall_bytes``. A 206 is taken only with a
``Content-Range`` that starts at the byte asked for and names the listed size (another would
corrupt the file: the job fails at once), and the job fails at once on an answer with a
``Content-Encoding`` other than identity (a gzip bomb); a hub that ignores ``Range`` (a 200)
restarts the file from zero, and one that cuts those streams too fails the job after ``retries``
restarts. Every file is checked for its size and its hash (sha256 for LFS files, else git's blob
sha1, both from the hub's tree listing) before it moves into place; a file that fails is fetched
again from zero, once more, then the job fails. A failed job says why in progress.json's ``error`` (no space left, the
hub's answer, an unsafe path) and exits PERMANENT when running it again cannot help.

Hub listings are not trusted (:func:`listing_problems`): a path that is absolute, has a ``..``
component, a backslash or a control character, or names rigup's own files, a path listed twice
(also case-insensitively) or as a file and a directory, a size that is not a non-negative
integer, a file without a hash (unless the model sets ``allow_unhashed``), a listing of more than
MAX_FILES files, a page over MAX_LISTING_BYTES or with a ``Content-Encoding`` other than identity,
or whose next page is on another origin is refused (the plan refuses the model, and this
script checks again before every write, rename or delete that nothing lands outside ``dest``).
Parts and their checkpoints live in directories of their own (``parts/``, ``ckpt/``), so no listed
name can be taken for another's checkpoint.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import fnmatch
import hashlib
import hmac
import http.server
import itertools
import json
import os
import random
import re
import shutil
import signal
import socketserver
import subprocess
import stat
import sys
import threading
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from http.client import HTTPException

WORK = ".rigup-fetch"
CHUNK = 1 << 20
CHECKPOINT = 16 << 20      # a checkpoint every 16 MiB of a stream ...
CHECKPOINT_S = 5.0         # ... or every 5 s, whichever comes first: what a crash may lose
STALL_S = 60.0             # a stream's stall window, in s (the job's stall_s) ...
STALL_MIN_BYTES = 64 << 10  # ... and the bytes it must bring in each window (the job's stall_bytes)
RETRIES = 10               # reconnects in a row without a stream that brought STALL_MIN_BYTES before a
                           # stream fails; also restarts from zero of a file whose hub ignores Range
BACKOFF_S, BACKOFF_MAX_S = 0.5, 30.0
RETRY_STATUS = (408, 425, 429, 500, 502, 503, 504)  # hub answers worth asking again
PERMANENT = 3              # exit status of a failure that a restart cannot mend (RestartPreventExitStatus)
SHARD_RE = re.compile(r"^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$")
USER_AGENT = "rigup-fetch/1"


# ---------------------------------------------------------------- helpers (also used by the role)

def human(n: float) -> str:
    """Bytes as people read them: 512 B, 3.4 MiB, 1.35 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def unsafe_path(path) -> str | None:
    """Why the hub-listed ``path`` may not be written under a model's dest, or None when it is a
    plain relative path there. Lexical only (the plan has no filesystem): see :func:`inside`."""
    if not isinstance(path, str) or not path:
        return "an empty path"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "a control character in the path"
    odd = next((c for c in path if c in LOOKALIKE_SLASHES or c in IGNORABLE
                or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") or unicodedata.category(c) == "Zs" and c != " "),
               None)
    if odd:   # a name shown as a/b that is one file, or text that reads otherwise than it is (Cs: a lone
        # surrogate, JSON's "\ud800", names no file on the host)
        return (f"the character U+{ord(odd):04X} ({unicodedata.name(odd, 'unnamed')}) in the path: "
                "it looks like a slash, is invisible, or reorders the text")
    if len(path.encode()) > PATH_MAX or any(len(p.encode()) > NAME_MAX for p in path.split("/")):
        return f"a path the host cannot create (at most {PATH_MAX} bytes, a part at most {NAME_MAX})"
    if "\\" in path:
        return "a backslash in the path"
    if path.startswith("/"):
        return "an absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "a '..' component, which leads outside the model's directory"
    if "" in parts or "." in parts:
        return "an empty or '.' component"
    if parts[0].casefold().startswith(".rigup-"):   # rigup's own (the job's work directory, the marker), in any case
        return f"it would overwrite rigup's own {parts[0]}"
    if [p.casefold() for p in parts[:2]] == [".cache", "huggingface"]:   # removed after each job
        return "it is in huggingface_hub's own directory (.cache/huggingface), which the job removes"
    if any(p != p.strip() for p in parts):
        return "a component that starts or ends with a space"
    return None


NAME_MAX, PATH_MAX = 255, 4096   # Linux's limits on a file name and a path, in bytes (rigup/boundary/fields.py's)
# characters a terminal shows as "/" (division, fraction and fullwidth slashes, ...)
LOOKALIKE_SLASHES = frozenset("\u2044\u2215\u2571\u29f8\uff0f\u1735\u2cc6\u3033")
# Unicode's Default_Ignorable_Code_Point characters drawn as nothing that are not Cf (variation
# selectors, the combining grapheme joiner (Mn), Hangul fillers (Lo), Mongolian selectors), and
# the Cf ranges for good measure: 'a\ufe0f.gguf' shows as 'a.gguf'. Written out by hand: the
# standard library's unicodedata has no such property.
IGNORABLE = frozenset(chr(c) for lo, hi in ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF), (0x034F, 0x034F),
                                            (0x115F, 0x1160), (0x3164, 0x3164), (0xFFA0, 0xFFA0),
                                            (0x180B, 0x180F), (0x200B, 0x200F), (0x2060, 0x206F),
                                            (0xFEFF, 0xFEFF))
                      for c in range(lo, hi + 1))


MAX_LISTING_BYTES = 64 << 20   # one page of the hub's tree listing
# HubError codes of a listing that is wrong whatever the network does: refused, never asked again
HOSTILE_CODES = ("ListingTooLong", "BadListing", "ContentEncoding", "ForeignPage")
LISTING_S = 300                # the whole listing, every page (each request also has its timeout)
MAX_FILES = 10_000   # a listing longer than this is refused (a hub that answers without end)
HEX40, HEX64 = re.compile(r"[0-9a-f]{40}"), re.compile(r"[0-9a-f]{64}")


def listing_problems(files: list, allow_unhashed: bool = False) -> list[tuple[str, str]]:
    """(path, why) of each thing wrong in a hub's listing ``files`` ([{path, size, oid, sha256}]):
    an unsafe path (:func:`unsafe_path`), a size that is not a non-negative integer, a hash that is
    missing (unless ``allow_unhashed``) or not hex, a path listed twice (also case-insensitively, and
    in another Unicode normal form),
    a file that is also a directory, a listing longer than MAX_FILES. Everything a hub says is
    data: checked like configuration before any byte."""
    if not isinstance(files, list):
        return [("", f"the listing is not a list ({type(files).__name__})")]
    if len(files) > MAX_FILES:
        return [("", f"the listing has {len(files)} files, more than {MAX_FILES}")]
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for f in files:
        path = f.get("path") if isinstance(f, dict) else None
        why = unsafe_path(path) if isinstance(f, dict) else "an entry that is not an object"
        if why:
            out.append((path if isinstance(path, str) else repr(path), why))
            continue
        size = f.get("size")
        if type(size) is not int or size < 0:
            out.append((path, f"size {size!r} is not a non-negative integer"))
        sha, oid = f.get("sha256"), f.get("oid")
        if sha is not None and not (isinstance(sha, str) and HEX64.fullmatch(sha)):
            out.append((path, f"sha256 {sha!r} is not 64 lowercase hex"))
        if oid is not None and not (isinstance(oid, str) and HEX40.fullmatch(oid)):
            out.append((path, f"git blob id {oid!r} is not 40 lowercase hex"))
        if sha is None and oid is None and not allow_unhashed:
            out.append((path, "no hash (neither sha256 nor git blob id): it could not be verified; "
                              "allow_unhashed: true on the model fetches it unverified"))
        # Unicode's compatibility caseless match: 'é' (NFC) and 'e' + U+0301 (NFD) are one name on
        # a file system that normalises (macOS, ZFS normalization=), and fullwidth 'ａ.gguf' looks
        # like 'a.gguf' everywhere
        key = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", path).casefold())
        if key in seen:
            out.append((path, f"listed twice (as {seen[key]!a}; paths are compared case-insensitively, "
                              "in Unicode's compatibility form)"))
        seen.setdefault(key, path)
    for key, path in seen.items():
        parts = key.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                out.append((path, f"{seen['/'.join(parts[:i])]!r} is listed as a file and a directory"))
                break
    return out


FILES_MAX = 1 << 16       # a marker's files (rigup/boundary/results.py FILES_MAX)
MARKER_BYTES_MAX = 1 << 60
PROGRESS_BYTES_MAX = 1 << 56    # a progress record's bytes (rigup/boundary/hosttext.py MAX_BYTES) ...
PROGRESS_ETA_MAX = 10 ** 9      # ... and seconds left (MAX_ETA_S)
STATE_WORD = re.compile(r"[a-z]{1,16}")


def _count(value, hi: int) -> bool:
    return type(value) is int and 0 <= value <= hi


def _plain_text(value, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and not any(
        unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in value)


def marker_problem(doc) -> str | None:
    """Why a completion marker (its parsed JSON) does not read as rigup/boundary/results.py ``marker``
    reads one, or None: an object of schema 1 (or none), ``files`` a list of plain relative paths
    (:func:`unsafe_path`), ``repo`` and ``revision`` text, ``bytes`` a JSON int; each may be absent.
    The rigup user can write the marker: one of another shape is no marker to the probe (the model is
    fetched again), the share server, the metrics and the warm pass, never a crash of theirs
    (tests/unit/test_fetcher_markers.py holds it within the boundary's reader)."""
    if not isinstance(doc, dict):
        return f"not a JSON object: {type(doc).__name__}"
    if "schema" in doc and not (type(doc["schema"]) is int and doc["schema"] == 1):
        return f"schema {shown(doc['schema'], 40)}: not 1"
    files = doc.get("files", [])
    if not (isinstance(files, list) and len(files) <= FILES_MAX):
        return f"files: not a list of at most {FILES_MAX}"
    bad = next(((f, unsafe_path(f)) for f in files if unsafe_path(f)), None)
    if bad:
        return f"files: {shown(repr(bad[0]), 200)}: {bad[1]}"
    for key, limit in (("repo", 400), ("revision", 200)):
        if key in doc and not _plain_text(doc[key], limit):
            return f"{key}: not text of at most {limit} characters"
    return None if _count(doc.get("bytes", 0), MARKER_BYTES_MAX) else "bytes: not a whole number"


def marker_of(doc) -> dict | None:
    """``doc`` when it reads as a completion marker (:func:`marker_problem`), else None."""
    return None if marker_problem(doc) else doc


def progress_of(doc) -> dict | None:
    """A job's progress.json (its parsed JSON; {} for none) as rigup/boundary/hosttext.py
    ``download_progress`` reads it, and ``updated`` a finite time, or None when it does not read
    (JSON ints for the bytes, at most the total; finite rate, ETA and time; a state word; text)."""
    if not isinstance(doc, dict):
        return None
    state, done, total = doc.get("state"), doc.get("bytes", 0), doc.get("total", 0)
    if state is not None and not (isinstance(state, str) and STATE_WORD.fullmatch(state)):
        return None
    if not (_count(done, PROGRESS_BYTES_MAX) and _count(total, PROGRESS_BYTES_MAX)) or total and done > total:
        return None
    for key, hi in (("rate", PROGRESS_BYTES_MAX), ("eta", PROGRESS_ETA_MAX), ("updated", 1e11)):
        value = doc.get(key)
        if value is not None and not (type(value) in (int, float) and 0 <= value <= hi):   # NaN fails both
            return None
    return doc if all(isinstance(doc.get(k), (str, type(None))) for k in ("error", "detail", "source")) else None


class UnsafePath(Exception):
    """A hub-listed path would be written, renamed or deleted outside the model's dest."""


def inside(root: str, path: str) -> str:
    """``path`` itself, once checked that with its symlinks resolved it lies under ``root``; else
    UnsafePath. Called before every write, rename or delete (defence in depth: the plan has
    refused unsafe listings already)."""
    top = os.path.realpath(root)
    if os.path.commonpath([top, os.path.realpath(path)]) != top:
        raise UnsafePath(f"{path} resolves outside {root}")
    return path


def safe_join(root: str, rel: str) -> str:
    """``root/rel`` for the hub-listed ``rel``; UnsafePath when ``rel`` is unsafe (:func:`unsafe_path`)
    or resolves outside ``root``."""
    why = unsafe_path(rel)
    if why:
        raise UnsafePath(f"the hub listed {rel!r}: {why}")
    return inside(root, os.path.join(root, rel))


def shard_problems(paths) -> list[str]:
    """Incomplete GGUF shard sets among ``paths``: one line per set that lacks a shard."""
    sets: dict[tuple[str, int], set[int]] = {}
    for p in paths:
        m = SHARD_RE.match(p)
        if m:
            sets.setdefault((m.group(1), int(m.group(3))), set()).add(int(m.group(2)))
    out = []
    for (prefix, count), have in sorted(sets.items()):
        missing = sorted(set(range(1, count + 1)) - have)
        if missing:
            out.append(f"{prefix}-*-of-{count:05d}.gguf lacks shard(s) "
                       + ", ".join(f"{i:05d}" for i in missing))
    return out


def select(files: list[dict], include: list[str]) -> tuple[list[dict], list[str]]:
    """The files matching any pattern of ``include`` (all files when it is empty), and the
    patterns that matched nothing."""
    if not include:
        return list(files), []
    chosen = [f for f in files if any(fnmatch.fnmatchcase(f["path"], p) for p in include)]
    unmatched = [p for p in include if not any(fnmatch.fnmatchcase(f["path"], p) for f in files)]
    return chosen, unmatched


def git_blob_sha1(size: int):
    h = hashlib.sha1()
    h.update(b"blob %d\0" % size)
    return h


def hasher(entry: dict):
    """A hash object for ``entry``'s expected hash: sha256 when the hub gave one, else git's."""
    return hashlib.sha256() if entry.get("sha256") else git_blob_sha1(entry["size"])


def expected_hash(entry: dict) -> str | None:
    return entry.get("sha256") or entry.get("oid")


class Run:
    """One run of rigup-fetch, made in :func:`main` and passed to what needs it (issue 64: no
    module-level state): the names the role passes in every spec, job and share configuration
    (:meth:`named`: the completion marker's file name, the hub token's and the share token's paths,
    defined once in rigup/names.py), and the stop every stream reads (``stop``), set by SIGTERM or
    SIGINT (:meth:`on_signal`, which keeps the signal's name in ``why``) or by a stream's failure."""

    def __init__(self):
        self.marker = self.token_file = self.share_token_file = ""
        self.stop = threading.Event()
        self.why: list[str] = []

    def named(self, doc: dict) -> Run:
        """The marker's name and the tokens' paths from the role's JSON (``marker``, ``token_file``,
        ``share_token_file``)."""
        self.marker, self.token_file, self.share_token_file = (doc["marker"], doc["token_file"],
                                                               doc.get("share_token_file", ""))
        return self

    def read_token(self, name: str = "hf-token") -> str | None:
        """A token: the unit's credential ``name`` (LoadCredential), or its root-only file (a job run
        as root without systemd): the hub's (``hf-token``) or the fleet's share token (``share-token``)."""
        own = self.token_file if name == "hf-token" else self.share_token_file
        for path in (os.path.join(os.environ.get("CREDENTIALS_DIRECTORY", "/nonexistent"), name), own):
            try:
                with open(path) as fh:
                    token = fh.read().strip()
                if token:
                    return token
            except OSError:
                pass
        return None

    def on_signal(self, signum, _frame) -> None:
        """SIGTERM/SIGINT (``systemctl stop``, a clean reboot, Ctrl-C): every stream checkpoints its
        part and ends; the job exits 0."""
        self.why.append(signal.Signals(signum).name)
        self.stop.set()


class HubError(Exception):
    """The hub refused a request; ``code`` is its X-Error-Code (RepoNotFound, RevisionNotFound),
    or rigup's own: Unreachable, Timeout, or one of HOSTILE_CODES."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def _request(url: str, token: str | None, headers: dict | None = None, timeout: float = 30):
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")  # never to a CDN redirect
    # the job's environment is the unit's: no proxy unless HTTPS_PROXY is set for it
    return urllib.request.urlopen(req, timeout=timeout)


def hub_files(endpoint: str, repo: str, revision: str, token: str | None) -> list[dict]:
    """Every file of ``repo`` at ``revision``: [{path, size, oid, sha256}], from the hub's tree API
    (``/api/models/{repo}/tree/{revision}?recursive=true``, following its Link pages)."""
    url = (f"{endpoint.rstrip('/')}/api/models/{repo}/tree/{urllib.parse.quote(revision, safe='')}"
           "?recursive=true&expand=false")
    out, deadline = [], time.monotonic() + LISTING_S
    while url:
        try:
            with _request(url, token) as resp:
                encoding = not_identity(resp)
                if encoding:
                    raise HubError(0, "ContentEncoding", f"{endpoint} answered its listing of {repo} with "
                                                         f"Content-Encoding {encoding!r}; rigup asks for identity "
                                                         "(a compressed page may inflate without bound)")
                body = bytearray()
                while chunk := resp.read1(1 << 16):   # one recv at a time: the deadline holds
                    body += chunk
                    if len(body) > MAX_LISTING_BYTES:
                        raise HubError(0, "ListingTooLong", f"a page of {endpoint}'s listing of {repo} is over "
                                                            f"{MAX_LISTING_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise HubError(0, "Timeout", f"{endpoint} took over {LISTING_S} s to list {repo}")
                if getattr(resp, "length", None):   # closed before its Content-Length: never a listing
                    raise HubError(0, "CutOff", f"{endpoint}'s listing of {repo} ended after {len(body)} bytes, "
                                                f"{resp.length} short of its Content-Length")
                try:
                    items = json.loads(body)
                except (ValueError, RecursionError) as e:   # nested past the stack: a hostile listing (H1)
                    raise HubError(0, "BadListing", f"{endpoint}'s listing of {repo} is not JSON: {e}") from None
                if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                    raise HubError(0, "BadListing", f"{endpoint}'s listing of {repo} is not a list of objects")
                link = resp.headers.get("Link") or ""
        except urllib.error.HTTPError as e:
            code = e.headers.get("X-Error-Code") or ""
            body = e.read(4096).decode(errors="replace")
            if "html" in (e.headers.get("Content-Type") or "").lower():   # a proxy's error page: its words, not its markup
                body = " ".join(re.sub(r"<[^>]*>", " ", body).split())
            raise HubError(e.code, code, f"HTTP {e.code} {code or e.reason}: {body[:300]}".strip()) from None
        except (urllib.error.URLError, OSError) as e:
            raise HubError(0, "Unreachable", f"cannot reach {endpoint}: {getattr(e, 'reason', e)}") from None
        for item in items:
            if item.get("type") == "file":
                lfs = item.get("lfs") or {}
                out.append({"path": item.get("path"), "size": item.get("size"), "oid": item.get("oid"),
                            "sha256": lfs.get("oid") if isinstance(lfs, dict) and lfs.get("oid") else None})
            if len(out) > MAX_FILES:
                raise HubError(0, "ListingTooLong", f"{endpoint} lists more than {MAX_FILES} files in {repo}")
        m = re.search(r'<([^>]+)>;\s*rel="next"', link)
        url = urllib.parse.urljoin(url, m.group(1)) if m else None
        if url and not same_origin(url, endpoint):   # the token goes to the hub, nowhere else
            raise HubError(0, "ForeignPage", f"{endpoint}'s listing of {repo} has its next page on another host: "
                                             f"{url}; not followed (the token goes to the hub's origin alone)")
    return out


def not_identity(resp) -> str | None:
    """The ``Content-Encoding`` of ``resp`` when it is not identity (urllib asks for identity and
    decompresses nothing: a gzip body would be taken for the listing or the file), else None."""
    encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
    return None if encoding == "identity" else encoding


def same_origin(url: str, endpoint: str) -> bool:
    """Whether ``url`` has the scheme, host and port of ``endpoint``."""
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(endpoint)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def disk_free(path: str) -> int:
    """Free bytes for an unprivileged writer on the filesystem that holds (or will hold) ``path``."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path``: never through a symlink at its last
    component, never blocking (a FIFO, a device: OSError), so that a planted object is no file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def read_json(path: str, default=None):
    try:
        with os.fdopen(open_regular(path)) as fh:
            return json.load(fh)
    except (OSError, ValueError, RecursionError):  # not JSON, nested too deep, over int's digit limit
        return default


def as_owner(path: str, fn, *args):
    """``fn(*args)`` (its result, JSON) computed by the owner of the directory ``path`` (a model's
    directory; root's links followed): root reads what another user can place there only as that
    user, in a child that drops root first, so that a symlink planted there reaches nothing its
    owner could not read already. ``fn(*args)`` itself when this is not root, or ``path`` is
    root's or not there."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is None or st.st_uid == 0 or os.geteuid() != 0:
        return fn(*args)
    sys.stdout.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back to the caller's code
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(st.st_gid)
            os.setuid(st.st_uid)
            try:
                result = {"result": fn(*args)}
            except Exception as e:  # said by the parent
                result = {"error": f"{type(e).__name__}: {e}"}
            with os.fdopen(write, "w") as out:
                json.dump(result, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    _, status = os.waitpid(pid, 0)
    answer = json.loads(text) if status == 0 and text else {"error": f"the child ended with status {status}"}
    if "error" in answer:
        raise RuntimeError(f"reading {path} as its owner (uid {st.st_uid}): {answer['error']}")
    return answer["result"]


def write_json(path: str, value, fsync: bool = False) -> None:
    """Replace ``path`` with ``value`` atomically (:func:`replace`, the umask's mode)."""
    replace(path, json.dumps(value, separators=(",", ":")), mode=None, fsync=fsync)


def replace(path: str, text: str, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write ``path`` atomically: a new temp file beside it (a random dot-name, O_EXCL|O_NOFOLLOW: a
    link or file another user planted in the directory is never opened), chmod'ed to ``mode`` (None:
    the umask's), then renamed over ``path`` (a rename replaces a link there, never follows it); the
    temp file never outlives a failure. Each host program carries this copy (it ships alone)."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def overwrite_json(path: str, value) -> None:
    """Write ``value`` into the existing ``path`` in place, then cut it to length: the last word of
    a job on a full disk, where a new file has no block to go to but an old one has its own."""
    data = json.dumps(value, separators=(",", ":")).encode()
    with open(path, "r+b") as fh:
        fh.write(data)
        fh.truncate(len(data))


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def lock_held(dest: str) -> bool:
    """True while a job holds ``dest``'s lock (a lock that is no regular file is none)."""
    path = os.path.join(dest, WORK, "lock")
    try:
        fd = open_regular(path)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def verified_ok(dest: str, state: dict, path: str) -> bool:
    """``path`` is as it was when it was verified (same size and mtime)."""
    rec = state.get(path)
    try:
        st = os.stat(os.path.join(dest, path))
    except OSError:
        return False
    return bool(rec) and rec[0] == st.st_size and rec[1] == st.st_mtime_ns


# ---------------------------------------------------------------------------------- probe (fact)

def revisions(spec: dict) -> list[str]:
    """The model's revision directories next to its dest other than the one dest points to and
    the one a revision change fetches into (``spec["stage"]``), newest first."""
    dest, stage = spec["dest"].rstrip("/"), spec.get("stage")
    if not stage:
        return []
    parent, prefix = os.path.dirname(stage), os.path.basename(stage).rsplit("@", 1)[0] + "@"
    current = os.path.realpath(dest)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = [os.path.join(parent, n) for n in names if n.startswith(prefix)
             and re.fullmatch(r"[0-9a-f]{12}", n[len(prefix):])]
    found = [d for d in found if os.path.isdir(d) and not os.path.islink(d)
             and d != stage and os.path.realpath(d) != current and not lock_held(d)]
    return sorted(found, key=lambda d: -os.stat(d).st_mtime)


def staged(spec: dict, marker) -> bool:
    """Whether the model's job works in its revision directory: dest holds another complete
    revision (one being served), or such a job began already."""
    stage = spec.get("stage")
    if not stage or os.path.realpath(spec["dest"]) == os.path.realpath(stage):
        return False
    other = marker and (marker.get("repo"), marker.get("revision")) != (spec["repo"], spec["revision"])
    return bool(other) or os.path.isdir(stage)


def what_is(path: str, kind: str, owners: tuple = ()) -> str | None:
    """What ``path`` is when it is not of ``kind`` (``f`` a regular file, ``d`` a directory), or
    not owned by one of ``owners`` (uids; any when empty), and not absent: ``a symlink to X``,
    ``a FIFO``, ``a socket``, ``a device``, ``a directory``, ``a file``, ``owned by uid N``; None
    when it is as it should be, or absent. Never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    mode = st.st_mode
    if stat.S_ISREG(mode) and kind == "f" or stat.S_ISDIR(mode) and kind == "d":
        return None if not owners or st.st_uid in owners else f"owned by uid {st.st_uid}"
    if stat.S_ISLNK(mode):
        return f"a symlink to {os.readlink(path)}"
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a directory"
            if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode) else "a device")


def planted(where: str, marker: str) -> list[list[str]]:
    """[path, what it is] for each name rigup uses in the model directory ``where`` (the marker,
    the job's directory and its files) that holds something rigup never makes there (a symlink,
    a FIFO, a directory in a file's place): whoever can write there (the rigup user) planted it.
    ``where`` itself may be root's link (a revision switch) and nothing else but a directory;
    what is inside is root's or the directory's owner's (whoever else owns a name there could
    replace it). ``marker``: the completion marker's file name."""
    found = []
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        return []
    if stat.S_ISLNK(st.st_mode) and st.st_uid != 0 or not stat.S_ISLNK(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        return [[where, f"{what_is(where, 'd')} (owner uid {st.st_uid})"]]
    owners = (0, os.stat(where).st_uid)
    work = os.path.join(where, WORK)
    names = [(os.path.join(where, marker), "f"), (work, "d")]
    if what_is(work, "d", owners) is None and os.path.isdir(work):
        names += [(os.path.join(work, n), "f") for n in ("job.json", "progress.json", "state.json", "lock")]
        names += [(os.path.join(work, n), "d") for n in ("parts", "ckpt")]
    for path, kind in names:
        what = what_is(path, kind, owners)
        if what:
            found.append([path, what])
    return found


def _unsafe_chain(path: str) -> str | None:
    """Why another user than root could write or replace the directory ``path`` or one above it,
    or make it (or one above it) first; None when none can."""
    parts, p = [], path
    while p not in ("/", ""):
        parts.append(p)
        p = os.path.dirname(p)
    chain, shared = ["/"] + parts[::-1], None   # shared: a sticky directory others can write, just above
    for p in chain:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return (f"{p} is not there, and anyone can make it first in {shared}, which others can write"
                    if shared else None)        # else made by root from here on (install -d)
        except OSError as e:
            return f"{p} cannot be read ({e.strerror})"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                return f"{p} is a symlink owned by uid {st.st_uid}, not root"
            shared = None
            continue             # root's link: its target's chain is checked too
        if not stat.S_ISDIR(st.st_mode):
            return f"{p} is not a directory"
        writable = st.st_mode & 0o002 or st.st_mode & 0o020 and st.st_gid != 0
        if st.st_uid != 0 or writable and (p == path or not st.st_mode & 0o1000):
            return (f"{p} can be written by others than root (owner uid {st.st_uid}, group gid {st.st_gid}, "
                    f"mode {st.st_mode & 0o7777:o})")
        shared = p if writable else None   # sticky: what root made in it stays root's
    return None


def unsafe_parent(dest: str) -> str | None:
    """Why no model directory may be made at ``dest``: a directory above it (as written, and with
    its links resolved) that a user other than root can write, replace or make first; None when
    only root can. Root makes a model's directory (install -d) and renames revisions there."""
    parent = os.path.dirname(dest.rstrip("/")) or "/"
    return _unsafe_chain(parent) or _unsafe_chain(os.path.realpath(parent))


def probe_one(spec: dict, token: str | None, marker_name: str) -> dict:
    dest = spec["dest"]
    current = marker_of(read_json(os.path.join(dest, marker_name)))   # one that does not read: none (fetched again)
    where = spec["stage"] if staged(spec, current) else dest
    work = os.path.join(where, WORK)
    job = read_json(os.path.join(work, "job.json"))
    out = {"name": spec["name"], "dest": dest, "where": where, "running": lock_held(where),
           "marker": marker_of(read_json(os.path.join(where, marker_name))),
           "progress": read_json(os.path.join(work, "progress.json")),
           "job": job if isinstance(job, dict) else None, "damaged": [], "previous": revisions(spec),
           "planted": planted(dest, marker_name) + (planted(where, marker_name) if where != dest else []),
           "unsafe_parent": unsafe_parent(dest)}
    if where != dest:
        out["serving"] = current
    job, marker = out["job"] or {}, out["marker"]
    same = (marker and marker.get("repo") == spec["repo"] and marker.get("revision") == spec["revision"]
            and job.get("include") == spec["include"])
    if same:
        state = read_json(os.path.join(work, "state.json"), {})
        out["damaged"] = [p for p in marker.get("files", []) if not verified_ok(where, state, p)]
        if not out["damaged"]:
            out["complete"], out["staged"] = where == dest, where != dest
            return out
    out["complete"] = False
    # bytes already here: verified files, and parts of the files the job is fetching
    have = 0
    for entry in job.get("files", []):
        for path in (os.path.join(where, entry["path"]), os.path.join(work, "parts", entry["path"])):
            try:
                have += min(os.path.getsize(path), entry["size"])
                break
            except OSError:
                pass
    out["have_bytes"] = have
    out["free_bytes"] = disk_free(where if os.path.isdir(where) else dest)
    if spec.get("no_hub"):
        return out
    try:
        out["hub_files"] = hub_files(spec["endpoint"], spec["repo"], spec["revision"], token)
    except HubError as e:
        out["hub_error"] = {"status": e.status, "code": e.code, "message": str(e)}
        return out
    if where != dest:  # what the new revision takes from the one served: no byte, no disk
        out["reusable"] = {f["path"]: f["size"] for f in out["hub_files"]
                           if not os.path.exists(os.path.join(where, f["path"])) and reusable(dest, f)}
    return out


def reusable(dest: str, entry: dict) -> str | None:
    """The verified file of the revision at ``dest`` that ``entry`` (a file of another revision)
    is, byte for byte (same size and hash), or None."""
    if unsafe_path(entry.get("path")):
        return None
    state = read_json(os.path.join(dest, WORK, "state.json"), {})
    rec = state.get(entry["path"])
    if rec and rec[0] == entry["size"] and rec[2] == expected_hash(entry) and verified_ok(dest, state, entry["path"]):
        return os.path.join(dest, entry["path"])
    return None


def probe(run: Run, spec_b64: str) -> int:
    """Every model's state, each read as the owner of its directory (:func:`as_owner`), with the
    hub token read first (root's file)."""
    specs = json.loads(base64.b64decode(spec_b64))
    if specs:
        run.named(specs[0])
    token = run.read_token()
    for spec in specs:
        try:
            result = as_owner(spec["dest"], probe_one, spec, token, run.marker)
        except Exception as e:  # one model's surprise must not hide the others
            result = {"name": spec.get("name"), "probe_error": f"{type(e).__name__}: {e}"}
        print("##rigup-model " + json.dumps(result, separators=(",", ":")))
    return 0


# ---------------------------------------------------------------------------------- fetch (job)

class Stopped(Exception):
    """The job was told to stop (SIGTERM, SIGINT), or another stream failed: this stream closed
    its connection, checkpointed its part and ended."""


class JobFailed(Exception):
    """A failure, said as people read it; ``permanent`` when running the job again cannot help."""

    def __init__(self, message: str, permanent: bool = True):
        super().__init__(message)
        self.permanent = permanent


class LocalError(Exception):
    """An OSError of the local filesystem (its ``__cause__``) inside a stream, which the stream's
    network retries must let pass (ENOSPC is no reason to reconnect)."""


@contextmanager
def local():
    try:
        yield
    except OSError as e:
        raise LocalError(str(e)) from e


def log(message: str) -> None:
    """A line to the journal (or job.log); never an error of its own (job.log on a full disk)."""
    with _suppress():
        print(shown(message, 4000), file=sys.stderr)


class Progress:
    """Bytes done, rate over the last 20 s, ETA; written to progress.json each second."""

    def __init__(self, path: str, total: int, done: int, source: str):
        self.path, self.total, self.done, self.source = path, total, done, source
        self.fetched = 0          # bytes over the network in this job
        self.resumes = 0          # streams resumed within this job (a cut, a reset, a stall)
        self.samples = [(time.monotonic(), done)]
        self.state, self.error, self.detail = "running", None, ""
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started = time.time()

    def add(self, n: int, network: bool = True) -> None:
        with self.lock:
            self.done += n
            if network:
                self.fetched += n

    def resumed(self, detail: str) -> None:
        """A stream is resumed within the job: count it, say why (progress line and journal)."""
        with self.lock:
            self.resumes += 1
            self.detail = detail
        log(f"rigup-fetch: {detail}")

    def resumed_ok(self) -> None:
        """A resumed stream brings bytes again: its retry's reason is no longer the job's detail."""
        with self.lock:
            self.detail = ""

    def snapshot(self) -> dict:
        now = time.monotonic()
        with self.lock:
            self.samples.append((now, self.done))
            self.samples = [s for s in self.samples if now - s[0] <= 20] or self.samples[-1:]
            t0, b0 = self.samples[0]
            rate = (self.done - b0) / (now - t0) if now > t0 else 0.0
            left = max(self.total - self.done, 0)
            return {"state": self.state, "bytes": self.done, "total": self.total,
                    "rate": round(rate), "eta": round(left / rate) if rate > 0 and left else None,
                    "fetched": self.fetched, "resumes": self.resumes, "source": self.source,
                    "error": self.error, "detail": self.detail, "started": self.started,
                    "updated": time.time(), "pid": os.getpid()}

    def write(self) -> None:
        """progress.json; on a full disk, over the old one in place (:func:`overwrite_json`)."""
        snap = self.snapshot()
        try:
            write_json(self.path, snap)
        except OSError:
            with _suppress():
                overwrite_json(self.path, snap)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.write()


def checkpoint(fh, ckpt_path: str, written: int) -> None:
    """fsync the part, then record (fsync'ed) that its first ``written`` bytes are on disk in
    this boot: what a job after a reboot keeps."""
    with local():
        fh.flush()
        os.fsync(fh.fileno())
        write_json(ckpt_path, {"boot": boot_id(), "bytes": written}, fsync=True)


def resume_point(part: str, ckpt_path: str, size: int) -> int:
    """Bytes of ``part`` to keep: all of it in the boot that wrote it (a kill -9 loses only the
    page cache's future, not its present), only the checkpointed ones after a reboot."""
    try:
        have = os.path.getsize(part)
    except OSError:
        return 0
    ckpt = read_json(ckpt_path, {})
    if have and ckpt.get("boot") != boot_id():
        have = min(have, int(ckpt.get("bytes", 0)))
    return min(have, size)


def hub_answer(e: urllib.error.HTTPError, path: str) -> str:
    code = (e.headers.get("X-Error-Code") if e.headers else "") or ""
    return f"hub answered {e.code}{f' ({code})' if code else ''} for {path}"


def net_reason(e: Exception, stall: float) -> str:
    """A network error as people read it."""
    if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
        return f"no byte for {stall:g} s (stalled)"
    if isinstance(e, ConnectionResetError):
        return "the connection was reset"
    if isinstance(e, urllib.error.URLError):
        return f"cannot reach the hub: {e.reason}"
    return f"{type(e).__name__}: {e}"


CONTENT_RANGE_RE = re.compile(r"bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)")


def range_problem(value, start: int, size: int) -> str | None:
    """Why a 206's ``Content-Range`` does not carry bytes ``start``.. of a file of ``size`` bytes
    (None when it does): ``bytes START-END/TOTAL`` with START the byte asked for, END within the
    file, TOTAL its listed size or ``*``."""
    m = CONTENT_RANGE_RE.fullmatch((value or "").strip())
    if not m:
        return "not bytes START-END/TOTAL"
    first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
    if first != start:
        return f"it starts at byte {first}"
    if total != "*" and int(total) != size:
        return f"its total is not the listed size {size}"
    if last < first or last >= size:
        return f"its end {last} is outside bytes {first}-{size - 1}"
    return None


def receive(run: Run, url: str, token: str | None, entry: dict, fh, h, written: int, ckpt_path: str,
            progress: Progress, stall: float, stall_bytes: int = STALL_MIN_BYTES, retries: int | None = None):
    """Append ``entry``'s bytes from ``written`` on to ``fh`` and ``h``; return (h, written).

    A stream that ends early, is reset or cut, or stalls is asked again from where it stopped
    (``Range``) after an exponential backoff with jitter, up to ``retries`` (default RETRIES) times in a row without a
    stream that brought ``stall_bytes`` (or the rest of the file). Stalled: fewer than
    ``stall_bytes`` (or the rest of the file) in a window of ``stall`` s, or no byte for ``stall``
    s (the socket's timeout); each read is one ``recv`` at most (``read1``), so a hub trickling a
    byte at a time is seen between reads. A 206 whose ``Content-Range`` does not start at the
    byte asked for or names another size than the listed one fails the job at once (its bytes
    would land at the wrong place); a 200 to a ``Range`` request (the hub ignores it) starts the
    file again from zero, and after ``retries`` such restarts a cut fails the job. A hub answer other
    than RETRY_STATUS fails at once. Written by hand where the project would use tenacity: this
    script runs on bare hosts with the standard library alone. Checkpoints every CHECKPOINT bytes
    or CHECKPOINT_S s, and on the way out (a stop, a failure), after the connection is closed;
    fsyncs a whole file."""
    size, path = entry["size"], entry["path"]
    retries = RETRIES if retries is None else retries
    failures = 0
    restarts = 0                  # streams started again from zero: the hub ignored Range
    next_bytes, next_time = written + CHECKPOINT, time.monotonic() + CHECKPOINT_S
    try:
        while written < size:
            stalled = None
            try:
                asked = written
                headers = {"Range": f"bytes={asked}-"} if asked else {}
                with _request(url, token, headers, timeout=stall) as resp:
                    encoding = not_identity(resp)
                    if encoding:
                        raise JobFailed(f"{path}: the hub answered {url} with Content-Encoding {encoding!r}; "
                                        "rigup asks for identity (a compressed body is not the file and may "
                                        "inflate without bound): refused")
                    if resp.status == 206:
                        given = resp.headers.get("Content-Range")
                        bad = range_problem(given, asked, size)
                        if bad:
                            raise JobFailed(f"{path}: asked for bytes={asked}- of {size}, the hub answered 206 "
                                            f"with Content-Range {given!r} ({bad}); refused, since its bytes "
                                            f"would corrupt the file")
                    elif asked:  # the server ignored Range: start again
                        restarts += 1
                        progress.add(-written, network=False)
                        with local():
                            fh.truncate(0)
                        h, written = hasher(entry), 0
                    with local():
                        fh.seek(written)
                    got = 0                   # bytes of this stream
                    window, in_window = time.monotonic(), 0
                    need = min(stall_bytes, size - written)
                    while written < size:
                        if run.stop.is_set():
                            raise Stopped()
                        block = resp.read1(min(CHUNK, size - written))
                        if not block:
                            break
                        with local():
                            fh.write(block)
                        h.update(block)
                        written += len(block)
                        progress.add(len(block))
                        got += len(block)
                        in_window += len(block)
                        if got >= stall_bytes:  # this stream brought something: a new budget
                            if failures:   # resumed: the reason it retried is past (status shows the detail)
                                progress.resumed_ok()
                            failures = 0
                        now = time.monotonic()
                        if written >= next_bytes or now >= next_time:
                            checkpoint(fh, ckpt_path, written)
                            next_bytes, next_time = written + CHECKPOINT, time.monotonic() + CHECKPOINT_S
                        if written < size and now - window >= stall:
                            if in_window < need:
                                stalled = (f"{human(in_window)} in {now - window:.1f} s, under "
                                           f"{human(need)} per {stall:g} s (stalled)")
                                break
                            window, in_window, need = now, 0, min(stall_bytes, size - written)
                if written >= size:
                    break
                why = stalled or f"the stream ended at {human(written)} of {human(size)}"
            except urllib.error.HTTPError as e:
                e.close()
                if e.code not in RETRY_STATUS:
                    raise JobFailed(hub_answer(e, path)) from None
                why = f"the hub answered {e.code}"
            except (OSError, HTTPException) as e:  # reset, refused, cut short, stalled (timeout)
                why = net_reason(e, stall)
            if restarts >= retries:
                raise JobFailed(f"{path}: the hub ignores Range (it answered 200, the whole file, to "
                                f"{restarts} requests for the rest) and cut the stream {restarts + 1} times "
                                f"(last: {why})", permanent=False)
            failures += 1
            if failures > retries:
                raise JobFailed(f"{path}: {why}; {retries} retries in a row failed", permanent=False)
            delay = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)
            progress.resumed(f"{path}: {why}; resumed from {human(written)} with Range in {delay:.1f} s "
                             f"(retry {failures}/{retries}"
                             + (f", {restarts} restart(s) from zero: the hub ignores Range)" if restarts else ")"))
            if run.stop.wait(delay):
                raise Stopped()
    except BaseException:
        with _suppress(LocalError):
            checkpoint(fh, ckpt_path, written)
        raise
    with local():
        fh.flush()
        os.fsync(fh.fileno())
    return h, written


def hash_prefix(run: Run, fh, n: int, h):
    """``h`` updated with the first ``n`` bytes of ``fh`` (a part being resumed)."""
    fh.seek(0)
    while n:
        if run.stop.is_set():
            raise Stopped()
        block = fh.read(min(CHUNK, n))
        if not block:
            break
        h.update(block)
        n -= len(block)
    return h


def fetch_file(run: Run, job: dict, entry: dict, dest: str, progress: Progress, token: str | None) -> str:
    """Download ``entry`` into its part, verify it, move it into place; return its hash."""
    if run.stop.is_set():
        raise Stopped()
    path = entry["path"]
    parts, ckpts = os.path.join(dest, WORK, "parts"), os.path.join(dest, WORK, "ckpt")
    part, final, ckpt_path = safe_join(parts, path), safe_join(dest, path), safe_join(ckpts, path)
    os.makedirs(os.path.dirname(part), exist_ok=True)
    os.makedirs(os.path.dirname(ckpt_path), exist_ok=True)
    url = (f"{job['source'].rstrip('/')}/{job['repo']}/resolve/"
           f"{urllib.parse.quote(job['revision'], safe='')}/{urllib.parse.quote(path)}")
    stall = float(job.get("stall_s") or STALL_S)
    stall_bytes = int(job.get("stall_bytes") or STALL_MIN_BYTES)
    retries = int(job["retries"]) if job.get("retries") else None
    if expected_hash(entry) is None and not job.get("allow_unhashed"):
        raise JobFailed(f"{path}: the hub lists no hash for it (allow_unhashed is not set)")
    for attempt in (1, 2):
        have = resume_point(part, ckpt_path, entry["size"])
        with open(part, "ab+") as fh:
            fh.truncate(have)
            h = hash_prefix(run, fh, have, hasher(entry))
            if have or entry["size"] > CHECKPOINT:  # what is here is on disk, in this boot (a file
                checkpoint(fh, ckpt_path, have)   # smaller than that is cheaper to fetch again)
            progress.add(have, network=False)
            h, written = receive(run, url, token, entry, fh, h, have, ckpt_path, progress, stall,
                                 stall_bytes, retries)
        digest = h.hexdigest()
        want = expected_hash(entry)
        if written == entry["size"] and (want is None or digest == want):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(inside(parts, part), inside(dest, final))
            with _suppress():
                os.unlink(ckpt_path)
            return digest
        why = (f"size {written} != {entry['size']}" if written != entry["size"]
               else f"hash {digest} != {want}")
        progress.detail = f"{path}: {why}; fetched again from zero"
        progress.add(-written, network=False)
        os.unlink(inside(parts, part))
        with _suppress():
            os.unlink(ckpt_path)
    raise JobFailed(f"{path}: fetched twice and still wrong ({why})")


class _suppress:
    """Suppress ``kinds`` of exceptions (default OSError)."""

    def __init__(self, *kinds):
        self.kinds = kinds or (OSError,)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], self.kinds)


def hash_file(run: Run, path: str, entry: dict) -> str:
    h = hasher(entry)
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            if run.stop.is_set():
                raise Stopped()
            h.update(block)
    return h.hexdigest()


def wait_for_peer(run: Run, job: dict, progress: Progress, token) -> None:
    """A peer serves a model only once it is complete there: wait for its marker."""
    url = f"{job['source'].rstrip('/')}/rigup/complete/{job['repo']}/{job['revision']}"
    deadline = time.monotonic() + job.get("peer_wait", 86400)
    while True:
        try:
            with _request(url, token, timeout=10) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):  # waiting mends no token: say so at once
                raise JobFailed(f"peer {job['source']} refused this host's share token (HTTP {e.code}); "
                                "the fleet's hosts need the same model_fetch_share_token_src", permanent=True)
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise JobFailed(f"peer {job['source']} did not have {job['repo']}@{job['revision'][:12]} "
                            f"complete within {job.get('peer_wait')} s", permanent=False)
        progress.state, progress.detail = "waiting", f"waiting for peer {job['source']} to complete"
        progress.write()
        if run.stop.wait(5):
            raise Stopped()


def linked(reuse: str, entry: dict, final: str) -> bool:
    """``final`` made a hard link to the same file of the revision at ``reuse``, when it has it."""
    src = reusable(reuse, entry)
    if not src:
        return False
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.link(src, final)
        return True
    except OSError:  # another filesystem, or a link limit: fetched instead
        return False


def failure(e: Exception, dest: str, progress: Progress) -> tuple[str, bool]:
    """(why the job failed, as progress.json's error says it; whether that is permanent)."""
    err = e.__cause__ if isinstance(e, LocalError) else e
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        more = max(progress.total - progress.done - disk_free(dest), 0)
        return f"no space left on device at {dest}, {human(more)} more needed", True
    if isinstance(err, OSError):
        return f"{err.strerror or err} at {err.filename or dest}", err.errno in (errno.EACCES, errno.EROFS)
    if isinstance(err, UnsafePath):
        return f"refused: {err}; nothing is written outside {dest}", True
    if isinstance(err, JobFailed):
        return str(err), err.permanent
    return f"{type(err).__name__}: {err}", False


def clean_work(work: str, wanted: set[str]) -> None:
    """Remove what killed jobs leave: temp files of JSON writes, parts of files not in this job."""
    for n in os.listdir(work):
        if ".tmp" in n:
            os.unlink(inside(work, os.path.join(work, n)))
    for sub in ("parts", "ckpt"):
        top = os.path.join(work, sub)
        for root, _, names in os.walk(top):
            for n in names:
                full = os.path.join(root, n)
                if os.path.relpath(full, top) not in wanted:
                    os.unlink(inside(top, full))


def fetch(run: Run, job_path: str) -> int:
    job = read_json(job_path)
    run.named(job)
    dest = job["dest"]
    work = inside(dest, os.path.join(dest, WORK))
    os.makedirs(os.path.join(work, "parts"), exist_ok=True)
    lock = open(os.path.join(work, "lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(shown(f"another job fetches {dest}; this one stops", 4000), file=sys.stderr)
        return 0
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # what the role kills to stop a job that is not a systemd unit
    lock.flush()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, run.on_signal)
    token = run.read_token("share-token" if job.get("peer") else "hf-token")  # a peer wants the fleet's token
    files = job["files"]
    total = sum(f["size"] for f in files)
    progress = Progress(os.path.join(work, "progress.json"), total, 0, job["source"])
    progress.state = "verifying"
    progress.write()  # at once: the converge's wait tells a job that starts from one that died
    ticker = threading.Thread(target=progress.run, daemon=True)
    ticker.start()
    try:
        for entry in files:  # the plan refused these already; a job.json made by hand is checked too
            safe_join(dest, entry["path"])
        bad = listing_problems(files, bool(job.get("allow_unhashed")))
        if bad:
            raise JobFailed(f"the job's listing: {bad[0][0]!r}: {bad[0][1]}")
        wanted = {f["path"] for f in files}
        with _suppress():
            os.unlink(os.path.join(dest, run.marker))
        clean_work(work, wanted)
        # huggingface_hub's own leftovers
        shutil.rmtree(inside(dest, os.path.join(dest, ".cache", "huggingface", "download")), ignore_errors=True)
        state_path = os.path.join(work, "state.json")
        state = read_json(state_path, {})
        state = {p: r for p, r in state.items() if p in wanted}
        todo = []
        progress.detail = "checking files already here"
        for entry in files:
            final = safe_join(dest, entry["path"])
            if verified_ok(dest, state, entry["path"]) and state[entry["path"]][2] == expected_hash(entry):
                progress.add(entry["size"], network=False)
                continue
            state.pop(entry["path"], None)
            if os.path.exists(final):
                if os.path.getsize(final) == entry["size"] and hash_file(run, final, entry) == expected_hash(entry):
                    st = os.stat(final)
                    state[entry["path"]] = [st.st_size, st.st_mtime_ns, expected_hash(entry)]
                    progress.add(entry["size"], network=False)
                    continue
                os.unlink(final)  # corrupt or truncated: fetched again
            if job.get("reuse") and linked(job["reuse"], entry, final):
                st = os.stat(final)
                state[entry["path"]] = [st.st_size, st.st_mtime_ns, expected_hash(entry)]
                progress.add(entry["size"], network=False)
                continue
            todo.append(entry)
        write_json(state_path, state, fsync=True)
        if todo and job.get("peer"):
            wait_for_peer(run, job, progress, token)
        progress.state, progress.detail = "running", ""
        progress.write()
        state_lock = threading.Lock()

        def one(entry):
            digest = fetch_file(run, job, entry, dest, progress, token)
            st = os.stat(os.path.join(dest, entry["path"]))
            with state_lock:
                state[entry["path"]] = [st.st_size, st.st_mtime_ns, digest]
                write_json(state_path, state)

        todo.sort(key=lambda e: -e["size"])
        first = None
        with ThreadPoolExecutor(max(1, int(job.get("workers", 4)))) as pool:
            for done in as_completed([pool.submit(one, e) for e in todo]):
                try:
                    done.result()
                except Stopped:
                    pass
                except Exception as e:  # the others checkpoint and end; the first failure is the reason
                    run.stop.set()
                    first = first or e
        if first:
            raise first
        if run.stop.is_set():
            raise Stopped()
        missing = shard_problems(wanted)
        if missing:
            raise JobFailed("incomplete GGUF shard set: " + "; ".join(missing))
        for entry in files:
            if entry["path"].endswith(".gguf"):
                with open(os.path.join(dest, entry["path"]), "rb") as fh:
                    if fh.read(4) != b"GGUF":
                        raise JobFailed(f"{entry['path']}: not a GGUF file (no GGUF magic)")
        write_json(state_path, state, fsync=True)
        write_json(os.path.join(dest, run.marker), {
            "repo": job["repo"], "revision": job["revision"], "files": sorted(wanted), "bytes": total},
            fsync=True)
        progress.state, progress.detail = "complete", ""
        return 0
    except Stopped:
        progress.state = "stopped"
        progress.detail = f"stopped by {run.why[0] if run.why else 'a signal'}; parts checkpointed"
        return 0
    except Exception as e:
        progress.error, permanent = failure(e, dest, progress)
        progress.state, progress.detail = "failed", ""
        log(f"rigup-fetch {dest}: failed: {progress.error}")
        return PERMANENT if permanent else 1
    finally:
        progress.stop.set()
        progress.write()


# ------------------------------------------------------------------------------ share (fetch_from)

class ShareHandler(http.server.BaseHTTPRequestHandler):
    """Serves completed models (their marker's files only) with Range, for peers' jobs; the run's
    names are its server's (``self.server.run``, :class:`_Server`)."""

    protocol_version = "HTTP/1.1"
    config_path = ""
    unread: set = set()   # the model directories whose marker did not read, said once

    def log_message(self, fmt, *args):  # journal: one line per request
        sys.stderr.write(shown(f"{self.address_string()} {fmt % args}", 4000) + "\n")   # a peer's request line

    def _models(self):
        """(repo, revision) -> (dest, files) of each complete model; a marker that does not read
        (:func:`marker_of`), or names no repo, revision or files, is no model served (said once)."""
        config = read_json(self.config_path, {})
        out = {}
        name = self.server.run.marker
        for dest in config.get("dests", []):
            marker = marker_of(read_json(os.path.join(dest, name)))
            if marker is None or not {"repo", "revision", "files"} <= marker.keys():
                if os.path.exists(os.path.join(dest, name)) and dest not in self.unread:
                    self.unread.add(dest)
                    sys.stderr.write(shown(f"{dest}/{name} does not read as a marker: not served", 4000) + "\n")
                continue
            if not lock_held(dest):
                out[(marker["repo"], marker["revision"])] = (dest, set(marker["files"]))
        return out

    def _send(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        expected = self.server.run.read_token("share-token")
        given = self.headers.get("Authorization", "")
        if not expected or not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            return self._send(401, b"a peer of this fleet sends its share token\n")
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        models = self._models()
        m = re.match(r"^/rigup/complete/(.+)/([0-9a-f]{40})$", path)
        if m:
            return self._send(200 if (m.group(1), m.group(2)) in models else 404)
        m = re.match(r"^/(.+?/.+?)/resolve/([0-9a-f]{40})/(.+)$", path)
        if not m or (m.group(1), m.group(2)) not in models:
            return self._send(404, b"not here\n")
        dest, files = models[(m.group(1), m.group(2))]
        if m.group(3) not in files:
            return self._send(404, b"no such file\n")
        try:   # inside the model's directory, never through a link: as warm() and every reader here
            fh = os.fdopen(open_regular(safe_join(dest, m.group(3))), "rb")
        except (UnsafePath, OSError):
            return self._send(404, b"no such file\n")
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start = 0
            r = re.match(r"bytes=([0-9]+)-$", self.headers.get("Range", ""))
            if r:   # past 19 digits (int()'s limit is 4300) no file is that long: 416
                start = int(r.group(1)) if len(r.group(1)) <= 19 else size
                if start >= size:
                    return self._send(416, headers={"Content-Range": f"bytes */{size}"})
            self.send_response(206 if r else 200)
            if r:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if self.command == "HEAD":
                return
            os.sendfile(self.wfile.fileno(), fh.fileno(), start, size - start) if hasattr(os, "sendfile") \
                else shutil.copyfileobj(fh, self.wfile)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, run: Run):
        super().__init__(address, handler)
        self.run = run


def share(run: Run, config_path: str) -> int:
    config = read_json(config_path)
    run.named(config)
    ShareHandler.config_path = config_path
    server = _Server((config["bind"], int(config["port"])), ShareHandler, run)
    server.serve_forever()
    return 0


# ------------------------------------------------------------------------- revisions (as root)

RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: str, b: str) -> bool:
    """Swap paths ``a`` and ``b`` in one step (renameat2 RENAME_EXCHANGE); False where the C
    library or the filesystem cannot. By hand: Python's os module has no renameat2."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if call(at_fdcwd, a.encode(), at_fdcwd, b.encode(), RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), b)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def switch(spec_b64: str) -> int:
    """Point ``dest`` at ``stage`` (complete: the role checked) in one rename: a link replaced by
    a link; a directory exchanged with the link and kept as ``previous`` (its own revision's
    directory)."""
    spec = json.loads(base64.b64decode(spec_b64))
    dest, stage, previous = spec["dest"].rstrip("/"), spec["stage"], spec.get("previous")
    parent = os.path.dirname(dest)
    if os.path.dirname(stage) != parent or (previous and os.path.dirname(previous) != parent):
        raise SystemExit(f"rigup-fetch switch: {stage} and {previous} must be next to {dest}")
    new = dest + ".rigup-new"
    with _suppress(FileNotFoundError):
        os.unlink(new)
    os.symlink(os.path.basename(stage), new)
    if os.path.islink(dest) or not os.path.lexists(dest):
        os.rename(new, dest)
    elif not previous or os.path.lexists(previous):
        os.unlink(new)
        raise SystemExit(f"rigup-fetch switch: {dest} is a directory and its revision's place "
                         f"{previous} is taken (or unknown); move one of them away")
    elif exchange(new, dest):
        os.rename(new, previous)  # ``new`` is the old directory now
    else:  # no RENAME_EXCHANGE here: a moment without dest, while the instances still run the old files
        os.rename(dest, previous)
        os.rename(new, dest)
    fsync_dir(parent)
    print(shown(f"{dest} -> {os.path.basename(stage)}", 4000))
    return 0


def prune(spec_b64: str) -> int:
    """Remove the model's revision directories beyond the ``keep`` newest (``revisions``)."""
    spec = json.loads(base64.b64decode(spec_b64))
    for old in as_owner(spec["dest"], revisions, spec)[int(spec.get("keep", 0)):]:
        shutil.rmtree(old)    # never follows a link inside (rmtree.avoids_symlink_attacks)
        print(shown(f"removed {old}", 4000))
    return 0


# -------------------------------------------------------------------- metrics (the node exporter's)

# A job's states (progress.json's, and: absent before any job; dead when progress says a job runs
# but none holds the lock: a kill -9 that no unit restarted).
FETCH_STATES = ("absent", "verifying", "waiting", "running", "complete", "stopped", "failed", "dead", "unreadable")


def fetch_state(dest: str, marker_name: str) -> dict:
    """One model's download as the metrics say it: state, bytes, total, updated, error. A marker or
    progress.json that does not read (:func:`marker_of`, :func:`progress_of`) is ``unreadable``."""
    found = read_json(os.path.join(dest, marker_name))
    marker = marker_of(found)
    if marker is not None:
        return {"state": "complete", "bytes": marker.get("bytes", 0), "total": marker.get("bytes", 0)}
    progress = progress_of(read_json(os.path.join(dest, WORK, "progress.json"), {}))
    if progress is None or found is not None:
        return {"state": "unreadable"}
    state = progress.get("state") if progress.get("state") in FETCH_STATES else "absent"
    if state in ("verifying", "waiting", "running") and not lock_held(dest):
        state = "dead"
    return {"state": state, "bytes": progress.get("bytes", 0), "total": progress.get("total", 0),
            "updated": progress.get("updated"), "error": progress.get("error")}


def label(value) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the copy of
    rigup/boundary/formats.py's prom_label this program carries: it ships alone; a unit test holds the two equal)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(models: dict[str, dict], now: float) -> str:
    """rigup_model_fetch_* in the text format: per model the state (one series per state, 1 for
    the current one), bytes done and total, when progress was last written, the error of a failed
    job (an info series); when this ran."""
    head = [("state", "The model's download state (1: the current one)"),
            ("bytes", "Bytes of the model on disk and verified or in parts"), ("total_bytes", "Bytes of the model"),
            ("updated_timestamp_seconds", "When the job last wrote its progress (epoch seconds)"),
            ("error_info", "Why the model's download failed (label error)")]
    rows = {m: [] for m, _ in head}
    for name, st in sorted(models.items()):
        m = f'model="{label(name)}"'
        rows["state"] += [f'rigup_model_fetch_state{{{m},state="{s}"}} {int(s == st["state"])}' for s in FETCH_STATES]
        rows["bytes"].append(f"rigup_model_fetch_bytes{{{m}}} {int(st.get('bytes') or 0)}")
        rows["total_bytes"].append(f"rigup_model_fetch_total_bytes{{{m}}} {int(st.get('total') or 0)}")
        if st.get("updated"):
            rows["updated_timestamp_seconds"].append(
                f"rigup_model_fetch_updated_timestamp_seconds{{{m}}} {round(float(st['updated']), 3)}")
        if st["state"] == "failed":
            rows["error_info"].append(f'rigup_model_fetch_error_info{{{m},error="{label(st.get("error") or "")}"}} 1')
    lines = []
    for metric, text in head:
        if rows[metric]:
            lines += [f"# HELP rigup_model_fetch_{metric} {text}", f"# TYPE rigup_model_fetch_{metric} gauge"]
            lines += rows[metric]
    lines += ["# HELP rigup_model_fetch_last_run_timestamp_seconds When the metrics were last written",
              "# TYPE rigup_model_fetch_last_run_timestamp_seconds gauge",
              f"rigup_model_fetch_last_run_timestamp_seconds {round(now, 3)}"]
    return "\n".join(lines) + "\n"


def metrics(run: Run, config_path: str) -> int:
    """Write every model's state to the metrics file, atomically (a dot-file the collector ignores,
    then a rename), when its directory exists (roles/metrics installs the node exporter)."""
    config = read_json(config_path)
    run.named(config)
    path = config["metrics_file"]
    if not os.path.isdir(os.path.dirname(path)):
        return 0
    states = {}
    for m in config["models"]:
        try:
            states[m["name"]] = as_owner(m["dest"], fetch_state, m["dest"], run.marker)
        except Exception as e:  # one model's directory must not silence the others'
            sys.stderr.write(shown(f"rigup-fetch metrics: {m['name']}: {type(e).__name__}: {e}", 4000) + "\n")
            states[m["name"]] = {"state": "unreadable"}
    replace(path, metrics_text(states, time.time()))
    return 0


VMTOUCH = "/usr/bin/vmtouch"


def warm(run: Run, config_path: str) -> int:
    """Each warm model's files (its marker's list, each checked inside its directory) read into the
    page cache by vmtouch (``-t``: only the pages not there are read; ``-m``: no size limit), as
    the models' owner (rigup-model-warm.service's User). A model not complete yet is skipped."""
    config = read_json(config_path)
    run.named(config)
    rc = 0
    for model in config["models"]:
        marker = read_json(os.path.join(model["dest"], run.marker))
        if marker is None:
            print(shown(f"rigup-fetch warm: {model['name']}: not complete yet, skipped"), flush=True)
            continue
        if marker_problem(marker):
            print(shown(f"rigup-fetch warm: {model['name']}: its marker does not read ({marker_problem(marker)}), "
                        "skipped", 4000), flush=True)
            rc = 1
            continue
        try:
            files = [safe_join(model["dest"], rel) for rel in marker.get("files", [])]
        except UnsafePath as e:
            print(shown(f"rigup-fetch warm: {model['name']}: {e}", 4000), flush=True)
            rc = 1
            continue
        start = time.monotonic()
        done = subprocess.run([VMTOUCH, "-q", "-t", "-m", "1048576G", "--", *files], capture_output=True, text=True)
        print(shown(f"rigup-fetch warm: {model['name']}: {len(files)} file(s) in the page cache in "
                    f"{time.monotonic() - start:.1f} s" if done.returncode == 0 else
                    f"rigup-fetch warm: {model['name']}: vmtouch exit {done.returncode}: {done.stderr.strip()[:300]}", 4000),
              flush=True)
        rc = rc or (done.returncode != 0)
    return rc


def main(argv: list[str]) -> int:
    run = Run()   # this run's names and stop, passed to what needs them
    if len(argv) == 2 and argv[0] == "probe":
        return probe(run, argv[1])
    if len(argv) == 2 and argv[0] == "fetch":
        return fetch(run, argv[1])
    if len(argv) == 2 and argv[0] == "share":
        return share(run, argv[1])
    if len(argv) == 2 and argv[0] in ("switch", "prune"):
        return {"switch": switch, "prune": prune}[argv[0]](argv[1])
    if len(argv) == 2 and argv[0] == "metrics":
        return metrics(run, argv[1])
    if len(argv) == 2 and argv[0] == "warm":
        return warm(run, argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
