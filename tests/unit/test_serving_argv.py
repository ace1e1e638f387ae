"""issue 64, argv as data: each server of the serving plan carries its command line (rigup.serving
Server ``argv``), made by the plan; the operation fills only what the plan cannot know (the slots:
llama-server's model file and RPC workers, vLLM's pin). The argv of every case of
tests/unit/test_serving_snapshot.py, filled, is held byte-for-byte there (``argv.json``); here, what
the slots are and that one left unfilled never reaches a unit."""

from __future__ import annotations

import pytest

from rigup.boundary.formats import systemd_quote
from rigup.serving import MODEL_FILE, RPC, SLOTS, VLLM_EXE, filled, serving_plan
from roles.llama_server import LLAMA as LLAMA_SERVER
from roles.vllm import VLLM as VLLM_ENGINE
from tests.unit.test_serving_snapshot import LLAMA, VLLM


def argvs(engine, case) -> dict[str, list[str]]:
    """{unit: its planned argv} of a snapshot case, the plan made as preflight makes it."""
    plan, d, _ = case()
    found = serving_plan([engine], d, plan)[engine.role]
    return {s["unit"]: s["argv"] for served in found.values() for s in served.servers}


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_llama_servers_argv_leaves_the_model_file_and_rpc_workers_to_the_host(name):
    for unit, argv in argvs(LLAMA_SERVER, LLAMA[name]).items():
        assert all(isinstance(a, str) for a in argv) and argv[0].endswith("/current/bin/llama-server"), argv
        routed = "--models-preset" in argv
        assert (argv[argv.index("-m") + 1] == MODEL_FILE) if not routed else MODEL_FILE not in argv, (unit, argv)
        assert argv.count(MODEL_FILE) == (0 if routed else 1)
        assert (argv[argv.index("--rpc") + 1] == RPC) if "--rpc" in argv else RPC not in argv
        assert VLLM_EXE not in argv


@pytest.mark.parametrize("name", sorted(VLLM))
def test_vllm_servers_argv_leaves_only_the_pins_vllm_to_the_host(name):
    for unit, argv in argvs(VLLM_ENGINE, VLLM[name]).items():
        assert argv[:2] == [VLLM_EXE, "serve"] and not set(argv[1:]) & set(SLOTS), (unit, argv)


def test_llama_rpc_heads_argv_has_both_slots_and_filled_has_none():
    (argv,) = argvs(LLAMA_SERVER, LLAMA["llama-rpc-head-h100"]).values()
    assert {MODEL_FILE, RPC} <= set(argv)
    line = filled(argv, model_file="/srv/models/glm/m.gguf", rpc="10.0.0.2:50052,[fd00::3]:50060")
    assert not set(line) & set(SLOTS)
    assert line[line.index("-m") + 1] == "/srv/models/glm/m.gguf" and line[line.index("--rpc") + 1].startswith("10.0.0.2")
    assert filled(argv) == argv   # nothing given: the slots stay


@pytest.mark.parametrize("slot", SLOTS)
def test_a_slot_left_unfilled_is_never_written_into_a_unit(slot):
    """Each slot holds a control character, which the writer of a unit's command refuses: a server
    whose operation did not fill its argv fails the converge instead of running a wrong command."""
    with pytest.raises(Exception) as e:
        systemd_quote(slot)
    print(e.value)
