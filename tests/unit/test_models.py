"""rigup/models.py and the model families of rigup/gpu/models.yml (no hosts)."""

from rigup.gpu.catalogue import family_of, model_families
from rigup.models import first_gguf


def test_model_families_catalogue():
    fams = model_families()
    assert set(fams) == {"glm-5.3-flash", "deepseek-v4.1-flash", "qwen3.8-flash-next"}
    assert fams["glm-5.3-flash"]["vllm_min_cc"] == (9, 0) and fams["glm-5.3-flash"]["split_mode_row_fails"]
    assert fams["deepseek-v4.1-flash"]["vllm_min_cc"] == (9, 0)
    for fam in fams.values():
        assert fam["sources"] and fam["kv_gib_per_1k_tokens"] > 0
    assert family_of({"repo": "unsloth/GLM-5.3-Flash-GGUF"})["key"] == "glm-5.3-flash"
    assert family_of({"repo": "x/y", "family": "qwen3.8-flash-next"})["key"] == "qwen3.8-flash-next"
    assert family_of({"repo": "x/y"}) is None


def test_first_gguf():
    assert first_gguf(["a/x-00002-of-00003.gguf", "a/x-00001-of-00003.gguf", "config.json"]) == "a/x-00001-of-00003.gguf"
    assert first_gguf(["model-Q4_K_M.gguf", "mmproj-model-f16.gguf"]) == "model-Q4_K_M.gguf"
    assert first_gguf(["config.json", "model.safetensors"]) is None
    assert first_gguf([]) is None
