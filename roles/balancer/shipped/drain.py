#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-balancer-drain: a replica leaves or rejoins its balancer's pool (installed by
roles/balancer; the replicas' units of roles/llama_server call it with full privileges), and
HAProxy keeps its servers' state across a reload or a restart (haproxy.service's drop-in,
roles/balancer/config.py).

    rigup-balancer-drain drain BACKEND SERVER       before a stop: no new requests go to SERVER,
                                                    then wait (at most 50 s) for its running ones
    rigup-balancer-drain ready BACKEND SERVER PORT  after a start: wait for 127.0.0.1:PORT/health
                                                    200 (at most 600 s), then back in the pool, then
                                                    wait (at most 120 s) for HAProxy to say UP
    rigup-balancer-drain maint BACKEND SERVER [LEASE_S]
                                                    drain, then out of the pool (maint) until ready;
                                                    with LEASE_S (./roll.py), for that long: unless
                                                    renewed, the server goes back in by itself
                                                    once its /health answers 200 (expire)
    rigup-balancer-drain renew BACKEND SERVER LEASE_S
                                                    the lease, LEASE_S from now (./roll.py, while it
                                                    converges the batch)
    rigup-balancer-drain expire BACKEND SERVER      the lease lapsed (its systemd timer runs it): the
                                                    server back in the pool if /health answers 200,
                                                    else left out, said, and looked at again
    rigup-balancer-drain ready BACKEND SERVER       back in the pool now, then wait (at most 120 s)
                                                    for its health checks to say UP; exit 1 if not
(``maint`` and ``ready`` without a port: a gateway's side of ./roll.py, whose servers are other hosts.)
    rigup-balancer-drain release BACKEND            the frontend BACKEND gives up its port at once
                                                    (a single server takes it over; roles/balancer
                                                    then drops the frontend from the config)
    rigup-balancer-drain save-state                 the servers' state to STATE (at a start, a stop)
    rigup-balancer-drain reload MAINPID             save-state, then reload HAProxy (SIGUSR2 to its
                                                    master) and wait for the new worker to answer

Each change is read back from HAProxy's runtime API (``show servers state BACKEND``) and said
("BACKEND/SERVER is maint (read back from HAProxy)"): the helper exits 1, naming the socket or the
backend and server, when the admin socket cannot be reached or the state read back is not the one
asked (``release`` without HAProxy has nothing to release).

HAProxy keeps no server state across a reload by itself: its config reads STATE at start
(``server-state-file``, ``load-server-state-from-file global``), and this helper writes it after
each change it makes and before each reload (haproxy.service's ExecReload), start (ExecStartPre)
and stop (ExecStop): ``show servers state``, or the last one saved when the socket does not answer,
each server's line kept only for a server of the config on disk, its address left to the config
("-") and its port the config's (HAProxy would otherwise restore the old ones). A lock (STATE.lock)
keeps a change from falling between a reload's dump and its new worker. Standard library only:
it runs on bare hosts.
"""

from __future__ import annotations

import errno
import fcntl
import http.client
import ipaddress
import itertools
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from stat import S_ISREG, S_ISSOCK

SOCKET = "/run/haproxy/admin.sock"
LEASES = "/run/rigup/drain-leases"      # one file per leased server: {"until", "why"} (what status and people read)
RECHECK_S = 10                          # a lapsed lease whose server does not answer: looked at again this often
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")   # a backend's or server's name as roles/balancer writes them
CONFIG = "/etc/haproxy/haproxy.cfg"
STATE = "/run/haproxy/server-state"     # roles/balancer/config.py SERVER_STATE (the config reads it)
STATE_BYTES = 16 << 20                  # a server state's text: ~120 bytes a server
FMAINT, FDRAIN = 0x01, 0x08             # srv_admin_state: forced maintenance, forced drain
DRAIN_S, HEALTH_S, UP_S, LOCK_S, RELOAD_S = 50, 600, 120, 30, 30
ANSWER_S, ANSWER_BYTES = 10, 64 << 20     # one admin answer, whole: a worker that drips it holds no wait past its bounds
SECTIONS = {"global", "defaults", "frontend", "backend", "listen", "peers", "resolvers", "userlist", "cache",
            "program", "http-errors", "ring", "mailers", "crt-store"}


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


class Failed(Exception):
    """What could not be done, naming the socket or the backend and server."""


class Late(Failed):
    """An admin answer not whole by the deadline of the :meth:`Waiting.wait` under way: that wait's time is up."""


class Waiting:
    """The deadline of the :meth:`wait` under way (monotonic; None between waits), which no admin
    answer nor /health read outlasts: one per run of the program, made by :func:`main` and handed
    to what reads HAProxy or a server while it waits (issue 64: no state of the module's)."""

    def __init__(self) -> None:
        self.until: float | None = None

    def wait(self, predicate, seconds: float) -> bool:
        """Poll ``predicate`` every 0.2 s for at most ``seconds`` (the project would use tenacity;
        this runs on bare hosts)."""
        self.until = deadline = time.monotonic() + seconds   # admin() waits for no answer past it
        try:
            while not predicate():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
            return True
        except Late:   # an answer cut at the deadline: the time is up, as for one that came too late
            return False
        finally:
            self.until = None


def _until(waiting: Waiting | None) -> float:
    """The deadline of ``waiting``'s wait under way; infinity outside one."""
    return math.inf if waiting is None or waiting.until is None else waiting.until


WHOLE = re.compile(r"0|[1-9][0-9]{0,17}")   # the boundary's whole-number rule, rigup/boundary/numbers.py (a unit test holds them equal)


def _count(text: str, digits: int = 18) -> int | None:
    """The number ``text`` writes in ASCII digits alone, at most ``digits`` of them and no leading
    zero (:data:`WHOLE`, the boundary's rule); else None. str.isdigit() takes "²" (int() refuses it)
    and "٣" (int() reads 3), int() of more than 4300 digits raises (HAProxy's worker's answer: a
    traceback, issue 61 round 7 D4), and int() reads "0080" as 80 (round 9 H4)."""
    return int(text) if len(text) <= digits and WHOLE.fullmatch(text) else None


def admin(command: str, waiting: Waiting | None = None) -> str:
    """HAProxy's runtime API answer to ``command`` (whole within ``waiting``'s wait under way), from a
    listener of root's (or the helper's own user's) only: HAProxy's master binds the socket as root;
    /run/haproxy is haproxy's group's to write (Debian's tmpfiles.d), where anything else listening
    at the path was believed, its Pid and states (issue 61, round 6 DR6)."""
    try:   # the path's own inode, never a link's target: haproxy's group may plant a link to another root listener
        fd = os.open(SOCKET, os.O_PATH | os.O_NOFOLLOW)   # (issue 61, re-round 6 ND2)
    except OSError as e:
        raise Failed(f"cannot reach HAProxy's admin socket {SOCKET}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not S_ISSOCK(st.st_mode) or st.st_uid not in (0, os.geteuid()):
            raise Failed(f"cannot reach HAProxy's admin socket {SOCKET}: not a socket of root's (a link, or another "
                         "user's file): remove it and restart HAProxy")
        deadline = min(time.monotonic() + ANSWER_S, _until(waiting))   # for the whole answer, and within a wait's:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:   # a byte a second held ready past UP_S (round 7 D3)
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            s.connect(f"/proc/self/fd/{fd}")   # the inode just checked
            pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid not in (0, os.geteuid()):
                raise Failed(f"cannot reach HAProxy's admin socket {SOCKET}: its listener is not root's HAProxy "
                             f"(uid {uid}, pid {pid}): remove it and restart HAProxy")
            s.sendall(command.encode() + b"\n")
            chunks, size = [], 0
            while chunk := _part(s, deadline, size, command, waiting):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError as e:   # a timeout too (connect, send): Late at a wait's deadline
        raise _late_or_failed(waiting)(f"cannot reach HAProxy's admin socket {SOCKET}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _part(s: socket.socket, deadline: float, size: int, command: str, waiting: Waiting | None) -> bytes:
    """The answer's next bytes (b"": its end), or Failed once it took ANSWER_S or ANSWER_BYTES."""
    left = deadline - time.monotonic()
    try:
        if left > 0 and size <= ANSWER_BYTES:
            s.settimeout(left)
            return s.recv(65536)
    except socket.timeout:
        pass
    raise _late_or_failed(waiting)(f"HAProxy's admin socket {SOCKET}: no whole answer to "
                                   f"{shown(command.split(' ', 1)[0], 40)!r} within {ANSWER_S} s and {ANSWER_BYTES} bytes")


def _late_or_failed(waiting: Waiting | None) -> type[Failed]:
    """:class:`Late` once ``waiting``'s wait under way is past its deadline, else :class:`Failed`."""
    return Late if time.monotonic() >= _until(waiting) else Failed


def reachable() -> bool:
    try:
        return bool(admin("show info"))
    except Failed:
        return False


def worker_pid(waiting: Waiting | None = None) -> int | None:
    """The pid of the HAProxy worker answering on the socket (``show info``), None when none does."""
    try:
        info = admin("show info", waiting)
    except Failed:
        return None
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key == "Pid" and (pid := _count(value.strip(" \t\r\n\f\v"))) is not None:   # ASCII's blanks alone
            return pid
    return None


def parse_states(text: str) -> tuple[str, list[str], list[list[str]]]:
    """``show servers state``'s answer: its version line, its field names and its rows; Failed when
    it is not one (HAProxy's error, an empty answer)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].strip() != "1" or len(lines) < 2 or not lines[1].startswith("#"):
        # its first line only, as HAProxy's error reads ("Can't find backend."): never a file's text at large
        first = (text.strip().splitlines() or [""])[0]
        raise Failed(f"not a server state: {shown(first, 80)!r}")
    return lines[0].strip(), lines[1][1:].split(), [ln.split() for ln in lines[2:] if not ln.startswith("#")]


def server_state(backend: str, server: str) -> dict[str, str]:
    """The server's fields of ``show servers state BACKEND`` (srv_op_state, srv_admin_state, ...)."""
    try:
        _, names, rows = parse_states(admin(f"show servers state {backend}"))
    except Failed as e:
        if str(e).startswith("cannot reach"):
            raise
        raise Failed(f"backend {backend}: HAProxy ({SOCKET}) gives no server state for it: {e}") from None
    for row in rows:
        fields = dict(zip(names, row))
        if fields.get("srv_name") == server:
            return fields
    raise Failed(f"backend {backend} has no server {server} in HAProxy ({SOCKET})")


def admin_state(backend: str, server: str) -> int:
    value = server_state(backend, server).get("srv_admin_state", "")
    flags = _count(value)
    if flags is None:
        raise Failed(f"{backend}/{server}: srv_admin_state {shown(value, 40)!r} is not a number")
    return flags


def is_as_asked(asked: str, flags: int) -> bool:
    """``flags`` (srv_admin_state) say the server is in state ``asked`` (drain, maint or ready)."""
    if asked == "maint":
        return bool(flags & FMAINT)
    if asked == "drain":
        return bool(flags & FDRAIN) and not flags & FMAINT
    return not flags & (FMAINT | FDRAIN)


def confirmed(backend: str, server: str, asked: str) -> str:
    """The line that says a change was read back (./roll.py wants it for each of its steps)."""
    return f"{backend}/{server} is {asked} (read back from HAProxy)"


def named(flags: int) -> str:
    return "maint" if flags & FMAINT else "drain" if flags & FDRAIN else "ready"


class locked:
    """STATE.lock held: no reload dumps the state between a change and its read-back (a change
    then reaches the reload's new worker). Without its directory (no HAProxy yet): no lock."""

    def __enter__(self):
        try:
            # never through a link planted in HAProxy's directory (Debian's tmpfiles.d: haproxy's group may write it)
            self.fd = os.open(STATE + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Failed(f"{STATE}.lock is a symbolic link, which rigup never makes: remove it") from None
            self.fd = None
            return self
        deadline = time.monotonic() + LOCK_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise Failed(f"{STATE}.lock held for {LOCK_S} s (another rigup-balancer-drain or a reload)") from None
                time.sleep(0.1)

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def set_state(backend: str, server: str, asked: str) -> None:
    """``set server BACKEND/SERVER state ASKED``, read back (Failed unless it is so), then saved."""
    with locked():
        answer = admin(f"set server {backend}/{server} state {asked}").strip()
        flags = admin_state(backend, server)
        if not is_as_asked(asked, flags):
            raise Failed(f"{backend}/{server}: asked {asked}, HAProxy ({SOCKET}) says {named(flags)} "
                         f"(srv_admin_state {flags}){': ' + answer if answer else ''}")
        print(shown(f"rigup-balancer-drain: {confirmed(backend, server, asked)}", 4000), flush=True)   # roll.py looks for it
        try:
            if save_state() != "HAProxy":
                raise Failed("HAProxy gave no server state")
        except (Failed, OSError) as e:   # the change stands; a reload before the next save loses it
            print(shown(f"rigup-balancer-drain: warning: {backend}/{server} is {asked} but its state was not saved: {e}",
                        4000), file=sys.stderr)


def config_ports(text: str) -> dict[tuple[str, str], str]:
    """(backend, server) -> port of each ``server NAME ADDRESS:PORT`` of an HAProxy config."""
    found, backend = {}, None
    for line in text.splitlines():
        words = [w for w in re.split("[ \t]+", line.split("#", 1)[0]) if w]   # HAProxy's blanks (split() takes U+0085)
        if not words:
            continue
        if words[0] in SECTIONS:
            backend = words[1] if words[0] in ("backend", "listen") and len(words) > 1 else None
        elif words[0] == "server" and backend and len(words) > 2:
            port = words[2].rpartition(":")[2]
            if _count(port) is not None:
                found[(backend, words[1])] = port
    return found


def kept(state: str, config: str) -> str:
    """``show servers state``'s answer, each server's line kept only for a server of ``config``,
    its address "-" (the config's, resolved at start) and its port the config's."""
    version, names, rows = parse_states(state)
    if "srv_addr" not in names or "srv_port" not in names:
        raise Failed(f"no srv_addr or srv_port among the server state's fields: {names}")
    ports = config_ports(config)
    out = [version, "# " + " ".join(names)]
    addr, port_at = names.index("srv_addr"), names.index("srv_port")
    for row in rows:
        fields = dict(zip(names, row))
        port = ports.get((fields.get("be_name"), fields.get("srv_name")))
        if port is None or len(row) <= max(addr, port_at):
            continue
        row = list(row)
        row[addr], row[port_at] = "-", port
        out.append(" ".join(row))
    return "\n".join(out) + "\n"


def save_state() -> str | None:
    """STATE written (see the module's doc); returns where the state came from, None when there is
    none to save (no HAProxy answers, none saved)."""
    try:
        state, source = admin("show servers state"), "HAProxy"
        parse_states(state)
    except Failed as e:
        state, source = read_state(), f"the state last saved ({e})"
        if state is None:
            return None
    with open(CONFIG) as f:
        write_state(kept(state, f.read()))
    return source


def read_state() -> str | None:
    """STATE's text, None when there is none; Failed unless it is a regular file of the helper's own
    user (root's on a host: the helper alone writes it, through :func:`replace`), one link to it and
    no other user's to write, opened through no symbolic link and never waiting on a FIFO.
    /run/haproxy is haproxy's group's to write (Debian's tmpfiles.d): a link planted at STATE had
    root copy /etc/shadow's first line into the journal, a FIFO hung HAProxy's start (issue 61,
    round 6 DR3, DR5)."""
    try:
        fd = os.open(STATE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Failed(f"{STATE} is a symbolic link, which rigup never makes: remove it") from None
        raise Failed(f"cannot read {STATE}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1 or st.st_mode & 0o022:
            raise Failed(f"{STATE} is not the helper's own file (a regular file of uid {os.geteuid()}, one link, "
                         f"no other user's to write; it is mode {st.st_mode:o}, uid {st.st_uid}, {st.st_nlink} "
                         f"links): remove it")
        data = f.read(STATE_BYTES + 1)
    if len(data) > STATE_BYTES:
        raise Failed(f"{STATE} is larger than {STATE_BYTES} bytes: remove it")
    return data.decode(errors="replace")


def write_state(text: str) -> None:
    """STATE replaced by ``text`` in one rename (HAProxy reads it at start, as root): :func:`replace`,
    never through a link planted at a temp name."""
    replace(STATE, text)


def replace(path: str, text: str, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write ``path`` atomically: a new temp file beside it (a random dot-name, O_EXCL|O_NOFOLLOW: a
    link or file another user planted in the directory is never opened), chmod'ed to ``mode`` (None:
    the umask's), then renamed over ``path`` (a rename replaces a link there, never follows it); the
    temp file never outlives a failure. Each host program carries this copy (it ships alone)."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise



def ready_in_saved_state(backend: str, server: str) -> None:
    """The server's line of STATE (if any) says ready (no maint, no drain)."""
    with locked():
        try:
            version, names, rows = parse_states(read_state() or "")
        except (OSError, Failed):
            return
        for row in rows:
            fields = dict(zip(names, row))
            if (fields.get("be_name"), fields.get("srv_name")) == (backend, server) \
                    and (flags := _count(fields.get("srv_admin_state", ""))) is not None:
                row[names.index("srv_admin_state")] = str(flags & ~(FMAINT | FDRAIN))
        write_state("\n".join([version, "# " + " ".join(names)] + [" ".join(r) for r in rows]) + "\n")


def reload(mainpid: int, waiting: Waiting) -> None:
    """save-state, SIGUSR2 to HAProxy's master ``mainpid``, then the new worker answering (the lock
    held throughout: a change waits for the new worker)."""
    with locked():
        old = worker_pid()
        try:
            source = save_state()
            if source != "HAProxy":
                print(shown(f"rigup-balancer-drain: reload with {source or 'no saved server state'}", 4000), file=sys.stderr)
        except (Failed, OSError) as e:
            print(shown(f"rigup-balancer-drain: reload without a saved server state: {e}", 4000), file=sys.stderr)
        try:
            os.kill(mainpid, signal.SIGUSR2)
        except OSError as e:
            raise Failed(f"cannot signal HAProxy's master {mainpid}: {e.strerror or e}") from None
        # a worker inherits its listeners from the one it replaces: a socket file removed stays away
        # until a restart (so a socket that did not answer before is given a few seconds only)
        seconds = RELOAD_S if old is not None else min(RELOAD_S, 5)
        if not waiting.wait(lambda: worker_pid(waiting) not in (None, old), seconds):
            print(shown(f"rigup-balancer-drain: warning: no new HAProxy worker answered on {SOCKET} within {seconds} s "
                        "of the reload" + ("" if old is not None else " (restart HAProxy to bring the socket back)"), 4000),
                  file=sys.stderr)


def stat(backend: str, server: str, waiting: Waiting | None = None) -> list[str]:
    """The server's row of ``show stat`` ([] when it is not listed)."""
    for line in admin("show stat", waiting).splitlines():
        cols = line.split(",")
        if cols[:2] == [backend, server] and len(cols) > 17:
            return cols
    return []


def in_flight(backend: str, server: str, waiting: Waiting | None = None) -> int:
    """The server's current sessions (``scur`` of ``show stat``); 0 when it is not listed."""
    cols = stat(backend, server, waiting)
    return (_count(cols[4]) or 0) if cols else 0


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def drained(backend: str, server: str, worker: int | None, waiting: Waiting | None = None) -> bool:
    """No request of the server is left running: none at the worker that answers, and the worker
    that took the drain (``worker``), should a reload have replaced it, gone (a worker replaced by a
    reload finishes its requests, unseen by ``show stat``, before it exits)."""
    now = worker_pid(waiting)
    if worker is not None and now != worker and alive(worker):
        return False
    return in_flight(backend, server, waiting) == 0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (HTTPError 3xx, its own status): a server asked here has no reason to
    send one, and following it reads another server's answer as this one's (issue 47; round 9 D2:
    a replica's /health 302 to another URL's 200 was the replica healthy, and the gateway's root
    fetched any http URL a replica named)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class _Deadline(socket.socket):
    """A socket whose every send and receive waits no later than its ``deadline`` (monotonic), so
    that ``timeout`` bounds a whole answer, its status line and headers too: a socket's own
    timeout bounds each read only, and a server trickling a header line every 3 s held a 2-s wait
    18 s (round 9 D3). TimeoutError (an OSError) once the deadline has passed."""

    deadline = math.inf

    def _left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer was not whole by its deadline")
        self.settimeout(left)

    def recv_into(self, *args, **kwargs):
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._left()
        return super().sendall(*args, **kwargs)


def _connected(address: tuple, timeout: float, source=None, deadline: float = math.inf) -> _Deadline:
    """A :class:`_Deadline` socket connected to ``address`` (host, port), by the deadline."""
    failed: OSError = OSError(f"{address[0]!r} resolves to no address")
    for family, kind, proto, _, where in socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM):
        sock = _Deadline(family, kind, proto)
        sock.deadline = min(deadline, time.monotonic() + timeout)
        try:
            sock._left()
            sock.connect(where)
            return sock
        except OSError as e:
            sock.close()
            failed = e
    raise failed


class _WholeRead(http.client.HTTPConnection):
    """An HTTP connection whose ``timeout`` bounds the whole exchange (:class:`_Deadline`), from its
    start: the connect, the request, the status line, the headers and the body."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        deadline = time.monotonic() + (self.timeout if isinstance(self.timeout, (int, float)) else 60)
        self._create_connection = lambda address, timeout, source=None: _connected(address, timeout, source,
                                                                                  deadline)


class _Within(urllib.request.HTTPHandler):
    """http:// through :class:`_WholeRead`: the opener's ``timeout`` is the answer's, whole."""

    def http_open(self, req):
        return self.do_open(_WholeRead, req)


# no redirect, no proxy (the servers asked are the host's own or its pool's), each answer whole by its
# timeout: every HTTP read of a host program goes through this opener (tests/unit/test_no_redirect.py)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect(), _Within())


def health(url: str, seconds: float = 5, waiting: Waiting | None = None) -> int | str:
    """What ``url`` (a server's /health) answers: its status, or ``no answer (why)``, whole within
    ``seconds`` and ``waiting``'s wait under way (a redirect is its own status, never followed). Every
    HTTP read of this program goes through here: a refused connection or a timeout (OSError: URLError
    is one), a malformed status line or a header line over http.client's bound (HTTPException), a URL
    urllib does not take (ValueError) are no answer, never a traceback out of the replica's
    ExecStartPost (issue 61, round 8 D1: ``healthy`` caught OSError alone)."""
    try:
        with _OPENER.open(url, timeout=max(min(seconds, _until(waiting) - time.monotonic()), 0.001)) as r:
            return r.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code
    except (OSError, ValueError, http.client.HTTPException) as e:   # InvalidURL, BadStatusLine, LineTooLong
        return f"no answer ({getattr(e, 'reason', e)})"


def healthy(port: int, waiting: Waiting | None = None) -> bool:
    return health(f"http://127.0.0.1:{port}/health", waiting=waiting) == 200


def checked(*names: str) -> None:
    """Failed unless each name is a backend's or server's name as roles/balancer writes them (NAME):
    a name reaches HAProxy's runtime API, where ';' separates commands ('release "gw; shutdown
    sessions server gw/lab2"' sent two: issue 61, round 6 DR1), and a unit's name."""
    for name in names:
        if not NAME.fullmatch(name):
            raise Failed(f"not a backend or server name: {shown(name, 120)!r}")


# A lease on a drain (issue 65): roll.py drains a batch's servers with a lease and renews it while it
# converges them; a controller that dies stops renewing, and the gateway puts each server back by
# itself once it answers. The timer is a transient systemd unit (systemd-run): nothing to install,
# gone with the lease; a gateway rebooted meanwhile keeps the server out (its saved state) until
# a roll or an operator puts it back.
def lease_unit(backend: str, server: str) -> str:
    """The lease's unit (and file) name, one per (backend, server): the backend's length first
    (``rigup-drain-lease-13-gateway-gemma-lab2-lease``), so that no two pairs share it, as a plain
    join did (gateway-gemma/lab2 and gateway/gemma-lab2; ':' was '_' too: llama:glm and llama_glm).
    It ends in the fixed ``-lease``: systemd-run keeps a name's own unit suffix and derives the
    other unit from it, so servers lab2 and lab2.timer (or lab2.service, .socket, ...) shared
    one timer (round 1 rerun of issue 61, N05). A unit's name takes ':' as it is; at most 100
    characters each, the name stays within systemd's 255."""
    checked(backend, server)
    return f"rigup-drain-lease-{len(backend)}-{backend}-{server}-lease"


def lease_file(backend: str, server: str) -> str:
    return os.path.join(LEASES, lease_unit(backend, server) + ".json")


def arm(backend: str, server: str, seconds: int, why: str | None = None) -> None:
    """The lease's timer, ``seconds`` from now (an earlier one stopped first), and its file."""
    unit = lease_unit(backend, server)
    # its service too: an expire still looking at the server (its recheck) gives way to a roll's new lease
    subprocess.run(["systemctl", "stop", f"{unit}.timer", f"{unit}.service"], capture_output=True, timeout=30)
    subprocess.run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, timeout=30)
    done = subprocess.run(["systemd-run", "--quiet", "--collect", f"--unit={unit}", f"--on-active={seconds}s",
                           "--timer-property=AccuracySec=1s", os.path.abspath(sys.argv[0]), "expire", backend, server],
                          capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise Failed(f"{backend}/{server}: its lease's timer did not start: {done.stderr.strip()[:300]}")
    os.makedirs(LEASES, mode=0o755, exist_ok=True)
    replace(lease_file(backend, server), json.dumps({"until": round(time.time() + seconds), "why": why}))


def disarm(backend: str, server: str) -> None:
    """No lease any more (the server readied): its timer stopped, its file gone."""
    unit = lease_unit(backend, server)
    subprocess.run(["systemctl", "stop", f"{unit}.timer"], capture_output=True, timeout=30)
    try:
        os.remove(lease_file(backend, server))
    except FileNotFoundError:
        pass


def inside(unit: str) -> bool:
    """Whether this process runs in ``unit``'s service (its cgroup): the lease's own expire."""
    try:
        with open("/proc/self/cgroup") as f:
            return f"/{unit}.service" in f.read()
    except OSError:
        return False


def expire(backend: str, server: str) -> None:
    """The lease lapsed: back in the pool when the server's /health (its address and port in
    HAProxy) answers 200, else left out, the reason kept in the lease's file and said, and looked
    at again in RECHECK_S: by this process, when it runs in the lease's own service (its timer's,
    which systemd-run cannot make again while this service runs: the server stayed out for good,
    issue 65's burn-in cut short), else by a new timer. A server no longer in maint (readied
    meanwhile) needs nothing."""
    while _expired(backend, server) and inside(lease_unit(backend, server)):
        time.sleep(RECHECK_S)


def _expired(backend: str, server: str) -> bool:
    """One look of :func:`expire`: True when the server was left out, to be looked at again."""
    if not os.path.exists(lease_file(backend, server)):
        return False
    fields = server_state(backend, server)
    if not admin_state(backend, server) & FMAINT:
        disarm(backend, server)
        return False
    addr, port = fields.get("srv_addr", ""), fields.get("srv_port", "")
    try:   # HAProxy's resolved address: one that is not an IP address or port was a traceback in urlopen (DR10)
        ip = ipaddress.ip_address(addr)
        if not 0 < (_count(port) or 0) <= 65535 or getattr(ip, "scope_id", None):
            raise ValueError(port)   # a scoped IPv6 address (fe80::1%eth0) is no URL's host (re-round 6 ND5)
    except ValueError:
        url, got = f"{shown(addr, 80)!r} port {shown(port, 20)!r}", "nothing: not an IP address and port"
    else:
        url = f"http://{f'[{ip}]' if ip.version == 6 else ip}:{int(port)}/health"
        got = health(url)
    if got == 200:
        set_state(backend, server, "ready")
        disarm(backend, server)
        print(shown(f"rigup-balancer-drain: {backend}/{server}: its lease lapsed (the roll that drained it stopped "
                    f"renewing it) and {url} answers 200: back in the pool", 4000), flush=True)
        return False
    why = f"its lease lapsed, {url} answers {got}: left out of the pool, looked at again in {RECHECK_S} s"
    print(shown(f"rigup-balancer-drain: {backend}/{server}: {why}", 4000), file=sys.stderr, flush=True)
    if inside(lease_unit(backend, server)):
        replace(lease_file(backend, server), json.dumps({"until": round(time.time() + RECHECK_S), "why": why}))
    else:
        arm(backend, server, RECHECK_S, why)
    return True


def run(argv: list[str], waiting: Waiting) -> None:
    action = argv[0]
    if action == "save-state":
        with locked():
            save_state()
        return
    if action == "reload":
        reload(int(argv[1]), waiting)
        return
    backend = argv[1]
    checked(*argv[1:3])
    if action == "release":
        if reachable():
            admin(f"disable frontend {backend}")   # HAProxy closes its listener (as on a soft stop)
        return   # no HAProxy: nothing holds the port
    server = argv[2]
    if action == "expire":
        expire(backend, server)
        return
    if action == "renew":
        if os.path.exists(lease_file(backend, server)):
            arm(backend, server, int(argv[3]))
        return
    if action == "ready" and len(argv) > 3 and not reachable():
        # a replica started while HAProxy is away: its saved state must not drain it at HAProxy's start
        ready_in_saved_state(backend, server)
    admin("show info")   # fails now, naming the socket, when HAProxy cannot be reached
    if action in ("drain", "maint"):
        worker = worker_pid()
        set_state(backend, server, "drain")
        waiting.wait(lambda: drained(backend, server, worker, waiting), DRAIN_S)
        if action == "maint":
            set_state(backend, server, "maint")
            if len(argv) > 3:   # roll.py's lease
                arm(backend, server, int(argv[3]))
    elif action == "ready":
        if len(argv) > 3:   # a replica's start: its own /health first
            waiting.wait(lambda: healthy(int(argv[3]), waiting), HEALTH_S)
        set_state(backend, server, "ready")
        if os.path.exists(lease_file(backend, server)):
            disarm(backend, server)
        # "UP" once a health check passed since (right after ready HAProxy says "UP 1/2"; a replica
        # that was DOWN while it restarted is "DOWN 1/2" and takes no request): its unit's start ends
        # only then, so the next replica of a rolling restart is not drained while this one is not
        # yet in the pool (two 503s in CI at c1518c4, test_balancer's revision change)
        row: list[str] = []   # the last one read: no answer is waited for after UP_S

        def up() -> bool:
            row[:] = stat(backend, server, waiting)
            return row[17:18] == ["UP"]

        if not waiting.wait(up, UP_S):
            raise Failed(f"{backend}/{server}: not UP {UP_S} s after ready: {(row or ['?'] * 18)[17]}")
    else:
        raise Failed(f"unknown action {action!r}")


def main(argv: list[str]) -> int:
    if not argv or len(argv) < {"save-state": 1, "reload": 2, "release": 2, "renew": 4}.get(argv[0], 3) or \
            (argv[0] in ("maint", "renew") and len(argv) > 3 and not 0 < (_count(argv[3]) or 0) <= 86400) or \
            (argv[0] == "reload" and not 1 < (_count(argv[1]) or 0) <= 1 << 22) or \
            (argv[0] == "ready" and len(argv) > 3 and not 0 < (_count(argv[3]) or 0) <= 65535):
        # a number in ASCII digits and in range, or the usage (round 3's D4: reload x ended in a ValueError;
        # MAINPID 0 would signal drain's own process group)
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        run(argv, Waiting())
    except Failed as e:
        print(shown(f"rigup-balancer-drain: {' '.join(argv)}: {e}", 4000), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
