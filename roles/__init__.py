"""rigup's roles, one package each; none imports another (shared code is in rigup/).

:data:`STEPS` is the play: what deploy.py calls, in order: each role's ``apply``, and
model_fetch's ``waited`` after the build, so that the downloads (started early, in the
background) and the build run at the same time, then llama_cpp's ``proven`` (the new build's smoke
inference, with the served model when it is there by then, and the switch), and model_fetch's
``pruned`` last, once the serving roles restarted on a model's new revision. Adding a role is one
entry here (its ``apply``); :data:`ORDER`, the order preflight runs the roles' checks in and the
docs list them, is the order in which the roles first run. :func:`in_order` imports them (only
the plays do: a pure module such as roles/llama_server/command.py imports no other role).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rigup.role import Role

STEPS = ("base.apply", "nvidia_driver.apply", "model_fetch.apply", "cuda_toolkit.apply", "llama_cpp.apply", "model_fetch.waited",
         "llama_cpp.proven", "gpu_power.apply", "gpu_guard.apply", "cmpunlocker.apply", "burnin.apply", "rpc_worker.apply",
         "llama_server.apply", "vllm.apply", "balancer.apply", "metrics.apply", "watchdog.apply",
         "model_fetch.pruned")
ORDER = tuple(dict.fromkeys(step.split(".")[0] for step in STEPS))


def in_order() -> list[Role]:
    """The roles' records (each package's ``ROLE``, rigup/role.py), in the order they run."""
    return [import_module(f"roles.{name}").ROLE for name in ORDER]


def steps() -> list:
    """The deploy functions of :data:`STEPS`, in order: each role's ``apply``, or the step its
    record names."""
    records = {r.name: r for r in in_order()}
    return [records[role].apply if step == "apply" else records[role].steps[step]
            for role, step in (s.split(".") for s in STEPS)]
