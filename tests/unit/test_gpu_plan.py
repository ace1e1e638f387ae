"""rigup/gpu/catalogue.py lookups and rigup/gpu/plan.py's hardware plan, on fixtures."""
import json
from pathlib import Path

from rigup.gpu import catalogue
from rigup.gpu.catalogue import card_for, is_locked
from rigup.gpu.facts import parse_gpus
from rigup.gpu.plan import format_plan, hardware_plan

FIX = Path(__file__).resolve().parents[1] / "fixtures"
DRIVER = {"version": "580.105.08", "kernel_module": "open", "loaded": True}
TOOLKITS = [{"version": "12.4", "path": "/usr/local/cuda-12.4/bin/nvcc"},
            {"version": "12.8", "path": "/usr/local/cuda-12.8/bin/nvcc"}]


def gpus(name):
    return parse_gpus((FIX / name).read_text().splitlines())


# ----------------------------------------------------------------------------- catalogue
def test_catalogue_loads_and_every_entry_is_complete():
    cards = catalogue.cards()
    ids = [p for c in cards.values() for p in c["pci_ids"]]
    assert len(ids) == len(set(ids))
    for key, c in cards.items():
        assert c["cmake_arch"] == f"{c['compute_capability'][0]}{c['compute_capability'][1]}", key
        assert c["quirks"]["fp8"] == (c["compute_capability"] >= (8, 9)), key
        assert c["power_w"]["min"] <= c["power_w"]["default"] <= c["power_w"]["max"], key
    assert {"10de:20b0", "10de:20b2", "10de:20b5", "10de:2330", "10de:2331", "10de:2335", "10de:27b8",
            "10de:2236", "10de:2204", "10de:2684", "10de:2b85", "10de:2901", "10de:20c2", "10de:2082"} <= set(ids)


def test_locked_cmp_found_by_pci_id_not_name():
    locked = gpus("facts/cmp170hx-locked-query-nounits.csv")[0]
    assert locked["name"] == "NVIDIA Graphics Device"
    card = card_for(locked)
    assert card["key"] == "cmp170hx-8gb" and card["matched_by"] == "pci_id"
    assert card["quirks"] == {"fp8": False, "fma_throttled": True, "needs_unlock": True}
    assert (card["vram_locked_mib"], card["vram_mib"]) == (8192, 65536)
    assert card["pcie"] == {"gen": 1, "width": 4}
    assert is_locked(locked, card)
    assert not is_locked(gpus("facts/cmp170hx-unlocked-query-nounits.csv")[0], card)
    ten = card_for({"pci_device_id": "10de:2082"})
    assert (ten["vram_locked_mib"], ten["vram_mib"]) == (10240, 40960)


def test_name_alone_finds_nothing():
    assert card_for({"name": "NVIDIA A100-SXM4-80GB"}) is None
    assert card_for({"lost": True, "bus_id": "00000000:47:00.0"}) is None


def test_unknown_card_falls_back_by_compute_capability():
    card = card_for({"pci_device_id": "10de:ffff", "name": "NVIDIA Mystery", "compute_capability": (8, 6)})
    assert card["matched_by"] == "compute_capability"
    assert (card["class"], card["cmake_arch"], card["min_cuda"]) == ("sm86", "86", "11.1")
    odd = card_for({"compute_capability": (11, 0)})   # not even a listed family
    assert odd["cmake_arch"] == "110" and odd["min_cuda"] is None


def test_cc_parsing_is_numeric():
    assert catalogue.parse_cc("12.0") > catalogue.parse_cc("9.0")
    assert catalogue.parse_cc([10, 0]) == (10, 0) and catalogue.parse_cc("9") is None
    assert card_for({"pci_device_id": "10de:2b85"})["compute_capability"] == (12, 0)
    assert card_for({"pci_device_id": "10de:2335"})["class"] == "h200"


# ----------------------------------------------------------------------------- plan
def test_a100_plan():
    plan = hardware_plan(gpus("facts/a100-query-nounits.csv"), DRIVER, TOOLKITS)
    json.dumps(plan)
    assert plan["cuda_archs"] == ["80"] and plan["min_cuda"] == "11.0"
    assert plan["vram_mib"] == {"total": 8 * 81920, "per_card": [81920] * 8}
    assert plan["card_classes"] == ["a100"] and plan["gpu_count"] == 8 and not plan["cpu_only"]
    assert plan["cuda_toolkit"] == {"needed": "11.0", "found": "12.8", "path": "/usr/local/cuda-12.8/bin/nvcc"}
    assert plan["engines"]["llama.cpp"] == {"ok": True, "backend": "cuda"}
    assert plan["engines"]["vllm"]["ok"] is False and "9.0" in plan["engines"]["vllm"]["why"]
    assert plan["quirks"] == {"fp8": False, "fma_throttled": False} and not plan["needs_unlock"]


def test_h100_and_h200_plans():
    plan = hardware_plan(gpus("facts/h100-query-nounits.csv"), DRIVER, TOOLKITS)
    assert plan["cuda_archs"] == ["90"] and plan["min_cuda"] == "11.8"
    assert plan["engines"]["vllm"] == {"ok": True} and plan["quirks"]["fp8"] is True
    h200 = hardware_plan(gpus("h200/h200-query-nounits.csv"), DRIVER, [])
    assert h200["card_classes"] == ["h200"] and h200["vram_mib"]["total"] == 143771
    assert h200["cuda_toolkit"]["found"] is None


def test_mixed_a100_h100_host():
    mixed = gpus("facts/a100-query-nounits.csv")[:2] + gpus("facts/h100-query-nounits.csv")[:2]
    plan = hardware_plan(mixed, DRIVER, TOOLKITS)
    assert plan["cuda_archs"] == ["80", "90"]
    assert plan["min_cuda"] == "11.8" and plan["card_classes"] == ["a100", "h100"]
    assert plan["vram_mib"]["per_card"] == [81920, 81920, 81559, 81559]
    assert plan["engines"]["vllm"]["ok"] is False and "a100" in plan["engines"]["vllm"]["why"]


def test_archs_sort_numerically():
    plan = hardware_plan([{"pci_device_id": "10de:2b85"}, {"pci_device_id": "10de:2204"},
                          {"pci_device_id": "10de:2901"}], DRIVER, TOOLKITS)
    assert plan["cuda_archs"] == ["86", "100", "120"] and plan["min_cuda"] == "12.8"


def test_cmp170hx_locked_and_unlocked():
    locked = hardware_plan(gpus("facts/cmp170hx-locked-query-nounits.csv"), DRIVER, TOOLKITS)
    assert locked["cuda_archs"] == ["80"] and locked["card_classes"] == ["cmp170hx"]
    assert locked["needs_unlock"] is True
    assert locked["vram_mib"]["total"] == 6 * 8192 and locked["vram_unlocked_mib"]["total"] == 6 * 65536
    assert locked["quirks"]["fma_throttled"] is True
    assert locked["engines"]["vllm"]["patched_build"] is True
    unlocked = hardware_plan(gpus("facts/cmp170hx-unlocked-query-nounits.csv"), DRIVER, TOOLKITS)
    assert unlocked["needs_unlock"] is False and unlocked["vram_mib"]["total"] == 6 * 65536
    assert "after unlock" in format_plan(locked) and "after unlock" not in format_plan(unlocked)


def test_no_gpus_is_a_cpu_only_plan():
    plan = hardware_plan([], {"version": None, "kernel_module": None, "loaded": False}, [])
    assert plan["cpu_only"] and plan["cuda_archs"] == [] and plan["min_cuda"] is None
    assert "driver" in plan["why_cpu_only"]
    assert plan["engines"]["llama.cpp"] == {"ok": True, "backend": "cpu"}
    assert plan["engines"]["vllm"]["ok"] is False
    assert "loaded but reports no GPU" in hardware_plan([], DRIVER, [])["why_cpu_only"]


def test_lost_card_is_reported():
    plan = hardware_plan(gpus("facts/a100-lost-query-nounits.txt"), DRIVER, TOOLKITS)
    assert plan["gpu_count"] == 7 and plan["lost_cards"] == ["00000000:47:00.0"]
    assert any("47:00.0" in w for w in plan["warnings"])


def test_toolkit_too_old_is_not_picked():
    plan = hardware_plan([{"pci_device_id": "10de:2b85"}], DRIVER, TOOLKITS)
    assert plan["cuda_toolkit"] == {"needed": "12.8", "found": "12.8", "path": "/usr/local/cuda-12.8/bin/nvcc"}
    old = hardware_plan([{"pci_device_id": "10de:2b85"}], DRIVER, TOOLKITS[:1])
    assert old["cuda_toolkit"]["found"] is None


def test_format_plan_lines():
    text = format_plan(hardware_plan(gpus("facts/a100-query-nounits.csv"), DRIVER, TOOLKITS))
    assert "8 x a100" in text and "archs:     80" in text and "8 x 81920 MiB" in text
    assert "llama.cpp yes" in text and "vllm no" in text
    assert "CPU only" in format_plan(hardware_plan([], {}, []))
