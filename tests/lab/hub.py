"""The lab's model hub: a local Hugging Face-compatible endpoint that lab hosts (and
huggingface_hub / `hf download` on the controller) fetch models from, serving git repos the
tests make. Standard library only.

    python -m tests.lab.hub serve        # on the lab gateway, port 8090 (the lab bridge must be up)
                                         # and https on port 443 (the lab CA's certificate)

Repos live under ``STATE/hub/models/<org>/<repo>``: git work trees laid out as the hub keeps
them, with large files in git LFS (a pointer in git, the object under ``.git/lfs/objects``), so
the tree API gives an LFS file's sha256 and a small file's git blob id, as the real hub does.
It answers what rigup and huggingface_hub ask:

- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true`` (404 with ``X-Error-Code:
  RepoNotFound`` or ``RevisionNotFound``), ``POST /api/models/{repo}/paths-info/{rev}``,
  ``GET /api/models/{repo}[/revision/{rev}]`` (sha, siblings);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` with ``Range``, ``X-Repo-Commit``, ``ETag``,
  ``X-Linked-Etag`` and ``X-Linked-Size``;
- the lab's apt repository: ``GET /_apt/PATH`` (tests/lab/fabric_debs.py: the fabric manager's stand-ins);
- credentialed sources: ``GET /_auth/PATH``, a file of AUTH_DIR with AUTH's Basic credentials only;
- for tests: ``GET /_lab/bytes`` (resolve body bytes sent, by client address), ``GET
  /_lab/tokens`` (bearer tokens seen, by client), ``GET /_lab/requests`` (every request but the
  ``/_lab`` ones: client, method, path, whether it carried an ``Authorization`` header, whether
  it came over https), ``GET
  /_lab/other`` (the same of the other origin, below), ``POST /_lab/reset`` (counters, records
  and faults), ``POST /_lab/rate?bps=N`` (a per-stream rate limit, 0 = none: a WAN link);
- faults, for tests (cleared by reset): ``POST /_lab/cut?after=N&times=K&how=close|reset|stall``
  ends a file's response after N body bytes, for the next K responses longer than that (0:
  every one, so a client gets N bytes a connection): ``close`` shuts the connection (the client
  reads a short body), ``reset`` sends a TCP RST, ``stall`` sends nothing more for ``secs`` s
  (default 120) then closes;
- a hostile mode, per repo (cleared by reset): ``POST /_lab/hostile`` with ``{"repo": ...}`` and
  one switch per hostile answer (:data:`SWITCHES`): ``paths`` adds files at those paths
  (``../../x``, ``/etc/cron.d/x``, a name with a newline, ``config.json`` again or as
  ``CONFIG.JSON``: what git cannot hold) to the repo's tree listing, served if asked for;
  ``commit`` is the sha its model info answers for every revision (not 40 hex, a newline);
  ``ignore_range`` answers every file request 200 with the whole file, ``Range`` or not;
  ``trickle_bps`` sends a file's body a byte at a time at that rate, for as long as the client
  stays; ``gzip`` (``["listing"]``, ``["resolve"]`` or both) answers those with ``Content-Encoding:
  gzip`` and a gzip bomb (:func:`bomb`: about 1 MiB that inflates to 1 GiB of zeros) whatever the
  client asked for; ``next_page`` adds ``Link: <URL>; rel="next"`` to its listing (the other
  origin's URL, :func:`other_url`), as a hostile or broken mirror would.

The same hub answers over https on port HTTPS_PORT of its address (:func:`https_url`), with a
certificate of the lab's CA (tests/lab/tls.py), which the lab hosts trust and the controller's
clients are given (``SSL_CERT_FILE``): an https hub is given the token, so its path can be proven
(``/_lab/tokens``, and each request's ``auth`` and ``https``). 443, since the hosts' probe goes
through the lab's tinyproxy, which tunnels to ports 443 and 80 only.

The other origin: a second server in the same process, on port OTHER_PORT of the same address
(another origin: another port), that records every request it gets (client, method, path, the
``Authorization`` header's presence and its bearer token) and answers each with an empty
listing: what a client would give a token to if it followed a next page elsewhere.

Why not olah (PyPI), which the issue suggests: olah 0.5.4's local-mirror mode
(server_file_routes.file_get_common -> mirror/repos.py get_file) ignores ``Range`` and sends the
whole blob read into memory in 4 KiB chunks, so no client can resume from it, and its throughput
caps every figure measured against it.

From Python: ``hub.publish(repo_id, {path_in_repo: local_path})`` commits those files (the repo's
whole content at that commit) and returns the commit id; ``hub.serve()``, ``hub.stop()``,
``hub.url()``, ``hub.bytes_served(address=None)``, ``hub.tokens_seen(address)``, ``hub.reset()``,
``hub.rate(bps)``, ``hub.cut(after, times=1, how="close")``, ``hub.hostile(repo_id, paths, **switches)``,
``hub.requests()``, ``hub.https_url()``, ``hub.other_url()``, ``hub.other_requests()``.
``lab.down()`` stops the server (``lab.hub_pids()``).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.lab import lab, sources

ROOT = lab.STATE / "hub"
MODELS = ROOT / "models"
PORT = int(os.environ.get("RIGUP_LAB_HUB_PORT", "8090"))
OTHER_PORT = PORT + 2     # the other origin (8091 is the hosts' share port)
HTTPS_PORT = int(os.environ.get("RIGUP_LAB_HUB_HTTPS_PORT", "443"))
PID = lab.STATE / "hub.pid"
URL_FILE = lab.STATE / "hub.url"
LOG = ROOT / "access.log"
LFS_MIN = 1 << 20        # files this large go to LFS (the hub's own rule is about 10 MB or binary)
GIT_ENV = {"GIT_AUTHOR_NAME": "rigup lab", "GIT_AUTHOR_EMAIL": "lab@rigup.invalid",
           "GIT_COMMITTER_NAME": "rigup lab", "GIT_COMMITTER_EMAIL": "lab@rigup.invalid",
           "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z"}


def url(host: str | None = None) -> str:
    """The endpoint lab hosts use (HF_ENDPOINT / hf_endpoint): on the gateway, or where
    ``serve(bind)`` put it."""
    if host is None and URL_FILE.exists():
        return URL_FILE.read_text().strip()
    return f"http://{host or lab.GATEWAY}:{PORT}"


def https_url(host: str | None = None) -> str:
    """The hub's https origin (the lab CA's certificate for its address)."""
    address = urllib.parse.urlsplit(url(host)).hostname
    return f"https://{address}" + ("" if HTTPS_PORT == 443 else f":{HTTPS_PORT}")


def other_url(host: str | None = None) -> str:
    """The other origin: the hub's address, port OTHER_PORT."""
    parts = urllib.parse.urlsplit(url(host))
    return f"{parts.scheme}://{parts.hostname}:{OTHER_PORT}"


# ------------------------------------------------------------------------------ the mirror tree

def _git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                          env={**os.environ, **GIT_ENV})
    if proc.returncode:
        raise lab.LabError(f"git {' '.join(args)} in {repo}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode().strip()


def _sha256(path: Path) -> str:
    """sha256 of a file, remembered next to it in the cache (keyed by size and mtime)."""
    st = path.stat()
    memo = path.with_name(f".{path.name}.sha256")
    key = f"{st.st_size}:{st.st_mtime_ns}"
    if memo.exists() and memo.read_text().startswith(key + " "):
        return memo.read_text().split()[1]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    try:
        memo.write_text(f"{key} {h.hexdigest()}\n")
    except OSError:
        pass
    return h.hexdigest()


def publish(repo_id: str, files: dict[str, Path]) -> str:
    """Make ``files`` ({path in repo: local file}) the content of ``repo_id`` (``org/name``) in a
    new commit of the lab hub's mirror tree; return the commit id (a 40-hex revision to pin).
    Commits have a fixed author and date, so the same files give the same revision on every
    machine; publishing what the repo already holds adds no commit and returns the same id.
    Files of 1 MiB or more are stored as git LFS (hard-linked into ``.git/lfs/objects`` when on
    the same filesystem, else copied), so the hub lists their sha256 as the real hub does. The
    server need not be restarted: it reads the tree on each request."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+", repo_id):
        raise lab.LabError(f"repo id {repo_id!r}: expected org/name")
    repo = MODELS / repo_id
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    for old in _git(repo, "ls-files", "-z").split("\0"):
        if old:
            (repo / old).unlink(missing_ok=True)
    for rel, src in files.items():
        src = Path(src)
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        size = src.stat().st_size
        if size >= LFS_MIN:
            oid = _sha256(src)
            obj = repo / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid
            if not obj.exists():
                obj.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, obj)
                except OSError:
                    shutil.copyfile(src, obj)
            target.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n")
        else:
            shutil.copyfile(src, target)
    _git(repo, "add", "-A")
    has_head = subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", "HEAD"],
                              capture_output=True).returncode == 0
    if has_head and subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--quiet"]).returncode == 0:
        return _git(repo, "rev-parse", "HEAD")  # the same content: the same revision
    _git(repo, "commit", "-q", "-m", f"publish {len(files)} file(s)")
    return _git(repo, "rev-parse", "HEAD")


_LFS_RE = re.compile(rb"^version https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize (\d+)\n$")
_cache: dict[tuple[str, str], list[dict] | None] = {}
_cache_lock = threading.Lock()


def listing(repo_id: str, rev: str) -> tuple[str, list[dict]]:
    """(commit id, [{path, size, oid, lfs}]) of ``repo_id`` at ``rev``; LookupError(code)."""
    repo = MODELS / repo_id
    if not (repo / ".git").is_dir():
        raise LookupError("RepoNotFound")
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise LookupError("RevisionNotFound")
    sha = proc.stdout.strip()
    with _cache_lock:
        if (repo_id, sha) in _cache:
            return sha, _cache[(repo_id, sha)]
    out = []
    for line in _git(repo, "ls-tree", "-r", "-l", "-z", sha).split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        _, kind, oid, size = meta.split()
        entry = {"path": path, "size": int(size), "oid": oid, "lfs": None}
        if int(size) < 200:
            blob = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", oid], capture_output=True).stdout
            m = _LFS_RE.match(blob)
            if m:
                entry["lfs"] = {"oid": m.group(1).decode(), "size": int(m.group(2)), "pointerSize": int(size)}
                entry["size"] = int(m.group(2))
        out.append(entry)
    with _cache_lock:
        _cache[(repo_id, sha)] = out
    return sha, out


# ------------------------------------------------------------------------------ test repo files

CACHE = Path(os.environ.get("RIGUP_LAB_CACHE", "/var/cache/rigup-lab")) / "hub-files"
# The lab's credentialed sources (a private git server, an index that needs a login): files under
# AUTH_DIR at /_auth/..., answered only with these Basic credentials (tests/roles/test_vllm.py)
AUTH_DIR = ROOT / "auth"
AUTH = ("lab-deploy", "lab-secret-7f3a9c0e5b1d")


def random_file(name: str, size: int, seed: int = 5) -> Path:
    """A file of ``size`` pseudo-random bytes (the same for the same seed), made once and kept
    in the lab cache (for the resume tests: a file the hub cannot compress or guess)."""
    import random

    path = CACHE / name
    if path.exists() and path.stat().st_size == size:
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:{size}")
    tmp = path.with_name(f".{name}.tmp")
    with open(tmp, "wb") as fh:
        left = size
        while left:
            n = min(left, 8 << 20)
            fh.write(rng.randbytes(n))
            left -= n
    os.replace(tmp, path)
    return path


def _gguf_str(s: str) -> bytes:
    import struct

    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kv: dict, tensors: dict[str, bytes]) -> bytes:
    """A GGUF v3 file: ``kv`` (str, int as uint32/uint16 by name, or float) and F32 tensors
    (1-D, raw bytes), 32-byte aligned, as llama.cpp's gguf-py writes it."""
    import struct

    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kv))]
    for key, value in kv.items():
        out.append(_gguf_str(key))
        if isinstance(value, str):
            out += [struct.pack("<I", 8), _gguf_str(value)]
        elif key in ("split.no", "split.count"):
            out.append(struct.pack("<IH", 2, value))
        elif isinstance(value, int):
            out.append(struct.pack("<Ii", 5, value))
        else:
            out.append(struct.pack("<If", 6, value))
    offset = 0
    for name, data in tensors.items():
        out += [_gguf_str(name), struct.pack("<IQIQ", 1, len(data) // 4, 0, offset)]
        offset += (len(data) + 31) // 32 * 32
    head = b"".join(out)
    head += b"\0" * (-len(head) % 32)
    body = b"".join(d + b"\0" * (-len(d) % 32) for d in tensors.values())
    return head + body


def gguf_shards(name: str, count: int = 3, tensor_bytes: int = 2 << 20) -> dict[str, Path]:
    """A small model split into ``count`` GGUF shards (``NAME-0000k-of-0000N.gguf``), one F32
    tensor of ``tensor_bytes`` each, with llama.cpp's split keys; made once in the lab cache.
    Returns {file name: path}."""
    import random

    out = {}
    CACHE.mkdir(parents=True, exist_ok=True)
    for k in range(1, count + 1):
        fname = f"{name}-{k:05d}-of-{count:05d}.gguf"
        path = CACHE / fname
        rng = random.Random(f"{name}:{k}")
        kv = {"general.architecture": "llama", "general.name": name, "split.no": k - 1,
              "split.count": count, "split.tensors.count": count}
        if k == 1:   # the model's keys, in its first file as llama.cpp's gguf-split writes them: its layer
            kv["llama.block_count"] = count   # count, which llama.cpp's loader (and rigup's sizing) needs
        data = gguf_bytes(kv, {f"blk.{k - 1}.weight": rng.randbytes(tensor_bytes // 4 * 4)})
        if not path.exists() or path.read_bytes() != data:   # a cache of an older fixture made again
            lab.write(path, data)
        out[fname] = path
    return out


BOMB_BYTES = 1 << 30


def bomb() -> bytes:
    """A gzip stream of BOMB_BYTES zero bytes (about 1 MiB: deflate's best ratio is about 1032:1),
    made once (about 10 s) and kept in the lab cache."""
    import zlib

    path = CACHE / "bomb-1g.gz"
    if not path.exists():
        z = zlib.compressobj(9, zlib.DEFLATED, 31)   # 31: a gzip header and trailer
        block = bytes(1 << 20)
        lab.write(path, b"".join([*(z.compress(block) for _ in range(BOMB_BYTES >> 20)), z.flush()]))
    return path.read_bytes()


# ------------------------------------------------------------------------------------ the server

# The hostile mode's switches, one per hostile answer (POST /_lab/hostile): name -> its type.
SWITCHES = {"paths": list, "commit": str, "ignore_range": bool, "trickle_bps": int, "gzip": list,
            "next_page": str}
REQUESTS_KEPT = 10_000


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.bytes: dict[str, int] = {}
        self.tokens: dict[str, list[str]] = {}   # client -> bearer tokens it sent (the tests' own)
        self.requests: list[dict] = []           # {client, method, path, auth}: every API request
        self.other: list[dict] = []              # the same, with the token, of the other origin
        self.bps = 0
        self.clear_faults()

    def clear_faults(self) -> None:
        self.cut: dict = {}                      # {after, times (-1: every response), how, secs}
        self.hostile: dict[str, dict] = {}       # repo -> its hostile switches (SWITCHES)

    def switch(self, repo_id: str, name: str, default=None):
        with self.lock:
            return self.hostile.get(repo_id, {}).get(name, default)

    def record(self, where: list, handler, token: bool = False) -> None:
        auth = handler.headers.get("Authorization")
        seen = {"client": handler.client_address[0], "method": handler.command, "path": handler.path,
                "auth": auth is not None, "https": isinstance(handler.connection, ssl.SSLSocket)}
        if token:
            seen["token"] = auth[7:] if auth and auth.startswith("Bearer ") else auth
        with self.lock:
            where.append(seen)
            del where[:-REQUESTS_KEPT]

    def add(self, who: str, n: int) -> None:
        with self.lock:
            self.bytes[who] = self.bytes.get(who, 0) + n

    def take_cut(self, length: int) -> dict | None:
        """The cut for a response of ``length`` body bytes, if one is due (and count it)."""
        with self.lock:
            cut = self.cut
            if not cut or cut["times"] == 0 or length <= cut["after"]:
                return None
            if cut["times"] > 0:
                cut["times"] -= 1
            return dict(cut)


STATS = Stats()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rigup-lab-hub/1"

    def log_message(self, fmt, *args):
        with open(LOG, "a") as log:
            log.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {fmt % args}\n")

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authed(self, rel: str):
        """A file of AUTH_DIR (a git repository's dumb HTTP files, wheels), for a client that sends
        AUTH's Basic credentials, else 401 asking for them; a directory answers an HTML page of
        links (pip's --find-links)."""
        import base64

        given = self.headers.get("Authorization", "")
        if given != "Basic " + base64.b64encode(":".join(AUTH).encode()).decode():
            return self._send(401, b"credentials needed\n", {"WWW-Authenticate": 'Basic realm="rigup-lab"'}, "text/plain")
        return self._file(AUTH_DIR, rel, listing=True)

    def _file(self, base: Path, rel: str, listing: bool = False):
        """The file ``rel`` of ``base`` (never a path outside it), else 404; with ``listing`` a
        directory answers an HTML page of links (pip's --find-links)."""
        target = (base / rel).resolve()
        if not target.is_relative_to(base.resolve()) or not (target.is_file() or listing and target.is_dir()):
            return self._send(404, b"not found\n", ctype="text/plain")
        if target.is_dir():
            links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(target.iterdir()) if p.is_file())
            return self._send(200, f"<html><body>\n{links}</body></html>\n".encode(), ctype="text/html")
        return self._send(200, target.read_bytes(), ctype="application/octet-stream")

    def _json(self, value, status=200):
        self._send(status, json.dumps(value).encode())

    def _error(self, code: str, message: str, status=404):
        self._send(status, json.dumps({"error": message}).encode(), {"X-Error-Code": code})

    def do_POST(self):
        parts = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if parts.path == "/_lab/reset":
            with STATS.lock:
                STATS.bytes.clear()
                STATS.tokens.clear()
                STATS.requests.clear()
                STATS.other.clear()
                STATS.clear_faults()
            return self._json({})
        if parts.path == "/_lab/cut":
            q = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
            times = int(q.get("times", 1))
            with STATS.lock:
                STATS.cut = {"after": int(q["after"]), "times": -1 if times == 0 else times,
                             "how": q.get("how", "close"), "secs": float(q.get("secs", 120))}
            return self._json(STATS.cut)
        if parts.path == "/_lab/hostile":
            wanted = json.loads(body)
            repo_id = wanted.pop("repo")
            bad = [k for k, v in wanted.items() if k not in SWITCHES or not isinstance(v, SWITCHES[k])]
            if bad:
                return self._error("BadSwitch", f"unknown or mistyped switch(es) {bad}; known: {SWITCHES}", 400)
            with STATS.lock:
                STATS.hostile.setdefault(repo_id, {}).update(wanted)
            return self._json(STATS.hostile[repo_id])
        if parts.path == "/_lab/rate":
            STATS.bps = int(urllib.parse.parse_qs(parts.query).get("bps", ["0"])[0])
            return self._json({"bps": STATS.bps})
        STATS.record(STATS.requests, self)
        m = re.match(r"^/api/models/([^/]+/[^/]+)/paths-info/([^/]+)$", parts.path)
        if m:
            form = urllib.parse.parse_qs(body.decode())
            if not form and body.startswith(b"{"):
                form = json.loads(body)
            wanted = form.get("paths", [])
            try:
                _, files = listing(m.group(1), urllib.parse.unquote(m.group(2)))
            except LookupError as e:
                return self._error(str(e), f"{e}: {m.group(1)}@{m.group(2)}")
            return self._json([self._item(f) for f in files if f["path"] in wanted])
        self._error("EntryNotFound", "no such route")

    @staticmethod
    def _files(repo_id: str, rev: str) -> list[dict]:
        """The repo's files at ``rev`` (LookupError), with the hostile paths set for it."""
        _, files = listing(repo_id, rev)
        extra = STATS.switch(repo_id, "paths", [])
        data = b"hostile\n"
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return files + [{"path": p, "size": len(data), "oid": oid, "lfs": None, "data": data} for p in extra]

    @staticmethod
    def _item(f: dict) -> dict:
        item = {"type": "file", "oid": f["oid"], "size": f["size"], "path": f["path"]}
        if f["lfs"]:
            item["lfs"] = f["lfs"]
        return item

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        parts = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parts.path)
        query = urllib.parse.parse_qs(parts.query)
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            with STATS.lock:
                seen = STATS.tokens.setdefault(self.client_address[0], [])
                if auth[7:] not in seen:
                    seen.append(auth[7:])
        if path == "/_lab/bytes":
            with STATS.lock:
                return self._json(dict(STATS.bytes))
        if path == "/_lab/tokens":
            with STATS.lock:
                return self._json(dict(STATS.tokens))
        if path in ("/_lab/requests", "/_lab/other"):
            with STATS.lock:
                return self._json(list(STATS.requests if path == "/_lab/requests" else STATS.other))
        STATS.record(STATS.requests, self)
        if path.startswith("/_auth/"):
            return self._authed(path.removeprefix("/_auth/"))
        if path.startswith("/_apt/"):   # the lab's apt repository (tests/lab/fabric_debs.py)
            return self._file(ROOT / "apt", path.removeprefix("/_apt/"))
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            try:
                files = self._files(m.group(1), m.group(2))
            except LookupError as e:
                return self._error(str(e), f"{e}: {m.group(1)}@{m.group(2)}")
            prefix = (m.group(3) or "").strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            items, dirs = [], set()
            for f in files:
                if prefix and not f["path"].startswith(prefix + "/"):
                    continue
                rest = f["path"][len(prefix) + 1:] if prefix else f["path"]
                parents = rest.split("/")[:-1]
                for i in range(len(parents)):
                    d = "/".join(filter(None, [prefix, *parents[: i + 1]]))
                    if (recursive or i == 0) and d not in dirs:
                        dirs.add(d)
                        items.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
                if recursive or not parents:
                    items.append(self._item(f))
            repo_id = m.group(1)
            nxt = STATS.switch(repo_id, "next_page")
            link = {"Link": f'<{nxt}>; rel="next"'} if nxt else {}
            if "listing" in STATS.switch(repo_id, "gzip", []):
                return self._bomb(link)
            return self._send(200, json.dumps(items).encode(), link)
        m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$", path)
        if m:
            try:
                sha, files = listing(m.group(1), m.group(2) or "main")
            except LookupError as e:
                return self._error(str(e), f"{e}: {m.group(1)}", 401 if str(e) == "RepoNotFound" else 404)
            sha = STATS.switch(m.group(1), "commit", sha)
            return self._json({"id": m.group(1), "modelId": m.group(1), "sha": sha, "private": False,
                               "gated": False, "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                               "siblings": [{"rfilename": f["path"]} for f in files]})
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(*m.groups())
        self._error("EntryNotFound", "no such route")

    def _resolve(self, repo_id: str, rev: str, file: str):
        try:
            sha, _ = listing(repo_id, rev)
            files = self._files(repo_id, rev)
        except LookupError as e:
            return self._error(str(e), f"{e}: {repo_id}@{rev}")
        entry = next((f for f in files if f["path"] == file), None)
        if entry is None:
            return self._error("EntryNotFound", f"{file} is not in {repo_id}@{rev}")
        if "data" in entry:  # a hostile path: served, and counted, if a client asks for it
            STATS.add(self.client_address[0], len(entry["data"]))
            return self._send(200, entry["data"], ctype="application/octet-stream")
        if "resolve" in STATS.switch(repo_id, "gzip", []):
            return self._bomb({"X-Repo-Commit": sha})
        repo = MODELS / repo_id
        size = entry["size"]
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if entry["lfs"]:
            oid = entry["lfs"]["oid"]
            headers.update({"ETag": f'"{oid}"', "X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(size)})
            source = repo / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid
        else:
            headers["ETag"] = f'"{entry["oid"]}"'
            source = None
        start = 0
        r = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if STATS.switch(repo_id, "ignore_range"):
            r = None   # hostile: the whole file, 200, whatever was asked
        end = size - 1
        if r:
            start = int(r.group(1))
            end = min(int(r.group(2)), size - 1) if r.group(2) else size - 1
            if start >= size:
                return self._send(416, headers={**headers, "Content-Range": f"bytes */{size}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(206 if r else 200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        if source is not None:
            fh = open(source, "rb")
        else:
            fh = subprocess.Popen(["git", "-C", str(repo), "cat-file", "blob", entry["oid"]],
                                  stdout=subprocess.PIPE).stdout
            fh.read(start)
        who = self.client_address[0]
        t0, sent, left = time.monotonic(), 0, end - start + 1
        cut = STATS.take_cut(left)
        trickle = STATS.switch(repo_id, "trickle_bps", 0)
        try:
            if trickle:
                return self._trickle(fh, left, trickle)
            if source is not None:
                fh.seek(start)
            while left > 0:
                if cut and sent >= cut["after"]:
                    return self._cut(cut)
                block = fh.read(min(1 << 20, left, cut["after"] - sent if cut else left))
                if not block:
                    break
                self._counted(who, block)
                sent += len(block)
                left -= len(block)
                if STATS.bps:
                    ahead = sent / STATS.bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            fh.close()

    def _counted(self, who: str, block: bytes) -> None:
        """Send ``block``, counting each part the kernel took as it is taken: a client gone
        mid-block has still been sent (and kept, in its socket) what went before, so counting
        only whole blocks undercounted what a rebooted host had received."""
        view = memoryview(block)
        while view:
            n = self.connection.send(view)
            STATS.add(who, n)
            view = view[n:]

    def _trickle(self, fh, left: int, bps: int) -> None:
        """Send ``left`` bytes of ``fh`` a byte at a time, ``bps`` bytes a second (hostile: a
        stream that never stops, never ends), until the client goes."""
        self.close_connection = True
        while left > 0:
            self.wfile.write(fh.read(1))
            self.wfile.flush()
            STATS.add(self.client_address[0], 1)
            left -= 1
            time.sleep(1 / bps)

    def _bomb(self, headers: dict) -> None:
        """200 with ``Content-Encoding: gzip`` and the gzip bomb as body, whatever was asked (no
        Range, no identity): hostile."""
        body = bomb()
        if self.command != "HEAD":
            STATS.add(self.client_address[0], len(body))
        self._send(200, body, {**headers, "Content-Encoding": "gzip"})

    def _cut(self, cut: dict) -> None:
        """End this response early as ``cut["how"]`` says (a fault for the tests)."""
        self.close_connection = True
        sock = self.connection
        if cut["how"] == "stall":
            time.sleep(cut["secs"])
        elif cut["how"] == "reset":  # close with a zero linger: the client gets a RST
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class OtherHandler(Handler):
    """The other origin: records every request (with its token) and answers an empty listing."""

    server_version = "rigup-lab-other/1"

    def do_GET(self):
        STATS.record(STATS.other, self, token=True)
        self._send(200, b"[]")

    do_HEAD = do_POST = do_GET


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main_serve(bind: str, port: int, https_port: int) -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    other = Server((bind, port + OTHER_PORT - PORT), OtherHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    if https_port:
        from tests.lab import tls

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls.server_cert(bind))
        secure = Server((bind, https_port), Handler)
        # the handshake in the request's thread (on its first read), not in the one that accepts
        secure.socket = context.wrap_socket(secure.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=secure.serve_forever, daemon=True).start()
    Server((bind, port), Handler).serve_forever()


# ------------------------------------------------------------------------ process management

def serve(bind: str | None = None) -> str:
    """Start the hub on the lab gateway (or ``bind``), unless it runs; return its URL."""
    from tests.lab import tls

    MODELS.mkdir(parents=True, exist_ok=True)
    if not sources.pid_alive(PID):
        tls.server_cert(str(bind or lab.GATEWAY))   # made here, where a failure is seen
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lab.hub", "serve", "--bind", str(bind or lab.GATEWAY),
             "--port", str(PORT), "--https-port", str(HTTPS_PORT), "--root", str(ROOT)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.DEVNULL, stderr=open(ROOT / "server.log", "a"), stdin=subprocess.DEVNULL,
            start_new_session=True)
        PID.write_text(str(proc.pid))
        URL_FILE.write_text(url(str(bind or lab.GATEWAY)) + "\n")
        for _ in range(100):
            try:
                _OPENER.open(f"{url(bind)}/_lab/bytes", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise lab.LabError(f"the lab hub did not answer on {url(bind)}: {(ROOT / 'server.log').read_text()[-2000:]}")
    return url(bind)


def stop() -> None:
    """Stop the hub, if it runs."""
    sources.stop_pid(PID)
    URL_FILE.unlink(missing_ok=True)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the gateway is local


def _call(path: str, method: str = "GET", host: str | None = None):
    req = urllib.request.Request(f"{url(host)}{path}", method=method, data=b"" if method == "POST" else None)
    with _OPENER.open(req, timeout=10) as resp:
        return json.loads(resp.read())


def bytes_served(address: str | None = None, host: str | None = None) -> int:
    """File bytes the hub sent (to ``address``, or to everyone) since the last ``reset()``."""
    counts = _call("/_lab/bytes", host=host)
    return counts.get(address, 0) if address else sum(counts.values())


def tokens_seen(address: str, host: str | None = None) -> list[str]:
    """Bearer tokens ``address`` sent since the last ``reset()`` (tests of token handling)."""
    return _call("/_lab/tokens", host=host).get(address, [])


def reset(host: str | None = None) -> None:
    _call("/_lab/reset", "POST", host)


def rate(bps: int, host: str | None = None) -> None:
    """Limit each download stream to ``bps`` bytes/s (0: no limit)."""
    _call(f"/_lab/rate?bps={int(bps)}", "POST", host)


def cut(after: int, times: int = 1, how: str = "close", secs: float = 120, host: str | None = None) -> None:
    """End the next ``times`` file responses (0: every one) after ``after`` body bytes: ``close``
    (a short body), ``reset`` (TCP RST) or ``stall`` (silence for ``secs`` s). ``reset()`` ends it."""
    query = urllib.parse.urlencode({"after": int(after), "times": int(times), "how": how, "secs": secs})
    _call(f"/_lab/cut?{query}", "POST", host)


def hostile(repo_id: str, paths: list[str] | None = None, host: str | None = None, **switches) -> dict:
    """Make the hub answer for ``repo_id`` as a hostile mirror would, one switch per answer (see
    the module docstring, SWITCHES): ``paths`` (e.g. ``../../x``) listed in its tree too, and
    ``commit``, ``ignore_range``, ``trickle_bps``, ``gzip``, ``next_page``; ``reset()`` ends it.
    Returns the repo's switches now."""
    if paths is not None:
        switches["paths"] = paths
    req = urllib.request.Request(f"{url(host)}/_lab/hostile", method="POST",
                                 data=json.dumps({"repo": repo_id, **switches}).encode())
    with _OPENER.open(req, timeout=10) as resp:
        return json.loads(resp.read())


def requests(host: str | None = None) -> list[dict]:
    """Every request the hub got since the last ``reset()`` (but the tests' own ``/_lab`` ones):
    [{client, method, path, auth}], ``auth`` whether it carried an Authorization header."""
    return _call("/_lab/requests", host=host)


def other_requests(host: str | None = None) -> list[dict]:
    """Every request the other origin got since the last ``reset()``: [{client, method, path,
    auth, token}]."""
    return _call("/_lab/other", host=host)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.lab.hub")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--bind", default=str(lab.GATEWAY))
    p.add_argument("--port", type=int, default=PORT)
    p.add_argument("--https-port", type=int, default=HTTPS_PORT)   # 0: none
    p.add_argument("--root", default=str(ROOT))  # names the lab in the process list (lab.hub_pids)
    args = parser.parse_args()
    main_serve(args.bind, args.port, args.https_port)
