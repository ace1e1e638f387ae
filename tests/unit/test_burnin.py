"""roles/burnin: the acceptance program's own code on the lab's CUDA stand-in (tests/lab/cuda_standin.c,
built here with gcc) and nvidia-smi stand-in, with pyinfra unimportable (as on the GPU machine);
its pure parts; which cards a converge tests, serves on or leaves out; the quarantine in the
serving units' CUDA_VISIBLE_DEVICES, the guard and status.py."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plays import fleet
from rigup.gpu.plan import hardware_plan
from rigup.names import BURNIN_TESTING
from roles.burnin.shipped import acceptance
from roles.burnin.checks import check_clear, check_named
from roles.burnin.facts import parse_burnin_state
from roles.burnin.quarantine import lines, serving, sort_cards
from roles.gpu_guard.shipped.guard import parse_sample
from tests.unit.test_burnin_cublas import alone_scratch

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tests" / "lab"
DATA = {"burnin_level": "standard", "burnin_after_change": "quick", "burnin_retest": False, "burnin_clear": []}


@pytest.fixture(scope="module")
def sim():
    """The stand-ins of a 4-card A100 host: nvidia-smi on PATH, libcuda.so.1 on LD_LIBRARY_PATH. In the
    home directory: rigup-burnin starts with only LD_LIBRARY_PATH's directories no other user writes
    (round 7b L1; /tmp is 1777)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed (make test installs it)")
    with alone_scratch() as tmp:
        yield from sim_in(tmp)


def sim_in(tmp: Path):
    (tmp / "bin").mkdir()
    (tmp / "lib").mkdir()
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(tmp / "lib/libcuda.so.1"),
                    str(LAB / "cuda_standin.c")], check=True)
    smi = tmp / "bin/nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {LAB / 'nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    profile = json.loads((LAB / "gpu_profiles.json").read_text())["a100"]
    profile["bus_ids"] = profile["bus_ids"][:4]
    (tmp / "profile.json").write_text(json.dumps(profile))
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "LD_LIBRARY_PATH": str(tmp / "lib"),
           "RIGUP_GPU_SIM_PROFILE": str(tmp / "profile.json"), "RIGUP_GPU_SIM_RUN": str(tmp / "run"),
           "RIGUP_GPU_SIM_LIB": str(tmp / "var")}
    yield tmp, env


@pytest.fixture(scope="module")
def blas(sim):
    """The stand-in libcublas.so.12's directory, for the tests that give the host cuBLAS: in the home
    directory, as rigup-burnin loads no library from where another user writes (/tmp is 1777)."""
    with alone_scratch() as where:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-DCUBLAS_STANDIN", "-o",
                        str(where / "libcublas.so.12"), str(LAB / "cuda_standin.c"), "-L", str(sim[0] / "lib"),
                        "-l:libcuda.so.1"], check=True)
        # its libcublasLt beside it (rigup-burnin loads a cuBLAS only with it): an empty library stands in
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(where / "libcublasLt.so.12"), "-x", "c", "/dev/null"], check=True)
        yield where


def burnin(sim, *args, env=None):
    tmp, env = sim[0], env or sim[1]
    prelude = "import sys, runpy; sys.modules['pyinfra'] = None; sys.argv = ['rigup-burnin'] + sys.argv[1:]; " \
              f"runpy.run_path({str(ROOT / 'roles/burnin/shipped/acceptance.py')!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-c", prelude, *args, "--results", str(tmp / "records.json")],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_acceptance_run_finds_each_fault_through_its_own_ctypes_code(sim):
    tmp, env = sim
    subprocess.run(["nvidia-smi", "sim", "reset"], env=env, check=True)
    for args in (["-i", "1", "--vram-bad", "7"], ["-i", "2", "--pcie-width", "1"], ["-i", "3", "--throttle", "0x40"]):
        subprocess.run(["nvidia-smi", "sim", "set", *args], env=env, check=True)
    run = burnin(sim, "run", "--level", "quick", "--soak-s", "1", "--metrics", str(tmp / "m.prom"),
                 "--testing", str(tmp / "testing.json"), "--json", str(tmp / "run.json"))
    print(run.stdout, run.stderr)
    assert run.returncode == 3
    found = json.loads((tmp / "run.json").read_text())
    by_index = {r["index"]: r for r in found.values()}
    assert by_index[0]["passed"] and by_index[0]["figures"]["compute"]["wrong"] == 0
    gemm = by_index[0]["gemm"]    # no cuBLAS here, compute capability 8: the PTX tensor-core load ran, digested
    print("soak's load:", gemm)
    assert gemm["load"] == "ptx" and gemm["differ"] == 0 and gemm["seeds"] == acceptance.GEMM_SEEDS
    assert gemm["why"].startswith("no cuBLAS: ") and by_index[0]["schema"] == 2
    assert by_index[0]["power"]["judged"] is False    # the PTX load does not reach the cap: its watts are not judged
    assert by_index[0]["figures"]["vram"]["mib"] == 73728 and by_index[0]["figures"]["pcie"]["ratio"] > 0.25
    assert by_index[1]["failed"] == ["VRAM: 14 mismatched words (73728 MiB, 1 pattern(s) and their inverses)"]
    assert by_index[2]["failed"][0].startswith("PCIe: ") and "its x16 Gen4 link allows (link now x1 Gen4" in by_index[2]["failed"][0]
    assert by_index[3]["failed"][0].startswith("soak: hardware thermal slowdown in 100% of")
    assert by_index[0]["key"] == {"driver": "580.105.08", "memory_mib": 81920, "power_limit_w": 400.0}
    assert not (tmp / "testing.json").exists()
    prom = (tmp / "m.prom").read_text()
    assert prom.count("rigup_gpu_quarantined{") == 4 and prom.count("} 1\n") >= 3
    status = burnin(sim, "status")
    assert status.stdout.count("FAILED") == 3
    uuid = by_index[1]["uuid"] if "uuid" in by_index[1] else next(u for u, r in found.items() if r["index"] == 1)
    burnin(sim, "clear", uuid, "--metrics", str(tmp / "m.prom"))
    assert "(cleared by the operator)" in burnin(sim, "status").stdout


def test_pure_parts():
    assert acceptance.burn_reference(0, 1) == 1013904223 ^ (1013904223 >> 13)
    seed = acceptance.chunk_seed(0x00000000, 3)
    assert acceptance.chunk_seed(0xFFFFFFFF, 3) == seed ^ 0xFFFFFFFF    # a pattern and its inverse, same salt
    assert acceptance.fill_value(5, seed) != acceptance.fill_value(5, acceptance.chunk_seed(0, 4))
    assert acceptance.pcie_allowed_gbps(5, 16) == pytest.approx(63.0, abs=0.1)
    assert acceptance.pcie_allowed_gbps(None, 16) is None
    assert acceptance.throttle_reasons(0x4 | 0x40) == ["hardware thermal slowdown"]   # the cap itself is no fault
    assert acceptance.health_worse({"ecc.errors.uncorrected.volatile.total": 0},
                                   {"ecc.errors.uncorrected.volatile.total": 2, "remapped_rows.pending": "Yes",
                                    "recovery_action": "GPU Reset"}) == \
        ["2 new uncorrected ECC errors", "a row remap is pending (a reset applies it)",
         "the driver asks for recovery: GPU Reset"]
    assert ".entry fill" in acceptance.PTX and ".entry check" in acceptance.PTX and ".entry burn" in acceptance.PTX
    assert ".target sm_80" in acceptance.MMA_PTX and acceptance.MMA_PTX.count("mma.sync.aligned.m16n8k16") == \
        acceptance.MMA_CHAINS and "@STEP@" not in acceptance.MMA_PTX and ".entry rand" in acceptance.PTX
    assert acceptance.TESTING == BURNIN_TESTING


def test_an_unlock_that_did_not_take_fails_and_a_new_memory_size_is_tested_again():
    """(5) of the issue: a CMP card after the unlock must report its unlocked memory, and the VRAM
    pass covered it; an unlock (another memory size) or a new driver calls for a run again."""
    opts = {"pcie_min_ratio": 0.25, "throttle_max": 0.25}
    fig = {"vram": {"mib": 7372, "total_mib": 8192, "patterns": 1, "mismatches": 0}}
    assert acceptance.judge({"expect_mib": 65536}, fig, opts) == \
        ["VRAM: the card has 8192 MiB, 65536 MiB expected (the unlock did not take)"]
    assert acceptance.judge({"expect_mib": 65536}, {"vram": {**fig["vram"], "total_mib": 65536}}, opts) == []
    g = gpus(1, memory_total_mib=65536)
    part = sort_cards(g, {"records": {g[0]["uuid"]: rec(mib=8192)}}, "580.105.08", DATA)
    assert part["why"] == {g[0]["uuid"]: "memory 8192 -> 65536 MiB"} and part["run"] == {"quick": [g[0]["uuid"]]}


def test_dcgmi_runs_first_on_a_datacenter_card_only(tmp_path, monkeypatch):
    """Where dcgmi is installed: its level for the run's level, on datacenter cards only; a test it
    reports failed is named, its exit status counts when its JSON names none."""
    (tmp_path / "dcgmi").write_text("#!/bin/sh\necho \"$*\" > " + str(tmp_path / "argv") + "\n"
                                    "echo '{\"DCGM GPU Diagnostic\": {\"test_categories\": [{\"category\": \"Hardware\", "
                                    "\"tests\": [{\"name\": \"Memory\", \"results\": [{\"status\": \"Fail\"}]}, "
                                    "{\"name\": \"PCIe\", \"results\": [{\"status\": \"Pass\"}]}]}]}}'\nexit 226\n")
    (tmp_path / "dcgmi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert acceptance.dcgm({"index": 3, "name": "NVIDIA A100-SXM4-80GB"}, 2) == {"level": 2, "failed": ["Memory"]}
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-i", "3", "-j"]
    assert acceptance.dcgm({"index": 0, "name": "NVIDIA CMP 170HX"}, 2) is None
    assert acceptance.judge({}, {"dcgm": {"level": 2, "failed": ["Memory"]}}, {"pcie_min_ratio": 0.25,
                                                                              "throttle_max": 0.25}) == ["dcgmi diag -r 2: Memory"]


def gpus(n=4, **over):
    return [{"index": i, "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000", "bus_id": f"00000000:0{i}:00.0",
             "pci_device_id": "0x20B210DE", "memory_total_mib": 81920, "power_limit_w": 300.0, **over} for i in range(n)]


def rec(passed=True, driver="580.105.08", mib=81920, cap=300.0, **more):
    return {"passed": passed, "failed": [] if passed else ["VRAM: 12 mismatched words"], "index": 1,
            "bus_id": "00000000:01:00.0", "level": "quick", "key": {"driver": driver, "memory_mib": mib, "power_limit_w": cap},
            **more}


def test_which_cards_a_converge_tests_serves_on_or_leaves_out():
    g = gpus()
    u = [x["uuid"] for x in g]
    state = {"records": {u[0]: rec(), u[1]: rec(passed=False), u[2]: rec(driver="535.1"), u[3]: rec(cap=250.0)},
             "units": {}}
    for x, r in zip(g, state["records"].values()):
        r["bus_id"], r["index"] = x["bus_id"], x["index"]
    part = sort_cards(g, state, "580.105.08", DATA)
    print("\n".join(lines(part)))
    assert part["run"] == {"quick": [u[2], u[3]]}
    assert part["why"][u[2]] == "driver 535.1 -> 580.105.08"
    assert part["why"][u[3]] == "power cap 250 -> 300 W, above the one it was soaked at"
    assert [q["uuid"] for q in part["quarantined"]] == [u[1]] and part["accepted"] == 3
    off = [dict(g[0], lost=True, uuid=None, bus_id=state["records"][u[1]]["bus_id"])]   # off the bus: no UUID
    assert [q["uuid"] for q in sort_cards(off, state, None, DATA)["quarantined"]] == [u[1]]
    assert [c["uuid"] for c in serving(g, part)] == [u[0], u[2], u[3]]
    lower = sort_cards(g, {"records": {x: rec(cap=400.0) for x in u}}, "580.105.08", DATA)   # a lower cap was tested
    assert lower["run"] == {} and lower["accepted"] == 4 and lines(lower) == ["burn-in:   4 card(s) accepted"]
    new = sort_cards(g, {"records": {}, "units": {"rigup-llama@a.service": [u[0]]}}, None, DATA)
    assert new["run"] == {"standard": u[1:]} and new["waiting"][0]["why"] == "first sight: in use by rigup-llama@a.service"
    every = sort_cards(g, {"records": {}, "units": {"rigup-llama@a.service": None}}, None, DATA)
    assert every["run"] == {} and len(every["waiting"]) == 4
    rolling = sort_cards(g, {"records": {}, "units": {"rigup-llama@a.service": None}}, None, {**DATA, "rigup_rolling": True})
    assert rolling["run"] == {"standard": u} and rolling["stop"] == ["rigup-llama@a.service"]
    assert "rigup-llama@a.service stopped for the run" in "\n".join(lines(rolling))
    retest = sort_cards(g, state, "580.105.08", {**DATA, "burnin_retest": True})
    assert retest["run"]["standard"] == [u[1]] and not retest["quarantined"]
    clear = sort_cards(g, state, "580.105.08", {**DATA, "burnin_clear": ["all"]})
    assert clear["clear"] == [u[1]] and not clear["quarantined"]
    slow = sort_cards(g, {"records": {u[0]: rec(flagged=["GEMM: 84.7 TFLOPS, 0.85 of its siblings' median"])}}, None, DATA)
    assert slow["accepted"] == 1 and slow["flagged"][0]["uuid"] == u[0] and lines(slow)[-1] == \
        f"burn-in:   GPU 0 ({u[0]}) accepted, flagged: GEMM: 84.7 TFLOPS, 0.85 of its siblings' median"


def test_the_plan_pins_serving_to_the_accepted_cards():
    from roles.llama_server.command import servers
    from roles.llama_server.replicas import layout
    from roles.vllm.command import env_vars
    g = gpus()
    part = sort_cards(g, {"records": {g[1]["uuid"]: rec(passed=False)}}, None, DATA)
    plan = dict(hardware_plan(serving(g, part), {"version": "580.105.08", "loaded": True}, []), burnin=part)
    assert plan["gpu_count"] == 3 and plan["vram_mib"]["total"] == 3 * 81920
    inst = {"model": "m", "port": 8080, "host": "127.0.0.1", "ctx": 4096, "parallel": 1, "replicas": 1,
            "gpus_per_replica": None, "tensor_split": None}
    data = {"gpu_enabled": True, "llama_cpp_backend": "cuda"}
    (one,) = servers("m", inst, layout(inst, {"repo": "x/m", "size_gib": 1}, plan, data))
    assert one["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(g[i]["uuid"] for i in (0, 2, 3))
    env = env_vars("v", {"model": "m"}, {"vllm_nccl_nvls_enable": False}, plan)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(g[i]["uuid"] for i in (0, 2, 3))
    clean = dict(hardware_plan(g, {"version": "580.105.08", "loaded": True}, []), burnin=sort_cards(g, {}, None, DATA))
    (all_cards,) = servers("m", inst, layout(inst, {"repo": "x/m", "size_gib": 1}, clean, data))
    assert all_cards["env"] == {}      # nothing quarantined: no pin (no change for a host without burn-in)


def test_the_guard_leaves_a_quarantined_card_alone(tmp_path):
    rows = ["0, GPU-a, 00000000:07:00.0, 0x20B210DE, 61.00, 400.00, 35",
            "Unable to determine the device handle for GPU0000:0F:00.0: Unknown Error"]
    cards, lost = parse_sample(rows, 15)
    assert lost and len(cards) == 1
    cards, lost = parse_sample(rows, 15, ("0000:0f:00.0",))
    assert lost == [] and [c["uuid"] for c in cards] == ["GPU-a"]
    cards, lost = parse_sample(rows, 15, ("0000:0f:00.0", "0000:07:00.0"))    # every card under test
    assert lost == [] and [(c["uuid"], c.get("aside")) for c in cards] == [("GPU-a", True)]   # read, not judged
    assert [c.get("aside") for c in parse_sample(rows[:1], 0, ("0000:07:00.0",))[0]] == [True]


def test_the_guard_counts_the_draw_of_cards_under_test_against_the_psu_budget():
    """Issue 62: a card under a burn-in soak draws its cap from the same supply: the guard judges
    it not (no temperature or draw limit), yet its draw joins the sum against gpu_psu_watts."""
    from roles.gpu_guard.shipped.guard import evaluate
    config = {"window_s": 10, "psu_watts": 900, "default": {"temp_c": 50, "draw_w": 300}}
    rows = ["0, GPU-a, 00000000:07:00.0, 0x20B210DE, 250.00, 400.00, 45",
            "1, GPU-b, 00000000:0F:00.0, 0x20B210DE, 700.00, 700.00, 88"]   # b: under test, hot, at its cap
    history = [{"t": t, "cards": parse_sample(rows, 0, ("0000:0f:00.0",))[0], "lost": []} for t in (0, 6, 10)]
    why = evaluate(history, config, 10)
    print(why)
    assert why == "the 2 cards' average draws sum to 950.0 W over 10 s > the power supply's budget 900 W (gpu_psu_watts)"
    assert evaluate(history, {**config, "psu_watts": 1000}, 10) is None   # b's 88 C and 700 W not judged


def test_facts_status_and_refusals():
    lines_ = ["##rigup-burnin:records", json.dumps({"GPU-1": rec(passed=False)}), "",
              "##rigup-burnin:units", "Id=rigup-llama@a.service", "Environment=CUDA_VISIBLE_DEVICES=GPU-1,GPU-2 FOO=1",
              "", "Id=rigup-vllm@b.service", "Environment="]
    state = parse_burnin_state(lines_)
    assert state["units"] == {"rigup-llama@a.service": ["GPU-1", "GPU-2"], "rigup-vllm@b.service": None}
    assert state["records"]["GPU-1"]["passed"] is False and state["unreadable"] is None
    assert parse_burnin_state(["##rigup-burnin:records", "{nope"])["unreadable"].startswith("not JSON")
    q = fleet.parse_burnin([json.dumps({"GPU-1": rec(passed=False, failed=["VRAM: 12\x1b[31m words"]),
                                        "GPU-2": rec()})])
    assert list(q) == ["0000:01:00"] and "\\x1b" in q["0000:01:00"]["failed"]    # escaped for the terminal
    row = {"cards": [{"index": 1, "bus": "0000:01:00", "draw_w": 60, "temp_c": 30}], "quarantined": q,
           "guard": {"xid": {}}, "lost_cards": []}
    (card,) = fleet.attention_cards(row)
    assert card["problems"][0][0] == "QUARANTINED"
    assert check_clear({}, {}, {"burnin_clear": ["all", "GPU-00000000-0000-0000-0000-000000000000", "3"]})[0].what \
        == "burnin_clear[2]"
    plan = {"burnin": {"quarantined": [{"uuid": "GPU-2", "index": 2, "failed": ["VRAM: 12 mismatched words"]}]}}
    (refused,) = check_named(plan, {}, {"vllm_instances": {"glm": {"gpus": "0,1,2,3"}, "ds": {"gpus": "4,5"}}})
    assert refused.what == "vllm_instances.glm.gpus names GPU 2 (GPU-2)" and "VRAM: 12" in refused.why


def test_the_soak_on_cublas_judges_watts_digests_and_speed_through_its_own_ctypes_code(sim, blas):
    """With the host's cuBLAS (the stand-in libcublas.so.12, loaded by the program as the real one):
    a card that computes another digest, one that runs at 0.6x and one that draws 0.7 of its cap
    are each failed, naming why; one that runs at 0.85x is flagged; the rest pass."""
    tmp, env = sim
    env = {**env, "LD_LIBRARY_PATH": f"{tmp / 'lib'}:{blas}", "RIGUP_LAB_CUBLAS_FAULTS": str(tmp / "faults")}
    (tmp / "faults").write_text("1 wrong\n2 slow 1.667\n3 draw 0.7\n")
    subprocess.run(["nvidia-smi", "sim", "reset"], env=env, check=True)
    run = burnin(sim, "run", "--level", "quick", "--soak-s", "2", "--metrics", str(tmp / "m.prom"), "--testing",
                 str(tmp / "testing.json"), "--json", str(tmp / "blas.json"), "--samples", str(tmp / "samples.json"),
                 env=env)
    print(run.stdout, run.stderr)
    found = {r["index"]: r for r in json.loads((tmp / "blas.json").read_text()).values()}
    assert found[0]["passed"] and found[0]["failed"] == [] and found[0]["flagged"] == []
    gemm = found[0]["gemm"]
    assert (gemm["load"], gemm["dtype"], gemm["cublas"], gemm["tflops"]) == ("cublas", "fp16", "12.4.5", 100.0)
    assert found[0]["power"]["judged"] and found[0]["power"]["ratio"] == 1.0 and found[0]["power"]["cap_w"] == 400.0
    assert found[0]["key"] == {"driver": "580.105.08", "memory_mib": 81920, "power_limit_w": 400.0}
    assert [w.split(":")[0] for w in found[1]["failed"]] == ["GEMM"] and "differs from" in found[1]["failed"][0] \
        and gemm["digest"][:16] in found[1]["failed"][0]
    assert found[2]["failed"] == ["GEMM: 60.0 TFLOPS, 0.60 of its siblings' median (at least 0.80 wanted): a slow card"]
    assert found[3]["failed"][0].startswith("soak: mean draw 280 W, 0.70 of the 400 W cap in force")
    assert set(json.loads((tmp / "samples.json").read_text())) == set(json.loads((tmp / "blas.json").read_text()))
    # a card this cuBLAS refuses takes the PTX load, and is not failed for it; one at 0.85x is flagged
    (tmp / "faults").write_text("2 slow 1.18\n0 refuse\n")
    run = burnin(sim, "run", "--level", "quick", "--soak-s", "1", "--metrics", str(tmp / "m.prom"), "--testing",
                 str(tmp / "testing.json"), "--json", str(tmp / "blas.json"), env=env)
    found = {r["index"]: r for r in json.loads((tmp / "blas.json").read_text()).values()}
    assert run.returncode == 0 and found[2]["passed"] and \
        found[2]["flagged"] == ["GEMM: 84.7 TFLOPS, 0.85 of its siblings' median (below 0.90: watch it)"]
    assert found[0]["passed"] and found[0]["gemm"]["load"] == "ptx" and \
        found[0]["gemm"]["why"] == f"cuBLAS {blas}/libcublas.so.12: CUDA error 8 CUBLAS_STATUS in cublasGemmEx"


def test_the_pulse_fails_the_hosts_power_delivery_naming_the_card_off_the_bus_the_brake_and_the_watts(sim, blas):
    """Issue 62's pulse, through the program's own ctypes code on the stand-ins: every card's GEMM
    switched on and off at once; held, it records the cards' summed peak; a card that falls off the
    bus in it, and one in a hardware power brake, fail the host's power delivery with the figures
    (gpu_psu_watts named), and the card off the bus is failed in the records (quarantined)."""
    tmp, env = sim
    env = {**env, "LD_LIBRARY_PATH": f"{tmp / 'lib'}:{blas}", "RIGUP_LAB_CUBLAS_FAULTS": str(tmp / "faults")}
    (tmp / "faults").write_text("")
    subprocess.run(["nvidia-smi", "sim", "reset"], env=env, check=True)
    (tmp / "records.json").unlink(missing_ok=True)
    args = ["pulse", "--seconds", "2", "--hz", "4", "--psu-watts", "1500", "--pulse-results", str(tmp / "pulse.json"),
            "--testing", str(tmp / "testing.json"), "--metrics", str(tmp / "m.prom")]
    held = burnin(sim, *args, env=env)
    print(held.stdout, held.stderr)
    rec = json.loads((tmp / "pulse.json").read_text())
    print("held:", rec["figures"]["peak_w"], "W peak of", rec["figures"]["caps_w"], "W of caps;",
          {c["index"]: (c["load"], c["pulses"]) for c in rec["figures"]["cards"].values()})
    assert held.returncode == 0 and rec["passed"] and rec["failed"] == [] and len(rec["key"]["cards"]) == 4
    assert rec["key"]["caps_w"] == 1600 and rec["key"]["psu_watts"] == 1500 and rec["figures"]["peak_w"] > 240
    assert {(c["load"], c["pulses"]) for c in rec["figures"]["cards"].values()} == {("cublas", 8)}
    assert not (tmp / "testing.json").exists()
    subprocess.run(["nvidia-smi", "sim", "set", "-i", "2", "--lost-under-load", "1"], env=env, check=True)
    subprocess.run(["nvidia-smi", "sim", "set", "-i", "1", "--throttle", "0x80"], env=env, check=True)
    failed = burnin(sim, *args, env=env)
    print(failed.stdout, failed.stderr)
    rec = json.loads((tmp / "pulse.json").read_text())
    assert failed.returncode == 3 and not rec["passed"] and rec["faults"]
    (why,) = rec["failed"]
    assert why.startswith("pulse: the host's power delivery did not hold 4 card(s) switched on and off 4 times a "
                          "second for 2 s: ")
    assert "GPU 1 (00000000:0F:00.0) in a hardware power brake in " in why and "GPU 2 (" in why and \
        "fell off the bus" in why and "(their caps sum to 1600 W; gpu_psu_watts 1500 W)" in why
    records = json.loads((tmp / "records.json").read_text())
    lost = {u: r for u, r in records.items() if r["passed"] is False}
    assert [r["index"] for r in lost.values()] == [2] and \
        lost[next(iter(lost))]["failed"][0].startswith("fell off the bus in the pulse test of the host's power delivery")
    subprocess.run(["nvidia-smi", "sim", "reset"], env=env, check=True)


def test_a_cmp_170hx_soaks_on_cublas_with_its_watts_recorded_not_judged(sim, blas):
    """Issue 62: a card whose product cuts FP16 tensor throughput (CMP 170HX, PCI id 0x20C2) is not
    quarantined by the watts rule its GEMM cannot meet: drawing 0.5 of its cap it passes, the
    draw recorded and the reason named; its digests are judged as any card's."""
    tmp, env = sim
    profile = json.loads((LAB / "gpu_profiles.json").read_text())["cmp170hx"]
    profile["bus_ids"] = profile["bus_ids"][:2]
    (tmp / "cmp.json").write_text(json.dumps(profile))
    env = {**env, "LD_LIBRARY_PATH": f"{tmp / 'lib'}:{blas}", "RIGUP_LAB_CUBLAS_FAULTS": str(tmp / "cmp-faults"),
           "RIGUP_GPU_SIM_PROFILE": str(tmp / "cmp.json"), "RIGUP_GPU_SIM_RUN": str(tmp / "cmp-run"),
           "RIGUP_GPU_SIM_LIB": str(tmp / "cmp-var")}
    (tmp / "cmp-faults").write_text("0 draw 0.5\n1 draw 0.5\n")
    subprocess.run(["nvidia-smi", "sim", "reset"], env=env, check=True)
    run = burnin(sim, "run", "--level", "quick", "--soak-s", "2", "--metrics", str(tmp / "m.prom"), "--testing",
                 str(tmp / "testing.json"), "--json", str(tmp / "cmp-run.json"), env=env)
    print(run.stdout, run.stderr)
    found = json.loads((tmp / "cmp-run.json").read_text())
    for rec in found.values():
        print(rec["name"], rec["gemm"]["load"], rec["power"])
        assert rec["passed"] and rec["gemm"]["load"] == "cublas" and rec["power"]["ratio"] == 0.5
        assert rec["power"]["judged"] is False and rec["power"]["why"].startswith("CMP 170HX: no FP16 tensor throughput")
