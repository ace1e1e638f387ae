"""Facts only preflight needs (the shared hardware facts are in rigup/gpu/facts.py)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

MARK = "##rigup-bytes:"


def path_bytes_command(paths: list[str] | tuple[str, ...]) -> str:
    parts = [f"echo {shlex.quote(MARK + p)}; du -sb {shlex.quote(p)} 2>/dev/null | cut -f1"
             for p in paths]
    return "; ".join(parts) + "; true" if parts else "true"


def parse_path_bytes(lines: list[str]) -> dict[str, int]:
    """``path_bytes_command``'s output -> ``{path: bytes}``; 0 for a path that does not exist."""
    out: dict[str, int] = {}
    current = None
    for line in lines:
        if line.startswith(MARK):
            current = line[len(MARK):]
            out[current] = 0
        elif current is not None and line.strip().isdigit():
            out[current] = int(line.strip())
    return out


class PathBytes(FactBase):
    """Bytes under each of ``paths`` (``du -sb``): what a model download already put there.
    ``{"/srv/models/glm": 199715979264, "/srv/models/ds": 0}``."""

    default = dict

    def command(self, paths: list[str] | tuple[str, ...] = ()) -> str:
        return path_bytes_command(paths)

    def process(self, output: list[str]) -> dict[str, int]:
        return parse_path_bytes(output)
