"""Issue 61, round 12 (HO1, HO1b, HO3): the build hand-over (roles/llama_cpp/handover.py) with an
empty LlamaCppState answer, the host's own or a peer's, and with a peer that its own play refuses.
The hosts are pyinfra's own: ``@local`` (its local connector, a host read for real) whose answer is
made empty by the shell pyinfra runs the fact's command with (``true``: stdout empty, status 0;
``false``: the command failed), set in its host data as an inventory sets it."""

import os

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from rigup import summary
from rigup.config import config_of
from rigup.gpu.plan import hardware_plan
from roles.llama_cpp import artifact, handover
from roles.llama_cpp.facts import LlamaCppState, parse_state
from roles.llama_cpp.script import build_id, cmake_options
from tests.runs import own_run

COMMIT = "c" * 40
HERE = {"os": "debian 12", "glibc": "2.36", "machine": "x86_64"}
# a directory of root's (the form of llama_cpp_dir, which a peer's is now read through), never made:
# the fact only reads it, and finds no build
ABSENT = "/opt/rigup-test-absent/llama.cpp"


def _run(tmp_path, peer_data=None):
    """``@local`` then lab2, both reached, the same build id; ``@local``'s plan as its preflight made it."""
    assert not os.path.lexists(ABSENT)
    same = {"llama_cpp_ref": COMMIT, "llama_cpp_dir": ABSENT, "llama_cpp_artifacts": str(tmp_path / "cache")}
    return own_run(State(Inventory(([("@local", peer_data or {}), "lab2"], same)), Config()))


def _reach():
    """Both hosts reached, as pyinfra's connect marks them (a host failed when none is left raises)."""
    state = ctx_state.get()
    for name in ("@local", "lab2"):
        state.activate_host(state.inventory.get_host(name))


def _ask(run):
    """lab2's source, asked first (pyinfra prepares hosts at once), as roles/llama_cpp's build_source asks."""
    state = ctx_state.get()
    run.plans["@local"] = dict(hardware_plan([]))
    data = config_of(state.inventory.get_host("lab2"))
    options = cmake_options(dict(hardware_plan([])), data)
    ident = build_id(data, options)
    mine = {**parse_state([]), **HERE}
    return ident, handover.source("lab2", data, mine, ident, artifact.runtime(mine, [], options, None))


@pytest.mark.parametrize("shell, failed", [("true", False), ("false", True)])
def test_an_empty_answer_is_the_parsed_empty_state_and_the_host_compiles(tmp_path, shell, failed):
    """HO1b: pyinfra gives the fact's default() for an empty answer; ``{}`` was a KeyError in
    handover._source at preflight, ending the run for every host."""
    with _run(tmp_path):
        _reach()
        local = ctx_state.get().inventory.get_host("@local")
        data = config_of(local)
        state = local.get_fact(LlamaCppState, dir=data["llama_cpp_dir"], _shell_executable=shell)
        assert state == parse_state([]) == LlamaCppState().default()
        assert (local in ctx_state.get().failed_hosts) is failed
        options = cmake_options(dict(hardware_plan([])), data)
        got = handover.source("@local", data, state, build_id(data, options),
                              artifact.runtime(state, [], options, None))
        assert got["how"] == "compile" and got["why"] == f"no host has {got['key']}"


def test_a_peer_whose_answer_is_empty_is_read_and_the_host_goes_on(tmp_path):
    """HO1: the peer's LlamaCppState empty (stdout empty, status 0): a KeyError in _key_of ended the
    run; now its key is worked out from the empty state (no OS known: not lab2's key), lab2 compiles."""
    with _run(tmp_path, {"_shell_executable": "true"}) as run:
        _reach()
        ident, got = _ask(run)
        assert got["how"] == "compile" and run.compiling["@local"] not in (None, got["key"])
        assert ctx_state.get().inventory.get_host("@local") not in ctx_state.get().failed_hosts


def test_a_peer_whose_read_fails_is_not_the_one_that_compiles(tmp_path, capsys):
    """HO1: the peer's command failed: pyinfra fails the peer and gives the default; it compiles nothing."""
    with _run(tmp_path, {"_shell_executable": "false"}) as run:
        _reach()
        ident, got = _ask(run)
        assert got["how"] == "compile" and got["why"] == f"no host has {got['key']}"
        assert "@local" not in run.compiling
        assert ctx_state.get().inventory.get_host("@local") in ctx_state.get().failed_hosts


def test_a_peer_its_own_play_refused_is_not_the_one_that_compiles(tmp_path):
    """HO3: a host refused and failed (rigup.summary.fail) stayed in activated_hosts and was chosen:
    lab2 waited for a build nobody made. The same peer not failed is chosen (the control)."""
    for refused in (False, True):
        with _run(tmp_path) as run:
            _reach()
            if refused:
                summary.fail(ctx_state.get().inventory.get_host("@local"), ["its configuration"])
            ident, got = _ask(run)
            if refused:
                assert got["how"] == "compile" and "@local" not in run.compiling
            else:
                assert got["how"] == "receive" and got["from"] == "@local"


@pytest.mark.parametrize("key, value", [("llama_cpp_handover", "no"), ("llama_cpp_rollback", "false"),
                                        ("llama_cpp_dir", "relative/dir")])
def test_a_peer_setting_not_of_its_form_is_refused_naming_the_peer_and_key(tmp_path, capsys, key, value):
    """HO3: the peer's configuration read raw ('no' read as true) chose it to compile before its own
    play refused it; read through peer_value it is not counted, and the line names it and the key."""
    with _run(tmp_path, {key: value}) as run:
        _reach()
        ident, got = _ask(run)
        assert got["how"] == "compile" and "@local" not in run.compiling
    said = capsys.readouterr().err
    assert f"[lab2] llama.cpp {ident}: cannot read whether @local compiles it: host @local: {key}: expected" in said
