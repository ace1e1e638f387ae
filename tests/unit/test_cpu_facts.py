"""rigup/gpu/facts.py parse_cpu on captured CPU_COMMAND text, the CPU in the batched hardware read,
and the plan's cpu line (rigup/gpu/plan.py)."""
import subprocess
from pathlib import Path

import pytest

from rigup.gpu import facts
from rigup.gpu.facts import CpuInfo, HardwareFacts, parse_cpu, parse_hardware
from rigup.gpu.plan import cpu_text, format_plan, hardware_plan

FIX = Path(__file__).resolve().parents[1] / "fixtures"
DRIVER = {"version": "580.105.08", "kernel_module": "open", "loaded": True}
EMPTY = {"vendor": None, "model": None, "logical": None, "cores": None, "sockets": None,
         "numa_nodes": None, "flags": [], "amx": False, "mem_bytes": None}


def cpu(name):
    return parse_cpu((FIX / "cpu" / name).read_text().splitlines())


def test_sapphire_rapids_with_amx():
    spr = cpu("sapphire-rapids-8480.txt")
    assert spr == {
        "vendor": "Intel", "model": "Intel(R) Xeon(R) Platinum 8480+", "logical": 224, "cores": 112,
        "sockets": 2, "numa_nodes": 2, "amx": True, "mem_bytes": None,
        "flags": ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16", "avx512_fp16",
                  "avx512_vnni", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vbmi", "avx512vl",
                  "avx_vnni", "f16c", "fma"]}
    assert cpu_text(spr) == ("Intel(R) Xeon(R) Platinum 8480+, 2 sockets, 112 cores / 224 threads, 2 NUMA nodes, "
                             "AVX-512 (VNNI, BF16, FP16), AMX (INT8, BF16)")


def test_epyc_avx2_only():
    epyc = cpu("epyc-7763.txt")
    assert (epyc["vendor"], epyc["model"]) == ("AMD", "AMD EPYC 7763 64-Core Processor")
    assert (epyc["logical"], epyc["cores"], epyc["sockets"], epyc["numa_nodes"]) == (256, 128, 2, 2)
    assert epyc["flags"] == ["avx", "avx2", "f16c", "fma"] and epyc["amx"] is False
    assert cpu_text(epyc) == "AMD EPYC 7763 64-Core Processor, 2 sockets, 128 cores / 256 threads, 2 NUMA nodes, AVX2"


def test_captured_epyc_vm():
    vm = cpu("epyc-vm.txt")
    assert vm == {"vendor": "AMD", "model": "AMD EPYC", "logical": 2, "cores": 2, "sockets": 1,
                  "numa_nodes": 1, "flags": ["avx", "avx2", "f16c", "fma"], "amx": False,
                  "mem_bytes": 24537864 * 1024}   # MemTotal, captured with the rest
    assert cpu_text(vm) == "AMD EPYC, 2 cores / 2 threads, 1 NUMA node, AVX2"


def test_aarch64_neoverse_features_line():
    arm = cpu("graviton3-neoverse-v1.txt")
    assert arm == {"vendor": "ARM", "model": "Neoverse-V1", "logical": 64, "cores": 64, "sockets": 1,
                   "numa_nodes": 1, "amx": False, "mem_bytes": None,
                   "flags": ["asimd", "asimdhp", "bf16", "dotprod", "i8mm", "sve"]}     # asimddp -> dotprod
    assert cpu_text(arm) == "ARM Neoverse-V1, 64 cores / 64 threads, 1 NUMA node, NEON (FP16, DOTPROD, I8MM, BF16), SVE"
    # an implementer or part not in the table: vendor / model None, the rest still read
    odd = parse_cpu(["--- cpuinfo", "Features\t: fp asimd sve2", "CPU implementer\t: 0x99", "CPU part\t: 0x001",
                     "--- logical", "4"])
    assert (odd["vendor"], odd["model"], odd["logical"], odd["flags"]) == (None, None, 4, ["asimd", "sve2"])
    assert cpu_text(odd) == "unknown model, 4 threads, NEON, SVE2"


@pytest.mark.parametrize("text", [
    [], [""], ["garbage", "more garbage: yes"], (FIX / "cpu" / "garbled.txt").read_text().splitlines(),
    ["--- cpuinfo", "flags : ", "--- logical", "-3", "--- topology", "x y", "--- numa", "1.5"],
    ["--- numa", "--- logical", "--- cpuinfo", "vendor_id"],
])
def test_empty_or_garbled_input_gives_empty_values(text):
    assert parse_cpu(text) == EMPTY
    assert cpu_text(parse_cpu(text)) is None


def test_no_numa_nodes_in_sys_is_one_node():
    assert parse_cpu(["--- numa", "0"])["numa_nodes"] == 1
    assert parse_cpu(["--- numa", "8"])["numa_nodes"] == 8


def test_amx_needs_tiles_and_a_data_type():
    assert parse_cpu(["--- cpuinfo", "flags : amx_tile"])["amx"] is False
    assert parse_cpu(["--- cpuinfo", "flags : amx_int8 amx_bf16"])["amx"] is False
    assert parse_cpu(["--- cpuinfo", "flags : amx_tile amx_bf16"])["amx"] is True


def test_cpu_in_the_batched_read_and_defaults():
    hw = parse_hardware((FIX / "facts" / "hardware-lab.txt").read_text().splitlines()
                        + ["##rigup:cpu", *(FIX / "cpu" / "epyc-7763.txt").read_text().splitlines()])
    assert hw["cpu"] == cpu("epyc-7763.txt")
    assert hw["free_disk"]["/var/lib/rigup/models"] == 1234           # the sections around it still parse
    assert HardwareFacts.default()["cpu"] == EMPTY == CpuInfo.default()
    assert parse_hardware((FIX / "facts" / "hardware-lab.txt").read_text().splitlines())["cpu"] == EMPTY


def test_plan_carries_the_cpu_and_prints_it_next_to_the_cards():
    spr = cpu("sapphire-rapids-8480.txt")
    a100 = facts.parse_gpus((FIX / "facts" / "a100-query-nounits.csv").read_text().splitlines())
    plan = hardware_plan(a100, DRIVER, [], spr)
    assert plan["cpu"] == spr and plan["cpu"] is not spr
    lines = format_plan(plan).splitlines()
    assert lines[0].startswith("cards:     8 x a100")
    assert lines[1] == ("cpu:       Intel(R) Xeon(R) Platinum 8480+, 2 sockets, 112 cores / 224 threads, "
                        "2 NUMA nodes, AVX-512 (VNNI, BF16, FP16), AMX (INT8, BF16)")
    cpu_only = format_plan(hardware_plan([], {}, [], cpu("epyc-vm.txt"))).splitlines()
    assert cpu_only[0].startswith("cards:     none (CPU only")
    assert cpu_only[1] == "cpu:       AMD EPYC, 2 cores / 2 threads, 1 NUMA node, AVX2"


def test_plan_without_cpu_facts_prints_no_cpu_line():
    assert hardware_plan([], {}, [])["cpu"] == {}
    assert "cpu:" not in format_plan(hardware_plan([], {}, []))
    assert "cpu:" not in format_plan(hardware_plan([], {}, [], parse_cpu([])))


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_cpu_command_on_this_machine(shell):
    p = subprocess.run([shell, "-c", CpuInfo().command()], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0 and p.stderr == ""
    here = parse_cpu(p.stdout.splitlines())
    assert here["logical"] >= here["cores"] >= here["sockets"] >= 1 and here["numa_nodes"] >= 1
    assert here["mem_bytes"] > 2**30                                   # MemTotal, in bytes
    assert len(p.stdout) < 4096                                        # one processor's lines, not all of cpuinfo
    assert p.stdout.count("\n--- ") == 4 and p.stdout.startswith("--- cpuinfo\n")


def test_cpu_command_without_sys_falls_back_to_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(f"processor\t: {i}\nvendor_id\t: GenuineIntel\nphysical id\t: {i // 4}\n"
                               f"core id\t\t: {i % 4 // 2}\nflags\t\t: fpu avx avx2\n\n" for i in range(8)))
    cmd = (facts.CPU_COMMAND.replace(facts.CPUINFO, str(cpuinfo))
           .replace(facts.CPU_SYS, str(tmp_path / "no-cpu")).replace(facts.NODE_SYS, str(tmp_path / "no-node")))
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0
    got = parse_cpu(p.stdout.splitlines())
    assert (got["logical"], got["cores"], got["sockets"], got["numa_nodes"]) == (8, 4, 2, 1)
    assert got["vendor"] == "Intel" and got["model"] is None and got["flags"] == ["avx", "avx2"]
