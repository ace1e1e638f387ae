"""apt operations that change nothing, and read nothing twice, when the packages are there."""

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from rigup.state import read_once


@operation()
def installed(packages: list[str], cache_seconds: int = 86400):
    """Install ``packages`` when any is missing, reading apt's lists first if they are older
    than ``cache_seconds``. With every package present it runs no apt command at all (pyinfra's
    ``apt.packages(update=True)`` would refresh the lists, a change, whenever they are stale).

    The host's apt waits on the dpkg lock through roles/base's apt.conf drop-in.
    """
    present = read_once(DebPackages)
    missing = [p for p in packages if p not in present]
    if not missing:
        host.noop(f"{len(packages)} packages already installed")
        return
    yield from apt.update._inner(cache_time=cache_seconds)
    yield from apt.packages._inner(packages=missing, no_recommends=True)
