"""roles/llama_cpp's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py).

    check_source    llama_cpp_ref that is no tag or commit, llama_cpp_source that is no git URL
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.config import GIT_URL
from rigup.refusal import Refusal, config_refusals
from rigup.text import carries_credentials

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")


def check_source(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """llama_cpp_ref that is not a tag or commit (letters, digits, ``._/-``, not starting with
    ``-`` or holding ``..``: git would read it as an option or a range), or llama_cpp_source that
    is not a git URL, or one that carries credentials."""
    found = []
    ref, source = str(data.get("llama_cpp_ref", "")), str(data.get("llama_cpp_source", ""))
    if not REF.fullmatch(ref) or ".." in ref:
        found.append(("llama_cpp_ref", f"expected a release tag (b8779) or a commit id, got {ref!r}"))
    if not data.get("llama_cpp_archive") and not GIT_URL.fullmatch(source):
        found.append(("llama_cpp_source", f"expected a git URL (https://, ssh://, file:// or user@host:path), "
                                          f"got {source!r}"))
    refusals = config_refusals(found)
    if carries_credentials(source):   # round 12 SEC2: https://user:TOKEN@ (or a token as the user)
        refusals.append(Refusal("llama_cpp_source carries credentials in its URL",
                                "they would stand in git's argv on the controller (ls-remote) and on the host "
                                "(clone, remote set-url: any local user reads them in ps), in the build script and "
                                "its log", "give the URL without them: a public URL, or ssh:// with the host's own "
                                "deploy key", "credentials"))
    return refusals


CHECKS = (check_source,)
