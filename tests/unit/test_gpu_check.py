"""tests/gpu/check.py runs on a GPU machine that has no pyinfra: run it here with pyinfra made
unimportable, so an import of a pyinfra-only module from a pure one cannot break it unseen."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("import runpy, sys; sys.modules['pyinfra'] = None; sys.argv = ['check.py', 'plan']; "
           "runpy.run_path('tests/gpu/check.py', run_name='__main__')")


def test_check_py_plans_without_pyinfra():
    result = subprocess.run([sys.executable, "-c", BLOCKED], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "cards:" in result.stdout and "cmake -DCMAKE_BUILD_TYPE=Release" in result.stdout
    assert "ExecStart=" in result.stdout and "--parallel 8" in result.stdout


def test_the_compare_goals_are_judged_by_each_servers_label():
    check = runpy.run_path(str(ROOT / "tests/gpu/check.py"), run_name="check")
    doc = json.loads((ROOT / "tests/gpu/results/2026-12-02-h200-tune-morning.json").read_text())
    goals = check["compare_goals"](doc)
    assert goals["tuned >= 1.5x the reports' recipe at 16"] == (1.53, True)
    assert goals["tuned >= 2.5x the reports' recipe at 32"] == (2.12, False)
    assert goals["rigup's defaults >= 0.8x tuned at 16"] == (0.93, True)
    # the afternoon's run, with the prompt cache off in rigup's sized defaults: every goal met
    goals = check["compare_goals"](json.loads((ROOT / "tests/gpu/results/2026-12-02-h200-tune.json").read_text()))
    assert goals["tuned >= 2.5x the reports' recipe at 32"] == (3.37, True)
    assert goals["rigup's defaults >= 0.8x tuned at 16"] == (0.94, True) and all(met for _, met in goals.values())
