"""Files and directories a role manages, read in one round trip per role.

pyinfra's ``files.template``/``files.put`` read three facts per file (the file, its directory,
its sha1) and ``files.directory`` one per directory: a role with five files costs fifteen round
trips on a converge that has nothing to do. Here a role names all its paths once; the first of
its operations reads :class:`FileStates` for all of them (``read_once``) and each operation
compares what it wants with that, writing only what differs.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from io import StringIO
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FactBase
from rigup.probe import operation
from pyinfra.operations import files

from rigup.config import ROOT
from rigup.state import read_once, reading


_KINDS = {"regular file": "f", "regular empty file": "f", "directory": "d", "symbolic link": "l"}


def parse_file_states(paths: list[str], lines: list[str]) -> dict[str, dict | None]:
    """:class:`FileStates`' output: ``USER GROUP MODE TYPE<tab>PATH`` per path that exists (stat's
    own words for the type), then ``##sha``, then sha256sum's ``HASH  PATH`` per regular file. A
    path missing, of another type (a socket), or a regular file without its hash is None."""
    stats, sums, in_sums = {}, {}, False
    for line in lines:
        if line == "##sha":
            in_sums = True
        elif in_sums:
            if len(line) > 66 and not line.startswith("\\"):   # an escaped name is not one of rigup's
                sums[line[66:]] = line[:64]
        elif "\t" in line:
            head, _, path = line.partition("\t")
            stats[path] = head
    out: dict[str, dict | None] = {}
    for path in paths:
        user, group, mode, kind = (stats.get(path, "").split(" ", 3) + ["", "", "", ""])[:4]
        kind = _KINDS.get(kind)
        sha = sums.get(path) if kind == "f" else "-"
        out[path] = None if not kind or not sha else {"user": user, "group": group, "mode": mode, "kind": kind,
                                                        "sha256": sha}
    return out


class FileStates(FactBase):
    """``{path: {"user", "group", "mode", "kind", "sha256"} or None}`` for ``paths``, in one command
    (mode in octal without leading zeros, as ``stat %a``; sha256 ``-`` for a directory or a link).
    One ``stat`` and one ``sha256sum`` for all the paths: a converge reads about 40 (a stat and a
    hash forked per path cost the host about 0.1 s)."""

    merge_by = "paths"   # rigup/state.py Batch: the reads of several roles in one command

    def command(self, paths: list[str]) -> str:
        self.paths = list(paths)
        quoted = " ".join(shlex.quote(p) for p in paths)
        return ("set --; for p in " + quoted + '; do if [ -f "$p" ] && [ ! -L "$p" ]; then set -- "$@" "$p"; fi; done; '
                "stat --printf '%U %G %a %F\\t%n\\n' -- " + quoted + " 2>/dev/null; echo '##sha'; "
                '[ "$#" -eq 0 ] || sha256sum -- "$@" 2>/dev/null; true')

    def process(self, output: list[str]) -> dict:
        return parse_file_states(self.paths, output)


def _owner_mode(state: dict, user: str | None, group: str | None, mode: str | None) -> bool:
    """Whether ``state`` has this owner and mode (None: any)."""
    return ((user is None or state["user"] == user) and (group is None or state["group"] == group)
            and (mode is None or state["mode"] == str(mode).lstrip("0")))


@reading(FileStates, "paths")
@operation()
def managed(dest: str, text: str, paths: list[str], mode: str = "644", user: str = "root", group: str = "root"):
    """``dest`` holds ``text``, owned ``user:group`` with ``mode``; ``paths`` are all the files
    and directories of the role (read together, once)."""
    state = read_once(FileStates, paths=paths)[dest]
    if state and state["kind"] == "f" and state["sha256"] == hashlib.sha256(text.encode()).hexdigest():
        if _owner_mode(state, user, group, mode):
            host.noop(f"{dest} is as it should be")
            return
        yield f"chown {shlex.quote(f'{user}:{group}')} {shlex.quote(dest)} && chmod {shlex.quote(str(mode))} {shlex.quote(dest)}"
        return
    yield from files.put._inner(src=StringIO(text), dest=dest, mode=mode, user=user, group=group)


@reading(FileStates, "paths")
@operation()
def directory(path: str, paths: list[str], mode: str | None = "755", user: str | None = "root",
              group: str | None = "root"):
    """``path`` is a directory owned ``user:group`` with ``mode`` (None: left as it is; ``paths``:
    as :func:`managed`)."""
    state = read_once(FileStates, paths=paths)[path]
    if state and state["kind"] == "d" and _owner_mode(state, user, group, mode):
        host.noop(f"{path} is as it should be")
        return
    q = shlex.quote(path)
    owner = shlex.quote(f"{user or ''}:{group or ''}")
    yield " && ".join([f"mkdir -p {q}"] + ([f"chown {owner} {q}"] if user or group else [])
                      + ([f"chmod {shlex.quote(str(mode))} {q}"] if mode else []))


@reading(FileStates, "paths")
@operation()
def absent(dest: str, paths: list[str]):
    """``dest`` is not there: a file left from before (a stale secret) is removed (``rm -f``: a
    link is removed, never followed); ``paths``: as :func:`managed`."""
    if read_once(FileStates, paths=paths)[dest] is None:
        host.noop(f"{dest} is not there")
        return
    yield f"rm -f {shlex.quote(dest)}"


# a host program's file: in its owner's shipped/ folder (a role's, the plays'), or the top-level shipped/
SHIPPED = re.compile(r"(?:roles/[a-z][a-z0-9_]*/|plays/)?shipped/[a-z][a-z0-9_]*\.py")


def program_text(path: str) -> str:
    """The text of host program ``path`` (from the checkout's root) as it is installed or sent: the
    one reader of a file of a shipped/ folder (tests/unit/test_host_programs.py holds that nothing
    else reads one). ValueError for any other path: nothing else is shipped."""
    if not SHIPPED.fullmatch(path):
        raise ValueError(f"{path} is no host program (a file of a shipped/ folder)")
    return (ROOT / path).read_text()


def beside_name(path: str) -> str:
    """``shipped/xid.py`` -> ``rigup_xid.py``: the name a program's ``beside`` asks for."""
    return f"rigup_{PurePosixPath(path).stem}.py"


def program_paths(dest: str, beside: tuple[str, ...] = ()) -> list[str]:
    """``dest`` and the files :func:`program` puts beside it, for the role's ``paths``."""
    folder = dest.rsplit("/", 1)[0]
    return [dest, *(f"{folder}/{beside_name(b)}" for b in beside)]


def program(path: str, dest: str, paths: list[str], *, name: str, beside: tuple[str, ...] = (),
            mode: str = "755") -> list:
    """Install host program ``path`` at ``dest`` (root's, ``mode``) and each module of ``beside`` next to it
    as :func:`beside_name` (root's 0644: a program's beside() runs no file another user could write), each
    through :func:`managed` on the role's ``paths`` (read once with its other files). The
    operations, the program's first (for ``_if=any_changed``)."""
    missing = [p for p in program_paths(dest, beside) if p not in paths]
    if missing:   # managed() would KeyError at converge time only: said on the controller, at once
        raise ValueError(f"{name}: {missing} not among the role's paths")
    ops = [managed(name=name, dest=dest, text=program_text(path), paths=paths, mode=mode)]
    for module, at in zip(beside, program_paths(dest, beside)[1:]):
        ops.append(managed(name=f"{name}: {beside_name(module)} beside it ({module})", dest=at,
                           text=program_text(module), paths=paths, mode="644"))
    return ops
