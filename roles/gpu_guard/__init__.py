"""roles/gpu_guard: a power and thermal guard that stops serving, and stays tripped until cleared.

What it does to a host with GPUs and systemd (nothing on a CPU-only host, with gpu_enabled false,
or without systemd, where there are no serving units to stop):
- installs ``rigup_prefix/bin/rigup-gpu-guard`` (roles/gpu_guard/shipped/guard.py, standard library) and
  ``/etc/rigup/gpu-guard.json``: the window, the serving units, and the thresholds of every card
  the catalogue knows, by PCI id (roles/gpu_guard/thresholds.yml per card class, overridden by
  ``gpu_guard_thresholds``);
- runs it every ``gpu_guard_interval_s`` from ``rigup-gpu-guard.timer``. A sample is bad on a
  card's average draw over ``gpu_guard_window_s`` above ``draw_w``, the cards' average draws
  summing above ``gpu_psu_watts`` (the power supply's budget, when set), a temperature above
  ``temp_c``, or lost telemetry (also an nvidia-smi that does not answer within
  ``gpu_guard_smi_timeout``: it is killed with its process group). It trips when
  ``gpu_guard_debounce_bad`` of the last ``gpu_guard_debounce_samples`` samples are bad (one
  flaky [N/A] alone does not); then it logs the reason (journal, priority crit), writes it to
  the tripped file (rigup.names.guard_file) and stops ``rigup-llama@*`` and ``rigup-vllm@*``. Serving units carry
  ``ConditionPathExists=!{rigup_state_dir}/gpu-guard.tripped``, so they do not start while it
  exists, also after a reboot. The oneshot unit has a TimeoutStartSec derived from
  ``gpu_guard_smi_timeout`` (guard.unit_timeout_s), so no hung call holds up the timer;
- each check also writes every card's power draw and limit, temperature, SM clock, utilisation,
  VRAM used and PCIe link, the tripped state and lost telemetry to rigup.names.GPU_METRICS (atomically)
  when the node exporter's textfile directory exists (roles/metrics);
- Xid triage (guard.py's docstring): each check reads the kernel's new ``NVRM: Xid`` lines from
  the journal and acts per card by rigup/gpu/xid.yml: an application fault restarts the serving
  units on that card; ``gpu_guard_xid_suspect_count`` memory or firmware faults within
  ``gpu_guard_xid_suspect_window_s`` make the card suspect (its units stopped, drained at their
  balancer, until cleared); a card fallen off the bus (NVLink, GSP) trips the guard at once and,
  with ``gpu_guard_xid_reboot``, reboots the host at most ``gpu_guard_xid_max_reboots`` a day
  (back with every card, the guard clears itself and starts what it stopped). Counts per card and
  class and the suspect cards: ``{rigup_state_dir}/gpu-guard-xid.json``, the metrics
  (rigup_gpu_xid_events, rigup_gpu_suspect), ``rigup-gpu-guard status`` and status.py;
- ``gpu_guard_clear: true`` clears a tripped guard and suspect cards (as ``rigup-gpu-guard clear``).
With ``gpu_guard_enabled: false`` the timer is stopped and disabled; with ``rigup_maintenance``
(roles/base) it is paused the same way, its files kept.

Variables (roles/gpu_guard/defaults.yml): gpu_guard_enabled, gpu_guard_interval_s,
gpu_guard_window_s, gpu_guard_smi_timeout, gpu_guard_debounce_bad, gpu_guard_debounce_samples,
gpu_guard_thresholds, gpu_guard_clear, gpu_guard_xid_enabled, gpu_guard_xid_source,
gpu_guard_xid_suspect_count, gpu_guard_xid_suspect_window_s, gpu_guard_xid_reboot,
gpu_guard_xid_max_reboots; gpu_psu_watts (roles/gpu_power), gpu_enabled (roles/preflight),
rigup_prefix and rigup_state_dir (roles/base).
"""

from __future__ import annotations

import json
import shlex
from functools import lru_cache
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.facts.files import File
from rigup.probe import systemd
from pyinfra.operations.util import any_changed

from rigup import files, services, yamlfile
from rigup.config import Config, role_defaults
from shipped import xid
from rigup.gpu.catalogue import cards as catalogue_cards, xid_codes
from rigup.gpu.fabric import SERVICE as FABRIC_SERVICE
from rigup.gpu.plan import Plan, gpu_host
from rigup.names import BURNIN_TESTING, GPU_METRICS, GUARD_SERVICE, GUARD_TIMER, burnin_file, guard_file, xid_file
from rigup.templates import render
from roles.gpu_guard.checks import CHECKS
from roles.gpu_guard.shipped.guard import unit_timeout_s

HERE = Path(__file__).resolve().parent
XID = ("shipped/xid.py",)   # the guard's Xid parser, installed beside it
CONFIG = "/etc/rigup/gpu-guard.json"
SAMPLES = "/run/rigup/gpu-guard-samples.json"
SERVICE, TIMER = GUARD_SERVICE, GUARD_TIMER
SERVING_UNITS = ["rigup-llama@*", "rigup-vllm@*"]

__all__ = ["apply", "CHECKS"]


@lru_cache(maxsize=None)
def class_thresholds() -> dict:
    return yamlfile.safe_load((HERE / "thresholds.yml").read_text())


def guard_config(data: Config, plan: Plan | None = None) -> dict:
    """The guard's configuration file (pure: data in)."""
    table = class_thresholds()
    by_pci = {}
    for card in catalogue_cards().values():
        cls = card["class"]
        limits = dict(table.get("default") or {})
        if card["power_w"].get("max"):
            limits["draw_w"] = round(card["power_w"]["max"] * 1.05)
        limits.update((table.get("classes") or {}).get(cls) or {})
        limits.update((data.get("gpu_guard_thresholds") or {}).get(cls) or {})
        for pci in card["pci_ids"]:
            by_pci[pci] = {"class": cls, **limits}
    return {
        "window_s": data["gpu_guard_window_s"],
        "interval_s": data["gpu_guard_interval_s"],
        "smi_timeout_s": data["gpu_guard_smi_timeout"],
        "debounce": {"bad": data["gpu_guard_debounce_bad"], "of": data["gpu_guard_debounce_samples"]},
        "units": SERVING_UNITS,
        "tripped_file": guard_file(data),
        "samples_file": SAMPLES,
        "metrics_file": GPU_METRICS,
        "default": dict(table.get("default") or {}),
        "by_pci_id": by_pci,
        **({"psu_watts": data["gpu_psu_watts"]} if data.get("gpu_psu_watts") else {}),
        **({"xid": xid_config(data)} if data["gpu_guard_xid_enabled"] else {}),
        # the cards rigup-burnin tests or quarantined: not judged (guard.py set_aside)
        **({"burnin": {"results": burnin_file(data), "testing": BURNIN_TESTING}} if data.get("burnin_enabled") else {}),
        # an NVSwitch board: the fabric is judged each check (guard.py fabric_problem); its switches'
        # SXid events are this host's (shipped/xid.py)
        **({"fabric": {"service": FABRIC_SERVICE, "switches": [xid.card_key(b) for b in fabric.get("buses") or []]}}
           if (fabric := (plan or {}).get("fabric") or {}).get("nvswitches") else {}),
    }


@lru_cache(maxsize=None)
def xid_catalogue() -> dict[str, dict]:
    """rigup/gpu/xid.yml as the guard's file holds it ({"code": entry}), parsed once per run."""
    return {str(code): entry for code, entry in sorted(xid_codes().items())}


def xid_config(data: Config) -> dict:
    """The guard's Xid triage: the catalogue (rigup/gpu/xid.yml), the journal match of the
    source, the suspect rule, the reboot policy and the state files (on disk: they outlive a reboot)."""
    state = str(data["rigup_state_dir"]).rstrip("/")
    return {"catalogue": xid_catalogue(),
            "match": xid.JOURNAL_MATCH[data["gpu_guard_xid_source"]],
            "suspect_count": data["gpu_guard_xid_suspect_count"],
            "suspect_window_s": data["gpu_guard_xid_suspect_window_s"],
            "reboot": data["gpu_guard_xid_reboot"], "max_reboots": data["gpu_guard_xid_max_reboots"],
            "state_file": xid_file(data), "reboots_file": f"{state}/gpu-guard-reboots.json"}


@operation()
def cleared(tripped_file: str, xid_state: str, script: str):
    """Clear a tripped guard and suspect cards (logs who cleared it and the old reason); nothing
    when not tripped and no Xid state was kept."""
    if not host.get_fact(File, path=tripped_file) and not host.get_fact(File, path=xid_state):
        host.noop("the guard is not tripped")
        return
    yield f"{shlex.quote(script)} clear"


@deploy("gpu_guard", data_defaults=role_defaults("gpu_guard"))
def apply(plan: Plan, data: Config):
    if not gpu_host(plan, data) or not plan.get("systemd", True):
        return    # without systemd there are no serving units to stop (preflight refuses them)
    if not data["gpu_guard_enabled"]:
        services.running(name=f"gpu_guard: stop {TIMER}", unit=TIMER, units=[TIMER], enabled=False)
        return
    script = f"{data['rigup_prefix']}/bin/rigup-gpu-guard"
    service_path, timer_path = f"/etc/systemd/system/{SERVICE}", f"/etc/systemd/system/{TIMER}"
    paths = [*files.program_paths(script, XID), CONFIG, service_path, timer_path]   # the guard imports rigup_xid.py beside it
    files.program("roles/gpu_guard/shipped/guard.py", script, paths, name="gpu_guard: the guard", beside=XID)
    files.managed(name=f"gpu_guard: {CONFIG}", dest=CONFIG, paths=paths,
                  text=json.dumps(guard_config(data, plan), indent=1, sort_keys=True) + "\n")
    service = files.managed(name=f"gpu_guard: {SERVICE}", dest=service_path, paths=paths,
                            text=render("gpu_guard-service.j2", script=script, config=CONFIG,
                                        timeout=unit_timeout_s(data["gpu_guard_smi_timeout"])))
    timer = files.managed(name=f"gpu_guard: {TIMER}", dest=timer_path, paths=paths,
                          text=render("gpu_guard-timer.j2", interval=data["gpu_guard_interval_s"]))
    # any_changed: a list given to _if means all of them (the unit alone changing reloaded nothing)
    systemd.daemon_reload(name="gpu_guard: systemd daemon-reload", _if=any_changed(service, timer))
    if data["gpu_guard_clear"]:
        cleared(name="gpu_guard: clear the tripped guard", tripped_file=guard_file(data),
                xid_state=xid_file(data), script=script)
    if data["rigup_maintenance"]:   # paused: its files stay, the timer runs again when maintenance ends
        services.running(name=f"gpu_guard: pause {TIMER} (rigup_maintenance)", unit=TIMER, units=[TIMER], enabled=False)
        return
    services.running(name=f"gpu_guard: run {TIMER}", unit=TIMER, units=[TIMER])
    systemd.service(name=f"gpu_guard: restart {TIMER} (new period)", service=TIMER, restarted=True,
                    _if=timer.did_change)


ROLE = Role("gpu_guard", apply, checks=CHECKS)
