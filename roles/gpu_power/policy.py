"""The power policy of a host's cards: pure functions, no pyinfra, no YAML.

:func:`power_plan` takes the cards as ``rigup.gpu.facts.parse_gpus`` reads them (one dict per
card) and the policy (``gpu_power_watts``, ``gpu_power_overrides``, ``gpu_power_clocks``,
``gpu_power_persistence``), and returns one row per card: what it has, what it should have, and
whether it differs. :func:`config_lines` turns the rows into the boot unit's configuration
(``/etc/rigup/gpu-power.conf``, one card per line, by UUID), :func:`format_plan` into the lines
plan mode prints. tests/gpu/power_plan.py runs them on a real GPU machine without pyinfra.

Cards are named by UUID or PCI bus id, never by index: indexes reorder between boots.
"""

from __future__ import annotations

import re

_CLOCKS = re.compile(r"^\s*([0-9]+)\s*,\s*([0-9]+)\s*$")


def bus_tail(bus_id: str) -> str:
    """A PCI bus id without its domain, upper case: "0000:c3:00.0" and "00000000:C3:00.0" -> "C3:00.0"."""
    text = str(bus_id).strip().upper()
    return text.split(":", 1)[1] if text.count(":") == 2 else text


def card_named(key: str, gpus: list[dict]) -> dict | None:
    """The card that ``key`` (a UUID "GPU-..." or a PCI bus id) names, or None (an index names none)."""
    text = str(key).strip()
    for gpu in gpus:
        if gpu.get("uuid") and text.upper() == gpu["uuid"].upper():
            return gpu
        if ":" in text and gpu.get("bus_id") and bus_tail(text) == bus_tail(gpu["bus_id"]):
            return gpu
    return None


def parse_clocks(text) -> tuple[int, int] | None:
    """"1410,1410" -> (1410, 1410); None when it is not "MIN,MAX" MHz with MIN <= MAX."""
    m = _CLOCKS.match(str(text)) if text is not None else None
    if not m or int(m.group(1)) > int(m.group(2)):
        return None
    return int(m.group(1)), int(m.group(2))


def _same(watts, want) -> bool:
    return watts is not None and want is not None and abs(float(watts) - float(want)) <= 0.005


def _w(value) -> str:
    return "?" if value is None else f"{float(value):g}"


def psu_need(cards: list[dict], fixed: dict[str, float]) -> tuple[float, str]:
    """The least a power supply must give ``cards`` (each {"uuid", "min"}): the ``fixed`` caps
    ({uuid: watts}) and the other cards' minimum limits, and what that is made of, in words."""
    free = [c for c in cards if c.get("uuid") not in fixed]
    floor = sum(float(c["min"] or 0) for c in free)
    parts = [f"{len(free)} card(s) at their minimum limits ({_w(floor)} W)"]
    if fixed:
        parts.append(f"{len(fixed)} override(s) ({_w(sum(fixed.values()))} W)")
    return floor + sum(fixed.values()), " and ".join(parts)


def psu_shares(cards: list[dict], budget: float, fixed: dict[str, float], ceiling: float | None = None
               ) -> tuple[dict[str, int], str | None]:
    """Each card's cap within the power supply's ``budget`` (``gpu_psu_watts``) for the GPUs:
    ({uuid: watts}, problem or None). Cards in ``fixed`` ({uuid: watts}: their overrides) keep
    their caps and count against the budget; the others share the rest equally, each within its
    own ``min``..``max`` (and at most ``ceiling``, gpu_power_watts): a card whose range ends
    below or starts above the equal share takes its end, and the rest is shared again among the
    others (one level, clamped per card). Whole watts, rounded down, so the sum never exceeds the
    budget. The problem: the budget is below :func:`psu_need` (naming that minimum)."""
    free = [c for c in cards if c.get("uuid") not in fixed]
    need, parts = psu_need(cards, fixed)
    if need > budget:
        return {}, f"gpu_psu_watts {_w(budget)} W is below the {_w(need)} W this host's cards need: {parts}"
    left = budget - sum(fixed.values())
    bounds = {c["uuid"]: (float(c["min"] or 0), min(x for x in (c["max"], ceiling, left) if x is not None))
              for c in free}
    bounds = {u: (lo, max(lo, hi)) for u, (lo, hi) in bounds.items()}

    def at(level: float) -> float:
        return sum(min(max(level, lo), hi) for lo, hi in bounds.values())

    low, high = 0.0, max((hi for _, hi in bounds.values()), default=0.0)
    for _ in range(60):   # the level whose clamped shares fill the budget (each card within its range)
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid) <= left else (low, mid)
    shares = {u: int(min(max(low, lo), hi) + 1e-6) for u, (lo, hi) in bounds.items()}
    return shares, None


def power_plan(gpus: list[dict], watts: int | None, overrides: dict | None = None,
               clocks: dict | None = None, persistence: bool = True,
               class_of=lambda gpu: None, applied: dict | None = None, psu_watts: int | None = None) -> dict:
    """What the policy asks of each card, and what differs::

        {"cards": [{"index", "uuid", "bus_id", "class", "limit", "min", "max", "default",
                    "persistence", "want_watts", "source", "want_clocks", "change": [...]}],
         "lost": ["00000000:47:00.0"], "problems": ["..."]}

    ``change`` lists what would be done to the card ("power limit 250 -> 180 W", ...); an empty
    list means the card is as the policy wants. ``problems`` are reasons not to change anything:
    an override naming no card, a value outside a card's min..max, a bad clock pair.
    ``class_of(gpu)`` gives the card class (for ``clocks``, keyed by class); ``applied``
    ({uuid: {"watts", "clocks"}}, ``facts.parse_applied``) is what the boot script set at this
    boot: a clock lock or a cap the policy no longer has is released (clocks cannot be queried).
    ``psu_watts`` (gpu_psu_watts): the cards without an override share it (:func:`psu_shares`),
    gpu_power_watts their ceiling.
    """
    overrides = overrides or {}
    clocks = clocks or {}
    applied = applied or {}
    present = [g for g in gpus if not g.get("lost")]
    problems: list[str] = []
    by_uuid: dict[str, tuple[int, str]] = {}
    for key, value in overrides.items():
        gpu = card_named(key, present)
        if str(key).strip().isdigit():
            problems.append(f"gpu_power_overrides.{key}: keyed by a GPU index; key it by UUID or PCI bus id")
        elif gpu is None:
            problems.append(f"gpu_power_overrides.{key}: no card on this host has that UUID or PCI bus id")
        else:
            by_uuid[gpu["uuid"]] = (value, f"gpu_power_overrides.{key}")
    for cls, pair in clocks.items():
        if pair is not None and parse_clocks(pair) is None:
            problems.append(f"gpu_power_clocks.{cls}: expected \"MIN,MAX\" MHz with MIN <= MAX, got {pair!r}")
    shares: dict[str, int] = {}
    if psu_watts is not None:
        ranged = [{"uuid": g.get("uuid"), "min": g.get("power_min_w"), "max": g.get("power_max_w")} for g in present]
        shares, short = psu_shares(ranged, float(psu_watts), {u: float(w) for u, (w, _) in by_uuid.items()}, watts)
        problems += [short] if short else []
    rows = []
    for gpu in present:
        default = (shares[gpu["uuid"]], "gpu_psu_watts") if gpu.get("uuid") in shares else (
            watts, "gpu_power_watts" if watts is not None else None)
        want, source = by_uuid.get(gpu.get("uuid"), default)
        cls = class_of(gpu)
        pair = parse_clocks(clocks.get(cls)) if cls else None
        row = {
            "index": gpu.get("index"), "uuid": gpu.get("uuid"), "bus_id": gpu.get("bus_id"), "class": cls,
            "limit": gpu.get("power_limit_w"), "min": gpu.get("power_min_w"), "max": gpu.get("power_max_w"),
            "default": gpu.get("power_default_w"), "persistence": gpu.get("persistence"),
            "want_watts": want, "source": source,
            "want_clocks": f"{pair[0]},{pair[1]}" if pair else None, "change": [],
        }
        if want is not None:
            low, high = row["min"], row["max"]
            if low is None or high is None:
                problems.append(f"{source}: GPU {row['index']} ({row['uuid']}, {row['bus_id']}) does not report "
                                "its power range (power.min_limit/max_limit), so no limit can be checked")
            elif not low <= want <= high:
                problems.append(f"{source}: {want} W is outside GPU {row['index']} ({row['uuid']}, {row['bus_id']}) "
                                f"range {_w(low)}-{_w(high)} W")
            elif not _same(row["limit"], want):
                row["change"].append(f"power limit {_w(row['limit'])} -> {_w(want)} W")
        elif (applied.get(row["uuid"], {}).get("watts") and row["default"] is not None
              and not _same(row["limit"], row["default"])):
            row["change"].append(f"power limit {_w(row['limit'])} -> default {_w(row['default'])} W "
                                 "(no longer in the policy)")
        if persistence and row["persistence"] is not True:
            row["change"].append("persistence mode -> on")
        locked = applied.get(row["uuid"], {}).get("clocks")
        if row["want_clocks"] and locked != row["want_clocks"]:
            row["change"].append(f"lock GPU clocks {row['want_clocks']} MHz")
        elif not row["want_clocks"] and locked:
            row["change"].append(f"reset GPU clocks (locked at {locked} MHz, no longer in the policy)")
        rows.append(row)
    return {"cards": rows, "lost": [g.get("bus_id") for g in gpus if g.get("lost")], "problems": problems}


def config_lines(plan: dict, persistence: bool = True) -> str:
    """The boot unit's configuration: ``UUID WATTS|- CLOCKS|- PERSISTENCE`` per card, sorted by
    UUID (stable across boots whatever the indexes). Cards the policy leaves alone are left out."""
    out = ["# rigup gpu_power: UUID  watts|-  clocks MIN,MAX|-  persistence 1|0  (written by rigup)"]
    for row in sorted(plan["cards"], key=lambda r: r["uuid"] or ""):
        if row["want_watts"] is None and not row["want_clocks"] and not persistence:
            continue
        watts = "-" if row["want_watts"] is None else str(int(row["want_watts"]))
        out.append(f"{row['uuid']} {watts} {row['want_clocks'] or '-'} {1 if persistence else 0}")
    return "\n".join(out) + "\n"


def commands(plan: dict) -> list[list[str]]:
    """The nvidia-smi calls that would bring the cards to the policy, each with ``-i <UUID>``
    (never a bare -pl, which would set every card): for plan mode to show."""
    out = []
    for row in plan["cards"]:
        for change in row["change"]:
            if change.startswith("persistence"):
                out.append(["nvidia-smi", "-i", row["uuid"], "-pm", "1"])
            elif change.startswith("power limit"):
                watts = row["default"] if row["want_watts"] is None else row["want_watts"]
                out.append(["nvidia-smi", "-i", row["uuid"], "-pl", f"{float(watts):g}"])
            elif change.startswith("lock GPU clocks"):
                out.append(["nvidia-smi", "-i", row["uuid"], "-lgc", row["want_clocks"]])
            elif change.startswith("reset GPU clocks"):
                out.append(["nvidia-smi", "-i", row["uuid"], "-rgc"])
    return out


def format_plan(plan: dict) -> str:
    """Each card, its limits, and what would change; then the problems."""
    lines = []
    for row in plan["cards"]:
        cls = f" {row['class']}" if row["class"] else ""
        pm = {True: "on", False: "off"}.get(row["persistence"], "?")
        lines.append(f"GPU {row['index']} {row['uuid']} {row['bus_id']}{cls}: limit {_w(row['limit'])} W "
                     f"(min {_w(row['min'])}, max {_w(row['max'])}, default {_w(row['default'])}), "
                     f"persistence {pm}")
        want = (f"{_w(row['want_watts'])} W from {row['source']}" if row["want_watts"] is not None
                else "leave the limit as it is (gpu_power_watts is null)")
        todo = "; ".join(row["change"]) if row["change"] else "no change"
        lines.append(f"    policy: {want}" + (f", clocks {row['want_clocks']}" if row["want_clocks"] else "")
                     + f" -> {todo}")
    for bus in plan["lost"]:
        lines.append(f"GPU {bus}: fell off the bus (nvidia-smi cannot reach it); nothing can be set on it")
    if not plan["cards"] and not plan["lost"]:
        lines.append("no NVIDIA GPU answers on this host")
    lines += [f"refused: {p}" for p in plan["problems"]]
    changes = sum(len(r["change"]) for r in plan["cards"])
    lines.append(f"{changes} change(s) would be made" + (" (none, while refused)" if plan["problems"] else ""))
    return "\n".join(lines)
