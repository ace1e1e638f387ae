"""What a host's hardware calls for: pure functions of its facts and the catalogue.

No pyinfra host access here: :func:`hardware_plan` takes the values of the ``NvidiaGpus``,
``NvidiaDriver``, ``CudaToolkits`` and ``CpuInfo`` facts (rigup/gpu/facts.py) and returns a plain,
JSON-serialisable dict that preflight, the roles and a dry run all read::

    {"cpu_only": False, "why_cpu_only": None,
     "gpu_count": 8, "lost_cards": [],                      # bus ids of cards off the bus
     "cards": [{"index": 0, "bus_id": "00000000:07:00.0", "uuid": "GPU-17a2...", "class": "a100",
                "key": "a100-sxm4-80gb", "matched_by": "pci_id", "compute_capability": [8, 0],
                "cmake_arch": "80", "min_cuda": "11.0", "vram_mib": 81920,
                "vram_unlocked_mib": 81920, "locked": False,
                "power_w": {"min": 100.0, "default": 400.0, "max": 400.0, "limit": 400.0},
                "link": {"link": "x16 Gen4", "downtrained": False, "why": ""}}, ...],
     "card_classes": ["a100"],
     "cuda_archs": ["80"],                                  # CMAKE_CUDA_ARCHITECTURES, never "native"
     "min_cuda": "11.0",                                    # the newest of the cards' minimums
     "cuda_toolkit": {"needed": "11.0", "found": "12.8", "path": "/usr/local/cuda-12.8/bin/nvcc"},
     "driver": {"version": "580.105.08", "loaded": True, "kernel_module": "open"},
     "cpu": {"vendor": "AMD", "model": "AMD EPYC 7763 64-Core Processor", "logical": 256,
             "cores": 128, "sockets": 2, "numa_nodes": 2, "flags": ["avx", "avx2", "f16c", "fma"],
             "amx": False},                                 # CpuInfo's value; {} when not read
     "vram_mib": {"total": 655360, "per_card": [81920, ...]},
     "vram_unlocked_mib": {"total": 655360, "per_card": [81920, ...]},   # after cmpunlocker
     "needs_unlock": False,
     "quirks": {"fp8": False, "fma_throttled": False},
     "engines": {"llama.cpp": {"ok": True, "backend": "cuda"},
                 "vllm": {"ok": False, "why": "...", "patched_build": True}},
     "warnings": []}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from rigup.serving import ServingPlan

from rigup.gpu.catalogue import card_for, cuda_version, is_locked, model_families


class Card(TypedDict):
    """One card of a plan (``plan["cards"]``)."""

    index: int | None
    bus_id: str | None
    uuid: str | None
    # also: "class" (card class, e.g. "a100"; a keyword, so not declared here)
    key: str | None
    matched_by: str | None
    compute_capability: list[int] | None
    cmake_arch: str | None
    min_cuda: str | None
    vram_mib: int | None
    vram_unlocked_mib: int | None
    locked: bool
    power_w: dict[str, float | None]
    quirks: dict[str, bool]


class Plan(TypedDict, total=False):
    """What :func:`hardware_plan` returns (see the module docstring for an example); preflight adds
    ``systemd`` (whether systemd is PID 1)."""

    cpu_only: bool
    why_cpu_only: str | None
    gpu_count: int
    lost_cards: list[str]
    cards: list[Card]
    card_classes: list[str]
    cuda_archs: list[str]
    min_cuda: str | None
    cuda_toolkit: dict[str, str | None]
    driver: dict[str, object]
    cpu: dict[str, object]
    vram_mib: dict[str, object]
    vram_unlocked_mib: dict[str, object]
    needs_unlock: bool
    quirks: dict[str, bool]
    engines: dict[str, dict]
    warnings: list[str]
    systemd: bool
    serving_units: list[str]
    driver_step: dict | None    # rigup.gpu.driver.driver_step: the driver roles/nvidia_driver installs
    fabric: dict | None         # rigup.gpu.fabric.fabric_plan: the NVSwitch fabric (preflight adds it)
    burnin: dict | None         # roles/burnin/quarantine.py: cards to test, quarantined, waiting (preflight adds it)
    serving: ServingPlan        # rigup.serving.serving_plan: every serving instance sized, with its servers (preflight)


def vllm_min_cc() -> tuple[int, int]:
    """The compute capability stock vLLM needs for the catalogued families that need the most
    (rigup/gpu/models.yml ``vllm_min_cc``)."""
    return max((f["vllm_min_cc"] for f in model_families().values() if f["vllm_min_cc"]), default=(0, 0))


def gpu_host(plan: dict, data: dict) -> bool:
    """Whether this host's GPUs are rigup's to provision: ``gpu_enabled`` and a usable GPU."""
    return bool(data.get("gpu_enabled", True)) and not plan.get("cpu_only", True)


def gpu_count(plan: dict) -> int | None:
    """How many usable GPUs the plan has, or None when that is not known (a CPU-only plan)."""
    return None if plan.get("cpu_only", True) else plan.get("gpu_count")


def vram_per_card_gib(plan: dict, data: dict) -> tuple[list[float], bool]:
    """VRAM per card in GiB (after the unlock when ``cmpunlocker_enabled``), and whether locked
    cards are counted at their locked size."""
    unlock = bool(data.get("cmpunlocker_enabled"))
    key = "vram_unlocked_mib" if unlock else "vram_mib"
    per_card = [m / 1024 for m in (plan.get(key) or {}).get("per_card", [])]
    return per_card, bool(plan.get("needs_unlock")) and not unlock


def vram_cards(plan: dict, data: dict) -> tuple[list[float], str]:
    """VRAM per card in GiB for the serving roles' VRAM checks ([] when the host's GPUs are not
    rigup's), and the hint to add to a refusal when locked cards are counted locked."""
    if not gpu_host(plan, data):
        return [], ""
    per_card, locked = vram_per_card_gib(plan, data)
    return per_card, ", or enable cmpunlocker (these cards are still locked)" if locked else ""


def unlock_wait(plan: dict, data: dict) -> str | None:
    """Why serving waits on this host, or None: with ``cmpunlocker_enabled``, cards that still
    report their locked memory (before the cold power-off that unlocks them). The VRAM checks
    count the unlocked size meanwhile (:func:`vram_per_card_gib`), so nothing may start on the
    locked cards; rigup never power-cycles, so the cards cannot unlock during a run."""
    if not data.get("cmpunlocker_enabled") or not gpu_host(plan, data):
        return None
    locked = [c for c in plan.get("cards") or [] if c.get("locked")]
    if not locked:
        return None
    now = sorted({c["vram_mib"] for c in locked})
    want = sorted({c["vram_unlocked_mib"] for c in locked})
    return (f"the cards report {' / '.join(map(str, now))} MiB (locked): serving waits until they report "
            f"{' / '.join(map(str, want))} MiB, after a cold power-off (shutdown -h now, wait 30 s, power on), "
            "then converge again")


def cards_gib_text(per_card: list[float]) -> str:
    """[80.0, 80.0] -> "2 x 80.0 GiB"; mixed sizes one by one."""
    if len(set(per_card)) == 1:
        return f"{len(per_card)} x {per_card[0]:.1f} GiB"
    return " + ".join(f"{v:.1f}" for v in per_card) + " GiB"


VLLM_WHY = ("stock vLLM's recipes for the seed models need compute capability >= {cc} kernels "
            "(sparse MLA, FP8); {cards} only run vLLM from a patched build")


def link_state(gen: int | None, gen_max: int | None, width: int | None, width_max: int | None,
               loaded: bool = False) -> dict:
    """A card's PCIe link against its maxima: ``{"link": "x16 Gen5", "downtrained": False, "why": ""}``.

    The width is compared always; the generation only when ``loaded`` (cards drop their generation
    at idle to save power, so an idle Gen1 says nothing). An unknown value ([N/A]: a VM hides the
    host's side, ``pcie.link.gen.hostmax``) is unknown, never a mismatch; so is a current value above
    its maximum (no link runs faster or wider than its card can: a lying host's Gen7 of Gen3)."""
    if gen is not None and gen_max is not None and gen > gen_max:
        gen = gen_max = None
    if width is not None and width_max is not None and width > width_max:
        width = width_max = None
    link = f"x{width if width is not None else '?'} Gen{gen if gen is not None else '?'}"
    why = []
    if width is not None and width_max is not None and width < width_max:
        why.append(f"x{width} of x{width_max}")
    if loaded and gen is not None and gen_max is not None and gen < gen_max:
        why.append(f"Gen{gen} of Gen{gen_max} under load")
    return {"link": link, "downtrained": bool(why), "why": ", ".join(why)}


def _card_plan(gpu: dict) -> dict:
    card = card_for(gpu)
    cc = gpu.get("compute_capability") or (card["compute_capability"] if card else None)
    locked = is_locked(gpu, card)
    vram = gpu.get("memory_total_mib")
    if vram is None and card:
        vram = card["vram_locked_mib"] if card["quirks"].get("needs_unlock") else card["vram_mib"]
    unlocked = card["vram_mib"] if locked and card else vram
    power = {k: gpu.get(f"power_{k}_w") for k in ("min", "default", "max", "limit")}
    for k in ("min", "default", "max"):
        if power[k] is None and card and card["power_w"].get(k) is not None:
            power[k] = float(card["power_w"][k])
    return {
        "index": gpu.get("index"),
        "bus_id": gpu.get("bus_id"),
        "uuid": gpu.get("uuid"),
        "class": card["class"] if card else "unknown",
        "key": card["key"] if card else None,
        "matched_by": card["matched_by"] if card else None,
        "compute_capability": list(cc) if cc else None,
        "cmake_arch": card["cmake_arch"] if card else None,
        "min_cuda": card["min_cuda"] if card else None,
        "vram_mib": vram,
        "vram_unlocked_mib": unlocked,
        "locked": locked,
        "power_w": power,
        "link": link_state(gpu.get("pcie_gen"), gpu.get("pcie_gen_max"), gpu.get("pcie_width"), gpu.get("pcie_width_max")),
        "quirks": dict(card["quirks"]) if card else {},
    }


def _pick_toolkit(toolkits: list[dict], needed: str | None) -> dict | None:
    """The newest toolkit at least ``needed`` (any, when ``needed`` is None)."""
    ok = [t for t in toolkits or [] if cuda_version(t.get("version")) >= cuda_version(needed)]
    return max(ok, key=lambda t: cuda_version(t.get("version")), default=None)


def hardware_plan(gpus: list[dict], driver: dict | None = None, toolkits: list[dict] | None = None,
                  cpu: dict | None = None) -> Plan:
    """The plan for a host with these ``NvidiaGpus`` / ``NvidiaDriver`` / ``CudaToolkits`` /
    ``CpuInfo`` values (see the module docstring for its shape)."""
    driver = driver or {}
    lost = [g.get("bus_id") for g in gpus or [] if g.get("lost")]
    cards = [_card_plan(g) for g in gpus or [] if not g.get("lost")]
    warnings = [f"GPU {b} fell off the bus (nvidia-smi cannot reach it): reseat or reboot" for b in lost]

    archs = sorted({c["cmake_arch"] for c in cards if c["cmake_arch"]}, key=int)
    minimums = [c["min_cuda"] for c in cards if c["min_cuda"]]
    min_cuda = max(minimums, key=cuda_version) if minimums else None
    toolkit = _pick_toolkit(toolkits or [], min_cuda) if cards else None
    unknown = [c for c in cards if c["cmake_arch"] is None]
    for c in unknown:
        warnings.append(f"GPU {c['index']} ({c['bus_id']}): neither its PCI id nor its compute "
                        "capability is known: no CUDA architecture for it")
    for c in cards:
        if c["link"]["downtrained"]:
            warnings.append(f"GPU {c['index']} ({c['bus_id']}): PCIe {c['link']['why']} DOWNTRAINED (a riser, a "
                            "dusty slot, a mining board; it slows every transfer, a split model's whole speed): "
                            "reseat it; rigup makes a card with a full link the main GPU")
    if any(c["matched_by"] == "compute_capability" for c in cards):
        warnings.append("some cards are not in rigup/gpu/catalogue.yml; planned by compute capability")

    why_cpu = None
    if not cards:
        if lost:
            why_cpu = "every GPU fell off the bus"
        elif gpus is None or not driver.get("loaded"):
            why_cpu = "no NVIDIA GPU answers: nvidia-smi is missing or the driver is not loaded"
        else:
            why_cpu = "the NVIDIA driver is loaded but reports no GPU"

    per_card = [c["vram_mib"] or 0 for c in cards]
    per_card_unlocked = [c["vram_unlocked_mib"] or 0 for c in cards]
    floor = vllm_min_cc()
    cc_text = f"{floor[0]}.{floor[1]}"
    below_vllm = sorted({c["class"] for c in cards
                         if not c["compute_capability"] or tuple(c["compute_capability"]) < floor})
    if not cards:
        vllm = {"ok": False, "why": f"CPU only: {why_cpu}", "patched_build": False}
    elif below_vllm:
        vllm = {"ok": False, "why": VLLM_WHY.format(cc=cc_text, cards=", ".join(below_vllm) + f" cards (cc < {cc_text})"),
                "patched_build": True}
    else:
        vllm = {"ok": True}

    return {
        "cpu_only": not cards,
        "why_cpu_only": why_cpu,
        "gpu_count": len(cards),
        "lost_cards": lost,
        "cards": cards,
        "card_classes": sorted({c["class"] for c in cards}),
        "cuda_archs": archs,
        "min_cuda": min_cuda,
        "cuda_toolkit": {"needed": min_cuda, "found": toolkit["version"] if toolkit else None,
                         "path": toolkit["path"] if toolkit else None},
        "driver": {k: driver.get(k) for k in ("version", "loaded", "kernel_module")},
        "cpu": dict(cpu or {}),
        "vram_mib": {"total": sum(per_card), "per_card": per_card},
        "vram_unlocked_mib": {"total": sum(per_card_unlocked), "per_card": per_card_unlocked},
        "needs_unlock": any(c["locked"] for c in cards),
        "quirks": {"fp8": bool(cards) and all(c["quirks"].get("fp8") for c in cards),
                   "fma_throttled": any(c["quirks"].get("fma_throttled") for c in cards)},
        "engines": {"llama.cpp": {"ok": True, "backend": "cuda" if cards else "cpu"}, "vllm": vllm},
        "warnings": warnings,
    }


def _vram(per_card: list[int]) -> str:
    if not per_card:
        return "0 MiB"
    if len(set(per_card)) == 1:
        return f"{len(per_card)} x {per_card[0]} MiB = {sum(per_card)} MiB"
    return " + ".join(map(str, per_card)) + f" = {sum(per_card)} MiB"


_AVX512 = (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"), ("avx512_fp16", "FP16"))
_AMX = (("amx_int8", "INT8"), ("amx_bf16", "BF16"), ("amx_fp16", "FP16"))
_NEON = (("asimdhp", "FP16"), ("dotprod", "DOTPROD"), ("i8mm", "I8MM"), ("bf16", "BF16"))


def _isa(name: str, flags: list[str], extras: tuple[tuple[str, str], ...]) -> str:
    """``"AVX-512 (VNNI, BF16)"``: ``name`` with the labels of the ``extras`` flags it has."""
    labels = [label for flag, label in extras if flag in flags]
    return f"{name} ({', '.join(labels)})" if labels else name


def _plural(n: int, word: str) -> str:
    """``"1 socket"``, ``"2 sockets"``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def cpu_text(cpu: dict | None) -> str | None:
    """A plan's ``cpu`` in one line: ``"Intel(R) Xeon(R) Platinum 8480+, 2 sockets, 112 cores /
    224 threads, 2 NUMA nodes, AVX-512 (VNNI, BF16, FP16), AMX (INT8, BF16)"`` (sockets only when
    more than one; what is unknown is left out); None when nothing is known of the CPU."""
    cpu = cpu or {}
    flags = cpu.get("flags") or []
    model, vendor = cpu.get("model"), cpu.get("vendor")
    name = f"{vendor} {model}" if model and vendor and vendor not in model else model or vendor
    parts = [name or "unknown model"]
    if (cpu.get("sockets") or 0) > 1:
        parts.append(_plural(cpu["sockets"], "socket"))
    counts = [_plural(cpu[k], word) for k, word in (("cores", "core"), ("logical", "thread")) if cpu.get(k)]
    parts += [" / ".join(counts)] if counts else []
    if cpu.get("numa_nodes"):
        parts.append(_plural(cpu["numa_nodes"], "NUMA node"))
    if "avx512f" in flags:
        parts.append(_isa("AVX-512", flags, _AVX512))
    elif "avx2" in flags:
        parts.append(_isa("AVX2", flags, (("avx_vnni", "VNNI"),)))
    elif "avx" in flags:
        parts.append("AVX")
    if "amx_tile" in flags:
        parts.append(_isa("AMX", flags, _AMX))
    if "asimd" in flags:
        parts.append(_isa("NEON", flags, _NEON))
    if "sve" in flags or "sve2" in flags:
        parts.append("SVE2" if "sve2" in flags else "SVE")
    return ", ".join(parts) if len(parts) > 1 or name else None


def format_plan(plan: dict) -> str:
    """A few readable lines: cards, CPU, archs, toolkit, VRAM, engines, warnings."""
    if plan["cpu_only"]:
        lines = [f"cards:     none (CPU only: {plan['why_cpu_only']})"]
    else:
        counts: dict[str, int] = {}
        for c in plan["cards"]:
            counts[c["class"]] = counts.get(c["class"], 0) + 1
        lines = ["cards:     " + ", ".join(f"{n} x {k}" for k, n in counts.items())
                 + (f" (+{len(plan['lost_cards'])} lost)" if plan["lost_cards"] else "")
                 + (" (from the PCI bus: no driver answers yet)" if (plan.get("driver_step") or {}).get("predicted") else "")]
        lines.append("archs:     " + (";".join(plan["cuda_archs"]) or "-"))
        tk = plan["cuda_toolkit"]
        found = f"found {tk['found']} ({tk['path']})" if tk["found"] else "none installed that is new enough"
        lines.append(f"toolkit:   CUDA >= {tk['needed']}, {found}")
        vram = _vram(plan["vram_mib"]["per_card"])
        if plan["needs_unlock"]:
            vram += f" (locked; {_vram(plan['vram_unlocked_mib']['per_card'])} after unlock)"
        lines.append("vram:      " + vram)
    cpu = cpu_text(plan.get("cpu"))
    if cpu:
        lines.insert(1, f"cpu:       {cpu}")    # next to the cards
    engines = []
    for name, e in plan["engines"].items():
        engines.append(f"{name} yes" + (f" ({e['backend']})" if e.get("backend") else "")
                       if e["ok"] else f"{name} no: {e['why']}")
    lines.append("engines:   " + "; ".join(engines))
    lines += [f"warning:   {w}" for w in plan["warnings"]]
    return "\n".join(lines)


def build_backend(plan: dict, data: dict) -> str:
    """``cuda`` or ``cpu``: what ``llama_cpp_backend`` (auto|cuda|cpu) means for this plan; auto is
    cuda when the host has NVIDIA GPUs and ``gpu_enabled`` is true."""
    chosen = data.get("llama_cpp_backend", "auto")
    if chosen == "auto":
        return "cuda" if gpu_host(plan, data) else "cpu"
    return chosen


def nvcc_path(plan: dict, data: dict) -> str:
    """Where this host's nvcc of ``cuda_version`` is, or will be once roles/cuda_toolkit ran."""
    source, version = data["cuda_source"], data["cuda_version"]
    if source == "nvidia":
        return f"/usr/local/cuda-{version}/bin/nvcc"
    if source == "distro":
        return "/usr/bin/nvcc"
    return plan["cuda_toolkit"]["path"] or "nvcc"
