"""Rolling mode's pure parts (./roll.py drives pyinfra's CLI with them): which hosts roll, in which
batches, what each batch's converge said of each host, and the roll's summary."""

from __future__ import annotations

import math
import re

from rigup.config import BATCH

SERVING_MAPS = ("llama_server_instances", "vllm_instances")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# rigup.summary's lines: "    [name] failed at OP: why", "[name] unreachable: why", "[name] refused (...): why"
_LINE = re.compile(r"^\s*\[([^\]]+)\] (failed at .*|unreachable: .*|refused .*|converged .*|unchanged)$")


def serving_hosts(hosts: dict[str, dict]) -> list[str]:
    """The hosts that roll (``hosts``: name -> data, inventory order): those serving an instance,
    gateways and hosts in maintenance (rigup_maintenance) excepted."""
    return [name for name, data in hosts.items() if not data.get("balancer_gateway") and not data.get("rigup_maintenance")
            and any(data.get(var) for var in SERVING_MAPS)]


def batches(names: list[str], batch) -> list[list[str]]:
    """``names`` cut into batches of ``batch`` hosts (an int >= 1, or "N%" of them, at least 1)."""
    if isinstance(batch, str) and BATCH.fullmatch(batch):
        size = max(1, math.floor(len(names) * int(batch[:-1]) / 100))
    elif isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1:
        size = batch
    else:
        raise ValueError(f"rigup_batch: expected a count >= 1 or a share such as \"25%\", got {batch!r}")
    return [names[i:i + size] for i in range(0, len(names), size)]


def outcomes(output: str, names: list[str], returncode: int) -> dict[str, str | None]:
    """Each host of a batch: None when its converge went well, else why not (rigup.summary's line
    for it; pyinfra's exit code when a failed run said nothing of the host)."""
    said = {}
    for line in _ANSI.sub("", output).splitlines():
        match = _LINE.match(line)
        if match and match.group(1) in names:
            said[match.group(1)] = match.group(2)
    found = {}
    for name in names:
        line = said.get(name, "")
        if line.startswith(("failed", "unreachable", "refused")):
            found[name] = line
        elif returncode and name not in said:
            found[name] = f"pyinfra exited {returncode}"
        else:
            found[name] = None
    return found


def summary(done: list[str], failed: dict[str, str], not_started: list[str]) -> list[str]:
    """The roll's last lines: done, failed (why), not started."""
    lines = [f"    [{name}] done" for name in done]
    lines += [f"    [{name}] failed: {why}" for name, why in failed.items()]
    lines += [f"    [{name}] not started (still serving as before)" for name in not_started]
    return ["--> rigup roll: what happened to each host"] + lines
