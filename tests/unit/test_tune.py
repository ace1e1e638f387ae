"""plays/shipped/tune.py's sweep, with each point's figure given by a table instead of a server (the
measuring itself, a real llama-server, runs on the lab and on the H200: tests/roles/test_tune.py,
tests/gpu/check.py tune)."""

import pytest

from plays.shipped import tune
from rigup.contract import llama_server as contract
from roles.llama_server.command import argv as unit_argv
from rigup.instances.llama_server import instances
from tests.lab.hub import gguf_bytes
from tests.unit.hosts import REV, data

ARGV = ["/b/llama-server", "-m", "/m.gguf", "--alias", "g", "--host", "0.0.0.0", "--port", "8081", "-c", "8192",
        "--parallel", "1", "-ngl", "99", "-fa", "auto", "--jinja"]
FLAGS = contract.spellings(contract.SWEPT)   # the spec's flags, as plays/tuning.py spec writes them
SPEC = {"argv": ARGV, "port": 18081, "concurrency": 8, "slot_tokens": 8192, "max_parallel": 32, "gpu": True,
        "budget_s": 600, "flags": {k: list(v) for k, v in FLAGS.items()}}


def table(figures: dict, default: float = 100.0, failing=()):
    """measure_point: tok/s by (parallel, fa, batch, kv) read from the argv, as a server would give."""
    seen = []

    def measure(spec, argv, log):
        f = tune.flags_of(argv, FLAGS)
        key = (int(f["parallel"]), f.get("flash_attn"), f.get("batch"), f.get("cache_type_k"))
        seen.append(key)
        if key in failing:
            return {"status": "no-fit", "error": "cudaMalloc failed: out of memory"}
        return {"status": "ok", "tps": figures.get(key, default)}
    return measure, seen


def test_the_tuners_allow_list_is_the_contracts_swept_spellings():
    """plays/shipped/tune.py takes only the spellings it holds (no host holds the contract): both change together."""
    assert tune.SPELLINGS == FLAGS


def test_flags_are_set_once_in_every_spelling():
    argv = tune.with_flags(ARGV + ["--ctx-size=4096", "-np", "3"], {"ctx": 65536, "parallel": 8, "port": 1}, FLAGS)
    assert argv.count("-c") == 1 and "--ctx-size=4096" not in argv and "-np" not in argv
    assert tune.flags_of(argv, FLAGS) == {"ctx": "65536", "parallel": "8", "port": "1", "host": "0.0.0.0", "flash_attn": "auto", "ngl": "99"}
    assert tune.with_flags(ARGV, {"flash_attn": None}, FLAGS)[-1] == "--jinja" and "-fa" not in tune.with_flags(ARGV, {"flash_attn": None}, FLAGS)


def test_slots_grow_while_they_gain_then_the_gpu_flags_are_tried():
    figures = {(1, "auto", None, None): 100, (8, "auto", None, None): 400, (16, "auto", None, None): 600,
               (32, "auto", None, None): 590, (16, "on", None, None): 700}
    measure, seen = table(figures, default=650)
    result = tune.tune(SPEC, measure_point=measure, logs=None)
    print([(p["flags"], p["tps"]) for p in result["points"]])
    assert seen[:4] == [(1, "auto", None, None), (8, "auto", None, None), (16, "auto", None, None),
                        (32, "auto", None, None)]            # 32 lost: 4 is never tried
    assert result["best"]["flags"] == {"parallel": 16, "ctx": 131072, "flash_attn": "on"}
    assert result["ratio"] == 7.0 and result["baseline"]["flags"] == {}
    kinds = [p["stage"] for p in result["points"]]
    assert kinds == [0, 1, 1, 1, 2, 3, 4, 4, 5]   # -cram 0; fa on gained (off is not tried); 2 batch pairs; q8_0
    assert result["points"][4]["flags"] == {"parallel": 16, "ctx": 131072, "cache_ram": 0}


def test_fewer_slots_are_tried_when_the_concurrency_loses():
    figures = {(1, "auto", None, None): 100, (8, "auto", None, None): 90, (4, "auto", None, None): 120,
               (2, "auto", None, None): 110}
    measure, seen = table(figures, default=50)
    result = tune.tune({**SPEC, "gpu": False}, measure_point=measure)
    assert [k[0] for k in seen] == [1, 8, 4, 2, 4] and result["best"]["flags"] == {"parallel": 4, "ctx": 32768}


def test_a_change_that_spells_the_baselines_own_flags_is_not_measured_again():
    """The instance already serves 2 slots of 4,096 (as the lab's does) at a target of 4: the
    halving direction's 2 is the baseline itself, skipped (on the lab it was measured twice,
    8.5 and 24.2 tok/s, and the noise won); 1 is tried."""
    argv = tune.with_flags(ARGV, {"ctx": 8192, "parallel": 2}, FLAGS)
    figures = {(2, "auto", None, None): 100, (4, "auto", None, None): 90, (1, "auto", None, None): 60}
    measure, seen = table(figures)
    result = tune.tune({**SPEC, "argv": argv, "concurrency": 4, "slot_tokens": 4096, "gpu": False},
                       measure_point=measure)
    assert [k[0] for k in seen] == [2, 4, 1, 2] and result["best"]["flags"] == {} and result["ratio"] == 1.0


def test_a_point_that_does_not_fit_is_recorded_and_skipped():
    measure, _ = table({(8, "auto", None, None): 400}, failing={(16, "auto", None, None)})
    result = tune.tune({**SPEC, "gpu": False}, measure_point=measure)
    bad = [p for p in result["points"] if p["status"] != "ok"]
    assert [p["flags"]["parallel"] for p in bad] == [16] and "out of memory" in bad[0]["error"]
    assert result["best"]["flags"]["parallel"] == 8


def test_a_gain_within_the_noise_keeps_what_is():
    measure, _ = table({(8, "auto", None, None): 102}, default=100)
    result = tune.tune({**SPEC, "gpu": False, "concurrency": 8}, measure_point=measure)
    assert result["best"]["flags"] == {} and result["ratio"] == 1.0


def test_the_budget_ends_the_sweep_and_the_best_so_far_stands():
    measure, seen = table({(8, "auto", None, None): 400})
    result = tune.tune({**SPEC, "budget_s": 0}, measure_point=measure)
    assert len(seen) == 1 and result["best"] is result["baseline"] and "budget" in result["stopped"]


def test_a_baseline_that_does_not_serve_stops_the_sweep():
    measure, seen = table({}, failing={(1, "auto", None, None)})
    result = tune.tune(SPEC, measure_point=measure)
    assert len(seen) == 1 and result["best"] is None and "does not serve" in result["stopped"]


@pytest.mark.parametrize("levels, want", [([{"total_tps": 100}, {"total_tps": 400}], 200.0), ([], 0.0)])
def test_a_points_figure_is_the_geometric_mean_of_its_levels(levels, want):
    assert tune.score(levels) == want


def test_the_parallel_stage_starts_at_the_highest_level():
    assert tune.parallel_directions(32, 32) == [[32], [16, 8, 4, 2, 1]]
    assert tune.parallel_directions(64, 32)[0] == [32]
    stages = tune.stages({**SPEC, "levels": [1, 8, 16, 32]}, tune.flags_of(ARGV, FLAGS))
    assert stages[1][0][0] == {"parallel": 32, "ctx": 262144}


def test_the_host_ram_prompt_cache_off_is_kept_when_it_gains_and_the_flag_reaches_the_unit():
    def measure(spec, argv, log):
        f = tune.flags_of(argv, FLAGS)
        return {"status": "ok", "tps": 330.0 if f.get("cache_ram") == "0" else 230.0}
    result = tune.tune({**SPEC, "gpu": False, "max_parallel": 8}, measure_point=measure)
    assert result["best"]["flags"] == {"cache_ram": 0} and "-cram" in result["best"]["argv"]
    found, problems = instances(data(models={"m": {"repo": "a/b-GGUF", "revision": REV}},
                                     llama_server_instances={"g": {"model": "m", "port": 8081, "ctx": 4096, "parallel": 2}},
                                     llama_server_tuned={"g": {"flags": {"cache_ram": 0}}}))
    assert problems == [] and found["g"]["cache_ram"] == 0
    assert " -cram 0" in " ".join(map(str, unit_argv("g", found["g"], "/b/llama-server", "/m.gguf")))


def offloaded(fit: int, layers: int = 32):
    """measure_point of a model of ``layers`` layers whose VRAM holds ``fit`` of them: tok/s grows
    with the layers on the GPU; more than ``fit`` runs out of memory. The server logs the count."""
    seen = []

    def measure(spec, argv, log):
        f = tune.flags_of(argv, FLAGS)
        ngl = min(int(f.get("ngl", 99)), layers + 1) - int(f.get("n_cpu_moe", 0))
        seen.append(ngl)
        if ngl > fit:
            return {"status": "no-fit", "error": "cudaMalloc failed: out of memory"}
        return {"status": "ok", "tps": 10.0 + 5 * ngl}
    return measure, seen


def test_a_partial_offload_climbs_in_eighths_of_the_models_layers_until_it_does_not_fit(tmp_path):
    model = tmp_path / "m.gguf"   # the header the tuner reads the layer count from (-m)
    model.write_bytes(gguf_bytes({"general.architecture": "llama", "llama.block_count": 32}, {}))
    measure, seen = offloaded(fit=26)
    argv = tune.with_flags(ARGV, {"ngl": 12}, FLAGS)
    spec = {**SPEC, "argv": argv[:argv.index("-m") + 1] + [str(model)] + argv[argv.index("-m") + 2:],
            "max_parallel": 1, "concurrency": 1}
    result = tune.tune(spec, measure_point=measure)
    assert result["layers"] == 32
    assert seen[:5] == [12, 16, 20, 24, 28]   # 28 > 26: out of memory, the climb ends there
    assert result["best"]["flags"]["ngl"] == 24 and [p["status"] for p in result["points"]][4] == "no-fit"
    found, problems = instances(data(models={"m": {"repo": "a/b-GGUF", "revision": REV}},
                                     llama_server_instances={"g": {"model": "m", "port": 8081, "ngl": 12}},
                                     llama_server_tuned={"g": {"flags": {"ngl": 24, "n_cpu_moe": 4}}}))
    assert problems == [] and " -ngl 24 " in " ".join(map(str, unit_argv("g", {**found["g"], "ctx": 8192, "parallel": 1},
                                                                          "/b/llama-server", "/m.gguf")))


def test_moe_experts_come_onto_the_gpus_until_they_do_not_fit_and_a_whole_model_skips_the_stage():
    measure, seen = offloaded(fit=30)
    spec = {**SPEC, "argv": tune.with_flags(ARGV, {"n_cpu_moe": 20}, FLAGS), "layers": 32, "max_parallel": 1, "concurrency": 1}
    assert tune.stages(spec, tune.flags_of(spec["argv"], FLAGS))[1] == [[{"n_cpu_moe": n} for n in (16, 12, 8, 4, 0)]]
    result = tune.tune(spec, measure_point=measure)
    assert result["best"]["flags"]["n_cpu_moe"] == 4   # 33 - 0 > 30 does not fit
    assert all("ngl" not in c for s in tune.stages({**SPEC, "layers": 32}, tune.flags_of(ARGV, FLAGS)) for d in s for c in d)


def test_several_gpus_try_the_other_split_mode_each_card_with_less_and_each_main_gpu():
    stages = tune.stages({**SPEC, "gpus": 2}, tune.flags_of(ARGV + ["-sm", "layer"], FLAGS))
    split = [s for s in stages if any("split_mode" in c or "tensor_split" in c for d in s for c in d)]
    assert split == [[[{"split_mode": "row"}]], [[{"tensor_split": "3,4"}], [{"tensor_split": "4,3"}]],
                     [[{"split_mode": "row", "main_gpu": 1}]]]
    assert not [s for s in tune.stages(SPEC, tune.flags_of(ARGV, FLAGS)) if any("tensor_split" in c for d in s for c in d)]
    assert tune.with_flags(ARGV, {"tensor_split": "3,4", "main_gpu": 1}, FLAGS)[-4:] == ["-ts", "3,4", "-mg", "1"]


def test_the_drop_ins_execstart_reads_back_as_the_arguments_it_was_written_from():
    """issue 47: the sweep reads the instance's ExecStart= (roles/llama_server's drop-in, written by
    rigup.boundary.formats.systemd_quote); a '%' or '$' in an argument is doubled there for systemd, and must
    reach the sweep's servers single."""
    from plays.tuning import ExecStart
    from rigup.boundary.formats import systemd_quote
    argv = ["/opt/rigup/llama.cpp/current/bin/llama-server", "-m", "/srv/models/m/a b.gguf", "--alias", "g",
            "--chat-template-kwargs", '{"budget": "50%", "x": "$HOME"}', "--api-key-file", "/etc/rigup/k;ey"]
    line = " ".join(systemd_quote(a) for a in argv)
    assert "50%%" in line and "$$HOME" in line
    assert ExecStart().process([line]) == argv and ExecStart().process([""]) is None


def test_environment_lines_keep_a_dollar_and_read_back_as_written():
    """issue 47: Environment= expands specifiers (``%`` doubled) but not variables ("$ has no
    special meaning", systemd.exec): a ``$`` written doubled there reached the server doubled. The
    drop-ins' Environment= words (rigup.boundary.formats.systemd_env) read back by the sweep (ServingEnv)."""
    from plays.tuning import ServingEnv
    from rigup.boundary.formats import systemd_env
    env = {"CUDA_VISIBLE_DEVICES": "1,0", "PROMPT": 'say "$HOME" at 50%', "P": "a\\b;c"}
    words = [systemd_env(k, v) for k, v in env.items()]
    print(words)
    assert words[0] == "CUDA_VISIBLE_DEVICES=1,0" and "$$" not in " ".join(words) and "50%%" in words[1]
    read = ServingEnv().process([f"E {' '.join(words)}", "G 2"])
    assert read["env"] == env and read["gpus"] == 2


@pytest.mark.parametrize("text, count", [("32", 32), ("-1", -1), ("\u00b2", None), ("\u0663\u0662", None), (None, None)])
def test_a_flags_count_is_ascii_digits(text, count):
    """str.isdigit() took "²" (int() raised ValueError) and "٣٢" (read as 32)."""
    print(f"\n{text!r}: {tune._count(text)}")
    assert tune._count(text) == count
