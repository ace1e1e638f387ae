"""roles/llama_cpp's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_source    llama_cpp_ref that is no tag or commit, llama_cpp_source that is no git URL
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.config import GIT_URL
from rigup.refusal import Refusal, config_refusals

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")


def check_source(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """llama_cpp_ref that is not a tag or commit (letters, digits, ``._/-``, not starting with
    ``-`` or holding ``..``: git would read it as an option or a range), or llama_cpp_source that
    is not a git URL."""
    found = []
    ref, source = str(data.get("llama_cpp_ref", "")), str(data.get("llama_cpp_source", ""))
    if not REF.fullmatch(ref) or ".." in ref:
        found.append(("llama_cpp_ref", f"expected a release tag (b8779) or a commit id, got {ref!r}"))
    if not data.get("llama_cpp_archive") and not GIT_URL.fullmatch(source):
        found.append(("llama_cpp_source", f"expected a git URL (https://, ssh://, file:// or user@host:path), "
                                          f"got {source!r}"))
    return config_refusals(found)


CHECKS = (check_source,)
