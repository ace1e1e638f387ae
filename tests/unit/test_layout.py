"""Where code lives (issue 64): ``rigup/`` is the roles' library, and what only a play needs lives
beside the plays. Read from the syntax tree of every module, never by importing it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def modules(*folders: str) -> list[Path]:
    return [p for d in folders for p in sorted((ROOT / d).rglob("*.py"))]


def imported(module: ast.Module) -> set[str]:
    """Every module name ``module`` imports, anywhere in it (a function's lazy import too)."""
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_module_of_rigup_imports_matplotlib():
    """The plays' charts (charts.py, beside bench.py and tune.py, which hand them to rigup/bench.py
    and rigup/tuning.py) are the only code that draws: the library never needs matplotlib."""
    found = sorted(str(p.relative_to(ROOT)) for p in modules("rigup")
                   if any(m.split(".")[0] == "matplotlib" for m in imported(tree(p))))
    assert found == []
    assert "matplotlib" in imported(tree(ROOT / "charts.py"))
