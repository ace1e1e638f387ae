"""Root never follows what the rigup user places (rigup/nofollow.py), with real files: a model's
directory owned by another user (nobody), a symlink to a root-only file and FIFOs planted in it;
the probe, the metrics, prune, the shell reads, the job's files and the smoke's marker read
follow none, block on none, and the probe names each plant. Needs root (skipped otherwise)."""

import base64
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from rigup.names import HF_TOKEN, MARKER
from rigup.nofollow import FUNCTIONS, read_file
from roles.llama_cpp.shipped import smoke
from roles.model_fetch import job_written
from roles.model_fetch.shipped import fetcher
from roles.model_fetch.facts import parse_probe
from roles.model_fetch.plan import plan_model

REV = "a" * 40
SECRET = "root only 5f3c\n"
USER = "nobody"


@pytest.fixture
def place():
    """(dest, secret, root_dir): an empty model directory of nobody's under root's directories,
    a root-only file and a root-only directory next to them."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a directory of another user's, planted in")
    base = tempfile.mkdtemp(dir="/var/tmp", prefix="rigup-nofollow-")
    os.chmod(base, 0o755)
    models = os.path.join(base, "models")
    os.mkdir(models, 0o755)
    dest, secret, root_dir = os.path.join(models, "m"), os.path.join(base, "secret"), os.path.join(base, "root-dir")
    os.mkdir(dest)
    os.chown(dest, pwd.getpwnam(USER).pw_uid, pwd.getpwnam(USER).pw_gid)
    with open(secret, "w") as f:
        f.write(SECRET)
    os.chmod(secret, 0o600)
    os.mkdir(root_dir, 0o700)
    yield dest, secret, root_dir
    shutil.rmtree(base)


def owned(path: str) -> None:
    nobody = pwd.getpwnam(USER)
    os.lchown(path, nobody.pw_uid, nobody.pw_gid)


def link(target: str, path: str) -> None:
    os.symlink(target, path)
    owned(path)


def fifo(path: str) -> None:
    os.mkfifo(path)
    owned(path)


def fingerprint(*paths) -> list:
    return [(p, oct(os.lstat(p).st_mode), os.lstat(p).st_uid, sorted(os.listdir(p)) if os.path.isdir(p)
             else open(p).read()) for p in paths]


def probe(dest: str) -> tuple[dict, str, float]:
    spec = [{"name": "m", "dest": dest, "repo": "org/m", "revision": REV, "include": [], "no_hub": True,
             "endpoint": "http://127.0.0.1:9", "stage": os.path.join(os.path.dirname(dest), f".m@{REV[:12]}"),
             "marker": MARKER, "token_file": HF_TOKEN}]
    start = time.monotonic()
    out = subprocess.run([sys.executable, fetcher.__file__, "probe", base64.b64encode(json.dumps(spec).encode())],
                         capture_output=True, text=True, timeout=30)
    return parse_probe(out.stdout.splitlines())["models"]["m"], out.stdout + out.stderr, time.monotonic() - start


def test_the_probe_reads_as_the_directorys_owner_and_names_every_plant(place):
    dest, secret, root_dir = place
    work = os.path.join(dest, ".rigup-fetch")
    os.mkdir(work)
    owned(work)
    link(secret, os.path.join(dest, MARKER))
    for name in ("job.json", "progress.json", "state.json"):
        link(secret, os.path.join(work, name))
    fifo(os.path.join(work, "lock"))
    link(root_dir, os.path.join(work, "parts"))
    before = fingerprint(secret, root_dir)
    state, output, seconds = probe(dest)
    print(f"\nprobe with 6 plants: {seconds:.2f} s, planted: {state['planted']}")
    assert seconds < 10 and SECRET.strip() not in output
    assert state["marker"] is None and state["job"] is None and state["progress"] is None and not state["running"]
    assert {p: w for p, w in state["planted"]} == {
        os.path.join(dest, MARKER): f"a symlink to {secret}", **{os.path.join(work, n): f"a symlink to {secret}"
                                                                for n in ("job.json", "progress.json", "state.json")},
        os.path.join(work, "lock"): "a FIFO", os.path.join(work, "parts"): f"a symlink to {root_dir}"}
    p = plan_model("m", {"repo": "org/m", "revision": REV, "include": [], "dest": dest}, state, endpoint="http://hub",
                   source="http://hub", peer=None, workers=1, peer_wait=1)
    assert p.action == "refused" and len(p.problems) == 6
    assert all(key == "models.m.dest" and "which rigup never makes there" in why for key, why in p.problems)
    assert fingerprint(secret, root_dir) == before


def test_a_fifo_or_a_link_for_the_job_directory_itself_is_named(place):
    dest, secret, root_dir = place
    fifo(os.path.join(dest, ".rigup-fetch"))
    state, _, seconds = probe(dest)
    assert [w for _, w in state["planted"]] == ["a FIFO"] and seconds < 10
    os.unlink(os.path.join(dest, ".rigup-fetch"))
    link(root_dir, os.path.join(dest, ".rigup-fetch"))
    state, _, _ = probe(dest)
    assert state["planted"] == [[os.path.join(dest, ".rigup-fetch"), f"a symlink to {root_dir}"]]
    os.unlink(os.path.join(dest, ".rigup-fetch"))
    os.mkdir(os.path.join(dest, ".rigup-fetch"))    # root's: whoever else owns a name there could replace it
    os.chown(os.path.join(dest, ".rigup-fetch"), 1, 1)
    assert probe(dest)[0]["planted"] == [[os.path.join(dest, ".rigup-fetch"), "owned by uid 1"]]


def test_a_parent_another_user_can_write_is_named(place):
    dest, _, _ = place
    models = os.path.dirname(dest)
    assert fetcher.unsafe_parent(dest) is None   # under /var/tmp (sticky), in root's directory there
    os.chmod(models, 0o777)
    assert "can be written by others than root" in fetcher.unsafe_parent(dest) and "mode 777" in fetcher.unsafe_parent(dest)
    os.chmod(models, 0o1777)   # sticky, but dest's own parent: anyone could make dest first
    assert "mode 1777" in fetcher.unsafe_parent(dest)
    os.chmod(models, 0o755)
    os.chown(models, pwd.getpwnam(USER).pw_uid, -1)
    assert f"owner uid {pwd.getpwnam(USER).pw_uid}" in fetcher.unsafe_parent(dest)
    assert "anyone can make it first" in fetcher.unsafe_parent("/var/tmp/rigup-no-such-dir/models/m")
    assert probe(dest)[0]["unsafe_parent"]


def test_metrics_and_prune_end_at_once_on_fifos(place, tmp_path):
    dest, secret, _ = place
    work = os.path.join(dest, ".rigup-fetch")
    os.mkdir(work)
    owned(work)
    fifo(os.path.join(dest, MARKER))
    fifo(os.path.join(work, "progress.json"))
    fifo(os.path.join(work, "lock"))
    config = tmp_path / "metrics.json"
    out = tmp_path / "prom" / "rigup_model_fetch.prom"
    out.parent.mkdir()
    config.write_text(json.dumps({"models": [{"name": "m", "dest": dest}], "metrics_file": str(out), **{
        "marker": MARKER, "token_file": HF_TOKEN}}))
    start = time.monotonic()
    run = subprocess.run([sys.executable, fetcher.__file__, "metrics", str(config)], capture_output=True, text=True,
                         timeout=30)
    metrics_s = time.monotonic() - start
    assert run.returncode == 0, run.stderr
    assert 'rigup_model_fetch_state{model="m",state="absent"} 1' in out.read_text()
    old = os.path.join(os.path.dirname(dest), ".m@" + "b" * 12)     # an old revision, the user's, planted in
    os.makedirs(os.path.join(old, ".rigup-fetch"))
    for d in (old, os.path.join(old, ".rigup-fetch")):
        owned(d)
    fifo(os.path.join(old, ".rigup-fetch", "lock"))
    link(secret, os.path.join(old, "weights.gguf"))
    spec = {"name": "m", "dest": dest, "revision": REV, "stage": os.path.join(os.path.dirname(dest), f".m@{REV[:12]}"),
            "keep": 0, "marker": MARKER, "token_file": HF_TOKEN}
    start = time.monotonic()
    run = subprocess.run([sys.executable, fetcher.__file__, "prune", base64.b64encode(json.dumps(spec).encode())],
                         capture_output=True, text=True, timeout=30)
    prune_s = time.monotonic() - start
    print(f"\nmetrics on 3 FIFOs: {metrics_s:.2f} s; prune of a revision with a FIFO lock and a link: {prune_s:.2f} s")
    assert run.returncode == 0 and f"removed {old}" in run.stdout, run.stderr
    assert not os.path.lexists(old) and open(secret).read() == SECRET and metrics_s < 10 and prune_s < 10


def test_the_shell_reads_as_the_owner_never_through_a_link_never_from_a_fifo(place):
    dest, secret, _ = place
    marker = os.path.join(dest, MARKER)
    results = {}
    for kind in ("file", "link", "fifo", "hard link"):
        if os.path.lexists(marker):
            os.unlink(marker)
        if kind == "file":
            with open(marker, "w") as f:
                f.write('{"revision": "x"}')
            owned(marker)
        elif kind == "link":
            link(secret, marker)
        elif kind == "fifo":
            fifo(marker)
        else:
            os.link(secret, marker)   # root may; the user could only where protected_hardlinks is 0
        start = time.monotonic()
        out = subprocess.run(["sh", "-c", f"{FUNCTIONS}; {read_file(dest, marker)}"], capture_output=True, text=True,
                             timeout=20)
        results[kind] = (out.stdout, round(time.monotonic() - start, 2))
    print(f"\n{results}")
    assert results["file"][0] == '{"revision": "x"}'
    assert results["link"][0] == results["fifo"][0] == results["hard link"][0] == ""
    assert all(seconds < 5 for _, seconds in results.values())


def test_the_job_files_are_made_by_the_user_and_a_plant_is_never_followed(place):
    dest, secret, root_dir = place
    job = '{"name": "m"}\n'
    os.rmdir(dest)       # made by root (install -d, owned by the user), inside it all by the user

    def run():
        command = job_written(dest, job, USER)
        return subprocess.run(["sh", "-c", command.get_raw_value()], input=job, capture_output=True, text=True,
                              timeout=30)
    assert run().returncode == 0
    path = os.path.join(dest, ".rigup-fetch", "job.json")
    assert open(path).read() == job and os.stat(path).st_uid == os.stat(dest).st_uid == pwd.getpwnam(USER).pw_uid
    os.unlink(path)
    link(secret, path)                         # replaced, never written through
    assert run().returncode == 0 and not os.path.islink(path) and open(secret).read() == SECRET
    shutil.rmtree(os.path.join(dest, ".rigup-fetch"))
    link(root_dir, os.path.join(dest, ".rigup-fetch"))   # before: install -d chowned the link's target
    failed = run()
    print(f"\n.rigup-fetch a link to a root directory: exit {failed.returncode}: {failed.stderr.strip()[:200]}")
    assert failed.returncode != 0
    assert (stat.S_IMODE(os.stat(root_dir).st_mode), os.stat(root_dir).st_uid, os.listdir(root_dir)) == (0o700, 0, [])


def test_the_smoke_takes_no_marker_through_a_link_or_from_a_fifo(place):
    dest, secret, _ = place
    marker = os.path.join(dest, MARKER)
    spec = {"tiny": "/opt/tiny.gguf", "max_model_bytes": 1 << 40}
    with open(secret, "w") as f:
        f.write(json.dumps({"files": ["m.gguf"], "bytes": 1}))
    link(secret, marker)
    assert smoke.model_of({"marker": marker}, spec) == spec["tiny"]
    os.unlink(marker)
    fifo(marker)
    start = time.monotonic()
    assert smoke.model_of({"marker": marker}, spec) == spec["tiny"] and time.monotonic() - start < 1
    os.unlink(marker)
    with open(marker, "w") as f:
        f.write(json.dumps({"files": ["m.gguf"], "bytes": 1}))
    with open(os.path.join(dest, "m.gguf"), "w") as f:   # the bound is the file's own size (re5 N23)
        f.write("x")
    assert smoke.model_of({"marker": marker}, spec) == os.path.join(dest, "m.gguf")


def test_without_systemd_the_job_files_are_roots_in_roots_directory(tmp_path):
    """A host without systemd runs the job as root: its directory is root's, made by root."""
    dest, job = str(tmp_path / "m"), '{"name": "m"}\n'
    command = job_written(dest, job, None)
    assert "runuser" not in command.get_raw_value() and "install -d" not in command.get_raw_value()
    run = subprocess.run(["sh", "-c", command.get_raw_value()], input=job, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert open(os.path.join(dest, ".rigup-fetch", "job.json")).read() == job


def test_the_table_is_held_to_the_code():
    """rigup/nofollow.py PLACES names code that exists (each ``file:name`` defined there), and every
    module that reads or writes what another user can place (it uses rigup.nofollow's shell
    functions, an O_NOFOLLOW open, runuser or setpriv) is in the table: a new place cannot be added
    without its row."""
    import re
    from pathlib import Path

    from rigup.nofollow import PLACES

    root = Path(__file__).resolve().parents[2]
    named = set()
    for place in PLACES:
        for ref in place.code.split(", "):
            path, name = ref.split(":")
            text = (root / path).read_text()
            assert re.search(rf"^\s*(def|class) {name}\b|^\s*(config\.)?{name} = ", text, re.M), ref
            named.add(path)
    sources = [p for d in ("roles", "rigup", "plays", "shipped") for p in (root / d).rglob("*.py")] + list(root.glob("*.py"))
    users = {str(p.relative_to(root)) for p in sources if p.name != "nofollow.py"
             and re.search(r"rigup\.nofollow|import nofollow|O_NOFOLLOW|\brunuser\b|\bsetpriv\b|TEMP_DIR", p.read_text())}
    checks_only = {"roles/model_fetch/checks.py"}   # refuses a dest; reads nothing on a host
    # the controller's own files named by configuration: rigup/boundary/owned.py's rule (docs/boundary.md)
    checks_only |= {"rigup/boundary/owned.py", "rigup/secrets.py"}
    print(f"{len(PLACES)} places in {len(named)} files; modules meeting the rigup user's files: {len(users)}")
    assert users - named - checks_only == set()
