"""Facts only preflight needs (the shared hardware facts are in rigup/gpu/facts.py)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigup.boundary.numbers import whole
from rigup.nofollow import FUNCTIONS, read_file

MARK = "##rigup-bytes:"


def path_bytes_command(paths, marker: str = ".rigup-complete.json") -> str:
    """Bytes under each path (a link given is followed); a path given as ``(path, revision)``
    counts 0 while its completion ``marker`` names another revision (its files are not the
    wanted revision's: a revision change fetches next to it). The marker is read as its directory's
    owner, never through a link or from a FIFO (rigup.nofollow); ``du`` opens no file."""
    q = shlex.quote
    parts = [FUNCTIONS]
    for entry in paths:
        path, revision = (entry, None) if isinstance(entry, str) else entry
        du = f"du -sbD {q(path)} 2>/dev/null | cut -f1"
        if revision:
            wanted = q(chr(34) + 'revision' + chr(34) + ':' + chr(34) + revision + chr(34))
            other = f"[ -e {q(path + '/' + marker)} ] && ! {read_file(path, path + '/' + marker, 8 << 20)} | grep -qF {wanted}"
            du = f"if {other}; then echo 0; else {du}; fi"
        parts.append(f"echo {q(MARK + path)}; {du}")
    return "; ".join(parts) + "; true" if len(parts) > 1 else "true"


def parse_path_bytes(lines: list[str]) -> dict[str, int]:
    """``path_bytes_command``'s output -> ``{path: bytes}``; 0 for a path that does not exist."""
    out: dict[str, int] = {}
    current = None
    for line in lines:
        if line.startswith(MARK):
            current = line[len(MARK):]
            out[current] = 0
        elif current is not None and whole(line) is not None:   # du's bytes; isdigit() takes "²"
            out[current] = whole(line)
    return out


class PathBytes(FactBase):
    """Bytes under each of ``paths`` (``du -sbD``; see :func:`path_bytes_command`): what a model
    download already put there. ``{"/srv/models/glm": 199715979264, "/srv/models/ds": 0}``."""

    default = dict

    def command(self, paths=(), marker: str = ".rigup-complete.json") -> str:
        return path_bytes_command(paths, marker)

    def process(self, output: list[str]) -> dict[str, int]:
        return parse_path_bytes(output)
