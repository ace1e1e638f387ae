"""A run's state, in one object (issue 64): what a play learns and keeps while it runs lives on the
:class:`Run` of its pyinfra ``State`` (:func:`of`, or :func:`now` for the State pyinfra runs), and
what prints at the end are the Run's :meth:`Run.at_end` hooks, called once at exit, the newest
first (as ``atexit`` calls its own). No module keeps run state of its own: tests/unit/test_layout.py
reads every module for registries, and this module's ``_RUNS`` is the only one.

Each field names the module that fills it and who reads it, so what a step hands the next is
visible here (preflight's plans feed the roles; the compiling host of a build is chosen from the
plans, not by which host asked first). Keyed by the State, weakly: each test's State has its own
run, and a finished one goes.
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(eq=False)
class Run:
    """One play's state: every field empty when the run starts."""

    # rigup/config.py: the roles' resolvers (asked once per host), each host's Config, the fleet's
    resolvers: tuple = ()
    configs: dict[str, Any] = field(default_factory=dict)
    fleet: dict | None = None
    # rigup/state.py: facts read at a point of a host's run ((host, ops run, fact) -> value) and
    # the facts named to be read in a host's next batch (host -> {fact key: (fact, kwargs)})
    facts: dict[tuple, Any] = field(default_factory=dict)
    wanted: dict[str, dict[tuple, tuple]] = field(default_factory=dict)
    # rigup/probe.py: host -> the operation calls of the step being recorded
    recording: dict[str, list] = field(default_factory=dict)
    # rigup/lock.py: host -> the open channel that holds its converge lock
    locks: dict[str, Any] = field(default_factory=dict)
    # rigup/summary.py: host -> pyinfra's warnings and errors, preflight's refusals, the roles'
    # notes, 'converged without operations'; report() reads them at the end
    heard: dict[str, list[str]] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    quiet: dict[str, str] = field(default_factory=dict)
    # roles/preflight: host -> its hardware plan (rigup/peer.py makes a peer's before its own preflight
    # does: preflight's plan_of, llama_cpp's handover), host -> refusal count
    plans: dict[str, Any] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    # roles/model_fetch: host -> refused model count, models its apply waits for, revisions it
    # stages, models it may prune; the hub's answers per (what, endpoint, repo, revision) and
    # what was asked of the hub, in order
    fetch_refused: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, Any] = field(default_factory=dict)
    staging: dict[str, Any] = field(default_factory=dict)
    pruning: dict[str, Any] = field(default_factory=dict)
    hub_answers: dict[tuple, Any] = field(default_factory=dict)
    hub_calls: list = field(default_factory=list)
    # roles/llama_cpp/handover.py: host -> the build key it compiles or receives (None: none), its own
    # choice or worked out by a host after it in the inventory (the first of a key compiles it);
    # host -> its build's source
    compiling: dict[str, str | None] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    # plays/fleet.py (status.py): host -> its row, host -> joules per token, the output's settings
    rows: dict[str, Any] = field(default_factory=dict)
    energy: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    # plays/bench.py (bench.py): host -> its results, the output folder and chart
    results: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    # what prints at the end, newest first
    ends: list[tuple] = field(default_factory=list)

    def at_end(self, hook: Callable[..., None], *args) -> None:
        """Call ``hook(*args)`` once when the process exits (the same registration again is ignored)."""
        if (hook, *args) not in self.ends:
            self.ends.append((hook, *args))


_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def of(state) -> Run:
    """The Run of ``state`` (a pyinfra State, or an Inventory for a host without one), made once."""
    run = _RUNS.get(state)
    if run is None:
        run = _RUNS[state] = Run()
    return run


def now() -> Run:
    """The Run of the State pyinfra runs now (its context: set before the inventory loads)."""
    from pyinfra.context import ctx_state

    state = ctx_state.get()
    if state is None:
        raise RuntimeError("rigup.run.now() outside a pyinfra run")
    return of(state)


def host_run(host) -> Run:
    """The Run of ``host``'s State (a host of a bare Inventory, in tests: its inventory's)."""
    return of(getattr(host, "state", None) or host.inventory)


@atexit.register
def _end() -> None:
    for run in list(_RUNS.values()):
        for hook, *args in reversed(run.ends):
            hook(*args)
