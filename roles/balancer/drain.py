#!/usr/bin/python3
"""rigup-balancer-drain: a replica leaves or rejoins its balancer's pool (installed by
roles/balancer; the replicas' units of roles/llama_server call it with full privileges).

    rigup-balancer-drain drain BACKEND SERVER       before a stop: no new requests go to SERVER,
                                                    then wait (at most 50 s) for its running ones
    rigup-balancer-drain ready BACKEND SERVER PORT  after a start: wait for 127.0.0.1:PORT/health
                                                    200 (at most 600 s), then back in the pool
    rigup-balancer-drain maint BACKEND SERVER       drain, then out of the pool (maint) until ready
    rigup-balancer-drain ready BACKEND SERVER       back in the pool now, then wait (at most 120 s)
                                                    for its health checks to say UP; exit 1 if not
(``maint`` and ``ready`` without a port: a gateway's side of ./roll.py, whose servers are other hosts.)
    rigup-balancer-drain release BACKEND            the frontend BACKEND gives up its port at once
                                                    (a single server takes it over; roles/balancer
                                                    then drops the frontend from the config)

Without HAProxy's admin socket it does nothing. Standard library only: it runs on bare hosts.
"""

import socket
import sys
import time
import urllib.error
import urllib.request

SOCKET = "/run/haproxy/admin.sock"


def admin(command: str) -> str:
    """HAProxy's runtime API answer to ``command`` ("" without the socket)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(SOCKET)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def stat(backend: str, server: str) -> list[str]:
    """The server's row of ``show stat`` ([] when it is not listed)."""
    for line in admin("show stat").splitlines():
        cols = line.split(",")
        if cols[:2] == [backend, server] and len(cols) > 17:
            return cols
    return []


def in_flight(backend: str, server: str) -> int:
    """The server's current sessions (``scur`` of ``show stat``); 0 when it is not listed."""
    cols = stat(backend, server)
    return int(cols[4]) if cols and cols[4].isdigit() else 0


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait(predicate, seconds: float) -> bool:
    """Poll ``predicate`` every 0.2 s for at most ``seconds`` (the project would use tenacity;
    this runs on bare hosts)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def main(argv: list[str]) -> int:
    action, backend = argv[:2]
    if not admin("show info"):
        return 0   # no balancer here (yet)
    if action == "release":
        admin(f"disable frontend {backend}")   # HAProxy closes its listener (as on a soft stop)
        return 0
    server = argv[2]
    if action in ("drain", "maint"):
        admin(f"set server {backend}/{server} state drain")
        wait(lambda: in_flight(backend, server) == 0, 50)
        if action == "maint":
            admin(f"set server {backend}/{server} state maint")
    elif action == "ready" and len(argv) > 3:
        wait(lambda: healthy(int(argv[3])), 600)
        admin(f"set server {backend}/{server} state ready")
    elif action == "ready":
        admin(f"set server {backend}/{server} state ready")
        if not wait(lambda: stat(backend, server)[17:18] == ["UP"], 120):
            print(f"{backend}/{server}: not UP 120 s after ready: {(stat(backend, server) or ['?'] * 18)[17]}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
