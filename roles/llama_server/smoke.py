"""What a new llama.cpp build is tried with before it serves (roles/llama_cpp's smoke inference):
each instance's own flags, from the same argv as its drop-in. Pure: plan and data in."""

from __future__ import annotations

from rigup.models import serving
from rigup.names import marker_path
from roles.llama_server.command import argv, servers
from roles.llama_server.replicas import layout
from roles.llama_server.schema import instances


def smoke_runs(plan: dict, data: dict, fleet=None) -> list[dict]:
    """One run per instance (its first server, with that server's environment): ``{name, marker,
    args, env}``, ``args`` being llama-server's flags after ``-m MODEL``; none when nothing serves."""
    wanted, entries = serving(data, instances)
    runs = []
    for name, inst in sorted((wanted or {}).items()):
        entry = entries[inst["model"]]
        first = servers(name, inst, layout(inst, entry, plan, data))[0]
        args = argv(name, first["inst"], "llama-server", "MODEL")[3:]
        runs.append({"name": name, "marker": marker_path(entry["dest"]), "args": args, "env": first["env"]})
    return runs
