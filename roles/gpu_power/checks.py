"""roles/gpu_power's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py). Cards are matched by UUID or PCI bus id with the policy's own rule
(roles/gpu_power/policy.py ``card_named``).

    check_config            gpu_power_overrides values that are not watts
    check_clocks            gpu_power_clocks: a class not in the catalogue, a pair not "MIN,MAX" MHz
    check_power_range       gpu_power_watts, or an override, outside a card's power range
    check_override_targets  an override keyed by an index, or naming a card not on the host
    check_psu_budget        gpu_psu_watts below what the cards need at their minimum limits
    check_systemd           caps, overrides or clock locks on a host where systemd is not PID 1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.config import parse_form
from rigup.gpu.catalogue import class_problem
from rigup.gpu.plan import gpu_host
from rigup.refusal import Refusal, config_refusals, gpus_text, needs_systemd, watts_text
from roles.gpu_power.policy import card_named, parse_clocks, psu_need

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

OVERRIDE_WATTS = parse_form("int 50..1000")
POLICY = ("gpu_power_watts", "gpu_power_overrides", "gpu_power_clocks", "gpu_psu_watts")


def _gpus(facts: Facts) -> list[dict]:
    return [g for g in facts.get("gpus") or [] if not g.get("lost")]


def _card_range(card: dict) -> tuple[float | None, float | None]:
    power = card.get("power_w") or {}
    return power.get("min"), power.get("max")


def _overrides(plan: Plan, facts: Facts, data: Config):
    """(key, watts, plan card or None) of each override whose value has the right form."""
    cards = {c["index"]: c for c in plan.get("cards") or []}
    for key, value in (data.get("gpu_power_overrides") or {}).items():
        if OVERRIDE_WATTS.problem(value) is None:
            gpu = card_named(key, _gpus(facts))
            yield key, value, cards.get(gpu.get("index")) if gpu else None


def check_config(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A gpu_power_overrides value that is not watts (int 50..1000)."""
    return config_refusals([(f"gpu_power_overrides.{key}", f"expected watts, {OVERRIDE_WATTS.text}, {why}")
                            for key, watts in (data.get("gpu_power_overrides") or {}).items()
                            if (why := OVERRIDE_WATTS.problem(watts))])


def check_clocks(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """gpu_power_clocks: a key that is not a card class of the catalogue, or a value that is not
    "MIN,MAX" MHz with MIN <= MAX (``1410-1410``, a typo'd class)."""
    found = []
    for cls, pair in (data.get("gpu_power_clocks") or {}).items():
        if class_problem(cls):
            found.append((f"gpu_power_clocks.{cls}", class_problem(cls)))
        elif pair is not None and parse_clocks(pair) is None:
            found.append((f"gpu_power_clocks.{cls}", f"expected \"MIN,MAX\" MHz with MIN <= MAX, got {pair!r}"))
    return config_refusals(found)


def check_power_range(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """gpu_power_watts, or an override, outside the card's power.min_limit..max_limit."""
    if not gpu_host(plan, data):
        return []
    found = []
    watts = data.get("gpu_power_watts")
    if isinstance(watts, (int, float)) and not isinstance(watts, bool):
        outside: dict[tuple, list] = {}
        for card in plan.get("cards") or []:
            low, high = _card_range(card)
            if low is not None and watts < low or high is not None and watts > high:
                outside.setdefault((card["class"], low, high), []).append(card["index"])
        if outside:
            ranges = "; ".join(f"{gpus_text(idx)} ({cls}) accept {watts_text(lo)}-{watts_text(hi)} W"
                               for (cls, lo, hi), idx in outside.items())
            lows = [lo for (_, lo, _), _ in outside.items() if lo is not None]
            highs = [hi for (_, _, hi), _ in outside.items() if hi is not None]
            span = f"between {watts_text(max(lows)) if lows else '?'} and {watts_text(min(highs)) if highs else '?'}"
            found.append(Refusal(
                f"gpu_power_watts {watts_text(watts)} W is outside the power range of this host's cards",
                f"{ranges} (nvidia-smi power.min_limit..power.max_limit)",
                f"set gpu_power_watts {span}, or null to leave the limits as they are", "power_range"))
    for key, value, card in _overrides(plan, facts, data):
        if card is None:
            continue  # check_override_targets reports it
        low, high = _card_range(card)
        if low is not None and value < low or high is not None and value > high:
            found.append(Refusal(
                f"gpu_power_overrides.{key} {value} W is outside its card's power range",
                f"GPU {card['index']} ({card['class']}, {card['bus_id']}) accepts {watts_text(low)}-{watts_text(high)} W",
                f"set it between {watts_text(low)} and {watts_text(high)}", "power_range"))
    return found


def check_override_targets(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An override keyed by a UUID or bus id of no card on this host (or by an index)."""
    if not gpu_host(plan, data):
        return []
    found = []
    cards = plan.get("cards") or []
    for key in data.get("gpu_power_overrides") or {}:
        if str(key).strip().isdigit():
            found.append(Refusal(
                f"gpu_power_overrides.{key} is keyed by a GPU index",
                "indexes reorder between boots, so the cap could land on another card",
                "key it by the card's UUID or PCI bus id (nvidia-smi --query-gpu=index,uuid,pci.bus_id "
                "--format=csv)", "power_override_target"))
        elif card_named(key, _gpus(facts)) is None:
            bus_ids = ", ".join(c["bus_id"] for c in cards if c.get("bus_id"))
            found.append(Refusal(
                f"gpu_power_overrides.{key} names a card that is not on this host",
                f"no GPU here has that UUID or PCI bus id (its {len(cards)} GPUs: {bus_ids})",
                "key it by a UUID or bus id from nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv "
                "on this host, or move it to the host that has the card", "power_override_target"))
    return found


def check_psu_budget(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """gpu_psu_watts below the overrides plus the other cards' minimum limits (policy.py
    ``psu_need``, the floor the converge's ``psu_shares`` refuses below)."""
    budget = data.get("gpu_psu_watts")
    if not gpu_host(plan, data) or not isinstance(budget, (int, float)) or isinstance(budget, bool):
        return []
    cards = [{"uuid": c.get("uuid"), "min": _card_range(c)[0], "max": _card_range(c)[1]} for c in plan.get("cards") or []]
    fixed = {card["uuid"]: float(value) for _, value, card in _overrides(plan, facts, data) if card}
    need, parts = psu_need(cards, fixed)
    if need <= budget:
        return []
    lows = "; ".join(sorted({f"{sum(1 for x in plan['cards'] if x['class'] == c['class'])} x {c['class']} at "
                             f"{watts_text(_card_range(c)[0])} W" for c in plan["cards"]}))
    return [Refusal(f"gpu_psu_watts {watts_text(budget)} W is below the {watts_text(need)} W this host's cards need",
                    f"{parts}; the lowest limits nvidia-smi accepts (power.min_limit): {lows}",
                    f"set gpu_psu_watts to at least {watts_text(need)} (or fewer overrides), or null for no budget",
                    "psu_budget")]


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Caps, overrides or clock locks on a host where systemd is not PID 1 (the boot unit keeps them)."""
    return needs_systemd(facts, [key for key in POLICY if data.get(key) not in (None, {}, False)])


CHECKS = (check_config, check_clocks, check_systemd, check_power_range, check_override_targets, check_psu_budget)
