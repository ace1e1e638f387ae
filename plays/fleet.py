"""The fleet at a glance (status.py): one row per host, read in one round trip per host.

:class:`FleetStatus` runs one shell command made of sections (``##rigup-status:NAME`` then the
section's output): the cards (nvidia-smi, bounded), the llama.cpp build that serves (the
``current`` link), every serving unit (``rigup-llama@*``, ``rigup-vllm@*``: state, ``/health``
code at its port, the model revision of its drop-in), the GPU guard's tripped file and its Xid
state (counts per card and class, suspect cards), and any the play adds (model_fetch's probe for
the downloads). The ``parse_*`` functions, :func:`host_row` and the renderers are pure
(tests/unit/test_fleet.py); :func:`record` keeps each host's row on the run (rigup/run.py) and
:func:`report` prints them all once, at the run's end, sorted by host name, with a row ``unreachable
(reason)`` for each host that could not be reached (heard by rigup.summary).

The table fits 120 columns for a typical host, what is wrong first: a line above it names the
hosts that need attention; each host's row is a summary (its cards' total draw / limit and the
hottest card); under it, indented, a row for each card that needs attention (a downtrained link,
Xid events this boot, suspect, telemetry lost), the guard's reason when tripped and each model
not downloaded. JSON (:func:`render_json`) has every field.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import textwrap
import time

import click
from pyinfra.api import FactBase

from rigup import run as run_state
from rigup.contract import llama_server
from rigup.gpu.catalogue import card_for
from rigup.gpu.plan import link_state
from rigup.gpu.facts import GPU_QUERY, parse_gpus, sections
from shipped.xid import card_key
from rigup.boundary import Unreadable, burnin
from rigup.boundary.core import loads   # every JSON a host or Prometheus gave: RecursionError too
from rigup.boundary.numbers import json_whole, number, whole
from rigup.names import GUARD_TIMER, RELAY_UNIT, WATCHDOG_TIMER, burnin_copy
from rigup.instances import every, left_out
from rigup.text import say, shown, shown_lines

MARK = "##rigup-status:"
XID_MARK = "@@ xid"      # in the guard section: the host's boot id, then the guard's Xid state file
# The most of the guard's Xid state status reads: its 50 events hold a kernel line each (up to ~1 KiB: 64 KiB
# cut a state of long lines, round 5 C15); a state past it reads as unreadable, never as no state
XID_MAX_BYTES = 1 << 20
BOOT_ID = "/proc/sys/kernel/random/boot_id"
ENERGY_QUERY = "rigup:host_joules_per_token"   # roles/metrics/prometheus.py's recorded series
WIDTH = 120              # the table's target width (a typical host's row, the notes, the summary line)
CELL_CHARS, LINE_CHARS = 1000, 4000   # the most of a cell and of a line the table shows (rigup.text.shown)
SMI_TIMEOUT_S = 5
# The most lines of nvidia-smi's a row reads, and the most characters of each (issue 61: 200000 card lines
# held status for minutes): a host has a few cards, 16 on the largest boards; the rest is not understood.
SMI_LINES, SMI_LINE_CHARS = 256, 16384
SMI = (f"if command -v nvidia-smi >/dev/null 2>&1; then {{ timeout -k 1 {SMI_TIMEOUT_S} nvidia-smi "
       f"--query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1; echo \"smi_rc=$?\"; }} | "
       f"awk '/^smi_rc=/ || NR <= {SMI_LINES} {{ print substr($0, 1, {SMI_LINE_CHARS}) }}'; fi")
# What one section of a host's answer may hold (each section's own bound is tighter where it has one:
# the guard's, the burn-in records'): the shell cuts it there, whatever a command printed
SECTION_BYTES = 4 << 20
# Each serving unit's drop-in: its state, its --port and --host (read from the ExecStart line, kept to
# digits and address characters before they reach curl), /health's HTTP code there, and the model
# revision its comment records (roles/llama_server, roles/vllm: "..., model <revision>"). A router's key
# reaches curl as one header line (``-H @-``: headers only, never curl's config, which a key holding a
# newline and ``output = FILE`` once turned into a file root wrote), its first line's printable ASCII, and
# only to the unit's own listener (issue 61, round 5 C1): a unit that is down (the guard stopped it, a
# restart loop, systemctl stop) leaves its port to any local user, who would collect the key at the next
# status. ``own UNIT PORT``: the unit active, and every process listening on PORT (ss's pids) its MainPID
# or a child of it; else no key is sent (ss without root names no pid: no key either).
SERVING = r"""own() {
  [ "$(systemctl is-active "$1" 2>/dev/null)" = active ] || return 1
  m=$(systemctl show -p MainPID --value "$1" 2>/dev/null | head -n 1 | tr -cd 0-9)
  case $m in ''|0) return 1;; esac
  pids=$(ss -Hltnp "sport = :$2" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -c5- | sort -u)
  [ -n "$pids" ] || return 1
  for p in $pids; do
    [ "$p" = "$m" ] || [ "$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)" = "$m" ] || return 1
  done
}
for d in /etc/systemd/system/rigup-llama@*.service.d /etc/systemd/system/rigup-vllm@*.service.d; do
  [ -d "$d" ] || continue; u=${d##*/}; u=${u%.d}; f=$d/rigup.conf
  port=$(grep -o -e '--port[= ][0-9]*' "$f" 2>/dev/null | head -n 1 | tr -cd 0-9)
  bind=$(grep -o -e '--host[= ][^ ]*' "$f" 2>/dev/null | head -n 1 | cut -c8- | tr -cd '0-9A-Za-z.:-')
  case $bind in ''|0.0.0.0|::) bind=127.0.0.1;; *:*) bind="[$bind]";; esac
  code=; [ -z "$port" ] || code=$(curl -s -o /dev/null -m 2 --noproxy '*' -w '%{http_code}' "http://$bind:$port/health" 2>/dev/null)
  printf '%s\n' "@@ $u" "active=$(systemctl is-active "$u" 2>/dev/null)" "port=$port" "health=$code"
  printf '%s\n' "revision=$(sed -n 's/^# .*, model \([^ ,]*\)$/\1/p' "$f" 2>/dev/null | head -n 1)"
  if [ -n "$port" ] && grep -q -e '--models-preset' "$f" 2>/dev/null; then
    kf=$(grep -o -e '--api-key-file[= ][^ ]*' "$f" | head -n 1 | cut -c16- | tr -d "'\"")
    hdr=; [ -n "$kf" ] && [ -r "$kf" ] && own "$u" "$port" && hdr="Authorization: Bearer $(head -n 1 "$kf" | tr -cd '\041-\176')"
    printf '%s\n' "models=$(printf '%s\n' "$hdr" | curl -s -m 2 --noproxy '*' -H @- "http://$bind:$port/models" 2>/dev/null | head -c 1048576 \
      | tr -d '\n' | grep -o -e '"id": *"[^"]*"' -e '"value": *"[^"]*"' | tr -d '" ' | paste -s -d, - | head -c 4096)"
  fi
done; true"""
_UNIT = re.compile(r"rigup-(llama|vllm)@(.+)\.service")
# The units that watch a host for rigup (issue 65: one that is down is named, never silent), each
# with the words status uses for it. A unit counts only where it is enabled: rigup enables each one
# the host's configuration asks for (the watchdog's timer is disabled where nothing is watched), so
# one enabled and not active watches nothing. Their words come from systemctl (kept to [a-z-]).
# A timer stays active while the service it starts fails at every run (rerun3's NW3: the host
# unwatched, status silent), so each line carries its service's last result too (systemd's Result:
# success, or why it failed), and a timer's service whose last run failed is named by its words.
WATCHERS = {RELAY_UNIT: "metrics relay", WATCHDOG_TIMER: "watchdog timer",
            GUARD_TIMER: "GPU guard timer", "prometheus-node-exporter.service": "node exporter"}
TIMED = {f"{u.removesuffix('.timer')}.service": what.removesuffix(" timer")
         for u, what in WATCHERS.items() if u.endswith(".timer")}   # a timer's service -> its words
WATCHERS_SECTION = (f"for u in {' '.join(shlex.quote(u) for u in WATCHERS)}; do "
                    'echo "$u $(systemctl is-enabled "$u" 2>/dev/null | head -n 1) '
                    '$(systemctl is-active "$u" 2>/dev/null | head -n 1) '
                    '$(systemctl show -p Result --value "${u%.*}.service" 2>/dev/null | head -n 1)"; done; true')
_STATE = re.compile(r"[a-z-]{1,32}")


def build_section(llama_cpp_dir: str) -> str:
    """The target of ``<llama_cpp_dir>/current`` (roles/llama_cpp switches it), then the ratio of
    its decode to the build it replaced (its smoke's comparison, in ``rigup-smoke.json``) as
    ``ratio=1.02`` when it was measured."""
    current = shlex.quote(llama_cpp_dir.rstrip('/') + '/current')
    return (f"readlink {current} 2>/dev/null; f={current}/rigup-smoke.json; [ -f \"$f\" ] && [ ! -L \"$f\" ] && "
            "head -c 65536 \"$f\" | grep -o '\"ratio\": [0-9.]*' | head -n1 | sed 's/\"ratio\": /ratio=/'; true")


def guard_section(tripped_file: str, xid_state_file: str | None = None) -> str:
    """``tripped`` and the file's JSON (roles/gpu_guard/shipped/guard.py) while the guard is tripped; then,
    when ``xid_state_file`` exists, :data:`XID_MARK`, ``boot=<this boot's id>`` and its JSON (at most
    :data:`XID_MAX_BYTES`). Each file on one line behind ``|``, as the burn-in section's: a file's line is
    never a marker (round 5 C4: a tripped file holding ``##rigup-status:gpus`` ended the section)."""
    q = shlex.quote(tripped_file)
    text = f"if [ -e {q} ]; then echo tripped; head -c 4096 {q} | tr -d '\\n' | sed 's/^/|/'; echo; fi"
    if xid_state_file:
        x = shlex.quote(xid_state_file)
        text += (f"\nif [ -e {x} ]; then echo {shlex.quote(XID_MARK)}; printf '%s\\n' \"boot=$(cat {BOOT_ID} 2>/dev/null)\"; "
                 f"head -c {XID_MAX_BYTES} {x} | tr -d '\\n' | sed 's/^/|/'; echo; fi")
    return text


def energy_section(url: str) -> str:
    """On a monitoring host: Prometheus's ``rigup:host_joules_per_token`` (roles/metrics: every
    card's draw over the tokens its llama-server instances generate per second, 5 minutes' rate, while
    they generate) for every host, as the query API's JSON (:func:`parse_energy`)."""
    return (f"curl -s -m 3 --noproxy '*' -G --data-urlencode query={shlex.quote(ENERGY_QUERY)} "
            f"{shlex.quote(url.rstrip('/') + '/api/v1/query')} 2>/dev/null; true")


def loads_section(relay: str, routers: list[str]) -> str:
    """Each router instance's loads as the host's metrics relay counts them (roles/metrics/shipped/relay.py,
    from the router's /models/sse): ``@@ NAME``, then its ``rigup_router_model_loads_total`` and
    ``rigup_router_model_last_load_seconds`` lines (:func:`parse_loads`). ``relay``: its base URL."""
    return "\n".join(f"echo {shlex.quote('@@ ' + name)}; curl -s -m 2 --noproxy '*' "
                      f"{shlex.quote(relay.rstrip('/') + '/metrics/' + name)} 2>/dev/null | head -c 1048576 | grep -E "
                      "'^rigup_router_(model_(loads_total|last_load_seconds)[{]|queue_(waiting|limit) )' | head -n 256"
                      for name in routers) + "\ntrue"


QUEUE = "(queue)"   # parse_loads's key of a router's queue (never a model's name: a name has no parenthesis)


def parse_loads(lines: list[str]) -> dict[str, dict[str, dict]]:
    """The loads section -> ``{instance: {model: {"loads": N, "last_s": seconds or None}}}`` (model
    names escaped for the terminal), and for a queued router ``{QUEUE: {"waiting", "limit"}}``; an
    instance whose relay said nothing is left out."""
    out: dict[str, dict[str, dict]] = {}
    current = None
    for line in lines:
        if line.startswith("@@ "):
            current = line[3:].strip()
            continue
        q = re.fullmatch(r"rigup_router_queue_(waiting|limit) (\S{1,20})", line.strip())
        if q and current is not None:   # a queued router: its HAProxy queue
            if (n := whole(q.group(2), 999_999_999)) is not None:   # whole(): "٣٣" is no count
                out.setdefault(current, {}).setdefault(QUEUE, {})[q.group(1)] = n
            continue
        m = re.fullmatch(r'rigup_router_model_(loads_total|last_load_seconds)\{model="([^"]{1,128})"\} ([0-9.eE+]+)',
                         line.strip())
        # a count of loads below a trillion, a load's seconds below a day; else not a figure of the relay's
        value = number(m.group(3), float, 0, 1e12 if m.group(1) == "loads_total" else 86400) if m else None
        if current is None or value is None:
            continue
        entry = out.setdefault(current, {}).setdefault(shown(m.group(2), 64), {"loads": 0, "last_s": None})
        if m.group(1) == "loads_total":
            entry["loads"] = int(value)
        else:
            entry["last_s"] = round(value, 2)
    return out


def status_command(parts: dict[str, str]) -> str:
    """One shell command: each section's marker, then its command in a subshell (a section may
    hold a here-document, so they are joined by newlines)."""
    return "\n".join(f"echo {shlex.quote(MARK + name)}\n(\n{command}\n) | head -c {SECTION_BYTES}"
                     for name, command in parts.items()) + "\ntrue"


class FleetStatus(FactBase):
    """The output of each section of ``parts`` ({name: shell}), as lines: {name: [line, ...]}."""

    default = dict

    def command(self, parts: dict[str, str]) -> str:
        return status_command(parts)

    def process(self, output: list[str]) -> dict[str, list[str]]:
        return sections(output, MARK)


# ----------------------------------------------------------------------------- parsers
def _key(bus_id) -> str | None:
    """``00000000:4E:00.0`` -> ``0000:4e:00`` (shipped.xid.card_key, as the guard's Xid state names
    cards); None when it is not a bus id."""
    try:
        return card_key(bus_id)
    except (ValueError, TypeError, AttributeError):
        return None


def parse_cards(lines: list[str]) -> dict:
    """The gpus section -> ``{"cards": [{index, bus, class, draw_w, limit_w, temp_c, vram_used_mib,
    vram_total_mib, link}], "lost": n, "lost_cards": [bus, ...], "smi": None | "missing" | "hung" |
    "failed (rc N)" | "N lines not understood"}``; ``bus`` is the card's key (``0000:4e:00``, :func:`_key`).
    A line that is no card (an index that is not a number: a lying host's "²" or 5000 digits) is
    counted as not understood, once nvidia-smi did not fail; so is a card listed again (parse_gpus) and
    every line past the first :data:`SMI_LINES` (a host's answer is read in bounds). ``rc``: the last
    ``smi_rc=`` line's (the shell's own, after nvidia-smi's), an exit status 0..255."""
    rc_line = next((ln for ln in reversed(lines) if ln.startswith("smi_rc=")), None)
    said = [ln for ln in lines if ln.strip() and not ln.startswith("smi_rc=")]
    gpus = parse_gpus([ln[:SMI_LINE_CHARS] for ln in said[:SMI_LINES]])
    rc = whole(rc_line[7:], 255) if rc_line else None
    unread = len(said) - len(gpus)   # parse_gpus makes at most one card of a line
    smi = ("missing" if rc_line is None else "hung" if rc in (124, 137) else
           f"failed (rc {rc})" if rc != 0 and not gpus else
           f"{unread} line{'s' if unread > 1 else ''} not understood" if unread else None)
    cards = []
    for g in gpus:
        if g.get("lost"):
            continue
        card = card_for(g)
        cards.append({"index": g["index"], "bus": _key(g.get("bus_id")),
                      "class": card["class"] if card else (g.get("name") or "?"),
                      "draw_w": g.get("power_draw_w"), "limit_w": g.get("power_limit_w"),
                      "temp_c": g.get("temperature_c"), "vram_used_mib": g.get("memory_used_mib"),
                      "vram_total_mib": g.get("memory_total_mib"),
                      "link": link_state(g.get("pcie_gen"), g.get("pcie_gen_max"), g.get("pcie_width"),
                                         g.get("pcie_width_max"))})
    lost = [g for g in gpus if g.get("lost")]
    return {"cards": cards, "lost": len(lost), "lost_cards": [k for k in (_key(g.get("bus_id")) for g in lost) if k],
            "smi": smi}


def parse_serving(lines: list[str]) -> list[dict]:
    """The serving section -> ``[{"unit", "engine", "name", "active", "port", "health", "revision"}]``
    (port an int or None, health the HTTP code or None when nothing answered)."""
    out: list[dict] = []
    for line in lines:
        if line.startswith("@@ "):
            unit = line[3:].strip()
            m = _UNIT.fullmatch(unit)
            out.append({"unit": unit, "engine": m.group(1) if m else "?", "name": m.group(2) if m else unit,
                        "active": None, "port": None, "health": None, "revision": None})
        elif out and "=" in line:
            key, _, value = line.partition("=")
            value = value.strip(" \t\r\n\f\v")   # ASCII's blanks alone, as numbers (U+0085 is no blank there)
            if key == "port":   # a TCP port, an HTTP status (curl's 000: nothing answered); else unknown
                out[-1]["port"] = whole(value, 65535) or None
            elif key == "health":
                code = whole(value, 599)
                out[-1]["health"] = code if code is not None and code >= 100 else None
            elif key in ("active", "revision"):
                out[-1][key] = None if value in ("", "None") else value
            elif key == "models":   # a router's /models (issue 49): which of its set are loaded
                out[-1]["loaded"] = loaded_of(value)
    return out


def parse_watchers(lines: list[str]) -> dict[str, str]:
    """The watchers section -> ``{its words: its state}`` for each unit of :data:`WATCHERS` that is
    enabled and not active (``{"metrics relay": "failed"}``), and for each enabled timer whose
    service's last run did not succeed, its service's words (:data:`TIMED`: ``{"watchdog":
    "failed"}``; a result of another shape counts as failed); a line of another shape is left out."""
    out = {}
    for line in lines[:len(WATCHERS)]:
        unit, enabled, active, result = (line.split() + ["", "", "", ""])[:4]
        if unit not in WATCHERS or enabled != "enabled":
            continue
        if active != "active":
            out[WATCHERS[unit]] = active if _STATE.fullmatch(active) else "unknown"
        service = f"{unit.removesuffix('.timer')}.service"
        if service in TIMED and result and result != "success":
            out[TIMED[service]] = "failed"
    return out


def loaded_of(text: str) -> list[str] | None:
    """A router's /models as the serving section reduces it (``id:gemma,value:unloaded,id:tiny,
    value:loaded``: each model's id and its status, in order; the answer itself may be long: each
    model's arguments) -> the ids it has loaded (escaped for the terminal); None when there is no
    model in it."""
    loaded, current, seen = [], None, False
    for part in text.split(","):
        key, _, value = part.partition(":")
        if key == "id":
            current, seen = value, True
        elif key == "value" and current is not None:
            if value == "loaded":
                loaded.append(shown(current, 64))
            current = None
    return loaded if seen else None


BURNIN_MAX_BYTES = 262144


def burnin_section(results_file: str) -> str:
    """rigup-burnin's records (roles/burnin), at most :data:`BURNIN_MAX_BYTES`, each line behind "|"
    (no line of the file can pass for another section's marker)."""
    return f"head -c {BURNIN_MAX_BYTES} {shlex.quote(results_file)} 2>/dev/null | sed 's/^/|/'; true"


def _quarantined(cards: dict) -> dict:
    """``{card key: {"index", "level", "failed": text}}`` of the quarantined cards of typed
    records (rigup.boundary.burnin): failed, not cleared by the operator."""
    out = {}
    for rec in cards.values():
        key = _key(rec.get("bus_id"))
        if key and rec["passed"] is False and not rec.get("cleared"):
            out[key] = {"index": rec.get("index"), "level": shown(rec.get("level") or "?", 16),
                        "failed": shown("; ".join(rec["failed"]) or "?", 300)}
    return out


def parse_burnin(lines: list[str], where: str = "burn-in records", last: dict | None = None) -> dict:
    """The burn-in section -> :func:`_quarantined` of its records (rigup.boundary.burnin.records)
    and of ``last`` (the controller's copy's, rigup.names.burnin_copy) those of cards without a
    record here (as roles/burnin judges them); :class:`rigup.boundary.Unreadable` naming ``where``
    when the section does not read."""
    return _quarantined(_records(lines, where, last))


def _records(lines: list[str], where: str, last: dict | None) -> dict:
    own = burnin.records("\n".join(ln[1:] if ln.startswith("|") else ln for ln in lines), where).cards
    return {**(last or {}), **own}


def _due(cards: dict, every_days, now: float) -> dict:
    """``{card key: {"index", "days"}}`` of the passing cards whose last run is older than
    ``burnin_every_days`` (roles/burnin tests them again: in a roll where a unit serves from them)."""
    out = {}
    for rec in cards.values():
        key, found = _key(rec.get("bus_id")), burnin.due(rec, every_days, now)   # the one rule (issue 65)
        if key and found:
            out[key] = {"index": rec.get("index"), "days": found[0], "every": every_days}
    return out


def _file(line: str) -> str:
    """A file's line of the guard section without its ``|`` (guard_section)."""
    return line[1:] if line.startswith("|") else line


def parse_guard(lines: list[str]) -> dict:
    """The guard section -> ``{"tripped": bool, "reason": str | None, "time": str | None, "xid":
    {card: ...}, "xid_unreadable": why | None}`` (:func:`read_xid` of what follows :data:`XID_MARK`)."""
    at = next((i for i, ln in enumerate(lines) if ln.strip() == XID_MARK), len(lines))
    lines, (xid, unreadable) = lines[:at], read_xid(lines[at + 1:]) if at < len(lines) else ({}, None)
    if not any(ln.strip() == "tripped" for ln in lines):
        return {"tripped": False, "reason": None, "time": None, "xid": xid, "xid_unreadable": unreadable}
    body = [_file(ln) for ln in lines[lines.index("tripped") + 1:]] if "tripped" in lines else []
    try:
        record = loads(body[0], "the guard's tripped record") if body and body[0].strip() else {}
    except Unreadable as e:   # nested 200000 deep, a key twice, cut at 4096 bytes: shown as unreadable
        record = {"reason": f"(its record does not read: {e.why[:80]})"}
    record = record if isinstance(record, dict) else {"reason": "(its record is not a JSON object)"}
    reason, time = record.get("reason"), record.get("time")
    return {"tripped": True, "reason": reason if isinstance(reason, str) and reason else "(no reason recorded)",
            "time": time if isinstance(time, str) else None, "xid": xid, "xid_unreadable": unreadable}


def read_xid(lines: list[str]) -> tuple[dict, str | None]:
    """The lines after :data:`XID_MARK` (``boot=<id>``, the guard's Xid state as JSON) -> (:func:`xid_cards`,
    None), or ({}, why) when the state does not read (not JSON, cut at :data:`XID_MAX_BYTES`, no map of
    ``cards``): the guard holds a state, so its suspect cards cannot be told, and status says so (fail
    closed, as burn-in's records; round 5 C15: a cut state read as none, a suspect card shown ``ok``)."""
    boot = next((ln[5:].strip() for ln in lines if ln.startswith("boot=")), "")
    text = "".join(_file(ln) for ln in lines if not ln.startswith("boot=")).strip()
    try:
        state = loads(text, "the guard's Xid state") if text else None
    except Unreadable as e:
        return {}, shown(f"{e.why} (more than {XID_MAX_BYTES} bytes?)" if len(text) >= XID_MAX_BYTES else e.why, 200)
    if not isinstance(state, dict) or not isinstance(state.get("cards"), dict):
        return {}, "not the guard's (no map of cards)"
    return xid_cards(state, boot), None


def parse_xid(lines: list[str]) -> dict:
    """:func:`read_xid`'s cards alone (``{}`` when the state does not read)."""
    return read_xid(lines)[0]


def _small(n) -> bool:
    """An int of the guard's state file worth showing: not a bool, 0 to a billion (a 4000-digit count
    a host wrote there is not one)."""
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 10 ** 9


def _counts(value) -> dict[str, int]:
    """A card's counts from the state file, by class: the positive :func:`_small` ints only (a bool, a
    float, text and anything but a dict are ignored)."""
    if not isinstance(value, dict):
        return {}
    return {cls: n for cls, n in sorted(value.items(), key=lambda kv: str(kv[0]))
            if isinstance(cls, str) and _small(n) and n > 0}


def xid_cards(state, boot: str = "") -> dict:
    """The guard's Xid state (roles/gpu_guard/shipped/guard.py: ``{"boot", "cards": {card: {"counts",
    "recent", "suspect", "link"}}, ...}``) -> ``{card key: {"counts": {class: n}, "suspect": bool, "since":
    str | None}}`` (and ``"slow_link": "Gen3 of Gen4 under load"`` for a link the guard found below
    its maximum under load), read defensively: what has the wrong type is left out, never an error. Counts
    recorded in another boot than ``boot`` (the host's, when known) are left out: the guard starts
    them again at its next check; a suspect card stays suspect, and a suspect mark that does not read
    (``{}``, ``"yes"``, ``0``) is still one, as the guard holds it (roles/gpu_guard/shipped/guard.py
    suspect_of: its units stay stopped; rerun2's N12), its time unknown."""
    cards = state.get("cards") if isinstance(state, dict) else None
    if not isinstance(cards, dict):
        return {}
    recorded = state.get("boot")
    this_boot = not boot or not isinstance(recorded, str) or not recorded or recorded == boot
    out = {}
    for name, card in cards.items():
        key = _key(name)
        if key is None or not isinstance(card, dict):
            continue
        suspect = card.get("suspect")
        since = suspect.get("since") if isinstance(suspect, dict) else None
        out[key] = {"counts": _counts(card.get("counts")) if this_boot else {},
                    "suspect": suspect is not None and suspect is not False,
                    "since": since if isinstance(since, str) else None}
        link = card.get("link") if this_boot else None
        if isinstance(link, dict) and _small(link.get("gen")) and _small(link.get("gen_max")) \
                and link["gen"] < link["gen_max"]:
            out[key]["slow_link"] = f"Gen{link['gen']} of Gen{link['gen_max']} under load"
    seen = state.get("seen") if isinstance(state.get("seen"), dict) else {}   # the guard's last sample of each card
    for name, card in seen.items():
        key, index = _key(name), card.get("index") if isinstance(card, dict) else None
        if key and _small(index):
            out.setdefault(key, {"counts": {}, "suspect": False, "since": None})["index"] = index
    return out


def parse_energy(lines: list[str]) -> dict[str, float]:
    """The energy section (Prometheus's answer) -> ``{host: joules per token}``: the finite positive
    values only; ``{}`` when Prometheus did not answer or answered anything else."""
    try:
        answer = loads("".join(lines) or "null", "Prometheus's answer")
        results = answer["data"]["result"] if answer.get("status") == "success" else []
    except (Unreadable, TypeError, KeyError, AttributeError):
        return {}
    out = {}
    for r in results if isinstance(results, list) else []:
        try:
            name, text = r["metric"]["host"], r["value"][1]
            # Prometheus prints a sample's float64 in full ('f', shortest: 0.4166666666666667); float()
            # would take "1_0" and "١٢"
            value = number(text, float, places=17) if isinstance(text, str) else None
        except (TypeError, KeyError, IndexError, ValueError):
            continue
        if isinstance(name, str) and value is not None and 0 < value < float("inf"):
            out[name] = value
    return out


def parse_build(lines: list[str]) -> str | None:
    """The build section -> the target of ``current`` (``builds/b6123-3f2a...``), or None."""
    target = next((ln.strip() for ln in lines if ln.strip() and not ln.startswith("ratio=")), None)
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


def parse_build_ratio(lines: list[str]) -> float | None:
    """The build section -> the serving build's decode against the one it replaced (1.02), or None."""
    found = next((ln[6:].strip(" \t\r\n\f\v") for ln in lines if ln.startswith("ratio=")), "")
    return number(found, float, 0, 999.999999, places=6)


# ----------------------------------------------------------------------------- rows
REVISION_CHARS = 8     # a model's revision in model@revision
BUILD_HASH_CHARS = 4   # the hash of a build id (roles/llama_cpp: <ref>-<10 hex>) in the table


def tuned_text(entry: dict | None) -> str | None:
    """``tuned 1.84x at 4 concurrent`` of a ``llama_server_tuned`` entry (None: none, or no figures;
    ``tuned: unreadable`` when its figures are no YAML numbers, e.g. ``tok_s: "12"`` edited by hand)."""
    if not isinstance(entry, dict) or not entry.get("tok_s") or not entry.get("baseline_tok_s"):
        return None
    # a YAML number of the host_vars rigup wrote; text ("12") is none
    tok_s, baseline = (number(entry[k], float, 0, 1e9) if not isinstance(entry[k], str) else None
                       for k in ("tok_s", "baseline_tok_s"))
    ratio = tok_s / baseline if tok_s and baseline else None
    if ratio is None or not math.isfinite(ratio) or ratio > 1e6:   # a subnormal baseline made 'tuned infx'
        return "tuned: unreadable"
    return f"tuned {ratio:.2f}x at {json_whole(entry.get('concurrency'), 1 << 20) or '?'} concurrent"


def configured(name: str, data) -> list[tuple[str, str, dict]]:
    """Host ``name``'s serving instances as status.py reads them (``data``: its configuration;
    rigup.instances ``every``); each entry not of its form said, naming the host and the key,
    and left out of the host's row."""
    for where, why in left_out(data):
        say(f"[{name}] {where}: {why}: left out of status (preflight refuses it)", fg="yellow")
    return every(data)


def served_models(instances: list[tuple[str, str, dict]]) -> dict[str, str]:
    """{server name: its configured model} for :func:`host_row` (``models``): each serving instance
    (``instances``: :func:`configured`) by its name, and each model M a router pins (contract
    ``pinned``), whose server rigup-llama@NAME.M the serving section names NAME.M, M."""
    out = {name: inst["model"] for _, name, inst in instances}
    out.update({llama_server.PINNED_UNIT.format(name, m): m for _, name, inst in instances
                for m in llama_server.pinned(inst)})
    return out


def host_row(name: str, found: dict[str, list[str]], *, downloads: list[str], maintenance: bool,
             models: dict[str, str], tuned: dict | None = None, burnin_at: str = "burnin.json",
             burnin_every_days=None) -> dict:
    """The row of reachable host ``name``: ``found`` is :class:`FleetStatus`'s value, ``downloads``
    one short line per model (roles/model_fetch short_progress), ``models`` {instance name: its
    configured model} (for model@revision), ``tuned`` the host's ``llama_server_tuned``
    (rigup/instances/tuned.py), ``burnin_at`` the path of its burn-in records (rigup.names.burnin_file)."""
    cards = parse_cards(found.get("gpus", []))
    serving = parse_serving(found.get("serving", []))
    loads = parse_loads(found.get("loads", []))
    for s in serving:
        s["model"] = f"{models.get(s['name'], '?')}@{(s['revision'] or '?')[:REVISION_CHARS]}"
        s["tuned"] = tuned_text((tuned or {}).get(s["name"]))
        if s["name"] in loads:   # a router: the loads the relay counted, per model
            s["loads"] = loads[s["name"]]
    return {"host": name, "reachable": True, "maintenance": maintenance, **cards,
            "build": parse_build(found.get("build", [])), "build_ratio": parse_build_ratio(found.get("build", [])),
            "serving": serving,
            "downloads": downloads, "guard": parse_guard(found.get("guard", [])),
            "watchers_down": parse_watchers(found.get("watchers", [])),
            **burnin_part(name, found, burnin_at, burnin_every_days)}


def burnin_part(name: str, found: dict[str, list[str]], path: str, every_days=None) -> dict:
    """The row's ``quarantined`` cards (:func:`parse_burnin`) and ``burnin_unreadable`` (why the
    host's records at ``path``, or the controller's copy of them, do not read; else None): while the
    host's do not, the copy's last good records name the quarantined cards (fail closed)."""
    if "burnin" not in found:
        return {"quarantined": {}, "burnin_due": {}, "burnin_unreadable": None}
    try:
        copy, bad = burnin.cached(burnin_copy(name)), []
    except Unreadable as e:
        copy, bad = None, [f"{e.where}: {e.why}"]
    last = copy.cards if copy else {}
    try:
        cards = _records(found["burnin"], f"{name}:{path}", last)
    except Unreadable as e:
        cards, bad = last, [f"{e.where}: {e.why}", *bad]
    return {"quarantined": _quarantined(cards), "burnin_due": _due(cards, every_days, time.time()),
            "burnin_unreadable": shown("; ".join(bad), 600) if bad else None}


def unreachable_row(name: str, reason: str) -> dict:
    """The row of a host that could not be reached."""
    return {"host": name, "reachable": False, "reason": reason}


# ----------------------------------------------------------------------------- what needs attention
SEVERITY = ("LOST", "SUSPECT", "QUARANTINED", "telemetry lost", "DOWNTRAINED", "Xid", "DUE")   # a card's tag in the summary line


def _num(value, unit: str, digits: int = 0) -> str:
    return "?" if value is None else f"{value:.{digits}f}{unit}"


def _total(cards: list[dict], key: str, scale: float = 1) -> str:
    """The cards' ``key`` summed (``/ scale``), ``+?`` after it when a card's is unknown (not
    reported, or not understood), ``?`` when none is known."""
    known = [c[key] for c in cards if c.get(key) is not None]
    return (f"{sum(known) / scale:.0f}" if known else "?") + ("+?" if known and len(known) < len(cards) else "")


def card_problems(card: dict | None, xid: dict | None, lost: bool = False,
                  quarantine: dict | None = None, due: dict | None = None) -> list[tuple[str, str]]:
    """What is wrong with one card, as (its tag in :data:`SEVERITY`, the text of its row), in the
    row's order: lost or telemetry, link, Xid counts this boot, suspect. ``card`` is None for a card
    nvidia-smi does not list (``lost``: it said it cannot reach it)."""
    found = []
    if lost:
        found.append(("LOST", "LOST (nvidia-smi cannot reach it)"))
    elif card is not None and (card.get("draw_w") is None or card.get("temp_c") is None):
        found.append(("telemetry lost", f"telemetry lost (draw {_num(card.get('draw_w'), 'W')}, "
                                        f"temp {_num(card.get('temp_c'), 'C')})"))
    link, xid = (card or {}).get("link") or {}, xid or {}
    why = [w for w in (link.get("why") if link.get("downtrained") else None, xid.get("slow_link")) if w]
    if why:
        found.append(("DOWNTRAINED", f"{', '.join(why)} DOWNTRAINED"))
    if xid.get("counts"):
        found.append(("Xid", "Xid " + ", ".join(f"{cls} {n}" for cls, n in sorted(xid["counts"].items()))))
    if xid.get("suspect"):
        found.append(("SUSPECT", "SUSPECT" + (f" since {xid['since']}" if xid.get("since") else "")))
    if quarantine:
        found.append(("QUARANTINED", f"QUARANTINED by its {quarantine['level']} burn-in: {quarantine['failed']}"))
    if due:
        when = (f"its last run was {due['days']} days ago" if due["days"] >= 0
                else f"its last run is dated {-due['days']} days in the future")
        found.append(("DUE", f"burn-in DUE: {when} (burnin_every_days {due['every']}); a roll tests it again"))
    return found


def attention_cards(row: dict) -> list[dict]:
    """The cards of reachable ``row`` that need attention: those nvidia-smi lists, by index, then
    the others (lost, or named only by the guard's Xid state), by bus: ``[{"name": "GPU 3" or
    "GPU ?", "bus": "0000:4e:00", "problems": card_problems(...)}]``."""
    xid = (row.get("guard") or {}).get("xid") or {}
    quarantined = row.get("quarantined") or {}
    out, listed = [], set()
    for c in row["cards"]:
        listed.add(c.get("bus"))
        problems = card_problems(c, xid.get(c.get("bus")), quarantine=quarantined.get(c.get("bus")),
                                 due=(row.get("burnin_due") or {}).get(c.get("bus")))
        if problems:
            out.append({"name": f"GPU {c['index']}", "bus": c.get("bus") or "?", "problems": problems})
    lost = set(row.get("lost_cards") or [])
    for bus in sorted((lost | set(xid) | set(quarantined)) - listed):
        problems = card_problems(None, xid.get(bus), lost=bus in lost, quarantine=quarantined.get(bus))
        index = (xid.get(bus) or {}).get("index", (quarantined.get(bus) or {}).get("index"))   # as last seen
        if problems:
            out.append({"name": "GPU ?" if index is None else f"GPU {index}", "bus": bus, "problems": problems})
    return out


def _download_failed(text: str) -> str | None:
    """The model of a download line that failed (``big failed: ...``), else None."""
    name, sep, _ = text.partition(" failed: ")
    return name if sep else None


def host_problems(row: dict) -> list[str]:
    """What is wrong with a host, in a few words each, most urgent first: unreachable; guard
    TRIPPED; nvidia-smi hung or failed; each card that needs attention (``GPU 3 SUSPECT``: its
    worst tag); a serving unit not active (``dead failed``; not while in maintenance or tripped,
    which stop them); a download failed; a watcher enabled and not active (``metrics relay failed``)."""
    if not row["reachable"]:
        return ["unreachable"]
    found = ["guard TRIPPED"] if row["guard"]["tripped"] else []
    if row.get("smi") and row["smi"] != "missing":
        found.append(f"nvidia-smi {row['smi']}")
    for c in attention_cards(row):
        worst = min((tag for tag, _ in c["problems"]), key=SEVERITY.index)
        found.append(f"{c['name'] if c['name'] != 'GPU ?' else 'GPU ' + c['bus']} {worst}")
    if not row["maintenance"] and not row["guard"]["tripped"]:
        found += [f"{s['name']} {s['active'] or 'unknown'}" for s in row["serving"] if s["active"] != "active"]
    found += [f"{m} download failed" for m in map(_download_failed, row["downloads"]) if m]
    found += [f"{what} {state}" for what, state in (row.get("watchers_down") or {}).items()]
    if row.get("burnin_unreadable"):
        found.append("burn-in records unreadable")
    if row["guard"].get("xid_unreadable"):
        found.append("Xid state unreadable")
    return found


def summary_line(rows: list[dict], width: int = WIDTH) -> str | None:
    """``2 of 8 hosts need attention: lab2 (guard TRIPPED), lab5 (GPU 3 SUSPECT)``, hosts by name
    (at most 3 problems each, then ``+N more``), cut to ``width`` with ``and N more``; None when
    no host needs attention."""
    bad = [(r["host"], p) for r in sorted(rows, key=lambda r: r["host"]) if (p := host_problems(r))]
    if not bad:
        return None
    hosts, need = "hosts" if len(rows) != 1 else "host", "needs" if len(bad) == 1 else "need"
    line = f"{len(bad)} of {len(rows)} {hosts} {need} attention: "
    parts = [f"{h} ({', '.join(p[:3] + ([f'+{len(p) - 3} more'] if len(p) > 3 else []))})" for h, p in bad]
    shown = 0
    for i, part in enumerate(parts):
        more = f", and {len(parts) - i - 1} more" if i < len(parts) - 1 else ""
        if shown and len(line) + 2 + len(part) + len(more) > width:
            break
        line += (", " if shown else "") + part
        shown += 1
    return line + (f", and {len(parts) - shown} more" if shown < len(parts) else "")


def notes(row: dict, width: int = WIDTH) -> list[str]:
    """The rows under a host's, indented: each card that needs attention (``GPU 3 0000:4e:00  x4 of
    x16 DOWNTRAINED; Xid memory 2; SUSPECT since ...``), the guard's reason when tripped, and each
    model not downloaded (its download line), each watcher down; wrapped at ``width``."""
    if not row["reachable"]:
        return []
    texts = [f"{c['name']} {c['bus']}  {'; '.join(text for _, text in c['problems'])}" for c in attention_cards(row)]
    g = row["guard"]
    if g["tripped"]:
        texts.append(f"guard TRIPPED {g['time'] or ''}: {g['reason']}".replace("  ", " "))
    texts += [f"download {d}" for d in row["downloads"] if not d.endswith(" complete")]
    down = row.get("watchers_down") or {}
    texts += [f"{what} {state} ({unit}): a converge starts it again"
              for unit, what in WATCHERS.items() if (state := down.get(what))]
    texts += [f"{what} {state} ({unit}): its last run failed, its timer runs it again (journalctl -u {unit})"
              for unit, what in TIMED.items() if (state := down.get(what))]
    if row.get("burnin_unreadable"):   # its quarantined cards above: the controller's last good copy's
        texts.append(f"burn-in records unreadable: {row['burnin_unreadable']}")
    if g.get("xid_unreadable"):   # no suspect card can be told: the guard's own word is on the host
        texts.append(f"GPU guard's Xid state unreadable ({g['xid_unreadable']}): its suspect cards are not shown "
                     "(rigup-gpu-guard status on the host)")
    return [ln for t in texts for ln in textwrap.wrap(t, width, initial_indent="  ", subsequent_indent="      ",
                                                      break_long_words=False, break_on_hyphens=False)]


# ----------------------------------------------------------------------------- the table
def cards_cell(row: dict) -> str:
    """``8x a100`` (``2x a100, 1x h100`` when mixed; ``1 lost``; ``none``; ``(nvidia-smi hung)``);
    the cards that need attention have rows of their own under the host's."""
    counts: dict[str, int] = {}
    for c in row["cards"]:
        counts[c["class"]] = counts.get(c["class"], 0) + 1
    text = ", ".join(f"{n}x {cls}" for cls, n in counts.items()) or "none"
    if row.get("lost"):
        text += f" {row['lost']} lost"
    if row.get("smi") and row["smi"] != "missing":
        text += f" (nvidia-smi {row['smi']})"
    return text


def power_cell(row: dict) -> str:
    """The host's draw over its cards' limits and its hottest card: ``2000/3200W 61C`` (``+?``
    after the draw when a card's is unknown; ``-`` without cards), then, while it generates and a
    monitoring host's Prometheus has the figure, its joules per generated token (``0.44J/tok``)."""
    if not row["cards"]:
        return "-"
    temps = [c["temp_c"] for c in row["cards"] if c.get("temp_c") is not None]
    draw, limit = _total(row["cards"], "draw_w"), _total(row["cards"], "limit_w")
    text = f"{draw}/{limit}{'W' if limit != '?' else ''} {_num(max(temps) if temps else None, 'C')}"
    jpt = row.get("joules_per_token")
    if jpt is None:
        return text
    return f"{text} {jpt:.{2 if jpt < 10 else 1 if jpt < 100 else 0}f}J/tok"   # 3 significant digits, or whole J


def vram_cell(row: dict) -> str:
    """VRAM used over all cards, in GiB: ``12/640G`` (``+?`` as in :func:`power_cell`)."""
    cards = row["cards"]
    return f"{_total(cards, 'vram_used_mib', 1024)}/{_total(cards, 'vram_total_mib', 1024)}G" if cards else "-"


def build_cell(row: dict) -> str:
    """The build serving, its hash cut to :data:`BUILD_HASH_CHARS`: ``b6123-3f2a`` (of ``b6123-3f2a1b9c0d``)."""
    build = row["build"]
    if not build:
        return "-"
    ref, sep, digest = build.rpartition("-")
    cell = f"{ref}-{digest[:BUILD_HASH_CHARS]}" if sep and ref and re.fullmatch(r"[0-9a-f]+", digest) else build
    return cell + (f" {row['build_ratio']:.2f}x" if row.get("build_ratio") is not None else "")


def loads_text(loads: dict | None) -> str:
    """``; 3 loads, last 2.1 s`` (the loads the relay counted over the set, the slowest of each
    model's last), or "" without the relay's figures."""
    if not loads:
        return ""
    models = {m: e for m, e in loads.items() if m != QUEUE}
    last = [e["last_s"] for e in models.values() if e["last_s"] is not None]
    total = sum(e["loads"] for e in models.values())
    queue = loads.get(QUEUE) or {}
    return (f"; {total} load{'s' * (total != 1)}" + (f", last up to {max(last):g} s" if last else "")
            + (f"; queue {queue.get('waiting', '?')}/{queue.get('limit', '?')}" if queue else ""))


def serving_cell(row: dict) -> str:
    """``gemma active :8081 200 gemma-270m@dc8aac10``, one per instance, ``; ``-separated; a router
    also names what it has loaded and the loads its relay counted: ``[loaded: tiny; 2 loads, last
    up to 0.07 s]``."""
    return "; ".join(f"{s['name']} {s['active'] or '?'} :{s['port'] or '?'} {s['health'] or '-'} {s['model']}"
                     + (f" [loaded: {', '.join(s['loaded']) or 'none'}{loads_text(s.get('loads'))}]"
                        if s.get("loaded") is not None else "")
                     + (f" ({s['tuned']})" if s.get("tuned") else "") for s in row["serving"]) or "-"


def downloads_cell(row: dict) -> str:
    """Models downloaded of those configured: ``1/1`` (each one not complete has a row of its own)."""
    done = sum(1 for d in row["downloads"] if d.endswith(" complete"))
    return f"{done}/{len(row['downloads'])}" if row["downloads"] else "-"


def guard_cell(row: dict) -> str:
    """``ok`` or ``TRIPPED`` (the reason on a row of its own); ``MAINT`` while the host is in
    maintenance (rigup_maintenance: the guard is paused), ``TRIPPED MAINT`` when tripped too; ``?`` for ok
    while its Xid state does not read (its suspect cards unknown)."""
    if row["maintenance"]:
        return "TRIPPED MAINT" if row["guard"]["tripped"] else "MAINT"
    return "TRIPPED" if row["guard"]["tripped"] else "?" if row["guard"].get("xid_unreadable") else "ok"


COLUMNS = ("host", "cards", "power temp", "vram", "build", "serving", "models", "guard")


def cells(row: dict) -> list[str]:
    """The table's cells of ``row``."""
    if not row["reachable"]:
        return [row["host"], f"unreachable ({row['reason']})"] + [""] * (len(COLUMNS) - 2)
    return [row["host"], cards_cell(row), power_cell(row), vram_cell(row), build_cell(row),
            serving_cell(row), downloads_cell(row), guard_cell(row)]


def render_table(rows: list[dict]) -> str:
    """:func:`summary_line` (when a host needs attention), then the rows sorted by host name,
    columns aligned (an unreachable row spans the rest), each followed by its :func:`notes`. Each
    cell is escaped before the columns are aligned (rigup.text.shown: as wide as it is shown), and
    each line after (a note, the summary)."""
    ordered = sorted(rows, key=lambda r: r["host"])
    table = [list(COLUMNS)] + [[shown(c, CELL_CHARS) for c in cells(r)] for r in ordered]
    full = [t for t in table if not t[1].startswith("unreachable")]
    widths = [max(len(t[i]) for t in (table if i == 0 else full)) for i in range(len(COLUMNS))]
    summary = summary_line(ordered)
    lines = [shown(summary, LINE_CHARS)] if summary else []
    for row, t in zip([None] + ordered, table):
        if t[1].startswith("unreachable"):
            lines.append(f"{t[0]:<{widths[0]}}  {t[1]}")
        else:
            lines.append("  ".join(f"{c:<{w}}" for c, w in zip(t, widths)).rstrip())
        lines += [shown(note, LINE_CHARS) for note in notes(row)] if row else []
    return shown_lines("\n".join(lines), LINE_CHARS, None)


def render_json(rows: list[dict], energy: dict[str, float] | None = None) -> str:
    """``{"hosts": [row, ...]}`` sorted by host name, and ``"joules_per_token"`` ({host: J},
    as a monitoring host's Prometheus had them: shards.py hands them to the other shards' rows)."""
    doc = {"hosts": sorted(rows, key=lambda r: r["host"]), **({"joules_per_token": energy} if energy else {})}
    return json.dumps(doc, indent=1, sort_keys=True)


# ----------------------------------------------------------------------------- the run
def record(state, row: dict, fmt: str) -> None:
    """Keep ``row`` on ``state``'s run (rigup/run.py) for the report printed at its end (once, in
    format ``fmt``: table | json)."""
    run = run_state.of(state)
    run.at_end(report, state)
    run.report["fmt"] = fmt
    run.rows[row["host"]] = row


def record_energy(state, figures: dict[str, float]) -> None:
    """Keep the joules per token a monitoring host's Prometheus has for each host (:func:`parse_energy`)
    on ``state``'s run; :func:`report` puts each in its host's row."""
    run_state.of(state).energy.update(figures)


def report(state) -> None:
    """Print every host's row: those recorded, and an unreachable row for each host of the run
    that has none (its reason as rigup.summary heard it)."""
    from rigup import summary

    run = run_state.of(state)
    rows, energy = dict(run.rows), run.energy
    for host in state.inventory:
        if host.name not in rows and state.is_host_in_limit(host):
            line = summary.host_line(state, host)
            reason = line.split("unreachable: ", 1)[1] if "unreachable: " in line else line.split("] ", 1)[-1]
            rows[host.name] = unreachable_row(host.name, reason)
    for name, row in rows.items():
        if row.get("reachable"):
            row["joules_per_token"] = round(energy[name], 3) if name in energy else None
    if run.report.get("fmt") == "json":
        click.echo(render_json(list(rows.values()), energy))
    else:
        click.echo(render_table(list(rows.values())))
