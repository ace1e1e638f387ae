"""roles/llama_server's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py), and the ports its instances take. The sizes they judge and the plan lines print
are the serving plan's (the plan's ``serving``, made by preflight first: what the converge installs).

    check_config            an entry of llama_server_instances that is wrong, by key path
    check_open_without_key  an instance bound beyond loopback without an API key
    check_vram              a model plus its KV cache larger than the VRAM of its cards (a replica's)
    check_set_vram          a router's set (also) that the VRAM cannot serve: its pinned models, a
                            model alone or beside them, its models_max largest together beside them,
                            more models loaded at start than models_max
    check_replicas          more replicas x GPUs than the host has, a replica's unit or port taken,
                            a server's port outside 1024..65535
    check_split_mode_row    -sm row for a model family known to fail with it
    check_traps             an instance that meets a known llama.cpp trap of roles/llama_server/traps.yml
                            (flash attention without a CUDA kernel for its KV cache types, a
                            quantized V cache without it, -sm row on CUDA)
    check_systemd           instances on a host where systemd is not PID 1
    check_rpc               (FLEET_CHECKS, with every host's data) an instance's rpc_workers that
                            cannot serve it: not in the inventory, this host, no RPC server among
                            its llama.cpp targets, another llama_cpp_ref, no IP address; or RPC
                            with more than one replica
    check_rpc_vram          (FLEET_CHECKS) an RPC group's weights + KV cache larger than the VRAM of
                            the head's and its workers' GPUs (each worker's from its own facts)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re
from functools import lru_cache
from pathlib import Path

from rigup import traps
from rigup.boundary.numbers import number
from rigup.config import parse_form
from rigup.contract import llama_server as contract
from rigup.gpu.catalogue import family_of
from rigup.gpu.plan import Plan, build_backend, cards_gib_text, gpu_count, vram_cards
from rigup.models import flag_values, models
from rigup.refusal import (FIX_CONFIG, Fleet, Port, Refusal, config_refusals, needs_systemd, serving_exposure,
                           serving_ports)
from rigup.rpc import RPC_COST, RPC_TARGET, ip_problem, ref_problem
from rigup.units import downtrained, had_replicas, main_first, narrow, replica_name, replica_port
from roles.llama_server.command import queued
from roles.llama_server.replicas import SetPlan, Sized, for_model, layout_text, need_gib, sizes
from rigup.instances.llama_server import LlamaInstance, instances, spelled

if TYPE_CHECKING:
    from rigup.gpu.facts import Facts
    from rigup.config import Config

_SM_ROW = re.compile(rf"^({'|'.join(map(re.escape, contract.BY_KEY['split_mode'].spellings))})(=|\s+)row$")
TRAPS_FILE = Path(__file__).resolve().with_name("traps.yml")


def _instances(plan: Plan, data: Config) -> dict:
    return instances(data, gpu_count(plan))[0]


def _sized(plan: Plan, data: Config) -> dict[str, Sized]:
    """{name: replicas.Sized} of the host's valid instances: as preflight's serving plan sized them
    (the plan's ``serving``, once per host: what the converge installs). Sized here on the paths
    without one: a plan that preflight did not make (the lead's scripts, tests), and a host whose
    instances have problems, which the serving plan leaves unsized (preflight refuses the host,
    naming every refusal of the valid instances too)."""
    valid, planned = _instances(plan, data), (plan.get("serving") or {}).get("llama-server")
    if planned is not None:   # read without gpu_count, it may hold one whose tensor_split this host refuses
        return {name: planned[name].sized for name in valid}
    entries = models(data)[0]
    return {name: sizes(inst, entries[inst["model"]], plan, data, entries) for name, inst in valid.items()}


def layouts(plan: Plan, data: Config, why: bool = False) -> dict:
    """{name: (instance, replicas.Layout)} of the host's valid instances, ctx and parallel chosen
    where auto (:func:`_sized`); with ``why``, {name: (instance, layout, why rigup chose them)}."""
    return {name: (s[:3] if why else s[:2]) for name, s in _sized(plan, data).items()}


def plan_lines(plan: Plan, data: Config) -> list[str]:
    """Preflight's plan lines: each instance's layout (``glm: 4 replicas x 2 GPUs (GPU 0-1, ...)``),
    the ctx and parallel rigup chose for it and why (where they are auto), its main GPU when a
    card's link is downtrained, row or tensor split over narrow links (at or below x4 Gen3: layer
    split is preferred, and why), and for one with rpc_workers its split over the hosts and what
    RPC costs."""
    lines = []
    for name, (inst, lay, why, router) in sorted(_sized(plan, data).items()):
        lines.append(f"llama:     {layout_text(name, lay)}")
        for group in lay.groups if lay.gpu else []:
            slow = downtrained(group) if len(group) > 1 else []
            if slow and not inst["tensor_split"]:
                lines.append(f"llama:     {name}: main GPU {main_first(group)[0]['index']} (its first visible device); "
                             + ", ".join(f"GPU {c['index']} ({c['link']['why']}) last" for c in slow))
            elif slow:
                lines.append(f"llama:     {name}: GPU {slow[0]['index']} is downtrained ({slow[0]['link']['why']}); the "
                             "devices keep tensor_split's order: list a card with a full link first")
            thin = narrow(group) if len(group) > 1 and inst["split_mode"] in ("row", "tensor") else []
            if thin:
                lines.append(f"llama:     {name}: split_mode {inst['split_mode']} over narrow links ("
                             + ", ".join(f"GPU {c['index']} {c['link']['link']}" for c in thin)
                             + "): it moves activations between the cards at every layer; split_mode layer moves "
                             "them once per card and is the faster choice here (the reports' recipes chose it for "
                             "this); rigup keeps your setting")
        if why:   # ctx or parallel auto
            lines.append(f"llama:     {name}: {why}")
        if inst["also"]:
            lines += _set_lines(name, inst, router)
        if inst["rpc_workers"]:
            split = (f"shares {inst['tensor_split']} (tensor_split)" if inst["tensor_split"] else
                     "in proportion to each device's free memory")
            lines.append(f"llama:     {name}: -ngl {inst['ngl']} layers split over this host's devices and the RPC "
                         f"workers {', '.join(inst['rpc_workers'])} ({split}); {RPC_COST}")
    return lines


def _set_lines(name: str, inst: LlamaInstance, router: SetPlan) -> list[str]:
    """A router's lines: the models_max rigup chose and why (where auto), and each pinned model's
    own server."""
    lines = [f"llama:     {name}: router {router.why}"] if router.why else []
    for model, port in contract.pinned(inst).items():
        need = router.needs[model]
        lines.append(f"llama:     {name}: pinned {model} on its own server rigup-llama@"
                     f"{contract.PINNED_UNIT.format(name, model)} at {inst['host']}:{port} (the router's cards"
                     + (f", {need.total:.1f} GiB" if need else "") + "), never evicted")
    return lines


def ports(plan: Plan, data: Config, fleet=None) -> list[Port]:
    """Each instance's port (with replicas: its balancer's, which takes over the port of a single
    server it replaces; a single server takes it back from the balancer of the replicas it
    replaces: rigup-llama@NAME-K units on the host) and each replica's loopback port (port + 1 + K)."""
    found, laid = [], layouts(plan, data)
    for name, (inst, lay) in laid.items():
        where = f"llama_server_instances.{name}"
        if lay.replicas == 1 and queued(inst):   # a router behind its queue: HAProxy on the port, the router on +1
            found += [Port(inst["port"], f"{where} (its queue)", ("haproxy", "llama-server")),
                      Port(replica_port(inst, 0), f"{where} (its router)", ("llama-server",))]
            continue
        if lay.replicas == 1:
            balanced = had_replicas("rigup-llama", name, plan.get("serving_units") or [])
            found.append(Port(inst["port"], where, ("llama-server", "haproxy") if balanced else ("llama-server",)))
            continue
        found.append(Port(inst["port"], f"{where} (its balancer)", ("haproxy", "llama-server")))
        found += [Port(replica_port(inst, k), f"{where} (replica {k})", ("llama-server",))
                  for k in range(lay.replicas)]
    return found + [Port(port, f"llama_server_instances.{name} (pinned {model})", ("llama-server",))
                    for name, (inst, _) in laid.items()
                    for model, port in contract.pinned(inst).items()]   # a router's pinned models, each its server


def check_config(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    return config_refusals(instances(data, gpu_count(plan))[1])


check_config.__doc__ = (   # the flags from the contract's table (rigup/contract/llama_server.py), as docs/refusals.md shows them
    "An entry of llama_server_instances that is wrong: its name, an unknown or mistyped key, a model not in models, "
    "a bad tensor_split, or extra_args giving a flag rigup sets from the instance (" + ", ".join(
        sorted(contract.owned(), key=lambda s: (s.lstrip("-").lower(), s)))
    + "; ``--port=1`` and ``--api_key_file`` too), or a flag of llama-server's features beyond inference that "
    "llama_server_allow does not name (" + ", ".join(
        f"{name}: {' '.join(f.flags)}" for name, f in contract.HELD_OFF.items() if f.flags)
    + "), or a value that carries credentials (https://user:token@..., ?token=...: in extra_args it would stand in "
    "the server's command line); llama_server_cors_origins that is not one origin.")


def check_open_without_key(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An instance bound beyond loopback (its host: another address, a wildcard such as 0.0.0.0,
    ::0) without api_key."""
    return serving_exposure("llama_server_instances", _instances(plan, data))


def check_vram(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An instance's weights (size_gib) plus its KV cache (ctx x the family's estimate) plus 1 GiB
    per card larger than the VRAM of its cards: all the host's, or one replica's group (all layers
    on the GPUs)."""
    per_card, unlock_hint = vram_cards(plan, data)
    found = []
    for name, (inst, lay) in layouts(plan, data).items():
        vram = {c["index"]: gib for c, gib in zip(plan.get("cards", []), per_card)}
        group = [vram[c["index"]] for c in lay.groups[0]] if lay.gpu and lay.groups else per_card
        own = for_model(inst, inst["model"])   # a router's own model at its own flags (per_model)
        need = need_gib(models(data)[0][inst["model"]], own, len(group))
        if inst["rpc_workers"]:
            continue  # layers go to the workers' devices too: check_rpc_vram, with their plans
        if need is None or not group or need.total <= sum(group):
            continue  # unsized, or layers left on the CPU: the split is llama.cpp's to make
        where = f"llama_server_instances.{name}"
        source = (f"{need.family['key']} estimate from rigup/gpu/models.yml" if need.family else
                  "f16 estimate from the model's GGUF header")
        kv_text = (f"KV cache {need.kv:.1f} GiB ({own['ctx']:,} tokens x {need.kv_rate:g} GiB per 1k, "
                   f"{source})" if need.kv_rate else
                   "KV cache not counted (model family unknown)")
        of = f" per replica ({lay.replicas} replicas)" if lay.replicas > 1 else ""
        found.append(Refusal(
            f"model {inst['model']} does not fit the VRAM of {where}",
            f"weights {need.weights:.1f} GiB + {kv_text} + {need.overhead:.1f} GiB overhead (1 GiB per GPU) = "
            f"{need.total:.1f} GiB > {sum(group):.1f} GiB of VRAM{of} ({cards_gib_text(group)})",
            f"lower {where}.ctx, pick a smaller quant, give each replica more GPUs (gpus_per_replica: auto), "
            f"or lower ngl to keep layers on the CPU{unlock_hint}", "vram"))
    return found


def check_set_vram(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A router's set (``also``) that the VRAM of its cards cannot serve (each model at its weights
    + KV cache at its ctx + 1 GiB per GPU: the CUDA context of its own child process or server):
    its pinned models together; a model it loads that does not fit alone, or beside its pinned
    models (the instance's own alone: check_vram); its ``models_max`` largest together beside the
    pinned ones (models_max set; auto counts only what fits); or more models loaded at start
    (the instance's own and those with ``load_on_startup``) than ``models_max``, naming them."""
    _, unlock_hint = vram_cards(plan, data)
    found = []
    for name, (inst, _, _, router) in _sized(plan, data).items():
        if not inst["also"]:
            continue
        where = f"llama_server_instances.{name}"
        startup = [m for m in router.routed if m == inst["model"]
                   or (inst["per_model"].get(m) or {}).get("load_on_startup")]
        if len(startup) > router.models_max:
            how = (router.why if router.why else f"models_max {router.models_max} is set")
            found.append(Refusal(
                f"{len(startup)} models of {where} load at its start ({', '.join(startup)}), more than it holds at "
                f"once", f"{how}: the router would evict one of them as the next loads",
                f"drop load_on_startup from {where}.per_model of "
                f"{' or '.join(m for m in startup if m != inst['model'])}, or give it more VRAM", "vram"))
        if not router.known():
            continue  # unsized, or layers left on the CPU
        needs, pins, budget = router.needs, router.pinned, sum(router.cards)
        vram = f"{budget:.1f} GiB of VRAM ({cards_gib_text(router.cards)})"
        pinned_total = sum(needs[m].total for m in pins)
        beside = (f"{vram} - pinned " + " + ".join(f"{m} {needs[m].total:.1f} GiB" for m in pins)
                  + f" = {router.free:.1f} GiB") if pins else vram
        if pins and pinned_total > budget:
            one = needs[pins[0]]
            found.append(Refusal(
                f"the pinned models of {where} do not fit the VRAM together" if len(pins) > 1 else
                f"pinned model {pins[0]} of {where} does not fit the VRAM",
                (" + ".join(f"{m} {needs[m].total:.1f} GiB" for m in pins) if len(pins) > 1 else
                 f"weights {one.weights:.1f} GiB + KV cache {one.kv:.1f} GiB + {one.overhead:.1f} GiB overhead")
                + f" = {pinned_total:.1f} GiB > {vram}",
                f"unpin {' or '.join(pins)} ({where}.per_model), or pick smaller quants{unlock_hint}", "vram"))
            continue
        alone = [m for m in router.routed if needs[m].total > router.free and (pins or m != inst["model"])]
        for m in alone:
            ctx = f"{where}.{f'per_model.{m}.' if 'ctx' in (inst['per_model'].get(m) or {}) else ''}ctx"
            figures = (f"weights {needs[m].weights:.1f} GiB + KV cache {needs[m].kv:.1f} GiB + "
                       f"{needs[m].overhead:.1f} GiB overhead = {needs[m].total:.1f} GiB > {beside}")
            if pins:
                found.append(Refusal(f"model {m} of {where} does not fit beside its pinned "
                                     f"{', '.join(pins)}", figures,
                                     f"unpin {' or '.join(pins)} ({where}.per_model), drop {m} from the set, pick a "
                                     f"smaller quant, or lower {ctx}{unlock_hint}", "vram"))
            else:
                found.append(Refusal(f"model {m} of {where}.also does not fit the VRAM alone", figures,
                                     f"drop {m} from {where}.also, pick a smaller quant, or lower {ctx}{unlock_hint}",
                                     "vram"))
        largest = router.largest()[:router.models_max]
        total = sum(needs[m].total for m in largest)
        if len(largest) > 1 and total > router.free and not alone:
            found.append(Refusal(
                f"the {len(largest)} largest models of {where} do not fit the VRAM together (models_max "
                f"{inst['models_max']})", " + ".join(f"{m} {needs[m].total:.1f} GiB" for m in largest)
                + f" (weights, KV cache, 1 GiB per GPU for each child's CUDA context) = {total:.1f} GiB > {beside}",
                f"lower {where}.models_max or set it to auto (models are then swapped), pick smaller quants, or "
                f"lower {where}.ctx", "vram"))
    return found


def check_replicas(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """More replicas x gpus_per_replica than the host has GPUs, a main_gpu beyond a server's own
    GPUs, a unit name (NAME, a replica's NAME-K, a pinned model's NAME.M) that two instances give, or
    a server's port outside 1024..65535 (its port, a replica's port + 1 + K, a pinned model's port +
    2 + i: llama-server runs as the unprivileged rigup user)."""
    found = []
    all_layouts = layouts(plan, data)
    for name, (inst, lay) in all_layouts.items():
        where = f"llama_server_instances.{name}"
        found += serving_ports(where, "llama-server", inst, lay.replicas)
        past = {m: p for m, p in contract.pinned(inst).items() if p > 65535}
        if past:
            found.append(Refusal(f"{where}.per_model: pinned {', '.join(past)} from port {inst['port']}",
                                 f"a pinned model listens on port + 2 + i: {', '.join(map(str, past.values()))}, "
                                 "past 65535", f"lower {where}.port", "ports"))
        if lay.problem:
            found.append(Refusal(f"{where} cannot be laid out: {layout_text(name, lay)}", lay.problem,
                                 f"lower {where}.replicas or gpus_per_replica, or set them to auto", "replicas"))
        per = len(lay.groups[0]) if lay.gpu and lay.groups else 0
        if inst.get("main_gpu") is not None and per and inst["main_gpu"] >= per:
            found.append(Refusal(f"{where}.main_gpu is {inst['main_gpu']}, but each of its servers has {per} GPU"
                                 f"{'s' * (per > 1)} (0..{per - 1})", "-mg counts the server's own GPUs, in order",
                                 f"set {where}.main_gpu below {per}, or null", "replicas"))
    owners: dict[str, list[str]] = {}   # every server's name (its unit, its watchdog and relay entry) -> instances
    for name, (inst, lay) in all_layouts.items():
        for unit in unit_names(name, inst, lay.replicas):
            owners.setdefault(unit, []).append(name)
    for unit, names in sorted(owners.items()):
        if len(names) > 1:
            found.append(Refusal(f"{' and '.join(f'llama_server_instances.{n}' for n in names)} would both be "
                                 f"rigup-llama@{unit}", "each replica K runs as rigup-llama@NAME-K, a pinned "
                                 "model M as rigup-llama@NAME.M: two servers of one unit share its drop-in and "
                                 "one entry of the watchdog and the metrics relay", FIX_CONFIG, "replicas"))
    return found


def unit_names(name: str, inst: LlamaInstance, replicas: int) -> set[str]:
    """The names an instance's servers go by (rigup-llama@NAME, its replicas NAME-K, its pinned
    models NAME.M) and the instance's own: derived names of two instances may be equal (router
    ``a`` pinning ``b.c`` and router ``a.b`` pinning ``c`` are both a.b.c), so all are compared."""
    units = {name, *(replica_name(name, k) for k in range(replicas) if replicas > 1)}
    return units | {contract.PINNED_UNIT.format(name, m) for m in contract.pinned(inst)}


def check_split_mode_row(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
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


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """llama-server instances on a host where systemd is not PID 1."""
    names = sorted(_instances(plan, data))
    return needs_systemd(facts, [f"llama_server_instances ({', '.join(names)})"] if names else [])


def _worker_problems(worker: str, fleet: Fleet, data: Config) -> list[tuple[str, str]]:
    """(why, fix) for each reason ``worker`` cannot be an RPC worker of this host."""
    other = fleet.hosts.get(worker)
    if worker == fleet.me:
        return [(f"{worker} is this host itself", "name other hosts of the inventory")]
    if other is None:
        return [(f"{worker!r} is not a host of this inventory", "name a host of the inventory")]
    found = [(ip_problem(h, d), "use IP addresses in the inventory") for h, d in ((fleet.me, data), (worker, other))]
    found.append((ref_problem(fleet.me, data, worker, other), f"set the same llama_cpp_ref on {fleet.me} and {worker}"))
    if RPC_TARGET not in (other.get("llama_cpp_targets") or []):
        found.append((f"{worker} does not build {RPC_TARGET} (its llama_cpp_targets), so it cannot run rigup-rpc",
                      f"add {RPC_TARGET} to llama_cpp_targets of {worker}"))
    return [(why, fix) for why, fix in found if why]


def check_rpc(plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """An instance with rpc_workers that cannot work: a worker not in the inventory (``fleet``),
    this host itself, one without the RPC server, with another llama_cpp_ref, or whose address
    (or this host's) is no IP address; or RPC with more than one replica."""
    found = []
    for name, (inst, lay) in layouts(plan, data).items():
        where = f"llama_server_instances.{name}.rpc_workers"
        if not inst["rpc_workers"]:
            continue
        if lay.replicas > 1:
            found.append(Refusal(f"{where} with {lay.replicas} replicas", "RPC workers serve one server's layers",
                                 f"set llama_server_instances.{name}.replicas: 1, or drop rpc_workers", "rpc"))
        for worker in inst["rpc_workers"] if fleet else []:
            found += [Refusal(f"{where}: {worker}", why, fix, "rpc") for why, fix in _worker_problems(worker, fleet, data)]
    return found


def _worker_cards(plan: Plan, data: Config) -> list[float]:
    """VRAM per card (GiB) a worker's RPC server uses: its cards, or those of
    ``rpc_worker_cuda_devices`` (indexes or UUIDs)."""
    per_card, _ = vram_cards(plan, data)
    chosen = data.get("rpc_worker_cuda_devices")
    if not chosen:
        return per_card
    wanted = {w.strip() for w in str(chosen).split(",")}
    return [gib for card, gib in zip(plan.get("cards", []), per_card)
            if str(card["index"]) in wanted or card.get("uuid") in wanted]


def rpc_groups(plan: Plan, data: Config, fleet: Fleet | None) -> list[dict]:
    """Each instance with rpc_workers as a group: ``name``, ``need`` (replicas.need_gib over every
    card of the group, or None: unsized, layers on the CPU, or a worker's GPUs unknown), ``parts``
    ([(host, [GiB per card])], the head first) and ``unknown`` (workers whose plan cannot be read);
    none without a fleet that reads plans."""
    if not fleet or not fleet.plan_of:
        return []
    per_card, _ = vram_cards(plan, data)
    entries = models(data)[0]
    found = []
    for name, (inst, lay) in sorted(layouts(plan, data).items()):
        workers = [w for w in inst["rpc_workers"] if w in fleet.hosts and w != fleet.me]
        if not inst["rpc_workers"] or len(workers) < len(inst["rpc_workers"]):
            continue   # not a group, or check_rpc refuses the worker
        parts, unknown = [(fleet.me, per_card)], []
        for worker in workers:
            wplan = fleet.plan_of(worker)
            if wplan is None:
                unknown.append(worker)
            else:
                parts.append((worker, _worker_cards(wplan, fleet.hosts[worker])))
        cards = sum(len(p) for _, p in parts)
        need = need_gib(entries[inst["model"]], inst, cards) if cards and not unknown else None
        found.append({"name": name, "inst": inst, "need": need, "parts": parts, "unknown": unknown})
    return found


def _split_text(group: dict) -> str:
    """``rig-01 2 x 8.0 GiB (~14.0 GiB) + rig-02 6 x 8.0 GiB (~42.0 GiB) = 64.0 GiB``: each host's
    VRAM and its share of the need (llama.cpp splits in proportion to the devices' memory)."""
    total = sum(sum(p) for _, p in group["parts"])
    need = group["need"].total if group["need"] else 0.0
    shares = [f"{h} {cards_gib_text(p) if p else 'no GPU'}"
              + (f" (~{need * sum(p) / total:.1f} GiB)" if need and total else "") for h, p in group["parts"]]
    return " + ".join(shares) + f" = {total:.1f} GiB"


def fleet_plan_lines(plan: Plan, data: Config, fleet: Fleet | None = None) -> list[str]:
    """Preflight's lines for each RPC group: what it needs and how it splits over the hosts."""
    lines = []
    for g in rpc_groups(plan, data, fleet):
        if g["unknown"]:
            lines.append(f"llama:     {g['name']}: VRAM of RPC workers {', '.join(g['unknown'])} not known")
        elif g["need"]:
            need = g["need"]
            lines.append(f"llama:     {g['name']}: RPC group needs {need.total:.1f} GiB (weights {need.weights:.1f} + "
                         f"KV {need.kv:.1f} + overhead {need.overhead:.1f}) over {_split_text(g)}")
    return lines


def check_rpc_vram(plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """An RPC group (an instance and its rpc_workers) whose weights + KV cache + 1 GiB per GPU is
    more than the VRAM of the head's and the workers' GPUs, or a worker whose GPUs cannot be read."""
    found = []
    for g in rpc_groups(plan, data, fleet):
        where = f"llama_server_instances.{g['name']}"
        if g["unknown"]:
            found.append(Refusal(f"{where}.rpc_workers: the VRAM of {', '.join(g['unknown'])} cannot be read",
                                 "the group's VRAM plan needs each worker's GPUs (its facts)",
                                 f"make {', '.join(g['unknown'])} reachable and in the run", "vram"))
        elif g["need"] and g["need"].total > sum(sum(p) for _, p in g["parts"]):
            need = g["need"]
            found.append(Refusal(
                f"model {g['inst']['model']} does not fit the VRAM of {where} and its RPC workers",
                f"weights {need.weights:.1f} GiB + KV cache {need.kv:.1f} GiB + {need.overhead:.1f} GiB overhead "
                f"(1 GiB per GPU) = {need.total:.1f} GiB > {_split_text(g)}",
                f"add hosts to {where}.rpc_workers, lower {where}.ctx, or pick a smaller quant", "vram"))
    return found


# The settings of an instance a trap's condition reads, as llama-server gets them: the key, or the
# same flag given again in extra_args (the last one wins; the contract's policy ``also``), with the
# values llama.cpp takes (the key's choices; None: a number).
_SETTINGS = {f.key: (set(f.spellings), parse_form(f.form).choices or None)
             for f in contract.FLAGS if f.policy == contract.ALSO}
_KV = ("cache_type_k", "cache_type_v")
_CMAKE_TRUE = ("ON", "1", "TRUE", "YES", "Y")
_BACKENDS = ("cuda", "cpu")


def _types(value) -> bool:
    return isinstance(value, list) and bool(value) and all(v in contract.CACHE_TYPES for v in value)


# condition key -> (what its value must be, the instance settings it reads, whether it holds for
# (settings, value, context)); roles/llama_server/traps.yml documents each.
_CONDITIONS = {
    "backend": (lambda v: isinstance(v, list) and bool(v) and set(v) <= set(_BACKENDS), (),
                lambda s, v, c: c["backend"] in v),
    "flash_attn": (lambda v: isinstance(v, list) and bool(v) and set(v) <= set(_SETTINGS["flash_attn"][1]),
                   ("flash_attn",), lambda s, v, c: s["flash_attn"][0] in v),
    "split_mode": (lambda v: isinstance(v, list) and bool(v) and set(v) <= set(_SETTINGS["split_mode"][1]),
                   ("split_mode",), lambda s, v, c: s["split_mode"][0] in v),
    "gpu_layers": (lambda v: isinstance(v, bool), ("ngl",), lambda s, v, c: (s["ngl"][0] != 0) == v),
    "kv_types_in": (_types, _KV, lambda s, v, c: s["cache_type_k"][0] in v and s["cache_type_v"][0] in v),
    "kv_types_not_in": (_types, _KV, lambda s, v, c: s["cache_type_k"][0] not in v or s["cache_type_v"][0] not in v),
    "kv_not_pair_of": (_types, _KV, lambda s, v, c: not (s["cache_type_k"][0] == s["cache_type_v"][0] and
                                                         s["cache_type_k"][0] in v)),
    "v_type_not_in": (_types, ("cache_type_v",), lambda s, v, c: s["cache_type_v"][0] not in v),
    "family_flag_unset": (lambda v: isinstance(v, str) and bool(v), (),
                          lambda s, v, c: not (c["family"] or {}).get(v)),
}


@lru_cache(maxsize=None)
def catalogue(path: Path = TRAPS_FILE) -> tuple[traps.Trap, ...]:
    """The traps of roles/llama_server/traps.yml (rigup/traps.py), each condition's values checked
    too: ValueError naming the file and the entry for one that is wrong (a bug in the catalogue)."""
    found = traps.load(path, _CONDITIONS)
    for n, trap in enumerate(found, 1):
        for key, value in trap.condition.items():
            if not _CONDITIONS[key][0](value):
                raise ValueError(f"{path}: entry {n} ({trap.id}): condition.{key}: {value!r} is not a value of {key} "
                                 f"(see the keys at the top of {path.name})")
    return found


def settings(inst: LlamaInstance) -> dict[str, tuple]:
    """{setting: (value, how it is set)} of an instance as llama-server runs it: flash_attn,
    split_mode and ngl (from extra_args when given there again: the last one wins), the KV cache
    types (null is f16); ``how``: ``cache_type_k q4_1`` or ``extra_args -sm row``."""
    out: dict[str, tuple] = {}
    for key, (flags, allowed) in _SETTINGS.items():
        out[key] = (inst[key], f"{key} {inst[key]}")
        for flag, value in flag_values(spelled(inst["extra_args"]), flags):   # --n_gpu_layers too, as llama.cpp
            if value is None:
                continue
            if allowed is None:   # -ngl N, or all / auto: layers on the GPUs
                value = value if number(value, int) is None else number(value, int)
            if allowed is None or value in allowed:
                out[key] = (value, f"extra_args {flag} {value}")
    for key in _KV:
        out[key] = (inst.get(key) or "f16", f"{key} {inst.get(key) or 'f16'}")
    return out


def _cmake_sets(options: list, entry: str) -> bool:
    """Whether ``options`` (llama_cpp_cmake_options, NAME=VALUE, also -DNAME:TYPE=VALUE) set
    ``entry`` (NAME=VALUE; a CMake true, ON, when VALUE is one): the last setting of NAME counts."""
    name, want = entry.split("=", 1)
    value = None
    for option in options or []:
        key, sep, val = str(option).removeprefix("-D").partition("=")
        if sep and key.split(":", 1)[0] == name:
            value = val
    if value is None:
        return False
    return value.upper() in _CMAKE_TRUE if want.upper() in _CMAKE_TRUE else value == want


def _remedied(trap: traps.Trap, inst: LlamaInstance, data: Config) -> bool:
    """Whether the trap's remedy is in place: its build option set, its server flag given."""
    kind, value = trap.remedy.kind, trap.remedy.value
    if kind == "build_option":
        return _cmake_sets(data.get("llama_cpp_cmake_options"), value)
    if kind == "server_flag":
        return bool(flag_values(inst["extra_args"], {value}))
    return False


def _met_text(where: str, trap: traps.Trap, found: dict, backend: str) -> str:
    """What a met trap's refusal names: the settings of its condition's first key that reads any,
    as key paths (``llama_server_instances.glm.cache_type_k/cache_type_v q4_1/q4_1``), the others
    after ``with``, and the build's backend."""
    reads = [_CONDITIONS[key][1] for key in trap.condition if _CONDITIONS[key][1]]
    head = reads[0] if reads else ()
    rest = list(dict.fromkeys(k for keys in reads[1:] for k in keys if k not in head))
    if len(head) > 1:   # the KV cache types: keys only (extra_args may not set them)
        text = f"{where}.{'/'.join(head)} {'/'.join(str(found[k][0]) for k in head)}"
    else:
        text = f"{where}.{found[head[0]][1]}" if head else where
    if rest:
        text += " with " + ", ".join(found[k][1] for k in rest)
    if "backend" in trap.condition:
        text += f" on a {backend.upper() if backend == 'cuda' else backend} build"
    return text


def check_traps(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An instance that meets a known llama.cpp trap (roles/llama_server/traps.yml): flash
    attention over KV cache types the CUDA build has no kernel for (attention on the CPU, or FA
    turned off), a quantized V cache without flash attention (llama-server exits), -sm row on a
    CUDA build (no split buffers); unless the trap's build option or server flag is set."""
    backend = build_backend(plan, data)
    entries = models(data)[0]
    found = []
    for name, inst in sorted(_instances(plan, data).items()):
        where = f"llama_server_instances.{name}"
        now = settings(inst)
        context = {"backend": backend, "family": family_of(entries[inst["model"]])}
        for trap in catalogue():
            if not all(_CONDITIONS[key][2](now, value, context) for key, value in trap.condition.items()):
                continue
            if _remedied(trap, inst, data):
                continue
            found.append(Refusal(_met_text(where, trap, now, backend),
                                 f"{trap.summary} (llama.cpp trap {trap.id}: {trap.ref})",
                                 trap.remedy.fix.replace("{instance}", where), "traps"))
    return found


CHECKS = (check_config, check_open_without_key, check_systemd, check_vram, check_set_vram, check_replicas,
          check_split_mode_row, check_traps)
FLEET_CHECKS = (check_rpc, check_rpc_vram)
