"""roles/base's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_packages  a package of base_packages or base_extra_packages that is not a Debian name
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.refusal import Refusal, config_refusals

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

# Debian's package names (policy 5.6.1), with an optional =VERSION (policy 5.6.12): nothing apt reads
# as an option (-o...), a file (./x.deb) or a release (/unstable).
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[0-9][A-Za-z0-9.+~:-]*)?")


def check_packages(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A package of base_packages or base_extra_packages that is not a Debian package name
    (``[a-z0-9][a-z0-9+.-]+``, optionally ``=VERSION``): apt-get, as root, would read ``-o...`` as
    an option and ``./x.deb`` as a file to install."""
    return config_refusals([(f"{key}[{i}]", f"expected a Debian package name ([a-z0-9][a-z0-9+.-]+, optionally "
                                            f"=VERSION), got {name!r}")
                            for key in ("base_packages", "base_extra_packages")
                            for i, name in enumerate(data.get(key) or [])
                            if not (isinstance(name, str) and PACKAGE.fullmatch(name))])


CHECKS = (check_packages,)
