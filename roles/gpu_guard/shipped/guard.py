#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-gpu-guard: trip on sustained power draw, temperature or lost telemetry; stop serving.

Installed by rigup (roles/gpu_guard) as RIGUP_PREFIX/bin/rigup-gpu-guard and run by
rigup-gpu-guard.timer every few seconds (``check``). Standard library only.

Each check samples every card (nvidia-smi --query-gpu, killed with its process group after
``smi_timeout_s``), keeps the samples of the last ``window_s`` seconds (and enough for the
debounce) in SAMPLES (/run/rigup, root's), and judges the new sample bad when, for any card:
- its AVERAGE draw over the window is above its class's ``draw_w`` (instant peaks of twice the
  cap are normal on these cards, so single samples never count), once the samples span at least
  half the window; or the cards' average draws sum above ``psu_watts`` (gpu_psu_watts, the
  power supply's budget for the cards), when set;
- its temperature is above its class's ``temp_c``;
- its telemetry is lost: nvidia-smi fails or does not answer in time, a card fell off the bus, or
  reads [N/A] / [Unknown Error].
It trips when ``debounce.bad`` of the last ``debounce.of`` samples are bad (one flaky [N/A] alone
does not); a bad sample that does not trip is logged at priority warning. On a trip it writes the
reason to the journal (priority crit), records it in the TRIPPED file and stops the serving units
(rigup-llama@*, rigup-vllm@*). While the file exists, every check stops
them again, and the serving units do not start (ConditionPathExists=!TRIPPED). The file is on
disk: a reboot does not clear it. ``rigup-gpu-guard clear`` does, and ``status`` shows it.

Xid triage (``xid`` in the config): each check also reads the kernel's new ``NVRM: Xid`` lines
from the journal (``journalctl -o json`` from the cursor it kept, this boot's lines on the first
run; the kernel's own transport, which no local process can write), attributes each to a card by
its PCI bus id (rigup_xid.py, shipped/xid.py in the repository) and acts by the catalogue's
action for its code, logging the Xid line with what it did:
- ``restart`` (the application on the card faulted): restarts the serving units on that card
  (CUDA_VISIBLE_DEVICES of the unit; a unit without it has every card) that started before it;
- ``suspect`` (memory, firmware): counted per card; ``suspect_count`` of them within
  ``suspect_window_s`` mark the card suspect: its serving units are stopped (a replica is drained
  at its balancer first, by its ExecStop) and kept stopped until ``clear``;
- ``drain_host`` (the card fell off the bus, NVLink, GSP): trips the guard (the host leaves the
  gateways' pools, GpuGuardTripped fires) and, with ``reboot``, reboots the host at most
  ``max_reboots`` a day (counted on disk); after such a reboot, once every card answers again, the
  guard clears itself and starts the units it stopped;
- ``log``: logged and counted only.
On an NVSwitch host (config ``fabric``) each check first asks whether the fabric carries CUDA (the
fabric manager's service active, no card's fabric unregistered: :func:`fabric_problem`); when two
checks in a row say not, the guard trips, naming it (the host drained as for ``drain_host``): one
look alone (a ``systemctl is-active`` slower than its timeout) is logged, shown in the metrics and
kept in SAMPLES (``fabric``), never acted on. It clears itself at the first check that finds the
fabric back (a converge starts the fabric manager and clears it too).
Its switches' SXid events (shipped/xid.py) are triaged with the Xid lines: a fatal one drains the
host (``drain_host``), a non-fatal one is logged and counted per switch.
The counts per card and class (and the suspect cards) are in XID_STATE (on disk) and the metrics;
the counts start again at each boot (a reboot is the cards' recovery); suspect stays until clear.
With the Xid triage the guard also judges each card's PCIe link generation under load (at least
LOADED_PERCENT busy: cards drop their generation at idle), against the card's maximum: a card below
it is logged once and kept in XID_STATE (``link``, this boot's) and the metrics
(rigup_gpu_pcie_gen_under_load), which status.py shows (``Gen3 of Gen4 under load DOWNTRAINED``).

    rigup-gpu-guard [--config /etc/rigup/gpu-guard.json] check|status|clear
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

CONFIG = "/etc/rigup/gpu-guard.json"
QUERY = "index,uuid,pci.bus_id,pci.device_id,power.draw,power.limit,temperature.gpu"
# Read in the same call for the metrics file only (never judged): a card lacking one reads [N/A].
EXTRA = ("memory.used", "clocks.current.sm", "utilization.gpu", "pcie.link.gen.current", "pcie.link.width.current",
         "pcie.link.gen.max", "pcie.link.width.max")
# On an NVSwitch host (config ``fabric``) the cards' fabric registration too, in the same call (one
# nvidia-smi per check: a real host's costs 50-300 ms); judged by :func:`fabric_problem`.
FABRIC = ("fabric.state", "fabric.status")
# (metric, help, field, scale): the cards' gauges in the metrics file, in base units.
GAUGES = (("power_draw_watts", "Power draw (W)", "draw", 1), ("power_limit_watts", "Power limit (W)", "limit", 1),
          ("temperature_celsius", "Core temperature (C)", "temp", 1),
          ("memory_used_bytes", "VRAM used", "memory.used", 2 ** 20),
          ("sm_clock_hertz", "SM clock", "clocks.current.sm", 1e6),
          ("utilization_ratio", "GPU utilisation (0..1)", "utilization.gpu", 0.01),
          ("pcie_link_gen", "PCIe link generation", "pcie.link.gen.current", 1),
          ("pcie_link_width", "PCIe link width (lanes)", "pcie.link.width.current", 1),
          ("pcie_link_gen_max", "PCIe link generation, the card's maximum", "pcie.link.gen.max", 1),
          ("pcie_link_width_max", "PCIe link width (lanes), the card's maximum", "pcie.link.width.max", 1))
KILL_GRACE_S = 2            # how long a killed process group gets to go before the guard moves on
SYSTEMCTL_TIMEOUT_S = 20    # per systemctl call; a stop job goes on in systemd without its client
JOURNAL_TIMEOUT_S = 10      # the kernel log's new lines (journalctl)
SLACK_S = 10                # python start, reading and writing the state files
CLOCK_SKEW_S = 5            # how far after now a kept sample may be dated (a clock stepped back a little) and still count
XID_EVENTS_KEPT = 50        # the newest Xid events kept in XID_STATE, with what was done
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# the blanks taken off around a number or a cell: ASCII's alone, as rigup.boundary.numbers (str.strip() takes
# U+0085, U+00A0 and U+2028 too: nvidia-smi's "350\x85" was a draw of 350; issue 61 round 9 H2)
BLANK = " \t\r\n\f\v"
LOADED_PERCENT = 50         # utilization.gpu at or above which a card's link generation is judged (cards idle at Gen1)
# A PCI address, domain:bus:device.function (nvidia-smi's 00000000:4E:00.0, sysfs's 0000:4e:00.0): the copy of
# rigup/boundary/fields.py PCI_BUS_ID this program carries (it ships alone; tests/unit/test_gpu_guard.py holds the two equal)
PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
# nvidia-smi's line for a card it cannot reach (fallen off the bus): which card, by its bus id
NO_HANDLE = re.compile(r"Unable to determine the device handle for GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")

def unit_timeout_s(smi_timeout_s: int) -> int:
    """TimeoutStartSec of the guard's oneshot unit: the longest one check can take (an nvidia-smi
    call, the journal's new lines and four systemctl calls, each bounded and then killed) plus
    slack. A process stuck in the kernel past SIGKILL (a driver hung hard) is left to systemd,
    which ends the run at this limit."""
    return (smi_timeout_s + KILL_GRACE_S + JOURNAL_TIMEOUT_S + 4 * (SYSTEMCTL_TIMEOUT_S + KILL_GRACE_S)
            + SLACK_S)


def run_bounded(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, stdout then stderr) of ``argv``; (None, output so far) when it ran past
    ``timeout`` seconds, after killing its whole process group. subprocess.run(timeout=) kills
    only the child and then waits for its pipes with no limit, which a grandchild (or a child
    stuck in the driver) can hold open forever; hence a session of its own and killpg."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:        # uninterruptible: systemd reaps it after the run
            out, err = "", ""
        return None, (out or "") + (err or "")


def pci_id(text: str) -> str | None:
    """"0x20C210DE" -> "10de:20c2" (as rigup/gpu/facts.py parse_pci_id)."""
    t = text.strip().lower().removeprefix("0x")
    return f"{t[4:]}:{t[:4]}" if len(t) == 8 else None


def reading(text: str, digits: int = 9) -> float | None:
    """A number nvidia-smi or systemd printed, or None: ASCII digits, at most ``digits`` before the
    point, so finite (issue 47: "inf" read as a draw above every limit, "nan" as a reading, "²"
    passed isdigit and crashed float(), ending the check before any judgement); no sign and no
    leading zero (issue 61: "-00350" was a draw judged and exported, "0085" a temperature: every
    figure read here, a draw, a temperature, a clock, a time, is one printed unsigned).
    rigup.boundary.numbers's rule, by hand: this program ships alone, with the standard library only;
    tests/unit/test_gpu_guard.py holds it to numbers.number."""
    text = text.strip(BLANK)
    if not re.fullmatch(rf"(?:0|[1-9][0-9]{{0,{digits - 1}}})(?:\.[0-9]{{1,12}})?", text):
        return None
    return float(text)


def said(text: str, limit: int = 64) -> str:
    """What nvidia-smi said, as the journal and the tripped file get it: cut to ``limit`` characters,
    each one that is not printable (an escape sequence) as its Python escape (rigup.text.shown's rule)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])


def parse_sample(lines: list[str], rc: int = 0, quarantined: tuple = ()) -> tuple[list[dict], list[str]]:
    """nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits -> (cards, telemetry problems).
    ``quarantined``: bus ids (last 12 characters) of cards rigup-burnin took out of serving: not
    judged, and one of them off the bus is not lost telemetry (nothing serves from it); a set-aside
    card that answers is kept with ``"aside": True``: its draw still counts against the power
    supply's budget (a card under a burn-in soak draws its cap from the same supply)."""
    cards, lost, gone, aside = [], [], 0, 0   # gone: set-aside cards off the bus; aside: set-aside rows
    seen: set[str] = set()   # the UUIDs and bus ids of earlier rows
    for line in lines:
        if "Unable to determine the device handle" in line:
            named = NO_HANDLE.search(line)   # the card's bus id, compared whole (issue 61: a set-aside "0" matched every line)
            if named and named.group(1).lower()[-12:] in {q.lower() for q in quarantined}:
                gone += 1
                continue
            lost.append(said(line.strip(), 300))
            continue
        cells = [c.strip(BLANK) for c in line.split(",")]
        if len(cells) not in (7, 7 + len(EXTRA), 7 + len(EXTRA) + len(FABRIC)) or not re.fullmatch(r"[0-9]{1,4}", cells[0]):
            if line.strip():
                lost.append(said(line.strip(), 300))   # a malformed line: that line's problem, the others judged
            continue
        card = {"index": int(cells[0]), "uuid": cells[1], "bus_id": cells[2], "pci_id": pci_id(cells[3])}
        names = {cells[1].lower(), cells[2].lower()[-12:]}
        if names & seen:   # a card's draws are keyed by its UUID: a second row of one (round 5 B4) is lost telemetry
            lost.append(f"GPU {card['index']} ({said(cells[1])}, {said(cells[2], 32)}) repeats the UUID or bus id of "
                        "an earlier card")
            continue
        seen |= names
        for key, cell in zip(("draw", "limit", "temp", *EXTRA), cells[4:]):
            card[key] = reading(cell)
        if cells[2].lower()[-12:] in {q.lower() for q in quarantined}:
            aside += 1
            if card["draw"] is not None:
                cards.append({**card, "aside": True})
            continue
        if len(cells) == 7 + len(EXTRA) + len(FABRIC):   # "Completed, Success"; Ampere's "N/A, N/A"
            card["fabric"] = ", ".join(c.strip("[]") for c in cells[-len(FABRIC):])
        if card["draw"] is None or card["temp"] is None:
            lost.append(f"GPU {card['index']} ({said(card['uuid'])}, {said(card['bus_id'], 32)}) reads power.draw "
                        f"{said(cells[4], 32)}, temperature.gpu {said(cells[6], 32)}")
        cards.append(card)
    if rc != 0 and not lost and not gone:   # a set-aside card off the bus is why it failed
        text = " ".join(ln.strip() for ln in lines if ln.strip())
        lost.append(f"nvidia-smi exited {rc}: " + (said(text, 300) or "no output"))
    if rc == 0 and not cards and not lost and not aside:
        lost.append("nvidia-smi reports no GPU")
    return cards, lost


def thresholds_for(card: dict, config: dict) -> dict:
    """The thresholds of a card: its PCI id's, else the default ones."""
    return {**config.get("default", {}), **config.get("by_pci_id", {}).get(card.get("pci_id") or "", {})}


def driver_swapped(sample: dict) -> bool:
    """Whether nvidia-smi answered only that NVML's library is not the loaded module's version: a
    driver was installed (by hand, unattended-upgrades or roles/nvidia_driver before its reboot) and
    the host not yet rebooted. The cards work on under the old module and the reboot is the cure:
    tripping would stop serving for no fault of a card and outlive that reboot, so such a sample is
    not judged (the guard logs it, and the metrics show lost telemetry, until the reboot)."""
    return bool(sample["lost"]) and not sample["cards"] and \
        all("Driver/library version mismatch" in line for line in sample["lost"])


def evaluate(history: list[dict], config: dict, now: float) -> str | None:
    """Why the newest sample is bad, or None. ``history``: [{"t": time, "cards": [...],
    "lost": [...]}], newest last; the average draw is taken over its samples of the window."""
    if not history or driver_swapped(history[-1]):
        return None
    newest = history[-1]
    window = float(config.get("window_s", 60))
    history = [s for s in history if recent(s["t"], now, window)]
    # lost telemetry (a card off the bus, a line or value not understood) first; the other cards judged still
    reasons = ["telemetry lost: " + "; ".join(newest["lost"])] if newest["lost"] else []
    averages, spans = {}, []
    for card in newest["cards"]:
        if card.get("aside"):   # under test or quarantined: not judged, its draw summed below
            points = [c["draw"] for s in history for c in s["cards"]   # a draw of [N/A] in a kept sample: not one
                      if c["uuid"] == card["uuid"] and c["draw"] is not None]
            if points:
                averages[card["uuid"]] = sum(points) / len(points)
            continue
        limits = thresholds_for(card, config)
        name = (f"GPU {card['index']} ({said(card['uuid'])}, {said(card['bus_id'], 32)}, "
                f"{limits.get('class', 'unknown class')})")
        temp = limits.get("temp_c")
        if temp is not None and card["temp"] is not None and card["temp"] > temp:
            reasons.append(f"{name}: temperature {card['temp']:g} C > {temp:g} C")
        draw = limits.get("draw_w")
        points = [(s["t"], c["draw"]) for s in history for c in s["cards"]
                  if c["uuid"] == card["uuid"] and c["draw"] is not None]
        span = points[-1][0] - points[0][0] if points else 0
        if len(points) >= 2 and span >= window / 2:
            average = averages[card["uuid"]] = sum(d for _, d in points) / len(points)
            spans.append(span)
            if draw is not None and average > draw:
                reasons.append(f"{name}: average draw {average:.1f} W over {span:.0f} s "
                               f"({len(points)} samples) > {draw:g} W")
    psu = config.get("psu_watts")
    if psu and averages and len(averages) == len(newest["cards"]) and sum(averages.values()) > psu:
        over = f"{min(spans):.0f} s" if spans else "the window"   # every card set aside: no judged card's span
        reasons.append(f"the {len(averages)} cards' average draws sum to {sum(averages.values()):.1f} W over "
                       f"{over} > the power supply's budget {psu:g} W (gpu_psu_watts)")
    return "; ".join(reasons) or None


def recent(t: float, now: float, span: float) -> bool:
    """Whether a sample taken at ``t`` is of the ``span`` seconds before ``now``: never one dated after
    now beyond :data:`CLOCK_SKEW_S` (round 5 B14: a sample at now + 1e9 s, a clock stepped back or a hand
    edit, was kept and judged in every window for 31 years)."""
    return -CLOCK_SKEW_S <= now - t <= span


def debounce_of(config: dict) -> tuple[int, int]:
    """(bad, of): trip when ``bad`` of the last ``of`` samples are bad; (1, 1) when not configured."""
    d = config.get("debounce") or {}
    return int(d.get("bad", 1)), int(d.get("of", 1))


def keep(history: list[dict], config: dict, now: float) -> list[dict]:
    """The samples worth keeping at ``now``: those of the window, and of as long as the last
    ``of`` samples can span (one period each, the interval or a timed-out call), not older."""
    _, of = debounce_of(config)
    period = float(config.get("interval_s", 10)) + float(config.get("smi_timeout_s", 10))
    horizon = max(float(config.get("window_s", 60)), (of + 1) * period)
    return [s for s in history if recent(s["t"], now, horizon)]


def debounced(history: list[dict], config: dict) -> tuple[str | None, int]:
    """(the newest bad sample's reason if the guard trips else None, bad samples among the last
    ``of``). A sample's verdict is its "bad" (a reason or None)."""
    bad, of = debounce_of(config)
    reasons = [s["bad"] for s in history[-of:] if s.get("bad")]
    return (reasons[-1] if len(reasons) >= bad else None), len(reasons)


def read_cards(config: dict) -> tuple[list[dict], list[str]]:
    """One sample of every card, as :func:`parse_sample`; a call that does not answer within
    ``smi_timeout_s`` (a hung driver, a card fallen off the bus) is killed and is lost telemetry."""
    timeout = config.get("smi_timeout_s", 10)
    tries = ([EXTRA + FABRIC] if config.get("fabric") else []) + [EXTRA, ()]
    try:
        for extra in tries:   # a driver without one of the fields fails the query: read again without them
            rc, output = run_bounded(["nvidia-smi", f"--query-gpu={','.join((QUERY, *extra))}",
                                      "--format=csv,noheader,nounits"], timeout)
            if not (rc == 2 and "is not a valid field" in output):
                break
    except OSError as e:
        return [], [f"cannot run nvidia-smi: {e}"]
    if rc is None:
        text = f"nvidia-smi did not answer within {timeout} s"
        log(4, f"rigup-gpu-guard: {text}; killed it and its process group; this sample counts as lost telemetry")
        return [], [text]
    # nvidia-smi's lines end at "\n" (str.splitlines() cuts at U+0085 and U+2028 too: a cell's tail a line)
    return parse_sample(output.split("\n"), rc, tuple(b.lower()[-12:] for b in set_aside(config)))


def set_aside(config: dict) -> set[str]:
    """The bus ids of the cards rigup-burnin tests now or quarantined (config ``burnin``: its results
    file and the file of the cards under test, read at each check, so that a card quarantined in the
    middle of a converge is left alone at once): nothing serves from them, so they are not judged.
    A bus id that is not one (issue 61: ``"0"`` set aside every card) sets nothing aside: that card is
    judged as any other, the guard's side of failing closed. A record of a card whose ``passed`` or
    ``cleared`` does not read (``"false"``, ``"no"``: rerun3's NB7) counts as quarantined
    (:func:`quarantined`): set aside, as rigup-burnin and the controller keep it out."""
    burnin = config.get("burnin") or {}
    found = set()
    records = load(burnin["results"], {}) if burnin.get("results") else {}
    for rec in (records.values() if isinstance(records, dict) else []):
        if isinstance(rec, dict) and quarantined(rec) and bus_id(rec.get("bus_id")):
            found.add(rec["bus_id"])
    testing = load(burnin["testing"], []) if burnin.get("testing") else []
    found.update(b for b in (testing if isinstance(testing, list) else []) if bus_id(b))
    return found


def quarantined(rec: dict | None) -> bool:
    """A record that failed and that the operator did not clear; a record whose ``passed`` is not
    true or false, or whose ``cleared`` is not a mapping (rigup-burnin writes ``{"at", "by"}``), does
    not read and counts as quarantined too: fail closed. rigup-burnin's rule (roles/burnin/shipped/acceptance.py;
    the controller reads records through it), copied here (a host program ships alone; a unit test
    holds the two equal)."""
    if not rec:
        return False
    cleared, passed = rec.get("cleared"), rec.get("passed")
    if (cleared is not None and not isinstance(cleared, dict)) or not isinstance(passed, bool):
        return True
    # a clearing is rigup-burnin clear's {"at", "by"}, not older than the run it clears: {} or {"note"}
    # cleared nothing to the controller (round 6 BA6, BA7), nor one older than a new failure (re-round 6 NB5)
    at, cleared_at = ((v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)   # a time is a number
                      for v in (rec.get("at"), (cleared or {}).get("at")))
    return passed is False and (cleared_at is None or (at is not None and cleared_at < at))


def bus_id(value) -> bool:
    """Whether ``value`` is a PCI bus id (:data:`PCI_BUS_ID`)."""
    return isinstance(value, str) and PCI_BUS_ID.fullmatch(value) is not None


def load(path: str, default):
    """The JSON of ``path``; ``default`` when it is not there, or (said in the journal) when it does
    not read: not JSON, nested too deep (RecursionError), an int over Python's digit limit
    (ValueError), larger than 1 MiB: the guard's check goes on from ``default``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read((1 << 20) + 1)
        if len(text) > 1 << 20:
            raise ValueError("larger than 1 MiB")
        value = json.loads(text)
        return default if value is None else value   # "null": none (a caller's .get on None ended its check)
    except FileNotFoundError:
        return default
    except (OSError, ValueError, RecursionError) as e:
        log(4, f"rigup-gpu-guard: {path} does not read ({type(e).__name__}: {e}): taken as none")
        return default


# ----------------------------------------------------------------------------- the guard's own records, typed
# Each state file is read through one typed reader (issue 61: a card entry of XID_STATE that was a list, or a
# sample whose time was text, ended every check in a traceback: the host unguarded; a tripped file that was a
# list ended status in one). A part not of its form is left out, never trusted; what fails closed stays closed:
# a tripped file that is there trips the guard whatever it holds, a suspect mark that does not read stays one.
def finite(value) -> bool:
    """Whether ``value`` is a JSON number of the guard's records: an int or a float, never a bool, finite."""
    return type(value) in (int, float) and math.isfinite(value)


def samples_of(raw) -> list[dict]:
    """SAMPLES (a JSON list): each sample a map with a finite time ``t``, its cards (maps with a text
    ``uuid`` and a ``draw`` that is a finite number or null), its lost telemetry (text), its verdict
    ``bad`` (text or null) and ``fabric`` (text, when a look said the fabric was down); a sample or a
    card not of that form is left out (the window is then judged on fewer samples)."""
    out = []
    for sample in raw if isinstance(raw, list) else []:
        if not isinstance(sample, dict) or not finite(sample.get("t")):
            continue
        cards = sample.get("cards") if isinstance(sample.get("cards"), list) else []
        lost = sample.get("lost") if isinstance(sample.get("lost"), list) else []
        typed = {"t": sample["t"],
                 "cards": [c for c in cards if isinstance(c, dict) and isinstance(c.get("uuid"), str) and "draw" in c
                           and (c["draw"] is None or finite(c["draw"]))],
                 "lost": [text for text in lost if isinstance(text, str)],
                 "bad": sample["bad"] if isinstance(sample.get("bad"), str) else None}
        if isinstance(sample.get("fabric"), str):
            typed["fabric"] = sample["fabric"]
        out.append(typed)
    return out


def suspect_of(value) -> dict | None:
    """A card's suspect mark: {"since", "line"}, None when it is not marked (null, false); a mark that
    does not read is still a mark (its units stay stopped until clear), its time and line unknown:
    ``{}``, ``[]``, ``0`` and ``""`` too (rerun2's N12: read as no mark, they let its units start)."""
    if value is None or value is False:
        return None
    if isinstance(value, dict) and isinstance(value.get("since"), str) and isinstance(value.get("line"), str):
        return {"since": value["since"], "line": value["line"]}
    return {"since": "an unknown time", "line": "(the guard's record of it does not read)"}


def xid_card_of(card: dict) -> dict:
    """One card's entry of XID_STATE: its counts per class (JSON ints >= 0), the times of its recent
    suspect-class events (finite numbers), its suspect mark and its downtrained link (ints)."""
    counts = card.get("counts") if isinstance(card.get("counts"), dict) else {}
    recent = card.get("recent") if isinstance(card.get("recent"), list) else []
    out = {"counts": {cls: n for cls, n in counts.items() if type(n) is int and n >= 0},
           "recent": [t for t in recent if finite(t)], "suspect": suspect_of(card.get("suspect"))}
    link = card.get("link")
    if isinstance(link, dict) and type(link.get("gen")) is int and type(link.get("gen_max")) is int:
        out["link"] = {"gen": link["gen"], "gen_max": link["gen_max"],
                       "since": link["since"] if isinstance(link.get("since"), str) else "an unknown time"}
    return out


def xid_state_of(raw) -> dict:
    """XID_STATE (a JSON map): ``boot`` and ``cursor`` (text), ``read`` (true), ``last_t`` (finite),
    ``seen`` ({card: {"index": int, "uuid": text}}), ``cards`` ({card: :func:`xid_card_of`}) and
    ``events`` (maps, the newest :data:`XID_EVENTS_KEPT`); an entry not of its form is left out (a card
    whose entry is no map: its counts start again, as at a boot)."""
    state = raw if isinstance(raw, dict) else {}
    out: dict = {key: state[key] for key in ("boot", "cursor") if isinstance(state.get(key), str)}
    if state.get("read") is True:
        out["read"] = True
    if finite(state.get("last_t")):
        out["last_t"] = state["last_t"]
    seen = state.get("seen") if isinstance(state.get("seen"), dict) else {}
    out["seen"] = {k: {"index": c["index"], "uuid": c["uuid"]} for k, c in seen.items()
                   if isinstance(c, dict) and type(c.get("index")) is int and isinstance(c.get("uuid"), str)}
    cards = state.get("cards") if isinstance(state.get("cards"), dict) else {}
    out["cards"] = {k: xid_card_of(c) for k, c in cards.items() if isinstance(c, dict)}
    events = state.get("events") if isinstance(state.get("events"), list) else []
    out["events"] = [e for e in events if isinstance(e, dict)][-XID_EVENTS_KEPT:]
    return out


def read_xid_state(config: dict) -> dict:
    """XID_STATE from its file (config ``xid.state_file``), typed."""
    return xid_state_of(load(config["xid"]["state_file"], {}))


def tripped_of(raw) -> dict:
    """The TRIPPED record. The file's presence trips the guard whatever it holds (fail closed); a record
    that is no map, or a field not of its form, reads as a trip with that part unknown: no reason
    (said so), no reboot to wait for (``reboot_boot``), no unit to start again (``stopped``)."""
    record = raw if isinstance(raw, dict) else {}
    out: dict = {"reason": record["reason"] if isinstance(record.get("reason"), str) else
                 "(no reason recorded: the tripped file " + ("holds none" if record else "does not read") + ")"}
    if finite(record.get("t")):
        out["t"] = record["t"]
    out.update({key: record[key] for key in ("time", "samples", "reboot_boot") if isinstance(record.get(key), str)})
    if isinstance(record.get("stopped"), list):
        out["stopped"] = [unit for unit in record["stopped"] if isinstance(unit, str)]
    if type(record.get("cards")) is int and record["cards"] >= 0:
        out["cards"] = record["cards"]
    if record.get("fabric") is True:
        out["fabric"] = True
    return out


def save(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    replace(path, json.dumps(value), mode=None)


def kept(path: str, value) -> str | None:
    """:func:`save`, or why it could not (a full or read-only disk, its directory a file). A check goes
    on without the file: a trip still stops the serving units (fail closed) and says why; a save that
    raised ended the check in a traceback before the stop, the units serving (issue 61, round 13 GG1)."""
    try:
        save(path, value)
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    return None


def discarded(*paths: str) -> str | None:
    """Remove each of ``paths`` that is there, or say why one could not be (a directory in its place:
    round 32 G32a, ``clear`` ended in a traceback); the guard's files are root's, so this is a broken
    host, not an attack, and the caller says it and stays tripped."""
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            return f"cannot remove {path}: {e.strerror or e}"
    return None


def replace(path: str, text: str, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write ``path`` atomically: a new temp file beside it (a random dot-name, O_EXCL|O_NOFOLLOW: a
    link or file another user planted in the directory is never opened), chmod'ed to ``mode`` (None:
    the umask's), then renamed over ``path`` (a rename replaces a link there, never follows it); the
    temp file never outlives a failure. Each host program carries this copy (it ships alone)."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def number(value: float) -> str:
    """A sample value as the text format reads it, at full precision (a timestamp keeps its ms)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def escaped(value) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the copy of
    rigup/boundary/formats.py's prom_label this program carries: it ships alone; a unit test holds the two equal)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(cards: list[dict], lost: list[str] | None, tripped: bool, config: dict, now: float,
                 xid_state: dict | None = None, fabric: str | None = None) -> str:
    """The guard's metrics file (Prometheus text format, for the node exporter's textfile
    collector): each card's gauges (GAUGES) labelled gpu (index), uuid and class; whether the
    last sample lost telemetry and how many cards answered (both left out when ``lost`` is None:
    a tripped guard samples nothing); whether it is tripped; when it ran, and its period; the Xid
    counts and suspect cards of ``xid_state`` (:func:`xid_metrics`); on an NVSwitch host (config
    ``fabric``) whether its fabric carries CUDA (``fabric``: :func:`fabric_problem`'s reason, or None)."""
    lines = []
    for metric, text, field, scale in GAUGES:
        rows = [(c, c[field]) for c in cards if c.get(field) is not None]
        lines += [f"# HELP rigup_gpu_{metric} {text}", f"# TYPE rigup_gpu_{metric} gauge"] if rows else []
        lines += [f'rigup_gpu_{metric}{{gpu="{c["index"]}",uuid="{escaped(c["uuid"])}",'
                  f'class="{escaped(thresholds_for(c, config).get("class", "unknown"))}"}} {number(v * scale)}'
                  for c, v in rows]
    host = [("guard_tripped", "1 while the guard is tripped (serving units stopped)", int(tripped)),
            ("guard_last_run_timestamp_seconds", "When the guard last ran (epoch seconds)", round(now, 3)),
            ("guard_interval_seconds", "The guard's period (s)", config.get("interval_s", 10))]
    if lost is not None:
        host += [("telemetry_lost", "1 when the last sample lost telemetry (a card or nvidia-smi)", int(bool(lost))),
                 ("cards", "Cards that answered the last sample", len(cards))]
    if config.get("fabric"):
        host.append(("fabric_up", "1 while the NVSwitch fabric carries CUDA (fabric manager active, every card "
                                  "registered)", int(not fabric)))
    for metric, text, value in host:
        lines += [f"# HELP rigup_gpu_{metric} {text}", f"# TYPE rigup_gpu_{metric} gauge",
                  f"rigup_gpu_{metric} {number(value)}"]
    return "\n".join(lines + xid_metrics(xid_state or {}, cards)) + "\n"


def xid_metrics(state: dict, cards: list[dict]) -> list[str]:
    """rigup_gpu_xid_events{bus,gpu,class} (this boot's events per card and class) and
    rigup_gpu_suspect{bus,gpu} of XID_STATE's cards."""
    seen = state.get("seen") if isinstance(state.get("seen"), dict) else {}   # a card off the bus: as last seen
    index = {k: c.get("index", "") for k, c in seen.items() if isinstance(c, dict)} | \
        {card_key_of(c): c["index"] for c in cards}
    known = state.get("cards") or {}
    counts = [(bus, cls, n) for bus, card in sorted(known.items()) for cls, n in sorted((card.get("counts") or {}).items())]
    suspect = [(bus, 1 if card.get("suspect") else 0) for bus, card in sorted(known.items())]
    slow = [(bus, card["link"]) for bus, card in sorted(known.items())   # a gen that is no int would be no sample
            if isinstance(card.get("link"), dict) and type(card["link"].get("gen")) is int]
    lines = []
    if counts:
        lines += ["# HELP rigup_gpu_xid_events Xid events of the card this boot, by class (rigup/gpu/xid.yml)",
                  "# TYPE rigup_gpu_xid_events gauge"]
        lines += [f'rigup_gpu_xid_events{{bus="{escaped(bus)}",gpu="{escaped(index.get(bus, ""))}",class="{escaped(cls)}"}} {n}'
                  for bus, cls, n in counts]
    if suspect:
        lines += ["# HELP rigup_gpu_suspect 1 while the card is suspect (repeated memory or firmware Xid events)",
                  "# TYPE rigup_gpu_suspect gauge"]
        lines += [f'rigup_gpu_suspect{{bus="{escaped(bus)}",gpu="{escaped(index.get(bus, ""))}"}} {v}' for bus, v in suspect]
    if slow:
        lines += ["# HELP rigup_gpu_pcie_gen_under_load The card's PCIe link generation under load, when below its maximum",
                  "# TYPE rigup_gpu_pcie_gen_under_load gauge"]
        lines += [f'rigup_gpu_pcie_gen_under_load{{bus="{escaped(bus)}",gpu="{escaped(index.get(bus, ""))}",'
                  f'max="{escaped(link.get("gen_max"))}"}} {link.get("gen")}' for bus, link in slow]
    return lines


def write_metrics(config: dict, text: str) -> None:
    """Replace the metrics file atomically (a temp file the collector ignores, then rename), when
    its directory exists (roles/metrics installs the node exporter); metrics never stop the guard."""
    path = config.get("metrics_file")
    if not path or not os.path.isdir(os.path.dirname(path)):
        return
    try:
        replace(path, text)
    except OSError as e:
        log(4, f"rigup-gpu-guard: cannot write {path}: {e}")


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def beside(name: str, tree: str, me: str):
    """The module of the host program ``name`` that its role installs next to this one, read by that
    file's path; else, where this program is ``me`` of a source tree (the controller, unit tests,
    tests/gpu), the tree's file ``tree`` as its package module (imported as the rest of the tree is);
    else None (the caller names the file and ends). The file beside it is run only when it is a
    regular file, not a link, owned by root or by whoever runs this, that neither its group nor others
    may write: never code another user could have written, nor a module of that name from wherever
    sys.path finds one (round 8 R1: a rigup_xid.py in the prefix's parent ran as root). Raises
    ImportError, naming the file and why, for one that is there but not so. One function, copied
    into each host program that imports another (tests/unit/test_host_programs.py)."""
    import importlib
    import os
    import stat
    import sys
    import types
    mine = os.path.abspath(__file__)
    path, module_name = os.path.join(os.path.dirname(mine), name), name.removesuffix(".py")
    top = mine[:-len(me) - 1] if mine.endswith(os.sep + me) else None
    if top is not None and not os.path.lexists(path):   # the source tree: its package's module
        if not os.path.isfile(os.path.join(top, tree)):
            return None
        if top not in sys.path:
            sys.path.insert(0, top)
        module = importlib.import_module(tree.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        if os.path.abspath(getattr(module, "__file__", None) or "") != os.path.join(top, tree):
            raise ImportError(f"{module.__name__} is {getattr(module, '__file__', None)}, not {os.path.join(top, tree)}")
        return module
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:   # ELOOP: a link
        raise ImportError(f"{path} is not run: {'a link' if os.path.islink(path) else e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise ImportError(f"{path} is not run: {stat.filemode(st.st_mode)}, uid {st.st_uid} (only a regular "
                              f"file of root's or this user's, that no group or other user may write)")
        source = f.read()
    if module_name not in sys.modules:
        module = sys.modules[module_name] = types.ModuleType(module_name)
        module.__file__ = path
        try:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            del sys.modules[module_name]
            raise
    module = sys.modules[module_name]
    if os.path.abspath(getattr(module, "__file__", None) or "") != path:
        raise ImportError(f"{module_name} is {getattr(module, '__file__', None)}, not {path}")
    return module


# The Xid line parser, shipped/xid.py: rigup_xid.py beside this program (roles/gpu_guard installs the
# two), read by that file's path. Without it (or refused: a file another user could write) the Xid triage
# is off and the power and thermal checks go on: the guard never stops guarding for it.
try:
    xid_lines = beside("rigup_xid.py", "shipped/xid.py", "roles/gpu_guard/shipped/guard.py")
except ImportError as refused:
    xid_lines = None
    print(shown(f"<4>rigup-gpu-guard: the Xid triage is off: {refused}", 4000), flush=True)


def log(priority: int, text: str) -> None:
    """A journal line with its syslog priority (systemd reads the <N> prefix)."""
    print(shown(f"<{priority}>{text}", 4000), flush=True)


def running_units(config: dict) -> list[str] | None:
    """The serving units active, activating or reloading (None when systemctl did not answer)."""
    rc, listed = run_bounded(["systemctl", "list-units", "--state=active,activating,reloading", "--plain",
                              "--no-legend", *config.get("units", ["rigup-llama@*", "rigup-vllm@*"])],
                             SYSTEMCTL_TIMEOUT_S)
    return [u for u in listed.split() if u.endswith(".service")] if rc is not None else None


def serving_running(config: dict) -> list[str]:
    """The serving units running now (all the patterns when systemctl does not say)."""
    running = running_units(config)
    return list(config.get("units", ["rigup-llama@*", "rigup-vllm@*"])) if running is None else running


def stop_serving(config: dict, running: list[str] | None = None) -> tuple[list[str], str]:
    """Stop the serving units: (the ones that were running (``running``, when known), all the patterns
    when systemctl did not say; the same as text, with a note when the stop did not end in time)."""
    units = config.get("units", ["rigup-llama@*", "rigup-vllm@*"])
    running = serving_running(config) if running is None else running
    if running and run_bounded(["systemctl", "stop", *units], SYSTEMCTL_TIMEOUT_S)[0] is None:
        return running, ", ".join(running) + f" (still stopping after {SYSTEMCTL_TIMEOUT_S} s; systemd goes on)"
    return running, ", ".join(running)


# ----------------------------------------------------------------------------- Xid triage
def card_key_of(card: dict) -> str:
    """A sampled card's key as an Xid line names it (``0000:2b:00``), or its bus id as is."""
    try:
        return xid_lines.card_key(card["bus_id"]) if xid_lines else card["bus_id"]
    except ValueError:
        return card["bus_id"]


def boot_id() -> str:
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def journal_text(value) -> str:
    """A journal field as JSON gives it: a string, or bytes as a list of numbers (not UTF-8)."""
    if isinstance(value, list):
        return bytes(v for v in value if isinstance(v, int) and 0 <= v < 256).decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def parse_journal(output: str) -> tuple[list[tuple[float, str]], str | None]:
    """``journalctl -o json`` lines -> ([(epoch seconds, message)], the last entry's cursor)."""
    entries, cursor = [], None
    for line in output.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        cursor = entry.get("__CURSOR") or cursor
        stamp = entry.get("__REALTIME_TIMESTAMP")   # journald's microseconds, as text
        t = (reading(stamp, 18) or 0.0) / 1e6 if isinstance(stamp, str) else 0.0
        entries.append((t, journal_text(entry.get("MESSAGE"))))
    return entries, cursor


def read_kernel_log(config: dict, state: dict) -> tuple[list[tuple[float, str]], str | None]:
    """The kernel log's entries after the kept cursor (this boot's on the first run, or when the
    cursor is gone with a vacuumed journal), and the cursor to keep; a journalctl that fails or
    does not answer is logged and read again at the next check."""
    match = config["xid"].get("match", "_TRANSPORT=kernel")
    base = ["journalctl", "-o", "json", "--no-pager", "-q", "--output-fields=MESSAGE", match]
    cursor = state.get("cursor")
    for argv in ([*base, f"--after-cursor={cursor}"], [*base, "-b"]) if cursor else ([*base, "-b"],):
        rc, output = run_bounded(argv, JOURNAL_TIMEOUT_S)
        if rc == 0:
            entries, last = parse_journal(output)
            if "-b" in argv and state.get("read"):   # no cursor (none yet, or gone): less the lines judged
                entries = [e for e in entries if e[0] > float(state.get("last_t") or 0)]
            state["last_t"] = max([t for t, _ in entries] + [float(state.get("last_t") or 0)])
            state["read"] = True
            return entries, last or cursor
    log(4, f"rigup-gpu-guard: cannot read the kernel log (journalctl: {'no answer' if rc is None else rc}); "
           "its Xid lines are read at the next check")
    return [], cursor


def unit_blocks(text: str) -> list[dict]:
    """``systemctl show -p Id,Environment,ActiveEnterTimestamp --timestamp=unix U...`` -> one dict
    per unit."""
    blocks, current = [], {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = value
    return blocks


def serving_units(config: dict, cards: list[dict]) -> list[dict]:
    """The active serving units: {"unit", "cards": the card keys its CUDA_VISIBLE_DEVICES names
    (by UUID or index; every sampled card without it), "since": when it last started (epoch s)}."""
    names = running_units(config) or []
    if not names:
        return []
    rc, shown = run_bounded(["systemctl", "show", "-p", "Id,Environment,ActiveEnterTimestamp", "--timestamp=unix",
                             *names], SYSTEMCTL_TIMEOUT_S)
    by_id = {c["uuid"]: card_key_of(c) for c in cards} | {str(c["index"]): card_key_of(c) for c in cards}
    out = []
    for block in unit_blocks(shown if rc == 0 else ""):
        env = dict(w.partition("=")[::2] for w in block.get("Environment", "").split())
        visible = env.get("CUDA_VISIBLE_DEVICES")
        keys = {by_id.get(d.strip(), d.strip()) for d in visible.split(",")} if visible else set(by_id.values())
        stamp = block.get("ActiveEnterTimestamp", "").lstrip("@")
        out.append({"unit": block.get("Id", ""), "cards": keys,
                    "since": reading(stamp, 12) or 0.0})
    return [u for u in out if u["unit"]]


def systemctl(verb: str, units: list[str]) -> str:
    """``systemctl VERB UNITS`` bounded: "" when done, else what went wrong."""
    if not units:
        return ""
    rc, output = run_bounded(["systemctl", verb, *units], SYSTEMCTL_TIMEOUT_S)
    return "" if rc == 0 else f" (systemctl {verb}: {'no answer' if rc is None else f'exit {rc}'} {output.strip()[:200]})"


def reboots_today(path: str, now: float) -> tuple[str, int]:
    """(today, the reboots the guard made today). A count that is not a JSON int (``"x"``, ``true``,
    ``1e400``) no longer ends the check before the drain: it counts as no reboot left (issue 61)."""
    day = time.strftime("%Y-%m-%d", time.localtime(now))
    record = load(path, {})
    count = record.get("count", 0) if isinstance(record, dict) and record.get("day") == day else 0
    return day, count if type(count) is int and count >= 0 else 1 << 30


def triage(config: dict, state: dict, entries: list[tuple[float, str]], cards: list[dict], now: float,
           on_cards=serving_units, act=systemctl, judge: bool = True) -> dict | None:
    """Act on the Xid lines among ``entries`` (module docstring); ``state`` (XID_STATE) is updated.
    Returns the trip to record ({"reason", "reboot"}) for a drain_host event, else None.
    ``on_cards(config, cards)``: the serving units (:func:`serving_units`); ``act(verb, units)``:
    systemctl (:func:`systemctl`). Without ``judge`` (the guard's first read of this boot's log:
    the lines predate it) the events are counted and logged, nothing is done: a card still off the
    bus is lost telemetry to the sample anyway."""
    xid = config["xid"]
    catalogue = {int(k): v for k, v in (xid.get("catalogue") or {}).items()}
    seen = state.setdefault("seen", {})   # the cards of earlier samples: a card off the bus is in none now
    seen.update({card_key_of(c): {"index": c["index"], "uuid": c["uuid"]} for c in cards})
    answering = {card_key_of(c) for c in cards}
    names = {k: f"GPU {c['index']} ({c['uuid']}, {k}{'' if k in answering else ', not answering'})"
             for k, c in seen.items()}
    known, trip, units = state.setdefault("cards", {}), None, None
    here = set(seen) | nvidia_pci_cards() | set((config.get("fabric") or {}).get("switches") or [])
    acted: set[tuple[str, str]] = set()   # (card, class) acted on in this check: once each
    for t, message in entries:
        for event in xid_lines.events([message], catalogue):
            card = known.setdefault(event["card"], {"counts": {}, "recent": [], "suspect": None})
            card["counts"][event["class"]] = card["counts"].get(event["class"], 0) + 1
            who = names.get(event["card"], f"the {'NVSwitch' if event.get('kind') == 'SXid' else 'card'} at {event['card']}")
            what = f"{event.get('kind', 'Xid')} {event['code']} ({event['class']}: {event['meaning']}) on {who}"
            done = "logged"
            if not judge:
                done = "counted (before the guard's first check: not acted on)"
            elif event["card"] not in here:
                done = "counted, not acted on: no card of this host has that bus id (no sample, not on its PCI bus)"
            elif event["card"] in {card_key_of({"bus_id": b}) for b in set_aside(config)}:
                done = "counted, not acted on: the card is under acceptance or quarantined (rigup-burnin): nothing serves from it"
            elif (event["card"], event["class"]) in acted and event["action"] in ("restart", "drain_host"):
                done = "counted; acted on already in this check (once per card and class)"
            elif event["action"] == "restart":
                acted.add((event["card"], event["class"]))
                units = on_cards(config, cards) if units is None else units
                hit = [u["unit"] for u in units if event["card"] in u["cards"] and u["since"] < t]
                done = f"restarted {', '.join(hit)}{act('restart', hit)}" if hit else \
                    "no serving unit on the card started before it"
            elif event["action"] == "suspect":
                window = float(xid.get("suspect_window_s", 86400))
                card["recent"] = [r for r in card["recent"] if now - r <= window] + [t]
                if card["suspect"]:
                    done = "the card is suspect already"
                elif len(card["recent"]) >= int(xid.get("suspect_count", 2)):
                    card["suspect"] = {"since": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now)),
                                       "line": event["line"]}
                    done = (f"the card is SUSPECT ({len(card['recent'])} such events within {window:.0f} s): its "
                            "serving units are stopped until rigup-gpu-guard clear")
                else:
                    done = f"counted ({len(card['recent'])} of {xid.get('suspect_count', 2)} within {window:.0f} s)"
            elif event["action"] == "drain_host":
                acted.add((event["card"], event["class"]))
                trip = {"reason": f"{what}: {event['line']}", "reboot": False}
                day, count = reboots_today(xid.get("reboots_file", ""), now)
                if xid.get("reboot") and count < int(xid.get("max_reboots", 1)):
                    trip["reboot"] = True
                    done = f"the host is drained (guard tripped) and reboots ({count + 1} of {xid.get('max_reboots', 1)} today)"
                else:
                    done = "the host is drained (guard tripped)" + (
                        f"; no reboot: {count} of {xid.get('max_reboots', 1)} today done" if xid.get("reboot") else
                        "; gpu_guard_xid_reboot is off")
            state.setdefault("events", []).append({"t": t, "card": event["card"], "code": event["code"],
                                                   "class": event["class"], "action": event["action"],
                                                   "line": event["line"], "done": done})
            log(2 if event["action"] in ("drain_host", "suspect") else 4, f"rigup-gpu-guard: {what}: {done}. "
                f"The kernel said: {event['line']}")
    state["events"] = state.get("events", [])[-XID_EVENTS_KEPT:]
    return trip


def nvidia_pci_cards(root: str = "/sys/bus/pci/devices") -> set[str]:
    """The keys (``0000:2b:00``) of the NVIDIA devices on this host's PCI bus (vendor 0x10de): a card
    whose Xid comes before any sample of it (fallen off the bus at boot) is still this host's."""
    found = set()
    try:
        names = os.listdir(root)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(root, name, "vendor")) as f:
                if f.read(16).strip().lower() == "0x10de":
                    found.add(card_key_of({"bus_id": name}))
        except (OSError, ValueError):
            continue
    return found


def suspect_units(state: dict, units) -> list[str]:
    """The running serving units on a suspect card; ``units()``: :func:`serving_units`' list."""
    bad = {k for k, c in (state.get("cards") or {}).items() if c.get("suspect")}
    return [u["unit"] for u in units() if u["cards"] & bad] if bad else []


def links_under_load(state: dict, cards: list[dict], now: float) -> None:
    """Judge each card's PCIe link generation under load (cards drop it at idle to save power, so it
    is compared with the card's maximum only while the card is at least :data:`LOADED_PERCENT` busy):
    a card below its maximum then gets ``link`` ({"gen", "gen_max", "since"}) in its XID_STATE entry
    (this boot's, logged once at priority warning); a loaded sample at its maximum takes it away."""
    entries = state.setdefault("cards", {})
    for c in cards:
        util, gen, top = c.get("utilization.gpu"), c.get("pcie.link.gen.current"), c.get("pcie.link.gen.max")
        if util is None or gen is None or top is None or util < LOADED_PERCENT:
            continue
        key = card_key_of(c)
        entry = entries.get(key) or {}
        if gen < top and (entry.get("link") or {}).get("gen") != int(gen):
            entry["link"] = {"gen": int(gen), "gen_max": int(top),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now))}
            entries[key] = {"counts": {}, "recent": [], "suspect": None, **entry}
            log(4, f"rigup-gpu-guard: GPU {c['index']} ({c['uuid']}, {key}): PCIe link at Gen{int(gen)} of "
                   f"Gen{int(top)} under load ({util:.0f}% busy): a downtrained link (a riser, the slot, the "
                   f"board's lanes) slows every transfer to the card")
        elif gen >= top and entry.pop("link", None):
            log(5, f"rigup-gpu-guard: GPU {c['index']} ({key}): PCIe link back at Gen{int(gen)} under load")


def xid_check(config: dict, cards: list[dict], lost: list[str], now: float) -> tuple[dict, dict | None]:
    """This check's Xid part: (XID_STATE, the trip to record or None)."""
    path = config["xid"]["state_file"]
    state = read_xid_state(config)
    before = json.dumps(state, sort_keys=True)
    boot = boot_id()
    if state.get("boot") != boot:   # a new boot: the cards' counts start again; suspect stays
        state["cards"] = {k: {"counts": {}, "recent": c.get("recent", []), "suspect": c.get("suspect")}   # no link: re-judged
                          for k, c in (state.get("cards") or {}).items() if c.get("suspect") or c.get("recent")}
        state["boot"] = boot
    first = not state.get("read")
    entries, cursor = read_kernel_log(config, state)
    if cursor is None:   # no kernel line yet (a container's journal has none): absent, as the typed read leaves
        state.pop("cursor", None)   # it (a None kept made every check differ from its read: a write each check)
    else:
        state["cursor"] = cursor
    listed: list = []   # the serving units, read at most once this check (systemctl list-units, show)

    def units(*_) -> list[dict]:
        if not listed:
            listed.append(serving_units(config, cards))
        return listed[0]
    trip = triage(config, state, entries, cards, now, on_cards=units, judge=not first)
    links_under_load(state, cards, now)
    stop = suspect_units(state, units)
    if stop:
        log(2, f"rigup-gpu-guard: stopping {', '.join(stop)} (on a suspect card; rigup-gpu-guard status){systemctl('stop', stop)}")
    if json.dumps(state, sort_keys=True) != before:   # on disk: written only when it changed, not every check
        problem = kept(path, state)
        if problem:   # this check's triage still acts; the next reads the lines again
            log(3, f"rigup-gpu-guard: {problem}")
    return state, trip


def after_reboot(config: dict, record: dict, cards: list[dict], lost: list[str]) -> bool:
    """Whether a trip the guard rebooted for is over: this is another boot and every card it had
    answers again. Then it clears itself and starts the units it stopped."""
    if not record.get("reboot_boot") or record["reboot_boot"] == boot_id() or lost or \
            len(cards) < int(record.get("cards", 0)):
        return False
    problem = discarded(config["tripped_file"])
    if problem:
        log(3, f"rigup-gpu-guard: not cleared after the reboot: {problem}")
        return False
    units = resumed(config, record)
    log(5, f"rigup-gpu-guard: cleared after the reboot for {record.get('reason')}: all {len(cards)} cards answer; "
           f"starting {', '.join(units) or 'no unit'}{systemctl('start', units)}")
    return True


def serving_unit(name, patterns: list[str]) -> bool:
    """Whether ``name`` is a service of the serving units' ``patterns`` (systemctl's globs), no glob itself."""
    return isinstance(name, str) and name.endswith(".service") and not any(c in name for c in "*?[") and \
        any(fnmatch.fnmatchcase(name, p) for p in patterns)


def resumed(config: dict, record: dict) -> list[str]:
    """The serving units to start when a trip ends: those the guard stopped (``record["stopped"]``)
    and those whose last start its tripped file's condition skipped (a boot or a converge while
    tripped: inactive, ConditionResult=no). A unit an operator stopped is neither. A name the record
    holds is started only where it is a serving unit (a service of the config's ``units``): the record is
    a file, and its ``stopped`` once started ssh.service and debug-shell.service (round 5 B8)."""
    patterns = config.get("units", ["rigup-llama@*", "rigup-vllm@*"])
    units = [u for u in record.get("stopped", []) if serving_unit(u, patterns)]
    rc, listed = run_bounded(["systemctl", "list-units", "--all", "--plain", "--no-legend",
                              *patterns], SYSTEMCTL_TIMEOUT_S)
    names = [u for u in (listed or "").split() if u.endswith(".service")] if rc == 0 else []
    if names:
        rc, shown = run_bounded(["systemctl", "show", "-p", "Id,ActiveState,ConditionResult", *names], SYSTEMCTL_TIMEOUT_S)
        units += [b["Id"] for b in unit_blocks(shown if rc == 0 else "")
                  if b.get("ActiveState") == "inactive" and b.get("ConditionResult") == "no" and b.get("Id")]
    return sorted(set(units))


def fabric_problem(config: dict, cards: list[dict], lost: list[str]) -> tuple[str | None, bool]:
    """Whether the NVSwitch fabric can carry CUDA now: (why not, or None; whether that is known).
    Config ``fabric``: an NVSwitch host (elsewhere nothing is read: (None, True)). Not known when
    the cards' read (:func:`read_cards`, which reads their fabric on such a host: ``cards``,
    ``lost``) lost telemetry or answered no card: the fabric is then neither tripped on nor cleared.
    Else: the fabric manager's service not active, or a card whose fabric is not registered (Hopper
    and later: Completed/Success; N/A, as Ampere reports, passes: then its NVLinks say)."""
    fabric = config.get("fabric")
    if not fabric:
        return None, True
    rc, out = run_bounded(["systemctl", "is-active", fabric["service"]], config.get("smi_timeout_s", 10))
    if (out or "").strip() != "active":
        return f"{fabric['service']} is {said((out or '').strip() or 'not answering')}", True
    if lost or not cards:
        return f"not read ({lost[0] if lost else 'no card answered'})", False
    states = [c["fabric"] for c in cards if c.get("fabric")]
    bad = [s for s in states if s not in ("Completed, Success", "N/A, N/A")]
    if bad:
        return f"{len(bad)} of {len(states)} cards read fabric {said(bad[0])}", True
    if states and set(states) == {"N/A, N/A"}:   # Ampere: no fabric state, its NVLinks say
        rc, out = run_bounded(["nvidia-smi", "nvlink", "-s"], config.get("smi_timeout_s", 10))
        down = sum("inactive" in ln.lower() for ln in (out or "").splitlines()) if rc == 0 else 0
        if down:
            return f"{down} NVLinks inactive", True
    return None, True


def check(config: dict) -> int:
    tripped = config["tripped_file"]
    # an NVSwitch host's cards are read first (their fabric, judged tripped or not); elsewhere only untripped
    read = read_cards(config) if config.get("fabric") else None
    served = ([c for c in read[0] if not c.get("aside")], read[1]) if read else None
    fabric, known = fabric_problem(config, *served) if served else (None, True)
    if os.path.exists(tripped):
        record = tripped_of(load(tripped, None))
        if record.get("fabric") and known and not fabric:   # back: serve again
            problem = discarded(tripped, config["samples_file"])   # as clear: a look before the trip never counts again
            if not problem:
                units = resumed(config, record)
                log(5, f"rigup-gpu-guard: the NVSwitch fabric is back (was: {record.get('reason')}); cleared: "
                       f"starting {', '.join(units) or 'no unit'}{systemctl('start', units)}")
                return 0
            log(3, f"rigup-gpu-guard: the NVSwitch fabric is back but the trip stays: {problem}")
        # after its reboot, an NVSwitch host serves again only once its fabric is up too
        if record.get("reboot_boot") and record["reboot_boot"] != boot_id() and \
                known and not fabric:
            cards, lost = served or read_cards(config)
            cards = [c for c in cards if not c.get("aside")]
            if after_reboot(config, record, cards, lost):
                return 0
        write_metrics(config, metrics_text([], None, True, config, time.time(),
                                           read_xid_state(config) if config.get("xid") else None, fabric))
        running, stopped = stop_serving(config)
        if stopped:
            log(2, f"rigup-gpu-guard: tripped ({tripped}); stopped {stopped}, which started while tripped")
            if set(running) - set(record.get("stopped") or []):   # started again when cleared
                problem = kept(tripped, {**record, "stopped": sorted(set(running) | set(record.get("stopped") or []))})
                if problem:
                    log(3, f"rigup-gpu-guard: {problem}")
                    return 1
        return 0
    now = time.time()
    looked = fabric if fabric and known else None   # CUDA cannot run on this board now, by this look
    if looked:   # the check before said so too (its sample is the last kept): drained, until the fabric is back
        before = keep(samples_of(load(config["samples_file"], [])), config, now)
        if before and before[-1].get("fabric"):
            return trip_now(config, {"reason": f"the NVSwitch fabric: {fabric}", "reboot": False, "fabric": True}, [],
                            now, fabric)
        log(4, f"rigup-gpu-guard: the NVSwitch fabric: {fabric} (1 of 2 checks in a row; drained if the next "
               "says so too)")
    every, lost = read or read_cards(config)
    cards = [c for c in every if not c.get("aside")]   # the set-aside cards' draws count in evaluate's sum only
    xid_state, xid_trip = xid_check(config, cards, lost, now) if config.get("xid") and xid_lines else ({}, None)
    if xid_trip:
        return trip_now(config, xid_trip, cards, now)
    history = keep(samples_of(load(config["samples_file"], [])), config, now)
    history.append({"t": now, "cards": every, "lost": lost, **({"fabric": looked} if looked else {})})
    history[-1]["bad"] = evaluate(history, config, now)
    unsaved = kept(config["samples_file"], history)
    if unsaved:   # judged on this sample all the same
        log(3, f"rigup-gpu-guard: {unsaved}")
    reason, count = debounced(history, config)
    write_metrics(config, metrics_text(cards, lost, reason is not None, config, now, xid_state, fabric))
    bad, of = debounce_of(config)
    samples = f"{count} of the last {min(of, len(history))} samples bad"
    if reason is None:
        if driver_swapped(history[-1]) and not (len(history) > 1 and driver_swapped(history[-2])):
            log(4, f"rigup-gpu-guard: not judging the cards until the host reboots: {history[-1]['lost'][0]} "
                   "(a new driver is installed, the old module still loaded)")
        if history[-1]["bad"]:
            log(4, f"rigup-gpu-guard: bad sample ({samples}; trips at {bad} of {of}): {history[-1]['bad']}")
        return 1 if unsaved else 0
    problem = kept(tripped, {"t": now, "time": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now)),
                             "reason": reason, "samples": samples})
    _, stopped = stop_serving(config)
    log(2, f"rigup-gpu-guard: TRIPPED: {reason}; stopped serving units: {stopped or 'none running'}; "
           f"{samples}; " + (unrecorded(problem) if problem else
                             "they stay stopped until an operator runs rigup-gpu-guard clear"))
    return 1 if problem or unsaved else 0


def unrecorded(problem: str) -> str:
    """The trip's journal words when its record could not be written (:func:`kept`)."""
    return f"its record is not written ({problem}): nothing holds them stopped, a converge or a boot starts them"


def trip_now(config: dict, trip: dict, cards: list[dict], now: float, fabric: str | None = None) -> int:
    """Trip at once for an Xid event (no debounce: the kernel said so) and, when ``trip["reboot"]``,
    count the reboot and reboot the host."""
    # on record before any unit stops, as a debounced trip is: whoever sees the servers go (a gateway, an
    # operator) finds why, and a clear in between cannot be undone by a record written after it
    stopped = serving_running(config)
    record = {"t": now, "time": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now)), "reason": trip["reason"],
              "samples": "the fabric's state" if trip.get("fabric") else "an Xid event", "stopped": stopped,
              "cards": len(cards), **({"fabric": True} if trip.get("fabric") else {})}
    if trip["reboot"]:
        record["reboot_boot"] = boot_id()
    problem = kept(config["tripped_file"], record)
    uncounted = None
    if trip["reboot"] and not problem:   # counted before it: a count that cannot be kept bounds no reboot
        path = config["xid"]["reboots_file"]
        day, count = reboots_today(path, now)
        uncounted = kept(path, {"day": day, "count": count + 1})
    _, units = stop_serving(config, stopped)
    write_metrics(config, metrics_text(cards, [], True, config, now,
                                       read_xid_state(config) if config.get("xid") else None, fabric))
    # no reboot without both records: the units would start at boot with no trip on file, or the day's count unkept
    log(2, f"rigup-gpu-guard: TRIPPED: {trip['reason']}; stopped serving units: {units or 'none running'}; "
           + (("not rebooting; " if trip["reboot"] else "") + unrecorded(problem) if problem else
              f"not rebooting (the day's reboots are not counted: {uncounted}); they stay stopped until an operator "
              "runs rigup-gpu-guard clear" if uncounted else
              "rebooting the host (gpu_guard_xid_reboot)" if trip["reboot"] else
              "they stay stopped until the fabric is back (a converge starts the fabric manager)" if trip.get("fabric")
              else "they stay stopped until an operator runs rigup-gpu-guard clear"))
    if problem or uncounted:
        return 1
    if trip["reboot"]:
        time.sleep(1)   # the lines above reach journald and are on disk before the shutdown begins
        run_bounded(["journalctl", "--sync"], JOURNAL_TIMEOUT_S)
        run_bounded(["systemctl", "reboot"], SYSTEMCTL_TIMEOUT_S)
    return 0


def config_problem(config) -> str | None:
    """What makes ``config`` (the guard's file, roles/gpu_guard writes it) not one the guard can run on,
    or None: a map, its state files (``tripped_file``, ``samples_file``; ``xid``'s ``state_file`` when it
    has ``xid``, and ``reboots_file`` when that reboots) absolute paths. A file without one (a hand edit, a partial
    write) ended in a KeyError traceback at every check, status and clear (round 5 B17)."""
    if not isinstance(config, dict):
        return "not a JSON object"
    xid = config.get("xid")
    if xid is not None and not isinstance(xid, dict):
        return "its xid is not a map"
    for prefix, where, keys in (("", config, ("tripped_file", "samples_file")),
                                ("xid.", xid, ("state_file", *(("reboots_file",) if xid.get("reboot") else ())) if xid is not None else ())):
        for key in keys:
            if not isinstance(where.get(key), str) or not where[key].startswith("/"):
                return f"its {prefix}{key} is not an absolute path"
    return None


def main(argv: list[str]) -> int:
    path = CONFIG
    if argv[:1] == ["--config"]:
        path, argv = argv[1], argv[2:]
    config = load(path, None)
    problem = config_problem(config)
    if problem:
        print(shown(f"rigup-gpu-guard: cannot read {path}: {problem}"), file=sys.stderr)
        return 1
    command = argv[0] if argv else "check"
    if command == "check":
        return check(config)
    tripped = config["tripped_file"]
    # typed as the check reads them: a file that is there is a trip, whatever it holds (tripped_of)
    state = tripped_of(load(tripped, None)) if os.path.exists(tripped) else None
    raw = load(config["xid"]["state_file"], {}) if config.get("xid") else {}
    xid = xid_state_of(raw)
    if command == "status":
        samples = f" ({state['samples']})" if state and state.get("samples") else ""
        print(shown(f"tripped at {state.get('time', 'an unknown time')}: {state['reason']}{samples}", 4000)
              if state else "not tripped")
        for bus, card in sorted(xid["cards"].items()):
            counts = ", ".join(f"{cls} {n}" for cls, n in sorted(card["counts"].items())) or "none this boot"
            link = card.get("link") or {}
            print(shown(f"card {bus}: Xid {counts}" + (f"; SUSPECT since {card['suspect']['since']}: {card['suspect']['line']}"
                                                        if card["suspect"] else "")
                        + (f"; PCIe Gen{link['gen']} of Gen{link['gen_max']} under load since {link['since']}"
                           if link else ""), 4000))
        return 3 if state or any(c["suspect"] for c in xid["cards"].values()) else 0
    if command == "clear":
        problem = discarded(tripped, config["samples_file"])
        if problem:
            print(shown(f"rigup-gpu-guard: not cleared: {problem}", 4000), file=sys.stderr)
            return 1
        suspect = sorted(k for k, c in xid["cards"].items() if c["suspect"])
        for card in xid["cards"].values():
            card["suspect"], card["recent"] = None, []
        if config.get("xid") and raw:
            save(config["xid"]["state_file"], xid)
        text = "rigup-gpu-guard: cleared by an operator" + (f" (was: {state['reason']})" if state else
                                                             " (was not tripped)") + \
            (f"; no longer suspect: {', '.join(suspect)}" if suspect else "")
        print(shown(text, 4000))
        subprocess.run(["logger", "-t", "rigup-gpu-guard", "-p", "user.notice", shown(text, 4000)], check=False)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
