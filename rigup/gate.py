"""The health gate of a serving unit (llama_server, vllm): /health 200, then one real chat
completion; on failure, the unit's last journal lines. Runs on the controller at execution time
(``python.call``), one SSH command per probe, retried with tenacity. With ``record`` (a path,
rigup.names.gate_record) the completion's tok/s (llama-server's ``timings.predicted_per_second``)
is kept on the host, root-owned JSON written by the gate's own command: the throughput watchdog's
default floor is half of it (roles/watchdog)."""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import logger
from pyinfra.api import OperationError, StringCommand
from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

FAILED = "the unit failed"


def endpoint(bind: str, port: int) -> str:
    """The URL a client on the host reaches a server bound to ``bind`` at: its own address, or
    loopback for a wildcard bind; IPv6 in brackets."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1", "localhost": "127.0.0.1"}.get(bind, bind)
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def record_command(path: str, unit: str, tps: float, at: float) -> str:
    """The shell command that keeps the gate's measured ``tps`` of ``unit`` in ``path`` on the
    host (its directory 0755, the file 0644, replaced whole by a rename)."""
    text = json.dumps({"unit": unit, "tps": round(tps, 3), "at": round(at, 3)}, sort_keys=True)
    folder, tmp = path.rsplit("/", 1)[0], f"{path}.tmp"
    return (f"install -d -m 0755 {shlex.quote(folder)} && printf '%s\\n' {shlex.quote(text)} > {shlex.quote(tmp)} "
            f"&& chmod 0644 {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}")


def measured_tps(answer: dict) -> float | None:
    """The generation tok/s of a completion as llama-server reports it (vLLM does not: None)."""
    tps = (answer.get("timings") or {}).get("predicted_per_second")
    return float(tps) if isinstance(tps, (int, float)) and tps > 0 else None


def gate(host, unit: str, port: int, model: str, prompt: str, timeout: int, auth: str = "",
         poll: float = 1, fail_on_log: str | None = None, bind: str = "127.0.0.1", record: str | None = None) -> str:
    """The text of one completion from the unit's endpoint (at ``bind``:``port``), or
    OperationError with the journal. ``auth`` is curl arguments read on the host (a key never
    passes through here); ``fail_on_log`` fails the gate when the journal has that text even
    though it answered; ``record``: the host path that keeps the completion's tok/s."""
    base = endpoint(bind, port)

    def shell(command: str) -> str:
        ok, output = host.run_shell_command(StringCommand("bash", "-c", shlex.quote(command)),
                                            print_output=False, print_input=False)
        return output.stdout if ok else ""

    def journal() -> str:
        return shell(f"journalctl -u {unit} -n 40 --no-pager -o cat")

    @retry(stop=stop_after_delay(timeout), wait=wait_fixed(poll),
           retry=retry_if_result(lambda r: r not in ("200", FAILED)))
    def health() -> str:
        states = shell(f"systemctl show -p ActiveState -p SubState --value {unit}").split()
        if {"failed", "auto-restart", "inactive"} & set(states) \
                and not shell(f"systemctl list-jobs --no-legend {unit}").strip():
            return FAILED  # it exited and no start is queued (a start --no-block may not have begun): waiting is no use
        return shell(f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' {base}/health || true")

    try:
        code = health()
    except RetryError:
        code = "timeout"
    if code != "200":
        raise OperationError(f"{unit}: /health did not answer 200 within {timeout} s ({code}); "
                             f"last journal lines:\n{journal()}")
    body = json.dumps({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]})
    answer = shell(f"curl -s -m {timeout} {auth} -H 'Content-Type: application/json' "
                   f"-d {shlex.quote(body)} {base}/v1/chat/completions")
    try:
        doc = json.loads(answer)
        text = doc["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):  # empty, not JSON, or not a completion
        raise OperationError(f"{unit}: the health completion failed: {answer[:300] or 'no answer'!r}; "
                             f"last journal lines:\n{journal()}") from None
    if fail_on_log and fail_on_log in journal():
        raise OperationError(f"{unit}: its log says {fail_on_log!r}; last journal lines:\n{journal()}")
    tps = measured_tps(doc)
    if record and tps:
        shell(record_command(record, unit, tps, time.time()))
    return text


def answered(state, host, unit: str, port: int, model: str, prompt: str, timeout: int, **options) -> bool:
    """:func:`gate` as a ``python.call`` after a (re)start: notes the answer, or logs the reason and
    the journal and fails the host (a failed gate is a result, not a traceback)."""
    try:
        text = gate(host, unit, port, model, prompt, timeout, **options)
    except OperationError as e:
        # the journal first, the reason last: the run's summary (rigup.summary) quotes the last lines
        reason, _, journal = str(e).partition("\n")
        if journal:
            host.log_styled(journal, fg="red", log_func=logger.error)
        host.log_styled(reason, fg="red", log_func=logger.error)
        return False
    host.noop(f"{unit} answered: {text!r}")
    return True
