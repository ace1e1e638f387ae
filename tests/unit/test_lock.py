"""rigup/lock.py's lease, its shell run here by bash (a run directory of the test's own): a holder
that renews keeps a waiter out, naming it; one that stops renewing lets a waiter in within its
lease, named as the holder it took the lock from; one killed with -9 lets go at once."""

import os
import signal
import subprocess
import time

from rigup import lock
from rigup.lock import holder_command, renew

LEASE = 3
GRACE = 2   # the live holder's waiter's lock.GRACE_S (5 on a host): the same rule, 3 s sooner


class Pipe:
    """A holder's stdin as the channel renew() writes to."""

    def __init__(self, proc):
        self.proc = proc

    def sendall(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()


def start(owner, run_dir):
    proc = subprocess.Popen(["bash", "-c", holder_command(owner, lease=LEASE, run_dir=str(run_dir))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc


def answer(proc, timeout=30):
    t0 = time.monotonic()
    first = proc.stdout.readline().decode().strip()
    return first, time.monotonic() - t0


def test_lease_live_holder_lapsed_holder_killed_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "GRACE_S", GRACE)
    live = start("ops@a (pid 1)", tmp_path)
    assert answer(live)[0] == "locked"
    renew(Pipe(live), every=0.5)
    waiter = start("ops@b (pid 2)", tmp_path)
    line, seconds = answer(waiter)
    # the rest from the same buffered reader (communicate() reads the pipe itself: what readline
    # buffered with the first line, the owner when bash wrote both at once, was lost)
    waiter.stdin.close()
    rest = waiter.stdout.read().decode()
    waiter.wait(timeout=30)
    print(f"\nlive holder: the waiter was refused after {seconds:.1f} s: {line} {rest.strip()}")
    assert line == "busy" and rest.strip() == "ops@a (pid 1)"
    assert GRACE - 1 <= seconds < GRACE + 6   # a loaded machine: the next renewal, a second

    # the renewals stop (a controller cut off): the next one is let in within the lease
    pipe, live.stdin = live.stdin, open(os.devnull, "wb")   # renew()'s writes go nowhere from now on
    monkeypatch.undo()   # the host's grace again (5 s, past the 3 s lease): a renewal read late never refuses the taker
    t0 = time.monotonic()
    taker = start("ops@c (pid 3)", tmp_path)
    line, _ = answer(taker)
    seconds = time.monotonic() - t0
    print(f"stale holder: let in after {seconds:.1f} s: {line}")
    assert line.startswith("locked; took it from ops@a (pid 1), whose lease lapsed (no renewal for 3 s since ")
    assert seconds < LEASE + 5
    assert live.wait(timeout=5) == 0
    pipe.close()

    # a holder killed with -9: the next one is let in at once, and names nobody
    taker.send_signal(signal.SIGKILL)
    taker.wait(timeout=5)
    t0 = time.monotonic()
    after = start("ops@d (pid 4)", tmp_path)
    line, _ = answer(after)
    print(f"killed holder: let in after {time.monotonic() - t0:.1f} s: {line}")
    assert line == "locked" and time.monotonic() - t0 < 4
    after.stdin.close()                          # a run that ends: the lock is free, its owner gone
    assert after.wait(timeout=5) == 0
    assert not (tmp_path / "converge.owner").exists()


def test_a_run_directory_of_another_users_is_refused_and_its_links_never_followed(tmp_path):
    """Issue 61, round 6 LK2: a /run/rigup that another user made first (its converge.owner a link to
    root's file) had root's owner line written through the link. Now the shell refuses it, naming it;
    so too a run directory others may write, or a link to a directory."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    theirs, shared, linked = tmp_path / "theirs", tmp_path / "shared", tmp_path / "linked"
    theirs.mkdir()
    os.symlink(victim, theirs / "converge.owner")
    shared.mkdir()
    shared.chmod(0o1777)
    os.symlink(tmp_path / "shared", linked)
    cases = [shared, linked] + ([theirs] if os.geteuid() == 0 else [])
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)
    for run_dir in cases:
        done = subprocess.run(["bash", "-c", holder_command("op@ctl", lease=LEASE, run_dir=str(run_dir))],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        print(run_dir.name, done.returncode, done.stdout.strip())
        assert done.returncode == 1 and "is not this user's alone" in done.stdout and "remove it" in done.stdout
        assert not (run_dir / "converge.flock").exists()
    assert victim.read_text() == "root's\n"
