"""Issue 61, round 14 (/tmp/redteam/round14/round14.md). V32: vLLM's flags that name a file on the host
(--tokenizer, --hf-config-path, --chat-template, --download-dir, --ssl-keyfile, --load-format tensorizer's
tensorizer_uri...) passed: another user's file, trusted by its path, in the server every client shares.
They are held off as "files" (rigup/contract/vllm.py HELD_OFF), as llama-server's are. V34's leftovers:
variables of a tuning family that open a listener or a store passed the env allow-list."""

import pytest

from rigup.contract.vllm import HELD_OFF
from rigup.instances.vllm import DENIED, env_problems
from tests.unit.test_round12_vllm import WHERE, extra_args, problems

SHARED = "/tmp/shared"


@pytest.mark.parametrize("args", [
    ["--tokenizer", f"{SHARED}/tok"], ["--hf-config-path", f"{SHARED}/cfg"], ["--chat-template", f"{SHARED}/t.jinja"],
    ["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"],   # opened as a path first
    ["--download-dir", SHARED], ["--ssl-keyfile", f"{SHARED}/k.pem"], ["--ssl-certfile", f"{SHARED}/c.pem"],
    ["--ssl-ca-certs", f"{SHARED}/ca.pem"], ["--ssl_keyfile=/tmp/k"], ["--download", SHARED], ["--tokenizer.x", "y"],
    ["--generation-config", f"{SHARED}/gen"], ["--generation_config=/tmp/x"], ["--generation-config", "Auto"],
    ["--load-format", "tensorizer", "--model-loader-extra-config", f'{{"tensorizer_uri": "{SHARED}/w.tensors"}}'],
    ["--model-loader-extra-config", f'{{"tensorizer_dir": "{SHARED}", "num_readers": 2}}'],
    ["--model-loader-extra-config.encryption_keyfile", f"{SHARED}/key"],
    [f"--model_loader_extra_config.lora-dir={SHARED}"], ["--model-loader-extra", '{"tensorizer_uri": "s3://b/w"}']])
def test_v32_a_flag_naming_a_file_on_the_host_is_held_off_as_files(args):
    found = extra_args(["--enforce-eager", *args])
    print(args, "->", found)
    assert len(found) == 1 and "vLLM's files" in found[0] and "add files to vllm_allow" in found[0], found
    assert extra_args(args, allow=["files"]) == []


@pytest.mark.parametrize("args", [
    ["--generation-config", "vllm"], ["--generation-config=auto"], ["--tokenizer-mode", "mistral"],
    ["--tokenizer-revision", "main"], ["--chat-template-content-format", "openai"],
    ["--load-format", "safetensors"], ["--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 8}'],
    ["--enable-ssl-refresh"], ["--override-generation-config", '{"temperature": 0.5}']])
def test_the_words_and_flags_that_name_no_file_pass(args):
    assert extra_args(args) == []


def test_the_row_says_why():
    assert "another user's" in HELD_OFF["files"].opens and "rigup serves the model it fetched" in HELD_OFF["files"].opens


# -- V34: a listener or a store, by a tuning family's name -------------------------------------------

@pytest.mark.parametrize("name", ["NCCL_RAS_ENABLE", "VLLM_ENABLE_RESPONSES_API_STORE", "NCCL_COMM_ID", "nccl_comm_id"])
def test_v34_a_variable_that_opens_a_listener_or_a_store_is_refused_in_env_and_vllm_env(name):
    found = problems(env={name: "1"}) + env_problems({name: "1"}, "vllm_env")
    assert [p for p, _ in found] == [f"{WHERE}.env.{name}", f"vllm_env.{name}"], found
    assert all("is not a variable rigup lets tune vLLM" in why for _, why in found)


def test_v34_the_cuda_profiler_opens_the_profilers_routes_as_its_directory_does():
    """VLLM_TORCH_CUDA_PROFILE attaches POST /start_profile and /stop_profile as VLLM_TORCH_PROFILER_DIR does
    (vllm/entrypoints/serve/profile/api_router.py): held off with the profiler, opened by vllm_allow."""
    found = problems(env={"VLLM_TORCH_CUDA_PROFILE": "1"}, host_env={"VLLM_TORCH_CUDA_PROFILE": "1"})
    assert [p for p, why in found if "vLLM's profiler" in why] == [f"{WHERE}.env.VLLM_TORCH_CUDA_PROFILE",
                                                                     "vllm_env.VLLM_TORCH_CUDA_PROFILE"], found
    assert problems(["profiler"], env={"VLLM_TORCH_CUDA_PROFILE": "1"}, host_env={"VLLM_TORCH_CUDA_PROFILE": "1"}) == []


@pytest.mark.parametrize("name", ["VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ENABLE_CUDAGRAPH_GC", "NCCL_CUMEM_ENABLE",
                                  "VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING", "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE",
                                  "NCCL_RAS_TIMEOUT_FACTOR", "NCCL_DMABUF_ENABLE"])
def test_the_enable_variables_that_tune_pass(name):
    assert name not in DENIED and problems(env={name: "1"}) == env_problems({name: "1"}, "vllm_env") == []
