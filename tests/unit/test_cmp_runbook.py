"""docs/cmp170hx.md stays true: its YAML recipes are rigup's (every key declared, every value of
its form), preflight on an unlocked 6-card CMP 170HX rig refuses only what their placeholders
make it refuse, and every `pyinfra inventory/mine.py FILE` it runs names a play of the checkout."""

import re
from pathlib import Path

import yaml

from rigup.config import ROOT, problems
from tests.unit.hosts import data, host, refusals

DOC = (ROOT / "docs" / "cmp170hx.md").read_text()
BLOCKS = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC, re.S)]
UNLOCK, FORK, BASE = BLOCKS


def unlocked_rig():
    plan, facts = host("cmp170hx")
    for card in plan["cards"]:
        card.update(locked=False, vram_mib=65536)
    plan["needs_unlock"] = False
    plan["vram_mib"] = {"total": 6 * 65536, "per_card": [65536] * 6}
    return plan, facts


def test_its_recipes_are_declared_and_of_their_form():
    assert len(BLOCKS) == 3
    for block in BLOCKS:
        assert problems(block) == [], block


def test_the_fork_is_refused_only_for_its_placeholder_commit():
    plan, facts = unlocked_rig()
    values = data(**UNLOCK, **FORK, vllm_pip_version=None)
    nothing = {"git": True, "fetched": True, "commits": [], "error": None}   # no commit starts with 0000000
    found = [r.line("rig-01") for r in refusals(plan, {**facts, "reads": {"VllmCommit": nothing}}, values)]
    assert len(found) == 1 and "vllm_git_commit: no commit of https://github.com/hyd998877/" in found[0], found
    print(found[0])


def test_the_base_plus_patches_is_refused_only_for_its_patch_files():
    plan, facts = unlocked_rig()
    found = [r.line("rig-01") for r in refusals(plan, facts, data(**UNLOCK, **BASE, vllm_pip_version=None))]
    assert len(found) == 1 and "vllm_patch_manifest: cannot read /home/you/rigup-site/patches/dsv4/SHA256SUMS" in found[0]


def test_every_play_it_runs_is_in_the_checkout():
    plays = set(re.findall(r"pyinfra (?:-y )?inventory/mine\.py ([\w-]+\.py)", DOC))
    assert plays == {"deploy.py", "preflight.py", "status.py"}
    assert all((ROOT / p).is_file() for p in plays)
    assert (ROOT / "tests/roles/test_cmpunlocker.py").read_text().count("def test_the_cmp_runbook_from_stock") == 1
