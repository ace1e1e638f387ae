"""Rolling mode's pure parts (./roll.py drives pyinfra's CLI with them): which hosts roll, in which
batches, the ``--limit`` that picks a batch's hosts and no other, what each batch's converge said
of each host, and the roll's summary."""

from __future__ import annotations

import fnmatch
import glob
import json
import math
import os
import re
import stat
import time
from pathlib import Path

from rigup.boundary import owned, results
from rigup.boundary.core import Unreadable, loads
from rigup.boundary.numbers import json_whole
from rigup.config import BATCH
from rigup.contract import MAPS

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# pyinfra's options that pick hosts (roll.py picks them itself); any prefix of one names it alone
# among pyinfra 3.10's options (none other starts --l or --e): what an argparse-style parser takes
HOST_OPTIONS = ("--limit", "--exclude")
# rigup.summary's block at the end of a play, one line per host of the run:
# "    [name] converged (3 changed)", "[name] unchanged", "[name] failed at OP: why",
# "[name] unreachable: why", "[name] refused (n reasons): why", each maybe followed by "; note"
SUMMARY = "--> rigup: what happened to each host"
_LINE = re.compile(r"^\s*\[([^\]]+)\] ((converged \([0-9]+ changed\)|unchanged|failed at|unreachable:|refused \()(.*))$")
DONE, FAILED, UNKNOWN = "done", "failed", "unknown"


def journal_path() -> Path:
    """roll.py's journal of the roll in progress: ``$RIGUP_CACHE_DIR`` (~/.cache/rigup)/roll.json."""
    return Path(os.environ.get("RIGUP_CACHE_DIR") or Path.home() / ".cache" / "rigup") / "roll.json"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def left_behind(path: Path | None = None) -> tuple[dict | None, str | None]:
    """(the journal of a roll that died midway, or None; why the journal does not read, or None).
    A journal whose roll still runs is :class:`Running`: two rolls at once would drain each
    other's hosts. The journal's directory, when it exists, is checked first, journal or not
    (:func:`journal_directory`): one another user can write is :class:`Unjournaled`, naming it
    and the fix, before any drain (:func:`note` writes there next)."""
    path = path or journal_path()
    where = f"controller:{path}"
    if os.path.lexists(path.parent):
        try:
            journal_directory(path, where)
        except Unreadable as e:
            raise Unjournaled(f"{e.where}: {e.why} (the roll keeps its journal there), or set RIGUP_CACHE_DIR "
                              "to a directory of your own") from None
    if not path.exists():
        return None, None
    try:
        doc = results.roll_journal(loads(owned.read(path, where), where), where)
    except Unreadable as e:
        return None, f"{e.where}: {e.why}"
    if alive(doc["pid"]) and doc["pid"] != os.getpid():
        raise Running(f"another roll runs (pid {doc['pid']}, started {time.strftime('%H:%M:%S', time.localtime(doc['started']))}, "
                      f"at batch {', '.join(doc['batch'])}): let it finish, or stop it first")
    return doc, None


def journal_directory(path: Path, where: str) -> Path:
    """The directory the journal ``path`` is in, checked as :func:`note`'s write (rigup.boundary.owned)
    reaches it: that directory is on the journal's path, where a link of yours or root's is followed
    (``RIGUP_CACHE_DIR`` -> a directory of yours elsewhere), so a link there is followed when it is,
    to the directory it leads to, checked as ``owned.directory`` checks one; a link of another user's
    is :class:`~rigup.boundary.owned.NotOwned`. owned.directory alone refused every link there
    (round 3 rerun, NJ5: a cache kept behind a link of one's own stopped every roll)."""
    here = path.parent
    for _ in range(40):
        try:
            st = os.lstat(here)
            if not stat.S_ISLNK(st.st_mode):
                return owned.directory(here, where)
            if st.st_uid not in (os.geteuid(), 0):
                raise owned.NotOwned(where, f"{path}: the link {here} on its path is owned by uid {st.st_uid}, "
                                            "not by you or root: name the directory it leads to")
            here = Path(here.parent, os.readlink(here))   # a relative link: from the link's own directory
        except OSError as e:   # a link that leads nowhere: owned.write could not write there either
            raise owned.NotOwned(where, f"{path} cannot be read on the controller: {here}: {e.strerror}") from None
    raise owned.NotOwned(where, f"{path}: more than 40 links on its path")


class Running(Exception):
    """Another roll.py runs now (its journal's pid is alive)."""


class Unjournaled(Exception):
    """The journal's directory is one another user can write: no roll keeps its journal there."""


def note(path: Path, doc: dict | None) -> str | None:
    """Write (``doc``) or remove (None) the journal, in the controller's own directory; why it could
    not be (the disk full, a directory another user can write), or None: roll.py decides what a
    roll without its journal does, never a traceback with a batch drained."""
    try:
        if doc is None:
            path.unlink(missing_ok=True)
        else:
            owned.write(path, json.dumps(doc, sort_keys=True) + "\n", f"controller:{path}")
    except Unreadable as e:
        return f"{e.where}: {e.why}"
    except OSError as e:
        return f"controller:{path}: {e.strerror or e}"
    return None


def resumed(plan: list[list[str]], dead: dict | None) -> list[list[str]]:
    """The batches with the dead roll's batch first (its hosts were drained, or half converged:
    they are rolled before any other), each of its hosts taken out of the batch it was in."""
    if not dead:
        return plan
    first = [n for n in dead["batch"] if any(n in b for b in plan)]
    rest = [[n for n in b if n not in first] for b in plan]
    return ([first] if first else []) + [b for b in rest if b]


def host_options(args: list[str]) -> list[str]:
    """The arguments among ``args`` that pick hosts for pyinfra: ``--limit X``, ``--limit=X``, and
    any abbreviation (``--lim``, ``--l=X``, ``--ex``...): roll.py refuses them all."""
    found = []
    for arg in args:
        option = arg.split("=", 1)[0]
        if option.startswith("--") and len(option) > 2 and any(o.startswith(option) for o in HOST_OPTIONS):
            found.append(arg)
    return found


def limit_pattern(name: str) -> str:
    """A ``--limit`` pattern that pyinfra 3.10 reads as the host ``name`` alone: pyinfra takes a
    pattern for a group when a group has that name, else matches host names with fnmatch; this one
    holds a bracket (one of ``name``'s characters as a one-letter set), which no group name of an
    inventory file holds, and its other characters are escaped (``*?[``)."""
    at = next((i for i, c in enumerate(name) if c != "!"), None)   # "[!" would negate the set
    if at is None:
        raise ValueError(f"no --limit pattern names the host {name!r} alone")
    return glob.escape(name[:at]) + "[" + name[at] + "]" + glob.escape(name[at + 1:])


def limited(patterns: list[str], groups: dict[str, list[str]], names: list[str]) -> set[str]:
    """The hosts pyinfra 3.10's ``--limit`` picks for ``patterns`` (pyinfra_cli.cli's
    _get_inventory_pattern_matches): per pattern, the hosts of the group of that name if there is
    one, else the host names (``names``) that fnmatch it."""
    found: set[str] = set()
    for pattern in patterns:
        found.update(groups[pattern] if pattern in groups else [n for n in names if fnmatch.fnmatch(n, pattern)])
    return found


def limiter(inventory):
    """A function: hosts -> the --limit arguments that pick them and no other host of ``inventory``
    (pyinfra's), or why none do."""
    groups = {name: [h.name for h in hosts] for name, hosts in inventory.groups.items()}
    names = [h.name for h in inventory]

    def limit(hosts: list[str]) -> list[str] | str:
        try:
            patterns = [limit_pattern(n) for n in hosts]
        except ValueError as e:
            return str(e)
        picked = limited(patterns, groups, names)
        if picked != set(hosts):
            return f"pyinfra's --limit {' '.join(patterns)} would pick {', '.join(sorted(picked)) or 'no host'}"
        return [a for p in patterns for a in ("--limit", p)]
    return limit


def flag(name: str, data: dict, key: str) -> bool:
    """Host ``name``'s ``key`` (a bool setting) read typed, as its play reads it: ValueError naming the host
    and the key for a value not of its form (round 13 RO1: ``rigup_maintenance: "false"`` was true here by
    truthiness, and the host silently left out of the roll, while its plays refuse the value)."""
    from rigup.config import ConfigError, peer_value

    try:
        return bool(peer_value(data, key))
    except ConfigError as e:
        raise ValueError(f"host {name}: {e}") from None


def serving_hosts(hosts: dict[str, dict]) -> list[str]:
    """The hosts that roll (``hosts``: name -> data, inventory order): those serving an instance,
    gateways and hosts in maintenance (rigup_maintenance) excepted; ValueError for a setting not of its form."""
    return [name for name, data in hosts.items() if not flag(name, data, "balancer_gateway")
            and not flag(name, data, "rigup_maintenance") and any(data.get(var) for var in MAPS)]


def batch_of(data: dict[str, dict], hosts: list[str]):
    """The roll's rigup_batch, read from every host it rolls: one roll has one, so hosts that set it apart
    are named (ValueError; round 14 RO3: another host's bad value was ignored without a word)."""
    seen: dict[str, str] = {}
    for h in hosts:
        seen.setdefault(repr(data[h].get("rigup_batch", 1)), h)
    if len(seen) > 1:
        raise ValueError(f"rigup_batch: the hosts of one roll set it apart ({', '.join(f'{h}: {v}' for v, h in seen.items())}): "
                         "set it once, for their group or all")
    return data[hosts[0]].get("rigup_batch", 1) if hosts else 1


def batches(names: list[str], batch, alone=frozenset()) -> list[list[str]]:
    """``names`` cut into batches of ``batch`` hosts (an int >= 1, or "N%" of them, at least 1); the
    hosts of ``alone`` first, each in a batch of its own (burnin_pulse: a pulse can drop a marginal
    host or trip a rack circuit, so one host pulses at a time)."""
    if alone:
        return [[n] for n in names if n in alone] + batches([n for n in names if n not in alone], batch)
    if isinstance(batch, str) and BATCH.fullmatch(batch):
        size = max(1, math.floor(len(names) * int(batch[:-1]) / 100))
    elif isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1:
        size = batch
    else:
        raise ValueError(f"rigup_batch: expected a count >= 1 or a share such as \"25%\", got {batch!r}")
    return [names[i:i + size] for i in range(0, len(names), size)]


def setting(data: dict, key: str, default: int, lo: int, hi: int) -> int:
    """The roll's whole-number setting ``key`` of a host's ``data`` (``default`` when unset): an int
    within ``lo``..``hi`` of the inventory (YAML's ``2m``, ``'2'`` or ``0.5`` are not one), else
    ValueError naming the key: a lease of 0 would drain with no lease and spin its renewals."""
    value = data.get(key, default)
    got = json_whole(value, hi, lo)
    if got is None:
        raise ValueError(f"{key}: expected a whole number of {lo}..{hi}, got {str(value)[:40]!r}")
    return got


SETTINGS = (("rigup_drain_lease_s", 120, 3, 86400), ("rigup_max_fail", 0, 0, 100000))


def settings(data: dict[str, dict], hosts: list[str]) -> tuple[int, int]:
    """The roll's lease and failures allowed (:data:`SETTINGS`), read from every host it rolls: one
    roll has one of each, so a host whose own value is bad or differs is named (ValueError; re-round 6
    NR2: another host's '2m' or -3 was ignored without a word). Defaults without hosts."""
    got = []
    for key, default, lo, hi in SETTINGS:
        seen: dict[int, str] = {}
        for h in hosts or [None]:
            try:
                seen.setdefault(setting(data[h] if h else {}, key, default, lo, hi), h)
            except ValueError as e:
                raise ValueError(f"{h}: {e}") from None
        if len(seen) > 1:
            raise ValueError(f"{key}: the hosts of one roll set it apart ({', '.join(f'{h}: {v}' for v, h in seen.items())}): "
                             "set it once, for their group or all")
        got.append(next(iter(seen)))
    return got[0], got[1]


def said(output: str) -> dict[str, str]:
    """Each host's line of rigup.summary's block (the last one in ``output``): name -> what it says
    ("converged (3 changed)", "failed at OP: why", ...)."""
    lines = _ANSI.sub("", output).splitlines()
    # the header alone on its line, as rigup.summary prints it: a host's own output echoed by pyinfra
    # ("[h1] --> rigup: what happened to each host", then "[h1] converged (2 changed)") is no block (round 33 R33a)
    heads = [i for i, line in enumerate(lines) if line.rstrip() == SUMMARY]
    found = {}
    for line in lines[heads[-1] + 1:] if heads else []:
        match = _LINE.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def outcomes(output: str, names: list[str], returncode: int, dry: bool = False) -> dict[str, tuple[str, str]]:
    """Each host of a batch: (DONE, its line) when its own summary line says it converged or is
    unchanged, (FAILED, its line) when it says failed, unreachable or refused, else (UNKNOWN, why):
    pyinfra said nothing of it, whatever its exit code. With ``dry`` (pyinfra's --dry runs nothing
    and prints no summary) a host no line fails is (DONE, "planned") when pyinfra exited 0."""
    lines = said(output)
    found = {}
    for name in names:
        line = lines.get(name)
        if line is not None:
            found[name] = (DONE if line.startswith(("converged", "unchanged")) else FAILED, line)
        elif dry and not returncode:
            found[name] = (DONE, "planned (--dry: nothing changed)")
        elif dry:
            found[name] = (FAILED, f"pyinfra exited {returncode}")
        else:
            found[name] = (UNKNOWN, f"pyinfra's output has no result line for it (pyinfra exited {returncode})")
    return found


def strays(output: str, names: list[str]) -> dict[str, str]:
    """The hosts the summary speaks of that are not among ``names`` (a converge that reached hosts
    outside its batch): name -> its line."""
    return {name: line for name, line in said(output).items() if name not in names}


def summary(done: list[str], failed: dict[str, str], not_started: list[str], *, unknown: dict[str, str] | None = None,
            halted: dict[str, str] | None = None, strayed: dict[str, str] | None = None, planned: bool = False,
            stopped: str | None = None) -> list[str]:
    """The roll's last lines: done (``planned``: --dry's), failed (why), unknown (pyinfra said
    nothing of them: their state is not known), not converged (``halted``: the roll stopped before
    them, why), converged outside their batch (``strayed``: undrained), not started; then why the
    roll stopped, if it did."""
    lines = [f"    [{name}] {'planned (--dry: nothing changed)' if planned else 'done'}" for name in done]
    lines += [f"    [{name}] failed: {why}" for name, why in failed.items()]
    lines += [f"    [{name}] unknown: {why}; left out of the pool" for name, why in (unknown or {}).items()]
    lines += [f"    [{name}] not converged: {why}" for name, why in (halted or {}).items()]
    lines += [f"    [{name}] converged outside its batch, not drained: {why}" for name, why in (strayed or {}).items()]
    lines += [f"    [{name}] not started (still serving as before)" for name in not_started]
    lines += [f"    the roll stopped: {stopped}"] if stopped else []
    return ["--> rigup roll: what happened to each host"] + lines
