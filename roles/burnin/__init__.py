"""roles/burnin: accept a card before it serves; leave a card that fails out of serving.

What it does to a host with GPUs, systemd and ``burnin_enabled: true`` (nothing elsewhere):
- installs ``rigup_prefix/bin/rigup-burnin`` (roles/burnin/shipped/acceptance.py, standard library and
  the CUDA driver API through ctypes; beside it ``rigup_xid.py``, shipped/xid.py, as the GPU guard
  has it): the operator's ``rigup-burnin status``, ``run --level
  long``, ``clear UUID``;
- runs it, after gpu_power (the soak runs at the cap it set) and cmpunlocker (the unlocked memory
  is what gets tested) and before any serving role, on the cards this converge must test
  (roles/burnin/quarantine.py: a card's first sight at ``burnin_level``; a driver or memory
  change or a higher cap at ``burnin_after_change``; the quarantined ones with ``burnin_retest``)
  and that nothing serves from (in a roll, ``rigup_rolling``: the units that hold them are stopped
  for the run and started again after it; a run whose controller died is stopped and the units
  started by the host itself once ``rigup_drain_lease_s`` passed, as the gateways' drain lapses,
  and the next converge says so), all at once, each bounded in time (a card that hangs is killed
  and quarantined, never reset). Its records, per card UUID, are ``rigup_state_dir/burnin.json``
  (rigup.names.burnin_file) and the metrics rigup_gpu_burnin_passed, rigup_gpu_quarantined,
  rigup_gpu_burnin_seconds; the controller keeps a copy of each host's under
  ``$RIGUP_CACHE_DIR`` (~/.cache/rigup)/burnin/HOST.json at each preflight (rigup.names.burnin_copy),
  and while the host's own do not read (rigup/boundary/burnin.py) judges by that copy and refuses
  the host, naming the file;
- when a card fails, the run fails the host's converge there, naming the card and what failed,
  before any serving unit changes: what served before still serves. From the next converge on,
  preflight leaves the card out of the plan (its ``cards`` hook): out of every serving unit's
  CUDA_VISIBLE_DEVICES (a single llama-server and a vLLM instance without ``gpus`` are pinned to
  the accepted cards by UUID), of the replicas' groups and of the VRAM plan, and the GPU guard
  neither judges it nor acts on its Xid events. An instance whose layout needed that card (its
  tensor split's shares, its tp, its replicas' GPUs, its VRAM) is then refused by its own checks,
  naming the quarantine in the plan; a PCIe link below ``burnin_pcie_min_ratio`` of what the
  card's link allows is quarantined, one downtrained less only goes last in its group;
- ``burnin_clear`` (UUIDs or all) records the operator's acceptance of a quarantined card;
- with ``burnin_pulse``, after the cards' runs: ``rigup-burnin pulse``, every card not quarantined
  at once, its GEMM load switched on and off ``burnin_pulse_hz`` times a second for
  ``burnin_pulse_s`` (the step a whole rig makes from idle to full load): a card off the bus, a
  hardware power brake or an Xid fails the host's power delivery, with the cards' summed peak,
  their caps and ``gpu_psu_watts`` (``rigup_state_dir/burnin-pulse.json``); the card off the bus is
  quarantined, and the host is refused until a retest passes or gpu_psu_watts changes. Due at
  the host's first pulse, then when its cards, driver or gpu_psu_watts change or a cap rises; it
  runs in a roll (roll.py gives such a host a batch of its own) or where nothing serves.

Variables (roles/burnin/defaults.yml): burnin_enabled, burnin_level, burnin_after_change,
burnin_soak_s, burnin_timeout_s, burnin_vram_fraction, burnin_pcie_min_ratio,
burnin_throttle_max, burnin_power_min_ratio, burnin_slow_flag_ratio, burnin_slow_quarantine_ratio,
burnin_retest, burnin_clear, burnin_pulse, burnin_pulse_s, burnin_pulse_hz; gpu_psu_watts (roles/gpu_power);
rigup_rolling (roles/base, set by roll.py), rigup_drain_lease_s (roles/base);
gpu_guard_xid_source (roles/gpu_guard),
cmpunlocker_enabled (roles/cmpunlocker), gpu_enabled (roles/preflight), rigup_prefix and
rigup_state_dir (roles/base).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy

from rigup import files
from rigup.boundary import Unreadable, burnin, owned
from rigup.config import Config, role_defaults
from shipped import xid
from rigup.gpu.plan import Plan, gpu_host
from rigup.lock import RUN_DIR
from rigup.names import BURNIN_METRICS, burnin_copy, burnin_file, burnin_pulse_file
from rigup.probe import operation
from rigup.role import Role
from roles.burnin import fleetwide
from roles.burnin.shipped.acceptance import TESTING, quarantined
from roles.burnin.checks import CHECKS
from roles.burnin.facts import BurninState
from roles.burnin.quarantine import lines, named, serving, sort_cards

XID = ("shipped/xid.py",)   # rigup-burnin's Xid parser, installed beside it
LEASE_UNIT = "rigup-burnin-lease.service"
LAPSED = f"{RUN_DIR}/burnin-lapsed"   # what a lapsed lease did, for the next converge to say (then removed)
# the SSH session the operation runs in (the nearest sshd above it: the kernel ends it when the
# controller dies, even by SIGKILL), the operation's process group (the burn-in and its workers) and
# its leader's start time (field 22 of /proc/PID/stat, in clock ticks since boot): which group it is
SESSION = ("s=$$; while [ \"${s:-1}\" -gt 1 ] && ! grep -q '^sshd' /proc/$s/comm 2>/dev/null; do "
           "s=$(sed 's/.*) //' /proc/$s/stat | cut -d' ' -f2); done; s=${s:-1}; "
           "g=$(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f3); "
           "t=$(sed 's/.*) //' /proc/$g/stat 2>/dev/null | cut -d' ' -f20)")
# the lease's watcher, a transient unit of its own (outlives the session; no ${...} in it: systemd
# expands that in a unit's command line, as an environment variable): $1 the session, $2 the
# process group, $3 its leader's start time, $4 the lease, $5 the note, $6 rigup-burnin's list of
# the cards under test (a run killed leaves it, and the GPU guard would leave those cards alone),
# then the units. The group is signalled only while it is still the burn-in's (round 8 W1: a run
# that ended without a verdict, its controller gone, left the watcher armed; a group id reused
# meanwhile was another's): its leader is the one of that start time, or gone (a group id is not
# given to a new process while any member of the group lives, so then only the burn-in's are left)
WATCH = """s=$1 g=$2 t=$3 lease=$4 note=$5 testing=$6; shift 6
while [ -e /proc/$s ]; do sleep 2; done
gone=$(date '+%Y-%m-%d %H:%M:%S %Z')
sleep "$lease"
ours() { now=$(sed 's/.*) //' /proc/$g/stat 2>/dev/null | cut -d' ' -f20); [ -z "$now" ] || [ "$now" = "$t" ]; }
if ours && kill -s TERM -- -$g 2>/dev/null; then sleep 5; ours && kill -s KILL -- -$g 2>/dev/null; rm -f "$testing"; fi
systemctl start "$@"
said="a burn-in in a roll was cut short (its controller's SSH session ended at $gone) and its lease \
of $lease s lapsed: $* started again at $(date '+%Y-%m-%d %H:%M:%S %Z')"
echo "rigup-burnin: $said"
mkdir -p "$(dirname "$note")" && printf '%s\\n' "$said" > "$note"
"""

__all__ = ["apply", "CHECKS", "plan_reads", "plan_lines", "cards"]


def enabled(data: Config) -> bool:
    return bool(data["gpu_enabled"]) and bool(data["burnin_enabled"])


def plan_reads(data: Config) -> list:
    """rigup-burnin's records and the serving units' cards, in preflight's round trip."""
    return [(BurninState, {"path": burnin_file(data), "pulse": burnin_pulse_file(data) if data.get("burnin_pulse") else "",
                           "lapsed": LAPSED})] \
        if enabled(data) else []


def kept(path: Path, records: dict) -> None:
    """Write the controller's copy of a host's records (rigup.names.burnin_copy) when it changed,
    only into a directory no other user can write (rigup.boundary.owned.write; judged read the
    copy through burnin.cached, which refuses such a directory first)."""
    text = json.dumps(records, indent=1, sort_keys=True) + "\n"
    try:
        if not path.exists() or owned.read(path, f"controller:{path}") != text:
            owned.write(path, text, f"controller:{path}")
    except (OSError, Unreadable):
        pass   # the host's records are the ones that count


def judged(name: str, state: dict, path: str, data: Config, hosts=None) -> tuple[dict, list[dict]]:
    """The records host ``name``'s cards are judged by (``state``: BurninState's, of ``path`` on the
    host) and what did not read (``{"where", "why", "fix"}``: roles/burnin/checks.py refuses the
    host for each). Fail closed: while the host's records do not read, the controller's last good
    copy counts (none: every card untested); a quarantine in that copy stays until the host's own
    record of the card (a pass, the operator's clear) lifts it, or ``burnin_clear`` names it (it is
    then tested). The copy is written from a good read with records only, never from a bad or empty one."""
    try:
        copy, problems = burnin_copy(name), []
    except Unreadable as e:   # an inventory name that is no file name (../../x): that host refused, nothing kept
        return state, [{"where": e.where, "why": e.why, "fix": "name the host in the inventory by its DNS name or address"}]
    try:
        good = burnin.cached(copy)
    except Unreadable as e:
        good = None
        problems.append({"where": e.where, "why": e.why, "fix": f"move {copy} aside, or make its directory "
                                                                 "yours alone (the host's records are copied there "
                                                                 "again at the next preflight)"})
    if state.get("unreadable"):
        problems.append({"where": f"{name}:{path}", "why": state["unreadable"],
                         "fix": f"restore it from the controller's copy ({copy}) or move it aside (every card is "
                                "then tested again); meanwhile the controller's copy counts"})
        last = good or burnin.Records({}, {})
        return {**state, "records": dict(last.cards), "untested": dict(last.untested)}, problems
    own = state.get("records") or {}
    carried = {u: r for u, r in (good.cards if good else {}).items()
               if u not in own and quarantined(r) and not named(data.get("burnin_clear"), u)}
    records = {**own, **carried}
    if own and not problems:
        kept(copy, records)
    # against the other hosts' copies after the copy is kept: the host's own records stay as written
    # ``hosts``: the inventory's names, whose copies alone vote (a host gone from it left its copy behind)
    return {**state, "records": fleetwide.judge(records, copy, data.get("burnin_clear"), hosts)}, problems


def cards(gpus: list[dict], facts: dict, data: Config) -> tuple[list[dict], dict]:
    """Preflight's ``cards`` hook: the cards the plan may serve on (all but the quarantined) and
    the plan's ``burnin`` (roles/burnin/quarantine.py, with ``unreadable``: :func:`judged`); every
    card and nothing when it is off."""
    if not enabled(data) or not gpus:
        return gpus, {}
    state, problems = judged(host.name, (facts.get("reads") or {}).get("BurninState") or BurninState.default(),
                             burnin_file(data), data, [h.name for h in host.inventory])
    part = sort_cards(gpus, state, (facts.get("driver") or {}).get("version"), data)
    part["unreadable"] = problems
    part["lapsed"] = state.get("lapsed")
    return serving(gpus, part), {"burnin": part}


def plan_lines(plan: Plan, data: Config) -> list[str]:
    return lines(plan.get("burnin") or {}) if enabled(data) and gpu_host(plan, data) else []


def run_argv(script: str, level: str, uuids: list[str], plan: Plan, data: Config) -> list[str]:
    """rigup-burnin's command line for one level's cards."""
    argv = [script, "run", "--level", level, "--cards", ",".join(uuids), "--results", burnin_file(data),
            "--metrics", BURNIN_METRICS, "--vram-fraction", str(data["burnin_vram_fraction"]),
            "--pcie-min-ratio", str(data["burnin_pcie_min_ratio"]), "--throttle-max", str(data["burnin_throttle_max"]),
            "--power-min-ratio", str(data["burnin_power_min_ratio"]),
            "--slow-flag-ratio", str(data["burnin_slow_flag_ratio"]),
            "--slow-quarantine-ratio", str(data["burnin_slow_quarantine_ratio"])]
    if data["burnin_soak_s"] is not None:
        argv += ["--soak-s", str(data["burnin_soak_s"])]
    if data["burnin_timeout_s"] is not None:
        argv += ["--timeout-s", str(data["burnin_timeout_s"])]
    argv += ["--xid-match", xid.JOURNAL_MATCH[data["gpu_guard_xid_source"]]]
    if data.get("cmpunlocker_enabled"):   # the memory an unlocked card must report
        expect = [f"{c['uuid']}={c['vram_unlocked_mib']}" for c in plan.get("cards") or []
                  if c.get("uuid") in uuids and (c.get("quirks") or {}).get("needs_unlock") and c.get("vram_unlocked_mib")]
        if expect:
            argv += ["--expect-mib", ",".join(expect)]
    return argv


def pulse_argv(script: str, data: Config) -> list[str]:
    """rigup-burnin pulse's command line (burnin_pulse)."""
    return [script, "pulse", "--seconds", str(data["burnin_pulse_s"]), "--hz", str(data["burnin_pulse_hz"]),
            "--results", burnin_file(data), "--pulse-results", burnin_pulse_file(data), "--metrics", BURNIN_METRICS,
            "--xid-match", xid.JOURNAL_MATCH[data["gpu_guard_xid_source"]]] + \
        (["--psu-watts", str(data["gpu_psu_watts"])] if data.get("gpu_psu_watts") else [])


@operation()
def accepted(argvs: list[list[str]], stop: list[str] = (), lease: int = 0):
    """Test the cards (preflight chose them from the records: nothing to do yields nothing), then
    the host's pulse where it is due, one after the other, stopping at the first that fails; exit
    status 3 (a card failed, the power delivery did not hold) fails the host here, named on
    stderr. ``stop``: in a roll, the serving units that hold the cards, stopped for the runs and
    started again after them when all passed (a verdict of failure leaves them stopped: the host
    fails and stays out of the gateways' pools). They are held by a lease of ``lease`` seconds
    (rigup_drain_lease_s, the drain's), a watcher on the host (issue 65): once the SSH session the
    run came in by has ended (its controller killed or gone) and ``lease`` seconds passed, it
    stops what is left of the run and starts the units again, and says so in LAPSED; a run that
    ends with its controller there, or with a verdict, disarms it."""
    run = " && ".join(" ".join(shlex.quote(a) for a in argv) for argv in argvs)
    if not stop:
        yield run
        return
    units = " ".join(shlex.quote(u) for u in stop)
    watch = " ".join(shlex.quote(a) for a in ["/bin/sh", "-c", WATCH, "rigup-burnin-lease"])
    arm = (f"if [ \"$s\" -gt 1 ]; then systemctl stop {LEASE_UNIT} 2>/dev/null; systemctl reset-failed {LEASE_UNIT} "
           f"2>/dev/null; systemd-run --quiet --collect --unit={LEASE_UNIT} {watch} \"$s\" \"$g\" \"$t\" {int(lease)} "
           f"{shlex.quote(LAPSED)} {shlex.quote(TESTING)} {units} || exit 1; fi")
    yield (f"{SESSION}; {arm}; if systemctl stop {units}; then {run}; rc=$?; else rc=1; fi; "
           f"if [ $rc = 0 ]; then systemctl start {units} || rc=$?; fi; "
           f"if [ $rc = 0 ] || [ $rc = 3 ] || [ -e /proc/$s ]; then systemctl stop {LEASE_UNIT} 2>/dev/null; fi; exit $rc")


@operation()
def forgotten(path: str):
    """The lapsed lease's note removed, once said."""
    yield f"rm -f {shlex.quote(path)}"


@operation()
def cleared(script: str, uuids: list[str], results: str):
    yield " ".join(shlex.quote(a) for a in [script, "clear", ",".join(uuids), "--results", results,
                                              "--metrics", BURNIN_METRICS, "--by", "burnin_clear (a converge)"])


@deploy("burnin", data_defaults=role_defaults("burnin"))
def apply(plan: Plan, data: Config):
    if not enabled(data) or not gpu_host(plan, data) or not plan.get("systemd", True):
        return
    part = plan.get("burnin") or {}
    script = f"{data['rigup_prefix']}/bin/rigup-burnin"
    paths = files.program_paths(script, XID)   # the Xid parser it imports, as the guard's (the same file)
    files.program("roles/burnin/shipped/acceptance.py", script, paths, name="burnin: rigup-burnin", beside=XID)
    if part.get("lapsed"):   # said in the plan (quarantine.lines): once
        forgotten(name="burnin: the lapsed lease's note said", path=LAPSED)
    if part.get("clear"):
        cleared(name=f"burnin: clear {len(part['clear'])} card(s) (burnin_clear)", script=script,
                uuids=part["clear"], results=burnin_file(data))
    runs = sorted((part.get("run") or {}).items())
    argvs = [run_argv(script, level, uuids, plan, data) for level, uuids in runs]
    what = [f"{level} acceptance of {len(uuids)} card(s)" for level, uuids in runs]
    if (part.get("pulse") or {}).get("run"):
        argvs.append(pulse_argv(script, data))
        what.append("the pulse of the host's power delivery")
    if argvs:
        accepted(name=f"burnin: {', '.join(what)}", argvs=argvs, stop=part.get("stop") or [],
                 lease=data["rigup_drain_lease_s"])


ROLE = Role("burnin", apply, checks=CHECKS, plan_reads=plan_reads, plan_lines=plan_lines, cards=cards)
