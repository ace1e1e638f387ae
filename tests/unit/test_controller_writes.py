"""What rigup makes on the controller goes through rigup/boundary/owned.py (issue 61, the class of
round 3's K11: controller_token made the key's directory and file before the path was checked,
so a link of another user's at ~/.config/rigup had the key made in their directory). This test
reads the syntax tree of the controller's code (rigup/, roles/, the plays; not the host programs,
which carry their own O_EXCL|O_NOFOLLOW writers, tests/unit/test_host_programs.py) and fails on any
file or directory made outside owned.py (open for writing, write_text, mkdir, makedirs, os.open
with O_CREAT, touch, symlink_to) but in the functions named below, each with why."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKERS = ("write_text", "write_bytes", "mkdir", "makedirs", "touch", "symlink_to")
ALLOWED = {
    ("rigup/secrets.py", "controller_token"): "the key O_CREAT|O_EXCL|O_NOFOLLOW, in a directory owned.directory "
                                              "checked (and made, make=True) first",
    ("shards.py", "run_shard"): "a shard's log in the run's own TemporaryDirectory (mkdtemp: 0700, a random name)",
}


def _mode(call: ast.Call, at: int) -> object:
    if len(call.args) > at and isinstance(call.args[at], ast.Constant):
        return call.args[at].value
    return next((k.value.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)), None)


def makers() -> set[tuple[str, str]]:
    files = [p for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    found = set()
    for path in files:
        text, rel = path.read_text(), str(path.relative_to(ROOT))
        if "# rigup: runs on hosts" in text[:400] or rel == "rigup/boundary/owned.py":
            continue
        for fn in (n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                f, mode = call.func, None
                if isinstance(f, ast.Name) and f.id == "open":
                    mode = _mode(call, 1)
                elif isinstance(f, ast.Attribute) and f.attr == "open" and not (isinstance(f.value, ast.Name)
                                                                                and f.value.id == "os"):
                    mode = _mode(call, 0)
                made = (isinstance(mode, str) and bool(set(mode) & set("wax+"))) or \
                    (isinstance(f, ast.Attribute) and f.attr in MAKERS) or \
                    (isinstance(f, ast.Attribute) and f.attr == "open" and "O_CREAT" in ast.unparse(call))
                if made:
                    found.add((rel, fn.name))
    return found


def test_nothing_is_made_on_the_controller_outside_owned_but_the_named_ones():
    found = makers()
    print(f"made outside rigup/boundary/owned.py: {sorted(found)}; off the list now: {sorted(set(ALLOWED) - found)}")
    assert found <= set(ALLOWED), ("a file or directory made on the controller outside rigup/boundary/owned.py: use "
                                   "owned.write or owned.directory(make=True), or name it in ALLOWED with why: "
                                   f"{sorted(found - set(ALLOWED))}")
