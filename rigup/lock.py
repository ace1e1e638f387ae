"""One controller at a time per host: a converge holds the host's lock for as long as its SSH
connection lives, and a second controller is refused, naming the first.

The lock is ``flock`` on ``/run/rigup/converge.flock``, held by a shell in an SSH channel of its
own that only waits for the channel to close: when the run ends, or its controller dies, sshd
closes the channel and the lock is free again; nothing can be left stale (a file-based lease would
be, after a crash). Written here because pyinfra has no cross-run host lock."""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import sys
import time

LOCK = "/run/rigup/converge.flock"
OWNER = "/run/rigup/converge.owner"
GRACE_S = 5  # seconds a converge waits for the lock before it is refused
_held: dict[str, object] = {}  # host name -> the open channel that holds its lock


def holder_command(owner: str, sudo: bool = False) -> str:
    """Shell that takes the lock and keeps it until its stdin closes (printing ``locked``), or
    prints ``busy`` and who holds it."""
    q = shlex.quote
    hold = f"printf '%s\\n' {q(owner)} > {OWNER}; echo locked; exec cat >/dev/null"
    # a few seconds' grace: sshd may still be ending the channel of a run that just finished
    inner = (f"mkdir -p /run/rigup && exec 9>>{LOCK} && "
             f"if flock -w {GRACE_S} 9; then {hold}; else echo busy; cat {OWNER} 2>/dev/null; fi")
    return ("sudo -n " if sudo else "") + f"sh -c {q(inner)}"


def hold(host, timeout: float = 15) -> str | None:
    """Take ``host``'s converge lock for the rest of this run. None when this run holds it (or the
    host is not reached over SSH, or this is a --dry run, which changes nothing); else who holds it."""
    client = getattr(host.connector, "client", None)
    if client is None or "--dry" in sys.argv or host.name in _held:
        return None
    owner = (f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()}, since "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    channel = client.get_transport().open_session()
    channel.exec_command(holder_command(owner, sudo=bool(host.data.get("_sudo"))))
    channel.settimeout(timeout)
    answer = b""
    while b"\n" not in answer:
        chunk = channel.recv(1024)
        if not chunk:
            break
        answer += chunk
    if answer.startswith(b"locked"):
        _held[host.name] = channel
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
    holder = text.partition("\n")[2].strip()
    return holder or "another run (its owner did not say)"
