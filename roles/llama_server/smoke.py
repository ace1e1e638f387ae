"""What a new llama.cpp build is tried with before it serves (roles/llama_cpp's smoke inference):
each instance's own flags, from the same argv as its drop-in, as the plan's ``serving`` sizes it
(rigup.serving ``serving_plan``). Pure: plan and data in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.gpu.plan import build_backend
from rigup.models import models
from rigup.names import marker_path
from roles.llama_server.command import argv

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.config import Config


def smoke_runs(plan: Plan, data: Config, fleet=None) -> list[dict]:
    """One run per instance (its first server, with that server's environment): ``{name, marker,
    args, env}``, ``args`` being llama-server's flags after ``-m MODEL``; none when nothing serves.
    ``marker`` (the served model, when on disk) is left out, so that the tiny model answers, for an
    instance split over RPC workers (the smoke runs alone) and, on a GPU build, for one already
    serving (its model would be loaded a second time on the cards it fills)."""
    wanted, entries = plan["serving"]["llama-server"] or {}, models(data)[0]   # None: refused
    serving_now = set(plan.get("serving_units") or [])
    gpu = build_backend(plan, data) == "cuda"
    runs = []
    for name, served in sorted(wanted.items()):
        entry, first = entries[served.inst["model"]], served.servers[0]
        args = argv(name, first["inst"], "llama-server", "MODEL")[3:]
        alone = not served.inst["rpc_workers"] and not (gpu and f"rigup-llama@{first['unit']}" in serving_now)
        runs.append({"name": name, "marker": marker_path(entry["dest"]) if alone else None, "args": args,
                     "env": first["env"]})
    return runs
