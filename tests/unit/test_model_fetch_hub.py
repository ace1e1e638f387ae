"""The pure parts of model_fetch's controller side: the GGUF header, the hub's answers applied to
the ``models`` map (the pin to write, models_allow_unpinned, size_gib, an unknown family's KV
size), the endpoint and the token. The hub itself: tests/roles/test_model_fetch_hub.py."""

import json
import os
import struct

import pytest

from rigup.models import hub_endpoint, hub_key, models
from roles.llama_server.replicas import need_gib
from roles.model_fetch import hub as hub_module
from tests.unit.hosts import answered
from shipped.gguf import GGUFRefused, Incomplete, kv_figures, metadata
from tests.lab.hub import _gguf_str, gguf_bytes
from tests.runs import fresh_run  # noqa: F401 (a fixture: each test its own run)

COMMIT = "1a2b" + "0" * 36
LLAMA_KV = {"general.architecture": "llama", "llama.block_count": 22, "llama.embedding_length": 2048,
            "llama.attention.head_count": 32, "llama.attention.head_count_kv": 4, "llama.context_length": 2048}


def with_tokens(count: int) -> bytes:
    """A GGUF whose llama keys are followed by a tokenizer array of ``count`` strings."""
    kvs = [_gguf_str(k) + (struct.pack("<I", 8) + _gguf_str(v) if isinstance(v, str) else struct.pack("<Ii", 5, v))
           for k, v in LLAMA_KV.items()]
    tokens = _gguf_str("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count) + \
        b"".join(_gguf_str(f"t{i}") for i in range(count))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs) + 1) + b"".join(kvs) + tokens


def test_kv_figures_from_a_header():
    meta = metadata(gguf_bytes(LLAMA_KV, {}))
    figures = kv_figures(meta)
    # 22 layers x 4 KV heads x (64 + 64) x 2 bytes = 22,528 bytes per token
    assert figures == {"architecture": "llama", "layers": 22, "kv_gib_per_1k_tokens": round(22528 * 1000 / 2**30, 4),
                       "context_length": 2048}
    print("tinyllama-like header:", figures)


def test_header_cut_short_reads_what_it_has():
    whole = with_tokens(50_000)
    part = whole[:4096]
    with pytest.raises(Incomplete):
        metadata(part)
    meta = metadata(part, lambda k: not k.startswith("tokenizer."), partial=True)
    assert kv_figures(meta)["layers"] == 22 and kv_figures(meta)["kv_gib_per_1k_tokens"] > 0
    assert "tokenizer.ggml.tokens" not in metadata(whole, lambda k: not k.startswith("tokenizer."))


def test_not_a_gguf():
    with pytest.raises(GGUFRefused, match="not a GGUF"):
        metadata(b"PK\x03\x04" + b"\0" * 64)


def test_header_without_kv_figures():
    assert kv_figures({"general.architecture": "bert"}) == {"architecture": "bert", "layers": None,
                                                            "kv_gib_per_1k_tokens": None, "context_length": None}


@pytest.mark.parametrize("value", ["4096", 0, -1, 1 << 30, [4096], 1.5, True])
def test_a_context_length_that_is_not_one_is_refused(value):
    with pytest.raises(GGUFRefused, match="context_length"):
        kv_figures({**LLAMA_KV, "llama.context_length": value})


def test_per_layer_kv_heads():
    meta = {**LLAMA_KV, "llama.block_count": 4, "llama.attention.head_count_kv": [4, 0, 4, 0]}
    assert kv_figures(meta)["kv_gib_per_1k_tokens"] == round(8 * 128 * 2 * 1000 / 2**30, 4)


def data(**entry):
    return {"hf_endpoint": "http://hub.test", "models": {"x": {"repo": "org/x", "revision": "main", **entry}}}


def record(d, **facts):
    """``d`` as a configuration whose hub said ``facts`` of model x."""
    entry = {"repo": "org/x", "revision": d["models"]["x"]["revision"], "include": d["models"]["x"].get("include", [])}
    return answered(d, {hub_key(hub_endpoint(d), entry): facts})


def test_branch_refused_with_the_pin():
    d = data()
    assert models(d)[1][0][1].startswith("expected a full 40-hex commit id, got 'main'")
    found, problems = models(record(d, commit=COMMIT))
    assert found == {} and problems == [("models.x.revision", f"main is {COMMIT}; pin it (revision: {COMMIT}): a "
                                         "branch or tag moves; or --data models_allow_unpinned=true to fetch that commit")]
    d["models_allow_unpinned"] = True
    entry = models(record(d, commit=COMMIT))[0]["x"]
    assert entry["revision"] == COMMIT and entry["pinned_from"] == "main"


def test_hub_error_in_the_refusal():
    d = data()
    d = record(d, error="RepositoryNotFoundError: 401 (at http://hub.test)")
    assert "could not resolve (RepositoryNotFoundError: 401" in models(d)[1][0][1]


def test_size_and_gguf_from_the_hub():
    d = data(revision=COMMIT, include=["*.gguf"])
    gguf = {"architecture": "llama", "layers": 22, "kv_gib_per_1k_tokens": 0.021, "file": "m.gguf"}
    entry = models(record(d, commit=COMMIT, size_gib=0.6, gguf=gguf))[0]["x"]
    assert entry["size_gib"] == 0.6 and entry["gguf"] == gguf
    need = need_gib(entry, {"ngl": 99, "ctx": 8000}, 1)
    assert need.kv == pytest.approx(0.168) and need.total == pytest.approx(0.6 + 0.168 + 1)
    typed = data(revision=COMMIT, include=["*.gguf"], size_gib=2.0, family="glm-5.3-flash")
    entry = models(record(typed, commit=COMMIT, size_gib=0.6, gguf=gguf))[0]["x"]
    assert entry["size_gib"] == 2.0 and "gguf" not in entry   # typed values win; a known family's estimate


def test_endpoint_from_the_environment(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub_endpoint({"hf_endpoint": None}) == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.lan:8090/")
    assert hub_endpoint({"hf_endpoint": None}) == "http://mirror.lan:8090"
    assert hub_endpoint({"hf_endpoint": "http://other"}) == "http://other"


def test_token_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert hub_module.token({"model_fetch_hf_token_src": None}) == "hf_from_env"
    src = tmp_path / "token"
    src.write_text("hf_from_file_0123456789\n")
    src.chmod(0o600)
    assert hub_module.token({"model_fetch_hf_token_src": str(src)}) == "hf_from_file_0123456789"


def test_a_token_file_another_user_could_write_or_read_is_refused_naming_the_key(tmp_path):
    """model_fetch_hf_token_src is used only as ssh's StrictModes would (rigup/boundary/owned.py):
    a token file others may read or write, or one holding no token, is refused at preflight."""
    from roles.model_fetch.checks import check_endpoint

    src = tmp_path / "token"
    src.write_text("hf_from_file_0123456789\n")
    for mode, said in ((0o644, "chmod 600"), (0o620, "chmod 600")):
        src.chmod(mode)
        refused = check_endpoint({}, {}, {"hf_endpoint": "https://hub.test", "model_fetch_hf_token_src": str(src)})
        print(f"\n{oct(mode)}: {refused[0].why}")
        assert len(refused) == 1 and refused[0].what == "model_fetch_hf_token_src" and said in refused[0].why
    src.write_text("hf token\noutput = /etc/x\n")
    src.chmod(0o600)
    refused = check_endpoint({}, {}, {"hf_endpoint": "https://hub.test", "model_fetch_hf_token_src": str(src)})
    assert "not a key" in refused[0].why and "/etc/x" not in refused[0].why


def test_entries_that_need_no_hub_are_not_asked(fresh_run):
    d = data(revision=COMMIT, size_gib=1.0, family="glm-5.3-flash")
    assert hub_module.resolve(d) == {} and hub_module.lines(answered(d, resolve=hub_module.resolve)) == []
    assert fresh_run.hub_calls == []


def test_token_from_the_hf_auth_login_store(tmp_path):
    """Without a file or HF_TOKEN: the token `hf auth login` stored under HF_HOME (read at import,
    so in a fresh controller process)."""
    import os
    import subprocess
    import sys

    (tmp_path / "token").write_text("hf_stored_by_login\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    out = subprocess.run([sys.executable, "-c", "from roles.model_fetch.hub import token; "
                          "print(token({'model_fetch_hf_token_src': None}))"],
                         env={**env, "HF_HOME": str(tmp_path)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "hf_stored_by_login"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("what", ["read", "write"])
def test_the_hubs_answers_are_kept_only_where_no_other_user_can_write(tmp_path, monkeypatch, what, fresh_run):
    """The red team's 5 and 6 (issue 61): a hub cache directory of nobody's, 0777, holding figures
    that would size VRAM with 1 layer and no KV (read), or a link planted at the old temporary
    name (write): the model is refused naming the directory and the fix; nothing is written through."""
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path / "cache"))
    victim = tmp_path / "victim"
    victim.write_text("operator's file\n")
    commit = "ab" * 20
    key = ("gguf", "http://hub.test", "org/m", commit, "m.gguf") if what == "read" else ("tree", "http://hub.test", "org/m", commit)
    kept = hub_module._kept(key)
    kept.parent.mkdir(parents=True)
    hub_module._once(("tree", "http://hub.test", "org/m", "cd" * 20), lambda: [])     # ours: written, 0600
    assert oct(os.stat(hub_module._kept(("tree", "http://hub.test", "org/m", "cd" * 20))).st_mode & 0o777) == "0o600"
    os.chown(kept.parent, 65534, 65534)
    kept.parent.chmod(0o777)
    if what == "read":
        kept.write_text(json.dumps({"architecture": "llama", "layers": 1, "kv_gib_per_1k_tokens": 0.0,
                                    "context_length": 1 << 24, "read_bytes": 10}))
        os.chown(kept, 65534, 65534)
        kept.chmod(0o666)
        call = lambda: hub_module._head("http://hub.test", "org/m", commit, "m.gguf", None, 10)  # noqa: E731
    else:
        kept.with_suffix(f".tmp{os.getpid()}").symlink_to(victim)
        call = lambda: hub_module._once(key, lambda: [{"path": "m.gguf", "size": 1, "sha256": "a" * 64}])  # noqa: E731
    with pytest.raises(hub_module.HubRefused) as e:
        call()
    print(e.value)
    assert "the hub's answers kept on the controller" in str(e.value) and "owned by nobody" in str(e.value)
    assert victim.read_text() == "operator's file\n" and (key in fresh_run.hub_calls) == (what == "write")


# ------------------------------------------------------------------ the chat template (issue 63)

def test_a_model_without_a_chat_template_is_named_in_the_plan():
    """Gemma 270M as the lab serves it: chat through llama-server's fallback template."""
    d = data(revision=COMMIT, include=["*.gguf"], size_gib=0.25)
    figures = {"architecture": "gemma3", "layers": 18, "kv_gib_per_1k_tokens": 0.01, "context_length": 32768,
               "read_bytes": 1 << 20, "file": "gemma-3-270m.gguf"}
    said = {t: hub_module.lines(record(d, commit=COMMIT, gguf=dict(figures, chat_template=t)))
            for t in (False, True, None)}
    print("\n" + "\n".join(said[False]))
    assert [line for line in said[False] if "chat template" in line] == [
        "models.x: its GGUF (gemma-3-270m.gguf) has no chat template (tokenizer.chat_template): chat requests use "
        "llama-server's fallback template, and a base model answers them with nonsense; serve an instruct model, "
        "or give the instance a template (extra_args: --chat-template NAME, or --chat-template-file PATH with "
        "llama_server_allow: [files]: GET /props answers the file's text to any client)"]
    assert not any("chat template" in line for line in said[True] + said[None])   # found, or not known
    assert hub_module.lines(record(d, commit=COMMIT, gguf=figures)) == said[None]   # a stamp kept before


def hub_serving(answer):
    """(endpoint, server): a hub on loopback whose GET of any path answers ``answer(path, range)``:
    (status, body); shut it down after."""
    import http.server
    import threading

    class Files(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            status, body = answer(self.path, self.headers.get("Range"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def test_the_header_is_read_past_the_tokenizer_to_find_the_template_bounded(monkeypatch, fresh_run):
    """The template comes after the tokenizer's arrays: the next rung of HEAD_BYTES is asked for until
    the header is read whole, at most the last rung; a header longer than that: not known."""
    from tests.unit.test_gguf_header import tokenizer

    files = {"/with": tokenizer(20_000, "{{ messages }}"), "/without": tokenizer(20_000, None),
             "/long": tokenizer(200_000, None)}
    asked = []

    def answer(path, ranged):
        body = next(b for p, b in files.items() if f"{p}.gguf" in path)
        first, last = map(int, ranged.removeprefix("bytes=").split("-"))
        asked.append(last + 1)
        return 206, body[first:last + 1]

    endpoint, server = hub_serving(answer)
    monkeypatch.setattr(hub_module, "HEAD_BYTES", (4096, 1 << 20, 2 << 20))
    monkeypatch.setattr(hub_module, "_kept", lambda key: None)
    try:
        got = {name: hub_module._head(endpoint, "org/x", COMMIT, f"{name}.gguf", None, len(files[f"/{name}"]))
               for name in ("with", "without", "long")}
    finally:
        server.shutdown()
    print(f"\nbytes asked: {asked}; " + "; ".join(f"{n}: {g['chat_template']} ({g['read_bytes']} bytes)"
                                                 for n, g in got.items()))
    assert [got[n]["chat_template"] for n in ("with", "without", "long")] == [True, False, None]
    assert got["with"]["layers"] == 80 and asked == [4096, 1 << 20, 4096, 1 << 20, 4096, 1 << 20, 2 << 20]


def test_figures_kept_before_the_template_was_read_are_asked_again_once_and_used_if_the_hub_fails(tmp_path, monkeypatch,
                                                                                                   fresh_run):
    """A stamp of the hub cache from before issue 63 has no chat_template: the header is asked again
    (so that a model without one is named), the new stamp kept; with the hub down, the old figures
    still size the model (the template not known)."""
    from tests.unit.test_gguf_header import tokenizer

    body = tokenizer(2000, None)
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path))
    old = {"architecture": "llama", "layers": 80, "kv_gib_per_1k_tokens": 0.3, "context_length": None, "read_bytes": 1}
    endpoint, server = hub_serving(lambda path, ranged: (200, body))
    key = ("gguf", endpoint, "org/x", COMMIT, "m.gguf")
    kept = hub_module._kept(key)
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(old))
    try:
        got = hub_module._head(endpoint, "org/x", COMMIT, "m.gguf", None, len(body))
    finally:
        server.shutdown()
        server.server_close()
    assert got["chat_template"] is False and json.loads(kept.read_text())["chat_template"] is False
    assert fresh_run.hub_calls == [key]
    fresh_run.hub_answers.clear()
    assert hub_module._head(endpoint, "org/x", COMMIT, "m.gguf", None, len(body))["chat_template"] is False
    assert fresh_run.hub_calls == [key]   # the new stamp is current: not asked again
    kept.write_text(json.dumps(old))   # the old stamp again, and the hub gone
    fresh_run.hub_answers.clear()
    got = hub_module._head(endpoint, "org/x", COMMIT, "m.gguf", None, len(body))
    assert got["layers"] == 80 and got["chat_template"] is None and fresh_run.hub_calls == [key, key]


LAB_GEMMA = "/var/cache/rigup-lab/models/gemma-3-270m-q4_k_m.gguf"   # tests/lab/models.py, where the lab ran


@pytest.mark.skipif(not os.path.exists(LAB_GEMMA), reason="the lab's Gemma 270M is not cached on this machine")
def test_the_labs_gemma_270m_has_no_chat_template_and_is_named(monkeypatch, fresh_run):
    """The model issue 63 saw answer nonsense through the OpenAI client: its header (6.2 MiB, the
    tokenizer's 262k tokens) read whole from the second rung, no tokenizer.chat_template."""
    with open(LAB_GEMMA, "rb") as f:
        body = f.read(16 << 20)

    def answer(path, ranged):
        first, last = map(int, ranged.removeprefix("bytes=").split("-"))
        return 206, body[first:last + 1]

    endpoint, server = hub_serving(answer)
    monkeypatch.setattr(hub_module, "_kept", lambda key: None)
    try:
        got = hub_module._head(endpoint, "rigup-lab/gemma-3-270m-GGUF", COMMIT, "g.gguf", None, os.path.getsize(LAB_GEMMA))
    finally:
        server.shutdown()
    print(f"\n{got}")
    assert (got["architecture"], got["layers"], got["chat_template"], got["read_bytes"]) == ("gemma3", 18, False, 16 << 20)
