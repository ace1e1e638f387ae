"""rigup-watchdog reads a server's HTTP error body with throughput.loads (issue 61, round 4 W1): 3000
'[' raised RecursionError past _error_message's except, and check() called it "the check failed",
never a bad check, so a server answering so was never restarted."""

import io
import urllib.error

import pytest

from roles.watchdog.shipped import watchdog


@pytest.mark.parametrize("body", [b"[" * 3000, b"{" * 50000, b'{"error": {"message": "Loading model"}}'])
def test_W1_an_error_body_nested_past_the_stack_is_a_bad_check(body):
    e = urllib.error.HTTPError("http://127.0.0.1:1/v1/chat/completions", 500, "x", {}, io.BytesIO(body))
    verdict, why = watchdog.failure(e, {"timeout_s": 5})
    print(body[:20], "->", verdict, why[:80])
    assert verdict == "bad" and why.startswith("HTTP 500")
