"""Files and directories a role manages, read in one round trip per role.

pyinfra's ``files.template``/``files.put`` read three facts per file (the file, its directory,
its sha1) and ``files.directory`` one per directory: a role with five files costs fifteen round
trips on a converge that has nothing to do. Here a role names all its paths once; the first of
its operations reads :class:`FileStates` for all of them (``read_once``) and each operation
compares what it wants with that, writing only what differs.
"""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase
from rigup.probe import operation
from pyinfra.operations import files

from rigup.state import read_once, reading


def parse_file_states(paths: list[str], lines: list[str]) -> dict[str, dict | None]:
    """One line per path: ``missing``, or ``USER GROUP MODE KIND SHA256`` (KIND f, d or l)."""
    out: dict[str, dict | None] = {}
    for path, line in zip(paths, lines):
        cols = line.split()
        out[path] = None if len(cols) != 5 else dict(zip(("user", "group", "mode", "kind", "sha256"), cols))
    return out


class FileStates(FactBase):
    """``{path: {"user", "group", "mode", "kind", "sha256"} or None}`` for ``paths``, in one command
    (mode in octal without leading zeros, as ``stat %a``; sha256 ``-`` for a directory)."""

    def command(self, paths: list[str]) -> str:
        self.paths = list(paths)
        return ("for p in " + " ".join(shlex.quote(p) for p in paths) + "; do "
                'if [ -L "$p" ]; then echo "$(stat -c "%U %G %a" "$p") l -"; '
                'elif [ -d "$p" ]; then echo "$(stat -c "%U %G %a" "$p") d -"; '
                'elif [ -f "$p" ]; then echo "$(stat -c "%U %G %a" "$p") f $(sha256sum "$p" | cut -c1-64)"; '
                "else echo missing; fi; done")

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
