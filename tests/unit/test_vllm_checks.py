"""roles/vllm/checks.py and schema.py: instance entries, VRAM, compute capability (no hosts)."""

from tests.unit.hosts import host, data, only, refusals, REV, GLM


def test_8_vllm_weights_beyond_utilisation_of_its_cards():
    plan, facts = host("h100")
    d = {"models": {"glm": dict(GLM, size_gib=306.0, repo="zai-org/GLM-5.3-Flash")},
         "vllm_instances": {"glm": {"model": "glm", "port": 8000, "tp": 4, "gpu_memory_utilization": 0.9}}}
    (r,) = only(refusals(plan, facts, data(**d)), "vram")
    assert "weights 306.0 GiB >= 286.7 GiB usable (gpu_memory_utilization 0.9 x 4 x 79.6 GiB for tp 4 x pp 1)" in r.why


def test_9_vllm_for_glm_on_ampere_is_refused():
    plan, facts = host("a100")
    d = {"models": {"glm": dict(GLM, repo="zai-org/GLM-5.3-Flash", size_gib=306.0)},
         "vllm_instances": {"glm": {"model": "glm", "port": 8000, "tp": 8}}}
    (r,) = only(refusals(plan, facts, data(**d)), "vllm_cc")
    assert r.what.startswith("vllm_instances.glm needs compute capability >= 9.0")
    assert "a100 cards are cc 8.0" in r.why and "000_5bdf47c995ca0741.txt" in r.why
    assert "llama_server_instances" in r.fix


def test_9_a_patched_vllm_on_ampere_is_the_operators_call():
    plan, facts = host("a100")
    d = {"models": {"glm": dict(GLM, repo="zai-org/GLM-5.3-Flash", size_gib=306.0)},
         "vllm_instances": {"glm": {"model": "glm", "port": 8000, "tp": 8}},
         "vllm_git_commit": REV, "vllm_patches": ["patches/0001-sm80.patch"]}
    assert [r for r in refusals(plan, facts, data(**d)) if r.check == "vllm_cc"] == []


def test_9_the_same_recipe_on_hopper_passes():
    plan, facts = host("h100")
    d = {"models": {"ds": {"repo": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "revision": REV, "size_gib": 100.0}},
         "vllm_instances": {"ds": {"model": "ds", "port": 8000, "tp": 4}}}
    assert refusals(plan, facts, data(**d)) == []


def test_9_a_family_without_a_floor_is_not_refused_on_ampere():
    plan, facts = host("a100")
    d = {"models": {"q": {"repo": "Qwen/Qwen3.8-Flash-Next-FP8", "revision": REV}},
         "vllm_instances": {"q": {"model": "q", "port": 8000, "tp": 4}}}
    assert refusals(plan, facts, data(**d)) == []


def test_config_vllm_layout_problems():
    plan, facts = host("h100")
    d = {"models": {"q": {"repo": "Qwen/Qwen3.8-Flash-Next-FP8", "revision": REV}},
         "vllm_instances": {"q": {"model": "q", "port": 8000, "tp": 4, "pp": 2},
                            "p": {"model": "q", "port": 8001, "pp": 4, "pp_partition": "13,11,11"}}}
    found = {r.what: r.why for r in only(refusals(plan, facts, data(**d)), "config")}
    assert found["vllm_instances.q.tp"] == "tp 4 x pp 2 = 8 GPUs, but this host has 4"
    assert found["vllm_instances.p.pp_partition"] == "3 stages in '13,11,11', but pp is 4"


def test_a_wheel_built_for_cuda_13_on_a_570_driver_is_refused_naming_both():
    plan, facts = host("h100", driver="570.133.20")
    d = {"models": {"ds": {"repo": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "revision": REV, "size_gib": 100.0}},
         "vllm_instances": {"ds": {"model": "ds", "port": 8000, "tp": 4}}}
    (r,) = only(refusals(plan, facts, data(**d, vllm_pip_version="0.33.0+cu130")), "wheel_cuda")
    assert r.what == ("the vLLM wheel is built for CUDA 13.0 (vllm_pip_version 0.33.0+cu130), newer than NVIDIA "
                      "driver 570.133.20 runs")
    assert "CUDA 13.0 needs driver >= 580" in r.why and "runs CUDA up to 12.8" in r.why
    assert "+cu128" in r.fix
    index = ["--extra-index-url", "https://download.pytorch.org/whl/cu130"]
    (r,) = only(refusals(plan, facts, data(**d, vllm_pip_args=index)), "wheel_cuda")
    assert "vllm_pip_args[1] https://download.pytorch.org/whl/cu130" in r.what
    assert refusals(plan, facts, data(**d, vllm_pip_version="0.33.0+cu128")) == []
    assert refusals(plan, facts, data(**d)) == []                   # the wheel's CUDA unknown: not refused
    plan, facts = host("h100")                                      # the fixture's 580 driver runs CUDA 13.0
    assert refusals(plan, facts, data(**d, vllm_pip_version="0.33.0+cu130")) == []
