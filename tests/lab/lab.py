"""Lab of throwaway systemd test hosts, booted with systemd-nspawn on this machine.

Each host is a copy-on-write overlay of one cached debootstrap root, runs a full systemd in its
own network namespace on a lab bridge, is reached over SSH with a lab key, and gets packages only
through the lab's own proxies on the bridge: apt's http downloads through an apt-cacher-ng (each
package fetched once for all hosts, while every host keeps its own apt cache and locks), the rest
(pip, https) through a tinyproxy. A host booted with ``init=False`` runs no systemd:
sshd alone under nspawn's stub init, as a docker-style rental container runs its entrypoint.
Needs root. Standard library only.
"""
import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import ipaddress
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# RIGUP_LAB_ID (a number, default none) gives a second lab on the same machine its own names,
# subnet and state, so that two test runs can each have one at the same time.
LAB_ID = os.environ.get("RIGUP_LAB_ID", "")
STATE = Path(os.environ.get("RIGUP_LAB_DIR", f"/var/lib/rigup-lab{LAB_ID}"))
SUBNET = ipaddress.ip_network(os.environ.get("RIGUP_LAB_SUBNET", f"10.213.{int(LAB_ID or 0)}.0/24"))
GATEWAY = SUBNET[1]
PROXY = f"http://{GATEWAY}:8888"
APT_PROXY = f"http://{GATEWAY}:3142"  # the lab's apt-cacher-ng: apt's http sources go through it
BRIDGE = f"rigupbr{LAB_ID or 0}"
NETNS, VETH, TMUX, CGROUP = f"rigup{LAB_ID}-", f"rl{LAB_ID}-", f"rigup{LAB_ID}-lab-", f"rigup-lab{LAB_ID}"
SUITE = "bookworm"
INCLUDE = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "sudo",
           "ca-certificates", "iproute2", "procps", "less", "curl")
BASE_RECIPE = {"suite": SUITE, "variant": "minbase", "include": list(INCLUDE)}  # recorded in its stamp
PROFILES = ("a100", "h100", "hgx-h100", "cmp170hx", "none")
BOOT_TIMEOUT = 180
# What a host booted without systemd runs (as PID 2, under nspawn's stub init): sshd alone.
NO_INIT_COMMAND = ("/bin/sh", "-c", "mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e")

# The caches every lab on this machine shares, whatever its RIGUP_LAB_ID (a second lab next to make
# test's boots from warm caches): the base root (each host's overlay lies on it), the ccache
# (ccache locks its files for concurrent users) and apt-cacher-ng's package cache, which one
# apt-cacher-ng at a time uses: the one holding its lock (start_apt_cacher); another lab's
# apt-cacher-ng then keeps a cache of its own in its state dir.
CACHE = Path(os.environ.get("RIGUP_LAB_CACHE", "/var/lib/rigup-lab-cache"))
BASE = CACHE / "base"
CCACHE = CACHE / "ccache"
BASE_STAMP = ".rigup-lab-base.json"
HOSTS = STATE / "hosts"
KEY = STATE / "ssh" / "id_ed25519"
KNOWN_HOSTS = STATE / "ssh" / "known_hosts"
STATE_FILE = STATE / "lab.json"
PROXY_CONF, PROXY_PID, PROXY_LOG = (STATE / f"tinyproxy.{x}" for x in ("conf", "pid", "log"))
ACNG = STATE / "apt-cacher-ng"              # its acng.conf, pid, socket and logs
ACNG_CACHE = CACHE / "apt-cacher-ng"
ACNG_OWN_CACHE = STATE / "cache" / "apt-cacher-ng"   # while another lab's apt-cacher-ng holds ACNG_CACHE
ACNG_HOLDER = CACHE / "apt-cacher-ng.address"       # the holder's address, the others' upstream proxy
ACNG_USER = "apt-cacher-ng"                 # made by Debian's package
# Seconds apt-cacher-ng serves an index file (InRelease, Packages) it fetched without asking the
# mirror again (Debian's default: 27). apt-cacher-ng 3.7.4 fails when hosts running apt-get update
# in the same second make it refresh an InRelease it holds twice ("Failure to move file ... out of
# the way ... File exists") and one host's apt-get then hangs on the truncated answer (seen twice
# with 8 hosts). So the lab never refreshes one: each start drops the cached index files (their
# first fetch is shared safely), and they stay fresh for the lab's life.
ACNG_FRESH_S = 86400

HERE = Path(__file__).resolve().parent
GPU_SIM = HERE / "nvidia_smi.py"
CUDA_STANDIN = HERE / "cuda_standin.c"   # the CUDA driver API's stand-in (rigup-burnin's calls)
GPU_PROFILES = HERE / "gpu_profiles.json"
# command -> Debian package that provides it
TOOLS = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "tinyproxy": "tinyproxy",
         "apt-cacher-ng": "apt-cacher-ng", "tmux": "tmux", "ip": "iproute2", "ssh-keygen": "openssh-client", "ssh": "openssh-client",
         "openssl": "openssl", "gcc": "gcc"}


class LabError(RuntimeError):
    """A lab operation failed; the message says what and shows the evidence."""


def run(*args, check=True, **kw):
    """Run a command (text mode, output captured unless told otherwise); raise LabError on failure."""
    kw.setdefault("capture_output", "stdout" not in kw)
    proc = subprocess.run([str(a) for a in args], text=True, **kw)
    if check and proc.returncode:
        raise LabError(f"{shlex.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr or ''}")
    return proc


def write(path, data, mode=0o644):
    """Write a file atomically (replacing any symlink there), creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    tmp.chmod(mode)
    os.replace(tmp, path)


@contextlib.contextmanager
def locked():
    """Hold the lab lock so that two `up`/`down` runs don't interleave."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def ensure_tools():
    """Install the Debian packages of any missing tool; keep Debian's own tinyproxy and
    apt-cacher-ng services stopped (they listen on every address, in the way of the lab's own)."""
    missing = sorted({pkg for tool, pkg in TOOLS.items() if not shutil.which(tool)})
    if not missing:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run("apt-get", "update", env=env)
    run("apt-get", "install", "-y", *missing, env=env)
    for service in sorted({"tinyproxy", "apt-cacher-ng"} & set(missing)):
        if shutil.which("service"):
            run("service", service, "stop", check=False)
        if shutil.which("update-rc.d"):
            run("update-rc.d", service, "disable", check=False)


def apt_source_files():
    """The controller's apt source files (path, text); registry hosts are never hard-coded."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    return [(p, p.read_text()) for p in files if p.is_file() and p.suffix in (".list", ".sources")]


def debian_mirror():
    """The controller's Debian mirror for SUITE, read from its apt sources."""
    for _, text in apt_source_files():
        for stanza in re.split(r"\n\s*\n", text):  # deb822 stanzas
            fields = dict(re.findall(r"^([\w-]+):\s*(.*)$", stanza, re.M))
            if SUITE in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
        for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):  # one-line style
            if m.group(2) == SUITE:
                return m.group(1)
    raise LabError(f"no apt source for {SUITE} on this machine to take the Debian mirror from")


@functools.cache
def pip_index_url():
    """The controller's pip index-url if it sets an http(s) one, else None (pip's default applies)."""
    urls = [os.environ.get("PIP_INDEX_URL", "")]
    proc = run(sys.executable, "-m", "pip", "config", "list", check=False)
    urls += [v.strip("'\"") for k, v in re.findall(r"^(\S+?)=(.*)$", proc.stdout or "", re.M)
             if k.endswith(".index-url")]
    return next((u for u in urls if u.startswith(("http://", "https://"))), None)


def base_is_cached():
    """True if the base root exists and was built from the current recipe."""
    stamp = BASE / BASE_STAMP
    return stamp.exists() and all(json.loads(stamp.read_text()).get(k) == v for k, v in BASE_RECIPE.items())


def overlays_on(lower) -> list[str]:
    """Mount points of the overlays (any lab's hosts) lying on ``lower``."""
    with open("/proc/self/mounts") as mounts:
        return [f[1] for f in (line.split() for line in mounts)
                if f[2] == "overlay" and f"lowerdir={lower}" in f[3].split(",")]


def adopt_old_caches():
    """Caches an older lab kept in its own state dir (``STATE/base``, ``STATE/cache/...``) move to
    the shared CACHE where it has none yet, unless hosts still lie on them."""
    for old, new in ((STATE / "base", BASE), (STATE / "cache" / "ccache", CCACHE),
                     (STATE / "cache" / "apt-cacher-ng", ACNG_CACHE)):
        if old.is_dir() and not new.exists() and not overlays_on(old):
            new.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, new)


def build_base():
    """Build the cached base root once (atomically); return seconds taken, or None if cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # another lab may be building it right now
        return _build_base()


def _build_base():
    if base_is_cached():
        return None
    recipe = dict(BASE_RECIPE)
    if overlays_on(BASE):
        raise LabError(f"the base root must be rebuilt, but lab hosts use it ({', '.join(overlays_on(BASE))}): "
                       "run `down` in each lab first")
    start = time.monotonic()
    for stale in [*CACHE.glob("base.*"), BASE]:  # a half-built or outdated root
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="base.", dir=CACHE))
    log_path = CACHE / "base-build.log"
    with open(log_path, "w") as log:
        proc = run("debootstrap", "--variant=minbase", "--include=" + ",".join(INCLUDE), SUITE, tmp,
                   debian_mirror(), check=False, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        shutil.rmtree(tmp)
        tail = log_path.read_text()[-3000:]
        raise LabError(f"debootstrap failed ({proc.returncode}); see {log_path}:\n{tail}")
    prepare_base(tmp)
    recipe["built_s"] = round(time.monotonic() - start, 1)
    write(tmp / BASE_STAMP, json.dumps(recipe, indent=1))
    tmp.chmod(0o755)
    tmp.rename(BASE)
    return recipe["built_s"]


def prepare_base(root):
    """Make a fresh debootstrap root fit to be shared by many hosts."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets its own
    write(root / "etc/machine-id", "")  # empty: systemd makes one at first boot
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (root / "var/lib/dbus/machine-id").symlink_to("/etc/machine-id")
    (root / "etc/apt/sources.list").unlink(missing_ok=True)  # hosts get the controller's sources
    write(root / "etc/ssh/sshd_config.d/rigup-lab.conf",
          "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
          "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    units = root / "etc/systemd/system"
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    links = {"multi-user.target.wants/ssh.service": "/lib/systemd/system/ssh.service",
             # firstboot would prompt on the console for a root password; apt timers would take apt's lock
             "systemd-firstboot.service": "/dev/null", "apt-daily.timer": "/dev/null",
             "apt-daily-upgrade.timer": "/dev/null"}
    for unit, target in links.items():
        (units / unit).unlink(missing_ok=True)
        (units / unit).symlink_to(target)


def address(name):
    """The LAN address of host `labN`."""
    return str(SUBNET[10 + int(name.removeprefix("lab"))])


def load_state():
    """The lab state (lab.json), or an empty one."""
    if STATE_FILE.exists():
        return json.loads(STATE_FILE.read_text())
    return {"hosts": []}


def save_state(hosts_):
    """Write lab.json atomically; inventory/lab.py reads it."""
    write(STATE_FILE, json.dumps({
        "subnet": str(SUBNET), "gateway": str(GATEWAY), "proxy": PROXY, "ssh_key": str(KEY),
        "known_hosts": str(KNOWN_HOSTS), "hosts": hosts_}, indent=2) + "\n")


def session(name):
    """The tmux session that runs host `name`."""
    return f"{TMUX}{name}"


def is_running(name):
    """True while the boot loop of host `name` runs (its tmux pane is alive)."""
    proc = run("tmux", "display-message", "-p", "-t", session(name), "#{pane_dead}", check=False)
    return proc.returncode == 0 and proc.stdout.strip() == "0"


def console(name):
    """The last lines of host `name`'s console (its tmux pane)."""
    proc = run("tmux", "capture-pane", "-p", "-S", "-60", "-t", session(name), check=False)
    return proc.stdout.rstrip() if proc.returncode == 0 else f"(no tmux session {session(name)})"


def hosts():
    """The running lab hosts: [{"name", "address", "profile"}, ...]; a host booted without
    systemd also has ``"init": False``."""
    return [h for h in load_state()["hosts"] if is_running(h["name"])]


def has_init(name):
    """False for host `name` if lab.json says it was booted without systemd (``up(..., init=False)``)."""
    return next((h.get("init", True) for h in load_state()["hosts"] if h["name"] == name), True)


def require_init(name, what):
    """Refuse `what` on host `name` when it runs without systemd."""
    if not has_init(name):
        raise LabError(f"{name} runs without systemd (booted with init=False): it cannot {what}; "
                       f"`remove {name}` and `up` it again instead")


def ensure_bridge_and_proxy():
    """Create the lab bridge and start the lab's own tinyproxy and apt-cacher-ng on it, unless
    already there."""
    if run("ip", "link", "show", BRIDGE, check=False).returncode:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    if str(GATEWAY) not in run("ip", "-4", "addr", "show", BRIDGE).stdout:
        run("ip", "addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    if not lab_pids("tinyproxy"):
        write(PROXY_CONF, f"User nobody\nGroup nogroup\nListen {GATEWAY}\nPort 8888\nTimeout 600\n"
                          f"MaxClients 100\nAllow {SUBNET}\nConnectPort 443\nConnectPort 80\nLogLevel Info\n")
        pid = start_proxy("tinyproxy", ["tinyproxy", "-d", "-c", PROXY_CONF], PROXY_LOG, 8888)
        write(PROXY_PID, f"{pid}\n")
    if not lab_pids("apt-cacher-ng"):
        start_apt_cacher()


def start_apt_cacher():
    """The lab's apt-cacher-ng on the bridge address, as Debian's own user, with its cache in the
    shared CACHE (kept by `down`, like the base root) when no other lab's apt-cacher-ng holds it:
    the daemon inherits the lock on it (an flock lasts while any holder of its file lives), else
    in this lab's state dir. It reaches the registries as tinyproxy does, straight from this
    machine, and fetches each package once for every host."""
    CACHE.mkdir(parents=True, exist_ok=True)
    lock = open(CACHE / "apt-cacher-ng.lock", "w")
    try:
        upstream = ""
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            cache = ACNG_CACHE
            write(ACNG_HOLDER, f"{GATEWAY}:3142\n")
        except BlockingIOError:
            # another lab's apt-cacher-ng holds the shared cache: this one fetches through it, so
            # that each package still comes from the mirror once for every lab on the machine
            cache = ACNG_OWN_CACHE
            with contextlib.suppress(OSError):
                upstream = f"Proxy: http://{ACNG_HOLDER.read_text().strip()}\n"
        for d in (ACNG, cache):
            d.mkdir(parents=True, exist_ok=True)
            shutil.chown(d, ACNG_USER, ACNG_USER)
        for dists in [p for p in cache.rglob("dists") if p.is_dir()]:  # index files (ACNG_FRESH_S)
            shutil.rmtree(dists, ignore_errors=True)
        write(ACNG / "acng.conf", f"CacheDir: {cache}\nLogDir: {ACNG}\nSupportDir: /usr/lib/apt-cacher-ng\n"
                                  f"Port: 3142\nBindAddress: {GATEWAY}\nPidFile: {ACNG}/pid\n"
                                  f"SocketPath: {ACNG}/socket\nExThreshold: 4\nFreshIndexMaxAge: {ACNG_FRESH_S}\n{upstream}")
        start_proxy("apt-cacher-ng", ["apt-cacher-ng", "-c", ACNG, "ForeGround=1"], ACNG / "console.log", 3142,
                    user=ACNG_USER, pass_fds=(lock.fileno(),) if cache == ACNG_CACHE else ())
    finally:
        lock.close()


def start_proxy(what, argv, log_path, port, user=None, pass_fds=()):
    """Start the lab's proxy `what` (argv) in the background as `user`, logging to `log_path`;
    wait until it listens on the bridge address at `port`; return its pid."""
    with open(log_path, "a") as log:
        pid = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True, user=user, group=user,
                               pass_fds=pass_fds).pid
    for _ in range(50):
        with contextlib.suppress(OSError), socket.create_connection((str(GATEWAY), port), timeout=1):
            return pid
        time.sleep(0.1)
    raise LabError(f"{what} did not listen on {GATEWAY}:{port}:\n{Path(log_path).read_text()[-2000:]}")


def processes():
    """(pid, argv) of every process on the machine."""
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit():
                yield int(d.name), (d / "cmdline").read_bytes().decode(errors="replace").split("\0")


def lab_pids(program):
    """PIDs of the lab's `program` processes: systemd-nspawn of a lab host, or the lab's
    tinyproxy or apt-cacher-ng."""
    return [pid for pid, argv in processes() if Path(argv[0]).name == program
            and any(a in (str(PROXY_CONF), str(ACNG)) or a.startswith(f"--directory={HOSTS}/") for a in argv)]


def file_server_pids():
    """PIDs of the lab's file server (tests/lab/sources.py: http.server serving STATE/srv)."""
    return [pid for pid, argv in processes() if "http.server" in argv and str(STATE / "srv") in argv]


def hub_pids():
    """PIDs of the lab's model hub (tests/lab/hub.py: serving STATE/hub)."""
    return [pid for pid, argv in processes() if "tests.lab.hub" in argv and str(STATE / "hub") in argv]


def create_host(name, profile, seed=None, driver=True):
    """Lay out, configure and network host `name` (not yet booted); `seed(upper)` may fill its
    overlay's upper layer before it is mounted (e.g. tests/bench_fleet.py, from a converged host);
    `driver=False`: a GPU profile's cards without their driver (configure_root)."""
    d = HOSTS / name
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    if seed:
        seed(d / "upper")
    run("mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={BASE},upperdir={d / 'upper'},workdir={d / 'work'}", d / "root")
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", d / "ssh_host_ed25519_key")
    configure_root(d / "root", name, profile, d / "ssh_host_ed25519_key", driver)
    if GPU_SIM.exists() and profile != "none":
        write_pci(d / "pci", json.loads(GPU_PROFILES.read_text())[profile])
    netns, veth = f"{NETNS}{name}", f"{VETH}{name}"
    run("ip", "netns", "add", netns)
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    run("ip", "link", "set", veth, "master", BRIDGE, "up")
    run("ip", "-n", netns, "addr", "add", f"{address(name)}/{SUBNET.prefixlen}", "dev", "eth0")
    run("ip", "-n", netns, "link", "set", "lo", "up")
    run("ip", "-n", netns, "link", "set", "eth0", "up")  # no default route: only the LAN is reachable


def write_pci(pci, prof):
    """The profile's cards (and an HGX profile's NVSwitches) as sysfs shows them under
    /sys/bus/pci/devices (vendor, device and class of each; boot binds this directory there): what
    a host has on its PCI bus before any driver."""
    switches = prof.get("nvswitches") or {"bus_ids": []}   # an HGX board's NVSwitch chips: PCI bridges
    for card, klass in ((prof["card"], "0x030200"), (switches, "0x068000")):
        if not card.get("pci_device_id"):
            continue
        device = "0x" + card["pci_device_id"][2:6].lower()         # 0x20B210DE -> 0x20b2
        for bus in (prof if card is prof["card"] else switches)["bus_ids"]:   # 00000000:07:00.0 -> 0000:07:00.0
            d = pci / bus[4:].lower()
            d.mkdir(parents=True, exist_ok=True)
            for key, value in (("vendor", "0x10de"), ("device", device), ("class", klass)):
                (d / key).write_text(value + "\n")


# The lab's stand-in for what a container cannot do when Debian's NVIDIA driver packages are
# installed: load the kernel module (lab hosts share the controller's kernel) and run the
# persistence daemon against /dev/nvidiactl. After each dpkg run: with nvidia-smi's package
# installed, the simulated nvidia-smi answers with its version (tests/lab/nvidia_smi.py ``sim
# driver``: at once where no driver was loaded, after a reboot where another one was), and the
# package's nvidia-persistenced is diverted to a daemon that only holds on.
DRIVER_HOOK = """#!/bin/sh
v=$(dpkg-query -W -f='${Status} ${Version}' nvidia-smi 2>/dev/null | sed -n 's/^install ok installed //p')
[ -n "$v" ] || exit 0
/usr/lib/rigup-lab/nvidia-smi sim driver "${v%%-*}"
if [ -e /usr/bin/nvidia-persistenced ] && ! dpkg-divert --list /usr/bin/nvidia-persistenced | grep -q .; then
    dpkg-divert --local --rename --divert /usr/bin/nvidia-persistenced.distrib --add /usr/bin/nvidia-persistenced
    install -m 755 /usr/lib/rigup-lab/nvidia-persistenced /usr/bin/nvidia-persistenced
fi
true
"""
PERSISTENCED = """#!/bin/sh
# the lab's nvidia-persistenced (tests/lab/lab.py DRIVER_HOOK): forks and holds on, as the real one does
mkdir -p /var/run/nvidia-persistenced
setsid sleep infinity </dev/null >/dev/null 2>&1 &
echo $! > /var/run/nvidia-persistenced/nvidia-persistenced.pid
"""


# One thread per llama-server (llama.cpp reads -t from LLAMA_ARG_THREADS where the command line has
# none): the lab's hosts share this machine's few cores, and a server's second thread spin-waits at
# each barrier for one the other hosts' work has descheduled. On a 2-core VM with both cores busy,
# Gemma 270M's chat requests took 1.35 s of CPU each with llama.cpp's default (2 threads), 0.43 s
# with one, and finished 2.8x sooner (lab servers took 1,060 s of a 3,745 s CPU make test, issue 45)
LLAMA_THREADS = "LLAMA_ARG_THREADS=1"


def configure_root(root, name, profile, host_key, driver=True):
    """Write the per-host files into the host's overlay (they land in its upper layer). A GPU
    profile gets the simulated nvidia-smi: on PATH (/usr/bin) as if its driver were loaded, or
    with ``driver=False`` only in /usr/lib/rigup-lab until Debian's driver packages are
    installed (DRIVER_HOOK)."""
    write(root / "etc/hostname", f"{name}\n")
    write(root / "etc/resolv.conf", "# lab hosts resolve nothing themselves: all traffic goes via the proxy\n")
    write(root / "root/.ssh/authorized_keys", KEY.with_suffix(".pub").read_text(), 0o600)
    (root / "root/.ssh").chmod(0o700)
    write(root / "etc/ssh/ssh_host_ed25519_key", host_key.read_bytes(), 0o600)
    write(root / "etc/ssh/ssh_host_ed25519_key.pub", host_key.with_suffix(".pub").read_bytes())
    # http sources through the apt-cacher-ng (which keeps the packages: the host needs no copy),
    # https ones (tunnelled, so not cacheable) through tinyproxy. No HTTP pipelining, and a request
    # that gets no byte for 20 s is given up and retried (base's Acquire::Retries): with apt's
    # defaults, 8 hosts' apt-get update at once left one or two of them hanging on a connection
    # apt-cacher-ng had dropped until rigup's 180 s limit (rigup/apt.py): base on 8 hosts took 200
    # s twice (6 hosts done in 27), 211 s with the timeout alone; without pipelining, 61 and 37 s
    write(root / "etc/apt/apt.conf.d/01rigup-lab-proxy",
          f'Acquire::http::Proxy "{APT_PROXY}";\nAcquire::https::Proxy "{PROXY}";\n'
          'Acquire::http::Timeout "20";\nAcquire::http::Pipeline-Depth "0";\nAPT::Keep-Downloaded-Packages "false";\n')
    # a lab host is thrown away, never power-cut: dpkg need not fsync each file it unpacks (the
    # CUDA toolkit's thousands: issue 45's budget)
    write(root / "etc/dpkg/dpkg.cfg.d/01rigup-lab-unsafe-io", "force-unsafe-io\n")
    for path, text in apt_source_files():  # skip sources whose keyring the host lacks
        keyrings = re.findall(r"(?:Signed-By:|signed-by=)\s*(/\S+?)(?=[\s\]]|$)", text, re.I)
        if all((root / k.lstrip("/")).exists() for k in keyrings):
            write(root / str(path).lstrip("/"), text)
    write(root / "etc/rigup-lab/ca.crt", Path("/etc/ssl/certs/ca-certificates.crt").read_bytes())
    from tests.lab import tls   # the lab's own CA (the hub's https origin): a system CA of the host

    tls.trust_in(root)
    index = pip_index_url()
    write(root / "etc/pip.conf", f"[global]\nproxy = {PROXY}\ncert = /etc/rigup-lab/ca.crt\n"
          + (f"index-url = {index}\n" if index else ""))
    no_proxy = f"localhost,127.0.0.1,::1,{SUBNET}"
    write(root / "etc/environment", "".join(
        f"{k}={v}\n{k.upper()}={v}\n" for k, v in
        (("http_proxy", PROXY), ("https_proxy", PROXY), ("no_proxy", no_proxy))) + LLAMA_THREADS + "\n")
    # the same for every unit (llama-server's, and the smoke's, tune's and bench's servers)
    write(root / "etc/systemd/system.conf.d/rigup-lab.conf", f"[Manager]\nDefaultEnvironment={LLAMA_THREADS}\n")
    write(root / "etc/rigup-lab/profile", f"{profile}\n")
    if GPU_SIM.exists() and profile != "none":
        write(root / "usr/lib/rigup-lab/nvidia-smi", GPU_SIM.read_bytes(), 0o755)
        write(root / "usr/lib/rigup-lab/nvidia-persistenced", PERSISTENCED, 0o755)
        write(root / "usr/lib/rigup-lab/driver-hook", DRIVER_HOOK, 0o755)
        write(root / "etc/apt/apt.conf.d/99rigup-lab-driver",
              'DPkg::Post-Invoke { "/usr/lib/rigup-lab/driver-hook"; };\n')
        if driver:
            write(root / "usr/bin/nvidia-smi", GPU_SIM.read_bytes(), 0o755)
            # where the driver's libcuda.so.1 is, so that dlopen finds it without ldconfig
            write(root / f"usr/lib/{platform.machine()}-linux-gnu/libcuda.so.1", cuda_standin().read_bytes(), 0o755)
            # and the toolkit's libcublas.so.12 beside it (rigup-burnin's soak), whose faults per card
            # `sim set --gemm...` writes into the simulator's runtime state (a reboot clears them)
            write(root / f"usr/lib/{platform.machine()}-linux-gnu/libcublas.so.12", cuda_standin(cublas=True).read_bytes(), 0o755)
            # with its libcublasLt beside it, as the toolkit's (rigup-burnin loads a cuBLAS only with it): empty
            write(root / f"usr/lib/{platform.machine()}-linux-gnu/libcublasLt.so.12", empty_library().read_bytes(), 0o755)
            faults = root / "etc/rigup-lab/cublas-faults"
            faults.unlink(missing_ok=True)
            faults.symlink_to("/run/rigup-gpu-sim/cublas-faults")
        link = root / "usr/local/bin/rigup-gpu-sim"
        link.unlink(missing_ok=True)
        link.symlink_to("/usr/bin/nvidia-smi" if driver else "/usr/lib/rigup-lab/nvidia-smi")
        write(root / "etc/rigup-lab/gpu-profile.json",
              json.dumps(json.loads(GPU_PROFILES.read_text())[profile], indent=2) + "\n")


def cuda_standin(cublas: bool = False) -> Path:
    """tests/lab/cuda_standin.c built once per source (in the shared cache, under its lock): the
    stand-in libcuda.so.1, or with ``cublas`` the stand-in libcublas.so.12, linked with the former
    (its GEMMs call the card's side there)."""
    digest = hashlib.sha256(CUDA_STANDIN.read_bytes()).hexdigest()[:16]
    built = CACHE / f"lib{'cublas' if cublas else 'cuda'}-standin-{digest}.so"
    if not built.exists():
        libcuda = cuda_standin() if cublas else None     # before the lock: it takes it too
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / "cuda-standin.lock", "w") as lock, tempfile.TemporaryDirectory() as lib:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not built.exists():
                tmp = built.with_name(f".{built.name}.{os.getpid()}")
                define, link = [], []
                if libcuda:   # linked by the name the host has it under: its NEEDED entry
                    os.symlink(libcuda, Path(lib) / "libcuda.so.1")
                    define, link = ["-DCUBLAS_STANDIN"], ["-L", lib, "-l:libcuda.so.1"]
                run("gcc", "-O2", "-shared", "-fPIC", "-Wall", *define, "-o", tmp, CUDA_STANDIN, *link)
                os.replace(tmp, built)
    return built


def empty_library() -> Path:
    """A shared library with nothing in it (the stand-in libcublasLt.so.12), built once in the shared cache."""
    built = CACHE / "libempty-standin.so"
    if not built.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = built.with_name(f".{built.name}.{os.getpid()}")
        run("gcc", "-shared", "-fPIC", "-o", tmp, "-x", "c", "/dev/null")
        os.replace(tmp, built)
    return built


def write_etc_hosts(all_hosts):
    """Let every host resolve every lab host by name (rewritten on each `up`)."""
    lab = "".join(f"{h['address']}\t{h['name']}\n" for h in all_hosts)
    for h in all_hosts:
        write(HOSTS / h["name"] / "root/etc/hosts",
              f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{lab}")


def cgroups(name=""):
    """Host `name`'s cgroups (or the lab's parent ones): one per hierarchy that systemd uses."""
    roots = []
    for line in open("/proc/self/mountinfo"):
        mount, fs = line.split(" - ")
        fstype, _, options = fs.split()[:3]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            roots.append(Path(mount.split()[4]) / CGROUP / name)
    return roots


def remove_cgroups(name=""):
    """Remove host `name`'s (empty) cgroups, or all of the lab's, bottom-up."""
    for top in cgroups(name):
        for d, _, _ in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(d)


def shared_caches():
    """(controller dir, host dir) pairs every host mounts: ccache, so a test run compiles each
    file once for all its hosts (and the next run on this machine reuses it); ccache locks its
    cache for concurrent users. apt's cache is not shared: its archive lock would be one lock for
    every host, and hosts running apt at once failed on it. Each host has its own, and packages
    are shared through the lab's apt-cacher-ng instead."""
    pairs = [(CCACHE, "/var/cache/rigup/ccache")]
    for src, _ in pairs:
        (src / "partial").mkdir(parents=True, exist_ok=True)
    return pairs


def boot(name):
    """Start host `name` in its tmux session; the loop turns nspawn's 133 (reboot) into a reboot.

    A host lab.json marks ``"init": false`` runs NO_INIT_COMMAND (sshd) instead of systemd
    (`--as-pid2` instead of `-b`); nspawn kills it on SIGTERM.
    The loop first moves itself into the host's own cgroups: nspawn --keep-unit boots the host in
    the cgroup it starts in, and hosts sharing one would clash over their systemd's units there.
    """
    enter = "".join(f"mkdir -p {shlex.quote(str(c))} && echo $$ > {shlex.quote(str(c / 'cgroup.procs'))} && "
                    for c in cgroups(name))
    init = has_init(name)
    nspawn = shlex.join(["systemd-nspawn", "-q", f"--directory={HOSTS / name / 'root'}",
                         "-b" if init else "--as-pid2",
                         "--register=no", "--keep-unit", f"--machine={name}", "--resolv-conf=off",
                         "--link-journal=no", f"--network-namespace-path=/run/netns/{NETNS}{name}",
                         # its own firewall (roles/rpc_worker's nftables), in its own network namespace
                         "--capability=CAP_NET_ADMIN",
                         *(f"--bind={src}:{dest}" for src, dest in shared_caches()),
                         # the profile's cards on the PCI bus (write_pci), where sysfs shows them
                         *([f"--bind-ro={HOSTS / name / 'pci'}:/sys/bus/pci/devices"]
                           if (HOSTS / name / "pci").is_dir() else []),
                         *(() if init else NO_INIT_COMMAND)])
    # Each boot runs in a new time namespace whose boot clock starts at 0, so the host's
    # /proc/uptime restarts as a real machine's does (pyinfra's server.reboot waits for that).
    fresh_clock = 'unshare --time --boottime "-$(cut -d. -f1 /proc/uptime)" '
    loop = f'{enter}while :; do {fresh_clock}{nspawn}; rc=$?; [ $rc -eq 133 ] || break; done; echo "nspawn exited $rc"'
    run("tmux", "new-session", "-d", "-x", "200", "-y", "50", "-s", session(name))
    run("tmux", "set-option", "-t", session(name), "remain-on-exit", "on")  # keep a failed console
    run("tmux", "respawn-pane", "-k", "-t", session(name), "sh", "-c", loop)


def ssh_argv(name):
    """The ssh command line (lab key, strict host key checking) for host `name`."""
    return ["ssh", "-F", "/dev/null", "-i", str(KEY), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
            # a session whose host went away without a word (a reboot, a cut link) ends within a minute
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", f"root@{address(name)}"]


def ssh(name, cmd, timeout=None, capture=True):
    """Run `cmd` (a shell string, or argv that gets quoted) on host `name`; return CompletedProcess."""
    cmd = cmd if isinstance(cmd, str) else shlex.join(cmd)
    try:
        return subprocess.run(ssh_argv(name) + ["--", cmd], text=True, capture_output=capture,
                              timeout=timeout, stdin=subprocess.DEVNULL if capture else None)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, "", f"ssh {name}: timed out after {timeout} s")


def wait_ready(name, timeout=BOOT_TIMEOUT):
    """Wait until host `name` answers SSH and systemd says running/degraded; return that state
    ("no init" for a host without systemd, once SSH answers)."""
    deadline = time.monotonic() + timeout
    check, ready = ("systemctl is-system-running --wait", ("running", "degraded")) if has_init(name) \
        else ("echo no init", ("no init",))
    while (left := deadline - time.monotonic()) > 0:
        if not is_running(name):
            raise LabError(f"{name} stopped while booting; console:\n{console(name)}")
        proc = ssh(name, check, timeout=max(left, 1))
        if proc.stdout.strip() in ready:
            return proc.stdout.strip()
        time.sleep(1)
    raise LabError(f"{name} ({address(name)}) not ready after {timeout} s; console:\n{console(name)}")


def reboot(name, timeout=BOOT_TIMEOUT):
    """Reboot host `name` with `systemctl reboot` and wait until it is back; return systemd's state."""
    require_init(name, "reboot")
    # a token kept in /run, a tmpfs new on every boot (PID 1's start time repeats: uptime restarts)
    boot_mark = "cat /run/rigup-lab-boot 2>/dev/null || cat /proc/sys/kernel/random/uuid | tee /run/rigup-lab-boot"
    before = ssh(name, boot_mark, timeout=30).stdout.strip()
    ssh(name, "systemctl reboot", timeout=15)
    deadline = time.monotonic() + timeout
    while ssh(name, boot_mark, timeout=10).stdout.strip() in ("", before):
        if time.monotonic() > deadline or not is_running(name):
            raise LabError(f"{name} did not come back from reboot; console:\n{console(name)}")
        time.sleep(1)
    return wait_ready(name, max(deadline - time.monotonic(), 1))


def cold_boot(name, timeout=BOOT_TIMEOUT):
    """Power host `name` off (`systemctl poweroff`), power-cycle its simulated GPUs while it is off
    (tests/lab/nvidia_smi.py ``power_cycle``: what a warm reboot never does, e.g. bring up
    CMP 170HX cards unlocked once the unlocker's module is installed), then boot it again and wait
    until it is ready. Distinct from `reboot`; returns systemd's state."""
    require_init(name, "be powered off and on")
    ssh(name, "systemctl poweroff", timeout=15)
    deadline = time.monotonic() + timeout
    while is_running(name):
        if time.monotonic() > deadline:
            raise LabError(f"{name} did not power off; console:\n{console(name)}")
        time.sleep(0.5)
    if GPU_SIM.exists():
        sys.path.insert(0, str(HERE))
        try:
            import nvidia_smi
        finally:
            sys.path.remove(str(HERE))
        nvidia_smi.power_cycle(str(HOSTS / name / "root"))
    run("tmux", "kill-session", "-t", session(name), check=False)
    boot(name)
    return wait_ready(name, max(deadline - time.monotonic(), 1))


def kind(profile, init, driver=True):
    """A host's profile as messages name it: "a100", "none without systemd", "a100 without a driver"."""
    return profile + ("" if init else " without systemd") + ("" if driver else " without a driver")


def up(n, profile, first=1, init=True, seed=None, driver=True):
    """Boot hosts lab<first>..lab<first+n-1> with `profile` (keeping running ones); return all
    running hosts. Hosts of other profiles may run next to them: `up(1, "h100", first=3)` adds
    lab3 to a running a100 lab1..lab2. With `init=False` the new hosts run sshd without systemd
    (recorded as ``"init": false`` in lab.json); `reboot` and `cold_boot` refuse them. `seed`: see
    create_host. With `driver=False` a GPU profile's cards are on the PCI bus but no driver answers
    (``"driver": false``) until Debian's driver packages are installed (configure_root)."""
    if profile not in PROFILES or n < 1 or first < 1:
        raise LabError(f"need n >= 1, first >= 1 and a profile of {', '.join(PROFILES)}, "
                       f"not {n}, {first}, {profile!r}")
    wanted = [f"lab{i}" for i in range(first, first + n)]
    ensure_tools()
    with locked():
        running = hosts()
        for h in running:
            had = kind(h["profile"], h.get("init", True), h.get("driver", True))
            if h["name"] in wanted and had != kind(profile, init, driver):
                raise LabError(f"{h['name']} runs profile {had}, not "
                               f"{kind(profile, init, driver)}: `remove {h['name']}` or `down` first")
        if profile != "none" and GPU_SIM.exists() and profile not in json.loads(GPU_PROFILES.read_text()):
            raise LabError(f"profile {profile} is not in {GPU_PROFILES}")
        adopt_old_caches()
        built = build_base()
        if built is not None:
            print(f"base root built in {built} s", flush=True)
        if not KEY.exists():
            KEY.parent.mkdir(parents=True, exist_ok=True)
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigup-lab", "-f", KEY)
        ensure_bridge_and_proxy()
        names = {h["name"] for h in running}
        new = [{"name": name, "address": address(name), "profile": profile, **({} if init else {"init": False}),
                **({} if driver else {"driver": False})} for name in wanted if name not in names]
        for h in new:
            remove_host(h["name"])  # leftovers of a host that stopped or half-started
            create_host(h["name"], profile, seed, driver)
        all_hosts = sorted(running + new, key=lambda h: int(h["name"][3:]))
        inotify_room(len(all_hosts))
        publish(all_hosts)
        start = time.monotonic()
        for h in new:
            boot(h["name"])
        with concurrent.futures.ThreadPoolExecutor(len(all_hosts)) as pool:
            for h, state in zip(all_hosts, pool.map(lambda h: wait_ready(h["name"]), all_hosts)):
                print(f"{h['name']} {h['address']} {h['profile']}: {state} after "
                      f"{time.monotonic() - start:.1f} s", flush=True)
        return all_hosts


# Each booted host's systemd, journald, logind and dbus take inotify instances of root's one
# per-user quota: Debian's default of 128 runs out near 20 hosts ("Too many open files", units
# failing with result 'resources'). LXD's production guide raises these for the same reason.
INOTIFY_PER_HOST = {"max_user_instances": 32, "max_user_watches": 16384}


def inotify_room(count):
    """Raise the kernel's inotify limits (never lower them) to what ``count`` booted hosts need."""
    for key, per_host in INOTIFY_PER_HOST.items():
        path = Path("/proc/sys/fs/inotify") / key
        wanted = 128 + per_host * count
        if int(path.read_text()) < wanted:
            path.write_text(f"{wanted}\n")
            print(f"fs.inotify.{key} raised to {wanted} for {count} lab hosts", flush=True)


def publish(all_hosts):
    """Write known_hosts, lab.json (inventory/lab.py reads it) and every host's /etc/hosts."""
    keys = {h["name"]: (HOSTS / h["name"] / "ssh_host_ed25519_key.pub").read_text() for h in all_hosts}
    write(KNOWN_HOSTS, "".join(f"{h['address']} {keys[h['name']]}" for h in all_hosts))
    save_state(all_hosts)
    write_etc_hosts(all_hosts)


def remove(name):
    """Remove one host (e.g. one a test added with `up(..., first=N)`); the others keep running."""
    ensure_tools()
    with locked():
        mine = f"--directory={HOSTS / name / 'root'}"
        stop_processes([pid for pid, argv in processes()  # a clean poweroff; a host without systemd is killed
                        if Path(argv[0]).name == "systemd-nspawn" and mine in argv], 30)
        remove_host(name)
        rest = [h for h in hosts() if h["name"] != name]
        publish(rest)
        return rest


def stop_processes(pids, timeout):
    """SIGTERM `pids`, wait up to `timeout` s for them to exit, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pids := [p for p in pids if alive(p)]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        else:
            return


def alive(pid):
    """True while `pid` runs; reaps it if it is our own exited child (the proxy)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def lab_mounts():
    """Mount points under the state dir, deepest first."""
    points = [line.split()[4].encode().decode("unicode_escape") for line in open("/proc/self/mountinfo")]
    return sorted((p for p in points if p.startswith(f"{STATE}/")), key=len, reverse=True)


def remove_host(name):
    """Remove every trace of host `name`: processes, session, mount, netns, veth, files."""
    netns = f"{NETNS}{name}"
    if Path(f"/run/netns/{netns}").exists():  # what survives of a container (its PID 1 is in there)
        pids = run("ip", "netns", "pids", netns, check=False).stdout.split()
        stop_processes([int(p) for p in pids], 5)
    run("tmux", "kill-session", "-t", session(name), check=False)
    for point in lab_mounts():
        if point.startswith(f"{HOSTS / name}/") and run("umount", point, check=False).returncode:
            run("umount", "-l", point)
    run("ip", "netns", "del", netns, check=False)
    run("ip", "link", "del", f"{VETH}{name}", check=False)
    remove_cgroups(name)
    shutil.rmtree(HOSTS / name, ignore_errors=True)


def down():
    """Remove every lab host, the bridge and the proxy (idempotent); keep the cached base root."""
    ensure_tools()
    with locked():
        stop_processes(lab_pids("systemd-nspawn"), 30)  # SIGTERM: a clean poweroff (a host without systemd: killed)
        names = {h["name"] for h in load_state()["hosts"]}
        names |= {p.name for p in HOSTS.glob("*")}
        names |= {p.name.removeprefix(NETNS) for p in Path("/run/netns").glob(f"{NETNS}*")}
        tmux = run("tmux", "list-sessions", "-F", "#{session_name}", check=False).stdout.split()
        names |= {s.removeprefix(TMUX) for s in tmux if s.startswith(TMUX)}
        for name in sorted(names):
            remove_host(name)
        run("ip", "link", "del", BRIDGE, check=False)
        remove_cgroups()
        stop_processes(lab_pids("tinyproxy"), 5)
        stop_processes(lab_pids("apt-cacher-ng"), 5)
        stop_processes(file_server_pids(), 5)
        stop_processes(hub_pids(), 5)
        for path in (PROXY_PID, STATE / "srv.pid", STATE / "hub.pid", STATE / "hub.url", STATE_FILE, KNOWN_HOSTS):
            path.unlink(missing_ok=True)
        shutil.rmtree(HOSTS, ignore_errors=True)
        shutil.rmtree(STATE / "artifacts", ignore_errors=True)   # the controller's builds of this lab's hosts
