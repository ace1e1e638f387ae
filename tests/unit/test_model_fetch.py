"""roles/model_fetch without a lab: the pure plan (refusals, progress lines, shard sets,
first_gguf), the probe's parsing, and the host-side fetcher against the lab hub's server run on
loopback (real HTTP: resume with Range after a kill, a corrupt file fetched again)."""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rigup.names import HF_TOKEN, MARKER, revision_dir
from roles.model_fetch.shipped import fetcher
from roles.model_fetch.facts import parse_probe, unit_name
from roles.model_fetch.plan import human, pending_note, plan_model, progress_line

NAMES = {"marker": MARKER, "token_file": HF_TOKEN}  # what the role passes to every job and spec

REV = "a" * 40
FILES = [{"path": "m-00001-of-00002.gguf", "size": 600, "oid": "1" * 40, "sha256": "b" * 64},
         {"path": "m-00002-of-00002.gguf", "size": 400, "oid": "2" * 40, "sha256": "c" * 64},
         {"path": "config.json", "size": 10, "oid": "3" * 40, "sha256": None}]
ENTRY = {"repo": "org/m", "revision": REV, "include": [], "dest": "/srv/models/m"}


def plan(state, **entry):
    return plan_model("m", {**ENTRY, **entry}, state, endpoint="http://hub", source="http://hub", peer=None,
                      workers=4, peer_wait=60)


def test_shard_sets_and_include():
    assert fetcher.shard_problems(["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"]) == [
        "m-*-of-00003.gguf lacks shard(s) 00002"]
    assert fetcher.shard_problems([f["path"] for f in FILES]) == []
    chosen, unmatched = fetcher.select(FILES, ["*.gguf", "*.safetensors"])
    assert [f["path"] for f in chosen] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert unmatched == ["*.safetensors"]


def test_plan_starts_a_job_with_every_file_and_its_hash():
    p = plan({"hub_files": FILES, "free_bytes": 10_000, "have_bytes": 0})
    assert p.action == "start" and p.problems == []
    assert p.job["bytes"] == 1010 and [f["path"] for f in p.job["files"]] == sorted(f["path"] for f in FILES)
    assert p.job["files"][1]["sha256"] == "b" * 64


def test_plan_refusals_name_the_key_and_the_numbers():
    disk = plan({"hub_files": FILES, "free_bytes": 500, "have_bytes": 100})
    assert disk.action == "refused"
    key, why = disk.problems[0]
    assert key == "models.m.dest" and "910 bytes" in why and "(500 bytes)" in why and "fix:" in why
    inc = plan({"hub_files": FILES, "free_bytes": 10_000}, include=["*.bin"])
    assert inc.problems[0][0] == "models.m.include" and "'*.bin' matches no file of org/m" in inc.problems[0][1]
    half = plan({"hub_files": FILES, "free_bytes": 10_000}, include=["m-00001*"])
    assert "lacks shard(s) 00002" in half.problems[0][1]
    rev = plan({"hub_error": {"status": 404, "code": "RevisionNotFound", "message": "HTTP 404"}})
    assert rev.problems[0][0] == "models.m.revision" and f"{REV} is not a commit of org/m" in rev.problems[0][1]
    repo = plan({"hub_error": {"status": 404, "code": "RepoNotFound", "message": "HTTP 404"}})
    assert repo.problems[0][0] == "models.m.repo"
    down = plan({"hub_error": {"status": 0, "code": "Unreachable", "message": "cannot reach http://hub"}})
    assert down.problems[0][0] == "models.m" and "cannot reach" in down.problems[0][1]


def test_plan_leaves_a_running_job_alone_and_restarts_a_changed_one():
    job = plan({"hub_files": FILES, "free_bytes": 10_000}).job
    assert plan({"hub_files": FILES, "free_bytes": 10_000, "running": True, "job": job}).action == "running"
    other = dict(job, include=["*.gguf"])
    assert plan({"hub_files": FILES, "free_bytes": 10_000, "running": True, "job": other}).action == "restart"
    done = {"complete": True, "dest": "/srv/models/m", "marker": {"files": ["a"], "bytes": 3 << 30}}
    assert plan(done).action == "complete"
    assert progress_line("m", done) == "model m: complete, 1 file(s), 3.0 GiB at /srv/models/m"


def test_progress_lines():
    running = {"running": True, "progress": {"bytes": 50 << 20, "total": 100 << 20, "rate": 10 << 20, "eta": 5,
                                              "state": "running"}}
    assert progress_line("m", running) == "model m: 50.0 MiB / 100.0 MiB (50.0%), 10.0 MiB/s, ETA 5s (running)"
    stopped = {"progress": {"bytes": 50 << 20, "total": 100 << 20, "state": "running"}}
    assert "stopped at 50.0 MiB / 100.0 MiB (50.0%); resumed" in progress_line("m", stopped)
    assert human(1.35 * (1 << 40)) == "1.4 TiB"


def test_status_names_why_a_running_job_retries_until_a_stream_brings_bytes_again(tmp_path):
    """status.py's line of a job retrying a hub that refuses was 'big 40.0% running': silent on
    the hub being down for as long as the job's own retries last (minutes by default)."""
    from roles.model_fetch.plan import short_progress

    progress = fetcher.Progress(str(tmp_path / "progress.json"), 100 << 20, 40 << 20, "http://hub:8090")
    why = "big.bin: cannot reach the hub: [Errno 111] Connection refused; resumed from 40.0 MiB with Range in 1.0 s"
    progress.resumed(why + " (retry 1/10)")
    state = {"running": True, "progress": {"bytes": 40 << 20, "total": 100 << 20, "state": progress.state,
                                           "detail": progress.detail}}
    assert short_progress("big", state) == f"big 40.0% running: {why} (retry 1/10)"
    progress.resumed_ok()   # the hub back: the retry's reason is gone from the line
    assert progress.detail == "" and progress.resumes == 1
    assert short_progress("big", dict(state, progress=dict(state["progress"], detail=""))) == "big 40.0% running"


def test_a_proxys_error_page_for_a_listing_is_told_in_words():
    """A host behind an HTTP proxy, its hub down: the proxy answers 500 with an HTML page, which the
    refusal quoted as markup, cut before the proxy's reason (seen on the lab's tinyproxy)."""
    import http.server

    page = ('<?xml version="1.0" encoding="UTF-8" ?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" '
            '"http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html>\n<head><title>500 Unable to connect</title>'
            '</head>\n<body>\n<h1>Unable to connect</h1>\n<p>Tinyproxy was unable to connect to the remote web '
            'server.</p>\n<hr />\n<p><em>Generated by tinyproxy version 1.11.1.</em></p>\n</body>\n</html>\n')

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page.encode()
            self.send_response(500, "Unable to connect")
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with pytest.raises(fetcher.HubError) as raised:
            fetcher.hub_files(f"http://127.0.0.1:{server.server_address[1]}", "org/m", "a" * 40, None)
    finally:
        server.shutdown()
    message = str(raised.value)
    assert raised.value.status == 500 and "<" not in message and "\n" not in message
    assert "Tinyproxy was unable to connect to the remote web server." in message, message


def test_a_download_left_running_is_named_with_how_to_wait():
    """The summary line's note for a model this converge leaves downloading; none for a model
    complete or refused."""
    start = plan({"hub_files": FILES, "free_bytes": 10_000, "have_bytes": 0})
    assert pending_note(start, {}) == ("m: downloading 0.0% of 1010 B, serving when complete: converge again, "
                                       "or watch status.py")
    state = {"hub_files": FILES, "free_bytes": 10_000, "running": True, "job": start.job,
             "progress": {"bytes": 505}, "serving": {"revision": "b" * 40}}
    assert pending_note(plan(state), state).startswith(
        "m: downloading 50.0% of 1010 B, serving bbbbbbbbbbbb meanwhile, switching when complete: ")
    done = {"complete": True, "dest": "/srv/models/m", "marker": {"files": ["a"], "bytes": 3}}
    assert pending_note(plan(done), done) == ""
    assert pending_note(plan({"hub_files": FILES, "free_bytes": 1}), {}) == ""


def test_parse_probe_and_unit_names():
    lines = ["##rigup-systemd 1", "##rigup-share active", '##rigup-model {"name": "m", "complete": true}', "noise"]
    assert parse_probe(lines) == {"systemd": True, "python": True, "share_active": True,
                                  "models": {"m": {"name": "m", "complete": True}}}
    assert parse_probe(["##rigup-systemd 0", "##rigup-share ", "##rigup-nopython"])["python"] is False
    assert unit_name("glm 4.5/q4") == "rigup-fetch-glm_4.5_q4"


# ------------------------------------------------------------------ the fetcher over loopback HTTP

@pytest.fixture(scope="module")
def local_hub(tmp_path_factory):
    from tests.lab import hub

    root = tmp_path_factory.mktemp("hub")
    saved = hub.MODELS, hub.LOG
    hub.MODELS, hub.LOG = root / "models", root / "access.log"
    src = root / "src"
    src.mkdir()
    big = src / "big.bin"
    big.write_bytes(os.urandom(24 << 20))
    (src / "config.json").write_text('{"a": 1}\n')
    shards = {}
    for k in (1, 2):
        p = src / f"m-0000{k}-of-00002.gguf"
        p.write_bytes(hub.gguf_bytes({"split.no": k - 1, "split.count": 2}, {"t": os.urandom(1 << 16)}))
        shards[p.name] = p
    rev = hub.publish("org/m", {"big.bin": big, "config.json": src / "config.json", **shards})
    server = hub.Server(("127.0.0.1", 0), hub.Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", rev, hub
    server.shutdown()
    hub.MODELS, hub.LOG = saved


def job_for(dest, endpoint, rev):
    files = fetcher.hub_files(endpoint, "org/m", rev, None)
    job = {"dest": str(dest), "repo": "org/m", "revision": rev, "source": endpoint, "files": files,
           "include": [], "workers": 2, **NAMES}
    (dest / ".rigup-fetch").mkdir(parents=True, exist_ok=True)
    (dest / ".rigup-fetch/job.json").write_text(json.dumps(job))
    return job


def run_fetch(dest):
    return subprocess.run([sys.executable, fetcher.__file__, "fetch", str(dest / ".rigup-fetch/job.json")],
                          capture_output=True, text=True)


def test_hub_lists_sizes_and_hashes_and_refuses_unknowns(local_hub):
    endpoint, rev, _ = local_hub
    files = {f["path"]: f for f in fetcher.hub_files(endpoint, "org/m", rev, None)}
    assert files["big.bin"]["size"] == 24 << 20 and len(files["big.bin"]["sha256"]) == 64
    assert files["config.json"]["sha256"] is None and len(files["config.json"]["oid"]) == 40
    with pytest.raises(fetcher.HubError) as e:
        fetcher.hub_files(endpoint, "org/m", "f" * 40, None)
    assert e.value.code == "RevisionNotFound"
    with pytest.raises(fetcher.HubError) as e:
        fetcher.hub_files(endpoint, "org/none", rev, None)
    assert e.value.code == "RepoNotFound"


def test_fetch_verifies_and_marks_complete(local_hub, tmp_path):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "m"
    job_for(dest, endpoint, rev)
    result = run_fetch(dest)
    assert result.returncode == 0, result.stderr
    marker = json.loads((dest / ".rigup-complete.json").read_text())
    assert marker == {"repo": "org/m", "revision": rev, "bytes": sum(f.stat().st_size for f in dest.iterdir() if f.is_file() and not f.name.startswith(".")),
                      "files": ["big.bin", "config.json", "m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]}
    # the probe finds it complete without asking the hub
    spec = base64.b64encode(json.dumps([{"name": "m", "dest": str(dest), "repo": "org/m", "revision": rev,
                                         "include": [], "endpoint": "http://127.0.0.1:9", **NAMES}]).encode()).decode()
    out = subprocess.run([sys.executable, fetcher.__file__, "probe", spec], capture_output=True, text=True).stdout
    state = parse_probe(out.splitlines())["models"]["m"]
    assert state["complete"] and "hub_files" not in state and "hub_error" not in state
    # a shard changed on disk (same size): damaged, checked again, that shard fetched again
    shard = dest / "m-00002-of-00002.gguf"
    data = bytearray(shard.read_bytes())
    data[-1000:-990] = b"\0" * 10
    shard.write_bytes(bytes(data))
    state = parse_probe(subprocess.run([sys.executable, fetcher.__file__, "probe", spec], capture_output=True,
                                       text=True).stdout.splitlines())["models"]["m"]
    assert state["damaged"] == ["m-00002-of-00002.gguf"] and not state["complete"]
    assert run_fetch(dest).returncode == 0
    assert (dest / ".rigup-complete.json").exists() and shard.read_bytes() != bytes(data)


def test_kill_9_then_resume_fetches_only_the_rest(local_hub, tmp_path):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "m"
    job = job_for(dest, endpoint, rev)
    job["files"] = [f for f in job["files"] if f["path"] == "big.bin"]
    (dest / ".rigup-fetch/job.json").write_text(json.dumps(job))
    hub.STATS.bps = 8 << 20
    with hub.STATS.lock:
        hub.STATS.bytes.clear()
    proc = subprocess.Popen([sys.executable, fetcher.__file__, "fetch", str(dest / ".rigup-fetch/job.json")])
    part = dest / ".rigup-fetch/parts/big.bin"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not part.exists() or part.stat().st_size < (12 << 20)):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    hub.STATS.bps = 0
    have = part.stat().st_size
    assert 0 < have < 24 << 20
    # the killed stream's handler counts what the kernel took of its last block until the reset ends it
    # (tests/lab/hub.py counts each part as it is taken): cleared once its count stands still
    last, still = -1, time.monotonic()
    while time.monotonic() - still < 0.5 and time.monotonic() < deadline + 10:
        now = sum(hub.STATS.bytes.values())
        last, still = (now, still) if now == last else (now, time.monotonic())
        time.sleep(0.05)
    with hub.STATS.lock:
        hub.STATS.bytes.clear()
    assert run_fetch(dest).returncode == 0
    assert sum(hub.STATS.bytes.values()) == (24 << 20) - have
    assert not part.exists() and (dest / ".rigup-complete.json").exists()


# ------------------------------------------------------------------ hostile listings, faults

HOSTILE = ["../../x", "/etc/cron.d/x", "a/../../x", "a\\..\\x", "", "a//b", "./a", "a/\n", ".rigup-fetch/job.json",
           ".rigup-complete.json"]


def test_unsafe_paths_are_named_and_plain_ones_pass():
    for path in HOSTILE:
        assert fetcher.unsafe_path(path), path
    assert "'..'" in fetcher.unsafe_path("a/../../x") and "absolute" in fetcher.unsafe_path("/etc/cron.d/x")
    assert "backslash" in fetcher.unsafe_path("a\\..\\x")
    for path in ("config.json", "sub/dir/m-00001-of-00002.gguf", "..hidden", "a..b/c", ".gitattributes"):
        assert fetcher.unsafe_path(path) is None, path


def test_safe_join_refuses_what_resolves_outside(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    assert fetcher.safe_join(str(dest), "a/b.bin") == str(dest / "a/b.bin")
    with pytest.raises(fetcher.UnsafePath, match=r"'\.\./x'"):
        fetcher.safe_join(str(dest), "../x")
    (dest / "link").symlink_to(tmp_path)  # a symlink planted in dest: what goes through it is outside
    with pytest.raises(fetcher.UnsafePath, match="resolves outside"):
        fetcher.safe_join(str(dest), "link/x")


def test_plan_refuses_a_hostile_listing_naming_each_file():
    listed = FILES + [{"path": p, "size": 8, "oid": "4" * 40, "sha256": None} for p in ("../../x", "/etc/cron.d/x")]
    p = plan({"hub_files": listed, "free_bytes": 10_000}, include=["*.gguf"])  # include does not save it
    assert p.action == "refused" and p.job is None
    assert [k for k, _ in p.problems] == ["models.m.repo", "models.m.repo"]
    assert "'../../x'" in p.problems[0][1] and "'/etc/cron.d/x'" in p.problems[1][1]
    assert "before any byte" in p.problems[0][1]


def test_failed_line_says_why():
    failed = {"progress": {"bytes": 50 << 20, "total": 100 << 20, "state": "failed",
                           "error": "no space left on device at /srv/models/m, 50.0 MiB more needed"}}
    assert progress_line("m", failed) == ("model m: failed: no space left on device at /srv/models/m, 50.0 MiB "
                                          "more needed (at 50.0 MiB / 100.0 MiB (50.0%))")


def big_job(dest, endpoint, rev, **extra):
    job = job_for(dest, endpoint, rev)
    job.update(files=[f for f in job["files"] if f["path"] == "big.bin"], **extra)
    (dest / ".rigup-fetch/job.json").write_text(json.dumps(job))
    return job


def served(hub):
    with hub.STATS.lock:
        return sum(hub.STATS.bytes.values())


@pytest.fixture
def faults(local_hub):
    """The local hub's counters cleared, and its faults and rate limit off again afterwards."""
    _, _, hub = local_hub
    with hub.STATS.lock:
        hub.STATS.bytes.clear()
    yield hub
    with hub.STATS.lock:
        hub.STATS.clear_faults()
    hub.STATS.bps = 0


@pytest.mark.parametrize("how", ["close", "reset", "stall"])
def test_a_cut_reset_or_stalled_stream_is_resumed_in_the_same_job(local_hub, faults, tmp_path, how):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "m"
    big_job(dest, endpoint, rev, stall_s=1)
    hub.STATS.cut = {"after": 10 << 20, "times": 2, "how": how, "secs": 4}
    start = time.monotonic()
    result = run_fetch(dest)
    assert result.returncode == 0, result.stderr
    progress = json.loads((dest / ".rigup-fetch/progress.json").read_text())
    print(f"\n{how}: {progress['resumes']} resume(s) in one job, {served(hub)} bytes served for "
          f"{24 << 20}, {time.monotonic() - start:.1f} s")
    assert progress["resumes"] == 2 and progress["state"] == "complete"
    # a RST drops what the socket buffers held, which is sent again; otherwise not a byte
    assert served(hub) <= (24 << 20) + (2 * (4 << 20) if how == "reset" else 0)
    assert ("stalled" if how == "stall" else "ended at" if how == "close" else "reset") in result.stderr


def test_sigterm_checkpoints_every_byte_here(local_hub, faults, tmp_path):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "m"
    big_job(dest, endpoint, rev)
    hub.STATS.bps = 8 << 20
    proc = subprocess.Popen([sys.executable, fetcher.__file__, "fetch", str(dest / ".rigup-fetch/job.json")])
    part = dest / ".rigup-fetch/parts/big.bin"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not part.exists() or part.stat().st_size < (6 << 20)):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    have = part.stat().st_size
    ckpt = json.loads((dest / ".rigup-fetch/ckpt/big.bin").read_text())
    progress = json.loads((dest / ".rigup-fetch/progress.json").read_text())
    assert ckpt["bytes"] == have and 0 < have < 24 << 20  # what a job after a reboot keeps
    assert progress["state"] == "stopped" and "SIGTERM" in progress["detail"]
    assert not list((dest / ".rigup-fetch").glob("*.tmp*"))


def test_a_hub_refusal_fails_the_job_with_its_answer(local_hub, faults, tmp_path):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "m"
    job = big_job(dest, endpoint, rev)
    job["repo"] = "org/gone"  # the hub answers 404 for its files
    (dest / ".rigup-fetch/job.json").write_text(json.dumps(job))
    result = run_fetch(dest)
    assert result.returncode == fetcher.PERMANENT
    progress = json.loads((dest / ".rigup-fetch/progress.json").read_text())
    assert progress["state"] == "failed" and progress["error"] == "hub answered 404 (RepoNotFound) for big.bin"


def test_fetcher_refuses_a_hostile_job_before_any_byte(local_hub, faults, tmp_path):
    endpoint, rev, hub = local_hub
    dest = tmp_path / "deep/m"
    job = big_job(dest, endpoint, rev)
    outside = tmp_path / "x"
    outside.write_text("keep me\n")  # a wrong size: the fetcher would delete it as a corrupt file
    job["files"].append({"path": "../../x", "size": 3, "oid": "0" * 40, "sha256": None})
    (dest / ".rigup-fetch/job.json").write_text(json.dumps(job))
    result = run_fetch(dest)
    assert result.returncode == fetcher.PERMANENT
    progress = json.loads((dest / ".rigup-fetch/progress.json").read_text())
    assert "refused: the hub listed '../../x'" in progress["error"]
    assert outside.read_text() == "keep me\n" and served(hub) == 0
    assert not (dest / ".rigup-fetch/parts/big.bin").exists()


def test_wait_tells_a_dead_job_from_one_that_starts():
    from roles.model_fetch import dead_job

    assert dead_job("m", {"running": True, "progress": {"state": "running"}}, 100) is None
    assert dead_job("m", {"complete": True}, 100) is None
    assert dead_job("m", {}, 5) is None  # no progress yet: the unit may be starting
    assert "did not start within 30 s" in dead_job("m", {}, 31)
    failed = {"progress": {"state": "failed", "error": "hub answered 403 for big.bin", "bytes": 1 << 20, "total": 2 << 20}}
    assert dead_job("m", failed, 1) == "the download failed: hub answered 403 for big.bin (at 1.0 MiB / 2.0 MiB)"
    failed["progress"]["source"] = "http://hub.lan:8090"   # the job's source: the hub, or a peer
    assert dead_job("m", failed, 1) == ("the download failed: hub answered 403 for big.bin (at 1.0 MiB / 2.0 MiB, "
                                        "from http://hub.lan:8090)")
    assert "without completing or saying why (killed?)" in dead_job("m", {"progress": {"state": "running"}}, 1)


def probe_state(dest, rev, stage, endpoint="http://127.0.0.1:9"):
    spec = [{"name": "m", "dest": str(dest), "repo": "org/m", "revision": rev, "include": [],
             "endpoint": endpoint, "stage": str(stage), **NAMES}]
    return parse_probe(subprocess.run([sys.executable, fetcher.__file__, "probe", blob(spec)], capture_output=True,
                                      text=True).stdout.splitlines())["models"]["m"]


def blob(value) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def test_a_revision_change_fetches_beside_the_served_one_then_switches_in_one_rename(local_hub, tmp_path):
    endpoint, rev1, hub = local_hub
    dest = tmp_path / "m"
    job_for(dest, endpoint, rev1)
    assert run_fetch(dest).returncode == 0
    new_config = tmp_path / "config.json"
    new_config.write_text('{"a": 2}\n')
    src = hub.MODELS / "org/m"
    files = {p: src / p for p in ("big.bin", "m-00001-of-00002.gguf", "m-00002-of-00002.gguf")}
    keep = {p: tmp_path / ("keep-" + p) for p in files}
    for p, f in files.items():  # publish() empties the repo's tree first
        keep[p].write_bytes(f.read_bytes())
    rev2 = hub.publish("org/m", {**keep, "config.json": new_config})
    stage1, stage2 = revision_dir(str(dest), rev1), revision_dir(str(dest), rev2)
    # the probe: the new revision goes to its own directory; every unchanged file is reusable
    state = probe_state(dest, rev2, stage2, endpoint)
    assert state["where"] == stage2 and state["serving"]["revision"] == rev1 and not state["complete"]
    p = plan_model("m", {**ENTRY, "dest": str(dest), "revision": rev2}, state, endpoint=endpoint, source=endpoint,
                   peer=None, workers=2, peer_wait=1)
    assert p.action == "start", p.problems
    assert p.job["dest"] == stage2 and p.job["reuse"] == str(dest)
    assert sorted(state["reusable"]) == sorted(files)   # what the disk check counts as here
    # the job: only config.json comes from the hub, the rest are hard links of the served files
    os.makedirs(f"{stage2}/.rigup-fetch")
    with open(f"{stage2}/.rigup-fetch/job.json", "w") as fh:
        json.dump(dict(p.job, **NAMES), fh)
    result = subprocess.run([sys.executable, fetcher.__file__, "fetch", f"{stage2}/.rigup-fetch/job.json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    progress = json.loads(open(f"{stage2}/.rigup-fetch/progress.json").read())
    print(f"\nrevision change: {progress['fetched']} bytes fetched of {progress['total']}; "
          f"{progress['total'] - progress['fetched']} linked from the revision served")
    assert progress["fetched"] == new_config.stat().st_size
    assert os.stat(f"{stage2}/big.bin").st_ino == os.stat(dest / "big.bin").st_ino
    assert json.loads((dest / MARKER).read_text())["revision"] == rev1  # still served meanwhile
    assert probe_state(dest, rev2, stage2)["staged"]
    # the switch: dest (a directory) exchanged with a link to the new revision's directory
    assert fetcher.main(["switch", blob({"dest": str(dest), "stage": stage2, "previous": stage1})]) == 0
    assert os.readlink(dest) == os.path.basename(stage2)
    assert json.loads((dest / MARKER).read_text())["revision"] == rev2
    assert json.loads(open(f"{stage1}/{MARKER}").read())["revision"] == rev1
    state = probe_state(dest, rev2, stage2)
    assert state["complete"] and state["previous"] == [stage1]
    # back to rev1 (kept): nothing fetched, a link replaced by a link; then rev2's directory pruned
    state = dict(probe_state(dest, rev1, stage1))
    assert state["staged"] and not state["complete"]
    assert fetcher.main(["switch", blob({"dest": str(dest), "stage": stage1, "previous": stage2})]) == 0
    assert os.readlink(dest) == os.path.basename(stage1)
    assert probe_state(dest, rev1, stage1)["previous"] == [stage2]
    spec = {"dest": str(dest), "stage": stage1, "keep": 0}
    assert fetcher.main(["prune", blob(spec)]) == 0
    assert not os.path.exists(stage2) and probe_state(dest, rev1, stage1)["complete"]


def test_metrics_say_each_models_state_and_why_a_job_failed(tmp_path):
    """``rigup-fetch metrics``: one series per state (1: the current one), bytes, a failed job's
    error as a label (escaped), a job whose lock nobody holds as dead; written atomically, and
    nothing at all while the textfile directory is missing."""
    def model(name, marker=None, progress=None):
        dest = tmp_path / name
        (dest / ".rigup-fetch").mkdir(parents=True)
        if marker:
            (dest / MARKER).write_text(json.dumps(marker))
        if progress:
            (dest / ".rigup-fetch" / "progress.json").write_text(json.dumps(progress))
        return {"name": name, "dest": str(dest)}

    models = [model("done", marker={"bytes": 10}),
              model("broke", progress={"state": "failed", "bytes": 4, "total": 10, "updated": 5.5,
                                       "error": 'no space left on device at /x, "2 MiB" more needed'}),
              model("killed", progress={"state": "running", "bytes": 1, "total": 10, "updated": 6}),
              model("new")]
    textfiles = tmp_path / "textfile"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"models": models, "metrics_file": str(textfiles / "rigup_model_fetch.prom"),
                                  "marker": MARKER, "token_file": HF_TOKEN}))
    assert fetcher.main(["metrics", str(config)]) == 0 and not textfiles.exists()
    textfiles.mkdir()
    assert fetcher.main(["metrics", str(config)]) == 0
    assert os.listdir(textfiles) == ["rigup_model_fetch.prom"]
    text = (textfiles / "rigup_model_fetch.prom").read_text()
    print(text)
    current = {ln.split("{")[1].split(",")[0]: ln.split('state="')[1].split('"')[0]
               for ln in text.splitlines() if ln.startswith("rigup_model_fetch_state{") and ln.endswith(" 1")}
    assert current == {'model="done"': "complete", 'model="broke"': "failed", 'model="killed"': "dead",
                       'model="new"': "absent"}
    assert sum(ln.startswith('rigup_model_fetch_state{model="broke"') for ln in text.splitlines()) == len(
        fetcher.FETCH_STATES)
    assert ('rigup_model_fetch_error_info{model="broke",error="no space left on device at /x, \\"2 MiB\\" more '
            'needed"} 1') in text
    assert 'rigup_model_fetch_bytes{model="broke"} 4' in text and 'rigup_model_fetch_total_bytes{model="done"} 10' in text
    assert "rigup_model_fetch_updated_timestamp_seconds{model=\"broke\"} 5.5" in text


def test_the_models_state_is_read_in_preflights_round_trip_unless_a_pin_waits_on_the_hub():
    """model_fetch's plan_reads: the probe of every model goes in preflight's batched read, with
    the specs apply reads with; none while an entry's revision is a branch (its commit, and so its
    specs, are known only once plan_lines asked the hub)."""
    import roles.model_fetch as role
    from rigup.config import role_defaults
    from roles.model_fetch.facts import ModelFetchState

    commit = "a" * 40
    data = {**role_defaults("model_fetch"), "hf_endpoint": "http://hub.invalid",
            "models": {"gemma": {"repo": "lab/gemma", "revision": commit, "size_gib": 0.2}}}
    [(fact, kwargs)] = role.plan_reads(data)
    assert fact is ModelFetchState and [s["revision"] for s in kwargs["specs"]] == [commit]
    assert kwargs == {"specs": role.specs(data, role._models(data))}
    data["models"]["other"] = {"repo": "lab/other", "revision": "main", "size_gib": 0.2}
    assert role.plan_reads(data) == []
