"""rigup/probe.py's rule, read from the source: every operation a role or rigup calls is recorded
(declared with rigup.probe.operation, or pyinfra's called through rigup.probe), so that a converged
role registers none and a changed one registers them in the order they were made. A pyinfra
operation used directly in roles/ or rigup/ is only its ``_inner`` body, inside another operation.
On the lab: tests/roles/test_drift.py (drift on each role found and fixed), test_deploy.py."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("roles", "rigup", "plays", "shipped") for p in (ROOT / d).rglob("*.py") if p.name != "probe.py")


def bypasses(text: str, name: str) -> list[str]:
    """The ways source ``text`` declares or calls a pyinfra operation past rigup.probe, read from
    its syntax tree: any import of pyinfra.api's ``operation`` or of pyinfra.api itself, any import
    from a module of pyinfra.operations, and calls ``MODULE.op(...)`` of an operations module
    imported by name (``MODULE.op._inner(...)``, the body inside another operation, and
    pyinfra.operations.util, helpers that are no operation, are allowed)."""
    bad, modules = [], set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module == "pyinfra" and names & {"api", "operations"} or node.module.startswith("pyinfra.api.operation") \
                    or node.module == "pyinfra.api" and "operation" in names or node.module.startswith("pyinfra.operations.") and node.module != "pyinfra.operations.util":
                bad.append(f"{name}:{node.lineno}: from {node.module} import {', '.join(sorted(names))} "
                           "(use rigup.probe's operation, or add a wrapper in rigup.probe)")
            elif node.module == "pyinfra.operations":
                modules |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in ("pyinfra.api", "pyinfra.api.operation") or a.name.startswith("pyinfra.operations"):
                    bad.append(f"{name}:{node.lineno}: import {a.name} (use rigup.probe, or add a wrapper there)")
    for node in ast.walk(ast.parse(text)):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
            bad.append(f"{name}:{node.lineno}: {f.value.id}.{f.attr}(...) is not recorded "
                       "(call it through rigup.probe; add a wrapper there for another)")
    return bad


def test_no_role_or_rigup_module_declares_or_calls_a_pyinfra_operation_unrecorded():
    bad = [b for path in SOURCES for b in bypasses(path.read_text(), path.relative_to(ROOT))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("source", [
    "from pyinfra.api import operation", "from pyinfra.api import deploy, operation as op",
    "from pyinfra.api import (\n    deploy,\n    operation,\n)", "from pyinfra.api.operation import operation",
    "from pyinfra import api", "import pyinfra.api", "from pyinfra.operations.server import shell",
    "import pyinfra.operations.server as server", "from pyinfra.operations import server\nserver.shell(commands=[])",
    "from pyinfra.operations import server as s\ns.shell(commands=[])",
])
def test_every_spelling_of_a_bypass_is_found(source):
    found = bypasses(source, "x.py")
    print(found)
    assert found


def test_an_operations_body_inside_another_and_rigups_own_pass():
    assert bypasses("from pyinfra.operations import files\nyield from files.put._inner(src='a', dest='b')\n"
                    "from rigup.probe import operation, systemd\n", "x.py") == []


def test_reading_goes_above_the_operation():
    """Below @operation() the read would be named only when the recorded call runs, after the
    role's apply: it is refused where the module is loaded, naming the function."""
    from rigup.probe import operation
    from rigup.state import reading
    from rigup.gpu.facts import NvidiaGpus

    @reading(NvidiaGpus)
    @operation()
    def above():
        yield "true"

    with pytest.raises(TypeError, match=r"below\b.*: @reading goes above @operation\(\)"):
        @operation()
        @reading(NvidiaGpus)
        def below():
            yield "true"


def test_planned_answers_the_check_then_the_registered_operation():
    from rigup.probe import Planned, _holds

    p = Planned()
    assert p.did_change() is False
    p.change = True
    assert p.did_change() is True
    p.real = type("Meta", (), {"did_change": lambda self: False})()
    assert p.did_change() is False                      # the operation's own answer once registered
    assert _holds(None) and _holds([lambda: True, lambda: True]) and not _holds(lambda: False)
