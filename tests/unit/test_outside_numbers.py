"""Numbers from outside go through the boundary's one parser (issue 61, class 3; round 2's C1, C2,
J6, H8 were each a ``str.isdigit()`` then ``int()``): ``isdigit()``, ``isdecimal()`` and
``isnumeric()`` take ``²`` (which ``int()`` then refuses with a ValueError: a crash) and ``٣``
(which ``int()`` reads as 3). Read from the syntax tree: every such call outside rigup/boundary/ is
on the allow-list below with its reason, and a file's count there only goes down."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALLS = ("isdigit", "isdecimal", "isnumeric")

# path -> (calls allowed, why)
ALLOWED = {
    "rigup/gate.py": (1, "exit_.name: whether systemd's exit status has a name to show beside it; a display choice, "
                         "the number itself is read by numbers.whole"),
    "roles/gpu_power/policy.py": (1, "an override's key that looks like a GPU index is refused (the refusal, not a number read)"),
    "roles/gpu_power/checks.py": (1, "the same refusal in preflight"),
    "roles/balancer/shipped/drain.py": (1, "a host program's own ASCII-digits rule (isascii() and isdigit()), held by its tests"),
}


def uses() -> dict[str, int]:
    """{path: calls of CALLS} in rigup/, roles/ and the plays, outside rigup/boundary/."""
    sources = [p for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    found: dict[str, int] = {}
    for path in sources:
        rel = str(path.relative_to(ROOT))
        if rel.startswith("rigup/boundary/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS:
                found[rel] = found.get(rel, 0) + 1
    return found


def test_no_isdigit_on_outside_text_outside_the_boundary():
    found = uses()
    print("\n" + "\n".join(f"{p}: {n}" for p, n in sorted(found.items())))
    over = {p: n for p, n in found.items() if n > ALLOWED.get(p, (0, ""))[0]}
    assert not over, (f"str.isdigit()/isdecimal()/isnumeric() outside rigup/boundary/ (they take '²' and '٣'): "
                      f"{over}; read numbers with rigup.boundary.numbers (number, whole), or a host program's copy")
