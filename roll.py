#!/usr/bin/env python3
"""Roll a change over the fleet a batch at a time, each batch out of the gateways' pools while it
converges, so that the fleet's endpoint keeps answering.

    .venv/bin/python roll.py inventory/mine.py [pyinfra args: -y, --data k=v, --dry ...]

The serving hosts (those with llama_server_instances or vllm_instances, gateways excepted) go in
inventory order, ``rigup_batch`` at a time (1, N or "25%"; roles/base/defaults.yml). For each batch:
on every host of the group ``gateway``, each of the batch's servers is drained (no new requests;
its open ones finish, at most 50 s) then put in ``maint`` (roles/balancer's rigup-balancer-drain,
HAProxy's runtime API, which reads each change back: a drain it cannot verify stops the roll);
then ``pyinfra INVENTORY deploy.py --limit HOST...`` (``--play tune.py``: that play instead) with the
arguments given here (its serving
roles gate a restarted instance on /health and one real completion); then the hosts that
converged are put back ``ready`` and must be UP at every gateway before the next batch.

Each host is picked by its exact inventory name: the ``--limit`` pattern is one pyinfra cannot
read as a group (plays.roll.limit_pattern), and the hosts it picks are checked against the batch
before pyinfra runs. A host is done only when its own line of rigup's summary (the end of the
play) says converged or unchanged; one pyinfra says nothing of is unknown and stops the roll (it
stays out of the pools), as does a summary that speaks of hosts outside the batch. A host that
failed stays out of the pools. More than ``rigup_max_fail`` failed hosts stop the roll: the hosts
not started keep serving untouched. The last lines say which hosts are done, failed (why), unknown,
not converged and not started, and why the roll stopped; the exit code is 0 only when every host
is done. ``--dry`` converges nothing and touches no gateway (each batch's plan is printed).
Each batch's drain carries a lease (``rigup_drain_lease_s``, 120 s), renewed every third of it
while the batch converges: a roll that dies stops renewing it, and each gateway puts the host back
by itself once the lease lapsed and the host answers /health (roles/balancer/shipped/drain.py expire); the
units a burn-in stopped on the host start again after the same lease (roles/burnin accepted).
While it runs, roll.py keeps a journal (``$RIGUP_CACHE_DIR/roll.json``: its pid, the batch and the
step); its pyinfra dies with it (even by SIGKILL). A roll that finds the journal of one that died
names what it left (the batch, and whether it was draining, converging or putting it back) and
rolls that batch first; one that finds the journal of a roll still running refuses to start.
Gateways, and hosts that serve nothing, are not rolled: converge them with deploy.py; nor are hosts
in maintenance. roll.py picks the hosts itself: it refuses ``--limit`` and ``--exclude`` in any
spelling (``--limit=X``, ``--lim X``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from plays import inventory as inventories, roll
from rigup.config import ConfigError, role_defaults
from rigup.names import balancer_drain
from rigup.text import shown, shown_lines
from roles.balancer.config import gateway_backends

ROOT = Path(__file__).resolve().parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def dies_with_parent() -> None:
    """In the child, before pyinfra runs: the kernel sends it SIGTERM when roll.py dies, even by
    SIGKILL (prctl PR_SET_PDEATHSIG, Linux; the standard library has no binding for it, and a
    pipe to a dead parent would only end pyinfra at its next write)."""
    import ctypes
    import signal
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
    if os.getppid() == 1:   # roll.py died before the prctl: not to run at all
        os._exit(1)


def pyinfra(*args: str, echo: bool = True) -> tuple[int, str]:
    """``pyinfra ARGS`` from the project root, its output passed through (``echo``) and kept; it
    dies with roll.py (:func:`dies_with_parent`)."""
    proc = subprocess.Popen([PYINFRA, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=dies_with_parent)
    kept = []
    for line in proc.stdout:
        if echo:
            sys.stdout.write(shown_lines(line, 4000, None))   # pyinfra's output, host text in it
        kept.append(line)
    return proc.wait(), "".join(kept)


HELPER = "rigup-balancer-drain: "
READ_BACK = " (read back from HAProxy)"   # how the helper confirms a change (drain.confirmed)


def helper_said(output: str) -> list[str]:
    """What rigup-balancer-drain said (its lines in pyinfra's output of an exec)."""
    return list(dict.fromkeys(ln.split(HELPER, 1)[1].strip() for ln in roll._ANSI.sub("", output).splitlines()
                              if HELPER in ln))


def at_gateways(inventory: str, gateways: dict[str, list], action: str, names: list[str], args: list[str],
                limit, lease: int | None = None) -> str | None:
    """``rigup-balancer-drain ACTION BACKEND HOST [LEASE]`` on every gateway for each backend that
    holds one of ``names`` (``gateways``: name -> (its drain helper, its backends); ``limit``: a
    host's --limit arguments, or why there is none; ``lease``: maint's and renew's seconds); None,
    or why it failed (the helper's words)."""
    for gateway, (drain, backends) in gateways.items():
        servers = [(b["name"], name) for b in backends for name in names if any(s[0] == name for s in b["servers"])]
        if not servers:
            continue
        pick = limit([gateway])
        if isinstance(pick, str):
            return f"{action} at gateway {gateway}: {pick}"
        extra = [str(lease)] if lease else []
        steps = " && ".join(shlex.join([drain, action, backend, name, *extra]) for backend, name in servers)
        # one argument: pyinfra's exec joins its arguments with spaces into one shell command
        code, out = pyinfra("-y", *pick, *[a for a in args if a != "-y"], inventory, "exec", "--", steps,
                            echo=action != "renew")
        said = helper_said(out)
        if code:
            errors = [line for line in said if not line.endswith(READ_BACK)]
            return f"{action} at gateway {gateway} failed: {'; '.join(errors) or f'pyinfra exited {code}'}"
        if action == "renew":
            continue
        unconfirmed = [f"{b}/{n}" for b, n in servers if f"{b}/{n} is {action}{READ_BACK}" not in said]
        if unconfirmed:
            return (f"{action} at gateway {gateway}: its drain helper read back no {action} of "
                    f"{', '.join(unconfirmed)} (an older helper? converge the gateways first)")
    return None


@contextlib.contextmanager
def renewing(renew, lease: int):
    """``renew()`` every third of ``lease`` seconds while the block runs (the batch's converge): a
    renewal that fails is said, and the next one tried (the lease lapses only when none came)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(lease / 3):
            why = renew()
            if why:
                print(shown(f"--> rigup roll: the drain's lease was not renewed: {why}", 4000), flush=True)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


def play_of(args: list[str]) -> tuple[str, list[str]]:
    """The play each batch runs (``--play FILE``, e.g. tune.py; deploy.py by default) and the
    other arguments."""
    if "--play" not in args:
        return "deploy.py", args
    i = args.index("--play")
    if i + 1 >= len(args):
        raise SystemExit("roll.py: --play needs a play file (deploy.py, tune.py)")
    return args[i + 1], args[:i] + args[i + 2:]


def main(argv: list[str]) -> int:
    picking = roll.host_options(argv[1:])
    if not argv or argv[0].startswith("-") or picking:
        print(__doc__.strip() + "\n\n" + shown("roll.py picks the hosts itself: no --limit or --exclude"
                                                + (f" (got {' '.join(picking)})." if picking else "."), 4000), file=sys.stderr)
        return 2
    inventory, args = argv[0], argv[1:]
    play, args = play_of(args)
    inv = inventories.read(inventory, inventories.overrides(args))   # as pyinfra's CLI reads it
    data = {h.name: {**role_defaults("base"), **role_defaults("balancer"), **h.data.dict()} for h in inv}
    limit = roll.limiter(inv)
    dry = "--dry" in args
    try:   # every number and flag of the roll read before anything is drained: a bad one ends it here, named
        hosts = roll.serving_hosts(data)
        plan = roll.batches(hosts, roll.batch_of(data, hosts), {h for h in hosts if roll.flag(h, data[h], "burnin_pulse")})
        lease, max_fail = roll.settings(data, hosts)
        # each gateway's backends, its peers' settings read typed (a peer's port as text: ConfigError, round 14 RO2)
        gateways = {name: (balancer_drain(d), gateway_backends(name, data, d["balancer_gateway_bind"]))
                    for name, d in data.items() if roll.flag(name, d, "balancer_gateway")}
    except (ValueError, ConfigError) as e:
        print(shown(f"roll.py: {inventory}: {e}", 4000), file=sys.stderr)
        return 2
    journal = roll.journal_path()
    try:
        dead, unread = (None, None) if dry else roll.left_behind(journal)
    except (roll.Running, roll.Unjournaled) as e:
        print(shown(f"roll.py: {e}", 4000), file=sys.stderr)
        return 2
    except OSError as e:
        dead, unread = None, str(e)
    if unread:
        print(shown(f"--> rigup roll: the last roll's journal does not read ({unread}): rolling as usual", 4000))
    if dead:
        what = {"draining": "draining it at the gateways", "converging": "converging it (a build switch, a burn-in "
                "or a restart there may be cut short)", "readying": "putting it back in the gateways' pools"}[dead["step"]]
        print(shown(f"--> rigup roll: the roll of pid {dead['pid']} (started "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(dead['started']))}) died while {what}: "
                    f"{', '.join(dead['batch'])}; rolled first now (drained, converged, put back)", 4000), flush=True)
        plan = roll.resumed(plan, dead)
    started = time.time()

    def step(batch: list[str], name: str) -> str | None:
        """The journal's step; why it was not written (the disk full, its directory another
        user's), else None."""
        return None if dry else roll.note(journal, {"pid": os.getpid(), "started": started, "at": time.time(),
                                                     "inventory": inventory, "batch": batch, "step": name})
    done, failed, unknown, halted, strayed, stopped = [], {}, {}, {}, {}, None
    for i, batch in enumerate(plan):
        if len(failed) > max_fail:
            stopped = f"{len(failed)} failed host(s), rigup_max_fail is {max_fail}"
            break
        print(shown(f"--> rigup roll: batch {i + 1}/{len(plan)}: {', '.join(batch)}", 4000), flush=True)
        pick = limit(batch)
        if isinstance(pick, str):
            halted.update({name: pick for name in batch})
            stopped = f"no --limit picks batch {i + 1} alone: {pick}"
            break
        unjournaled = step(batch, "draining")
        if unjournaled:   # not drained: a roll that dies now would leave no word of its batch
            halted.update({name: "not drained: the roll's journal could not be written" for name in batch})
            stopped = f"the roll's journal could not be written: {unjournaled}"
            break
        why = None if dry else at_gateways(inventory, gateways, "maint", batch, args, limit, lease)
        if why:   # not converged: back in the pools where it left them (it serves as before)
            back = at_gateways(inventory, gateways, "ready", batch, args, limit)
            halted.update({name: f"its drain could not be verified; "
                                 + ("back ready at the gateways" if not back else f"and back ready failed: {back}")
                           for name in batch})
            stopped = f"a drain could not be verified: {why}"
            break
        unjournaled = step(batch, "converging")   # drained: the batch goes on, the roll stops after it
        with renewing(lambda: None if dry else at_gateways(inventory, gateways, "renew", batch, args, limit, lease),
                      lease):
            code, out = pyinfra(inventory, play, *pick, "--data", "rigup_rolling=true", *args)
        result = roll.outcomes(out, batch, code, dry)
        failed.update({name: why for name, (kind, why) in result.items() if kind == roll.FAILED})
        unknown.update({name: why for name, (kind, why) in result.items() if kind == roll.UNKNOWN})
        ok = [name for name in batch if result[name][0] == roll.DONE]
        unjournaled = step(batch, "readying") or unjournaled
        why = None if dry or not ok else at_gateways(inventory, gateways, "ready", ok, args, limit)
        failed.update({name: why for name in ok if why})
        done += [name for name in ok if not why]
        strayed.update(roll.strays(out, batch))
        if strayed:
            stopped = f"pyinfra's summary speaks of hosts outside batch {i + 1}: {', '.join(strayed)}"
            break
        if any(name in unknown for name in batch):
            stopped = f"pyinfra said nothing of {', '.join(n for n in batch if n in unknown)}: their state is unknown"
            break
        if unjournaled:
            stopped = f"the roll's journal could not be written during batch {i + 1}: {unjournaled}"
            break
    else:
        if len(failed) > max_fail:
            stopped = f"{len(failed)} failed host(s), rigup_max_fail is {max_fail}"
    gone = None if dry else roll.note(journal, None)   # ended, however: what it left is in its summary
    if gone:
        print(shown(f"--> rigup roll: its journal was not removed ({gone}): the next roll names this one's last batch",
                    4000), flush=True)
    seen = set(done) | set(failed) | set(unknown) | set(halted) | set(strayed)
    not_started = [name for name in hosts if name not in seen]
    print(shown_lines("\n".join(roll.summary(done, failed, not_started, unknown=unknown, halted=halted, strayed=strayed,
                                             planned=dry, stopped=stopped)), 4000, None), flush=True)
    return 0 if len(done) == len(hosts) and not strayed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
