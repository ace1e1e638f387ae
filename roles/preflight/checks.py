"""Preflight's refusals: pure functions of a host's plan, facts and data.

Each ``check_*`` takes ``(plan, facts, data)``: the hardware plan (rigup/gpu/plan.py), the
value of ``HardwareFacts`` (rigup/gpu/facts.py; ``model_bytes`` added by preflight) and the
host's merged data, and returns the :class:`Refusal` objects for what cannot work, each with
what is wrong, why, and how to fix it. :func:`refusals` runs them all. No host access here:
the unit tests call them on hand-made values.

    1  check_power_range            a power limit outside a card's range
    2  check_power_override_targets an override naming a UUID or bus id not on the host
    3  check_gpu_host               GPU roles on a host without a usable NVIDIA GPU
    4  check_driver_for_cuda        a driver older than the chosen CUDA toolkit needs
    5  check_cuda_for_archs         a CUDA toolkit too old for the host's cards
    6  check_ports                  a serving port already taken (naming the process)
    7  check_disk                   not enough free disk for a model
    8  check_vram                   a model plus its KV cache that does not fit the VRAM
    9  check_vllm_cc                a vLLM recipe that needs cc >= 9.0 kernels on older cards
    10 check_split_mode_row         llama.cpp -sm row for a model family known to fail with it
    11 check_cmpunlocker_secure_boot  cmpunlocker with Secure Boot on
    12 check_cmpunlocker_headers    cmpunlocker without the running kernel's headers
    13 check_cmpunlocker_driver     cmpunlocker on a driver not on its supported list
    14 check_cmpunlocker_cards      cmpunlocker on cards that are not CMP 170HX (by PCI id)
    -  check_config                 the nested maps (models, instances, overrides), by key path
    -  check_open_without_key       a serving instance bound beyond loopback without an API key
    -  check_systemd                serving, power caps or cmpunlocker where systemd is not PID 1

Nested-map problems are refusals, not a ConfigError that stops every host: an entry names host
things (a model on this host, a port, this host's GPU count), one host's mistake should not stop
the others, and preflight reports them in the same pass as the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigup.gpu.catalogue import cards as catalogue_cards
from rigup.gpu.catalogue import (cuda_version, family_of, min_driver_for_cuda, newest_cuda_for_driver,
                                 version_tuple)
from roles.preflight.schema import serving_config

GIB = 1024 ** 3
OVERHEAD_GIB_PER_GPU = 1.0   # llama.cpp's CUDA context and compute buffers, per card (an estimate)
ALL_LAYERS_NGL = 99          # llama.cpp's "-ngl 99": every layer on the GPUs (or -1)
OUR_SERVERS = ("llama-server", "vllm")  # a port they hold is rigup's own instance: the role restarts it


@dataclass(frozen=True)
class Refusal:
    """Why a host cannot go on: what is wrong, why it matters, and how to fix it."""

    what: str
    why: str
    fix: str
    check: str = ""

    def line(self, host_name: str) -> str:
        return f"[{host_name}] refused: {self.what}: {self.why}; fix: {self.fix}"


# ----------------------------------------------------------------------------- helpers
def _gpu_checks_apply(plan: dict, data: dict) -> bool:
    return bool(data.get("gpu_enabled", True)) and not plan.get("cpu_only", True)


def _indexes(indexes: list) -> str:
    """[0, 1, 2, 3, 5] -> "GPU 0-3, 5"."""
    nums = sorted(i for i in indexes if isinstance(i, int))
    runs: list[list[int]] = []
    for i in nums:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return f"GPU {text}" if text else "GPUs"


def _w(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _bus_tail(bus_id: str) -> str:
    """PCI bus id without its domain, upper case: "0000:c3:00.0" and "00000000:C3:00.0" -> "C3:00.0"."""
    text = str(bus_id).strip().upper()
    return text.split(":", 1)[1] if text.count(":") == 2 else text


def _gpu_facts(facts: dict) -> list[dict]:
    return [g for g in facts.get("gpus") or [] if not g.get("lost")]


def _config(plan: dict, data: dict) -> tuple[dict, list]:
    return serving_config(data, plan.get("gpu_count") if not plan.get("cpu_only", True) else None)


def _instances(config: dict):
    """(engine, "var.name", instance) for every valid serving instance."""
    for var, engine in (("llama_server_instances", "llama.cpp"), ("vllm_instances", "vllm")):
        for name, inst in config[var].items():
            yield engine, f"{var}.{name}", inst


# ----------------------------------------------------------------------------- 3
def check_gpu_host(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """3: GPU roles enabled on a host where no NVIDIA GPU answers (no nvidia-smi, no driver)."""
    if data.get("gpu_enabled", True) and plan.get("cpu_only"):
        return [Refusal("GPU roles enabled on a host without a usable NVIDIA GPU", plan["why_cpu_only"],
                        "install the NVIDIA driver, or set gpu_enabled: false for this host", "gpu_host")]
    return []


# ----------------------------------------------------------------------------- 1, 2
def _card_range(card: dict) -> tuple[float | None, float | None]:
    power = card.get("power_w") or {}
    return power.get("min"), power.get("max")


def _match_override(key, cards: list[dict], gpus: list[dict]) -> dict | None:
    """The plan card an override key names, by UUID or PCI bus id; None when none matches."""
    text = str(key).strip()
    by_index = {g.get("index"): g for g in gpus}
    for card in cards:
        gpu = by_index.get(card["index"], {})
        if gpu.get("uuid") and text.upper() == gpu["uuid"].upper():
            return card
        if ":" in text and card.get("bus_id") and _bus_tail(text) == _bus_tail(card["bus_id"]):
            return card
    return None


def check_power_range(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """1: gpu_power_watts, or an override, outside the card's power.min_limit..max_limit."""
    if not _gpu_checks_apply(plan, data):
        return []
    found = []
    watts = data.get("gpu_power_watts")
    cards = plan.get("cards") or []
    if isinstance(watts, (int, float)) and not isinstance(watts, bool):
        outside: dict[tuple, list] = {}
        for card in cards:
            low, high = _card_range(card)
            if low is not None and watts < low or high is not None and watts > high:
                outside.setdefault((card["class"], low, high), []).append(card["index"])
        if outside:
            ranges = "; ".join(f"{_indexes(idx)} ({cls}) accept {_w(lo)}-{_w(hi)} W"
                               for (cls, lo, hi), idx in outside.items())
            lows = [lo for (_, lo, _), _ in outside.items() if lo is not None]
            highs = [hi for (_, _, hi), _ in outside.items() if hi is not None]
            span = f"between {_w(max(lows)) if lows else '?'} and {_w(min(highs)) if highs else '?'}"
            found.append(Refusal(
                f"gpu_power_watts {_w(watts)} W is outside the power range of this host's cards",
                f"{ranges} (nvidia-smi power.min_limit..power.max_limit)",
                f"set gpu_power_watts {span}, or null to leave the limits as they are", "power_range"))
    gpus = _gpu_facts(facts)
    for key, value in (data.get("gpu_power_overrides") or {}).items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue  # check_config reports it
        card = _match_override(key, cards, gpus)
        if card is None:
            continue  # check_power_override_targets reports it
        low, high = _card_range(card)
        if low is not None and value < low or high is not None and value > high:
            found.append(Refusal(
                f"gpu_power_overrides.{key} {value} W is outside its card's power range",
                f"GPU {card['index']} ({card['class']}, {card['bus_id']}) accepts {_w(low)}-{_w(high)} W",
                f"set it between {_w(low)} and {_w(high)}", "power_range"))
    return found


def check_power_override_targets(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """2: an override keyed by a UUID or bus id of no card on this host (or by an index)."""
    if not _gpu_checks_apply(plan, data):
        return []
    found = []
    cards = plan.get("cards") or []
    gpus = _gpu_facts(facts)
    for key in data.get("gpu_power_overrides") or {}:
        text = str(key).strip()
        if text.isdigit():
            found.append(Refusal(
                f"gpu_power_overrides.{key} is keyed by a GPU index",
                "indexes reorder between boots, so the cap could land on another card",
                "key it by the card's UUID or PCI bus id (nvidia-smi --query-gpu=index,uuid,pci.bus_id "
                "--format=csv)", "power_override_target"))
            continue
        if _match_override(key, cards, gpus) is None:
            bus_ids = ", ".join(c["bus_id"] for c in cards if c.get("bus_id"))
            found.append(Refusal(
                f"gpu_power_overrides.{key} names a card that is not on this host",
                f"no GPU here has that UUID or PCI bus id (its {len(cards)} GPUs: {bus_ids})",
                "key it by a UUID or bus id from nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv "
                "on this host, or move it to the host that has the card", "power_override_target"))
    return found


# ----------------------------------------------------------------------------- 4, 5
def check_driver_for_cuda(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """4: the loaded driver is older than the chosen cuda_version needs."""
    if not _gpu_checks_apply(plan, data):
        return []
    wanted = str(data.get("cuda_version") or "")
    driver = (plan.get("driver") or {}).get("version")
    if version_tuple(wanted) is None:
        return [Refusal(f"cuda_version {wanted!r} is not a CUDA version",
                        "it must be major.minor, e.g. \"12.8\"",
                        "set cuda_version to a quoted major.minor (on the command line: "
                        "--data 'cuda_version=\"12.8\"')", "driver_for_cuda")]
    need = min_driver_for_cuda(wanted)
    if not driver or need is None or version_tuple(driver) is None:
        return []
    listed, min_driver = need
    if version_tuple(driver) >= version_tuple(min_driver):
        return []
    newest = newest_cuda_for_driver(driver)
    table = "" if listed == wanted else f" (the minimum of CUDA {listed}, the nearest listed)"
    return [Refusal(
        f"NVIDIA driver {driver} is too old for CUDA {wanted}",
        f"CUDA {wanted} needs driver >= {min_driver}{table} (CUDA release notes; "
        "rigup/gpu/catalogue.yml cuda_min_driver)",
        (f"set cuda_version to {newest} or older (the newest this driver runs), or " if newest else "")
        + f"upgrade the NVIDIA driver to >= {min_driver}", "driver_for_cuda")]


def check_cuda_for_archs(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """5: the chosen cuda_version is older than the host's cards need (plan min_cuda)."""
    if not _gpu_checks_apply(plan, data):
        return []
    wanted = str(data.get("cuda_version") or "")
    needed = plan.get("min_cuda")
    if version_tuple(wanted) is None or not needed or cuda_version(wanted) >= cuda_version(needed):
        return []
    short = {}
    for card in plan.get("cards") or []:
        if card.get("min_cuda") and cuda_version(card["min_cuda"]) > cuda_version(wanted):
            short[(card["class"], card.get("cmake_arch"), card["min_cuda"])] = True
    cards = "; ".join(f"{cls} cards (sm_{arch}) need CUDA >= {need}" for cls, arch, need in short)
    return [Refusal(f"CUDA {wanted} is too old for this host's cards",
                    f"{cards}: nvcc {wanted} cannot build for them (rigup/gpu/catalogue.yml min_cuda)",
                    f"set cuda_version to {needed} or newer", "cuda_for_archs")]


# ----------------------------------------------------------------------------- 6
def check_ports(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """6: a serving instance's port already has a listener that is not rigup's own server, or
    two instances share a port."""
    config, _ = _config(plan, data)
    listening = facts.get("listening_ports") or {}
    found = []
    taken_by: dict[int, list[str]] = {}
    for _, where, inst in _instances(config):
        taken_by.setdefault(inst["port"], []).append(where)
    used = set(listening) | set(taken_by)
    for port, wheres in taken_by.items():
        if len(wheres) > 1:
            found.append(Refusal(f"port {port} is given to {len(wheres)} instances",
                                 f"{' and '.join(wheres)} would all listen on it",
                                 "give each instance its own port", "ports"))
    for _, where, inst in _instances(config):
        port = inst["port"]
        if port not in listening or listening[port] in OUR_SERVERS:
            continue
        process = listening[port]
        free = next((p for p in range(port + 1, 65536) if p not in used), None)
        who = f"process {process}" if process else "a process that ss cannot name (run as root to see it)"
        stop = f"stop {process} " if process else "stop it "
        found.append(Refusal(
            f"port {port} of {where} is already taken",
            f"{who} listens on it (ss -ltnp 'sport = :{port}'), so the server could not bind",
            f"{stop}or give the instance another port" + (f" ({where}.port: {free} is free)" if free else ""),
            "ports"))
    return found


# ----------------------------------------------------------------------------- 7
def check_disk(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """7: a model (size_gib) larger than the free disk where it goes, net of what is there."""
    config, _ = _config(plan, data)
    free_disk = facts.get("free_disk") or {}
    present = facts.get("model_bytes") or {}
    found = []
    for name, model in config["models"].items():
        size = model.get("size_gib")
        free = free_disk.get(model["dest"])
        if size is None or free is None:
            continue
        have = (present.get(model["dest"]) or 0) / GIB
        need = max(size - have, 0.0)
        if need * GIB <= free:
            continue
        free_gib = free / GIB
        found.append(Refusal(
            f"not enough free disk for model {name}",
            f"it needs {need:.1f} GiB more at {model['dest']} ({size:.1f} GiB in all, {have:.1f} GiB already "
            f"there) and that filesystem has {free_gib:.1f} GiB free",
            f"free {need - free_gib:.1f} GiB there, or set models.{name}.dest (or models_dir) to a "
            "filesystem with room", "disk"))
    return found


# ----------------------------------------------------------------------------- 8
def _vram_per_card_gib(plan: dict, data: dict) -> tuple[list[float], bool]:
    """VRAM per card in GiB (after the unlock when cmpunlocker is on), and whether locked cards
    are counted at their locked size."""
    unlock = bool(data.get("cmpunlocker_enabled"))
    key = "vram_unlocked_mib" if unlock else "vram_mib"
    per_card = [m / 1024 for m in (plan.get(key) or {}).get("per_card", [])]
    return per_card, bool(plan.get("needs_unlock")) and not unlock


def _cards_text(per_card: list[float]) -> str:
    if len(set(per_card)) == 1:
        return f"{len(per_card)} x {per_card[0]:.1f} GiB"
    return " + ".join(f"{v:.1f}" for v in per_card) + " GiB"


def check_vram(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """8: an instance's model weights plus KV cache (llama.cpp: ctx x the family's estimate;
    plus 1 GiB per card) larger than the VRAM of the cards it runs on."""
    if not _gpu_checks_apply(plan, data):
        return []
    config, _ = _config(plan, data)
    per_card, locked = _vram_per_card_gib(plan, data)
    unlock_hint = ", or enable cmpunlocker (these cards are still locked)" if locked else ""
    found = []
    for engine, where, inst in _instances(config):
        model = config["models"][inst["model"]]
        weights = model.get("size_gib")
        if weights is None or not per_card:
            continue
        family = family_of(model)
        if engine == "llama.cpp":
            if not (inst["ngl"] >= ALL_LAYERS_NGL or inst["ngl"] == -1):
                continue  # layers left on the CPU: the split is llama.cpp's to make
            rate = family.get("kv_gib_per_1k_tokens") if family else None
            kv = (rate or 0.0) * inst["ctx"] / 1000
            overhead = OVERHEAD_GIB_PER_GPU * len(per_card)
            need = weights + kv + overhead
            total = sum(per_card)
            if need <= total:
                continue
            kv_text = (f"KV cache {kv:.1f} GiB ({inst['ctx']:,} tokens x {rate:g} GiB per 1k, "
                       f"{family['key']} estimate from rigup/gpu/models.yml)" if rate else
                       "KV cache not counted (model family unknown)")
            found.append(Refusal(
                f"model {inst['model']} does not fit the VRAM of {where}",
                f"weights {weights:.1f} GiB + {kv_text} + {overhead:.1f} GiB overhead (1 GiB per GPU) = "
                f"{need:.1f} GiB > {total:.1f} GiB of VRAM ({_cards_text(per_card)})",
                f"lower {where}.ctx, pick a smaller quant, or lower ngl to keep layers on the CPU{unlock_hint}",
                "vram"))
        else:
            cards = per_card[: inst["tp"] * inst["pp"]]
            budget = inst["gpu_memory_utilization"] * sum(cards)
            if weights < budget:
                continue
            found.append(Refusal(
                f"model {inst['model']} does not fit the VRAM of {where}",
                f"weights {weights:.1f} GiB >= {budget:.1f} GiB usable (gpu_memory_utilization "
                f"{inst['gpu_memory_utilization']:g} x {_cards_text(cards)} for tp {inst['tp']} x pp {inst['pp']}), "
                "leaving nothing for the KV cache",
                f"raise tp or pp (this host has {len(per_card)} GPUs), raise gpu_memory_utilization, or pick a "
                f"smaller checkpoint{unlock_hint}", "vram"))
    return found


# ----------------------------------------------------------------------------- 9, 10
def check_vllm_cc(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """9: a vLLM instance whose model family needs kernels for a higher compute capability
    (rigup/gpu/models.yml vllm_min_cc) than the host's cards have. A patched vLLM (a git commit
    with a patch series, as the CMP 170HX recipes of seeds 002/003 run) is the operator's claim
    that it carries those kernels: not refused."""
    if not _gpu_checks_apply(plan, data) or (data.get("vllm_git_commit") and data.get("vllm_patches")):
        return []
    config, _ = _config(plan, data)
    found = []
    for name, inst in config["vllm_instances"].items():
        family = family_of(config["models"][inst["model"]])
        floor = family.get("vllm_min_cc") if family else None
        if not floor:
            continue
        below = sorted({(c["class"], tuple(c["compute_capability"])) for c in plan.get("cards") or []
                        if c.get("compute_capability") and tuple(c["compute_capability"]) < tuple(floor)})
        if not below:
            continue
        cards = ", ".join(f"{cls} cards are cc {cc[0]}.{cc[1]}" for cls, cc in below)
        found.append(Refusal(
            f"vllm_instances.{name} needs compute capability >= {floor[0]}.{floor[1]} for {family['name']}",
            f"stock vLLM's kernels for {family['key']} run only on cc >= {floor[0]}.{floor[1]} "
            f"(rigup/gpu/models.yml, from {', '.join(family['sources'])}); this host's {cards}",
            "serve it with llama.cpp on this host (llama_server_instances), run vLLM on Hopper or newer "
            "(H100, H200, B200), or declare a patched vLLM (vllm_git_commit with vllm_patches)", "vllm_cc"))
    return found


_SM_ROW = re.compile(r"^(-sm|--split-mode)(=|\s+)row$")


def check_split_mode_row(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """10: llama.cpp row split (-sm row) for a model family known to fail with it."""
    config, _ = _config(plan, data)
    found = []
    for name, inst in config["llama_server_instances"].items():
        args = inst["extra_args"]
        joined = [" ".join(args[i:i + 2]) for i in range(len(args))] + list(args)
        row = inst["split_mode"] == "row" or any(_SM_ROW.match(a) for a in joined)
        family = family_of(config["models"][inst["model"]])
        if not row or not family or not family.get("split_mode_row_fails"):
            continue
        error = family.get("split_mode_row_error") or "it fails at load"
        found.append(Refusal(
            f"llama_server_instances.{name} uses -sm row for {family['name']}",
            f"llama.cpp fails to load {family['key']} with row split: \"{error}\" "
            f"(rigup/gpu/models.yml, from {', '.join(family['sources'])})",
            f"set llama_server_instances.{name}.split_mode: layer (and drop -sm row from extra_args)",
            "split_mode_row"))
    return found


# ----------------------------------------------------------------------------- 11-14
def _cmpunlocker_applies(plan: dict, data: dict) -> bool:
    return bool(data.get("cmpunlocker_enabled")) and _gpu_checks_apply(plan, data)


def check_cmpunlocker_secure_boot(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """11: cmpunlocker with UEFI Secure Boot on."""
    if not _cmpunlocker_applies(plan, data) or facts.get("secure_boot") is not True:
        return []
    return [Refusal("cmpunlocker with Secure Boot on",
                    "its patched NVIDIA kernel modules are unsigned, so the kernel would not load them "
                    "(its installer aborts; mokutil --sb-state says SecureBoot enabled)",
                    "turn Secure Boot off in the firmware setup, or set cmpunlocker_enabled: false for this host",
                    "cmpunlocker_secure_boot")]


def check_cmpunlocker_headers(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """12: cmpunlocker without the headers of the running kernel."""
    kernel = facts.get("kernel") or {}
    if not _cmpunlocker_applies(plan, data) or kernel.get("headers"):
        return []
    release = kernel.get("release") or "$(uname -r)"
    return [Refusal("cmpunlocker without kernel headers",
                    f"it builds patched nvidia modules against the running kernel {release}, and "
                    f"/lib/modules/{release}/build is missing",
                    f"install them (apt-get install linux-headers-{release}), or set cmpunlocker_enabled: false",
                    "cmpunlocker_headers")]


def check_cmpunlocker_driver(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """13: cmpunlocker on a driver that is not exactly one of cmpunlocker_supported_drivers (or
    on NVIDIA's proprietary kernel module: it patches the open one)."""
    if not _cmpunlocker_applies(plan, data):
        return []
    driver = plan.get("driver") or {}
    supported = [str(v) for v in data.get("cmpunlocker_supported_drivers") or []]
    found = []
    if driver.get("version") not in supported:
        found.append(Refusal(
            f"cmpunlocker on NVIDIA driver {driver.get('version') or '(none loaded)'}",
            f"its patches apply to exactly {', '.join(supported) or '(no version listed)'} "
            "(cmpunlocker_supported_drivers, from its driver/VERSION; there is no range)",
            f"install one of them (e.g. apt-get install nvidia-driver-{(supported or ['610'])[0].split('.')[0]}-open) "
            "and reboot, or add this version to cmpunlocker_supported_drivers if your cmpunlocker fork "
            "lists it", "cmpunlocker_driver"))
    if driver.get("kernel_module") == "proprietary":
        found.append(Refusal(
            "cmpunlocker on NVIDIA's proprietary kernel module",
            "cmpunlocker patches NVIDIA's open kernel modules (open-gpu-kernel-modules)",
            "install the -open driver packages of a supported version and reboot", "cmpunlocker_driver"))
    return found


def _cmp_ids() -> dict[str, str]:
    """PCI id -> cmpunlocker profile ("8gb", "10gb") of every card that needs the unlock."""
    return {pci: f"{card['vram_locked_mib'] // 1024}gb" for card in catalogue_cards().values()
            if card["quirks"].get("needs_unlock") and card.get("vram_locked_mib")
            for pci in card["pci_ids"]}


def check_cmpunlocker_cards(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """14: cmpunlocker on a host with cards that are not CMP 170HX (by PCI id), or with a
    cmpunlocker_profile that does not match the cards."""
    if not _cmpunlocker_applies(plan, data):
        return []
    cmp_ids = _cmp_ids()
    gpus = _gpu_facts(facts)
    others: dict[str, list] = {}
    profiles: dict[str, list] = {}
    for gpu in gpus:
        pci = gpu.get("pci_device_id")
        if pci in cmp_ids:
            profiles.setdefault(cmp_ids[pci], []).append(gpu.get("index"))
        else:
            others.setdefault(pci or "unknown PCI id", []).append(gpu.get("index"))
    found = []
    if others:
        keys = {c["index"]: c.get("key") for c in plan.get("cards") or []}
        cards = "; ".join(f"{_indexes(idx)} are {pci}" + (f" ({keys.get(idx[0])})" if keys.get(idx[0]) else "")
                          for pci, idx in others.items())
        unlockable = ", ".join(f"{pci} ({prof})" for pci, prof in sorted(cmp_ids.items()))
        found.append(Refusal(
            "cmpunlocker on cards that are not CMP 170HX",
            f"{cards}; cmpunlocker unlocks only {unlockable} cards, found by PCI id",
            "set cmpunlocker_enabled: false for this host", "cmpunlocker_cards"))
    profile = data.get("cmpunlocker_profile")
    wrong = {p: idx for p, idx in profiles.items() if p != profile}
    if wrong and not others:
        want = ", ".join(f"{_indexes(idx)} need {p}" for p, idx in wrong.items())
        found.append(Refusal(
            f"cmpunlocker_profile {profile} does not match this host's cards",
            f"{want} (by PCI id: 10de:20c2 is the 8 GB card, 10de:2082 the 10 GB card)",
            f"set cmpunlocker_profile: {next(iter(wrong))}", "cmpunlocker_cards"))
    return found


# ----------------------------------------------------------------------------- config
def check_config(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """The entries of models, llama_server_instances, vllm_instances and gpu_power_overrides,
    by key path (roles/preflight/schema.py)."""
    _, problems = _config(plan, data)
    return [Refusal(path, why, "correct it where it is set (group_vars, inventory host data or --data); "
                               "roles/*/defaults.yml documents each key", "config") for path, why in problems]


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_open_without_key(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """A llama-server bound beyond loopback must check an API key (llama-server checks none by
    default: anyone on the network could use the GPUs)."""
    config, _ = _config(plan, data)
    return [Refusal(f"llama_server_instances.{name}.host is {inst['host']} without an API key",
                    "a non-loopback address serves anyone who can reach it",
                    f"set llama_server_instances.{name}.api_key: true, or host: 127.0.0.1", "open_without_key")
            for name, inst in config["llama_server_instances"].items()
            if inst["host"] not in LOOPBACK and not inst["api_key"]]


def check_systemd(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """What only works with systemd, on a host where it is not PID 1 (a docker-style rental
    container): serving instances (systemd units), power caps and clock locks (kept by a boot unit)
    and cmpunlocker. The build and model downloads work there; gpu_power's persistence and the
    guard are skipped (there is nothing to guard without serving units)."""
    if facts.get("systemd", True):
        return []
    config, _ = _config(plan, data)
    needs = [f"{var} ({', '.join(sorted(config[var]))})"
             for var in ("llama_server_instances", "vllm_instances") if config[var]]
    needs += [key for key in ("gpu_power_watts", "gpu_power_overrides", "gpu_power_clocks", "cmpunlocker_enabled")
              if data.get(key) not in (None, {}, False)]
    if not needs:
        return []
    return [Refusal(f"{', '.join(needs)} on a host without systemd",
                    "they run as systemd units (serving, the boot unit that keeps power limits, the unlock) "
                    "and systemd is not PID 1 here (a container?)",
                    "use a host booted with systemd, or unset them for this host (model downloads and the "
                    "llama.cpp build work without systemd)", "systemd")]


CHECKS = (check_config, check_open_without_key, check_systemd, check_gpu_host, check_power_range, check_power_override_targets,
          check_driver_for_cuda, check_cuda_for_archs, check_ports, check_disk, check_vram,
          check_vllm_cc, check_split_mode_row, check_cmpunlocker_secure_boot,
          check_cmpunlocker_headers, check_cmpunlocker_driver, check_cmpunlocker_cards)


def refusals(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """Every reason this plan cannot work on this host (pure: plan, facts and data in)."""
    return [refusal for check in CHECKS for refusal in check(plan, facts, data)]
