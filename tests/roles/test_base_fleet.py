"""8 fresh lab hosts run apt at once: roles/base (tests/roles/base_only.py) converges on all of
them in one run, each host with its own apt cache, packages shared through the lab's
apt-cacher-ng; on one host another apt holds apt's lists and archive locks for longer than
pyinfra's retries last, and rigup's apt waits for them (rigup/apt.py ``waiting``)."""

import shlex

import pytest

from tests.conftest import limit, on_host
from tests.converge import pyinfra
from tests.lab import lab

pytestmark = pytest.mark.lab
RETRY_S = 2   # apt_retry_delay: pyinfra's 2 retries of base's apt install, 2 s apart (10 s by default)
HOLD_S = 12   # longer than those retries last, so only rigup's own wait can carry the install
HOLD = ("import fcntl, sys, time\n"
        "held = [open(p, 'w') for p in sys.argv[1:]]\n"
        "for f in held: fcntl.lockf(f, fcntl.LOCK_EX)\n"
        "open('/run/rigup-test-held', 'w').write(str(time.time()))\n"
        f"time.sleep({HOLD_S})\n"
        "open('/run/rigup-test-released', 'w').write(str(time.time()))\n")


def acng_debs() -> tuple[int, int]:
    """(.deb files the lab's apt-cacher-ng fetched from the mirror, .deb files it served)."""
    log = lab.ACNG / "apt-cacher.log"
    rows = [ln.split("|") for ln in (log.read_text().splitlines() if log.exists() else [])]
    debs = [r for r in rows if len(r) >= 5 and r[-1].endswith(".deb")]
    return sum(r[1] == "I" for r in debs), sum(r[1] == "O" for r in debs)


def test_eight_fresh_hosts_converge_base_at_once(fleet):
    names = [h["name"] for h in fleet]
    before = acng_debs()
    holder = names[0]
    on_host(lab, holder, "systemd-run --unit rigup-test-apt-hold python3 -c " + shlex.quote(HOLD)
            + " /var/lib/apt/lists/lock /var/cache/apt/archives/lock")
    on_host(lab, holder, "for i in $(seq 50); do [ -e /run/rigup-test-held ] && exit 0; sleep 0.1; done; exit 1")
    run = pyinfra("inventory/lab.py", "tests/roles/base_only.py", *limit(fleet),
                  "--data", f"apt_retry_delay={RETRY_S}", timeout=900)
    fetched, served = (a - b for a, b in zip(acng_debs(), before))
    print(f"\nbase on {len(names)} fresh hosts at once: {run.seconds:.1f} s, exit {run.returncode}; "
          f"apt-cacher-ng: {fetched} .deb fetched from the mirror, {served} served to the hosts")
    assert run.returncode == 0, run.output[-6000:]
    assert "Could not get lock" not in run.output
    for name in names:
        on_host(lab, name, "dpkg -s jq git tmux rsync >/dev/null")
        assert "DPkg::Lock::Timeout" in on_host(lab, name, "cat /etc/apt/apt.conf.d/80rigup")
    released = float(on_host(lab, holder, "cat /run/rigup-test-released"))
    installed = float(on_host(lab, holder, "stat -c %Y /var/lib/dpkg/info/jq.list"))
    print(f"{holder}: the locks were released at +{HOLD_S} s; jq installed {installed - released:.1f} s after")
    assert installed >= released
    assert served > fetched    # each package came from the mirror once at most, for 8 hosts
