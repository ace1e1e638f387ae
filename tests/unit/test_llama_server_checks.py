"""roles/llama_server/checks.py and schema.py: instance entries, VRAM, row split, open ports (no hosts)."""

import pytest

from roles.llama_server.schema import instances
from tests.unit.hosts import host, data, glm_llama, only, refusals, GIB, REV


def test_8_model_plus_kv_cache_beyond_vram_gives_the_figures():
    plan, facts = host("h100")  # 4 x 81559 MiB = 318.6 GiB
    (r,) = only(refusals(plan, facts, data(**glm_llama(ctx=5_000_000))), "vram")
    assert r.what == "model glm does not fit the VRAM of llama_server_instances.glm"
    assert ("weights 186.0 GiB + KV cache 150.0 GiB (5,000,000 tokens x 0.03 GiB per 1k, glm-5.3-flash estimate "
            "from rigup/gpu/models.yml) + 4.0 GiB overhead (1 GiB per GPU) = 340.0 GiB > 318.6 GiB of VRAM "
            "(4 x 79.6 GiB)") in r.why
    assert "lower llama_server_instances.glm.ctx" in r.fix
    assert refusals(plan, facts, data(**glm_llama(ctx=4_000_000))) == []   # 186 + 120 + 4 = 310 fits


def test_8_weights_alone_too_big():
    plan, facts = host("a100", free_disk={"/srv/models/glm": 2000 * GIB})  # 640 GiB of VRAM
    d = glm_llama()
    d["models"]["glm"].update(size_gib=700.0, repo="someone/unknown-model")
    (r,) = only(refusals(plan, facts, data(**d)), "vram")
    assert "KV cache not counted (model family unknown)" in r.why


def test_8_cmp_cards_count_locked_until_cmpunlocker_is_on():
    plan, facts = host("cmp170hx")  # 6 x 8 GiB locked, 6 x 64 GiB unlocked
    d = glm_llama(ctx=8192)
    (r,) = only(refusals(plan, facts, data(**d)), "vram")
    assert "6 x 8.0 GiB" in r.why and "enable cmpunlocker" in r.fix
    assert [x for x in refusals(plan, facts, data(cmpunlocker_enabled=True, **d)) if x.check == "vram"] == []


def test_8_partial_offload_is_not_judged():
    plan, facts = host("h100")
    d = glm_llama(ngl=40)
    d["models"]["glm"]["size_gib"] = 900.0
    found = refusals(plan, facts, data(**d, models_dir="/srv/models"))
    assert [r.check for r in found] == ["disk"]


def test_10_row_split_for_glm_is_refused_with_the_seed_error():
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(**glm_llama(split_mode="row"))), "split_mode_row")
    assert r.what == "llama_server_instances.glm uses -sm row for GLM-5.3 Flash (Z.ai, 321B MoE, 18B active, sparse MLA)"
    assert '"device CUDA0 does not support split buffers"' in r.why and "001_62f01b4e828dcb29.txt" in r.why
    assert "split_mode: layer" in r.fix


@pytest.mark.parametrize("args", [["-sm", "row"], ["--split-mode=row"], ["-sm row"]])
def test_10_row_split_in_extra_args_is_found_too(args):
    plan, facts = host("h100")
    only(refusals(plan, facts, data(**glm_llama(extra_args=args))), "split_mode_row")


def test_10_row_split_for_a_family_that_takes_it_passes():
    plan, facts = host("a100")
    d = {"models": {"ds": {"repo": "unsloth/DeepSeek-V4.1-Flash-1017-GGUF", "revision": REV, "size_gib": 460.6}},
         "llama_server_instances": {"ds": {"model": "ds", "port": 8081, "split_mode": "row"}}}
    assert refusals(plan, facts, data(**d)) == []


def test_config_instance_naming_an_unknown_model():
    plan, facts = host("h100")
    d = glm_llama()
    d["llama_server_instances"]["glm"]["model"] = "glm53"
    (r,) = only(refusals(plan, facts, data(**d)), "config")
    assert r.line("h").startswith("[h] refused: llama_server_instances.glm.model: 'glm53' is not a key of models "
                                  "(its keys: glm")


@pytest.mark.parametrize("change, path, text", [
    ({"prot": 8081}, "llama_server_instances.glm.prot", "unknown key (did you mean 'port'?)"),
    ({"port": "8081"}, "llama_server_instances.glm.port", "expected int 1..65535, got '8081' (str)"),
    ({"split_mode": "rows"}, "llama_server_instances.glm.split_mode", "expected one of none|layer|row|tensor"),
    ({"tensor_split": "16,16,17,0,1"}, "llama_server_instances.glm.tensor_split", "5 shares for 4 GPUs"),
])
def test_config_llama_instance_problems_name_the_key_path(change, path, text):
    plan, facts = host("h100")
    d = glm_llama()
    d["llama_server_instances"]["glm"].update(change)
    found = only(refusals(plan, facts, data(**d)), "config")
    assert any(r.what == path and text in r.why for r in found), [r.line("h") for r in found]


def test_instance_defaults_are_filled_in():
    found, problems = instances(data(**glm_llama()))
    assert problems == []
    inst = found["glm"]
    assert (inst["host"], inst["ctx"], inst["parallel"], inst["ngl"], inst["split_mode"]) == ("127.0.0.1", 8192, 1, 99, "layer")


def test_an_instance_open_to_the_network_needs_an_api_key():
    plan, facts = host("a100")
    open_ = glm_llama(host="0.0.0.0")
    found = [r for r in refusals(plan, facts, data(**open_)) if r.check == "open_without_key"]
    assert found and "without an API key" in found[0].what and "api_key: true" in found[0].fix
    inst = open_["llama_server_instances"]
    keyed = {**open_, "llama_server_instances": {k: {**v, "api_key": True} for k, v in inst.items()}}
    assert not [r for r in refusals(plan, facts, data(**keyed)) if r.check == "open_without_key"]
