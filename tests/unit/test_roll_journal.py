"""Issue 65: roll.py and its pyinfra die together, and the next roll names what a dead one left
(plays/roll.py's journal, read by rigup/boundary/results.py roll_journal; roll.py dies_with_parent)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from plays import roll
from rigup.boundary import Unreadable, results

ROOT = Path(__file__).resolve().parents[2]


def journal(**over):
    return {"pid": 4_000_000, "started": 1_790_000_000.0, "at": 1_790_000_100.0, "inventory": "inventory/lab.py",
            "batch": ["lab2"], "step": "converging", **over}


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_dead_rolls_journal_is_named_and_its_batch_rolled_first(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path / "cache"))
    path = roll.journal_path()
    assert roll.left_behind(path) == (None, None)
    roll.note(path, journal(pid=dead_pid()))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    dead, bad = roll.left_behind(path)
    assert bad is None and dead["batch"] == ["lab2"] and dead["step"] == "converging"
    assert roll.resumed([["lab1", "lab2"], ["lab3"], ["lab4"]], dead) == [["lab2"], ["lab1"], ["lab3"], ["lab4"]]
    assert roll.resumed([["lab1"]], dead) == [["lab1"]]     # a host no longer rolled is not added
    roll.note(path, journal(pid=os.getppid()))              # a roll that still runs
    with pytest.raises(roll.Running) as running:
        roll.left_behind(path)
    print(running.value)
    assert f"another roll runs (pid {os.getppid()}" in str(running.value)
    path.write_text('{"pid": "x"}')
    assert roll.left_behind(path)[1].startswith(f"controller:{path}: pid")
    roll.note(path, None)
    assert not path.exists()


def test_a_journal_directory_another_user_can_write_is_refused_journal_or_not(tmp_path):
    """Round 3 of issue 61, J7: left_behind said nothing of a 1777 directory without a journal in it,
    and roll.py's first step() then ended with a traceback."""
    d = tmp_path / "j7"
    d.mkdir()
    d.chmod(0o1777)
    for present in (False, True):
        with pytest.raises(roll.Unjournaled) as e:
            roll.left_behind(d / "roll.json")
        assert str(d) in str(e.value) and "set RIGUP_CACHE_DIR" in str(e.value)
        (d / "roll.json").write_text(json.dumps(journal(pid=dead_pid())))
    why = roll.note(d / "roll.json", journal())                # and a write there: said, never raised
    assert why.startswith(f"controller:{d / 'roll.json'}: {d} must be a directory that only you or root can write")
    assert roll.note(d / "roll.json", None) is None and not (d / "roll.json").exists()


def test_a_journal_directory_behind_a_link_of_your_own_is_followed(tmp_path):
    """Round 3 rerun of issue 61, NJ5: since J7's fix, RIGUP_CACHE_DIR a link of one's own to one's own
    0700 directory stopped every roll ('it is a symbolic link'), where owned.write (note) follows a
    link of yours or root's on the journal's path. The link is followed (absolute, relative, a chain)
    to a directory then checked as any other: a 1777 one behind a link is refused as it is without."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("real")
    (tmp_path / "chain").symlink_to("rel")
    for link in ("abs", "rel", "chain"):
        path = tmp_path / link / "roll.json"
        assert roll.left_behind(path) == (None, None)
        assert roll.note(path, journal(pid=dead_pid())) is None
        dead, bad = roll.left_behind(path)
        assert bad is None and dead["batch"] == ["lab2"] and (real / "roll.json").exists()
        assert roll.note(path, None) is None and not (real / "roll.json").exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (tmp_path / "to-shared").symlink_to(shared)
    (tmp_path / "nowhere").symlink_to(tmp_path / "missing")
    for link in ("to-shared", "nowhere"):
        with pytest.raises(roll.Unjournaled) as e:
            roll.left_behind(tmp_path / link / "roll.json")
        print(e.value)
        assert "set RIGUP_CACHE_DIR" in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user's needs root to make")
def test_a_journal_directory_behind_another_users_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "theirs").symlink_to(real)
    os.lchown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(roll.Unjournaled) as e:
        roll.left_behind(tmp_path / "theirs" / "roll.json")
    print(e.value)
    assert "the link" in str(e.value) and "uid 65534" in str(e.value)


@settings(max_examples=80, deadline=1000)
@given(st.fixed_dictionaries({}, optional={k: st.none() | st.booleans() | st.integers(-5, 1 << 70) | st.floats()
                                           | st.text(max_size=20) | st.lists(st.text(max_size=10), max_size=3)
                                           for k in ("pid", "started", "at", "inventory", "batch", "step")}))
def test_any_journal_reads_typed_or_is_refused_naming_where(doc):
    try:
        read = results.roll_journal(doc, "controller:roll.json")
    except Unreadable as e:
        assert e.where.startswith("controller:roll.json") and e.why
        return
    assert isinstance(read["pid"], int) and read["step"] in results.STEPS and all(isinstance(b, str) for b in read["batch"])


def test_pyinfra_dies_with_roll_py_even_by_sigkill(tmp_path):
    """roll.py's child (its pyinfra) started with dies_with_parent: roll.py killed with SIGKILL,
    the child is gone within a second (before: orphaned, writing to a dead pipe)."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys; sys.path.insert(0, %r); import roll; "
        "p = subprocess.Popen(['sleep', '60'], preexec_fn=roll.dies_with_parent); "
        "open(%r, 'w').write(str(p.pid)); p.wait()") % (str(ROOT), str(pidfile))], cwd=ROOT)
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.1)
    child = int(pidfile.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    start = time.monotonic()
    while roll.alive(child) and time.monotonic() - start < 5:
        try:
            os.waitpid(child, os.WNOHANG)   # not ours: reaped by init; alive() sees it gone
        except ChildProcessError:
            pass
        time.sleep(0.05)
    gone = time.monotonic() - start
    print(f"roll.py killed: its child gone after {gone:.2f} s")
    assert not roll.alive(child) or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
