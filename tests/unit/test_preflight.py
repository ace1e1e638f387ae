"""Preflight's refusals, as pure functions of plan, facts and data (no hosts)."""

from pathlib import Path

import pytest

from rigup.config import declared
from rigup.gpu.catalogue import family_of, min_driver_for_cuda, model_families, newest_cuda_for_driver
from rigup.gpu.facts import parse_gpus
from rigup.gpu.plan import hardware_plan
from roles.preflight import checks, refusals
from roles.preflight.facts import parse_path_bytes, path_bytes_command
from roles.preflight.schema import serving_config

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
GIB = 1024 ** 3
REV = "0123456789abcdef0123456789abcdef01234567"
NO_DRIVER = {"version": None, "kernel_module": None, "loaded": False}


def host(profile: str, driver: str | None = None, **extra) -> tuple[dict, dict]:
    """(plan, facts) of a host from the fact fixtures: a100 (8 cards), h100 (4), cmp170hx (6 locked)."""
    csv = {"a100": "a100-query-nounits.csv", "h100": "h100-query-nounits.csv",
           "cmp170hx": "cmp170hx-locked-query-nounits.csv"}[profile]
    gpus = parse_gpus((FIX / csv).read_text().splitlines())
    drv = {"version": driver or gpus[0]["driver_version"], "kernel_module": "open", "loaded": True}
    facts = {"gpus": gpus, "driver": drv, "cuda_toolkits": [], "listening_ports": {22: "sshd"},
             "secure_boot": None, "kernel": {"release": "6.1.0-28-amd64", "headers": True},
             "systemd": True, "free_disk": {"/": 500 * GIB, "/srv/models/glm": 500 * GIB},
             "model_bytes": {}}
    facts.update(extra)
    return hardware_plan(gpus, drv, []), facts


def data(**overrides) -> dict:
    """A host's merged data: every role default, then ``overrides``."""
    merged = {name: var.default for name, var in declared().items()}
    merged.update(overrides)
    return merged


GLM = {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": REV, "include": ["UD-Q4_K_XL/*"], "size_gib": 186.0}


def glm_llama(**inst) -> dict:
    return {"models": {"glm": dict(GLM)},
            "llama_server_instances": {"glm": {"model": "glm", "port": 8081, **inst}}}


def only(found, check: str):
    """The refusals of one check; fails when another check refused too."""
    assert [r.check for r in found] == [check] * len(found), [r.line("h") for r in found]
    assert found, "nothing was refused"
    return found


# ----------------------------------------------------------------------------- a healthy host
@pytest.mark.parametrize("profile", ["a100", "h100", "cmp170hx"])
def test_defaults_on_each_profile_pass(profile):
    plan, facts = host(profile)
    assert refusals(plan, facts, data()) == []


def test_seed_recipe_glm_q4_on_4x_h100_passes():
    plan, facts = host("h100")
    recipe = glm_llama(ctx=65536, parallel=8, ngl=99, flash_attn="on", jinja=True)
    assert refusals(plan, facts, data(**recipe)) == []


def test_every_line_names_host_what_why_and_fix():
    plan, facts = host("a100")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=450)), "power_range")
    line = r.line("node-7")
    assert line.startswith("[node-7] refused: gpu_power_watts 450 W is outside")
    assert "; fix: " in line and "\n" not in line


# ----------------------------------------------------------------------------- 3
def test_3_gpu_roles_on_a_host_without_gpu_are_refused_with_a_fix():
    plan = hardware_plan([], NO_DRIVER, [])
    (refusal,) = refusals(plan, {}, {"gpu_enabled": True})
    line = refusal.line("node-7")
    assert line.startswith("[node-7] refused: GPU roles enabled on a host without a usable NVIDIA GPU")
    assert "fix: install the NVIDIA driver, or set gpu_enabled: false" in line


def test_3_cpu_only_host_with_gpu_roles_off_passes():
    plan = hardware_plan([], NO_DRIVER, [])
    assert refusals(plan, {}, {"gpu_enabled": False}) == []


def test_3_a_gpu_less_host_gets_only_that_refusal_not_every_gpu_check():
    plan = hardware_plan([], NO_DRIVER, [])
    found = refusals(plan, {}, data(gpu_power_watts=900, cuda_version="10.2", cmpunlocker_enabled=True))
    assert [r.check for r in found] == ["gpu_host"]


# ----------------------------------------------------------------------------- 1
def test_1_power_limit_above_the_cards_max_names_the_range():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=300)), "power_range")
    assert "gpu_power_watts 300 W" in r.what
    assert "GPU 0-5 (cmp170hx) accept 100-250 W" in r.why
    assert "set gpu_power_watts between 100 and 250" in r.fix


def test_1_power_limit_below_the_cards_min():
    plan, facts = host("h100")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=150)), "power_range")
    assert "200-700 W" in r.why


def test_1_power_limit_in_range_passes():
    plan, facts = host("cmp170hx")
    assert refusals(plan, facts, data(gpu_power_watts=180)) == []


def test_1_override_out_of_its_cards_range():
    plan, facts = host("cmp170hx")
    uuid = facts["gpus"][2]["uuid"]
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={uuid: 280})), "power_range")
    assert f"gpu_power_overrides.{uuid} 280 W" in r.what
    assert "GPU 2 (cmp170hx, 00000000:0D:00.0) accepts 100-250 W" in r.why


# ----------------------------------------------------------------------------- 2
def test_2_override_for_a_uuid_not_on_the_host():
    plan, facts = host("a100")
    bad = "GPU-00000000-dead-beef-0000-000000000000"
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={bad: 300})), "power_override_target")
    assert f"gpu_power_overrides.{bad} names a card that is not on this host" in r.what
    assert "00000000:07:00.0" in r.why and "its 8 GPUs" in r.why


def test_2_override_for_a_bus_id_not_on_the_host():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={"0000:c3:00.0": 150})), "power_override_target")
    assert "0000:c3:00.0" in r.what


def test_2_override_keyed_by_index_is_refused():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={"3": 150})), "power_override_target")
    assert "keyed by a GPU index" in r.what and "reorder between boots" in r.why


def test_2_overrides_by_uuid_any_case_or_bus_id_with_short_domain_pass():
    plan, facts = host("cmp170hx")
    overrides = {facts["gpus"][0]["uuid"].lower(): 150, "0000:0a:00.0": 140, "0D:00.0": 180}
    assert refusals(plan, facts, data(gpu_power_overrides=overrides)) == []


# ----------------------------------------------------------------------------- 4
def test_4_driver_older_than_the_toolkit_needs():
    plan, facts = host("a100")  # driver 580.105.08
    (r,) = only(refusals(plan, facts, data(cuda_version="13.1")), "driver_for_cuda")
    assert r.what == "NVIDIA driver 580.105.08 is too old for CUDA 13.1"
    assert "needs driver >= 590.44.01" in r.why
    assert "set cuda_version to 13.0 or older" in r.fix and "upgrade the NVIDIA driver to >= 590.44.01" in r.fix


def test_4_unlisted_newer_version_uses_the_nearest_lower_minimum():
    plan, facts = host("h100", driver="575.57.08")
    (r,) = only(refusals(plan, facts, data(cuda_version="13.4")), "driver_for_cuda")
    assert "the minimum of CUDA 13.2, the nearest listed" in r.why


def test_4_cuda_version_that_is_not_major_minor():
    plan, facts = host("a100")
    (r,) = only(refusals(plan, facts, data(cuda_version="twelve")), "driver_for_cuda")
    assert "is not a CUDA version" in r.what


def test_4_driver_table_matches_the_release_notes():
    assert min_driver_for_cuda("11.8") == ("11.8", "520.61.05")
    assert min_driver_for_cuda("12.0") == ("12.0", "525.60.13")
    assert min_driver_for_cuda("12.4") == ("12.4", "550.54.14")
    assert min_driver_for_cuda("12.8") == ("12.8", "570.26")
    assert min_driver_for_cuda("13.0") == ("13.0", "580.65.06")
    assert min_driver_for_cuda("12.7") == ("12.6", "560.28.03")     # not a release: nearest lower
    assert min_driver_for_cuda("10.2") is None
    assert newest_cuda_for_driver("580.105.08") == "13.0"
    assert newest_cuda_for_driver("610.43.02") == "13.2"


# ----------------------------------------------------------------------------- 5
def test_5_toolkit_too_old_for_hopper():
    plan, facts = host("h100")
    found = refusals(plan, facts, data(cuda_version="11.4"))
    (r,) = only(found, "cuda_for_archs")
    assert r.what == "CUDA 11.4 is too old for this host's cards"
    assert "h100 cards (sm_90) need CUDA >= 11.8" in r.why
    assert "set cuda_version to 11.8 or newer" in r.fix


def test_5_the_same_toolkit_is_fine_for_ampere():
    plan, facts = host("a100")
    assert refusals(plan, facts, data(cuda_version="11.4")) == []


# ----------------------------------------------------------------------------- 6
def test_6_port_taken_by_another_process_names_it():
    plan, facts = host("h100", listening_ports={22: "sshd", 8080: "python3"})
    found = refusals(plan, facts, data(**glm_llama(port=8080)))
    (r,) = only(found, "ports")
    assert r.what == "port 8080 of llama_server_instances.glm is already taken"
    assert "process python3 listens on it" in r.why
    assert "stop python3 or give the instance another port (llama_server_instances.glm.port: 8081 is free)" in r.fix


def test_6_port_held_by_our_own_server_is_not_refused():
    plan, facts = host("h100", listening_ports={22: "sshd", 8081: "llama-server"})
    assert refusals(plan, facts, data(**glm_llama(port=8081))) == []


def test_6_port_held_by_an_unnamed_process():
    plan, facts = host("h100", listening_ports={8081: None})
    (r,) = only(refusals(plan, facts, data(**glm_llama())), "ports")
    assert "a process that ss cannot name" in r.why


def test_6_two_instances_on_one_port():
    plan, facts = host("h100")
    d = glm_llama()
    d["vllm_instances"] = {"glm": {"model": "glm", "port": 8081, "tp": 4}}
    found = [r for r in refusals(plan, facts, data(**d)) if r.check == "ports"]
    assert found[0].what == "port 8081 is given to 2 instances"
    assert "llama_server_instances.glm and vllm_instances.glm" in found[0].why


# ----------------------------------------------------------------------------- 7
def test_7_not_enough_disk_gives_both_sizes():
    plan, facts = host("h100", free_disk={"/": 50 * GIB, "/srv/models/glm": 50 * GIB})
    (r,) = only(refusals(plan, facts, data(**glm_llama())), "disk")
    assert r.what == "not enough free disk for model glm"
    assert "needs 186.0 GiB more at /srv/models/glm" in r.why and "has 50.0 GiB free" in r.why
    assert "free 136.0 GiB there" in r.fix


def test_7_bytes_already_downloaded_count():
    plan, facts = host("h100", free_disk={"/srv/models/glm": 50 * GIB},
                       model_bytes={"/srv/models/glm": 150 * GIB})
    assert refusals(plan, facts, data(**glm_llama())) == []


def test_7_dest_and_models_dir_are_used():
    d = glm_llama()
    d["models"]["glm"]["dest"] = "/data/glm"
    config, problems = serving_config(data(**d))
    assert problems == [] and config["models"]["glm"]["dest"] == "/data/glm"
    config, _ = serving_config(data(models_dir="/big", **glm_llama()))
    assert config["models"]["glm"]["dest"] == "/big/glm"


def test_7_path_bytes_fact_parsing():
    assert "du -sb '/srv/models/a b'" in path_bytes_command(["/srv/models/a b"])
    lines = ["##rigup-bytes:/srv/models/glm", "199715979264", "##rigup-bytes:/srv/models/ds"]
    assert parse_path_bytes(lines) == {"/srv/models/glm": 199715979264, "/srv/models/ds": 0}


# ----------------------------------------------------------------------------- 8
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


def test_8_vllm_weights_beyond_utilisation_of_its_cards():
    plan, facts = host("h100")
    d = {"models": {"glm": dict(GLM, size_gib=306.0, repo="zai-org/GLM-5.3-Flash")},
         "vllm_instances": {"glm": {"model": "glm", "port": 8000, "tp": 4, "gpu_memory_utilization": 0.9}}}
    (r,) = only(refusals(plan, facts, data(**d)), "vram")
    assert "weights 306.0 GiB >= 286.7 GiB usable (gpu_memory_utilization 0.9 x 4 x 79.6 GiB for tp 4 x pp 1)" in r.why


def test_8_partial_offload_is_not_judged():
    plan, facts = host("h100")
    d = glm_llama(ngl=40)
    d["models"]["glm"]["size_gib"] = 900.0
    found = refusals(plan, facts, data(**d, models_dir="/srv/models"))
    assert [r.check for r in found] == ["disk"]


# ----------------------------------------------------------------------------- 9
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


# ----------------------------------------------------------------------------- 10
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


# ----------------------------------------------------------------------------- 11-14
def test_11_cmpunlocker_with_secure_boot_on():
    plan, facts = host("cmp170hx", secure_boot=True)
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_secure_boot")
    assert r.what == "cmpunlocker with Secure Boot on" and "unsigned" in r.why
    assert "turn Secure Boot off" in r.fix


def test_11_unknown_secure_boot_state_is_not_refused():
    plan, facts = host("cmp170hx", secure_boot=None)
    assert refusals(plan, facts, data(cmpunlocker_enabled=True)) == []


def test_12_cmpunlocker_without_kernel_headers():
    plan, facts = host("cmp170hx", kernel={"release": "6.8.0-45-generic", "headers": False})
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_headers")
    assert "/lib/modules/6.8.0-45-generic/build is missing" in r.why
    assert "apt-get install linux-headers-6.8.0-45-generic" in r.fix


def test_13_cmpunlocker_on_an_unsupported_driver():
    plan, facts = host("cmp170hx", driver="610.57.04")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_driver")
    assert r.what == "cmpunlocker on NVIDIA driver 610.57.04"
    assert "exactly 610.43.02, 610.43.03" in r.why and "nvidia-driver-610-open" in r.fix


def test_13_cmpunlocker_on_the_proprietary_module():
    plan, facts = host("cmp170hx")
    plan["driver"]["kernel_module"] = "proprietary"
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_driver")
    assert "open kernel modules" in r.why


def test_14_cmpunlocker_on_a100_cards():
    plan, facts = host("a100", driver="610.43.02")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True)), "cmpunlocker_cards")
    assert r.what == "cmpunlocker on cards that are not CMP 170HX"
    assert "GPU 0-7 are 10de:20b2 (a100-sxm4-80gb)" in r.why
    assert "10de:20c2 (8gb)" in r.why and "10de:2082 (10gb)" in r.why


def test_14_cmpunlocker_profile_must_match_the_cards():
    plan, facts = host("cmp170hx")
    (r,) = only(refusals(plan, facts, data(cmpunlocker_enabled=True, cmpunlocker_profile="10gb")),
                "cmpunlocker_cards")
    assert "GPU 0-5 need 8gb" in r.why and "cmpunlocker_profile: 8gb" in r.fix


def test_11_to_14_all_pass_on_a_ready_cmp_host():
    plan, facts = host("cmp170hx", secure_boot=False)
    assert refusals(plan, facts, data(cmpunlocker_enabled=True, gpu_power_watts=180)) == []


# ----------------------------------------------------------------------------- nested maps
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


def test_config_model_problems():
    plan, facts = host("h100")
    d = {"models": {"glm": {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": "main", "family": "glm5"},
                    "bad": {"revision": REV}}}
    found = only(refusals(plan, facts, data(**d)), "config")
    paths = {r.what: r.why for r in found}
    assert "expected a full 40-hex commit id, got 'main'" in paths["models.glm.revision"]
    assert "'glm5' is not a family of rigup/gpu/models.yml" in paths["models.glm.family"]
    assert paths["models.bad.repo"] == "required (str)"


def test_config_vllm_layout_problems():
    plan, facts = host("h100")
    d = {"models": {"q": {"repo": "Qwen/Qwen3.8-Flash-Next-FP8", "revision": REV}},
         "vllm_instances": {"q": {"model": "q", "port": 8000, "tp": 4, "pp": 2},
                            "p": {"model": "q", "port": 8001, "pp": 4, "pp_partition": "13,11,11"}}}
    found = {r.what: r.why for r in only(refusals(plan, facts, data(**d)), "config")}
    assert found["vllm_instances.q.tp"] == "tp 4 x pp 2 = 8 GPUs, but this host has 4"
    assert found["vllm_instances.p.pp_partition"] == "3 stages in '13,11,11', but pp is 4"


def test_config_override_watts_must_be_int():
    plan, facts = host("cmp170hx")
    uuid = facts["gpus"][0]["uuid"]
    (r,) = only(refusals(plan, facts, data(gpu_power_overrides={uuid: "high"})), "config")
    assert r.what == f"gpu_power_overrides.{uuid}"


def test_instance_defaults_are_filled_in():
    config, problems = serving_config(data(**glm_llama()))
    assert problems == []
    inst = config["llama_server_instances"]["glm"]
    assert (inst["host"], inst["ctx"], inst["parallel"], inst["ngl"], inst["split_mode"]) == ("127.0.0.1", 8192, 1, 99, "layer")


# ----------------------------------------------------------------------------- model families
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


def test_checks_are_pure_and_all_listed():
    assert len(checks.CHECKS) == 17
    plan, facts = host("a100")
    before = repr((plan, facts))
    refusals(plan, facts, data(**glm_llama(split_mode="row"), gpu_power_watts=900, cmpunlocker_enabled=True))
    assert repr((plan, facts)) == before


# ----------------------------------------------------------------------------- group_vars examples
def commented_example(group: str) -> dict:
    """The commented-out recipe at the end of group_vars/<group>.yml, as data."""
    import re

    import yaml
    text = (Path(__file__).resolve().parents[2] / "group_vars" / f"{group}.yml").read_text()
    lines = [ln[2:] for ln in text.splitlines()
             if re.match(r"# ([a-z_]+:|  )", ln) and not ln[2:].lstrip().startswith("(")]
    return yaml.safe_load("\n".join(lines))


@pytest.mark.parametrize("group", ["a100", "h100", "cmp170hx"])
def test_group_vars_examples_are_valid_and_pass_on_their_cards(group):
    example = commented_example(group)
    assert example.get("models"), example
    from rigup.config import problems
    assert problems(example) == []
    plan, facts = host(group)
    assert refusals(plan, facts, data(**example)) == []


def test_an_instance_open_to_the_network_needs_an_api_key():
    plan, facts = host("a100")
    open_ = glm_llama(host="0.0.0.0")
    found = [r for r in refusals(plan, facts, data(**open_)) if r.check == "open_without_key"]
    assert found and "without an API key" in found[0].what and "api_key: true" in found[0].fix
    inst = open_["llama_server_instances"]
    keyed = {**open_, "llama_server_instances": {k: {**v, "api_key": True} for k, v in inst.items()}}
    assert not [r for r in refusals(plan, facts, data(**keyed)) if r.check == "open_without_key"]


def test_what_needs_systemd_is_refused_where_it_is_not_pid_1():
    plan, facts = host("a100", systemd=False)
    assert refusals(plan, facts, data()) == []          # downloads and the build need no systemd
    found = only(refusals(plan, facts, data(gpu_power_watts=300, **glm_llama())), "systemd")
    assert found[0].what == "llama_server_instances (glm), gpu_power_watts on a host without systemd"
    assert "systemd is not PID 1 here" in found[0].why and "model downloads" in found[0].fix
    plan, facts = host("a100")
    assert refusals(plan, facts, data(gpu_power_watts=300, **glm_llama())) == []
