"""A hostile or broken hub (review: "Trust nothing from outside"): every answer is data, checked
before use, refused naming the hub, the repo and the value; the controller's hub client is
bounded (timeouts, the token kept to the hub's origin, a capped header read without
decompression); the GGUF header reader refuses bad bytes with GGUFRefused, never another error."""

import http.server
import json
import random
import struct
import threading
import time
from pathlib import Path

import pytest

from rigup.models import first_gguf, hub_endpoint, hub_key, models
from roles.model_fetch.shipped import fetcher
from roles.model_fetch import hub as hub_module
from tests.runs import own_run
from rigup.boundary.core import Unreadable
from rigup.boundary.hosttext import gguf_figures
from shipped.gguf import GGUFRefused, kv_figures, metadata
from roles.model_fetch.plan import plan_model
from tests.unit.hosts import answered

SMOKE = Path(__file__).parents[2] / "roles/llama_cpp/smoke.gguf"
REV = "a" * 40
GOOD = {"path": "m.gguf", "size": 10, "oid": "1" * 40, "sha256": "b" * 64}


@pytest.fixture(autouse=True)
def no_hub_facts():
    """Each test its own run (tests/runs.py): no answer of the hub kept from another."""
    with own_run():
        yield


# ------------------------------------------------------------------ the commit a hub answers

@pytest.mark.parametrize("sha", ["0123456789abcdef0123456789abcdef01234567\nExecStartPre=+/bin/sh -c id",
                                 "/../../..", "A" * 40, "a" * 39, "a" * 41, None, 7, ""])
def test_a_commit_that_is_not_40_hex_is_refused_naming_the_hub(sha):
    with pytest.raises(hub_module.HubRefused) as e:
        hub_module.checked_commit("http://hub.test", "org/x", "main", sha)
    assert "http://hub.test" in str(e.value) and "org/x@main" in str(e.value) and repr(sha) in str(e.value)
    assert hub_module.checked_commit("http://hub.test", "org/x", "main", "0" * 40) == "0" * 40


def test_resolve_refuses_a_hostile_commit_and_models_never_use_it(monkeypatch):
    class Api:
        def model_info(self, repo, revision, timeout):
            assert timeout == hub_module.TIMEOUT_S
            return type("Info", (), {"sha": "0" * 40 + "\nExecStartPre=+/bin/touch /pwn"})()

    monkeypatch.setattr(hub_module, "_api", lambda endpoint, secret: Api())
    d = {"hf_endpoint": "http://hub.test", "models_allow_unpinned": True, "model_fetch_hf_token_src": None,
         "models": {"x": {"repo": "org/x", "revision": "main", "size_gib": 1.0, "family": None}}}
    monkeypatch.setenv("HF_TOKEN", "t")
    d = answered(d, resolve=hub_module.resolve)
    lines = hub_module.lines(d)
    assert any("not 40 lowercase hex" in line and "http://hub.test" in line for line in lines), lines
    valid, problems = models(d)
    assert "x" not in valid and problems and problems[0][0] == "models.x.revision"


def test_models_refuse_a_recorded_commit_that_is_not_hex():
    d = {"hf_endpoint": "http://hub.test", "models_allow_unpinned": True,
         "models": {"x": {"repo": "org/x", "revision": "main"}}}
    entry = {"repo": "org/x", "revision": "main", "include": []}
    valid, problems = models(answered(d, {hub_key(hub_endpoint(d), entry): {"commit": "/../../.."}}))
    assert not valid and "the hub at http://hub.test answered '/../../..'" in problems[0][1]


# ------------------------------------------------------------------ the listing a hub answers

@pytest.mark.parametrize("listing, why", [
    ([GOOD, dict(GOOD)], "listed twice"),
    ([GOOD, dict(GOOD, path="M.GGUF")], "case-insensitively"),
    ([dict(GOOD, path="\u00e9.gguf"), dict(GOOD, path="e\u0301.gguf")], "in Unicode's compatibility form"),   # NFC, NFD
    ([dict(GOOD, path="\u00c9.gguf"), dict(GOOD, path="e\u0301.gguf")], "in Unicode's compatibility form"),
    ([dict(GOOD, path="a.gguf"), dict(GOOD, path="\uff41.gguf")], "in Unicode's compatibility form"),   # fullwidth
    ([dict(GOOD, path="a.gguf"), dict(GOOD, path="a\ufe0f.gguf")], "U+FE0F (VARIATION SELECTOR-16)"),   # round 4
    ([dict(GOOD, path="a.gguf"), dict(GOOD, path="a\u034f.gguf")], "U+034F (COMBINING GRAPHEME JOINER)"),
    ([dict(GOOD, path="a.gguf"), dict(GOOD, path="a\u3164.gguf")], "U+3164 (HANGUL FILLER)"),
    ([dict(GOOD, path="a\U000e0100.gguf")], "U+E0100 (VARIATION SELECTOR-17)"),
    ([GOOD, dict(GOOD, path="m.gguf/x")], "as a file and a directory"),
    ([dict(GOOD, size=-1)], "not a non-negative integer"),
    ([dict(GOOD, size="10")], "not a non-negative integer"),
    ([dict(GOOD, size=True)], "not a non-negative integer"),
    ([dict(GOOD, sha256=None, oid=None)], "no hash"),
    ([dict(GOOD, sha256="zz")], "not 64 lowercase hex"),
    ([dict(GOOD, oid="x\ny")], "not 40 lowercase hex"),
    ([dict(GOOD, path="a\nExecStartPre=+/bin/sh.gguf")], "control character"),
    ([dict(GOOD, path="/etc/x")], "absolute"),
    ([dict(GOOD, path="a/../../x")], "'..'"),
    ([dict(GOOD, path="a\\b")], "backslash"),
    ([dict(GOOD, path=None)], "empty path"),
    (["m.gguf"], "not an object"),
    ([GOOD, dict(GOOD, path=".cache/huggingface/download/m.gguf.metadata")], "huggingface_hub's own directory"),
    ([dict(GOOD, path="org\u2215m.gguf")], "U+2215 (DIVISION SLASH)"),
    ([dict(GOOD, path="org\uff0fm.gguf")], "U+FF0F (FULLWIDTH SOLIDUS)"),
    ([dict(GOOD, path="m\u202efuulg.exe")], "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ([GOOD, dict(GOOD, path="\u200bm.gguf")], "U+200B (ZERO WIDTH SPACE)"),
    ([GOOD, dict(GOOD, path="m.gguf ")], "starts or ends with a space"),
    ([dict(GOOD, path=f"f{i}") for i in range(fetcher.MAX_FILES + 1)], "more than 10000"),
])
def test_a_hostile_listing_is_refused_naming_the_value(listing, why):
    found = fetcher.listing_problems(listing)
    print(f"listing {[f.get('path') if isinstance(f, dict) else f for f in listing[:2]]!a}: refused, {why!r} in {found[:1]!a}")
    assert found and any(why in w for _, w in found), found
    with pytest.raises(hub_module.HubRefused, match="the hub at http://hub.test lists in org/x@aaaaaaaaaaaa"):
        hub_module.checked_files(listing, "http://hub.test", "org/x", REV, False)


def test_unhashed_files_only_with_allow_unhashed():
    bare = [dict(GOOD, sha256=None, oid=None)]
    assert fetcher.listing_problems(bare, allow_unhashed=True) == []
    entry = {"repo": "org/m", "revision": REV, "include": [], "dest": "/srv/models/m"}
    kw = dict(endpoint="http://hub", source="http://hub", peer=None, workers=4, peer_wait=60)
    refused = plan_model("m", entry, {"hub_files": bare, "free_bytes": 100}, **kw)
    assert refused.action == "refused" and "no hash" in refused.problems[0][1]
    assert "http://hub" in refused.problems[0][1]
    ok = plan_model("m", dict(entry, allow_unhashed=True), {"hub_files": bare, "free_bytes": 100}, **kw)
    assert ok.action == "start" and ok.job["allow_unhashed"] is True


def test_the_plan_refuses_duplicates_and_a_negative_size():
    entry = {"repo": "org/m", "revision": REV, "include": [], "dest": "/srv/models/m"}
    kw = dict(endpoint="http://hub", source="http://hub", peer=None, workers=4, peer_wait=60)
    for listing in ([GOOD, dict(GOOD, size=99)], [dict(GOOD, size=-(1 << 40))]):
        p = plan_model("m", entry, {"hub_files": listing, "free_bytes": 100}, **kw)
        assert p.action == "refused" and p.job is None


def test_a_listed_name_cannot_collide_with_a_checkpoint():
    """``a.gguf`` next to ``a.gguf.ckpt``: parts and checkpoints live in directories of their own."""
    listing = [GOOD, dict(GOOD, path="m.gguf.ckpt")]
    assert fetcher.listing_problems(listing) == []


def test_the_fetch_job_refuses_an_unhashed_file(tmp_path):
    job = {"dest": str(tmp_path), "source": "http://127.0.0.1:9", "repo": "org/m", "revision": REV}
    with pytest.raises(fetcher.JobFailed, match="no hash"):
        fetcher.fetch_file(fetcher.Run(), job, dict(GOOD, sha256=None, oid=None), str(tmp_path), None, None)


def test_a_marker_name_with_a_newline_never_reaches_a_unit():
    assert first_gguf(["a\nExecStartPre=+/bin/sh.gguf", "../x.gguf", "/x.gguf", "b.gguf"]) == "b.gguf"
    assert first_gguf(["a\nb.gguf"]) is None


# ------------------------------------------------------------------ the controller's client

class _Pages(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps([{"type": "file", "path": "a.bin", "size": 1, "oid": "1" * 40}]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Link", '<http://other.test:1/api/next?cursor=1>; rel="next"')
        self.end_headers()
        self.wfile.write(body)


def test_the_token_never_follows_a_next_page_to_another_origin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(hub_module.HubRefused, match="another host: http://other.test:1/api/next"):
            hub_module._files(endpoint, "org/x", REV, "secret")
    finally:
        server.shutdown()
    assert [auth for _, auth in _Pages.seen] == ["Bearer secret"]   # the hub's page only


def test_a_compressed_listing_refuses_the_model_before_any_byte(monkeypatch):
    """org/bomb's listing comes with Content-Encoding: gzip (_Files, below)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(hub_module, "_kept", lambda key: None)
    try:
        with pytest.raises(fetcher.HubError, match="with Content-Encoding 'gzip'; rigup asks for identity") as e:
            fetcher.hub_files(endpoint, "org/bomb", REV, None)     # the host's probe: the plan refuses it
        assert e.value.code in fetcher.HOSTILE_CODES
        d = {"hf_endpoint": endpoint, "models": {"x": {"repo": "org/bomb", "revision": REV, "family": "glm-5.3-flash"}}}
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hub_module, "token", lambda data: None)
        d = answered(d, resolve=hub_module.resolve)
        lines = hub_module.lines(d)
    finally:
        server.shutdown()
    assert any("Content-Encoding 'gzip'" in line for line in lines), lines
    valid, problems = models(d)
    assert "x" not in valid and problems[0][0] == "models.x.repo", problems
    assert f"{endpoint} answered its listing of org/bomb with Content-Encoding 'gzip'" in problems[0][1] and "refused before any byte" in problems[0][1]


class _Resp:
    def __init__(self, chunks, encoding=None):
        self.chunks, self.url = chunks, "http://hub.test/org/x/resolve/a/m.gguf"
        self.headers = {"Content-Encoding": encoding} if encoding else {}

    def iter_raw(self):
        yield from self.chunks


def test_the_header_read_is_capped_and_never_decompressed():
    with pytest.raises(hub_module.HubRefused, match="Content-Encoding 'gzip'"):
        hub_module.read_capped(_Resp([b"x"], "gzip"), 10)
    endless = (b"x" * 4096 for _ in iter(int, 1))   # a server that never stops
    assert len(hub_module.read_capped(_Resp(endless), 10_000)) == 10_000
    assert hub_module.read_capped(_Resp([b"ab", b"cd"], "identity"), 3) == b"abc"


# ------------------------------------------------------------------ the GGUF header reader

def _read(buf: bytes) -> None:
    try:
        kv_figures(metadata(buf, lambda k: not k.startswith("tokenizer."), partial=True))
    except GGUFRefused:
        pass
    try:
        metadata(buf)
    except GGUFRefused:
        pass


def test_the_smoke_gguf_reads():
    figures = kv_figures(metadata(SMOKE.read_bytes(), lambda k: not k.startswith("tokenizer."), partial=True))
    assert figures["architecture"]


def test_gguf_fuzz_only_refusals_come_out():
    """1,500 mutations of a real GGUF header (roles/llama_cpp/smoke.gguf): byte flips, cuts, absurd
    counts and lengths, nested arrays; nothing but GGUFRefused (or an answer) may come out."""
    head = SMOKE.read_bytes()[:64 << 10]
    rng = random.Random(20261201)
    huge = [struct.pack("<Q", v) for v in (2 ** 64 - 1, 2 ** 63, 2 ** 32, 10 ** 12)]
    for i in range(1500):
        buf = bytearray(head)
        kind = i % 5
        if kind == 0:
            for _ in range(rng.randint(1, 20)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif kind == 1:
            buf = buf[:rng.randrange(len(buf))]
        elif kind == 2:
            at = rng.randrange(4, 2048)
            buf[at:at + 8] = rng.choice(huge)
        elif kind == 3:   # an array of arrays of arrays..., or an unknown type, at a random place
            at = rng.randrange(24, 1024)
            buf[at:at + 4] = struct.pack("<I", rng.choice([9, 13, 99, 2 ** 32 - 1]))
            buf[at + 4:at + 16] = struct.pack("<IQ", 9, rng.randrange(2 ** 64))
        else:
            at = rng.randrange(4, 1024)
            buf[at:at + 4] = struct.pack("<I", rng.randrange(2 ** 32))
        _read(bytes(buf))


def test_absurd_values_are_refused():
    def gguf(kvs: bytes, count: int) -> bytes:
        return b"GGUF" + struct.pack("<IQQ", 3, 0, count) + kvs

    def key(k: str) -> bytes:
        return struct.pack("<Q", len(k)) + k.encode()

    nested = key("a") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 50
    with pytest.raises(GGUFRefused, match="nested"):
        metadata(gguf(nested, 1))
    with pytest.raises(GGUFRefused):
        metadata(gguf(key("a") + struct.pack("<IIQ", 9, 4, 2 ** 64 - 1), 1))
    # absurd but legal lengths: a key of 2^20 bytes is refused; a value or an array longer than the
    # bytes read ends the read there (the keys before it kept), named with the bytes it would need
    with pytest.raises(GGUFRefused, match=r"^a key of 1048576 bytes at byte 24 \(GGUF keys have at most 65535\)"):
        metadata(gguf(struct.pack("<Q", 2 ** 20) + b"k" * 100, 1))
    arch = key("general.architecture") + struct.pack("<IQ", 8, 5) + b"llama"
    for absurd in (struct.pack("<IQ", 8, 2 ** 40), struct.pack("<IIQ", 9, 0, 2 ** 40), struct.pack("<IIQ", 9, 8, 2 ** 60)):
        body = gguf(arch + key("llama.x") + absurd + b"x" * 10, 3)
        assert metadata(body, partial=True) == {"general.architecture": "llama"}
        with pytest.raises(GGUFRefused, match=r"^the header needs \d{13,} bytes here, \d+ were read$"):
            metadata(body)
    meta = {"general.architecture": "llama", "llama.block_count": 2 ** 63, "llama.attention.head_count": 1}
    with pytest.raises(GGUFRefused, match="block_count"):
        kv_figures(meta)
    with pytest.raises(GGUFRefused):
        kv_figures({"general.architecture": "llama", "llama.block_count": 2, "llama.attention.head_count": 1,
                    "llama.embedding_length": float("inf")})


class _Files(http.server.BaseHTTPRequestHandler):
    """A hub's resolve endpoint that ignores Range: smoke.gguf whole, or (any path with "bomb":
    a file, a listing) a gzip "bomb"."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        gzip = "bomb" in self.path
        body = b"\x1f\x8b" + b"\0" * 1000 if gzip else SMOKE.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if gzip:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)


def _header_hub(handler, monkeypatch) -> tuple:
    """A hub answering with ``handler`` on loopback, (server, endpoint); nothing kept between runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(hub_module, "HEAD_BYTES", (4096, 1 << 20))
    monkeypatch.setattr(hub_module, "_kept", lambda key: None)
    return server, endpoint


def test_the_header_request_reads_capped_identity_bytes(monkeypatch):
    server, endpoint = _header_hub(_Files, monkeypatch)
    try:
        figures = hub_module._head(endpoint, "org/x", REV, "m.gguf", None, SMOKE.stat().st_size)
        assert figures["architecture"] == "llama" and figures["read_bytes"] <= 1 << 20
        with pytest.raises(hub_module.HubRefused, match="Content-Encoding 'gzip'"):
            hub_module._head(endpoint, "org/x", REV, "bomb.gguf", None, 1 << 30)
    finally:
        server.shutdown()


class _Slow(http.server.BaseHTTPRequestHandler):
    """A hub that answers its listing a byte at a time, never done."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass


def test_a_listing_that_never_ends_is_given_up(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(fetcher, "LISTING_S", 1)
    try:
        with pytest.raises(fetcher.HubError, match="took over 1 s"):
            fetcher.hub_files(f"http://127.0.0.1:{server.server_address[1]}", "org/x", REV, None)
    finally:
        server.shutdown()


class _Lying(http.server.BaseHTTPRequestHandler):
    """A hub whose listing's Content-Length lies: /api/models/<how>/...: ``longer`` (the body
    stops short of it and the connection closes), ``shorter`` (the rest of the body is dropped),
    ``huge`` (10^15 bytes said)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps([{"type": "file", "path": "m.gguf", "size": 10, "oid": "1" * 40}]).encode()
        how = self.path.split("/")[3]
        said = {"longer": len(body) + 1000, "shorter": len(body) - 5, "huge": 10 ** 15}[how]
        self.send_response(200)
        self.send_header("Content-Length", str(said))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


@pytest.mark.parametrize("how, code, why", [
    ("longer", "CutOff", "ended after 99 bytes, 1000 short of its Content-Length"),
    ("huge", "CutOff", "ended after 99 bytes, 999999999999901 short of its Content-Length"),
    ("shorter", "BadListing", "is not JSON"),
])
def test_a_listing_whose_content_length_lies_is_never_taken(how, code, why):
    """A complete-looking listing cut before its Content-Length is a cut connection (retried as
    any), never a listing; one longer than said is read as said, and is no JSON."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Lying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(fetcher.HubError) as e:
            fetcher.hub_files(f"http://127.0.0.1:{server.server_port}", f"{how}/r", "a" * 40, None)
    finally:
        server.shutdown()
    print(f"\n{how}: {e.value.code}: {e.value}")
    assert e.value.code == code and why in str(e.value)


class _Header(http.server.BaseHTTPRequestHandler):
    """A hub's resolve endpoint answering ``server.body`` (a GGUF header), Range ignored."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)


def test_a_header_rigup_cannot_size_refuses_the_model_not_kv_not_counted(monkeypatch):
    """Round 1 of issue 61, C10/C05: an architecture LLAMA with keys under llama., or a string of 2^63
    bytes before block_count, gave layers None and "KV cache not in the header (not counted)" in the
    plan: the model is refused (HubRefused: that host's model), naming the file and why; so is such
    figures kept in the hub's cache from before."""
    s = lambda b: struct.pack("<Q", len(b)) + b   # noqa: E731
    kv = lambda k, t, p: s(k.encode()) + struct.pack("<I", t) + p   # noqa: E731
    u32 = lambda k, v: kv(k, 4, struct.pack("<I", v))   # noqa: E731
    keys = [u32("llama.block_count", 32), u32("llama.attention.head_count", 32), u32("llama.embedding_length", 4096)]
    wrong = [kv("general.architecture", 8, s(b"LLAMA")), *keys]
    huge = [kv("general.architecture", 8, s(b"llama")), kv("x", 8, struct.pack("<Q", 2 ** 63)), *keys]
    server, endpoint = _header_hub(_Header, monkeypatch)
    try:
        for path, body, why in (("a.gguf", wrong, "no LLAMA.block_count in the whole header"),
                                (("b.gguf", huge, "past the file's"))):
            server.body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(body)) + b"".join(body) + b"\0" * 64
            with pytest.raises(hub_module.HubRefused, match=why):
                hub_module._head(endpoint, "org/x", REV, path, None, len(server.body))
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(Unreadable, match="no layer count"):
        gguf_figures({"architecture": "LLAMA", "layers": None, "kv_gib_per_1k_tokens": None, "context_length": None,
                      "read_bytes": 227, "chat_template": False}, "kept")


def test_rigups_own_names_are_refused_in_any_case_and_include_stays_inside():
    """Round 1 of issue 61, B13: '.RIGUP-FETCH/progress.json' was listed (rigup's own work directory
    on a case-insensitive file system); I08: include ['../../etc/*'] passed preflight."""
    from rigup.boundary.hosttext import hub_listing
    for path in (".RIGUP-FETCH/progress.json", ".Rigup-complete.json", ".CACHE/HuggingFace/x"):
        with pytest.raises(Unreadable, match="rigup's own|huggingface_hub's own"):
            hub_listing([{"path": path, "size": 1, "oid": None, "sha256": "a" * 64}], "hub", fetcher.listing_problems)
    for pattern in ("../../etc/*", "/etc/*", "a/../b"):
        _, problems = models({"models": {"m": {"repo": "org/m-GGUF", "revision": REV, "include": ["*.gguf", pattern]}}})
        assert problems == [("models.m.include[1]", f"{pattern!r}: an absolute pattern or one with a '..' part "
                                                     "matches no file (the files are paths inside dest)")], problems
    assert models({"models": {"m": {"repo": "org/m-GGUF", "revision": REV, "include": ["x..y/*.gguf"]}}})[1] == []
