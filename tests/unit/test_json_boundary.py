"""JSON from outside is parsed by the boundary's one parser (rigup.boundary.core.loads: a key twice,
NaN, nesting past Python's stack refused as Unreadable, a ValueError) or, in a host program that
ships alone, by its own copy of that rule held equal by a test: a bare ``json.loads`` elsewhere let
RecursionError out of a fact's process(), an operation or a scrape (issue 61, round 1: E11's
marker, F04's /models, shards.py's status JSON, the health gate's completion, the smoke's result).
Held on the syntax tree of every module outside rigup/boundary/ and the host programs; each
exception is named with its reason, and the list only goes down."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "# rigup: runs on hosts"
ALLOWED = {
    "rigup/bench.py": "smoke_remedy catches RecursionError beside ValueError; its other JSON is rigup's own",
    "rigup/inventory.py": "the operator's own --data value on their command line, as pyinfra's CLI reads it",
}


def calls(path: Path) -> list[int]:
    """The lines of ``json.loads(...)`` and ``json.load(...)`` in ``path``."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in ("loads", "load")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"]


def test_outside_json_is_parsed_by_the_boundary():
    found = {}
    for path in sorted([*(ROOT / "rigup").rglob("*.py"), *(ROOT / "roles").rglob("*.py"), *ROOT.glob("*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("rigup/boundary/") or MARK in "".join(path.read_text().splitlines(keepends=True)[:3]):
            continue
        lines = calls(path)
        if lines:
            found[rel] = lines
    unexplained = {p: lines for p, lines in found.items() if p not in ALLOWED}
    assert not unexplained, f"json.load(s) outside the boundary (use rigup.boundary.core.loads): {unexplained}"
    assert set(ALLOWED) <= set(found), f"allowed but gone (drop them from ALLOWED): {set(ALLOWED) - set(found)}"
