"""The boundary's table (rigup/boundary, each module's CROSSINGS; docs/boundary.md) is held to the
code in both directions: every reader and user it names is defined where it says; every public
function of a boundary module is a row's reader or writer, or one of the module's GENERIC helpers;
and every module outside the boundary that imports it is a row's user, so a new reader cannot be
added without its row."""

import ast
import re
from pathlib import Path

import rigup.boundary as boundary

ROOT = Path(__file__).resolve().parents[2]


def defined(path: str, name: str) -> bool:
    text = (ROOT / path).read_text()
    return re.search(rf"^\s*(async )?(def|class) {re.escape(name)}\b|^{re.escape(name)} = ", text, re.M) is not None


def test_every_name_in_the_table_is_defined_where_it_says():
    rows = boundary.crossings()
    refs = [ref for c in rows for ref in (c.reader, *c.users.split(", "))]
    missing = [ref for ref in refs if not defined(*ref.split(":"))]
    print(f"{len(rows)} crossings, {len(refs)} names")
    assert rows and not missing, missing


def test_every_public_function_of_the_boundary_is_a_row_or_generic():
    import importlib

    readers = {c.reader for c in boundary.crossings()}
    loose = []
    for name in boundary.MODULES:
        path = ROOT / "rigup" / "boundary" / f"{name}.py"
        if not path.exists():
            continue
        module = importlib.import_module(f"rigup.boundary.{name}")
        generic = set(getattr(module, "GENERIC", ()))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.name not in generic:
                if f"rigup/boundary/{name}.py:{node.name}" not in readers:
                    loose.append(f"rigup/boundary/{name}.py:{node.name}")
    assert not loose, f"a reader or writer without its row in CROSSINGS (or in the module's GENERIC): {loose}"


def test_every_module_that_imports_the_boundary_is_a_user_in_the_table():
    users = {ref.split(":")[0] for c in boundary.crossings() for ref in c.users.split(", ")}
    sources = [p for d in ("roles", "rigup", "plays", "shipped") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    importers = {str(p.relative_to(ROOT)) for p in sources
                 if "rigup/boundary/" not in str(p) and re.search(r"rigup\.boundary|from rigup\.boundary", p.read_text())}
    print(f"{len(importers)} modules import the boundary")
    assert importers - users == set(), f"modules reading through the boundary without a row: {sorted(importers - users)}"


def test_the_docs_page_is_the_table():
    page = (ROOT / "docs" / "boundary.md").read_text()
    assert boundary.table() in page, "docs/boundary.md is out of date: make docs"
