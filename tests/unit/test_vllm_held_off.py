"""Inference only, by default, for vLLM too (issue 61, round 10's V2): vLLM's features beyond
inference (rigup/contract/vllm.py ``HELD_OFF``: a file:// path for requests, the repository's own
Python, LoRA adapters loaded by a client, the development endpoints, code imported from a path,
prompt logging...) are refused in an instance's extra_args under every spelling vLLM's argparse
reads, and their variables in vllm_env and an instance's env, unless ``vllm_allow`` names them."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from rigup.config import declared
from rigup.contract import vllm as contract
from rigup.instances.vllm import OWNED_FLAGS, instances
from tests.unit.hosts import REV, data, host, only, refusals

MODELS = {"glm": {"repo": "org/some-model", "revision": REV}}
WHERE = "vllm_instances.a"
FEATURES = sorted(contract.HELD_OFF)
FLAGS = sorted(contract.held_off())
ENV = sorted(contract.held_off(kind="env"))
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)


def problems(allow=(), host_env=None, **entry) -> list[tuple[str, str]]:
    d = {"models": MODELS, "vllm_instances": {"a": {"model": "glm", "port": 8000, **entry}},
         "vllm_allow": allow if isinstance(allow, str) else list(allow)}
    if host_env is not None:
        d["vllm_env"] = host_env
    return instances(d)[1]


def held_off(extra_args: list, allow=()) -> list[str]:
    """The features whose refusal names extra_args' key path and vllm_allow."""
    return [re.search(r"vLLM's (\w+),", why)[1] for path, why in problems(allow, extra_args=extra_args)
            if path == f"{WHERE}.extra_args" and "vllm_allow" in why]


def spellings(flag: str) -> list[list[str]]:
    """The ways vLLM's FlexibleArgumentParser reads ``flag`` (vllm/utils/argparse_utils.py): as given,
    with a value after it or after '=', underscores for dashes, a JSON option's key after a dot, and
    an abbreviation (argparse's allow_abbrev)."""
    under = "--" + flag[2:].replace("-", "_")
    return [[flag], [flag, "x"], [f"{flag}=x"], [under, "x"], [f"{under}=x"], [f"{flag}.key", "x"],
            [f"{under}.some_key=x"], [flag[:-1]]]


def test_the_allow_key_names_exactly_the_features():
    assert declared()["vllm_allow"].form.item.choices == tuple(contract.HELD_OFF)
    assert declared()["vllm_allow"].default == []


def test_the_table_is_of_vllms_shape_and_apart_from_what_rigup_sets():
    """Long flags and VLLM_* variables, one feature each, every feature opened by something, and
    no flag that rigup writes itself (those are refused as owned whatever vllm_allow says)."""
    for name, feature in contract.HELD_OFF.items():
        assert feature.flags or feature.env, name
        assert all(re.fullmatch(r"--[a-z][a-z0-9-]+", f) for f in feature.flags), name
        assert all(re.fullmatch(r"VLLM_[A-Z0-9_]+", v) for v in feature.env), name
    assert len(FLAGS) == sum(len(f.flags) for f in contract.HELD_OFF.values())
    assert not set(FLAGS) & set(OWNED_FLAGS)


@pytest.mark.parametrize("flag", FLAGS)
def test_each_flag_is_refused_under_every_spelling_unless_its_feature_is_allowed(flag):
    feature = contract.held_off()[flag]
    for args in spellings(flag):
        assert held_off(["--enforce-eager", *args]) == [feature], args
        assert held_off(args, allow=[feature]) == [], args
        assert held_off(args, allow=[f for f in FEATURES if f != feature]) == [feature], args


@pytest.mark.parametrize("name", ENV)
@pytest.mark.parametrize("value", ["1", "0", "true", "/srv/x"])
def test_each_variable_is_refused_in_an_instances_env_and_vllm_env_unless_allowed(name, value):
    """Whatever the value (vLLM reads "0" as off, but the key alone is the operator's statement)."""
    feature = contract.held_off(kind="env")[name]
    own = [p for p, why in problems(env={name: value}) if "vllm_allow" in why]
    host_wide = [p for p, why in problems(host_env={name: value}) if "vllm_allow" in why]
    assert own == [f"{WHERE}.env.{name}"] and host_wide == [f"vllm_env.{name}"]
    assert problems(allow=[feature], env={name: value}, host_env={name: value}) == []


def test_the_refusal_names_the_key_path_what_it_opens_and_the_fix():
    (path, why), = problems(extra_args=["--trust-remote-code"])
    assert path == f"{WHERE}.extra_args"
    assert why.startswith("gives --trust-remote-code, vLLM's remote_code, off on a shared endpoint (")
    assert "run on the host" in why and why.endswith("drop it, or add remote_code to vllm_allow")
    (path, why), = problems(host_env={"VLLM_SERVER_DEV_MODE": "1"})
    assert path == "vllm_env.VLLM_SERVER_DEV_MODE" and "/collective_rpc" in why
    assert why.endswith("drop it, or add dev_mode to vllm_allow")


def test_vllm_env_is_read_only_on_a_host_serving_vllm_or_a_ray_node():
    assert instances({"vllm_env": {"VLLM_LOGGING_CONFIG_PATH": "/tmp/l.json"}})[1] == []
    (path, why), = instances({"vllm_env": {"VLLM_LOGGING_CONFIG_PATH": "/tmp/l.json"}, "vllm_ray_role": "worker"})[1]
    assert path == "vllm_env.VLLM_LOGGING_CONFIG_PATH" and "vLLM's plugins" in why


def test_an_allow_that_is_no_list_opens_nothing():
    """``vllm_allow: dev_mode`` (text) is refused by its form; meanwhile it opens nothing ('dev_mode' in
    'dev_mode' would)."""
    assert [p for p, _ in problems("dev_mode", host_env={"VLLM_SERVER_DEV_MODE": "1"})] == ["vllm_env.VLLM_SERVER_DEV_MODE"]


@pytest.mark.parametrize("args", [
    ["--no-trust-remote-code"], ["--no-enable-lora"], ["--no-enable-log-requests"], ["--disable-log-requests"],
    ["--config-format", "hf"], ["--allowed-media-domains", "example.com"], ["--max-log-len", "10"],
    ["--lora-dtype", "auto"], ["--enable-lora-bias"], ["--chat-template-content-format", "openai"], ["--enable-prefix-caching"],
    ["--max_model_len=8192"], ["--compilation-config.level", "3"], ["-O3"], ["--enforce-eager"], ["--kv-cache-dtype", "fp8"]])
def test_negations_and_inference_flags_pass(args):
    assert problems(extra_args=args) == []


@pytest.mark.parametrize("args, key", [
    (["--speculative-config.model", "/tmp/x"], "speculative"), (["--speculative_config.method=ngram"], "speculative"),
    (["--served_model_name.x", "y"], "served_model_name"), (["--uds", "/tmp/s"], "host"), (["--uds=/tmp/s"], "host")])
def test_a_flag_rigup_sets_is_refused_as_a_json_key_and_as_a_socket_too(args, key):
    """vLLM reads ``--speculative-config.model x`` as --speculative-config (a JSON option's key): it
    passed the owned flags' check before; --uds binds a Unix socket in place of host and port."""
    found = [why for path, why in problems(extra_args=args) if path == f"{WHERE}.extra_args"]
    assert len(found) == 1 and f"{WHERE}.{key}" in found[0], found


def test_preflight_refuses_a_host_whose_vllm_env_opens_dev_mode():
    plan, facts = host("h100")
    d = data(models={"glm": {"repo": "org/m", "revision": REV, "size_gib": 1.0}},
             vllm_instances={"glm": {"model": "glm", "port": 8000}}, vllm_env={"VLLM_SERVER_DEV_MODE": "1"})
    (r,) = only(refusals(plan, facts, d), "config")
    assert r.what == "vllm_env.VLLM_SERVER_DEV_MODE"
    assert [x for x in refusals(plan, facts, {**d, "vllm_allow": ["dev_mode"]}) if x.check == "config"] == []


@settings(max_examples=80, deadline=1000)
@given(flag=st.sampled_from(FLAGS), form=st.integers(0, 7), around=st.lists(TEXT, max_size=3),
       allow=st.lists(st.sampled_from(FEATURES), unique=True))
def test_any_spelling_among_any_arguments_is_refused_unless_allowed(flag, form, around, allow):
    feature = contract.held_off()[flag]
    assert (feature in held_off([*around, *spellings(flag)[form]], allow)) == (feature not in allow)


@settings(max_examples=80, deadline=1000)
@given(args=st.lists(st.one_of(TEXT, st.integers(), st.none(), st.sampled_from(["--", "--.", "--=", "-", "--_"])),
                     max_size=5),
       env=st.dictionaries(st.one_of(TEXT, st.sampled_from(ENV), st.integers()),
                           st.one_of(TEXT, st.integers(), st.booleans(), st.none()), max_size=4),
       allow=st.lists(st.sampled_from(FEATURES), unique=True))
def test_arbitrary_extra_args_and_env_are_refused_or_read_never_a_traceback(args, env, allow):
    """Each held variable of vllm_env is named (whatever the entry's own problems), and nothing
    else is refused as a feature."""
    found = problems(allow, host_env=env, extra_args=args, env=env)
    held = {p for p, why in found if p.startswith("vllm_env.")}
    assert held == {f"vllm_env.{n}" for n in env if n in contract.held_off(allow, "env")}
    assert all(why.split(" turns on ")[0] in contract.held_off(allow, "env") for _, why in found if " turns on " in why)
