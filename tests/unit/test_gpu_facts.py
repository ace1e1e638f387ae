"""rigup/gpu/facts.py: the parsers on captured text, and the commands run by a real shell."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigup.gpu import facts
from rigup.gpu.facts import (
    CpuInfo, CudaToolkits, FreeDisk, HardwareFacts, KernelInfo, ListeningPorts, NvidiaDriver, NvidiaGpus,
    SecureBoot, Systemd, parse_cuda_toolkits, parse_driver, parse_free_disk, parse_gpus,
    parse_hardware, parse_kernel, parse_listening_ports, parse_secure_boot, parse_systemd,
    present_gpus,
)

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
SIM = ROOT / "tests" / "lab" / "nvidia_smi.py"


def lines(name):
    return (FIX / name).read_text().splitlines()


# ----------------------------------------------------------------------------- NvidiaGpus
def test_h200_real_capture():
    [gpu] = parse_gpus(lines("h200/h200-query-nounits.csv"))
    assert gpu == {
        "index": 0, "uuid": "GPU-ef2950fa-d678-a194-df34-0c357ff41744", "bus_id": "00000000:00:06.0",
        "pci_device_id": "10de:2335", "name": "NVIDIA H200", "compute_capability": (9, 0),
        "memory_total_mib": 143771, "memory_used_mib": 0, "power_limit_w": 700.0,
        "power_min_w": 200.0, "power_max_w": 700.0, "power_default_w": 700.0, "power_draw_w": 90.62,
        "temperature_c": 34, "persistence": True, "pcie_gen": 5, "pcie_width": 16,
        "driver_version": "580.159.04", "pcie_gen_max": 5, "pcie_width_max": 16, "lost": False,
    }
    json.dumps(parse_gpus(lines("h200/h200-query-nounits.csv")))  # plain data


def test_query_fields_match_the_h200_capture_header():
    header = lines("h200/h200-query.csv")[0]
    names = [h.split(" [")[0].strip() for h in header.split(",")]
    assert names == facts.GPU_QUERY.split(",")


def test_header_and_units_lines_are_not_cards():
    # --format=csv (with a header and units) is not what the fact asks for: nothing parses as a card
    assert [g["index"] for g in parse_gpus(lines("h200/h200-query.csv")[:1])] == []


def test_a100_eight_cards():
    gpus = parse_gpus(lines("facts/a100-query-nounits.csv"))
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["pci_device_id"] for g in gpus} == {"10de:20b2"}
    assert {g["compute_capability"] for g in gpus} == {(8, 0)}
    assert gpus[0]["persistence"] is False and gpus[1]["power_draw_w"] == 63.7


def test_cmp_locked_and_unlocked():
    locked = parse_gpus(lines("facts/cmp170hx-locked-query-nounits.csv"))
    unlocked = parse_gpus(lines("facts/cmp170hx-unlocked-query-nounits.csv"))
    assert len(locked) == len(unlocked) == 6
    assert locked[0]["name"] == "NVIDIA Graphics Device" and locked[0]["memory_total_mib"] == 8192
    assert unlocked[0]["name"] == "NVIDIA CMP 170HX" and unlocked[0]["memory_total_mib"] == 65536
    assert locked[0]["pcie_gen"] == 1 and locked[0]["pcie_width"] == 4


def test_na_fields_are_none():
    [gpu] = parse_gpus(lines("facts/na-fields-query-nounits.csv"))
    for key in ("memory_used_mib", "power_limit_w", "power_min_w", "power_max_w", "power_default_w",
                "power_draw_w", "temperature_c", "pcie_gen", "pcie_width"):
        assert gpu[key] is None, key
    assert gpu["memory_total_mib"] == 8192 and gpu["compute_capability"] == (8, 0)


def test_empty_output_and_no_driver_text():
    assert parse_gpus([]) == []
    assert parse_gpus(["", "   "]) == []
    assert parse_gpus(lines("facts/no-driver-query-nounits.txt")) == []
    assert parse_gpus(['Field "bogus" is not a valid field to query.']) == []


def test_lost_card():
    gpus = parse_gpus(lines("facts/a100-lost-query-nounits.txt"))
    assert len(gpus) == 8
    assert gpus[2] == {"lost": True, "bus_id": "00000000:47:00.0"}
    assert [g["index"] for g in present_gpus(gpus)] == [0, 1, 3, 4, 5, 6, 7]


def test_cc_is_two_ints():
    assert facts.parse_cc("12.0") > facts.parse_cc("9.0")
    assert facts.parse_cc("10.0") == (10, 0)
    assert facts.parse_cc("[N/A]") is None
    assert facts.parse_pci_id("0x2B8510DE") == "10de:2b85"


def test_gpu_fact_is_safe_without_nvidia_smi():
    fact = NvidiaGpus()
    assert fact.requires_command() == "nvidia-smi"
    assert NvidiaGpus.default() == []
    assert fact.command().endswith("; true")
    assert fact.process([]) == []


# ----------------------------------------------------------------------------- driver and others
def test_driver_open_proprietary_sim_and_not_loaded():
    assert parse_driver(lines("facts/driver-open.txt")) == {
        "version": "580.159.04", "kernel_module": "open", "loaded": True}
    assert parse_driver(lines("facts/driver-proprietary.txt")) == {
        "version": "550.54.14", "kernel_module": "proprietary", "loaded": True}
    assert parse_driver(lines("facts/driver-lab-sim.txt")) == {
        "version": "580.105.08", "kernel_module": None, "loaded": True}
    assert parse_driver(lines("facts/driver-not-loaded.txt")) == NvidiaDriver.default()
    assert parse_driver([]) == {"version": None, "kernel_module": None, "loaded": False}


def test_driver_from_the_real_h200_proc_text():
    host = lines("h200/h200-host.txt")
    proc = [ln for ln in host if ln.startswith("NVRM version")]
    assert parse_driver(["--- proc", *proc, "--- smi"])["kernel_module"] == "open"


def test_cuda_toolkits_dedupe_by_realpath():
    tks = parse_cuda_toolkits(lines("facts/cuda-toolkits.txt"))
    assert [(t["version"], t["path"]) for t in tks] == [
        ("11.8", "/usr/bin/nvcc"), ("12.4", "/usr/local/cuda-12.4/bin/nvcc"),
        ("12.8", "/usr/local/cuda-12.8/bin/nvcc")]
    assert tks[2]["seen_as"] == ["/usr/local/cuda/bin/nvcc", "/usr/local/cuda-12.8/bin/nvcc"]
    assert tks[2]["full_version"] == "12.8.93"
    assert parse_cuda_toolkits([]) == []


def test_cuda_toolkit_from_the_real_h200_nvcc():
    host = lines("h200/h200-host.txt")
    start = host.index("+ nvcc --version")
    out = ["--- /usr/local/cuda/bin/nvcc /usr/local/cuda-13.0/bin/nvcc", *host[start + 1:start + 6]]
    assert [t["version"] for t in parse_cuda_toolkits(out)] == ["13.0"]


def test_listening_ports():
    assert parse_listening_ports(lines("facts/ss-ltnp.txt")) == {
        22: "sshd", 53: "systemd-resolve", 8080: "llama-server", 631: None}
    assert parse_listening_ports([]) == {}
    proc = ["proc", "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
            "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1",
            "   1: 0100007F:0016 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 2 1",
            "   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0 0 0 0 0 3 1"]
    assert parse_listening_ports(proc) == {8080: None, 80: None}     # 0A listens; 01 is a connection
    assert parse_listening_ports(["none"]) is None                   # nothing to read: nothing can be told
    assert ListeningPorts().command().startswith("if command -v ss") and ListeningPorts.default() == {}


def test_secure_boot():
    assert parse_secure_boot(["--- mokutil", "SecureBoot enabled"]) is True
    assert parse_secure_boot(["--- mokutil", "SecureBoot disabled", "Platform is in Setup Mode"]) is False
    assert parse_secure_boot(["--- mokutil", "EFI variables are not supported on this system"]) is None
    assert parse_secure_boot(["--- efivar", "   6   0   0   0   1"]) is True
    assert parse_secure_boot(["--- efivar", "   6   0   0   0   0"]) is False
    assert parse_secure_boot([]) is None


def test_kernel_systemd_disk():
    assert parse_kernel(["6.18.44-fc-v657-gpu", "headers=no"]) == {"release": "6.18.44-fc-v657-gpu", "headers": False}
    assert parse_kernel(["6.1.0-26-amd64", "headers=yes"])["headers"] is True
    assert parse_kernel([]) == KernelInfo.default()
    assert parse_systemd(["yes"]) is True and parse_systemd(["no"]) is False and Systemd.default() is False
    assert parse_free_disk(["68702195712"]) == 68702195712
    assert parse_free_disk(["    Avail", "1234"]) == 1234 and parse_free_disk([]) is None


def test_hardware_sections():
    hw = parse_hardware(lines("facts/hardware-lab.txt"))
    assert [g["pci_device_id"] for g in hw["gpus"]] == ["10de:2330"]
    assert hw["driver"]["version"] == "580.105.08"
    assert [t["version"] for t in hw["cuda_toolkits"]] == ["12.8"]
    assert hw["listening_ports"] == {22: "sshd"}
    assert hw["secure_boot"] is False and hw["systemd"] is True
    assert hw["kernel"] == {"release": "6.1.0-26-amd64", "headers": True}
    assert hw["free_disk"] == {"/": 68702195712, "/var/lib/rigup/models": 1234}
    assert HardwareFacts.default()["gpus"] == [] and HardwareFacts.default()["free_disk"] == {}


# ----------------------------------------------------------------------------- commands in a shell
def sh(command, tmp_path, profile=None, env=None):
    """Run a fact's command in sh, with the lab's simulated nvidia-smi on PATH when ``profile``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = "/usr/bin:/bin"
    if profile is not None:
        prof = json.loads((ROOT / "tests/lab/gpu_profiles.json").read_text())[profile]
        (tmp_path / "p.json").write_text(json.dumps(prof))
        smi = bindir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'smi-runs'}\nexec {sys.executable} {SIM} \"$@\"\n")
        smi.chmod(0o755)
        path = f"{bindir}:{path}"
    e = dict(os.environ, PATH=path, RIGUP_GPU_SIM_PROFILE=str(tmp_path / "p.json"),
             RIGUP_GPU_SIM_RUN=str(tmp_path / "run"), RIGUP_GPU_SIM_LIB=str(tmp_path / "lib"), **(env or {}))
    p = subprocess.run(["sh", "-c", command], env=e, capture_output=True, text=True, timeout=20)
    return p.returncode, p.stdout.splitlines()


def test_gpu_command_against_the_simulator(tmp_path):
    rc, out = sh(facts.GPU_COMMAND, tmp_path, "h100")
    assert rc == 0
    gpus = parse_gpus(out)
    assert len(gpus) == 4 and gpus[3]["bus_id"] == "00000000:5D:00.0"


def test_a_card_off_the_bus_is_read_once_and_every_other_card_once(tmp_path):
    """nvidia-smi fails (15) with a card off the bus after printing the others: not read again
    (each card twice in the plan, "+2 lost", until issue 50's lab test found it); a driver
    without the fabric fields (2) is."""
    sh("nvidia-smi sim set -i 2 --lost", tmp_path, "h100")
    rc, out = sh(facts.GPU_COMMAND, tmp_path, "h100")
    gpus = parse_gpus(out)
    assert rc == 0 and [g.get("index") for g in gpus] == [0, 1, None, 3] and gpus[2]["lost"]
    assert len((tmp_path / "smi-runs").read_text().splitlines()) == 2     # the sim call and the query


def test_gpu_command_without_driver_exits_zero(tmp_path):
    rc, out = sh(facts.GPU_COMMAND, tmp_path, "none")
    assert rc == 0 and parse_gpus(out) == []


def test_hardware_command_in_one_shell(tmp_path):
    cmd = HardwareFacts().command(paths=["/", str(tmp_path / "not" / "yet")])
    rc, out = sh(cmd, tmp_path, "a100")
    assert rc == 0
    hw = parse_hardware(out)
    assert len(hw["gpus"]) == 8 and hw["driver"]["version"] == "580.105.08"
    # the driver's version (no /proc/driver/nvidia in a container) is the gpus query's column:
    # nvidia-smi runs once for the whole read
    assert hw["driver"]["loaded"] and (tmp_path / "smi-runs").read_text().count("run") == 1
    assert isinstance(hw["free_disk"][str(tmp_path / "not" / "yet")], int)
    assert isinstance(hw["systemd"], bool) and hw["kernel"]["release"]
    assert hw["cpu"]["logical"] >= hw["cpu"]["cores"] >= hw["cpu"]["sockets"] >= 1     # real even in the lab
    assert hw["cpu"]["numa_nodes"] >= 1 and hw["cpu"]["model"]


def test_hardware_command_is_one_bash_command():
    p = subprocess.run(["bash", "-c", facts.hardware_command()], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0
    hw = parse_hardware(p.stdout.splitlines())
    assert hw["cpu"]["logical"] >= 1 and hw["cpu"]["cores"] >= 1 and hw["free_disk"]["/"] > 0
    assert p.stdout.count(facts.MARK + "cpu") == 1


def test_hardware_command_without_nvidia_smi(tmp_path):
    rc, out = sh(HardwareFacts().command(), tmp_path)
    assert rc == 0
    hw = parse_hardware(out)
    assert hw["gpus"] == [] and hw["driver"]["loaded"] is False


@pytest.mark.parametrize("fact", [NvidiaDriver, CudaToolkits, SecureBoot, KernelInfo, Systemd, CpuInfo])
def test_other_commands_exit_zero(fact, tmp_path):
    rc, _ = sh(fact().command(), tmp_path)
    assert rc == 0


def test_free_disk_command_walks_up_to_an_existing_parent(tmp_path):
    rc, out = sh(FreeDisk().command(path=str(tmp_path / "a b" / "c")), tmp_path)
    assert rc == 0 and FreeDisk().process(out) > 0


def test_a_driver_version_in_other_digits_is_no_version():
    """``\\d`` takes any Unicode digit: /proc's "٥٨٠.105.08" was read as a loaded driver (red team,
    issue 61); a version is ASCII digits, so it is none, and no regex of rigup/ or roles/ uses ``\\d``."""
    proc = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  \u0665\u0668\u0660.105.08  Release Build"
    got = parse_driver(["--- proc", proc, "--- smi", "\u0665\u0668\u0660.105.08"])
    print(f"\n{got}")
    assert got == {"version": None, "kernel_module": None, "loaded": False}
    root = Path(__file__).resolve().parents[2]
    found = [f"{p.relative_to(root)}:{n}" for d in ("rigup", "roles", "plays", "shipped") for p in sorted((root / d).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "\\d" in line and not line.lstrip().startswith("#")]
    assert found == [], f"\\d takes any Unicode digit: write [0-9] ({found})"


# ----------------------------------------------------------------------------- issue 61, round 2: figures in bounds
from hypothesis import given, settings, strategies as st   # noqa: E402

from rigup.gpu import catalogue, plan as gpu_plan   # noqa: E402
from rigup.gpu.driver import driver_step   # noqa: E402
from tests.unit.hosts import data   # noqa: E402

H100 = ("0, GPU-12345678-1234-1234-1234-123456789abc, 00000000:4E:00.0, 0x233010DE, NVIDIA H100, 9.0, 81559, 10, "
        "700, 200, 700, 700, 100, 40, Enabled, 5, 16, 580.105.08, 5, 16")


def with_cells(line: str, **cells: str) -> str:
    out = [c.strip() for c in line.split(",")]
    for key, value in cells.items():
        out[[k for _, k, _ in facts.GPU_FIELDS].index(key)] = value
    return ", ".join(out)


def test_a_negative_or_absurd_figure_is_no_reading():
    """round 2 A5/A6/K5: memory.total -81559, a draw of -350.5 W, 99999999999999999 C and PCIe Gen-3
    were read as they came (the plan's VRAM negative); each is None now, as an [N/A]; a link's current
    generation above its maximum is unknown, not a link."""
    [g] = parse_gpus([with_cells(H100, memory_total_mib="-81559", power_draw_w="-350.5", temperature_c="99999999999999999",
                                 pcie_gen="-3", power_limit_w="1e18")])
    assert (g["memory_total_mib"], g["power_draw_w"], g["temperature_c"], g["pcie_gen"], g["power_limit_w"]) == \
        (None, None, None, None, None)
    assert gpu_plan.hardware_plan([g], {"loaded": True})["vram_mib"]["total"] > 0   # the catalogue's H100, not -81559
    assert gpu_plan.link_state(7, 3, 32, 16, loaded=True) == {"link": "x? Gen?", "downtrained": False, "why": ""}


def test_one_card_listed_again_is_one_card():
    """round 2 A7/A8: the same card (uuid, bus id, index) listed three times was three cards of the plan
    (gpu_count 3); two cards both index 0 were two. A later row naming a card again is skipped."""
    assert gpu_plan.hardware_plan(parse_gpus([H100] * 3), {"loaded": True})["gpu_count"] == 1
    other = with_cells(H100, uuid="GPU-22345678-1234-1234-1234-123456789abc", bus_id="00000000:4F:00.0")
    assert [g["uuid"][:5] for g in parse_gpus([H100, other])] == ["GPU-1"]            # index 0 twice
    assert len(parse_gpus([H100, with_cells(other, index="1", bus_id="0000:4E:00.0")])) == 1   # the bus id again
    assert len(parse_gpus([H100, with_cells(other, index="1")])) == 2
    lost = "Unable to determine the device handle for GPU0000:47:00.0: Unknown Error"
    assert len(parse_gpus([lost, lost])) == 1


def test_a_compute_capability_past_the_newest_family_gives_no_architecture():
    """round 2 A9: compute_cap 99.99 of an unknown card became CMAKE_CUDA_ARCHITECTURES=9999 (and vLLM ok)."""
    p = gpu_plan.hardware_plan(parse_gpus([with_cells(H100, pci_device_id="0xFFFF10DE", compute_capability="99.99")]),
                               {"loaded": True})
    assert p["cuda_archs"] == [] and not p["engines"]["vllm"]["ok"]
    assert [catalogue.parse_cc(t) for t in ("12.0", "9.0", "12.9", "13.0", "0.5", "8.10", "8.", "(8, 0)", "٨.٠")] == \
        [(12, 0), (9, 0), (12, 9), None, None, None, None, None, None]
    assert catalogue.parse_cc([10, 0]) == (10, 0) and catalogue.parse_cc([True, 0]) is None


def test_a_cpu_implementer_is_hex_digits_alone():
    """round 2 A11: int(text, 16) took '0x4_1' (ARM); only 0x and 1-4 ASCII hex digits are hex."""
    vendor = [facts.parse_cpu(["--- cpuinfo", f"CPU implementer\t: {t}", "--- logical", "4"])["vendor"]
              for t in ("0x41", "0x4_1", "0x\u0664\u0661", "41", "0x 41", "0x00041")]
    assert vendor == ["ARM", None, None, None, None, None]


def test_the_branch_loaded_without_cards_says_so():
    """round 2 K7: with the pinned branch loaded and no card answering nvidia-smi, the step said
    'driver 580.105.08 is loaded, not branch 580'."""
    found = {"driver": {"version": "580.105.08", "loaded": True}, "gpus": [],
             "pci": [{"pci_device_id": "10de:2330", "bus_id": "4e:00.0"}]}
    assert driver_step(found, data(nvidia_driver_branch=580))["why"] == \
        "driver 580.105.08 (branch 580) is loaded but nvidia-smi reports none of the cards on the PCI bus"
    assert driver_step(found, data(nvidia_driver_branch=535))["why"] == "driver 580.105.08 is loaded, not branch 535"


FIGURE = st.one_of(st.text(max_size=12), st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{1,3})?", fullmatch=True),
                   st.sampled_from(["[N/A]", "1e3", "inf", "nan", "0x10", "1_0", "\u0661", "9" * 30]))


@settings(max_examples=200, deadline=1000)
@given(values=st.fixed_dictionaries({key: FIGURE for key in facts.BOUNDS if key != "index"}))
def test_every_figure_is_none_or_within_its_bounds(values):
    """Property: whatever a host prints for a card's figures, each is None or a number within its
    field's BOUNDS; the line is a card still (its identity read), never a traceback."""
    line = with_cells(H100, **{k: v.replace(",", " ") for k, v in values.items()})
    [g] = parse_gpus([line])
    for key, (lo, hi) in facts.BOUNDS.items():
        assert g[key] is None or (type(g[key]) in (int, float) and lo <= g[key] <= hi), (key, g[key])
    gpu_plan.hardware_plan([g], {"loaded": True})
