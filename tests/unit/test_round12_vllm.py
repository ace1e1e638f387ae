"""Issue 61, round 12's vLLM cases (/tmp/redteam/round12.md): an owned flag after one dash (V17), a
held-off feature inside a JSON option (V8), KV transfer (V9), secrets typed into env (V14) and the
environment an instance may be given (V11, V12)."""

import json

import pytest

from rigup.contract import vllm as contract
from rigup.instances.vllm import instances
from tests.unit.hosts import REV, data, host, only, refusals

MODEL = {"repo": "org/some-model", "revision": REV}
WHERE = "vllm_instances.a"


def problems(allow=(), host_env=None, **entry) -> list[tuple[str, str]]:
    d = {"models": {"m": MODEL}, "vllm_instances": {"a": {"model": "m", "port": 8000, **entry}}, "vllm_allow": list(allow)}
    return instances({**d, **({"vllm_env": host_env} if host_env is not None else {})})[1]


def extra_args(args, allow=()) -> list[str]:
    return [why for path, why in problems(allow, extra_args=args) if path == f"{WHERE}.extra_args"]


# -- V17: vLLM reads ``-x.key=value`` as ``-x '{"key": value}'``, after one dash too ---------------

@pytest.mark.parametrize("args", [["-sc.model=/tmp/shared/draft"], ["-sc.model", "/tmp/shared/draft"],
                                  ["-sc.method=eagle"], ["-tp.x=2"], ["-sc", '{"model": "/tmp/shared/d"}']])
def test_v17_an_owned_flags_short_spelling_with_a_key_is_refused(args):
    """``-sc.model=/x`` was appended by vLLM as -sc JSON after rigup's own --speculative-config, a drafter
    from any path in place of the checked draft_model."""
    found = extra_args(args)
    assert len(found) == 1 and "which rigup sets" in found[0], found


@pytest.mark.parametrize("args", [["-O3"], ["-O.backend=x"], ["--max-model-len", "-1"], ["--x", "-1.5"]])
def test_v17_other_single_dash_arguments_pass(args):
    assert problems(extra_args=args) == []


# -- V8: a held-off feature's key inside a JSON option ------------------------------------------

PLUGIN = "/tmp/shared/p.py"


@pytest.mark.parametrize("args", [
    ["--structured-outputs-config", json.dumps({"reasoning_parser_plugin": PLUGIN, "reasoning_parser": "x"})],
    ["--structured-outputs-config=" + json.dumps({"reasoning_parser_plugin": PLUGIN})],
    ["--structured_outputs_config", json.dumps({"backend": "auto", "reasoning-parser-plugin": PLUGIN})],
    ["--structured-outputs", '{"reasoning_parser_plugin": "a", "reasoning_parser_plugin": "b"}'],   # abbreviated, twice
    ["--structured-outputs-config", '{"backend": "auto", "reasoning_parser_plugin": "a"}'[:-1] + ', "x": 1}'],
    [f"--structured-outputs-config.reasoning_parser_plugin={PLUGIN}"],
    ["--structured_outputs_config.reasoning_parser_plugin", PLUGIN],
    ["--structured-outputs-config.reasoning_parser_plugin+", PLUGIN],
    ["--structured-out.reasoning-parser-plugin", PLUGIN]])
def test_v8_a_held_off_key_inside_a_json_option_is_refused_under_every_spelling(args):
    """vLLM's StructuredOutputsConfig imports reasoning_parser_plugin's file, which ``plugins`` holds off
    as --reasoning-parser-plugin: it passed as JSON, with ``=`` and dotted."""
    found = extra_args(["--enforce-eager", *args])
    assert found and all("--structured-outputs-config.reasoning_parser_plugin, vLLM's plugins" in w for w in found), found
    assert extra_args(args, allow=["plugins"]) == []


@pytest.mark.parametrize("args", [
    ["--structured-outputs-config", '{"backend": "xgrammar", "reasoning_parser": "deepseek_r1"}'],
    ["--structured-outputs-config.backend=guidance"], ["--structured-outputs-config", "not json"],
    ["--structured-outputs-config", '["reasoning_parser_plugin"]'], ["--structured-outputs-config", "[" * 5000],
    ["--structured-outputs-config"]])
def test_v8_the_options_other_keys_and_text_that_is_no_object_pass(args):
    assert problems(extra_args=args) == []


def test_v8_the_table_spells_each_key_as_an_option_and_its_key():
    keys = contract.held_off(kind="keys")
    assert keys == {"--structured-outputs-config.reasoning_parser_plugin": "plugins"}
    assert all(k.split(".")[0] not in contract.held_off() for k in keys)


# -- V9: KV transfer ----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--kv-transfer-config", '{"kv_connector": "X", "kv_connector_module_path": "evil_mod", "kv_role": "kv_both"}'],
    ["--kv-transfer-config.kv_connector=P2pNcclConnector", "--kv-transfer-config.kv_ip=0.0.0.0"],
    ["--kv_transfer_config.kv_role", "kv_both"], ["--kv-transfer", "{}"],
    ["--ec-transfer-config", '{"ec_connector": "SHMConnector", "ec_role": "ec_consumer"}']])
def test_v9_a_kv_connector_is_held_off_until_allowed(args):
    """--kv-transfer-config imports kv_connector_module_path by name and its connectors listen and move
    every client's KV cache; kv_events (a publisher of the same blocks) was held off, this was not."""
    found = extra_args(args)
    assert found and all("vLLM's kv_transfer" in w and w.endswith("add kv_transfer to vllm_allow") for w in found)
    assert extra_args(args, allow=["kv_transfer"]) == []


def test_v9_preflight_refuses_it_naming_the_key_path():
    plan, facts = host("h100")
    d = data(models={"m": {**MODEL, "size_gib": 1.0}},
             vllm_instances={"a": {"model": "m", "port": 8000, "extra_args": ["--kv-transfer-config", "{}"]}})
    (r,) = only(refusals(plan, facts, d), "config")
    assert r.what == f"{WHERE}.extra_args" and "kv_transfer" in r.why
