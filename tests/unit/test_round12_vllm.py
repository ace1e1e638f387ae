"""Issue 61, round 12's vLLM cases (/tmp/redteam/round12.md): an owned flag after one dash (V17), a
held-off feature inside a JSON option (V8), KV transfer (V9), secrets typed into env (V14) and the
environment an instance may be given (V11, V12)."""

import json

import pytest

from rigup.contract import vllm as contract
from rigup.instances.vllm import RIGUP_SETS, instances
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


@pytest.mark.parametrize("args", [["-O3"], ["-O.level=3"], ["--max-model-len", "-1"], ["--x", "-1.5"]])
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
    ["--structured-outputs-config.backend=guidance"],   # text json.loads refuses: refused whole (round 16 V49)
    ["--structured-outputs-config", '["reasoning_parser_plugin"]'], ["--structured-outputs-config"],
    ["--structured-outputs-config", '{"backend": "auto", "backend": "xgrammar", "x": NaN}']])   # the boundary's refusal
def test_v8_the_options_other_keys_and_text_that_is_no_object_pass(args):
    assert problems(extra_args=args) == []


def test_v8_the_table_spells_each_key_as_an_option_and_its_key():
    keys = contract.held_off(kind="keys")
    compilation = ("backend", "cache_dir", "debug_dump_path", "inductor_passes", "inductor_compile_config")
    tensorizer = ("tensorizer_uri", "tensorizer_dir", "lora_dir", "encryption_keyfile")   # round 14 V32
    assert keys == {**dict.fromkeys(("--structured-outputs-config.reasoning_parser_plugin",
                                     *(f"{o}.{k}" for k in compilation for o in ("--compilation-config", "-cc", "-O"))),
                                    "plugins"),
                    **dict.fromkeys((f"--model-loader-extra-config.{k}" for k in tensorizer), "files")}
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


# -- V14: a secret typed into env ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_ID_TOKEN", "hf_token",
                                  "OPENAI_API_KEY", "S3_SECRET_ACCESS_KEY", "MY_PASSWORD"])
@pytest.mark.parametrize("where", ["env", "vllm_env"])
def test_v14_a_secret_in_env_or_vllm_env_is_refused_as_vllm_api_key_is(name, where):
    """HF_TOKEN in env was written to /etc/rigup/vllm/x.env while VLLM_API_KEY was refused: the hub's token
    has its own root-only file (model_fetch_hf_token_src); huggingface_hub reads HF_TOKEN,
    HUGGING_FACE_HUB_TOKEN and HF_OIDC_ID_TOKEN (HF_HUB_TOKEN is read by nothing)."""
    plan, facts = host("h100")
    inst = {"model": "m", "port": 8000, **({"env": {name: "hf_" + "a" * 34}} if where == "env" else {})}
    d = data(models={"m": {**MODEL, "size_gib": 1.0}}, vllm_instances={"a": inst},
             **({"vllm_env": {name: "hf_" + "a" * 34}} if where == "vllm_env" else {}))
    (r,) = only(refusals(plan, facts, d), "open_without_key")   # once, by its own check (not config's too)
    assert r.what == f"{WHERE}: {name} in env" and "every run's output" in r.why and r.fix.startswith("remove it")
    if name.upper().startswith("HF_"):
        assert "model_fetch_hf_token_src" in r.fix


def test_v14_the_env_files_writer_refuses_a_secret_too():
    from rigup.config import ConfigError
    from rigup.config import role_defaults
    from roles.vllm import command as cmd

    inst = {"tp": 1, "pp": 1, "pp_partition": None, "gpus": None, "env": {"HF_TOKEN": "hf_x"}}
    with pytest.raises(ConfigError, match="vllm_instances.a.env.HF_TOKEN: a secret"):
        cmd.env_vars("a", inst, role_defaults("vllm"), {})


# -- V11, V12: the environment an instance may be given is an allow-list ------------------------

# what rigup's tests, docs (docs/cmp170hx.md), group_vars and the field notes (/work/shared/notes) give
USED = ["VLLM_LOGGING_LEVEL", "VLLM_X", "X_QUOTED", "DEBUG", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "DSV4_LOGITS_ROW_CHUNK",
        "VLLM_STUB_LOAD_SECONDS", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_GLM5_DISABLE", "VLLM_ENGINE_READY_TIMEOUT_S",
        "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE",
        "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "VLLM_HOST_IP",
        "VLLM_PP_LAYER_PARTITION", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER",
        "HF_XET_HIGH_PERFORMANCE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF",
        "TOKENIZERS_PARALLELISM", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "NVIDIA_TF32_OVERRIDE",
        "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_ATTENTION_BACKEND", "VLLM_DISABLE_COMPILE_CACHE", "PYTHONUNBUFFERED",
        "VLLM_USE_V1", "VLLM_WORKER_MULTIPROC_METHOD"]
# round 12's V11 and V12, and their kin: each loads code or files from where it points, or sends somewhere
REFUSED = ["HOME", "TMPDIR", "TMP", "PATH", "GCONV_PATH", "OPENSSL_CONF", "OPENSSL_MODULES", "NCCL_CONF_FILE",
           "TRITON_PTXAS_PATH", "CC", "CXX", "TRITON_CACHE_MANAGER", "CUDA_HOME", "CUDA_PATH", "FLASHINFER_WORKSPACE_BASE",
           "HF_HOME", "HF_ENDPOINT", "TORCH_HOME", "CUDA_CACHE_PATH", "CUDA_INJECTION64_PATH", "CUDA_MPS_PIPE_DIRECTORY",
           "NCCL_NET_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_TOPO_FILE", "VLLM_NCCL_SO_PATH", "VLLM_CUDART_SO_PATH",
           "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_RPC_BASE_PATH", "VLLM_ASSETS_CACHE", "VLLM_PLUGINS",
           "VLLM_USAGE_STATS_SERVER", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONWARNINGS", "XDG_CACHE_HOME",
           "XDG_CONFIG_HOME", "http_proxy", "HTTPS_PROXY", "BASH_ENV", "ENV", "CLASSPATH", "SOMELIB_PLUGIN_PATH",
           "MY_CACHE_DIR", "TRITON_LIBCUDA_PATH", "TORCH_EXTENSIONS_DIR", "HF_MODULES_CACHE", "TORCHINDUCTOR_CACHE_DIR",
           "TRITON_CACHE_DIR", "TRITON_HOME", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "GIT_SSH_COMMAND", "NODE_OPTIONS",
           "MALLOC_CONF", "LOCPATH", "NLSPATH", "HOSTALIASES"]


@pytest.mark.parametrize("name", [n for n in USED if n not in RIGUP_SETS])   # those: round 13 V28
def test_v11_what_rigups_tests_docs_and_notes_give_is_taken(name):
    assert problems(env={name: "1"}, host_env={name: "1"}) == []


@pytest.mark.parametrize("name", REFUSED)
def test_v11_v12_anything_else_is_refused_in_env_and_vllm_env_naming_the_key_and_the_fix(name):
    """HOME=/tmp/shared (Triton's ~/.triton/cache, NCCL's ~/.nccl.conf), PATH (the JIT's compilers),
    GCONV_PATH, OPENSSL_CONF, NCCL_CONF_FILE, CC, CUDA_HOME... passed the deny-list of rounds 10-11."""
    from rigup.instances.vllm import env_problems

    (path, why), = [p for p in problems(env={name: "/tmp/shared/x"}) if p[0] != f"{WHERE}.extra_args"]
    assert path == f"{WHERE}.env.{name}" and "drop it" in why
    assert ("one rigup sets" if name in RIGUP_SETS else "loads code") in why   # round 13 V28: HOME, HF_HOME...
    plan, facts = host("h100")
    d = data(models={"m": {**MODEL, "size_gib": 1.0}}, vllm_instances={"a": {"model": "m", "port": 8000}},
             vllm_env={name: "/tmp/shared/x"})
    assert [r.what for r in only(refusals(plan, facts, d), "config")] == [f"vllm_env.{name}"]
    assert env_problems({name: "x"}, "vllm_env") == [(f"vllm_env.{name}", why)]


def test_v12_a_ray_workers_vllm_env_is_checked_at_preflight_too():
    """vllm_env is a Ray node's environment too (roles/vllm/cluster.py): a worker has no instance."""
    plan, facts = host("h100")
    d = data(vllm_ray_role="worker", vllm_ray_head="h", vllm_ray_version="2.52.1", vllm_env={"PATH": "/tmp/shared"})
    assert [r.what for r in only(refusals(plan, facts, d), "config")] == ["vllm_env.PATH"]


def test_v11_the_env_files_writer_applies_the_same_list():
    from rigup.config import ConfigError, role_defaults
    from roles.vllm import command as cmd

    inst = {"tp": 1, "pp": 1, "pp_partition": None, "gpus": None, "env": {"NCCL_DEBUG": "WARN"}}
    assert cmd.env_vars("a", inst, role_defaults("vllm"), {})["NCCL_DEBUG"] == "WARN"
    with pytest.raises(ConfigError, match="vllm_env.GCONV_PATH: GCONV_PATH is not a variable rigup lets tune"):
        cmd.env_vars("a", inst, {**role_defaults("vllm"), "vllm_env": {"GCONV_PATH": "/tmp/shared"}}, {})


def test_v4_round_11s_names_stay_refused_and_held_off_ones_stay_vllm_allows():
    for name in ("NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_MODULES_CACHE",
                 "XDG_CACHE_HOME", "LD_PRELOAD", "PYTHONPATH"):
        assert [p for p, _ in problems(env={name: "/x"})] == [f"{WHERE}.env.{name}"]
    for name, feature in contract.held_off(kind="env").items():   # VLLM_TORCH_PROFILER_DIR: a place, but profiler's
        assert problems(allow=[feature], env={name: "/x"}, host_env={name: "/x"}) == []
