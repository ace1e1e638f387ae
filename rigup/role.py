"""What a role declares to the play, to preflight and to the docs, in one record: each role's
``roles/<role>/__init__.py`` ends with its ``ROLE = Role(...)``; roles/__init__.py ``in_order()``
gives the records in the order the roles run, and nothing looks a hook up by name.

- ``apply``: its ``@deploy``; ``steps``: the other deploy functions the play (roles.STEPS) calls
  (model_fetch's ``waited`` and ``pruned``, llama_cpp's ``proven``)
- ``checks`` / ``fleet_checks``: its refusals, of one host / with the fleet (docs/refusals.md)
- ``resolve``: what it asks the outside world once per run (model_fetch: the hub)
- ``ports``: the ports its units will listen on (preflight's port claims)
- ``plan_reads``: the facts its plan lines and checks read, in preflight's one round trip
- ``plan_lines`` / ``fleet_plan_lines``: its lines of the plan
- ``smoke_runs``: what a new llama.cpp build is tried with before it serves
- ``cards``: which of the host's cards the plan may serve on (burnin: all but the quarantined),
  and what it adds to the plan (``{"burnin": ...}``)
- ``engine``: a serving engine's record (rigup.serving ``Engine``): preflight plans its instances
  (rigup.serving ``serving_plan``, the plan's ``serving``), which its ``apply`` installs
- ``plan_adds``: what it tells the roles before it through the plan (llama_cpp: whether this host
  compiles its build, ``llama_cpp_compiles``, so that cuda_toolkit installs the compiler only then)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Role:
    name: str
    apply: Callable
    checks: tuple = ()
    fleet_checks: tuple = ()
    resolve: Callable | None = None
    ports: Callable | None = None
    plan_reads: Callable | None = None
    plan_lines: Callable | None = None
    fleet_plan_lines: Callable | None = None
    smoke_runs: Callable | None = None
    cards: Callable | None = None
    plan_adds: Callable | None = None
    engine: object | None = None
    steps: dict = field(default_factory=dict)
