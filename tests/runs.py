"""A test's own run (rigup/run.py): a fresh pyinfra State set as the one pyinfra runs, so that
what the code keeps on the run (the hub's answers and calls, each host's build source) starts
empty and goes with the test. A State of a test module before it (test_roll.py sets one when it
is collected) would otherwise carry over."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state

from rigup import run as run_state


@contextmanager
def own_run(state: State | None = None):
    """``state`` (else a new State) as pyinfra's current one while the block runs; yields its Run."""
    state, before = state or State(), ctx_state.get()
    ctx_state.set(state)
    try:
        yield run_state.of(state)
    finally:
        ctx_state.set(before)


@pytest.fixture
def fresh_run():
    """The test's own Run (:func:`own_run`)."""
    with own_run() as run:
        yield run
