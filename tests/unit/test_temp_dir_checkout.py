"""issue 61 round 10, CF1: config.py's TEMP_DIR '.' (issue 47) takes only where pyinfra runs from the
checkout (pyinfra_cli reads config.py from its current directory alone). A play importing rigup run
from elsewhere is refused before any operation, saying where to run it; from the checkout it runs
with TEMP_DIR '.'."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAY = "import rigup  # noqa: F401\nfrom pyinfra import config\n\nprint('TEMP_DIR in this run:', repr(config.TEMP_DIR))\n"


def _run(cwd: Path, play: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "-y", "@local", str(play)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_play_run_outside_the_checkout_is_refused(tmp_path):
    play = tmp_path / "play_tmp.py"
    play.write_text(PLAY)
    outside, inside = _run(tmp_path, play), _run(ROOT, play)
    said = [ln for ln in (outside.stdout + outside.stderr).splitlines() if "TEMP_DIR" in ln]
    print("from", tmp_path, "rc", outside.returncode, said)
    print("from the checkout rc", inside.returncode, [ln for ln in inside.stdout.splitlines() if "TEMP_DIR" in ln])
    assert outside.returncode != 0 and "TEMP_DIR in this run" not in outside.stdout
    assert any(f"rigup's plays run from the checkout (cd {ROOT})" in ln and "TEMP_DIR is None" in ln for ln in said)
    assert inside.returncode == 0 and "TEMP_DIR in this run: '.'" in inside.stdout


def test_an_inventory_importing_rigup_outside_the_checkout_is_refused(tmp_path):
    """rigup imported first by the inventory (rigup.config, as inventory/*.py): refused the same."""
    (tmp_path / "inv.py").write_text("import rigup.text  # noqa: F401\nhosts = ['@local']\n")
    run = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), str(tmp_path / "inv.py"), "debug-inventory"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = run.stdout + run.stderr
    print("rc", run.returncode, [ln for ln in out.splitlines() if "TEMP_DIR" in ln])
    assert run.returncode != 0 and "TEMP_DIR is None" in out
