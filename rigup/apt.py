"""apt operations that change nothing, and read nothing twice, when the packages are there; and
apt commands that wait for every apt lock.

apt (2.6, Debian 12) waits for dpkg's locks (``/var/lib/dpkg/lock-frontend`` and ``lock``) when
told to (``DPkg::Lock::Timeout``, roles/base's apt.conf drop-in), but not for the others: ``apt-get
update`` fails at once on ``/var/lib/apt/lists/lock`` and ``apt-get install`` on
``/var/cache/apt/archives/lock`` while another apt (apt-daily, unattended-upgrades, a second
controller) holds them. :func:`waiting` runs an apt command again while it fails on a lock, for up
to ``apt_lock_timeout`` seconds: apt says which lock, and no tool has to guess it (lslocks, fuser
and /proc/locks see fcntl locks differently across filesystems and containers).
"""

import shlex

from pyinfra import host
from rigup.probe import operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from rigup.state import read_once, reading

# apt's words (LC_ALL=C) when a lock is held: lists, archives (Could not get lock / Unable to lock
# directory) and dpkg's own past DPkg::Lock::Timeout (Unable to acquire the dpkg frontend lock).
LOCK_WORDS = ("Could not get lock", "Unable to lock", "Unable to acquire the dpkg frontend lock")
# $1: seconds to wait, $2: the apt command (shell). Runs $2 until it succeeds, fails for another
# reason, or the time is up; says once which lock it waits for. A command that timed out (exit
# 124 of ``timeout``: an ``apt-get update`` whose mirror or proxy stopped answering, seen as a
# connection left in CLOSE-WAIT by apt's http method for ever) is run again too.
_WAIT = (
    'export LC_ALL=C; end=$(( $(date +%s) + $1 )); said=; '
    'while :; do out=$(eval "$2" 2>&1); rc=$?; '
    'if [ $rc -eq 0 ]; then printf "%s\\n" "$out"; exit 0; fi; '
    'if [ $rc -eq 124 ]; then echo "rigup: $2 timed out: run again"; '
    'else case $out in ' + "|".join(f'*"{w}"*' for w in LOCK_WORDS) + ') ;; *) printf "%s\\n" "$out"; exit $rc;; esac; fi; '
    'if [ "$(date +%s)" -ge "$end" ]; then printf "%s\\n" "$out" '
    '"rigup: an apt lock was still held after $1 s (apt_lock_timeout)"; exit $rc; fi; '
    '[ -n "$said" ] || { said=1; printf "%s\\n" "$out" | grep -m1 -e "lock" | sed "s/^/rigup: waiting: /"; }; '
    'sleep 2; done'
)


def waiting(command: str, timeout: int) -> str:
    """Shell that runs the apt ``command`` (shell text), again every 2 s while it fails because an
    apt lock is held, for up to ``timeout`` seconds; its output is printed once it ends."""
    return f"sh -c {shlex.quote(_WAIT)} rigup-apt {int(timeout)} {shlex.quote(command)}"


UPDATE_TIMEOUT_S = 180  # an apt-get update (index files only) that takes longer hangs: run it again


def updated(command: str = "apt-get update") -> str:
    """``apt-get update`` bounded to UPDATE_TIMEOUT_S (then killed and, by :func:`waiting`, run
    again): apt's http method can wait for ever on a connection its proxy closed."""
    return f"timeout -k 10 {UPDATE_TIMEOUT_S} {command}"


def lock_timeout() -> int:
    """This host's ``apt_lock_timeout`` (roles/base), 600 without one."""
    value = host.data.get("apt_lock_timeout")
    return 600 if value is None else int(value)


@reading(DebPackages)
@operation()
def installed(packages: list[str], cache_seconds: int = 86400):
    """Install ``packages`` when any is missing, reading apt's lists first if they are older
    than ``cache_seconds``. With every package present it runs no apt command at all (pyinfra's
    ``apt.packages(update=True)`` would refresh the lists, a change, whenever they are stale).

    Each apt command waits for every apt lock (:func:`waiting`, ``apt_lock_timeout``).
    """
    present = read_once(DebPackages)
    missing = [p for p in packages if p not in present]
    if not missing:
        host.noop(f"{len(packages)} packages already installed")
        return
    timeout = lock_timeout()
    for command in apt.update._inner(cache_time=cache_seconds):
        yield waiting(updated(command), timeout) if str(command).startswith("apt-get") else command
    yield install_command(missing, timeout)


def install_command(packages: list[str], timeout: int | None = None) -> str:
    """Shell text installing ``packages`` (no recommends, waiting for apt's locks)."""
    install = "install --no-install-recommends " + " ".join(shlex.quote(p) for p in packages)
    return waiting(noninteractive_apt(install), lock_timeout() if timeout is None else timeout)


@operation()
def components(names: list[str]):
    """Add the archive components ``names`` (Debian's contrib, non-free, non-free-firmware) to the
    Debian sources that lack them, in deb822 or one-line files, then read apt's lists again."""
    for name in names:
        yield (f"for f in /etc/apt/sources.list.d/*.sources; do [ -e \"$f\" ] || continue; "
               f"grep -Eq '^Components:(.* )?{name}( |$)' \"$f\" || sed -i 's/^Components: .*/& {name}/' \"$f\"; done; "
               f"[ ! -s /etc/apt/sources.list ] || grep -Eq '^deb .* {name}( |$)' /etc/apt/sources.list || "
               f"sed -Ei 's/^(deb .*)$/\\1 {name}/' /etc/apt/sources.list")
    yield waiting(updated(), lock_timeout())
