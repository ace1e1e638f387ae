"""Which cards a converge tests, serves on, or leaves out (pure: the host's cards, rigup-burnin's
records and data in; roles/burnin's ``cards`` hook and plan lines read it).

Per card (by UUID; lost cards keep their record; ``state``: the records as roles/burnin judges
them, read by rigup/boundary/burnin.py):
- no record, or a pass not believed (no level, time, key or figures): its **first sight**:
  tested at ``burnin_level``;
- a record that passed (or that the operator cleared), under the same key: **accepted**; with
  ``burnin_every_days``, a pass older than that is **due** again (at ``burnin_level``, as a
  first sight: waiting for a roll where a unit serves from it). The key
  is the driver version, the memory the card reports (an unlock changes it) and the power cap it
  was soaked at: a cap at or below it was tested, a higher one was not. Another driver or memory
  size, or a higher cap: tested again at ``burnin_after_change``, and meanwhile it serves;
- a record that failed: **quarantined**: left out of the plan (so of every serving unit's
  CUDA_VISIBLE_DEVICES and of the VRAM plan), until ``burnin_retest`` tests it again and it
  passes, or ``burnin_clear`` names it;
- a card something serves from (an active serving unit whose CUDA_VISIBLE_DEVICES has it, or one
  without it) is never tested while it serves: it **waits** (a card never tested serves
  meanwhile, as it did before burn-in was enabled), until a roll: roll.py's converge of a host
  (``rigup_rolling``, the host drained at the gateways) stops the units that hold the cards for
  the run and starts them again after it (a card that fails leaves them stopped: the host fails,
  and stays out of the pools). Or drain the host with rigup_maintenance.
"""

from __future__ import annotations

import time

from rigup.boundary import burnin
from rigup.text import shown
from roles.burnin.shipped.acceptance import quarantined

CAP_SLACK_W = 0.5


def key_change(rec: dict, gpu: dict, driver: str | None) -> str | None:
    """Why a card accepted under ``rec["key"]`` must be tested again now, or None."""
    key = rec.get("key") or {}
    why = []
    if driver and key.get("driver") and str(key["driver"]) != str(driver):
        why.append(f"driver {shown(key['driver'], 32)} -> {shown(driver, 32)}")
    mem = gpu.get("memory_total_mib")
    if mem and key.get("memory_mib") and int(key["memory_mib"]) != int(mem):
        why.append(f"memory {key['memory_mib']} -> {mem} MiB")
    cap, soaked = gpu.get("power_limit_w"), key.get("power_limit_w")
    if isinstance(cap, (int, float)) and isinstance(soaked, (int, float)) and cap > soaked + CAP_SLACK_W:
        why.append(f"power cap {soaked:g} -> {cap:g} W, above the one it was soaked at")
    return ", ".join(why) or None


def holders(uuid: str, units: dict) -> list[str]:
    """The active serving units that hold the card (a unit without CUDA_VISIBLE_DEVICES, or one
    naming cards by index, holds every card)."""
    return [unit for unit, devices in sorted(units.items())
            if devices is None or uuid in devices or any(not d.startswith("GPU-") for d in devices)]


def named(values, uuid: str) -> bool:
    return "all" in (values or []) or uuid in (values or [])


def overdue(rec: dict, every_days, now: float) -> str | None:
    """Why a passing record is due again under ``burnin_every_days``, or None (the one rule:
    rigup.boundary.burnin.due)."""
    found = burnin.due(rec, every_days, now)
    return found[1] if found else None


def sort_cards(gpus: list[dict], state: dict, driver: str | None, data: dict, now: float | None = None) -> dict:
    """The burn-in part of the plan (``plan["burnin"]``)::

        {"run": {"standard": [uuid...], "quick": [uuid...]}, "why": {uuid: "first sight" | change},
         "quarantined": [{"uuid", "index", "bus_id", "failed": [...]}], "clear": [uuid...],
         "waiting": [{"uuid", "index", "why"}], "accepted": N,
         "flagged": [{"uuid", "index", "flagged": [...]}]}   # accepted, and serving: a slow card to watch
    """
    records, units, untested = state.get("records") or {}, state.get("units") or {}, state.get("untested") or {}
    now = time.time() if now is None else now
    out: dict = {"run": {}, "why": {}, "quarantined": [], "clear": [], "waiting": [], "accepted": 0, "stop": [],
                 "flagged": [], "pulse": pulse_part(gpus, state, driver, data)}
    if (out["pulse"] or {}).get("run"):
        out["stop"] += [u for u in out["pulse"]["stop"] if u not in out["stop"]]

    def run(gpu: dict, level: str, why: str) -> None:
        held = holders(gpu["uuid"], units)
        if held and not data.get("rigup_rolling"):
            out["waiting"].append({"uuid": gpu["uuid"], "index": gpu.get("index"),
                                   "why": f"{why}: in use by {shown(held[0], 80)}"})
            return
        out["run"].setdefault(level, []).append(gpu["uuid"])
        out["why"][gpu["uuid"]] = why
        out["stop"] += [u for u in held if u not in out["stop"]]   # a roll: stopped for the run

    buses: dict[str, list[str]] = {}
    for u, r in records.items():
        buses.setdefault(str(r.get("bus_id", "")).lower()[-12:], []).append(u)
    # a bus id two records share: the quarantined one whatever the records' order (fail closed; round 6 BA10)
    by_bus = {b: next((u for u in sorted(us) if quarantined(records[u])), sorted(us)[0]) for b, us in buses.items()}
    for gpu in gpus:
        # a card off the bus has no UUID in nvidia-smi's answer: its record is found by its bus id
        uuid = gpu.get("uuid") or by_bus.get(str(gpu.get("bus_id", "")).lower()[-12:])
        if not uuid:
            continue
        rec = records.get(uuid)
        if quarantined(rec):
            if named(data.get("burnin_clear"), uuid):
                out["clear"].append(uuid)
            elif data.get("burnin_retest") and not gpu.get("lost"):
                run(gpu, data["burnin_level"], "a retest of a quarantined card")
            else:
                index = gpu.get("index") if gpu.get("index") is not None else rec.get("index")   # off the bus: as recorded
                out["quarantined"].append({"uuid": uuid, "index": index, "bus_id": gpu.get("bus_id"),
                                           "failed": [shown(f, 200) for f in rec.get("failed") or ["?"]]})
            continue
        if gpu.get("lost"):
            continue
        if rec is None:   # a pass not believed (rigup.boundary.burnin) is no record: tested as at first sight
            run(gpu, data["burnin_level"], untested.get(uuid) or "first sight")
            continue
        if isinstance(rec.get("flagged"), list) and rec["flagged"]:
            out["flagged"].append({"uuid": uuid, "index": gpu.get("index"),
                                   "flagged": [shown(f, 200) for f in rec["flagged"]]})
        change = key_change(rec, gpu, driver)
        due = overdue(rec, data.get("burnin_every_days"), now)
        if change:   # it passed before: it serves meanwhile
            run(gpu, data["burnin_after_change"], change)
        elif due:   # re-acceptance on a schedule: the full level, in a roll where it serves
            run(gpu, data["burnin_level"], due)
        out["accepted"] += 1
    return out


def pulse_part(gpus: list[dict], state: dict, driver: str | None, data: dict) -> dict | None:
    """Whether the pulse of the host's power delivery (``burnin_pulse``; rigup-burnin pulse) runs in
    this converge: ``{"due": why or None, "run": bool, "stop": [units], "waiting": unit or None,
    "failed": [why] (a failed record not due again: roles/burnin/checks.py refuses the host),
    "held": {...} (a passed record), "unreadable": why}``, or None when off. Due at the host's
    first pulse; after a pass, when its cards (those not quarantined), driver or gpu_psu_watts
    changed or a cap rose; after a failure, only with burnin_retest or another gpu_psu_watts (the
    fix the verdict names). It runs only where no serving unit holds a card, or in a roll (the
    units that hold them stopped for it: every card at once)."""
    if not data.get("burnin_pulse"):
        return None
    if state.get("pulse_unreadable"):
        return {"unreadable": state["pulse_unreadable"], "run": False}
    records, rec = state.get("records") or {}, state.get("pulse")
    retest = data.get("burnin_retest")   # the quarantined cards are tested again first, and pulse when they pass
    chosen = [g for g in gpus if g.get("uuid") and not g.get("lost")
              and (retest or not quarantined(records.get(g["uuid"])))]
    caps = sum(g["power_limit_w"] for g in chosen if isinstance(g.get("power_limit_w"), (int, float)))
    psu = data.get("gpu_psu_watts")
    due, key = None, (rec or {}).get("key") or {}
    if rec is None:
        due = "the host's first pulse"
    elif rec.get("untested"):   # a pass without figures, or naming a failure (rigup.boundary.burnin.pulse)
        due = rec["untested"]
    elif key.get("psu_watts") != (float(psu) if psu else None):
        due = f"gpu_psu_watts {key.get('psu_watts') or 'unset'} -> {psu or 'unset'}"
    elif not rec["passed"]:
        due = "a retest (burnin_retest)" if data.get("burnin_retest") else None
    else:
        change = []
        if key.get("cards") != sorted(g["uuid"] for g in chosen):
            change.append("its cards changed")
        if driver and key.get("driver") and str(key["driver"]) != str(driver):
            change.append(f"driver {shown(key['driver'], 32)} -> {shown(driver, 32)}")
        if caps > (key.get("caps_w") or 0) + CAP_SLACK_W * max(1, len(chosen)):
            change.append(f"the cards' caps {key.get('caps_w'):g} -> {caps:g} W")
        due = ", ".join(change) or None
    part = {"due": due, "run": False, "stop": [], "waiting": None, "cards": len(chosen),
            "failed": [shown(f, 600) for f in rec["failed"]] if rec and not rec["passed"] and not due else [],
            "held": rec["figures"] if rec and rec["passed"] and not due else None}
    if due and chosen:
        held = sorted({u for g in chosen for u in holders(g["uuid"], state.get("units") or {})})
        if held and not data.get("rigup_rolling"):
            part["waiting"] = held[0]
        else:
            part["run"], part["stop"] = True, held
    return part


def serving(gpus: list[dict], part: dict) -> list[dict]:
    """The cards the plan may serve on: all but the quarantined ones."""
    out = {q["uuid"] for q in part.get("quarantined") or []}
    return [g for g in gpus if g.get("uuid") not in out]


def lines(part: dict) -> list[str]:
    """Preflight's burn-in lines."""
    if not part:
        return []
    text = []
    for level, uuids in sorted(part.get("run", {}).items()):
        whys = sorted({part["why"][u] for u in uuids})
        text.append(f"burn-in:   {level} on {len(uuids)} card(s) ({'; '.join(whys)}): {shown(', '.join(uuids), 2000)}")
    if part.get("stop"):
        text.append(f"burn-in:   a roll: {shown(', '.join(part['stop']), 400)} stopped for the run (drained at the "
                    "gateways) and started again after it")
    for q in part.get("quarantined") or []:
        text.append(f"burn-in:   GPU {shown(q['index'], 8)} ({shown(q['bus_id'], 32)}, {shown(q['uuid'], 64)}) QUARANTINED, "
                    f"left out of serving: {'; '.join(q['failed'])} (burnin_retest tests it again, burnin_clear accepts it)")
    for w in part.get("waiting") or []:
        text.append(f"burn-in:   GPU {shown(w['index'], 8)} ({shown(w['uuid'], 64)}) waits: {w['why']} "
                    "(set rigup_maintenance for its run)")
    for uuid in part.get("clear") or []:
        text.append(f"burn-in:   {shown(uuid, 64)} cleared by the operator (burnin_clear): it serves again")
    for bad in part.get("unreadable") or []:
        text.append(f"burn-in:   {shown(bad['where'], 200)} does not read: {shown(bad['why'], 300)} (the host is "
                    "refused; its cards are judged by the controller's last good copy)")
    text += pulse_lines(part.get("pulse"))
    if not text:
        text.append(f"burn-in:   {part.get('accepted', 0)} card(s) accepted")
    if part.get("lapsed"):
        text.append(f"burn-in:   found: {part['lapsed']}")
    for f in part.get("flagged") or []:
        text.append(f"burn-in:   GPU {shown(f['index'], 8)} ({shown(f['uuid'], 64)}) accepted, flagged: "
                    f"{'; '.join(f['flagged'])}")
    return text


def pulse_lines(pulse: dict | None) -> list[str]:
    """Preflight's lines of the pulse (:func:`pulse_part`)."""
    if not pulse:
        return []
    if pulse.get("unreadable"):
        return [f"burn-in:   the pulse record does not read: {shown(pulse['unreadable'], 300)} (the host is refused)"]
    if pulse["run"]:
        return [f"burn-in:   pulse of the host's power delivery, {pulse['cards']} card(s) at once ({shown(pulse['due'], 300)})"]
    if pulse["waiting"]:
        return [f"burn-in:   pulse due ({shown(pulse['due'], 300)}) waits: in use by {shown(pulse['waiting'], 80)} "
                "(it runs in a roll: roll.py)"]
    if pulse["failed"]:
        return [f"burn-in:   the host's power delivery FAILED its pulse: {'; '.join(pulse['failed'])}"]
    held = pulse.get("held") or {}
    return [f"burn-in:   the host's power delivery held its pulse ({shown(held.get('peak_w'), 16)} W at its peak, "
            f"caps {shown(held.get('caps_w'), 16)} W)"] if pulse.get("held") is not None else []
