"""Issue 61, round 14 V32 (/tmp/redteam/round14/round14.md): vLLM's flags that name a file on the host
(--tokenizer, --hf-config-path, --chat-template, --download-dir, --ssl-keyfile, --load-format tensorizer's
tensorizer_uri...) passed: another user's file, trusted by its path, in the server every client shares.
They are held off as "files" (rigup/contract/vllm.py HELD_OFF), as llama-server's are."""

import pytest

from rigup.contract.vllm import HELD_OFF
from tests.unit.test_round12_vllm import extra_args

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
