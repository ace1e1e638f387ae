"""roles/llama_server/checks.py and schema.py: instance entries, VRAM, row split, open ports (no hosts)."""

import pytest

from roles.llama_server import checks
from roles.llama_server.command import argv
from rigup.instances.llama_server import instances
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


def test_10_row_split_for_any_other_model_on_cuda_is_the_trap_and_passes_on_a_cpu_build():
    plan, facts = host("a100")
    d = {"models": {"ds": {"repo": "unsloth/DeepSeek-V4.1-Flash-1017-GGUF", "revision": REV, "size_gib": 460.6}},
         "llama_server_instances": {"ds": {"model": "ds", "port": 8081, "split_mode": "row"}}}
    (r,) = only(refusals(plan, facts, data(**d)), "traps")   # CUDA has no split buffers (PR #24216), any model
    assert r.what == "llama_server_instances.ds.split_mode row on a CUDA build"
    assert refusals(plan, facts, data(llama_cpp_backend="cpu", **d)) == []


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
    assert (inst["host"], inst["ctx"], inst["parallel"], inst["ngl"], inst["split_mode"]) == ("127.0.0.1", "auto", "auto", 99, "layer")


def test_an_instance_open_to_the_network_needs_an_api_key():
    plan, facts = host("a100")
    open_ = glm_llama(host="0.0.0.0")
    found = [r for r in refusals(plan, facts, data(**open_)) if r.check == "open_without_key"]
    assert found and "without an API key" in found[0].what and "api_key: true" in found[0].fix
    inst = open_["llama_server_instances"]
    keyed = {**open_, "llama_server_instances": {k: {**v, "api_key": True} for k, v in inst.items()}}
    assert not [r for r in refusals(plan, facts, data(**keyed)) if r.check == "open_without_key"]


# ----------------------------------------------------------------------------- known llama.cpp traps
def llama(**inst) -> dict:
    """An instance of a model of no known family (size 10 GiB), as check_traps sees one."""
    return {"models": {"m": {"repo": "org/model-GGUF", "revision": REV, "size_gib": 10.0}},
            "llama_server_instances": {"x": {"model": "m", "port": 8081, **inst}}}


FA_ALL_QUANTS = "https://github.com/ggml-org/llama.cpp/pull/28456"


@pytest.mark.parametrize("inst, what, trap, fix", [
    ({"cache_type_k": "q4_1", "cache_type_v": "q4_1"},
     "llama_server_instances.x.cache_type_k/cache_type_v q4_1/q4_1 with flash_attn auto, ngl 99 on a CUDA build",
     f"fa-kv-type-cpu-fallback: {FA_ALL_QUANTS}", "add GGML_CUDA_FA_ALL_QUANTS=ON to llama_cpp_cmake_options"),
    ({"cache_type_k": "q5_1", "cache_type_v": "q5_1", "flash_attn": "on"},
     "llama_server_instances.x.cache_type_k/cache_type_v q5_1/q5_1 with flash_attn on, ngl 99 on a CUDA build",
     "fa-kv-type-cpu-fallback", "or set llama_server_instances.x.cache_type_k and cache_type_v to one same type"),
    ({"cache_type_k": "q8_0", "cache_type_v": "q4_0", "flash_attn": "on"},     # mixed K/V
     "llama_server_instances.x.cache_type_k/cache_type_v q8_0/q4_0 with", "fa-kv-type-cpu-fallback", "ALL_QUANTS"),
    ({"cache_type_k": "q8_0", "flash_attn": "on"},                               # K q8_0, V the default f16
     "llama_server_instances.x.cache_type_k/cache_type_v q8_0/f16 with", "fa-kv-type-cpu-fallback", "ALL_QUANTS"),
    ({"cache_type_k": "iq4_nl", "cache_type_v": "iq4_nl", "flash_attn": "on"},
     "llama_server_instances.x.cache_type_k/cache_type_v iq4_nl/iq4_nl with", "fa-iq4nl-no-cuda-kernel",
     "set llama_server_instances.x.cache_type_k and cache_type_v to one same type of f16, q8_0 or q4_0"),
    ({"cache_type_v": "q8_0", "flash_attn": "off"},
     "llama_server_instances.x.cache_type_v q8_0 with flash_attn off",
     "quantized-v-without-fa: https://github.com/ggml-org/llama.cpp/issues/28524",
     "set llama_server_instances.x.flash_attn: on, or llama_server_instances.x.cache_type_v: f16"),
    ({"cache_type_k": "q8_0", "cache_type_v": "q8_0", "extra_args": ["--flash-attn=off"]},
     "llama_server_instances.x.cache_type_v q8_0 with extra_args --flash-attn off", "quantized-v-without-fa",
     "flash_attn: on"),
    ({"split_mode": "row"}, "llama_server_instances.x.split_mode row on a CUDA build",
     "sm-row-no-split-buffers: https://github.com/ggml-org/llama.cpp/pull/24216",
     "set llama_server_instances.x.split_mode: layer"),
    ({"extra_args": ["-sm", "row"]}, "llama_server_instances.x.extra_args -sm row on a CUDA build",
     "sm-row-no-split-buffers", "split_mode: layer"),
])
def test_traps_each_is_refused_with_its_id_ref_and_fix(inst, what, trap, fix):
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(**llama(**inst))), "traps")
    line = r.line("h")
    assert r.what.startswith(what), line
    assert f"(llama.cpp trap {trap}" in line and fix in r.fix, line
    print(line)


def test_traps_the_row_split_refusal_says_why_not_the_model():
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(**llama(split_mode="row"))), "traps")
    assert '"device CUDA0 does not support split buffers"' in r.why and "001_62f01b4e828dcb29.txt" in r.why
    assert "every model" in r.why


@pytest.mark.parametrize("inst, extra", [
    ({"flash_attn": "on"}, {}),                                                     # f16 KV with FA
    ({"cache_type_k": "f16", "cache_type_v": "f16", "flash_attn": "on"}, {}),
    ({"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}, {}),      # K = V with a default kernel
    ({"cache_type_k": "q4_0", "cache_type_v": "q4_0"}, {}),
    ({"cache_type_k": "bf16", "cache_type_v": "bf16", "flash_attn": "on"}, {}),
    ({"cache_type_k": "q4_1", "cache_type_v": "q4_1", "flash_attn": "on"},
     {"llama_cpp_cmake_options": ["GGML_CUDA_FA_ALL_QUANTS=ON"]}),
    ({"cache_type_k": "q8_0", "cache_type_v": "q5_0", "flash_attn": "on"},           # mixed, with the option
     {"llama_cpp_cmake_options": ["-DGGML_CUDA_FA_ALL_QUANTS:BOOL=1"]}),
    ({"cache_type_k": "q4_1", "cache_type_v": "q4_1", "flash_attn": "on"}, {"llama_cpp_backend": "cpu"}),
    ({"cache_type_v": "q4_0", "flash_attn": "on"}, {"llama_cpp_backend": "cpu"}),   # quantized V, CPU build, FA on
    ({"cache_type_k": "q5_1", "cache_type_v": "q5_1", "flash_attn": "on", "ngl": 0}, {}),   # no layers on the GPUs
    ({"cache_type_k": "q4_0", "flash_attn": "off"}, {}),                             # a quantized K alone needs no FA
    ({"cache_type_k": "q4_1", "extra_args": ["-fa", "off"]}, {}),                    # FA off: no FA kernel needed
    ({"split_mode": "layer"}, {}),
    ({"split_mode": "row"}, {"llama_cpp_backend": "cpu"}),
])
def test_traps_safe_configurations_pass(inst, extra):
    plan, facts = host("h100")
    assert [r.line("h") for r in refusals(plan, facts, data(**llama(**inst), **extra))] == []


def test_traps_the_build_option_must_be_on_and_its_last_setting_counts():
    plan, facts = host("h100")
    inst = llama(cache_type_k="q4_1", cache_type_v="q4_1", flash_attn="on")
    for options in (["GGML_CUDA_FA_ALL_QUANTS=OFF"], ["GGML_CUDA_FA_ALL_QUANTS=ON", "GGML_CUDA_FA_ALL_QUANTS=OFF"],
                    ["GGML_CUDA_FA_ALL_QUANTSX=ON"]):
        only(refusals(plan, facts, data(llama_cpp_cmake_options=options, **inst)), "traps")


def test_traps_iq4_nl_is_refused_even_with_the_build_option():
    plan, facts = host("h100")
    d = data(llama_cpp_cmake_options=["GGML_CUDA_FA_ALL_QUANTS=ON"],
             **llama(cache_type_k="iq4_nl", cache_type_v="iq4_nl", flash_attn="on"))
    (r,) = only(refusals(plan, facts, d), "traps")
    assert "fa-iq4nl-no-cuda-kernel" in r.why


def test_traps_glm_row_split_stays_check_split_mode_row_alone():
    plan, facts = host("h100")
    only(refusals(plan, facts, data(**glm_llama(split_mode="row"))), "split_mode_row")


@pytest.mark.parametrize("args, key", [(["-ctk", "q8_0"], "cache_type_k"), (["--cache-type-k=q8_0"], "cache_type_k"),
                                       (["-ctv q4_0"], "cache_type_v"), (["--cache-type-v", "q4_0"], "cache_type_v")])
def test_cache_types_in_extra_args_are_refused_rigup_owns_them(args, key):
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(**llama(extra_args=args))), "config")
    assert r.what == "llama_server_instances.x.extra_args" and f"set {key}" in r.why, r.line("h")


def test_cache_types_outside_llama_cpps_are_refused():
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(**llama(cache_type_v="q4_2"))), "config")
    assert r.what == "llama_server_instances.x.cache_type_v" and "expected one of f32|f16|bf16|q8_0" in r.why


def test_cache_types_reach_the_command_line_only_when_set():
    found, _ = instances(data(**llama(cache_type_k="q8_0", cache_type_v="q8_0", ctx=8192, parallel=1)))
    args = argv("x", found["x"], "/b/llama-server", "/m.gguf")
    assert args[args.index("-ctk") + 1] == "q8_0" and args[args.index("-ctv") + 1] == "q8_0"
    default, _ = instances(data(**llama(ctx=8192, parallel=1)))
    assert not {"-ctk", "-ctv"} & set(argv("x", default["x"], "/b/llama-server", "/m.gguf"))
    with pytest.raises(ValueError, match="sized"):   # auto is chosen first, never passed on
        argv("x", instances(data(**llama()))[0]["x"], "/b/llama-server", "/m.gguf")


def test_traps_catalogue_values_are_checked(tmp_path):
    bad = tmp_path / "traps.yml"
    bad.write_text("- id: t\n  ref: https://x.invalid/1\n  summary: s\n  condition: {flash_attn: [true]}\n"
                   "  remedy: {kind: refuse, value: null, fix: f}\n")
    with pytest.raises(ValueError, match=r"traps.yml: entry 1 \(t\): condition.flash_attn: \[True\] is not a value"):
        checks.catalogue(bad)
    assert len(checks.catalogue()) == 4


def test_batch_sizes_reach_the_command_line_only_when_set_and_extra_args_may_not_give_them():
    found, _ = instances(data(**llama(batch=4096, ubatch=1024, ctx=8192, parallel=1)))
    args = argv("x", found["x"], "/b/llama-server", "/m.gguf")
    assert args[args.index("-b") + 1] == "4096" and args[args.index("-ub") + 1] == "1024"
    plain, _ = instances(data(**llama(ctx=8192, parallel=1)))
    assert not {"-b", "-ub"} & set(argv("x", plain["x"], "/b/llama-server", "/m.gguf"))
    _, problems = instances(data(**llama(extra_args=["-ub", "256"])))
    assert problems and problems[0][0] == "llama_server_instances.x.extra_args" and "ubatch" in problems[0][1]
