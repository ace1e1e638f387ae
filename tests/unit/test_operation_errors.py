"""An OperationError's text reaches the terminal as pyinfra prints it, unescaped: one that carries a
host's text (a bus id from sysfs, nvidia-smi's answer, a version) goes through rigup.text.shown (round 5
A4: a bus id holding an OSC sequence reached roles/nvidia_driver's ``loaded`` error). Read from the
syntax tree: each ``raise OperationError(X)`` in rigup/ and roles/ with X neither a plain string nor a
call of ``shown``; the files below are those not yet moved (their count may only fall)."""

from __future__ import annotations

import ast
from pathlib import Path

from rigup.gpu.facts import parse_pci

ROOT = Path(__file__).resolve().parents[2]
# path -> raises whose text is not through shown (none carries a host's text unchecked; moved as they are touched)
ALLOWED = {
    "rigup/gate.py": 3, "rigup/progress.py": 3, "rigup/tuning.py": 2, "roles/balancer/__init__.py": 1,
    "roles/cmpunlocker/__init__.py": 1, "roles/gpu_power/power.py": 1, "roles/llama_cpp/build.py": 1,
    "roles/llama_server/__init__.py": 1, "roles/model_fetch/__init__.py": 3,
}


def unshown() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in [*(ROOT / "rigup").rglob("*.py"), *(ROOT / "roles").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", getattr(node.exc.func, "attr", None)) == "OperationError"):
                continue
            arg = node.exc.args[0] if node.exc.args else None
            if isinstance(arg, ast.Constant) or (isinstance(arg, ast.Call) and getattr(arg.func, "id", None) == "shown"):
                continue
            rel = str(path.relative_to(ROOT))
            found[rel] = found.get(rel, 0) + 1
    return found


def test_an_operation_errors_text_goes_through_shown():
    found = unshown()
    over = {p: n for p, n in found.items() if n > ALLOWED.get(p, 0)}
    print(f"raises of OperationError not through shown: {sum(found.values())} in {len(found)} files (allowed: {ALLOWED})")
    assert not over, f"OperationError texts not through rigup.text.shown (pyinfra prints them unescaped): {over}"
    assert all(found.get(p, 0) == n for p, n in ALLOWED.items()), \
        f"fewer raises than ALLOWED says (lower its count): { {p: found.get(p, 0) for p in ALLOWED} }"


def test_sysfs_pci_lines_that_are_not_bus_and_device_ids_are_skipped():
    """Round 5 A4: a sysfs name with an OSC sequence and a device id of CSI were kept as cards."""
    got = parse_pci(["0000:07:00.0\x1b]0;owned\x07 0x20b2 0x030200", "0000:08:00.0 0x\x1b[2J 0x030200",
                     "../../etc 0x20b2 0x030200", "0000:08:00.0 0x20b2;rm 0x030200", "0000:09:00.0 0x20B2 0x030200"])
    print("read:", got)
    assert got == [{"bus_id": "0000:09:00.0", "pci_device_id": "10de:20b2"}]
