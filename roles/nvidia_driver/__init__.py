"""roles/nvidia_driver: the NVIDIA kernel driver at ``nvidia_driver_branch``, from the distribution.

What it does to a host (only with ``nvidia_driver_branch`` set, ``gpu_enabled``, and NVIDIA cards
on its PCI bus or answering nvidia-smi):
- the apt components the driver is in (Debian: contrib, non-free, non-free-firmware; rigup.apt);
- the driver's headless packages at the branch (roles/nvidia_driver/packages.py: DKMS modules,
  open or proprietary as the cards need, nvidia-smi, libcuda, the persistence daemon) and the
  running kernel's headers for DKMS, after checking that apt's candidate is of the branch; then
  held (``apt-mark hold``), so that an upgrade never moves a serving host to another branch;
- while the driver changes, the GPU guard (roles/gpu_guard) paused: its timer stopped, not
  disabled, and started again once the new module answers (at the reboot, or where the change
  failed, by roles/gpu_guard's next converge): between the packages' unpacking and the new module,
  nvidia-smi fails in ways that are no card's fault, and a tripped guard would outlive the reboot;
- nouveau blacklisted (/etc/modprobe.d/rigup-nouveau.conf; the initramfs rebuilt where there is one);
- the module loaded (``modprobe nvidia nvidia_uvm``), or, when it cannot be in place (another
  version's module in use, nouveau loaded), a reboot (``nvidia_driver_reboot``) and a wait for the
  host to come back; then nvidia-smi must report the branch and the cards the plan had (made from
  the PCI bus when no driver answered: rigup.gpu.driver), else the host fails, naming both;
- nvidia-persistenced enabled and running (systemd hosts);
- on an NVSwitch host (HGX, DGX: rigup/gpu/fabric.py) the fabric manager and its NSCQ library of
  the branch, at the driver's release and held with it, enabled and running; the serving units are
  ordered after it (roles/llama_server, roles/vllm);
- on an NVSwitch host or a VM of one, with or without a branch pinned: the fabric registered
  before anything serves (every card's fabric.state Completed/Success, or with N/A, Ampere, the
  fabric manager active), waited for ``nvidia_driver_fabric_timeout`` s, else the host fails
  naming what the cards read.
A host already at the branch, its packages held, changes nothing; one whose driver of the branch
came from elsewhere (NVIDIA's .run installer, another repository: none of the distribution's
driver packages installed) is left as it is. preflight plans the step
(``plan["driver_step"]``), and the roles after this one plan on the cards the driver will report.

Variables (roles/nvidia_driver/defaults.yml): nvidia_driver_branch, nvidia_driver_modules,
nvidia_driver_headers, nvidia_driver_reboot, nvidia_driver_reboot_delay, nvidia_driver_fabric_timeout; gpu_enabled
(roles/preflight), apt_lock_timeout, apt_cache_seconds (roles/base).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import OperationError, deploy
from pyinfra.operations import server

from rigup.role import Role
from rigup import apt, lock
from rigup.config import Config, role_defaults
from rigup.files import managed
from rigup.gpu.driver import branch_of, modules_choice
from rigup.gpu.fabric import SERVICE as FABRIC_SERVICE
from rigup.gpu.fabric import line as fabric_line
from rigup.gpu.facts import NvidiaDriver, NvidiaGpus
from rigup.gpu.plan import Plan, gpu_host
from rigup.names import GUARD_SERVICE, GUARD_TIMER, guard_file
from rigup.probe import operation
from rigup.services import running
from rigup.state import read_once, reading
from rigup.text import shown
from roles.nvidia_driver.checks import CHECKS
from roles.nvidia_driver.facts import DriverHost
from roles.nvidia_driver.packages import FABRIC_PACKAGE, PIN_FILE, PINNED, at_branch, driver_packages, other_fabric, preferred_modules

__all__ = ["apply", "CHECKS", "plan_reads", "plan_lines"]

BLACKLIST = "/etc/modprobe.d/rigup-nouveau.conf"
REBOOT_TIMEOUT_S = 600


def managed_here(plan: Plan, data: Config) -> bool:
    """Whether this host's driver is rigup's: a branch pinned, GPU roles on, NVIDIA cards."""
    return data.get("nvidia_driver_branch") is not None and gpu_host(plan, data)


def plan_reads(data: Config) -> list:
    return [(DriverHost, {})] if data.get("nvidia_driver_branch") is not None else []


def _modules(plan: Plan, data: Config) -> str | None:
    """The module flavour for this host (checks.py refuses a host where none fits)."""
    os_id = (read_once(DriverHost).get("os") or {}).get("id", "")
    return modules_choice(plan, data["nvidia_driver_modules"], preferred_modules(os_id))[0]


def installed_elsewhere(plan: Plan, data: Config, state: dict) -> bool:
    """The pinned branch answers, and none of the distribution's driver packages is installed
    (``state``: DriverHost's value): a driver from NVIDIA's .run installer or another repository,
    which rigup leaves as it is (its packages on top would clash with it)."""
    os_id, branch = (state.get("os") or {}).get("id", ""), int(data["nvidia_driver_branch"])
    ours = {p for m in ("open", "proprietary") for p in (driver_packages(os_id, branch, m) or {}).get("packages", [])}
    return not plan.get("driver_step") and not ours & set(state.get("packages") or {})


def plan_lines(plan: Plan, data: Config) -> list[str]:
    fabric = [fabric_line(plan.get("fabric"))] if plan.get("fabric") else []
    return fabric + _driver_lines(plan, data)


def _driver_lines(plan: Plan, data: Config) -> list[str]:
    step = plan.get("driver_step")
    if not managed_here(plan, data):
        return []
    branch = data["nvidia_driver_branch"]
    modules = _modules(plan, data)
    if installed_elsewhere(plan, data, read_once(DriverHost)):
        return [f"driver:    {shown(plan['driver']['version'], 40)} (branch {branch}), not from the distribution's packages: "
                "left as it is"]
    if not step:
        return [f"driver:    {shown(plan['driver']['version'], 40)} (branch {branch}, {modules} modules): nothing to install"]
    then = ("the cards above are from the PCI bus: nvidia-smi must report them once it is loaded"
            if step["predicted"] else "the module is swapped: a reboot unless it loads in place")
    return [f"driver:    branch {branch} ({modules} modules) to install: {step['why']}; {then}"]


@reading(DriverHost)
@operation()
def packages_at_branch(packages: list[str], branch: int, versioned: bool, probe: str, headers: str | None):
    """``packages`` installed at ``branch`` and held (with ``headers``, the running kernel's headers
    package, when given and missing); apt's candidate of ``probe`` checked to be of the branch first.
    Another branch's fabric manager (held with its driver) is unheld and taken out in the same
    apt transaction: it conflicts with the new branch's."""
    state = read_once(DriverHost)
    installed = state["packages"]
    missing = at_branch(installed, packages, branch, versioned)
    unheld = [p for p in packages if p in installed and not installed[p]["held"]]
    if not missing and not unheld:
        host.noop(f"the driver's {len(packages)} packages are at branch {branch} and held")
        return
    timeout = apt.lock_timeout()
    names = " ".join(shlex.quote(p) for p in packages)
    if missing:
        yield apt.waiting(apt.updated(), timeout)
        if versioned:   # the kernel module's version, of the branch, for every package (packages.py)
            q = shlex.quote(probe)
            yield (f"v=$(apt-cache policy {q} | sed -n 's/^ *Candidate: //p'); case \"$v\" in {int(branch)}.*) ;; *) "
                   f"echo \"rigup: apt offers {probe} $v, not of branch {int(branch)}: this host's sources have no "
                   f"driver of branch {int(branch)}; set nvidia_driver_branch to the branch they have\" >&2; exit 1;; esac; "
                   "u=${v#*:}; u=${u%-*}; "    # its release: Debian's revision (0+deb12u1) is not NVIDIA's (1)
                   f"{_fabric_at(packages)}"
                   "printf '%s\\n' '# rigup (roles/nvidia_driver): every package at the kernel module release' "
                   f"{shlex.quote('Package: ' + PINNED)} \"Pin: version $u-*\" 'Pin-Priority: 1001' > {PIN_FILE}")
        extra = f" {shlex.quote(headers)}" if headers else ""
        old = other_fabric(installed, packages)   # another branch's fabric manager: out in the same transaction
        if old:
            yield f"apt-mark unhold {' '.join(shlex.quote(p) for p in old)} >/dev/null"
            extra += "".join(f" {shlex.quote(p + '-')}" for p in old)
        yield apt.waiting(apt.noninteractive_apt(
            f"install --no-install-recommends --allow-change-held-packages {names}{extra}"), timeout)
    yield f"apt-mark hold {names} >/dev/null"


def _fabric_at(packages: list[str]) -> str:
    """Shell that fails, before anything is installed, where apt offers a fabric manager package of
    ``packages`` at other releases only than ``$u``, the kernel module candidate's (the shell's
    twin of packages.upstream): preflight's check (checks.py) read the host's lists before this
    converge updated them, and at another release the fabric manager refuses to start, so the host
    would reboot into a board nothing can use."""
    fabric = [p for p in packages if FABRIC_PACKAGE.fullmatch(p)]
    if not fabric:
        return ""
    return (f"off=; for p in {' '.join(shlex.quote(p) for p in fabric)}; do apt-cache madison \"$p\" | awk -F' *[|] *' "
            "-v u=\"$u\" '{sub(/^[0-9]+:/, \"\", $2)} index($2, u \"-\") == 1 {f = 1} END {exit !f}' || off=\"$off $p\"; "
            "done; if [ -n \"$off\" ]; then echo \"rigup: apt offers$off at other versions only, the driver at $v (the "
            "fabric manager must be the driver's release, $u): nothing installed\" >&2; exit 1; fi; ")


@operation()
def initramfs():
    """The initramfs rebuilt (update-initramfs -u) where the host has one: nouveau stays out of it."""
    yield "if command -v update-initramfs >/dev/null 2>&1; then update-initramfs -u; fi"


def _answer(branch: int) -> tuple[bool, str]:
    """Whether the driver of ``branch`` answers now, and what nvidia-smi says (read afresh)."""
    driver = host.get_fact(NvidiaDriver)
    version = driver.get("version") if driver.get("loaded") else None
    return branch_of(version) == branch, version or "no driver answers"


@reading(NvidiaDriver)
@operation()
def loaded(branch: int, reboot: bool, cards: list[str], delay: int = 5):
    """The driver of ``branch`` loaded and answering with ``cards`` (bus ids, sorted): loaded
    in place when no NVIDIA module is, else after a reboot (``reboot``; the host reached again from
    ``delay`` s after it), else the host fails."""
    driver = read_once(NvidiaDriver)
    if driver.get("loaded") and branch_of(driver.get("version")) == branch and _cards_match(cards, fresh=False)[0]:
        host.noop(f"driver {driver['version']} answers")
        return
    # in place: nouveau out (blacklisted, so it stays out at the next boot), then nvidia's modules
    yield ("modprobe -r nouveau 2>/dev/null; if [ ! -d /sys/module/nvidia ]; then "
           "modprobe nvidia && modprobe nvidia_uvm; fi; true")
    ok, said = _answer(branch)
    if not ok:
        if not reboot:
            raise OperationError(shown(f"driver branch {branch} is installed but not loaded ({said}): the module cannot "
                                       "be swapped in place; reboot the host (or set nvidia_driver_reboot: true)", 4000))
        yield from server.reboot._inner(delay=delay, interval=2, reboot_timeout=REBOOT_TIMEOUT_S)
        taken = lock.again(host)    # the converge lock went with the old boot
        if taken:
            raise OperationError(shown(f"after its reboot: {taken.what}: {taken.why}", 4000))
        ok, said = _answer(branch)
        if not ok:
            raise OperationError(shown(f"driver branch {branch} is installed, but after a reboot nvidia-smi says: {said}", 4000))
    match, reported = _cards_match(cards)
    if not match:
        raise OperationError(shown(f"driver branch {branch} answers with {reported}, but the plan (made from the PCI bus "
                                   f"before the driver answered) had {len(cards)} ({', '.join(cards)}): converge again, "
                                   "the plan is then read from nvidia-smi", 4000))


def _cards_match(cards: list[str], fresh: bool = True) -> tuple[bool, str]:
    """Whether nvidia-smi reports exactly the cards at bus ids ``cards``, and which it reports
    (``fresh``: read now, as after a command of the same operation; else read once per change)."""
    gpus = host.get_fact(NvidiaGpus) if fresh else read_once(NvidiaGpus)
    reported = sorted(str(g.get("bus_id")).upper() for g in gpus if not g.get("lost"))
    return reported == cards, (f"{len(reported)} cards ({', '.join(reported)})" if reported else "no card")


@operation()
def fabric_ready(fabric: dict, timeout: int, tripped: str, changing: bool = False):
    """The fabric registered before anything serves: every card's fabric.state/status
    Completed/Success (Hopper and later), or, where the cards report N/A (Ampere), the fabric
    manager active and no NVLink inactive. Read in the plan (nothing to do when it already was,
    unless ``changing``: the driver changes in this converge, so the plan's read is of the old
    one); else waited for at most ``timeout`` s, and the host fails naming what the cards read.
    Once registered, a GPU guard tripped by the fabric (its file ``tripped`` says ``"fabric": true``:
    roles/gpu_guard) runs its check now, which clears it and starts the serving units it stopped or
    whose start it skipped (a reboot of this converge while the fabric registered); without the
    guard's service the file is removed, so that the serving units start in this converge."""
    states, links = fabric.get("states") or {}, fabric.get("nvlinks")
    whole = not links or links["up"] == links["links"]   # Ampere: its NVLinks, beside the service
    if not changing and (states and set(states) == {"Completed/Success"} or
                         not states and fabric.get("active") == "active" and whole):
        host.noop("the NVSwitch fabric is registered")
        return
    t, fab = shlex.quote(tripped), "'\"fabric\": true'"
    done = (f"{{ if grep -qs {fab} {t}; then systemctl start {GUARD_SERVICE} >/dev/null 2>&1; "
            f"if grep -qs {fab} {t}; then rm -f {t}; fi; fi; exit 0; }}")
    yield (f"end=$(( $(date +%s) + {int(timeout)} )); while :; do "
           "s=$(nvidia-smi --query-gpu=fabric.state,fabric.status --format=csv,noheader 2>&1 | sed 's/[][]//g'); "
           f"if [ -n \"$s\" ] && ! printf '%s\\n' \"$s\" | grep -qvx 'Completed, Success'; then {done}; fi; "
           "if [ -n \"$s\" ] && ! printf '%s\\n' \"$s\" | grep -qvx 'N/A, N/A' "
           f"&& systemctl is-active -q {FABRIC_SERVICE} && ! nvidia-smi nvlink -s 2>/dev/null | grep -q inactive; "
           f"then {done}; fi; "
           "if [ \"$(date +%s)\" -ge \"$end\" ]; then echo \"rigup: the NVSwitch fabric is not registered after "
           f"{int(timeout)} s (the cards read: $(printf '%s\\n' \"$s\" | sort | uniq -c | tr -s ' \\n' ' '); "
           f"{FABRIC_SERVICE}: $(systemctl is-active {FABRIC_SERVICE}); its journal: "
           f"$(journalctl -q -o cat -n 3 -u {FABRIC_SERVICE} 2>/dev/null | tr -cd '[:print:]\\n' | cut -c1-200 | tr '\\n' ' ')"
           "): nothing serves until it is\" >&2; exit 1; fi; "
           "sleep 1; done")


@operation()
def guard_paused(paused: bool):
    """The GPU guard's timer stopped (and a check in flight), or started again where it is enabled
    (after a reboot it already runs: a no-op), around a driver change. A lab run's roll tripped a
    guard without it: the package's nvidia-smi unpacked before the driver it talks to, two samples
    failed, and the host came back from its reboot not serving."""
    if paused:
        yield f"systemctl stop {GUARD_TIMER} {GUARD_SERVICE} 2>/dev/null; true"
    else:
        yield f"if systemctl is-enabled -q {GUARD_TIMER}; then systemctl start {GUARD_TIMER}; fi; true"


@deploy("nvidia_driver", data_defaults=role_defaults("nvidia_driver"))
def apply(plan: Plan, data: Config):
    if not managed_here(plan, data):
        if plan.get("fabric") and data.get("gpu_enabled", True):   # a driver not rigup's: its fabric still gates
            fabric_ready(name="NVSwitch fabric registered", fabric=plan["fabric"], timeout=data["nvidia_driver_fabric_timeout"],
                         tripped=guard_file(data))
        return
    branch = int(data["nvidia_driver_branch"])
    modules = _modules(plan, data)
    state = read_once(DriverHost)
    fabric = plan.get("fabric") or {}
    table = driver_packages(state["os"].get("id", ""), branch, modules, nvswitch=bool(fabric.get("nvswitches")))
    if not modules or not table or installed_elsewhere(plan, data, state):   # refused by preflight (checks.py), or not ours
        return
    missing = bool(at_branch(state["packages"], table["packages"], branch, table["versioned"]))
    if table["components"]:
        apt.components(name=f"apt components {' '.join(table['components'])}", names=table["components"],
                       _if=lambda: missing)
    if missing and plan.get("systemd"):
        guard_paused(name="GPU guard paused while the driver changes", paused=True)
    headers = None
    if data["nvidia_driver_headers"] and not state["headers"] and state["release"]:
        headers = f"linux-headers-{state['release']}"
    packages_at_branch(name=f"NVIDIA driver {branch} ({modules} modules)", packages=table["packages"], branch=branch,
                       versioned=table["versioned"], probe=table["probe"], headers=headers)
    blacklist = managed(name="nouveau blacklisted", dest=BLACKLIST, paths=[BLACKLIST],
                        text="# rigup (roles/nvidia_driver): the NVIDIA driver drives these cards\n"
                             "blacklist nouveau\noptions nouveau modeset=0\n")
    initramfs(name="initramfs without nouveau", _if=blacklist.did_change)
    cards = sorted(str(c.get("bus_id")).upper() for c in plan["cards"])   # what nvidia-smi must report
    loaded(name=f"NVIDIA driver {branch} loaded", branch=branch, reboot=data["nvidia_driver_reboot"], cards=cards,
           delay=data["nvidia_driver_reboot_delay"])
    if plan.get("systemd"):
        running(name="nvidia-persistenced running", unit="nvidia-persistenced.service",
                units=["nvidia-persistenced.service"])
        if fabric.get("nvswitches"):   # before any serving unit: CUDA does not start on an NVSwitch board without it
            running(name="fabric manager running", unit=FABRIC_SERVICE, units=[FABRIC_SERVICE])
    if fabric:   # an NVSwitch board, or a VM of one whose cards report the fabric its hypervisor runs
        fabric_ready(name="NVSwitch fabric registered", fabric=fabric, timeout=data["nvidia_driver_fabric_timeout"],
                     tripped=guard_file(data), changing=missing)
    if missing and plan.get("systemd"):
        guard_paused(name="GPU guard running again", paused=False)


ROLE = Role("nvidia_driver", apply, checks=CHECKS, plan_reads=plan_reads, plan_lines=plan_lines)
