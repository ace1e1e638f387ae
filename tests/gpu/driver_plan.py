"""roles/nvidia_driver's plan from the PCI bus against what the driver reports, on a real NVIDIA
machine with only python3 and nvidia-smi (no pyinfra, no network).

A host without a driver is planned from the NVIDIA devices sysfs lists on its PCI bus and their
catalogue entries (rigup.gpu.driver.predicted_gpus); once the driver is loaded the plan comes
from nvidia-smi. This reads both on a machine whose driver answers and prints them side by side:
the cards (bus id, class), the CUDA architectures, the VRAM per card, the newest CUDA of the
loaded branch and the kernel modules the role would install. Exit 1 when the two plans differ in
anything a role plans on; exit 2 when sysfs shows no NVIDIA device (a sandbox that hides the PCI
bus, as gVisor may: the plan from the PCI bus is then impossible there, and the role's check
refuses such a host).

It only reads: PCI_COMMAND (sysfs), GPU_COMMAND (nvidia-smi --query-gpu), rigup's own, and
``nvidia-smi -q`` and ``nvidia-smi nvlink -s``; the fabric manager's package and service
(MANAGER_COMMAND) only where an NVSwitch is on the bus.

    python3 tests/gpu/driver_plan.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.standalone import ROOT  # noqa: E402  (pyinfra stood in where it is missing)

from rigup.gpu import fabric  # noqa: E402
from rigup.gpu.catalogue import branch_cuda  # noqa: E402
from rigup.gpu.driver import branch_of, modules_choice, predicted_gpus  # noqa: E402
from rigup.gpu.facts import GPU_COMMAND, PCI_COMMAND, parse_gpus, parse_pci  # noqa: E402
from rigup.gpu.plan import hardware_plan  # noqa: E402


def shell(command: str) -> list[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120).stdout.splitlines()


def summary(plan: dict) -> dict:
    """What the roles plan on: the cards by bus id and class, archs, VRAM, minimum CUDA."""
    return {"cards": [(c["bus_id"], c["class"]) for c in sorted(plan["cards"], key=lambda c: c["bus_id"])],
            "cuda_archs": plan["cuda_archs"], "vram_mib": sorted(plan["vram_mib"]["per_card"]),
            "min_cuda": plan["min_cuda"], "cpu_only": plan["cpu_only"]}


def fabric_read(pci_lines: list[str], gpus: list[dict]) -> dict:
    """The fabric as preflight reads it (rigup.gpu.facts: the fabric manager only with an NVSwitch on
    the bus), the plan's line, what rigup does, and the raw text nvidia-smi gives of it."""
    switches = fabric.parse_nvswitches(pci_lines)
    manager = fabric.parse_manager(shell(fabric.MANAGER_COMMAND)) if switches else None
    planned = fabric.fabric_plan(switches, gpus, manager)
    query = shell("nvidia-smi -q 2>&1")
    start = next((i for i, ln in enumerate(query) if ln.strip() == "Fabric"), None)
    section = query[start:start + 6] if start is not None else []
    links = shell("timeout 10 nvidia-smi nvlink -s 2>&1")
    if planned is None:
        does = ("no NVSwitch on the PCI bus and no card reports a fabric state (N/A): no fabric line, no fabric "
                "manager installed or refused, no fabric gate before serving, nothing judged by the GPU guard")
    elif planned["nvswitches"]:
        does = "an NVSwitch host: fabric manager at the driver's version, gate, guard (docs/hgx.md)"
    else:
        does = "a VM of an HGX host: no fabric manager; the cards' fabric state gated before serving"
    return {"nvswitches": switches, "cards": [(g.get("fabric_state"), g.get("fabric_status")) for g in gpus],
            "manager": manager, "plan": planned, "line": fabric.line(planned), "rigup_does": does,
            "nvidia_smi_q_fabric": section, "nvlink_s": links[:40], "nvlink_parsed": fabric.parse_nvlinks(
                ["nvl " + ln for ln in links])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 tests/gpu/driver_plan.py")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    pci_lines = shell(PCI_COMMAND)
    pci = parse_pci(pci_lines)
    gpus = parse_gpus(shell(GPU_COMMAND))
    version = next((g.get("driver_version") for g in gpus if g.get("driver_version")), None)
    real = hardware_plan(gpus, {"version": version, "loaded": bool(version)}, [])
    predicted = hardware_plan(predicted_gpus(pci), {}, [])
    branch = branch_of(version)
    result = {"pci": pci, "pci_raw": pci_lines, "driver": version, "branch": branch,
              "branch_cuda": branch_cuda(str(branch)) if branch else None,
              "modules": modules_choice(real, "auto")[0],
              "from_nvidia_smi": summary(real), "from_the_pci_bus": summary(predicted),
              "fabric": fabric_read(pci_lines, gpus)}
    result["same"] = result["from_nvidia_smi"] == result["from_the_pci_bus"]
    print(json.dumps(result, indent=2, default=list))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=list) + "\n")
    if not pci:
        print("sysfs shows no NVIDIA device on the PCI bus here: no plan can be made from it", file=sys.stderr)
        return 2
    if not result["same"]:
        print("the plan from the PCI bus differs from nvidia-smi's", file=sys.stderr)
        return 1
    print(f"OK: the plan from the PCI bus is nvidia-smi's ({len(pci)} card(s), driver {version}, "
          f"branch {branch}: CUDA up to {result['branch_cuda']}, {result['modules']} modules)")
    print(f"fabric: {result['fabric']['line'] or 'no fabric line'}: {result['fabric']['rigup_does']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
