#!/usr/bin/env python3
"""Roll a change over the fleet a batch at a time, each batch out of the gateways' pools while it
converges, so that the fleet's endpoint keeps answering.

    .venv/bin/python roll.py inventory/mine.py [pyinfra args: -y, --data k=v, --dry ...]

The serving hosts (those with llama_server_instances or vllm_instances, gateways excepted) go in
inventory order, ``rigup_batch`` at a time (1, N or "25%"; roles/base/defaults.yml). For each batch:
on every host of the group ``gateway``, each of the batch's servers is drained (no new requests;
its open ones finish, at most 50 s) then put in ``maint`` (roles/balancer's rigup-balancer-drain,
HAProxy's runtime API); then ``pyinfra INVENTORY deploy.py --limit HOST...`` with the arguments
given here (its serving roles gate a restarted instance on /health and one real completion); then
the hosts that converged are put back ``ready`` and must be UP at every gateway before the next
batch. A host that failed stays out of the pools. More than ``rigup_max_fail`` failed hosts stop
the roll: the hosts not started keep serving untouched. The last lines say which hosts are done,
failed (why) and not started; the exit code is 0 only when every host is done. ``--dry`` converges
nothing and touches no gateway (each batch's plan is printed). Gateways, and hosts that serve
nothing, are not rolled: converge them with deploy.py; nor are hosts in maintenance.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
from pyinfra_cli.util import parse_cli_arg

from rigup import roll
from rigup.config import role_defaults
from rigup.names import balancer_drain
from roles.balancer.config import gateway_backends

ROOT = Path(__file__).resolve().parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def overrides(args: list[str]) -> dict:
    """The ``--data key=value`` pairs among pyinfra's arguments, read as pyinfra reads them."""
    pairs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--data"]
    pairs += [a.split("=", 1)[1] for a in args if a.startswith("--data=")]
    return {k: parse_cli_arg(v) for k, _, v in (p.partition("=") for p in pairs)}


def pyinfra(*args: str) -> tuple[int, str]:
    """``pyinfra ARGS`` from the project root, its output passed through and kept."""
    proc = subprocess.Popen([PYINFRA, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kept = []
    for line in proc.stdout:
        sys.stdout.write(line)
        kept.append(line)
    return proc.wait(), "".join(kept)


def at_gateways(inventory: str, gateways: dict[str, list], action: str, names: list[str], args: list[str]) -> str | None:
    """``rigup-balancer-drain ACTION BACKEND HOST`` on every gateway for each backend that holds one
    of ``names`` (``gateways``: name -> (its drain helper, its backends)); None, or why it failed."""
    for gateway, (drain, backends) in gateways.items():
        steps = [shlex.join([drain, action, b["name"], name]) for b in backends for name in names
                 if any(s[0] == name for s in b["servers"])]
        if not steps:
            continue
        # one argument: pyinfra's exec joins its arguments with spaces into one shell command
        code, out = pyinfra("-y", "--limit", gateway, *[a for a in args if a != "-y"], inventory, "exec", "--",
                            " && ".join(steps))
        if code:
            return f"{action} at gateway {gateway} failed (pyinfra exited {code})"
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or "--limit" in argv:
        print(__doc__.strip() + "\n\nroll.py picks the hosts itself: no --limit.", file=sys.stderr)
        return 2
    inventory, args = argv[0], argv[1:]
    ctx_state.set(State())   # the inventory file is read as pyinfra's CLI reads it
    data = {h.name: {**role_defaults("base"), **role_defaults("balancer"), **h.data.dict()}
            for h in make_inventory(inventory, override_data=overrides(args), cwd=str(ROOT))}
    dry = "--dry" in args
    hosts = roll.serving_hosts(data)
    first = data[hosts[0]] if hosts else {}
    plan = roll.batches(hosts, first.get("rigup_batch", 1))
    max_fail = first.get("rigup_max_fail", 0)
    gateways = {name: (balancer_drain(d), gateway_backends(name, data, d["balancer_gateway_bind"]))
                for name, d in data.items() if d.get("balancer_gateway")}
    done, failed = [], {}
    for i, batch in enumerate(plan):
        if len(failed) > max_fail:
            break
        print(f"--> rigup roll: batch {i + 1}/{len(plan)}: {', '.join(batch)}", flush=True)
        why = None if dry else at_gateways(inventory, gateways, "maint", batch, args)
        if why:
            failed.update({name: why for name in batch})
            continue
        code, out = pyinfra(inventory, "deploy.py", *[a for n in batch for a in ("--limit", n)], *args)
        result = roll.outcomes(out, batch, code)
        failed.update({name: why for name, why in result.items() if why})
        ok = [name for name in batch if not result[name]]
        why = None if dry or not ok else at_gateways(inventory, gateways, "ready", ok, args)
        failed.update({name: why for name in ok if why})
        done += [name for name in ok if not why]
    not_started = [name for name in hosts if name not in done and name not in failed]
    print("\n".join(roll.summary(done, failed, not_started)), flush=True)
    if len(failed) > max_fail:
        print(f"    the roll stopped: {len(failed)} failed host(s), rigup_max_fail is {max_fail}")
    return 0 if len(done) == len(hosts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
