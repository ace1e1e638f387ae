"""A model's completion marker and its job's progress.json, which the rigup user can write, read by
a typed reader wherever they are read (issue 61, round 4: F1, F5, F11, S1, S3, S6): on the controller
by the boundary's (rigup.boundary.results.marker, hosttext.download_progress: roles/model_fetch/facts.py
read_markers, read_progress); on the host by rigup-fetch's own copies (fetcher.py marker_of,
progress_of), held here within the boundary's: what the host takes, the controller takes alike."""

import base64
import http.client
import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary import fields, results
from rigup.boundary.hosttext import download_progress
from rigup.names import HF_TOKEN, MARKER
from roles.model_fetch.shipped import fetcher
from roles.model_fetch.facts import parse_probe
from roles.model_fetch.plan import plan_model, progress_line

REV = "0123456789abcdef0123456789abcdef01234567"
NAMES = {"marker": MARKER, "token_file": HF_TOKEN}
SCRIPT = os.path.join(os.path.dirname(fetcher.__file__), "fetcher.py")


def probed(dest, **marker) -> dict:
    """rigup-fetch probe run as on a host for model m at ``dest`` holding ``marker``, read by parse_probe."""
    os.makedirs(f"{dest}/.rigup-fetch", exist_ok=True)
    (dest / MARKER).write_text(json.dumps({"repo": "org/m-GGUF", "revision": REV, "files": [], **marker}))
    (dest / ".rigup-fetch" / "job.json").write_text(json.dumps({"include": []}))
    spec = {"name": "m", "dest": str(dest), "repo": "org/m-GGUF", "revision": REV, "include": [],
            "endpoint": "http://127.0.0.1:9", "stage": None, "no_hub": True, **NAMES}
    out = subprocess.run([sys.executable, SCRIPT, "probe", base64.b64encode(json.dumps([spec]).encode())],
                         capture_output=True, text=True, check=True)
    return parse_probe(out.stdout.splitlines())["models"]["m"]


@pytest.mark.parametrize("marker", [{"bytes": "lots"}, {"bytes": [1]}, {"bytes": -1}, {"files": 5},
                                    {"files": ["/etc/shadow"]}, {"schema": 2}])
def test_F1_a_marker_that_does_not_read_is_no_marker_and_the_model_is_fetched_again(tmp_path, marker):
    """F1: bytes "lots" ended model_fetch's apply in TypeError (plan.py progress_line), for every host."""
    state = probed(tmp_path / "m", **marker)
    got = plan_model("m", {"repo": "org/m-GGUF", "revision": REV, "include": [], "dest": str(tmp_path / "m")},
                     state, endpoint="x", source="x", peer=None, workers=1, peer_wait=1)
    print(marker, "->", got.action, got.line, got.problems)
    assert state["marker"] is None and not state["complete"] and got.action != "complete"


def test_F2_a_marker_without_bytes_reads_complete(tmp_path):
    """F2: a marker with no bytes (each field is optional to the boundary's reader) was a KeyError."""
    state = probed(tmp_path / "m")
    line = progress_line("m", state)
    print(line)
    assert state["complete"] and line.startswith("model m: complete, 0 file(s), 0 B")


@pytest.mark.parametrize("forged", [{"bytes": "lots"}, {"files": ["../x"]}, [1], "x"])
def test_a_forged_probe_marker_refuses_the_model_naming_the_file(forged):
    """The controller's reader of what the probe printed: a marker the boundary does not read (which
    rigup-fetch never prints) refuses that model, naming the marker's file; no crash of the converge."""
    line = "##rigup-model " + json.dumps({"name": "m", "dest": "/srv/m", "where": "/srv/m", "complete": True,
                                          "marker": forged, "job": [1]})
    state = parse_probe([line])["models"]["m"]
    got = plan_model("m", {"repo": "o/m", "revision": REV, "include": [], "dest": "/srv/m"}, state,
                     endpoint="x", source="x", peer=None, workers=1, peer_wait=1)
    print(forged, "->", got.action, got.problems)
    assert got.action == "refused" and f"/srv/m/{MARKER}" in got.problems[0][1] and state["job"] is None


def metrics_of(tmp_path, progress) -> str:
    a, b = tmp_path / "a", tmp_path / "b"
    os.makedirs(a / ".rigup-fetch"), os.makedirs(b), os.makedirs(tmp_path / "prom")
    (a / ".rigup-fetch" / "progress.json").write_text(json.dumps(progress))
    (b / MARKER).write_text(json.dumps({"repo": "r/m", "revision": "0" * 40, "files": [], "bytes": 5}))
    (tmp_path / "cfg.json").write_text(json.dumps({"metrics_file": str(tmp_path / "prom" / "m.prom"), **NAMES,
                                                   "models": [{"name": "a", "dest": str(a)},
                                                              {"name": "b", "dest": str(b)}]}))
    assert fetcher.main(["metrics", str(tmp_path / "cfg.json")]) == 0
    return (tmp_path / "prom" / "m.prom").read_text()


@pytest.mark.parametrize("progress", [{"state": "running", "bytes": "lots"}, [1], {"updated": [1]},
                                      {"updated": "nan"}, {"bytes": 5, "total": 2}, {"rate": 1e999}])
def test_F5_one_models_progress_that_does_not_read_is_unreadable_and_the_others_are_written(tmp_path, progress):
    """F5: progress.json {"bytes": "lots"} (or [1], {"updated": [1]}) ended rigup-model-metrics for every model."""
    text = metrics_of(tmp_path, progress)
    print(progress, "->", [ln for ln in text.splitlines() if ln.endswith(" 1") and "state=" in ln])
    assert 'rigup_model_fetch_state{model="a",state="unreadable"} 1' in text
    assert 'rigup_model_fetch_state{model="b",state="complete"} 1' in text and "nan" not in text.lower()


def test_F11_a_marker_whose_files_are_no_list_is_skipped_and_the_next_model_warmed(tmp_path, monkeypatch, capsys):
    """F11: a marker {"files": 5} ended the warm pass before the next model (TypeError)."""
    os.makedirs(tmp_path / "a"), os.makedirs(tmp_path / "b")
    (tmp_path / "a" / MARKER).write_text(json.dumps({"files": 5}))
    (tmp_path / "b" / "x.gguf").write_text("x")
    (tmp_path / "b" / MARKER).write_text(json.dumps({"repo": "o/b", "revision": REV, "files": ["x.gguf"]}))
    (tmp_path / "cfg.json").write_text(json.dumps({**NAMES, "models": [{"name": "a", "dest": str(tmp_path / "a")},
                                                                       {"name": "b", "dest": str(tmp_path / "b")}]}))
    monkeypatch.setattr(fetcher, "VMTOUCH", "/bin/true")
    assert fetcher.main(["warm", str(tmp_path / "cfg.json")]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "a: its marker does not read (files: not a list of at most 65536), skipped" in out and "b: 1 file(s) in the page cache" in out


@pytest.fixture
def share(tmp_path, monkeypatch):
    """A share server over model directories o (a marker without repo) and m; get(path, range) -> (status, body)."""
    os.makedirs(tmp_path / "m"), os.makedirs(tmp_path / "o"), os.makedirs(tmp_path / "cred")
    (tmp_path / "cred" / "share-token").write_text("tok")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "cred"))
    (tmp_path / "o" / MARKER).write_text(json.dumps({"files": ["y"]}))
    (tmp_path / "share.json").write_text(json.dumps({"dests": [str(tmp_path / "o"), str(tmp_path / "m")], **NAMES}))
    monkeypatch.setattr(fetcher.ShareHandler, "config_path", str(tmp_path / "share.json"))
    server = fetcher._Server(("127.0.0.1", 0), fetcher.ShareHandler, fetcher.Run().named(NAMES))
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def get(path, headers=()):
        c = http.client.HTTPConnection(*server.server_address, timeout=10)
        c.request("GET", path, headers={"Authorization": "Bearer tok", **dict(headers)})
        r = c.getresponse()
        return r.status, r.read()
    yield tmp_path / "m", get
    server.shutdown()


def test_S3_a_marker_without_repo_leaves_the_other_models_served(share):
    """S3: one marker without repo/revision was a KeyError in _models: every request died."""
    dest, get = share
    (dest / "x.gguf").write_text("x")
    (dest / MARKER).write_text(json.dumps({"repo": "o/m", "revision": "a" * 40, "files": ["x.gguf"]}))
    got = get(f"/o/m/resolve/{'a' * 40}/x.gguf")
    print(got)
    assert got == (200, b"x")


def test_S1_the_share_server_serves_no_file_outside_the_model_and_none_through_a_link(share, tmp_path):
    """S1: a marker naming an absolute path, or a link planted as model.gguf, served another file."""
    dest, get = share
    (tmp_path / "secret").write_text("NOT-A-MODEL\n")
    os.symlink(tmp_path / "secret", dest / "model.gguf")
    (dest / MARKER).write_text(json.dumps({"repo": "o/m", "revision": "a" * 40,
                                           "files": ["model.gguf", str(tmp_path / "secret")]}))
    absolute = get(f"/o/m/resolve/{'a' * 40}/{tmp_path / 'secret'}")
    (dest / MARKER).write_text(json.dumps({"repo": "o/m", "revision": "a" * 40, "files": ["model.gguf"]}))
    linked = get(f"/o/m/resolve/{'a' * 40}/model.gguf")
    print("absolute:", absolute, "link:", linked)
    assert absolute[0] == 404 and linked[0] == 404 and b"NOT-A-MODEL" not in absolute[1] + linked[1]


def test_S6_a_range_of_5000_digits_is_416(share):
    """S6: int() of 5000 digits raised ValueError out of the request's thread (no answer at all)."""
    dest, get = share
    (dest / "x.gguf").write_text("x")
    (dest / MARKER).write_text(json.dumps({"repo": "o/m", "revision": "a" * 40, "files": ["x.gguf"]}))
    got = get(f"/o/m/resolve/{'a' * 40}/x.gguf", {"Range": "bytes=" + "9" * 5000 + "-"})
    print(got)
    assert got[0] == 416


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2, 2**61) | st.floats() | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=8)
paths = st.text(max_size=12) | st.sampled_from(["a.gguf", "d/a.gguf", "../a", "/a", "a/./b", "a\u202eb", "\ud800",
                                                "x" * 256, ".rigup-x", " a", "a\\b"])
markers = st.fixed_dictionaries({}, optional={"files": st.lists(paths, max_size=3) | json_values,
                                              "repo": st.text(max_size=8) | json_values,
                                              "revision": st.text(max_size=8) | json_values,
                                              "bytes": st.integers(-1, 2**61) | json_values,
                                              "schema": st.integers(0, 3) | json_values})


progresses = st.fixed_dictionaries({}, optional={k: json_values | st.integers(0, 2**57) | st.floats()
                                                  for k in ("state", "bytes", "total", "rate", "eta", "updated")}
                                   | {"error": json_values, "state": st.sampled_from(["running", "Failed", "x" * 17])})
# the host's reader, the boundary's, and the fields both give (with the boundary's value of one absent)
READERS = {"marker": (fetcher.marker_of, results.marker, {"files": None, "repo": None, "revision": None, "bytes": None}),
           "progress": (fetcher.progress_of, download_progress, {"state": None, "bytes": 0, "total": 0})}


@settings(max_examples=400, deadline=1000)
@given(st.tuples(st.just("marker"), markers | json_values) | st.tuples(st.just("progress"), progresses | json_values))
def test_the_hosts_readers_take_only_what_the_boundarys_take_alike(case):
    kind, doc = case
    host, boundary, shared = READERS[kind]
    if host(doc) is not None:
        typed = boundary(doc, kind)
        assert all(typed.get(k) == doc.get(k, absent) for k, absent in shared.items()), (kind, doc, typed)


@settings(max_examples=300, deadline=1000)
@given(paths)
def test_a_path_the_host_takes_is_one_the_boundary_takes(path):
    if fetcher.unsafe_path(path) is None:
        assert fields.inside(path, "p") == path
    else:
        with pytest.raises(Exception):
            fetcher.safe_join("/srv/m", path)


def test_status_reads_the_marker_as_the_probe_does():
    """status.py's cheaper read (facts.py parse_progress): a marker naming the pinned revision whose
    bytes is text is not complete there either."""
    from roles.model_fetch.facts import parse_progress
    spec = {"name": "m", "dest": "/srv/m", "repo": "o/m", "revision": REV}
    good, bad = ({"repo": "o/m", "revision": REV, "files": [], "bytes": b} for b in (5, "lots"))
    got = [parse_progress(["@@ m", f"marker={json.dumps(m)}", "progress="], [spec])["m"]["complete"] for m in (good, bad)]
    print(got)
    assert got == [True, False]


# round 34 M34a: each field of the probe's line that the plan reads, mistyped (the red team's shapes): the model
# refused naming the field; before, each raised inside the plan, and the run ended for every host
FORGED = [("damaged", [1, 2]), ("damaged", {"a": 1}), ("planted", 5), ("planted", ["abc"]), ("have_bytes", "x"),
          ("free_bytes", "lots"), ("reusable", [1]), ("reusable", {"m.gguf": "x"}), ("hub_error", "boom"),
          ("hub_error", {"message": 5}), ("hub_error", {"status": "404", "message": "x"}), ("complete", "yes"),
          ("where", ["/srv"]), ("free_bytes", 1e400), ("have_bytes", True)]


@pytest.mark.parametrize("field, value", FORGED)
def test_a_mistyped_field_of_the_probe_refuses_that_model_naming_it(field, value):
    line = "##rigup-model " + json.dumps({"name": "m", "dest": "/srv/m", "where": "/srv/m", "complete": False,
                                          "have_bytes": 0, "free_bytes": 10, field: value})
    state = parse_probe([line])["models"]["m"]
    got = plan_model("m", {"repo": "o/m", "revision": REV, "include": [], "dest": "/srv/m"}, state,
                     endpoint="x", source="x", peer=None, workers=1, peer_wait=1)
    print(field, value, "->", got.action, got.problems)
    why = "the probe's model line: not JSON (Infinity" if value == 1e400 else f"model m: the probe's line: {field}"
    assert got.action == "refused" and why in got.problems[0][1]


@settings(max_examples=80, deadline=2000)
@given(st.dictionaries(st.sampled_from(sorted({f for f, _ in FORGED} | {"staged", "running", "previous", "unsafe_parent",
                                                                        "probe_error", "hub_files"})),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                               max_size=3), max_leaves=8)))
def test_any_probe_line_is_planned_or_refused_never_a_traceback(fields):
    line = "##rigup-model " + json.dumps({"name": "m", "dest": "/srv/m", **fields}, allow_nan=True)
    state = parse_probe([line])["models"].get("m")
    got = plan_model("m", {"repo": "o/m", "revision": REV, "include": [], "dest": "/srv/m"}, state or {},
                     endpoint="x", source="x", peer=None, workers=1, peer_wait=1)
    assert got.action in ("refused", "complete", "switch", "start", "running", "restart") and got.line.isprintable()
