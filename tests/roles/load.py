"""Chat completions against one or more base URLs (round robin), N requests at a concurrency C
(with a 6th argument, a file: rounds of C requests go on until that file exists, N at least; a 7th:
the seconds each such round waits after the last, so that a looping client leaves the host's cores to others):
prints {"ok", "failed", "errors", "tokens", "seconds"} as JSON. Copied to a lab host by
tests/roles/test_balancer.py; standard library only (lab hosts have no packages for it)."""

import concurrent.futures
import json
import os
import sys
import time
import urllib.request

urls, n, concurrency, max_tokens, key = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), open(sys.argv[5]).read().strip()
body = json.dumps({"messages": [{"role": "user", "content": "Count from one to twenty."}],
                   "max_tokens": max_tokens, "temperature": 0}).encode()


def one(i: int):
    request = urllib.request.Request(urls[i % len(urls)] + "/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=900) as r:
            return json.load(r)["usage"]["completion_tokens"], None
    except Exception as e:  # noqa: BLE001 - every failure counts, whatever it is
        return None, f"{type(e).__name__}: {e}"


until = sys.argv[6] if len(sys.argv) > 6 else None
pause = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
start = time.monotonic()
results = []
with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
    results += pool.map(one, range(n))
    while until and not os.path.exists(until):
        results += pool.map(one, range(len(results), len(results) + concurrency))
        if any(e for _, e in results[-concurrency:]):
            time.sleep(max(pause, 0.2))   # a server restarting refuses at once: no busy loop on the host's cores
        elif pause:
            time.sleep(pause)
n = len(results)
errors = [e for _, e in results if e]
print(json.dumps({"ok": n - len(errors), "failed": len(errors), "errors": errors[:5],
                  "tokens": sum(t for t, _ in results if t), "seconds": round(time.monotonic() - start, 2)}))
