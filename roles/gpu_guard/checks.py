"""roles/gpu_guard's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py).

    check_thresholds    gpu_guard_thresholds: a class not in the catalogue, an unknown key, a value
                        that is not a number 0..2000
    check_debounce      more bad samples to trip than samples kept
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.gpu.catalogue import class_problem
from rigup.refusal import Refusal, config_refusals

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

KEYS = ("draw_w", "temp_c")


def threshold_problems(overrides: dict) -> list[tuple[str, str]]:
    """(key path, why) for what is wrong with ``gpu_guard_thresholds``, [] when nothing."""
    found = []
    for cls, entry in (overrides or {}).items():
        where = f"gpu_guard_thresholds.{cls}"
        if class_problem(cls):
            found.append((where, class_problem(cls)))
        elif not isinstance(entry, dict):
            found.append((where, f"expected a map of {', '.join(KEYS)}, got {entry!r}"))
        else:
            for key, value in entry.items():
                if key not in KEYS:
                    found.append((f"{where}.{key}", f"unknown key; known keys: {', '.join(KEYS)}"))
                elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                            or not 0 < value <= 2000):
                    found.append((f"{where}.{key}", f"expected a number 0..2000 or null, got {value!r}"))
    return found


def check_debounce(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """gpu_guard_debounce_bad larger than gpu_guard_debounce_samples (it could never trip)."""
    bad, of = data.get("gpu_guard_debounce_bad", 1), data.get("gpu_guard_debounce_samples", 1)
    return config_refusals([("gpu_guard_debounce_bad", f"expected at most gpu_guard_debounce_samples ({of}), "
                                                      f"got {bad}")] if bad > of else [])


def check_thresholds(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """gpu_guard_thresholds: a class not in the catalogue, an unknown key, a value that is not a
    number 0..2000."""
    return config_refusals(threshold_problems(data.get("gpu_guard_thresholds")))


CHECKS = (check_thresholds, check_debounce)
