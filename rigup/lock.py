"""One controller at a time per host: a converge holds the host's lock as a lease it renews, and a
second controller is refused, naming the first.

The lock is ``flock`` on ``/run/rigup/converge.flock``, held by a shell in an SSH channel of its
own. The controller renews the lease every ``RENEW_S`` seconds (a newline down the channel); the
shell lets go when the channel closes (the run ended, or its controller died: the kernel closes
its TCP connection) or when no renewal came for ``LEASE_S`` seconds (a controller cut off by a
partition, whose connection sshd would keep for hours). A waiter watches the lease: a renewal seen
while it waits means a live holder (refused, naming it); none means a holder that is gone, whose
lock it takes within the lease, naming it. Written here because pyinfra has no cross-run host
lock."""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import sys
import threading
import time

from rigup import run as run_state, summary
from rigup.refusal import Refusal
from rigup.text import say

RUN_DIR = "/run/rigup"
GRACE_S = 5    # seconds a waiter waits before a renewed lease refuses it (sshd may be ending a run)
LEASE_S = 60   # seconds without a renewal after which a holder lets go
RENEW_S = 10   # seconds between renewals


def holder_command(owner: str, sudo: bool = False, lease: int = LEASE_S, run_dir: str = RUN_DIR) -> str:
    """bash that takes the lock and keeps it while renewals (lines on stdin) come, printing
    ``locked`` (and ``; took it from OWNER, ...`` after a holder whose lease lapsed), or prints
    ``busy`` and who holds it."""
    q = shlex.quote
    lock, own = q(f"{run_dir}/converge.flock"), q(f"{run_dir}/converge.owner")
    lapsed, d = q(f"{run_dir}/converge.lapsed"), q(run_dir)
    # the run directory this user's alone (root's on a host), no link: one that another user made
    # first (a package, a unit's RuntimeDirectory=) let its links take root's writes below
    # (converge.owner -> any file: issue 61, round 6 LK2)
    script = f"""
mkdir -p {d} || exit 1
if [ -L {d} ] || [ "$(stat -c %u {d})" != "$(id -u)" ] || [ $(( 0$(stat -c %a {d}) & 022 )) -ne 0 ]; then
  echo {d}" is not this user's alone ($(stat -c '%U:%G mode %a' {d})): remove it (rigup makes it)"; exit 1
fi
exec 9>>{lock} || exit 1
start=$(date +%s)
until flock -n 9; do
  waited=$(( $(date +%s) - start )); renewed=$(stat -c %Y {own} 2>/dev/null || echo 0)
  if {{ [ "$renewed" -gt "$start" ] && [ "$waited" -ge {GRACE_S} ]; }} || [ "$waited" -ge {lease + GRACE_S} ]; then
    echo busy; cat {own} 2>/dev/null; exit 0
  fi
  sleep 1
done
took=""
if [ -s {lapsed} ]; then took="; took it from $(head -n1 {own} 2>/dev/null), $(cat {lapsed})"; fi
printf '%s\\n' {q(owner)} > {own}; rm -f {lapsed}
printf 'locked%s\\n' "$took"
while :; do read -r -t {lease} _; r=$?; [ "$r" -eq 0 ] || break; touch {own}; done
if [ "$r" -gt 128 ]; then
  echo "whose lease lapsed (no renewal for {lease} s since $(date -r {own} '+%Y-%m-%d %H:%M:%S %Z'))" > {lapsed}
else
  rm -f {own}
fi
"""
    return ("sudo -n " if sudo else "") + f"bash -c {q(script)}"


def renew(channel, every: float = RENEW_S) -> None:
    """Send a renewal down ``channel`` every ``every`` seconds until it closes (a thread: a
    greenlet under pyinfra, whose gevent patches threading and time)."""
    def loop():
        while True:
            time.sleep(every)
            try:
                channel.sendall(b"\n")
            except Exception:  # noqa: BLE001 - any end of the channel ends the renewals
                return

    threading.Thread(target=loop, name="rigup-lock-renew", daemon=True).start()


def again(host) -> Refusal | None:
    """Take ``host``'s lock again after it rebooted in this run (roles/nvidia_driver): the lock file
    (/run) and the channel that held it went with the old boot. None when taken; else the refusal
    (another controller took it while the host was down)."""
    channel = run_state.host_run(host).locks.pop(host.name, None)
    if channel is not None:
        channel.close()
    return hold(host)


def _read_line(channel) -> bytes:
    answer = b""
    while b"\n" not in answer:
        chunk = channel.recv(1024)
        if not chunk:
            break
        answer += chunk
    return answer


def hold(host) -> Refusal | None:
    """Take ``host``'s converge lock for the rest of this run. None when this run holds it (or the
    host is not reached over SSH, or this is a --dry run, which changes nothing); else the refusal
    naming who holds it, or saying the lock gave no answer."""
    client = getattr(host.connector, "client", None)
    held = run_state.host_run(host).locks   # host -> the open channel that holds its lock
    if client is None or "--dry" in sys.argv or host.name in held:
        return None
    owner = (f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()}, since "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    wait = LEASE_S + GRACE_S + 15
    channel = client.get_transport().open_session()
    channel.exec_command(holder_command(owner, sudo=bool(host.data.get("_sudo"))))
    channel.settimeout(wait)
    try:
        answer = _read_line(channel)
    except (socket.timeout, TimeoutError):
        channel.close()
        return Refusal("the converge lock gave no answer", f"{RUN_DIR}/converge.flock said nothing within {wait} s",
                       "see that the host is not overloaded, then run again", "lock")
    if answer.startswith(b"locked"):
        held[host.name] = channel
        renew(channel)
        took = answer.decode(errors="replace").strip().partition("; took it from ")[2]
        if took:
            summary.note(host, f"took the converge lock from {took}")
            say(f"[{host.name}] took the converge lock from {took}")
        return None
    text = answer.decode(errors="replace")
    try:
        # to the end of its output: recv returns b"" at once from then on, and a loop waiting for
        # the exit status would spin without ever letting paramiko's transport (a gevent greenlet
        # under pyinfra) run, and so for ever
        while chunk := channel.recv(1024):
            text += chunk.decode(errors="replace")
    except OSError:
        pass
    channel.close()
    if not text.startswith("busy"):
        return Refusal("the converge lock could not be taken", text.strip()[:300] or "the lock's shell said nothing",
                       "see that bash, flock and /run/rigup work on the host", "lock")
    holder = text.partition("\n")[2].strip() or "another run (its owner did not say)"
    return Refusal("another controller converges this host", f"{holder} holds its lock",
                   "wait for that run to end, or stop it", "lock")
