"""roles/llama_server's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py), and the ports its instances take.

    check_config            an entry of llama_server_instances that is wrong, by key path
    check_open_without_key  an instance bound beyond loopback without an API key
    check_vram              a model plus its KV cache larger than the VRAM of the host's cards
    check_split_mode_row    -sm row for a model family known to fail with it
    check_systemd           instances on a host where systemd is not PID 1
"""

from __future__ import annotations

import re

from rigup.gpu.catalogue import family_of
from rigup.gpu.plan import cards_gib_text, gpu_count, vram_cards
from rigup.models import models
from rigup.refusal import Port, Refusal, config_refusals, needs_systemd, serving_exposure
from roles.llama_server.schema import instances

OVERHEAD_GIB_PER_GPU = 1.0   # llama.cpp's CUDA context and compute buffers, per card (an estimate)
ALL_LAYERS_NGL = 99          # llama.cpp's "-ngl 99": every layer on the GPUs (or -1)
_SM_ROW = re.compile(r"^(-sm|--split-mode)(=|\s+)row$")


def _instances(plan: dict, data: dict) -> dict:
    return instances(data, gpu_count(plan))[0]


def ports(plan: dict, data: dict, fleet=None) -> list[Port]:
    return [Port(inst["port"], f"llama_server_instances.{name}", ("llama-server",))
            for name, inst in _instances(plan, data).items()]


def check_config(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """An entry of llama_server_instances that is wrong: its name, an unknown or mistyped key, a
    model not in models, a bad tensor_split."""
    return config_refusals(instances(data, gpu_count(plan))[1])


def check_open_without_key(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """An instance bound beyond loopback (host, or --host in extra_args) without api_key, or an API
    key in extra_args."""
    return serving_exposure("llama_server_instances", _instances(plan, data))


def check_vram(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """An instance's weights (size_gib) plus its KV cache (ctx x the family's estimate) plus 1 GiB
    per card larger than the VRAM of the host's cards (all layers on the GPUs)."""
    per_card, unlock_hint = vram_cards(plan, data)
    entries = models(data)[0]
    found = []
    for name, inst in _instances(plan, data).items():
        model = entries[inst["model"]]
        weights = model.get("size_gib")
        if weights is None or not per_card or not (inst["ngl"] >= ALL_LAYERS_NGL or inst["ngl"] == -1):
            continue  # unsized, or layers left on the CPU: the split is llama.cpp's to make
        family = family_of(model)
        rate = family.get("kv_gib_per_1k_tokens") if family else None
        kv = (rate or 0.0) * inst["ctx"] / 1000
        overhead = OVERHEAD_GIB_PER_GPU * len(per_card)
        need, total = weights + kv + overhead, sum(per_card)
        if need <= total:
            continue
        where = f"llama_server_instances.{name}"
        kv_text = (f"KV cache {kv:.1f} GiB ({inst['ctx']:,} tokens x {rate:g} GiB per 1k, "
                   f"{family['key']} estimate from rigup/gpu/models.yml)" if rate else
                   "KV cache not counted (model family unknown)")
        found.append(Refusal(
            f"model {inst['model']} does not fit the VRAM of {where}",
            f"weights {weights:.1f} GiB + {kv_text} + {overhead:.1f} GiB overhead (1 GiB per GPU) = "
            f"{need:.1f} GiB > {total:.1f} GiB of VRAM ({cards_gib_text(per_card)})",
            f"lower {where}.ctx, pick a smaller quant, or lower ngl to keep layers on the CPU{unlock_hint}",
            "vram"))
    return found


def check_split_mode_row(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """llama.cpp row split (-sm row) for a model family known to fail with it."""
    entries = models(data)[0]
    found = []
    for name, inst in _instances(plan, data).items():
        args = inst["extra_args"]
        joined = [" ".join(args[i:i + 2]) for i in range(len(args))] + list(args)
        row = inst["split_mode"] == "row" or any(_SM_ROW.match(a) for a in joined)
        family = family_of(entries[inst["model"]])
        if not row or not family or not family.get("split_mode_row_fails"):
            continue
        error = family.get("split_mode_row_error") or "it fails at load"
        sources = f"rigup/gpu/models.yml, from {', '.join(family['sources'])}"
        why = f"llama.cpp fails to load {family['key']} with row split: \"{error}\" ({sources})"
        fix = f"set llama_server_instances.{name}.split_mode: layer (and drop -sm row from extra_args)"
        found.append(Refusal(f"llama_server_instances.{name} uses -sm row for {family['name']}", why, fix,
                             "split_mode_row"))
    return found


def check_systemd(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """llama-server instances on a host where systemd is not PID 1."""
    names = sorted(_instances(plan, data))
    return needs_systemd(facts, [f"llama_server_instances ({', '.join(names)})"] if names else [])


CHECKS = (check_config, check_open_without_key, check_systemd, check_vram, check_split_mode_row)
