"""rigup/probe.py's rule, read from the source: every operation a role or rigup calls is recorded
(declared with rigup.probe.operation, or pyinfra's called through rigup.probe), so that a converged
role registers none and a changed one registers them in the order they were made. A pyinfra
operation used directly in roles/ or rigup/ is only its ``_inner`` body, inside another operation.
On the lab: tests/roles/test_drift.py (drift on each role found and fixed), test_deploy.py."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("roles", "rigup") for p in (ROOT / d).rglob("*.py") if p.name != "probe.py")


def test_no_role_or_rigup_module_declares_or_calls_a_pyinfra_operation_unrecorded():
    bad = []
    for path in SOURCES:
        text = path.read_text()
        name = path.relative_to(ROOT)
        if re.search(r"^from pyinfra\.api import [^\n]*\boperation\b", text, re.M):
            bad.append(f"{name}: imports pyinfra.api.operation (use rigup.probe.operation)")
        for m in re.finditer(r"^from pyinfra\.operations import ([^\n]+)$", text, re.M):
            for module in (x.strip() for x in m.group(1).split(",")):
                for call in re.finditer(rf"(?<!`)\b{module}\.([a-z_]+)(\.[a-z_]+)?\(", text):   # not in ``docs``
                    if call.group(2) != "._inner":
                        bad.append(f"{name}: {module}.{call.group(1)}(...) is not recorded (use rigup.probe.{module})")
    assert not bad, "\n".join(bad)


def test_planned_answers_the_check_then_the_registered_operation():
    from rigup.probe import Planned, _holds

    p = Planned()
    assert p.did_change() is False
    p.change = True
    assert p.did_change() is True
    p.real = type("Meta", (), {"did_change": lambda self: False})()
    assert p.did_change() is False                      # the operation's own answer once registered
    assert _holds(None) and _holds([lambda: True, lambda: True]) and not _holds(lambda: False)
