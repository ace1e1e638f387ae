"""Issue 61, round 13's vLLM cases (/tmp/redteam/round13.md): variables naming a library, driver or
stream (V20, V21), secrets in other spellings (V22), a class imported by name (V23), --compilation-config's
keys (V24), prompt embeddings (V25) and the variables rigup sets itself (V28)."""

import pytest

from rigup.config import ConfigError
from rigup.instances.vllm import RIGUP_SETS, env_problems
from roles.vllm.command import env_vars
from tests.unit.hosts import data, host, only, refusals
from tests.unit.test_round12_vllm import MODEL, WHERE, extra_args, problems


# -- V20, V21: a library, a driver or a stream named by a variable -----------------------------

@pytest.mark.parametrize("name", ["OCL_ICD_FILENAMES", "OCL_ICD_VENDORS", "OPENCV_OPENCL_RUNTIME", "LIBVA_DRIVER_NAME",
                                  "VLLM_LOGGING_STREAM", "VK_ICD_FILENAMES", "CCACHE_COMPILERCHECK", "MPLBACKEND",
                                  "COVERAGE_PROCESS_START", "SOMELIB_FILENAME"])
def test_v20_v21_a_variable_naming_a_library_driver_or_stream_is_refused_in_env_and_vllm_env(name):
    """The OpenCL ICD loader dlopens OCL_ICD_FILENAMES' libraries, cv2 opens OPENCV_OPENCL_RUNTIME's, libva
    joins LIBVA_DRIVER_NAME into a .so path, and VLLM_LOGGING_STREAM=ext://mod.x imports mod: each passed
    the allow-list's "two words, none a place"."""
    found = problems(env={name: "/tmp/shared/x.so"}) + env_problems({name: "ext://evil.x"}, "vllm_env")
    assert [p for p, _ in found] == [f"{WHERE}.env.{name}", f"vllm_env.{name}"], found
    assert all("is not a variable rigup lets tune vLLM" in why for _, why in found)


@pytest.mark.parametrize("name", ["DSV4_LOGITS_ROW_CHUNK", "VLLM_LOGGING_LEVEL", "NCCL_DEBUG", "VLLM_ATTENTION_BACKEND"])
def test_v20_tuning_variables_still_pass(name):
    assert problems(env={name: "1"}) == env_problems({name: "1"}, "vllm_env") == []


# -- V22: secrets in other spellings --------------------------------------------------------------

@pytest.mark.parametrize("name", ["VLLM_API_KEYS", "VLLM_APIKEY", "OPENAI_APIKEY", "GITHUB_PAT", "WANDB_PASS",
                                  "SOME_PASSPHRASE", "MY_BEARER", "AWS_CREDENTIALS", "hf_token"])
def test_v22_a_secret_in_another_spelling_is_refused_and_never_written(name):
    plan, facts = host("h100")
    token = "hf_" + "Q" * 34
    d = data(models={"m": {**MODEL, "size_gib": 1.0}},
             vllm_instances={"a": {"model": "m", "port": 8000, "env": {name: token}}})
    (r,) = only(refusals(plan, facts, d), "open_without_key")
    assert r.what == f"vllm_instances.a: {name} in env" and token not in str(r)
    with pytest.raises(ConfigError, match="a secret typed into the configuration"):
        env_vars("a", {"env": {name: token}}, {}, {})


# -- V23: a class imported by name ----------------------------------------------------------------

@pytest.mark.parametrize("args", [["--scheduler-cls", "evil_mod.Sched"], ["--scheduler_cls=evil_mod.Sched"],
                                  ["--distributed-executor-backend", "evil_mod.Exec"],
                                  ["--distributed-executor-backend=evil_mod.Exec"],
                                  ["--distributed_executor_backend", "evil_mod.Exec"],
                                  ["--distributed-executor", "evil_mod.Exec"]])
def test_v23_a_class_path_vllm_imports_by_name_is_held_off_with_plugins(args):
    found = extra_args(["--enforce-eager", *args])
    assert len(found) == 1 and "vLLM's plugins" in found[0], found
    assert extra_args(args, allow=["plugins"]) == []


@pytest.mark.parametrize("backend", ["mp", "ray", "uni", "external_launcher"])
def test_v23_a_plain_executor_backend_passes(backend):
    assert problems(extra_args=["--distributed-executor-backend", backend]) == []
    assert problems(extra_args=[f"--distributed-executor-backend={backend}"]) == []


# -- V24: --compilation-config's (-O's) backend, cache_dir and debug_dump_path -----------------

@pytest.mark.parametrize("key", ["backend", "cache_dir", "debug_dump_path"])
@pytest.mark.parametrize("spelling", [lambda k: ["--compilation-config", '{"%s": "/tmp/shared/x"}' % k],
                                      lambda k: ['--compilation-config={"%s": "/tmp/shared/x"}' % k],
                                      lambda k: ["--compilation_config", '{"level": 3, "%s": "x"}' % k],
                                      lambda k: ["--compilation-conf", '{"%s": "x"}' % k],
                                      lambda k: ["-O", '{"%s": "/tmp/shared/x"}' % k],
                                      lambda k: [f"-O.{k}=evil_mod.compile"],
                                      lambda k: [f"-O.{k}", "x"],
                                      lambda k: [f"--compilation-config.{k}=/tmp/shared/x"],
                                      lambda k: [f"--compilation-config.{k.replace('_', '-')}", "x"]])
def test_v24_a_compilation_key_that_loads_or_writes_code_is_held_off_under_every_spelling(key, spelling):
    args = spelling(key)
    found = extra_args(["--enforce-eager", *args])
    assert found and all(f".{key}, vLLM's plugins" in w for w in found), found
    assert extra_args(args, allow=["plugins"]) == []


@pytest.mark.parametrize("args", [["-O3"], ["-O", "3"], ["-O.level=3"], ["--compilation-config", '{"level": 3}'],
                                  ["--compilation-config.cudagraph_mode=FULL"],
                                  ["--structured-outputs-config", '{"backend": "xgrammar"}']])
def test_v24_the_other_compilation_keys_pass(args):
    assert problems(extra_args=args) == []


# -- V25: prompt embeddings -----------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--enable-prompt-embeds"], ["--enable_prompt_embeds"], ["--enable-prompt-embed"]])
def test_v25_prompt_embeds_are_held_off(args):
    """A client's base64 tensor goes to torch.load (vLLM's CVE-2025-62164)."""
    found = extra_args(args)
    assert len(found) == 1 and "vLLM's prompt_embeds" in found[0] and "torch.load" in found[0], found
    assert extra_args(args, allow=["prompt_embeds"]) == []
    assert problems(extra_args=["--no-enable-prompt-embeds"]) == []


# -- V28: the variables rigup sets for the instance -------------------------------------------------

@pytest.mark.parametrize("name, key", [("CUDA_VISIBLE_DEVICES", "gpus"), ("VLLM_PP_LAYER_PARTITION", "pp_partition"),
                                       ("NCCL_P2P_DISABLE", "vllm_nccl_p2p_disable"), ("VLLM_HOST_IP", "vllm_host_ip"),
                                       ("cuda_visible_devices", "gpus")])
def test_v28_a_variable_rigup_sets_is_refused_naming_the_key_to_set(name, key):
    """CUDA_VISIBLE_DEVICES was written after rigup's own, so a card the burn-in quarantined served again."""
    found = problems(env={name: "3"}) + env_problems({name: "3"}, "vllm_env")
    assert [p for p, _ in found] == [f"{WHERE}.env.{name}", f"vllm_env.{name}"], found
    assert all(f"is one rigup sets for the instance: set {key}" in why or f"set vllm_instances.NAME.{key}" in why
               for _, why in found), found
    with pytest.raises(ConfigError, match="one rigup sets"):
        env_vars("a", {"env": {name: "3"}}, {}, {})


def test_v28_every_variable_command_writes_is_one_rigup_sets():
    """The table is held to roles/vllm/command.py env_vars with every knob on."""
    inst = {"pp_partition": "1,1", "pp": 2, "layers": 2, "gpus": "0,1", "env": {}}
    knobs = {"vllm_nccl_p2p_disable": True, "vllm_nccl_ib_disable": True, "vllm_socket_ifname": "eth0",
             "vllm_host_ip": "10.0.0.1"}
    written = set(env_vars("a", inst, knobs, {}))
    written |= set(env_vars("a", {"env": {}}, {}, {"burnin": {"quarantined": ["GPU-1"]},
                                                    "cards": [{"index": 0, "uuid": "GPU-0"}]}))
    assert written <= set(RIGUP_SETS), written - set(RIGUP_SETS)
    assert {p.split(".")[1] for p, _ in env_problems({n: "1" for n in written}, "vllm_env")} == written


def test_v28_preflight_refuses_vllm_env_giving_cuda_visible_devices():
    plan, facts = host("h100")
    d = data(models={"m": {**MODEL, "size_gib": 1.0}}, vllm_instances={"a": {"model": "m", "port": 8000}},
             vllm_env={"CUDA_VISIBLE_DEVICES": "3"})
    (r,) = only(refusals(plan, facts, d), "config")
    assert r.what == "vllm_env.CUDA_VISIBLE_DEVICES" and "gpus" in str(r)


# -- round 14 V29, V30: --compilation-config's (-O's) inductor_passes and inductor_compile_config ----

@pytest.mark.parametrize("key", ["inductor_passes", "inductor_compile_config"])
@pytest.mark.parametrize("spelling", [lambda k: ["--compilation-config", '{"%s": {"p": "evil_mod.f"}}' % k],
                                      lambda k: ["-O", '{"%s": {"cpp.cxx": ["/tmp/shared/cc"]}}' % k],
                                      lambda k: ['-O={"%s": {}}' % k],
                                      lambda k: ["--compilation_config", '{"level": 3, "%s": {}}' % k],
                                      lambda k: [f"-O.{k}", '{"p": "evil_mod.f"}'],
                                      lambda k: [f"--compilation-config.{k.replace('_', '-')}={{}}"]])
def test_v29_v30_inductor_passes_and_compile_config_are_held_off_with_plugins(key, spelling):
    """inductor_passes maps a pass to a function vLLM imports by qualname; inductor_compile_config is torch
    inductor's own settings (cpp.cxx: the compiler run; trace.debug_dir: written there)."""
    args = spelling(key)
    found = extra_args(["--enforce-eager", *args])
    assert found and all(f".{key}, vLLM's plugins" in w for w in found), found
    assert extra_args(args, allow=["plugins"]) == []


# -- round 14 V34: variables naming an address, and three that open something -------------------------

@pytest.mark.parametrize("name", ["NCCL_RAS_ADDR", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_PORT",
                                  "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_ALLOW_INSECURE_SERIALIZATION",
                                  "VLLM_TRACE_FUNCTION", "VLLM_USE_MODELSCOPE", "vllm_trace_function"])
def test_v34_an_address_or_a_variable_that_opens_something_is_refused_in_env_and_vllm_env(name):
    found = problems(env={name: "1"}) + env_problems({name: "1"}, "vllm_env")
    assert [p for p, _ in found] == [f"{WHERE}.env.{name}", f"vllm_env.{name}"], found
    assert all("is not a variable rigup lets tune vLLM" in why for _, why in found)
