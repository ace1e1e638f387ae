"""How an instance of llama_server_instances is laid out on a host's GPUs: pure functions of the
instance, its model, the plan and the host's data (no pyinfra: tests/gpu and the lead's scripts
import it on machines without it).

- ``replicas: 1`` and ``gpus_per_replica: null`` (the defaults): one server over all the host's
  GPUs, as before.
- ``gpus_per_replica: auto``: the fewest GPUs whose VRAM holds the weights, the KV cache
  (ctx x the family's estimate: llama.cpp's ``-c`` is the context of all slots together) and
  1 GiB per GPU (:func:`need_gib`, the arithmetic check_vram refuses with).
- ``replicas: auto``: as many replicas of that many GPUs as the host has; a model that needs more
  than half the GPUs keeps today's single server split over all of them.
- On a host whose llama.cpp is built for the CPU (or without GPUs): ``replicas: N`` servers, no
  pinning.

- ``ctx`` and ``parallel`` left ``auto`` (their defaults): :func:`sizing`, on one replica's GPUs
  (slots of 8,192 tokens, as many as the VRAM left after the weights holds, at most 32; the plan
  prints why); :func:`sizes` gives the instance with both chosen, its layout and a router's set
  plan (:class:`Sized`), once per host: preflight's serving plan keeps it for the converge, the
  refusals and the plan lines.

Replica K (0-based) of instance NAME is the unit ``rigup-llama@NAME-K``, bound to loopback on
port ``port + 1 + K`` (roles/llama_server/command.py: ``replica_port``, ``servers``); the
instance's own host:port is the balancer's (roles/balancer), which spreads requests over them.
This module imports nothing of the role: load it by its path where pyinfra is missing.
"""

from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

from rigup.gpu.catalogue import family_of
from rigup.gpu.plan import Plan, build_backend, vram_cards
from rigup.contract.llama_server import pinned
from rigup.refusal import gpus_text

if TYPE_CHECKING:
    from rigup.models import ModelEntry
    from rigup.instances.llama_server import LlamaInstance
    from rigup.config import Config

OVERHEAD_GIB_PER_GPU = 1.0   # llama.cpp's CUDA context and compute buffers, per card (an estimate)
ALL_LAYERS_NGL = 99          # llama.cpp's "-ngl 99": every layer on the GPUs (or -1)
# ctx and parallel left to rigup (``auto``, their defaults): slots of SLOT_TOKENS (or the model's
# trained context when shorter), as many as KV_SHARE of the VRAM left after the weights and the
# overhead holds, at most MAX_SLOTS. On one H200 (issue 28: an 8B-shaped F16 model, 400-token
# chats) the slot count sized to the concurrency was almost all of the gain: 32 slots of 8,192
# tokens served 32 concurrent requests 12.9x faster than -c 8192 --parallel 1 and 2.9x faster than
# the reports' -c 65536 --parallel 8; beyond the concurrency a fleet sends, slots only hold VRAM.
SLOT_TOKENS = 8192
MAX_SLOTS = 32
MAX_TOKENS = 1 << 40         # KV cache tokens the VRAM holds, at most (a sizing's figure, never a server's)
KV_SHARE = 0.8               # the rest: compute buffers, which grow with the slots and the batch


class Need(NamedTuple):
    """What an instance needs in VRAM over ``cards`` GPUs, in GiB (``kv_rate``: GiB per 1k tokens
    of the model's family, or of its GGUF header when the family is unknown; None when neither)."""

    total: float
    weights: float
    kv: float
    overhead: float
    kv_rate: float | None
    family: dict | None


class Layout(NamedTuple):
    """Where an instance's servers go: ``groups`` (one list of cards per replica, each card a plan
    card; ``[]`` per replica on the CPU), ``gpu`` (whether they are pinned to GPUs), ``idle`` (the
    indexes of cards no replica takes) and ``problem`` (why this layout cannot be, or None)."""

    groups: list[list[dict]]
    gpu: bool
    idle: list[int]
    problem: str | None = None
    pinned: bool = False    # cards are quarantined (roles/burnin): every server names its cards

    @property
    def replicas(self) -> int:
        return len(self.groups)


class Sizing(NamedTuple):
    """An instance's ``ctx`` (every slot's tokens together, llama.cpp's ``-c``) and ``parallel``
    (its slots), ``why`` rigup chose them (None: the instance set both), and ``cache_ram`` (0 when
    rigup sized several slots from the VRAM and the instance left ``cache_ram`` unset: llama-server
    then copies a used slot's state into its host-RAM prompt cache before each new task, which held
    new requests back 1.7 s on the H200 and cost 1.41x at 32 concurrent,
    tests/gpu/results/2026-12-02-h200-admission.md; None: leave it as it is)."""

    ctx: int
    parallel: int
    why: str | None
    cache_ram: int | None = None


def _kv_rate(model: ModelEntry) -> float | None:
    family = family_of(model)   # else the GGUF header's figure, read on the controller (model_fetch)
    return family.get("kv_gib_per_1k_tokens") if family else (model.get("gguf") or {}).get("kv_gib_per_1k_tokens")


def slot_tokens(model: ModelEntry) -> int:
    """SLOT_TOKENS, or the model's trained context (its GGUF header) when that is shorter."""
    trained = (model.get("gguf") or {}).get("context_length")
    return min(SLOT_TOKENS, trained) if isinstance(trained, int) and trained > 0 else SLOT_TOKENS


def sizing(inst: LlamaInstance, model: ModelEntry, group_gib: list[float]) -> Sizing:
    """The instance's ctx and parallel where it left them ``auto``, for a server on GPUs of
    ``group_gib`` GiB each ([]: on the CPU, or the layers' place is llama.cpp's to choose)."""
    ctx, parallel, slot = inst["ctx"], inst["parallel"], slot_tokens(model)
    if ctx != "auto" and parallel != "auto":
        return Sizing(ctx, parallel, None)
    if ctx != "auto":
        n = max(1, min(MAX_SLOTS, ctx // slot))
        return Sizing(ctx, n, f"{n} slot{'s' * (n > 1)} of {ctx // n:,} tokens (ctx {ctx:,} is set; parallel: one "
                              f"slot per {slot:,} tokens, at most {MAX_SLOTS})")
    if parallel != "auto":
        return Sizing(parallel * slot, parallel, f"ctx {parallel * slot:,} = {parallel} slot"
                                                 f"{'s' * (parallel > 1)} x {slot:,} tokens (parallel is set)")
    weights, rate = model.get("size_gib"), _kv_rate(model)
    whole = inst["ngl"] >= ALL_LAYERS_NGL or inst["ngl"] == -1
    if not group_gib or weights is None or not rate or not whole or inst.get("rpc_workers"):
        reason = ("on the CPU" if not group_gib else "layers on RPC workers" if inst.get("rpc_workers") else
                  "layers left on the CPU (ngl)" if not whole else
                  "the model's size is not known" if weights is None else "its KV cache per token is not known")
        return Sizing(slot, 1, f"1 slot of {slot:,} tokens ({reason}: rigup sizes slots from the VRAM only)")
    free = sum(group_gib) - weights - OVERHEAD_GIB_PER_GPU * len(group_gib)
    held_tokens = max(free, 0.0) * KV_SHARE / rate * 1000   # a rate near 0 (5e-324) gives inf: int() raised
    tokens = int(min(held_tokens, MAX_TOKENS)) if held_tokens == held_tokens else 0   # and NaN: none
    held = (f"{free:.1f} GiB of VRAM left after the weights ({weights:.1f} GiB) and {len(group_gib):g} GiB overhead "
            f"holds {tokens / 1000:,.0f}k tokens of KV cache at {rate:g} GiB per 1k in {KV_SHARE:.0%} of it")
    if tokens < slot:
        ctx = tokens // 1024 * 1024 or slot   # 0: check_vram refuses, naming the figures
        return Sizing(ctx, 1, f"1 slot of {ctx:,} tokens: {held}")
    n = min(MAX_SLOTS, tokens // slot)
    capped = f"; at most {MAX_SLOTS} slots" if n == MAX_SLOTS and tokens // slot > MAX_SLOTS else ""
    why = f"ctx {n * slot:,} = {n} slot{'s' * (n > 1)} x {slot:,} tokens: {held}{capped}"
    if n > 1 and inst.get("cache_ram") is None:
        return Sizing(n * slot, n, f"{why}; cache_ram 0: with {n} slots the host-RAM prompt cache delays new "
                                   "requests", 0)
    return Sizing(n * slot, n, why)


def group_gib(lay: Layout, plan: Plan, data: Config) -> list[float]:
    """GiB of each card of the layout's first server ([]: on the CPU)."""
    if not (lay.gpu and lay.groups and lay.groups[0]):
        return []
    vram = dict(zip((c["index"] for c in plan.get("cards", [])), vram_cards(plan, data)[0]))
    return [vram[c["index"]] for c in lay.groups[0] if c["index"] in vram]


def set_cards(lay: Layout, plan: Plan, data: Config) -> list[float]:
    """GiB of each card a router's set is planned on: its server's, or on a CPU build the host's
    (as check_vram counts them: the VRAM plan holds wherever every layer is asked on the GPUs)."""
    return group_gib(lay, plan, data) if lay.gpu else vram_cards(plan, data)[0]


class Sized(NamedTuple):
    """An instance as rigup serves it on a host, sized once (preflight's serving plan keeps it:
    rigup.serving ``Served.sized``): ``inst`` with ``ctx`` and ``parallel`` chosen where ``auto``
    (:func:`sizing`, on one replica's GPUs; ``cache_ram`` with them where sizing sets it) and a
    router's ``models_max`` where ``auto``, its ``layout``, ``why`` ctx and parallel were chosen
    (None: both set), and a router's ``router`` (:func:`set_plan` of its set on its cards, with
    ``models_max`` as the instance gives it; None: no router, or no ``entries`` to plan it)."""

    inst: dict
    layout: Layout
    why: str | None
    router: SetPlan | None


def sizes(inst: LlamaInstance, model: ModelEntry, plan: Plan, data: Config,
          entries: dict[str, ModelEntry] | None = None) -> Sized:
    """The instance sized on this host (:class:`Sized`); ``entries``, the host's models, plan a
    router's set (needed where its models_max is ``auto``)."""
    lay = layout(inst, model, plan, data)
    size = sizing(inst, model, group_gib(lay, plan, data))
    out = {**inst, "ctx": size.ctx, "parallel": size.parallel} | \
        ({} if size.cache_ram is None else {"cache_ram": size.cache_ram})
    router = None
    if inst.get("also") and (entries is not None or inst["models_max"] == "auto"):
        if entries is None:
            raise ValueError("a router's models_max auto is chosen from its set's models: give sized() the entries")
        router = set_plan(out, entries, set_cards(lay, plan, data))   # type: ignore[arg-type]
        out["models_max"] = router.models_max   # the instance's, or the one chosen where auto
    return Sized(out, lay, size.why, router)


def sized(inst: LlamaInstance, model: ModelEntry, plan: Plan, data: Config,
          entries: dict[str, ModelEntry] | None = None) -> tuple[dict, Layout, str | None]:
    """The instance sized, its layout, and why (:func:`sizes` without a router's set plan)."""
    return sizes(inst, model, plan, data, entries)[:3]


chosen = sized   # its former name: what it chose laid over the instance, which laid over the instance again is itself


def for_model(inst: LlamaInstance, key: str) -> LlamaInstance:
    """The instance as model ``key`` of its router set runs: its own flags (per_model) over the
    instance's."""
    return {**inst, **((inst.get("per_model") or {}).get(key) or {})}  # type: ignore[typeddict-item]


def need_gib(model: ModelEntry, inst: LlamaInstance, cards: int) -> Need | None:
    """VRAM the instance needs on ``cards`` GPUs; None when it cannot be told (the model has no
    size_gib, or layers stay on the CPU: the split is llama.cpp's to make)."""
    weights = model.get("size_gib")
    if weights is None or not (inst["ngl"] >= ALL_LAYERS_NGL or inst["ngl"] == -1):
        return None
    rate = _kv_rate(model)
    kv = (rate or 0.0) * inst["ctx"] / 1000
    overhead = OVERHEAD_GIB_PER_GPU * cards
    return Need(weights + kv + overhead, weights, kv, overhead, rate, family_of(model))


class SetPlan(NamedTuple):
    """A router's set (``also``) on its cards (``cards``: GiB each): ``needs`` (model -> its Need at
    its own flags, or None where it cannot be told: no size, layers on the CPU, no GPUs),
    ``pinned`` (models on servers of their own beside the router, in also's order), ``routed`` (the
    models the router loads, its own first), ``free`` (GiB of the cards left beside the pinned),
    ``models_max`` (the instance's, or the one chosen from the VRAM) and ``why`` (the plan line's
    reason for a chosen one; None when the instance set it)."""

    needs: dict[str, Need | None]
    pinned: list[str]
    routed: list[str]
    cards: list[float]
    free: float
    models_max: int
    why: str | None

    def known(self) -> bool:
        """Whether every model's need is known (the VRAM plan can judge the set)."""
        return bool(self.cards) and all(n is not None for n in self.needs.values())

    def largest(self) -> list[str]:
        """The models the router loads, the largest first (the worst case of what it holds at once)."""
        return sorted(self.routed, key=lambda m: self.needs[m].total, reverse=True)


def set_plan(inst: LlamaInstance, entries: dict[str, ModelEntry], cards: list[float]) -> SetPlan:
    """The VRAM plan of a router's set on its cards (``cards``: GiB each; [] on the CPU). With
    ``models_max: auto``, how many of the models the router loads fit at once beside the pinned ones:
    the largest first, so that any of that many fit together (the worst case); at least 1 (a set
    whose largest does not fit beside the pinned is refused: check_set_vram), and 1 when a model's
    need is not known (the least, as before models_max was chosen)."""
    pins = list(pinned(inst))
    routed = [m for m in [inst["model"], *inst["also"]] if m not in pins]
    needs = {m: need_gib(entries[m], for_model(inst, m), len(cards)) if cards else None for m in [*routed, *pins]}
    free = sum(cards) - sum(needs[m].total for m in pins if needs[m])
    plan = SetPlan(needs, pins, routed, cards, free, 1, None)
    if inst["models_max"] != "auto":
        return plan._replace(models_max=inst["models_max"])
    if not plan.known():
        unknown = [m for m, n in needs.items() if n is None]
        reason = "on the CPU" if not cards else f"the VRAM need of {', '.join(unknown)} is not known (its size, or ngl)"
        return plan._replace(why=f"models_max 1 ({reason}: rigup counts the set's models from the VRAM only)")
    fit, total = [], 0.0
    for m in plan.largest():
        if total + needs[m].total > free:
            break
        fit.append(m)
        total += needs[m].total
    where = f"{sum(cards):.1f} GiB on {len(cards)} card{'s' * (len(cards) > 1)}"
    if pins:
        where += (f", pinned {' + '.join(f'{m} {needs[m].total:.1f}' for m in pins)} GiB, "
                  f"{free:.1f} GiB left")
    figures = " + ".join(f"{m} {needs[m].total:.1f}" for m in fit)
    if len(fit) == len(routed):
        why = f"all {len(fit)}: {figures} GiB" if len(fit) > 1 else f"its one model: {figures} GiB"
    elif not fit:
        big = plan.largest()[0]
        why = f"its largest, {big} {needs[big].total:.1f} GiB, does not fit: refused"
    else:
        nxt = plan.largest()[len(fit)]
        why = (f"largest {len(fit)}: {figures} GiB; with {nxt} {needs[nxt].total:.1f} GiB "
               f"{total + needs[nxt].total:.1f} GiB > {free:.1f}")
    chosen = max(1, len(fit))
    return plan._replace(models_max=chosen, why=f"models_max {chosen} from VRAM ({where}; {why})")


def fewest_gpus(model: ModelEntry, inst: LlamaInstance, per_card: list[float]) -> int | None:
    """The fewest of the host's cards (the smallest first, to be safe on a mixed host) whose VRAM
    holds the instance; None when unknown or when even all of them do not."""
    ordered = sorted(per_card)
    for k in range(1, len(ordered) + 1):
        need = need_gib(model, inst, k)
        if need is None:
            return None
        if need.total <= k * ordered[0]:
            return k
    return None


def layout(inst: LlamaInstance, model: ModelEntry, plan: Plan, data: Config) -> Layout:
    """The instance's layout on this host (see the module docstring)."""
    if inst["ctx"] == "auto":   # gpus_per_replica auto: the fewest GPUs that hold its slots (one if parallel is auto)
        inst = {**inst, "ctx": (inst["parallel"] if inst["parallel"] != "auto" else 1) * slot_tokens(model)}
    replicas, per = inst.get("replicas", 1), inst.get("gpus_per_replica")
    per_card, _ = vram_cards(plan, data)
    cards = list(plan.get("cards", [])) if per_card else []
    if not cards or build_backend(plan, data) != "cuda":
        return Layout([[] for _ in range(1 if replicas == "auto" else replicas)], False, [])
    n, fixed = len(cards), isinstance(per, int)
    if per == "auto" or (per is None and replicas == "auto"):
        per = fewest_gpus(model, inst, per_card)   # None: unknown, or fits no group of the cards
    if replicas == "auto":
        replicas = n // per if per and n // per > 1 else 1
    if replicas == 1 and not fixed:
        per = n   # one server over every GPU, as before
    elif per is None:
        per = max(1, n // replicas)
    groups = [cards[k * per:(k + 1) * per] for k in range(replicas)]
    pinned = bool((plan.get("burnin") or {}).get("quarantined"))
    if replicas * per > n:
        return Layout(groups, True, [], f"{replicas} replicas x {per} GPUs = {replicas * per} GPUs, "
                                        f"but this host has {n}" + (" (quarantined cards left out)" if pinned else ""), pinned)
    return Layout(groups, True, [c["index"] for c in cards[replicas * per:]], None, pinned)


def layout_text(name: str, lay: Layout) -> str:
    """One line for preflight's plan, e.g. ``glm: 4 replicas x 2 GPUs (GPU 0-1, 2-3, 4-5, 6-7)``."""
    if not lay.gpu:
        return f"{name}: {lay.replicas} replica{'s' if lay.replicas > 1 else ''} on the CPU"
    per = len(lay.groups[0]) if lay.groups else 0
    groups = ", ".join(f"{g[0]['index']}-{g[-1]['index']}" if len(g) > 1 else str(g[0]["index"])
                       for g in lay.groups if g)
    text = f"{name}: {lay.replicas} replica{'s' if lay.replicas > 1 else ''} x {per} GPUs (GPU {groups})"
    if lay.idle:
        text += f"; {gpus_text(lay.idle)} idle"
    return text + (f"; cannot be: {lay.problem}" if lay.problem else "")
