"""The host fetcher's stream against hostile hubs on loopback (real HTTP, a server in a thread):
a stall is fewer than ``stall_bytes`` in a window of ``stall_s`` (a trickle stalls too), a hub
that ignores Range and cuts every stream fails the job after RETRIES restarts from zero, a 206
whose Content-Range is not the bytes asked for is refused at once, and a good hub that cuts once
still completes with the right hash."""

import hashlib
import http.server
import os
import re
import threading
import time

import pytest

from roles.model_fetch.shipped import fetcher

REV = "a" * 40
SIZE = 256 << 10
DATA = os.urandom(SIZE)
PATH = "sub/m.bin"


class Hub(http.server.BaseHTTPRequestHandler):
    """A hub's resolve endpoint serving DATA as ``PATH``, misbehaving as ``mode`` says:

    good       honours Range; the first stream is cut at half
    trickle    honours Range; one byte every 0.2 s
    ignore     ignores Range (200, the whole file); every stream is cut at half
    ignore1    the first stream is cut at half; then 200, the whole file, to the Range request
    badstart   the first stream is cut at half; the Range request gets a 206 starting 7 bytes on
    badtotal   the first stream is cut at half; the Range request gets a 206 of another total
    badform    the first stream is cut at half; the Range request gets a 206 without bytes N-M/T
    gzip       200 with Content-Encoding: gzip (a gzip stream of the file), whatever was asked
    """
    mode = "good"
    served = 0
    requests: list = []
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def send(self, body: bytes, close: bool = False, delay: float = 0.0) -> None:
        cls = type(self)
        try:
            if delay:
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    with cls.lock:
                        cls.served += 1
                    time.sleep(delay)
            else:
                self.wfile.write(body)
                with cls.lock:
                    cls.served += len(body)
        except OSError:   # the fetcher hung up (a stall)
            pass
        if close:
            self.close_connection = True

    def do_GET(self):
        cls = type(self)
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(m.group(1)) if m else None
        with cls.lock:
            cls.requests.append(start)
            first = len(cls.requests) == 1
        assert self.path == f"/org/m/resolve/{REV}/{PATH}", self.path
        mode, half = cls.mode, SIZE // 2
        ranged = start is not None and mode in ("good", "trickle", "badstart", "badtotal", "badform")
        if ranged:
            self.send_response(206)
            self.send_header("Content-Range", {
                "badstart": f"bytes {start + 7}-{SIZE - 1}/{SIZE}",
                "badtotal": f"bytes {start}-{SIZE - 1}/{SIZE + 1}",
                "badform": f"bytes {start}-/{SIZE}"}.get(mode, f"bytes {start}-{SIZE - 1}/{SIZE}"))
            self.send_header("Content-Length", str(SIZE - start))
        elif mode == "gzip":
            import gzip

            body = gzip.compress(DATA)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self.send(body)
        else:
            start = 0
            self.send_response(200)
            self.send_header("Content-Length", str(SIZE))
        self.end_headers()
        if mode == "trickle":
            return self.send(DATA[start:], delay=0.2)
        if mode == "ignore" or first:
            return self.send(DATA[start:half], close=True)     # cut at half
        self.send(DATA[start:])


@pytest.fixture
def hub():
    """A fresh Hub class of its own (a trickle's thread of the test before may still write), its
    ``url`` set, serving on loopback."""
    cls = type("OneHub", (Hub,), {"mode": "good", "served": 0, "requests": [], "lock": threading.Lock()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    cls.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield cls
    server.shutdown()
    server.server_close()


def fetch(hub, tmp_path, **job):
    """fetch_file in this process (so the module's RETRIES and backoff can be made small):
    (seconds it took, the digest or the JobFailed, the progress)."""
    dest = tmp_path / "m"
    dest.mkdir(exist_ok=True)
    entry = {"path": PATH, "size": SIZE, "oid": "0" * 40, "sha256": hashlib.sha256(DATA).hexdigest()}
    endpoint = hub.url
    job = {"dest": str(dest), "source": endpoint, "repo": "org/m", "revision": REV, **job}
    progress = fetcher.Progress(str(tmp_path / "progress.json"), SIZE, 0, endpoint)
    start = time.monotonic()
    try:
        result = fetcher.fetch_file(fetcher.Run(), job, entry, str(dest), progress, None)
    except fetcher.JobFailed as e:
        result = e
    return time.monotonic() - start, result, progress


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(fetcher, "BACKOFF_S", 0.01)
    monkeypatch.setattr(fetcher, "BACKOFF_MAX_S", 0.05)


def test_a_trickle_stalls_and_fails_after_the_retries(hub, tmp_path, quick, monkeypatch, capsys):
    monkeypatch.setattr(fetcher, "RETRIES", 3)
    hub.mode = "trickle"
    took, result, progress = fetch(hub, tmp_path, stall_s=0.5, stall_bytes=1024)
    log = capsys.readouterr().err
    print(f"\ntrickle (1 B / 0.2 s, window 0.5 s, 1 KiB): failed in {took:.1f} s after {progress.resumes} "
          f"resume(s), {hub.served} bytes served, {len(hub.requests)} requests")
    assert isinstance(result, fetcher.JobFailed) and not result.permanent
    assert "stalled" in str(result) and "3 retries in a row failed" in str(result) and PATH in str(result)
    assert "per 0.5 s (stalled)" in log and progress.resumes == 3 and len(hub.requests) == 4
    assert all(start is not None for start in hub.requests[1:])   # resumed with Range each time
    assert took < 4 * 2.5      # each stream gives up within its window (+ a read); before, never


def test_a_hub_that_ignores_range_and_cuts_every_stream_fails_the_job(hub, tmp_path, quick, capsys):
    hub.mode = "ignore"
    took, result, progress = fetch(hub, tmp_path)
    log = capsys.readouterr().err
    print(f"\nignores Range, cuts at half: failed in {took:.1f} s after {len(hub.requests)} requests, "
          f"{hub.served} bytes served for {SIZE}")
    assert isinstance(result, fetcher.JobFailed) and not result.permanent
    why = str(result)
    assert why.startswith(f"{PATH}: the hub ignores Range") and f"cut the stream {fetcher.RETRIES + 1} times" in why
    assert len(hub.requests) == fetcher.RETRIES + 1 and hub.served == (fetcher.RETRIES + 1) * SIZE // 2
    assert "restart(s) from zero: the hub ignores Range" in log
    assert took < 10


def test_the_jobs_retries_bound_the_reconnects_and_the_restarts(hub, tmp_path, quick):
    """model_fetch_retries reaches the job as ``retries``: 2 reconnects of a trickle, 2 restarts
    from zero of a hub that ignores Range."""
    hub.mode = "trickle"
    _, stalled, _ = fetch(hub, tmp_path, stall_s=0.5, stall_bytes=1024, retries=2)
    asked = len(hub.requests)
    hub.requests.clear()
    hub.mode = "ignore"
    (tmp_path / "b").mkdir()
    _, cut, _ = fetch(hub, tmp_path / "b", retries=2)
    print(f"\nretries 2: trickle {asked} requests ({stalled}); ignores Range {len(hub.requests)} requests ({cut})")
    assert "2 retries in a row failed" in str(stalled) and asked == 3
    assert "cut the stream 3 times" in str(cut) and len(hub.requests) == 3


def test_a_hub_that_ignores_range_once_but_sends_the_whole_file_completes(hub, tmp_path, quick):
    hub.mode = "ignore1"
    took, digest, progress = fetch(hub, tmp_path)
    print(f"\nignores Range once: complete in {took:.2f} s, {hub.served} bytes served for {SIZE}")
    assert digest == hashlib.sha256(DATA).hexdigest()
    assert (tmp_path / "m" / PATH).read_bytes() == DATA and hub.served == SIZE + SIZE // 2


@pytest.mark.parametrize("mode, given", [
    ("badstart", f"bytes {SIZE // 2 + 7}-{SIZE - 1}/{SIZE}"),
    ("badtotal", f"bytes {SIZE // 2}-{SIZE - 1}/{SIZE + 1}"),
    ("badform", f"bytes {SIZE // 2}-/{SIZE}"),
])
def test_a_wrong_content_range_is_refused_at_once(hub, tmp_path, quick, mode, given):
    hub.mode = mode
    took, result, progress = fetch(hub, tmp_path)
    print(f"\n{mode}: refused in {took:.2f} s after {len(hub.requests)} requests, {hub.served} bytes served")
    assert isinstance(result, fetcher.JobFailed) and result.permanent
    why = str(result)
    assert why.startswith(f"{PATH}: asked for bytes={SIZE // 2}- of {SIZE}") and repr(given) in why, why
    assert hub.requests == [None, SIZE // 2]      # at once: no retry of a wrong answer
    part = tmp_path / "m/.rigup-fetch/parts" / PATH
    assert part.read_bytes() == DATA[:SIZE // 2]  # not a byte of the wrong range written


def test_a_compressed_answer_is_refused_at_once(hub, tmp_path, quick):
    """urllib asks for identity and inflates nothing: a gzip body would be written as the file
    (and a bomb may inflate without bound where something does): refused, no byte written."""
    hub.mode = "gzip"
    took, result, progress = fetch(hub, tmp_path)
    print(f"\nContent-Encoding gzip: refused in {took:.2f} s after {len(hub.requests)} request(s)")
    assert isinstance(result, fetcher.JobFailed) and result.permanent
    assert str(result).startswith(f"{PATH}: the hub answered {hub.url}/org/m/resolve/") and "'gzip'" in str(result)
    assert hub.requests == [None]
    assert (tmp_path / "m/.rigup-fetch/parts" / PATH).read_bytes() == b""


def test_range_problem():
    assert fetcher.range_problem(f"bytes 5-{SIZE - 1}/{SIZE}", 5, SIZE) is None
    assert fetcher.range_problem(f"bytes 5-{SIZE - 1}/*", 5, SIZE) is None
    assert fetcher.range_problem("bytes 5-9/*", 5, SIZE) is None              # a shorter range: resumed
    assert "starts at byte 0" in fetcher.range_problem(f"bytes 0-{SIZE - 1}/{SIZE}", 5, SIZE)
    assert "listed size" in fetcher.range_problem(f"bytes 5-{SIZE - 1}/{SIZE * 2}", 5, SIZE)
    assert "outside" in fetcher.range_problem(f"bytes 5-{SIZE}/*", 5, SIZE)
    assert "outside" in fetcher.range_problem("bytes 5-4/*", 5, SIZE)
    for bad in (None, "", "5-9/10", "bytes */10", "bytes 5-9/10, bytes 1-2/10", "bytes -5-9/10"):
        assert fetcher.range_problem(bad, 5, SIZE) == "not bytes START-END/TOTAL", bad


def test_a_good_hub_that_cuts_once_completes_with_the_right_hash(hub, tmp_path, quick):
    took, digest, progress = fetch(hub, tmp_path, stall_s=1, stall_bytes=1024)
    print(f"\ngood hub, cut once: complete in {took:.2f} s after {progress.resumes} resume(s), "
          f"{hub.served} bytes served for {SIZE}")
    assert digest == hashlib.sha256(DATA).hexdigest() and progress.resumes == 1
    assert (tmp_path / "m" / PATH).read_bytes() == DATA
    assert hub.requests == [None, SIZE // 2] and hub.served == SIZE   # not a byte twice
