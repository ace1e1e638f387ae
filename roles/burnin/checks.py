"""roles/burnin's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_clear    burnin_clear: an entry that is not a GPU UUID (GPU-...) or "all"
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rigup.refusal import Refusal, config_refusals

if TYPE_CHECKING:
    from rigup.config import Config
    from rigup.gpu.facts import Facts
    from rigup.gpu.plan import Plan

UUID = re.compile(r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def check_clear(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """burnin_clear names cards by UUID (indexes reorder between boots) or is "all"."""
    return config_refusals([(f"burnin_clear[{i}]", f"expected a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) "
                                                  f"or \"all\", got {v!r}")
                            for i, v in enumerate(data.get("burnin_clear") or [])
                            if v != "all" and not UUID.fullmatch(str(v))])


CHECKS = (check_clear,)
