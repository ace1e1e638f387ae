"""Every bad input of tests/unit/hostile_inputs.yml is refused, before anything changes, with its
key path; none crashes with a traceback. As on a real run: config validation of the host's data
(rigup/config.py, which stops the run), then every role's preflight checks (which refuse the host)."""

import re
from pathlib import Path

import pytest
import yaml

from rigup.config import problems
from rigup.models import hub_endpoint, hub_key
from tests.unit.hosts import REV, answered, data, host, refusals

CASES = yaml.safe_load((Path(__file__).with_name("hostile_inputs.yml")).read_text())
MODEL = {"repo": "org/model-GGUF", "revision": REV}
INSTANCE = {"model": "m", "port": 8081}


def filled(case: dict) -> dict:
    """The case's values, with ``M``/``I`` (and a model ``m`` for instances) filled in."""
    values = {k: v for k, v in case.items() if k not in ("key", "hub")}
    for var in ("models", "llama_server_instances", "vllm_instances"):
        if var in values:
            values[var] = {name: {"M": MODEL, "I": INSTANCE}.get(e, e) if isinstance(e, str) else e
                           for name, e in values[var].items()}
    if any(v in values for v in ("llama_server_instances", "vllm_instances")):
        values.setdefault("models", {"m": MODEL})
    return values


def test_there_are_at_least_150():
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", CASES, ids=[re.sub(r"\s", "_", c["key"])[:60] for c in CASES])
def test_each_is_refused_naming_its_key(case):
    """A case's ``hub``: what the hub answered of each of its models (as roles/model_fetch/hub.py
    records it): a hub's answer is data, refused like configuration."""
    values = filled(case)
    answers = {hub_key(hub_endpoint(data(**values)), {"include": [], **values["models"][name]}): facts
               for name, facts in (case.get("hub") or {}).items()}
    found = [f"{key}: {why}" for key, why in problems(values)]
    if not found:  # valid at the top level: the roles' checks must refuse it
        plan, facts = host("a100")
        found = [r.line("h") for r in refusals(plan, facts, answered(data(**values), answers))]
    assert found, f"not refused: {values!r}"
    assert any(case["key"] in line for line in found), found
    print(f"{case['key']!r:48} -> {found[0][:150]}")


@pytest.mark.parametrize("values", [
    {"vllm_git_url": url, "vllm_git_commit": REV, "vllm_instances": {"x": INSTANCE}}
    for url in ("https://github.com/vllm-project/vllm.git", "ssh://git@git.lan/vllm.git", "git@github.com:org/vllm.git",
                "/srv/git/vllm.git", "file:///root/vllm-stub/vllm-stub.git")] + [
    {"base_extra_packages": ["htop", "libstdc++6", "nvtop=3.0.2-1", "python3.11-venv", "g++-12=12.2.0-14+deb12u1"]},
    {"models": {"m": {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": REV}}},
    {"llama_server_instances": {"x": {**INSTANCE, "host": "127.0.0.2"}}},
    {"llama_server_instances": {"x": {**INSTANCE, "port": 1023, "replicas": 2}}},
    {"llama_server_instances": {"x": {**INSTANCE, "port": 65533, "replicas": 2}}},
    {"llama_server_instances": {"x": {**INSTANCE, "extra_args": ["-fa", "on", "--temp", "0.7", "--port-x"]}}},
    {"vllm_instances": {"x": {**INSTANCE, "extra_args": ["--max-model-len", "32k", "--enforce-eager"]}}},
    {"hf_endpoint": "http://hub.lan:8090", "hf_endpoint_insecure": True},
    {"vllm_host_ip": "10.0.0.5"}, {"metrics_address": "10.0.0.5"},
    {"metrics_allow": ["192.0.2.7", "fd00::7"], "prometheus_allow": ["198.51.100.3"]}])
def test_the_good_spellings_pass(values):
    """What the refusals above must not catch: the good spellings of the same values."""
    values = {"models": {"m": MODEL}, **values} if "models" not in values else values
    plan, facts = host("a100")
    assert problems(values) == [] and [r.line("h") for r in refusals(plan, facts, data(**values))] == []
