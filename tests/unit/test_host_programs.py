"""The programs that run on hosts (docs/layout.md, "Programs that run on hosts"): each marked, each
importing only the standard library and the other host programs (as the package module on the
controller, or as the name it is installed under next to it on a host), and the marked ones are
the table's. What a plain python3 on a bare host or the GPU machine can run."""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "# rigup: runs on hosts"
# imports beyond the standard library, and why
ALLOWED = {"rigup/gpu/xid.py": {"yaml"},            # catalogue(): on the controller only (the guard gets the codes in its config)
           "roles/vllm/ray_wait.py": {"ray._raylet"}}  # runs in Ray's own venv, with Ray's client of its GCS


def marked() -> set[str]:
    return {str(p.relative_to(ROOT)) for d in ("rigup", "roles") for p in (ROOT / d).rglob("*.py")
            if MARK in "".join(p.read_text().splitlines(keepends=True)[:3])}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names}   # a module, or a name of one
    return found


def test_the_marked_programs_are_the_layouts_table():
    table = (ROOT / "docs/layout.md").read_text().split("## Programs that run on hosts", 1)[1].split("\n## ", 1)[0]
    listed = {p for row in table.splitlines() if row.startswith("| `") for p in re.findall(r"`([\w/]+\.py)`", row.split(" | ")[0])}
    assert marked() == listed and len(listed) >= 12, (marked() ^ listed)


def test_each_host_program_imports_the_standard_library_and_the_other_host_programs_only():
    programs = marked()
    # each program by its package module and by the name it has next to another on a host (rigup_NAME)
    own = {p[:-3].replace("/", ".").removesuffix(".__init__") for p in programs}
    own |= {f"rigup_{Path(p).stem}" for p in programs} | {"rigup_contract", "rigup_llama_contract", "rigup_xid"}
    wrong = {}
    for p in sorted(programs):
        outside = {m for m in imports(ROOT / p) if m.split(".")[0] not in sys.stdlib_module_names
                   and m not in own and m.rsplit(".", 1)[0] not in own
                   and not any(m == a or m.startswith(a + ".") for a in ALLOWED.get(p, ()))}
        if outside:
            wrong[p] = sorted(outside)
    assert wrong == {}, wrong
