"""roles/llama_cpp/shipped/smoke.py, the host-side smoke inference, against stand-in llama-servers (a few
lines of Python that serve /health and /completion, then answer, crash or hang as told), and the
tiny model it falls back to."""

import hashlib
import json
import os
import stat
import sys
import textwrap

import pytest

from roles.llama_cpp import smoke_model
from roles.llama_cpp.shipped import smoke
from roles.llama_server.facts import remedy_flags

# a stand-in llama-server: its behaviour comes from SMOKE_MODE in the environment (crash, hang, empty,
# repack: crash unless --no-repack, load-crash), everything else answers like llama-server
SERVER = textwrap.dedent("""\
    #!{python}
    import http.server, json, os, signal, sys, time
    argv = sys.argv[1:]
    mode = os.environ.get("SMOKE_MODE", "ok")
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))   # as llama-server does (even where SIGINT came ignored)
    if argv == ["--help"]:   # as llama.cpp's common/arg.cpp lists them (this build knows -ngl, not --reasoning-budget)
        print("----- common params -----", "-m,    --model FNAME", "-c,    --ctx-size N", "-np,   --parallel N",
              "-ngl,  --gpu-layers, --n-gpu-layers N", "--host HOST", "--port PORT", "--no-repack", "--metrics", sep="\\n")
        sys.exit(0)
    if mode == "load-crash":
        os.kill(os.getpid(), signal.SIGABRT)
    port = int(argv[argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{{"status": "ok"}}')
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if mode == "crash" or (mode == "repack" and "--no-repack" not in argv):
                print("decode: batch of 40 tokens", flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == "hang":
                time.sleep(60)
            tokens = 0 if mode == "empty" else 8
            self.send_response(200); self.end_headers()
            rate = os.path.join(os.path.dirname(sys.argv[0]), "tps")   # its decode rate: a file beside it
            rate = float(open(rate).read()) if os.path.exists(rate) else 100.0
            self.wfile.write(json.dumps({{"content": "hi" * tokens, "tokens_predicted": tokens,
                                         "timings": {{"predicted_per_second": rate}}}}).encode())
    print("listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """)
REMEDY = {"id": "cpu-repack-crash", "signals": ["SIGSEGV"], "args": ["--no-repack"]}


@pytest.fixture
def spec(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(SERVER.format(python=sys.executable))
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return {"key": "k1", "bin": str(bin_dir), "log": str(tmp_path / "smoke.log"), "out": str(tmp_path / "out.json"),
            "tiny": str(smoke_model.PATH), "timeout": 10, "max_model_bytes": 1 << 30,
            "runs": [{"name": "gemma", "args": ["--host", "0.0.0.0", "--port", "8081", "-ngl", "0", "--metrics"]}],
            "remedies": [REMEDY]}


def run(spec, mode, monkeypatch):
    monkeypatch.setenv("SMOKE_MODE", mode)
    return smoke.smoke(spec)


def test_a_build_that_answers_passes_with_the_instance_flags_less_its_own(spec, monkeypatch):
    doc = run(spec, "ok", monkeypatch)
    (r,) = doc["runs"]
    assert doc["ok"] and r["ok"] and r["tokens"] == 8 and doc["traps"] == [] and doc["server_args"] == []
    assert "-ngl" in r["argv"] and "0.0.0.0" not in r["argv"] and "8081" not in r["argv"] and "--metrics" not in r["argv"]
    assert r["model"] == str(smoke_model.PATH)    # no marker: the tiny model
    assert json.loads(open(spec["out"]).read())["key"] == "k1"
    print(f"\nsmoke of a stand-in that answers: {doc['seconds']} s")


def test_a_flag_the_builds_help_does_not_list_fails_the_run_naming_it_before_any_start(spec, monkeypatch):
    """issue 46: an instance flag the new build does not know (a build from before the flag) fails
    the host at the smoke, naming the flag, not the server at its start."""
    spec["runs"][0]["args"] += ["--reasoning-budget", "0", "--cache-reuse=256"]
    doc = run(spec, "ok", monkeypatch)
    (r,) = doc["runs"]
    assert not doc["ok"] and r["phase"] == "flags" and r["seconds"] == 0
    assert r["reason"].startswith("this build's llama-server does not know --cache-reuse, --reasoning-budget")
    assert "# rigup smoke:" not in open(spec["log"]).read()      # no server was started
    assert smoke.unknown_flags(["-ngl", "-1", "--port=1"], smoke.help_flags(spec)) == []


def test_a_crash_on_the_first_inference_is_named(spec, monkeypatch):
    spec["remedies"] = []
    doc = run(spec, "crash", monkeypatch)
    (r,) = doc["runs"]
    assert not doc["ok"] and r["signal"] == "SIGSEGV" and r["phase"] == "inference"
    assert "crashed (SIGSEGV)" in r["reason"] and "during its first inference" in r["reason"]
    assert any("decode: batch" in line for line in r["tail"])


def test_a_crash_while_loading_is_named(spec, monkeypatch):
    (r,) = run(spec, "load-crash", monkeypatch)["runs"]
    assert r["signal"] == "SIGABRT" and "while loading" in r["reason"] and not r.get("remedy")


def test_a_repack_crash_is_retried_with_the_remedy_and_recorded(spec, monkeypatch):
    doc = run(spec, "repack", monkeypatch)
    (r,) = doc["runs"]
    assert doc["ok"] and r["remedy"] == "cpu-repack-crash" and "crashed (SIGSEGV)" in r["first"]
    assert doc["traps"] == ["cpu-repack-crash"] and doc["server_args"] == ["--no-repack"]
    assert "--no-repack" in r["argv"]
    # what it wrote, as roles/llama_server reads it back (through rigup.boundary.results.smoke; its
    # key is a spec's hash, 16 hex digits, where the fixture's is k1)
    assert remedy_flags(json.dumps({**doc, "key": "0123456789abcdef"})) == ["--no-repack"]


def test_a_remedy_for_another_signal_is_not_tried(spec, monkeypatch):
    spec["remedies"] = [{**REMEDY, "signals": ["SIGILL"]}]
    doc = run(spec, "repack", monkeypatch)
    assert not doc["ok"] and doc["traps"] == []


def test_a_hang_and_an_empty_answer_fail(spec, monkeypatch):
    spec["timeout"] = 3
    hang = run(spec, "hang", monkeypatch)["runs"][0]
    # bounded (far below the 300 s default), with room for a loaded machine: 20 s seen under CI and two benches
    assert not hang["ok"] and "hang" in hang["reason"] and hang["seconds"] < 60, hang
    empty = run(spec, "empty", monkeypatch)["runs"][0]
    assert not empty["ok"] and "no tokens" in empty["reason"]


def test_the_served_model_is_used_when_complete_and_small_enough(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    marker = folder / ".rigup-complete.json"
    marker.write_text(json.dumps({"files": ["b-00002-of-00002.gguf", "b-00001-of-00002.gguf", "x.json"], "bytes": 100}))
    for shard in ("b-00001-of-00002.gguf", "b-00002-of-00002.gguf"):   # the files themselves are weighed too
        (folder / shard).write_bytes(b"x" * 50)
    spec = {"tiny": "TINY", "max_model_bytes": 1000}
    assert smoke.model_of({"marker": str(marker)}, spec) == str(folder / "b-00001-of-00002.gguf")
    assert smoke.model_of({"marker": str(marker)}, {**spec, "max_model_bytes": 99}) == "TINY"
    assert smoke.model_of({"marker": str(tmp_path / "none.json")}, spec) == "TINY"
    marker.write_text(json.dumps({"files": ["../../etc/x.gguf"], "bytes": 1}))
    assert smoke.model_of({"marker": str(marker)}, spec) == "TINY"     # a path outside the model's folder
    marker.write_text("{not json")
    assert smoke.model_of({"marker": str(marker)}, spec) == "TINY"


def test_flags_the_smoke_sets_itself_are_dropped():
    assert smoke.server_args(["--port=1", "--host", "h", "-c", "4096", "-fa", "on", "--alias", "a", "--metrics",
                              "--api-key-file", "/k", "--rpc", "10.0.0.2:50052", "-ctv", "q8_0"]) == \
        ["-fa", "on", "-ctv", "q8_0"]


def test_signal_names():
    assert smoke.signal_name(-11) == "SIGSEGV" and smoke.signal_name(139) == "SIGSEGV"
    assert smoke.signal_name(1) is None and smoke.signal_name(0) is None


def test_the_tiny_model_is_the_one_its_maker_writes(tmp_path):
    pytest.importorskip("gguf")
    made = smoke_model.write(tmp_path / "smoke.gguf")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(made) == digest(smoke_model.PATH)
    assert os.path.getsize(smoke_model.PATH) < 1_000_000


@pytest.mark.parametrize("files", [["model-Q4_K_M.gguf", "mmproj-model-f16.gguf"],
                                   ["Q8/x-00001-of-00002.gguf", "Q8/x-00002-of-00002.gguf", "Q4/y.gguf"],
                                   ["../evil.gguf", "a\nb.gguf", "/abs.gguf", "ok.gguf"], ["x.json"], []])
def test_the_smoke_loads_the_file_the_server_would(files):
    from rigup.models import first_gguf
    assert smoke.first_gguf(files) == first_gguf(files)


def test_a_busy_gpu_or_rpc_instance_smokes_on_the_tiny_model():
    from roles.llama_server.smoke import smoke_runs
    data = {"models": {"m": {"repo": "o/r", "revision": "a" * 40}}, "models_dir": "/srv/models",
            "llama_server_instances": {"glm": {"model": "m", "port": 8081}}, "llama_cpp_backend": "cpu"}
    from rigup.config import role_defaults
    for role in ("llama_server", "model_fetch", "llama_cpp", "preflight", "base"):
        data = {**role_defaults(role), **data}
    from rigup.serving import serving_plan
    from roles.llama_server import LLAMA
    plan = {"cards": [], "serving_units": ["rigup-llama@glm"]}
    (run,) = smoke_runs({**plan, "serving": serving_plan([LLAMA], data, plan)}, data)   # as preflight plans it
    assert run["marker"].endswith("/.rigup-complete.json") and "-ngl" in run["args"]   # CPU build: its model


def test_a_crash_the_remedy_does_not_save_names_both(spec, monkeypatch):
    """A crash whose signal a remedy names, which crashes again with the remedy: the run's reason is
    the remedied attempt's (the build's own crash: on an AMX host the first one only hid it), with
    the first one after it."""
    doc = run(spec, "crash", monkeypatch)
    (r,) = doc["runs"]
    print(r["reason"])
    assert not doc["ok"] and r["signal"] == "SIGSEGV" and not r.get("remedy") and doc["traps"] == []
    assert r["reason"].startswith("llama-server crashed (SIGSEGV)") and "during its first inference, with " in r["reason"]
    assert ", with --no-repack (trap cpu-repack-crash; without it: llama-server crashed (SIGSEGV)" in r["reason"]


def _second_build(spec, tmp_path, tps: float | None = None, crash: bool = False):
    """A 'current' build beside the spec's new one: the same stand-in, at its own rate."""
    current = tmp_path / "current-bin"
    current.mkdir()
    server = current / "llama-server"
    text = SERVER.format(python=sys.executable)
    server.write_text(text.replace('mode = os.environ.get("SMOKE_MODE", "ok")', 'mode = "load-crash"') if crash else text)
    server.chmod(0o755)
    if tps is not None:
        (current / "tps").write_text(str(tps))
    return {**spec, "compare": {"bin": str(current), "tolerance": 0.1, "rounds": 2}}


def test_a_build_as_fast_as_the_current_one_passes_measured_interleaved(spec, tmp_path, monkeypatch):
    """issue 51: new and current server sessions alternate (new, current, new, current), same model and flags."""
    doc = run(_second_build(spec, tmp_path, tps=98.0), "ok", monkeypatch)
    cmp = doc["compare"]
    assert doc["ok"] and cmp["ok"] and cmp["ratio"] == round(100 / 98, 3) and cmp["rounds"] == 2
    assert cmp["new_tps"] == [100.0, 100.0] and cmp["current_tps"] == [98.0, 98.0]
    starts = [ln.split()[3] for ln in open(spec["log"]) if ln.startswith("# rigup smoke: ")]
    sides = ["new" if s.startswith(spec["bin"] + "/") else "current" for s in starts]
    assert sides == ["new", "new", "current", "new", "current"]      # the smoke run, then A B A B
    assert json.loads(open(spec["out"]).read())["compare"]["ratio"] == cmp["ratio"]
    print(f"\ncompare: {cmp}")


def test_a_build_slower_than_the_tolerance_fails_with_its_ratio(spec, tmp_path, monkeypatch):
    (tmp_path / "bin" / "tps").write_text("40")
    doc = run(_second_build(spec, tmp_path, tps=100.0), "ok", monkeypatch)
    assert not doc["ok"] and doc["runs"][0]["ok"]          # it answered: only its speed fails it
    assert doc["compare"] == {"ok": False, "ratio": 0.4, "new_tps": [40.0, 40.0], "current_tps": [100.0, 100.0],
                              "tolerance": 0.1, "model": str(smoke_model.PATH), "rounds": 2}


def test_a_current_build_that_cannot_run_the_flags_is_not_compared(spec, tmp_path, monkeypatch):
    doc = run(_second_build(spec, tmp_path, crash=True), "ok", monkeypatch)
    assert doc["ok"] and doc["compare"]["ok"] and "current build gave no rate" in doc["compare"]["skipped"]
    assert "ratio" not in doc["compare"]


def test_a_current_build_without_its_server_is_not_compared(spec, tmp_path, monkeypatch):
    doc = run({**spec, "compare": {"bin": str(tmp_path / "gone"), "tolerance": 0.1}}, "ok", monkeypatch)
    assert doc["ok"] and "FileNotFoundError" in doc["compare"]["skipped"]


def test_no_comparison_without_a_current_build_or_after_a_failed_run(spec, tmp_path, monkeypatch):
    assert "compare" not in run({**spec, "compare": {"tolerance": 0.1, "rounds": 2}}, "ok", monkeypatch)
    assert "compare" not in run(_second_build(spec, tmp_path, tps=1.0), "crash", monkeypatch)
