#!/usr/bin/python3
"""Simulated ``nvidia-smi`` for GPU-less lab hosts (stdlib only).

Installed as /usr/bin/nvidia-smi (and symlinked as /usr/local/bin/rigup-gpu-sim)
on lab containers.  The cards come from a profile (one entry of
tests/lab/gpu_profiles.json) at /etc/rigup-lab/gpu-profile.json, or the file
named by $RIGUP_GPU_SIM_PROFILE.  Runtime state (power limits, persistence,
clock locks, draw, temperature, lost cards) lives in
$RIGUP_GPU_SIM_RUN (default /run/rigup-gpu-sim) so a reboot resets it like a
real GPU; $RIGUP_GPU_SIM_LIB (default /var/lib/rigup-gpu-sim) holds what
survives reboots: the file ``unlocked`` unlocks CMP 170HX cards.

Output texts and exit codes follow the real tool (see the nvidia-smi(1)
RETURN VALUE section): 0 ok, 2 invalid argument/field (also an out-of-range
-pl: not verified on hardware), 4 no permission (a non-root caller changing a
setting), 6 no such device, 9 driver not loaded, 15 GPU fallen off the bus.

Test helper:  nvidia-smi sim set [-i N[,M]|all] [--draw W] [--temp C]
              [--memory-used MIB] [--pcie-width N] [--pcie-gen N] (the link as negotiated: below
              the card's maximum, a downtrained link) [--lost|--found] [--na FIELD[,FIELD]|none] [--hang 1|0]
              [--throttle MASK] (clocks_event_reasons.active) [--ecc-uncorrected N]
              and the CUDA stand-in's faults (tests/lab/cuda_standin.c): [--vram-bad WORDS]
              [--lost-under-load S] [--cuda-hang 1|0]; the cuBLAS stand-in's (the same file built
              -DCUBLAS_STANDIN): [--gemm wrong|refuse|ok] [--gemm-slow F] [--gemm-draw R], written
              for it to $RUN_DIR/cublas-faults (see ``cublas_faults``);
              sim cuda (the cards as the CUDA stand-in reads them);
              sim lock|unlock|show|reset
              sim driver VERSION (Debian's driver packages of VERSION were installed: the module
              loads at once, or at the next boot where another was loaded; see ``sim_driver``);
              sim calls (every nvidia-smi argv so far);  sim module (the loaded
              kernel module's path, as ``modinfo -n nvidia`` would print it);
              sim xid CODE -i N [--lost] (the driver's Xid line for card N, logged as
              rigup-lab-kernel: the log source gpu_guard_xid_source lab reads; --lost: the card
              falls off the bus too, as with Xid 79)
(or the same arguments to ``rigup-gpu-sim``).

``--na power.draw`` makes --query-gpu answer ``[N/A]`` for those fields of the chosen cards
(as flaky drivers do) until ``--na none``. ``--hang 1`` makes every later nvidia-smi call (not
``sim``) hang as a wedged driver does: it never answers, and a child of its own holds its
output open (so killing only the process does not free a reader); ``--hang 0`` ends that for
later calls. Both are runtime state: a reboot clears them.

Every invocation's argv is appended (JSON, one line) to $LIB_DIR/calls.log, so that tests can
check how the tools drove the cards (e.g. that no ``-pl`` ever ran without ``-i``).

The kernel side of a CMP 170HX unlock: the patched driver is the file
/lib/modules/<release>/updates/cmpunlocker/nvidia.ko. The cards' unlock state changes only at a
COLD power cycle (tests/lab/lab.py ``cold_boot`` calls :func:`power_cycle` on the host's root
while it is off): with that module present they come up unlocked (PCIe Gen2 when
/etc/modprobe.d/cmp-pcie-gen2.conf is there too), without it locked. A warm reboot keeps the
state (stale GSP state, as on real cards). ``sim module`` prints the module loaded at this boot.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time

PROFILE = os.environ.get("RIGUP_GPU_SIM_PROFILE", "/etc/rigup-lab/gpu-profile.json")
RUN_DIR = os.environ.get("RIGUP_GPU_SIM_RUN", "/run/rigup-gpu-sim")
LIB_DIR = os.environ.get("RIGUP_GPU_SIM_LIB", "/var/lib/rigup-gpu-sim")

EXIT_INVALID_ARG, EXIT_NO_PERMISSION, EXIT_NOT_FOUND, EXIT_NO_DRIVER, EXIT_GPU_LOST = 2, 4, 6, 9, 15
NO_PERMISSION = "Insufficient Permissions\nTerminating early due to previous errors."
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


class Exit(Exception):
    def __init__(self, code, text=""):
        super().__init__(text)
        self.code, self.text = code, text


# ---------------------------------------------------------------- profile / state
def load_profile():
    try:
        with open(PROFILE) as f:
            prof = json.load(f)
    except (OSError, ValueError):
        return {"profile": "none", "bus_ids": [], "card": {}}
    drv = driver_state()
    if drv.get("version"):
        prof["driver_version"] = drv["version"]
        prof["cuda_version"] = BRANCH_CUDA.get(drv["version"].split(".")[0], prof.get("cuda_version"))
    return prof


# The fabric manager's stand-in (tests/lab/fabric_debs.py: its service writes FABRIC_READY with its
# version once it runs, and refuses to start at another version than the loaded driver's): an HGX
# profile's cards report their fabric registered only while it runs at the driver's version.
FABRIC_READY = os.environ.get("RIGUP_GPU_SIM_FABRIC", "/run/nvidia-fabricmanager/ready")


def fabric():
    """(fabric.state, fabric.status) of an HGX profile's cards, as nvidia-smi reports them."""
    try:
        with open(FABRIC_READY) as f:
            running = f.read().strip()
    except OSError:
        running = None
    return ("Completed", "Success") if running and running == PROF.get("driver_version") else ("In Progress", "N/A")


# ---------------------------------------------------------------- the driver packages (sim driver)
# What the lab stands in for when Debian's NVIDIA driver packages are installed (tests/lab/lab.py
# DRIVER_HOOK calls ``sim driver VERSION`` after each dpkg run): the kernel module loads at once
# where none was loaded (a bare host), else it stays until the next boot, and meanwhile nvidia-smi
# fails as the real one does when its library and the loaded module differ. The state is
# LIB_DIR/driver.json: {"version", "pending", "boot"} (it outlives a reboot, as the installed
# packages do).
DRIVER_FILE = "driver.json"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
EXIT_MISMATCH = 18
BRANCH_CUDA = {"535": "12.2", "550": "12.4", "570": "12.8", "575": "12.9", "580": "13.0", "590": "13.1"}
STAND_IN_PATHS = ("/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi")


def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def driver_state():
    """LIB_DIR/driver.json, with a version pending since an earlier boot taken as loaded now."""
    path = os.path.join(LIB_DIR, DRIVER_FILE)
    try:
        with open(path) as f:
            drv = json.load(f)
    except (OSError, ValueError):
        return {}
    if drv.get("pending") and drv.get("boot") != boot_id():
        drv = {"version": drv["pending"]}
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as f:
                json.dump(drv, f)
            os.replace(path + ".tmp", path)
    return drv


def is_stand_in(path):
    try:
        with open(path, "rb") as f:
            return b"Simulated ``nvidia-smi``" in f.read(400)
    except OSError:
        return False


def sim_driver(version):
    """Debian's nvidia-smi VERSION was installed: the module loads (no driver answered before) or
    waits for the next boot (another version is loaded)."""
    drv = driver_state()
    loaded = drv.get("version") or (PROF.get("driver_version") if any(map(is_stand_in, STAND_IN_PATHS)) else None)
    if loaded == version and not drv.get("pending"):
        return 0
    swap = loaded and loaded != version    # another module is in use: the new one loads at the next boot
    new = {"version": loaded, "pending": version, "boot": boot_id()} if swap else {"version": version}
    os.makedirs(LIB_DIR, exist_ok=True)
    with open(os.path.join(LIB_DIR, DRIVER_FILE), "w") as f:
        json.dump(new, f)
    target = "/usr/local/bin/nvidia-smi"      # ahead of the package's /usr/bin/nvidia-smi on PATH
    if not is_stand_in(target):
        with open(os.path.abspath(__file__), "rb") as src, open(target + ".tmp", "wb") as dst:
            dst.write(src.read())
        os.chmod(target + ".tmp", 0o755)
        os.replace(target + ".tmp", target)
    return 0


UNLOCKER_MODULE = "updates/cmpunlocker/nvidia.ko"      # under /lib/modules/<release>/
STOCK_MODULE = "updates/dkms/nvidia.ko"                # what the stock DKMS driver installs
GEN2_CONF = "etc/modprobe.d/cmp-pcie-gen2.conf"


def unlocked():
    return os.path.exists(os.path.join(LIB_DIR, "unlocked"))


def unlock_extra():
    """What the last cold boot's unlock recorded (e.g. {"pcie_gen": 2}); {} for a plain unlock."""
    try:
        with open(os.path.join(LIB_DIR, "unlocked")) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def log_call(argv):
    """Append this invocation's argv to LIB_DIR/calls.log (readers without write access skip it)."""
    try:
        os.makedirs(LIB_DIR, exist_ok=True)
        with open(os.path.join(LIB_DIR, "calls.log"), "a") as f:
            f.write(json.dumps({"t": round(time.time(), 3), "uid": os.getuid(), "argv": argv}) + "\n")
    except OSError:
        pass


def loaded_module(root="/"):
    """The nvidia.ko the driver loaded at this boot: fixed at the first call after boot."""
    path = os.path.join(RUN_DIR, "module")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        pass
    release = os.uname().release
    base = os.path.join("/lib/modules", release)
    mod = os.path.join(base, UNLOCKER_MODULE)
    if not os.path.exists(os.path.join(root, mod.lstrip("/"))):
        mod = os.path.join(base, STOCK_MODULE)
    try:
        os.makedirs(RUN_DIR, exist_ok=True)
        with open(path, "w") as f:
            f.write(mod + "\n")
    except OSError:
        pass
    return mod


def power_cycle(root):
    """A cold power-off and on of the host whose root file system is ``root`` (called by the lab
    while the host is off): the cards come up unlocked when the unlocker's module is installed
    (Gen2 with its modprobe option), locked otherwise. Returns the new state."""
    lib = os.path.join(root, LIB_DIR.lstrip("/"))
    os.makedirs(lib, exist_ok=True)
    mods = os.path.join(root, "lib/modules", os.uname().release, UNLOCKER_MODULE)
    flag = os.path.join(lib, "unlocked")
    if os.path.exists(mods):
        extra = {"pcie_gen": 2} if os.path.exists(os.path.join(root, GEN2_CONF)) else {}
        with open(flag, "w") as f:
            f.write(json.dumps(extra))
        return dict(extra, unlocked=True)
    if os.path.exists(flag):
        os.remove(flag)
    return {"unlocked": False}


def build_cards(prof):
    """Static description of each card, template merged with per-card overrides."""
    tmpl = prof.get("card", {})
    extra = prof.get("cards") or [{"bus_id": b} for b in prof.get("bus_ids", [])]
    cards = []
    for i, over in enumerate(extra):
        c = dict(tmpl, **over, index=i)
        if c.get("unlockable") and unlocked():
            c.update(c.get("unlocked", {}))
            c.update(unlock_extra())
        c.setdefault("bus_id", "00000000:%02X:00.0" % (7 + 3 * i))
        h = hashlib.sha1(("%s:%d:%s" % (prof.get("profile", "?"), i, c["bus_id"])).encode()).hexdigest()
        c.setdefault("uuid", "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:32]))
        cards.append(c)
    return cards


def defaults(c):
    i = c["index"]
    return {"power_limit": float(c.get("power_default_w", 0)), "persistence": False,
            "clocks_lock": None, "lost": False, "na": [], "memory_used": int(c.get("memory_used_idle_mib", 0)),
            "draw": round(float(c.get("idle_draw_w", 60.0)) + (i * 37 % 50) / 10.0, 2),
            "temp": int(c.get("idle_temp_c", 35)) + i * 3 % 5}


@contextlib.contextmanager
def state(write=False):
    """Yields {index: runtime state}; saved back (atomically) when write=True."""
    path = os.path.join(RUN_DIR, "state.json")
    lock = None
    try:   # readers (maybe non-root) need only a read-only handle for a shared lock
        if write:
            os.makedirs(RUN_DIR, exist_ok=True)
        lock = open(os.path.join(RUN_DIR, "state.lock"), "a" if write else "r")
        fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
    except FileNotFoundError:
        pass                       # nothing written since boot: all defaults
    except PermissionError:
        if write:
            raise Exit(EXIT_NO_PERMISSION, NO_PERMISSION)
    try:
        try:
            with open(path) as f:
                raw = json.load(f).get("cards", {})
        except (OSError, ValueError):
            raw = {}
        st = {c["index"]: dict(defaults(c), **raw.get(str(c["index"]), {})) for c in CARDS}
        yield st
        if write:
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "w") as f:
                json.dump({"cards": {str(k): v for k, v in st.items()}}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
    finally:
        if lock:
            lock.close()


# ---------------------------------------------------------------- helpers
def lost_msg(c):
    return "Unable to determine the device handle for GPU%s: Unknown Error" % c["bus_id"][-12:]


def norm_bus(b):
    b = b.upper()
    return b.split(":", 1)[1] if b.count(":") == 2 else b   # drop the domain


def select(spec):
    """Cards named by -i (index, UUID or PCI bus id, comma separated); all when None."""
    if spec is None:
        return list(CARDS)
    out = []
    for tok in spec.split(","):
        tok = tok.strip()
        hit = [c for c in CARDS if tok == str(c["index"]) or tok.upper() == c["uuid"].upper()
               or (":" in tok and norm_bus(tok) == norm_bus(c["bus_id"]))]
        if not hit:
            raise Exit(EXIT_NOT_FOUND, "No devices were found")
        out += [c for c in hit if c not in out]
    return out


def check_lost(cards, st):
    lost = [c for c in cards if st[c["index"]]["lost"]]
    if lost:
        raise Exit(EXIT_GPU_LOST, "\n".join(lost_msg(c) for c in lost))


def watts(x):
    return "%.2f W" % x


# ---------------------------------------------------------------- --query-gpu
def _fields():
    W, M, H = "W", "MiB", "MHz"
    f = {
        "index": (None, lambda c, s: str(c["index"])),
        "uuid": (None, lambda c, s: c["uuid"]),
        "pci.bus_id": (None, lambda c, s: c["bus_id"]),
        "pci.device_id": (None, lambda c, s: c.get("pci_device_id")),
        "name": (None, lambda c, s: c.get("name")),
        "compute_cap": (None, lambda c, s: c.get("compute_cap")),
        "driver_version": (None, lambda c, s: PROF.get("driver_version")),
        "count": (None, lambda c, s: str(len(CARDS))),
        "memory.total": (M, lambda c, s: c.get("memory_total_mib")),
        "memory.used": (M, lambda c, s: s["memory_used"]),
        "memory.free": (M, lambda c, s: c.get("memory_total_mib", 0) - s["memory_used"]),
        "power.limit": (W, lambda c, s: s["power_limit"]),
        "enforced.power.limit": (W, lambda c, s: s["power_limit"]),
        "power.default_limit": (W, lambda c, s: c.get("power_default_w")),
        "power.min_limit": (W, lambda c, s: c.get("power_min_w")),
        "power.max_limit": (W, lambda c, s: c.get("power_max_w")),
        "power.draw": (W, lambda c, s: min(s["draw"], s["power_limit"])),
        "temperature.gpu": (None, lambda c, s: s["temp"]),
        "utilization.gpu": ("%", lambda c, s: s.get("utilization", 0)),
        "persistence_mode": (None, lambda c, s: "Enabled" if s["persistence"] else "Disabled"),
        "pcie.link.gen.current": (None, lambda c, s: s.get("pcie_gen") or c.get("pcie_gen")),
        "pcie.link.gen.max": (None, lambda c, s: c.get("pcie_gen")),
        "pcie.link.width.current": (None, lambda c, s: s.get("pcie_width") or c.get("pcie_width")),
        "pcie.link.width.max": (None, lambda c, s: c.get("pcie_width")),
        "clocks.current.sm": (H, lambda c, s: s["clocks_lock"][1] if s["clocks_lock"]
                              else c.get("sm_clock_idle_mhz")),
        "clocks.max.sm": (H, lambda c, s: c.get("sm_clock_max_mhz")),
        # the NVSwitch fabric's registration (Hopper and later; N/A on the lab's cards without
        # NVSwitch, as on one passed-through H200: rigup/gpu/fabric.py; an HGX profile's: fabric())
        "fabric.state": (None, lambda c, s: fabric()[0] if PROF.get("nvswitches") else c.get("fabric_state")),
        "fabric.status": (None, lambda c, s: fabric()[1] if PROF.get("nvswitches") else c.get("fabric_status")),
        # what rigup-burnin reads before and after its run, and samples during its soak
        "ecc.errors.uncorrected.volatile.total": (None, lambda c, s: s.get("ecc_uncorrected", 0)),
        "remapped_rows.pending": (None, lambda c, s: "Yes" if s.get("remap_pending") else "No"),
        "remapped_rows.failure": (None, lambda c, s: "No"),
        "retired_pages.pending": (None, lambda c, s: "No"),
        "clocks_event_reasons.active": (None, lambda c, s: "0x%016x" % int(s.get("throttle") or 0)),
    }
    f["clocks_throttle_reasons.active"] = f["clocks_event_reasons.active"]
    f["clocks.current.graphics"] = f["clocks.current.sm"]
    f["clocks.max.graphics"] = f["clocks.max.sm"]
    return f


FIELDS = _fields()
ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "clocks.sm": "clocks.current.sm",
           "clocks.gr": "clocks.current.graphics", "clocks.max.gr": "clocks.max.graphics"}


def query_gpu(spec, fmt, ids):
    names = [ALIASES.get(n.strip(), n.strip()) for n in spec.split(",") if n.strip()]
    for n in names:
        if n not in FIELDS:
            raise Exit(EXIT_INVALID_ARG, 'Field "%s" is not a valid field to query.\n' % n)
    opts = [o.strip() for o in (fmt or "").split(",")]
    if "csv" not in opts or set(opts) - {"csv", "noheader", "nounits"}:
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    cards = select(ids)
    lines = [] if "noheader" in opts else [
        ", ".join(n + (" [%s]" % FIELDS[n][0] if FIELDS[n][0] else "") for n in names)]
    rc = 0
    with state() as st:
        for c in cards:
            s = st[c["index"]]
            if s["lost"]:
                lines.append(lost_msg(c))
                rc = EXIT_GPU_LOST
                continue
            vals = []
            for n in names:
                unit, get = FIELDS[n]
                v = None if n in s["na"] else get(c, s)
                if v is None:
                    vals.append("[N/A]")
                    continue
                if unit == "W":
                    v = "%.2f" % float(v)
                v = str(v)
                vals.append(v if (unit is None or "nounits" in opts) else "%s %s" % (v, unit))
            lines.append(", ".join(vals))
    print("\n".join(lines))
    return rc


# ---------------------------------------------------------------- other commands
def nvlink_status(args):
    """``nvidia-smi nvlink -s``: each card's NVLinks (an HGX profile's ``nvswitches.links`` per card,
    up only while the fabric is registered: :func:`fabric`); a profile without NVSwitch has none."""
    if args != ["-s"]:
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    links = (PROF.get("nvswitches") or {}).get("links", 0)
    up = fabric()[0] == "Completed"
    out = []
    for c in CARDS:
        out.append("GPU %d: %s (UUID: %s)" % (c["index"], c["name"], c["uuid"]))
        out += ["\t Link %d: %s" % (k, "26.562 GB/s" if up else "<inactive>") for k in range(links)]
    print("\n".join(out))
    return 0


def list_gpus(ids):
    with state() as st:
        cards = select(ids)
        out, rc = [], 0
        for c in cards:
            if st[c["index"]]["lost"]:
                out.append(lost_msg(c))
                rc = EXIT_GPU_LOST
            else:
                out.append("GPU %d: %s (UUID: %s)" % (c["index"], c["name"], c["uuid"]))
    print("\n".join(out))
    return rc


def set_power_limit(value, ids):
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    cards = select(ids)
    with state(write=True) as st:
        check_lost(cards, st)
        for c in cards:           # validate every target before touching any
            lo, hi = float(c["power_min_w"]), float(c["power_max_w"])
            if not lo <= w <= hi:
                raise Exit(EXIT_INVALID_ARG,
                           "Provided power limit %.2f W is not a valid power limit which should be between "
                           "%.2f W and %.2f W for GPU %s\nTerminating early due to previous errors."
                           % (w, lo, hi, c["bus_id"]))
        for c in cards:
            s = st[c["index"]]
            print("Power limit for GPU %s was set to %.2f W from %.2f W." % (c["bus_id"], w, s["power_limit"]))
            s["power_limit"] = w
    print("All done.")
    return 0


def set_persistence(value, ids):
    v = {"0": False, "1": True, "DISABLED": False, "ENABLED": True}.get(str(value).upper())
    if v is None:
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    word = "Enabled" if v else "Disabled"
    cards = select(ids)
    with state(write=True) as st:
        check_lost(cards, st)
        for c in cards:
            s = st[c["index"]]
            if s["persistence"] == v:
                print("Persistence mode is already %s for GPU %s." % (word, c["bus_id"]))
            else:
                print("%s persistence mode for GPU %s." % (word, c["bus_id"]))
                s["persistence"] = v
    print("All done.")
    return 0


def lock_clocks(value, ids):
    try:
        lo, hi = (int(x) for x in str(value).split(","))
    except ValueError:
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    cards = select(ids)
    with state(write=True) as st:
        check_lost(cards, st)
        for c in cards:
            hi_c = min(hi, int(c.get("sm_clock_max_mhz", hi)))
            st[c["index"]]["clocks_lock"] = [min(lo, hi_c), hi_c]
            print('GPU clocks set to "(gpuClkMin %d, gpuClkMax %d)" for GPU %s' % (lo, hi, c["bus_id"]))
    print("All done.")
    return 0


def reset_clocks(ids):
    cards = select(ids)
    with state(write=True) as st:
        check_lost(cards, st)
        for c in cards:
            st[c["index"]]["clocks_lock"] = None
    print("All done.")
    return 0


def header():
    return ["", "==============NVSMI LOG==============", "",
            "%-55s: %s" % ("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
            "%-55s: %s" % ("Driver Version", PROF.get("driver_version")),
            "%-55s: %s" % ("CUDA Version", PROF.get("cuda_version")), "",
            "%-55s: %d" % ("Attached GPUs", len(CARDS))]


def query(display, ids):
    cards = select(ids)
    sections = [d.strip().upper() for d in (display or "").split(",") if d.strip()]
    out = header()
    with state() as st:
        check_lost(cards, st)
        for c in cards:
            s = st[c["index"]]
            kv = lambda k, v, ind=4: out.append("%-55s: %s" % (" " * ind + k, v))
            out.append("GPU %s" % c["bus_id"])
            if not sections:
                kv("Product Name", c["name"])
                kv("Persistence Mode", "Enabled" if s["persistence"] else "Disabled")
                kv("GPU UUID", c["uuid"])
                kv("Minor Number", c["index"])
                kv("GPU Recovery Action", "None")
            if not sections or "POWER" in sections:
                out.append("    GPU Power Readings")
                draw = watts(min(s["draw"], s["power_limit"]))
                kv("Average Power Draw", draw, 8)
                kv("Instantaneous Power Draw", draw, 8)
                kv("Current Power Limit", watts(s["power_limit"]), 8)
                kv("Requested Power Limit", watts(s["power_limit"]), 8)
                kv("Default Power Limit", watts(c["power_default_w"]), 8)
                kv("Min Power Limit", watts(c["power_min_w"]), 8)
                kv("Max Power Limit", watts(c["power_max_w"]), 8)
            out.append("")
    print("\n".join(out))
    return 0


def summary(ids):
    """The plain ``nvidia-smi`` table (layout of the 5xx drivers; need not be exact)."""
    cards = select(ids)
    wide, cut = "+" + "-" * 89 + "+", "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    dv, cv = PROF.get("driver_version"), PROF.get("cuda_version")
    out = [time.strftime("%a %b %d %H:%M:%S %Y"), wide,
           "|" + (" NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s" % (dv, dv, cv)).ljust(89) + "|",
           cut, "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    with state() as st:
        check_lost(cards, st)
        for c in cards:
            s = st[c["index"]]
            out.append("|%4d  %-29.29s%4s  |%19s Off |%21s |" % (
                c["index"], c.get("name"), "On" if s["persistence"] else "Off", c["bus_id"], "0"))
            out.append("|%4s%5dC%6s%15dW / %4dW |%8dMiB / %6dMiB |%8s%13s |" % (
                "N/A", s["temp"], "P0", min(s["draw"], s["power_limit"]), s["power_limit"],
                s["memory_used"], c.get("memory_total_mib", 0), "0%", "Default"))
            out.append(cut)
    out += ["", wide, "| Processes:".ljust(90) + "|",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|", "|  No running processes found".ljust(90) + "|", wide]
    print("\n".join(out))
    return 0


# ---------------------------------------------------------------- sim helper
def sim(args):
    cmd = args[0] if args else "show"
    if cmd in ("lock", "unlock"):
        path = os.path.join(LIB_DIR, "unlocked")
        if cmd == "unlock":
            os.makedirs(LIB_DIR, exist_ok=True)
            open(path, "w").close()
        elif os.path.exists(path):
            os.remove(path)
        return 0
    if cmd == "calls":
        try:
            with open(os.path.join(LIB_DIR, "calls.log")) as f:
                sys.stdout.write(f.read())
        except OSError:
            pass
        return 0
    if cmd == "module":
        if not CARDS:
            raise Exit(EXIT_NO_DRIVER, NO_DRIVER)
        print(loaded_module())
        return 0
    if cmd == "xid":
        return sim_xid(args[1:])
    if cmd == "cuda":
        return sim_cuda()
    if cmd == "driver" and len(args) == 2:
        return sim_driver(args[1])
    if cmd == "show":
        with state() as st:
            doc = {"profile": PROF.get("profile"), "unlocked": unlocked(), "run_dir": RUN_DIR,
                   "cards": [dict(index=c["index"], name=c.get("name"), uuid=c["uuid"], bus_id=c["bus_id"],
                                  **st[c["index"]]) for c in CARDS]}
        print(json.dumps(doc, indent=2))
        return 0
    if cmd not in ("set", "reset"):
        raise Exit(EXIT_INVALID_ARG, "usage: rigup-gpu-sim set|reset|show|lock|unlock ...")
    if not CARDS:
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER)
    ids, changes, hang, rest = None, {}, None, list(args[1:])
    keys = {"--draw": ("draw", float), "--temp": ("temp", int), "--memory-used": ("memory_used", int),
            "--pcie-width": ("pcie_width", int), "--pcie-gen": ("pcie_gen", int), "--util": ("utilization", int),
            # the CUDA side's faults (tests/lab/cuda_standin.c reads them with ``sim cuda``)
            "--vram-bad": ("vram_bad", int), "--lost-under-load": ("lost_under_load", float),
            "--cuda-hang": ("cuda_hang", int), "--throttle": ("throttle", lambda v: int(v, 0)),
            "--ecc-uncorrected": ("ecc_uncorrected", int),
            # the cuBLAS stand-in's (it reads cublas_faults' file)
            "--gemm": ("gemm", gemm_fault), "--gemm-slow": ("gemm_slow", float), "--gemm-draw": ("gemm_draw", float)}
    while rest:
        a = rest.pop(0)
        if a in ("-i", "--id") and rest:
            ids = rest.pop(0)
        elif a in keys and rest:
            k, conv = keys[a]
            changes[k] = conv(rest.pop(0))
        elif a in ("--lost", "--found"):
            changes["lost"] = a == "--lost"
        elif a == "--na" and rest:
            changes["na"] = na_fields(rest.pop(0))
        elif a == "--hang" and rest:
            hang = rest.pop(0)
        else:
            raise Exit(EXIT_INVALID_ARG, "rigup-gpu-sim: bad argument %r" % a)
    if hang is not None:
        set_hang(hang)
    cards = list(CARDS) if ids in (None, "all") else select(ids)
    with state(write=True) as st:
        for c in cards:
            if cmd == "reset":
                st[c["index"]] = defaults(c)
            else:
                st[c["index"]].update(changes)
        cublas_faults(st)
    return 0


def gemm_fault(value):
    if value not in ("wrong", "refuse", "ok"):
        raise Exit(EXIT_INVALID_ARG, "rigup-gpu-sim: --gemm wrong|refuse|ok, not %r" % value)
    return value


def cublas_faults(st):
    """The cuBLAS stand-in's faults file (tests/lab/cuda_standin.c blas_fault: ``INDEX wrong``,
    ``INDEX refuse``, ``INDEX slow F``, ``INDEX draw R``), rewritten from the cards' state at each
    set and reset; a lab host reads it through /etc/rigup-lab/cublas-faults (tests/lab/lab.py)."""
    text = ""
    for i, s in sorted(st.items()):
        text += "%d %s\n" % (i, s["gemm"]) if s.get("gemm") in ("wrong", "refuse") else ""
        text += "".join("%d %s %g\n" % (i, k, s["gemm_" + k]) for k in ("slow", "draw") if s.get("gemm_" + k) is not None)
    path = os.path.join(RUN_DIR, "cublas-faults")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


XID_TEXT = {79: "GPU has fallen off the bus.", 13: "Graphics Exception: ESR 0x404600=0x80000002",
            48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
                "partition 6, subpartition 0.", 31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
                "GPCCLIENT_T1_0 faulted @ 0x7f1c_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"}


def sim_xid(rest):
    """The driver's ``NVRM: Xid`` line for one card, as the kernel logs it, into the journal as
    rigup-lab-kernel (a lab host has no kernel log of its own: the lab's containers share one)."""
    import subprocess
    if not rest or not rest[0].isdigit() or "-i" not in rest or rest.index("-i") + 1 >= len(rest):
        raise Exit(EXIT_INVALID_ARG, "usage: rigup-gpu-sim xid CODE -i N [--lost]")
    code, card = int(rest[0]), select(rest[rest.index("-i") + 1])[0]
    domain, bus, device = card["bus_id"].lower().split(":")   # 00000000:07:00.0 -> 0000:07:00
    line = "NVRM: Xid (PCI:%s:%s:%s): %d, pid=4242, name=llama-server, %s" % (
        domain[-4:], bus, device.split(".")[0], code, XID_TEXT.get(code, "rigup lab Xid"))
    subprocess.run(["logger", "-t", "rigup-lab-kernel", "-p", "kern.warning", "--", line], check=True)
    if "--lost" in rest:
        with state(write=True) as st:
            st[card["index"]]["lost"] = True
    print(line)
    return 0


def sim_cuda():
    """One line per card for the CUDA stand-in (tests/lab/cuda_standin.c): index, bus id, memory
    total and used (MiB), link gen and width now and at most, and the injected faults: bad VRAM
    words, seconds under load before it falls off the bus (0: never), a hanging launch (1)."""
    with state() as st:
        for c in CARDS:
            s = st[c["index"]]
            if s["lost"]:
                continue
            print("%d %s %d %d %d %d %d %d %d %g %d" % (
                c["index"], c["bus_id"], c.get("memory_total_mib", 0), s["memory_used"],
                s.get("pcie_gen") or c.get("pcie_gen") or 1, s.get("pcie_width") or c.get("pcie_width") or 1,
                c.get("pcie_gen") or 1, c.get("pcie_width") or 1, s.get("vram_bad", 0),
                s.get("lost_under_load", 0), s.get("cuda_hang", 0)))
    return 0


def na_fields(text):
    """``--na`` value -> the fields to answer [N/A] for ("none" or "" -> none)."""
    names = [ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip() and n.strip() != "none"]
    bad = [n for n in names if n not in FIELDS]
    if bad:
        raise Exit(EXIT_INVALID_ARG, "rigup-gpu-sim: --na: unknown field(s) %s" % ", ".join(bad))
    return names


HANG = os.path.join(RUN_DIR, "hang")


def set_hang(value):
    """``--hang 1``: every later call hangs; ``--hang 0``: calls answer again."""
    if value not in ("0", "1"):
        raise Exit(EXIT_INVALID_ARG, "rigup-gpu-sim: --hang takes 1 or 0")
    if value == "1":
        os.makedirs(RUN_DIR, exist_ok=True)
        open(HANG, "w").close()
    elif os.path.exists(HANG):
        os.remove(HANG)
    return 0


def hang_if_wedged():
    """Never return while the hang flag is set, as a wedged driver's nvidia-smi: a child (of the
    same process group) sleeps with our stdout and stderr, then we sleep too."""
    if os.path.exists(HANG):
        import subprocess
        subprocess.Popen(["sleep", "86400"])
        while True:
            time.sleep(3600)


# ---------------------------------------------------------------- main
SHORT = {"-i": "id", "--id": "id", "-pl": "power-limit", "--power-limit": "power-limit",
         "-pm": "persistence-mode", "--persistence-mode": "persistence-mode", "-lgc": "lock-gpu-clocks",
         "--lock-gpu-clocks": "lock-gpu-clocks", "-d": "display", "--display": "display",
         "--query-gpu": "query-gpu", "--format": "format"}
FLAGS = {"-L": "list", "--list-gpus": "list", "-q": "query", "--query": "query", "-rgc": "reset-gpu-clocks",
         "--reset-gpu-clocks": "reset-gpu-clocks", "-h": "help", "--help": "help"}


def parse(argv):
    opts, rest = {}, list(argv)
    while rest:
        a = rest.pop(0)
        name, eq, val = a.partition("=")
        if name in SHORT:
            if not eq:
                if not rest:
                    raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
                val = rest.pop(0)
            opts[SHORT[name]] = val
        elif a in FLAGS:
            opts[FLAGS[a]] = True
        else:
            raise Exit(EXIT_INVALID_ARG, "ERROR: Option %s is not recognized. Please run 'nvidia-smi -h'." % a)
    return opts


def run(argv):
    global PROF, CARDS
    PROF = load_profile()
    CARDS = build_cards(PROF)
    if argv[:1] == ["sim"]:
        return sim(argv[1:])
    log_call(argv)
    hang_if_wedged()
    pending = driver_state().get("pending")
    if pending:   # as a real nvidia-smi, until the boot that loads the new module
        raise Exit(EXIT_MISMATCH, MISMATCH + "\nNVML library version: " + pending)
    if argv[:1] == ["nvlink"]:
        return nvlink_status(argv[1:])
    opts = parse(argv)
    if opts.get("help"):
        print("NVIDIA System Management Interface (rigup lab simulation)\n" + __doc__)
        return 0
    if not CARDS:
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER)
    ids = opts.get("id")
    actions = [k for k in ("query-gpu", "list", "power-limit", "persistence-mode", "lock-gpu-clocks",
                           "reset-gpu-clocks", "query") if k in opts]
    if len(actions) > 1 or ("format" in opts and actions != ["query-gpu"]):
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    act = actions[0] if actions else None
    if act == "query-gpu":
        return query_gpu(opts["query-gpu"], opts.get("format"), ids)
    if act == "list":
        return list_gpus(ids)
    if act == "power-limit":
        return set_power_limit(opts["power-limit"], ids)
    if act == "persistence-mode":
        return set_persistence(opts["persistence-mode"], ids)
    if act == "lock-gpu-clocks":
        return lock_clocks(opts["lock-gpu-clocks"], ids)
    if act == "reset-gpu-clocks":
        return reset_clocks(ids)
    if act == "query":
        return query(opts.get("display"), ids)
    if "display" in opts:
        raise Exit(EXIT_INVALID_ARG, BAD_ARGS)
    return summary(ids)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.path.basename(sys.argv[0]) == "rigup-gpu-sim":
        argv = ["sim"] + argv
    try:
        return run(argv)
    except Exit as e:
        if e.text:
            print(e.text)
        return e.code
    except BrokenPipeError:      # e.g. `nvidia-smi ... | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
