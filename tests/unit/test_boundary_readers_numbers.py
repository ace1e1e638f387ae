"""The host-text readers of the GPU plan, status and the configuration read numbers through the
boundary's one parser (issue 61, class 3): ``int()`` and ``float()`` take ``"١٢"``, ``"1_000"``,
``" 12 "``, ``"1e400"`` (inf) and raise on ``"²"``, so every call of either on a value that is not
a literal (or ``map(int, ...)``) in these modules is on the allow-list below, by function, with why
it reads no outside text as it came (a regex of ASCII digits before it, the catalogue's own YAML, a
value already typed); a function's count only goes down. Round 2 found A11 (``int(text, 16)`` took
``0x4_1``), rigup/gate.py's ``_int`` (systemd's ``NRestarts=١``) and G11 (``--data 5_0_0``) here.
tests/unit/test_outside_numbers.py holds ``str.isdigit()`` the same way, everywhere."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READERS = sorted((ROOT / "rigup" / "gpu").glob("*.py")) + [ROOT / p for p in (
    "rigup/fleet.py", "status.py", "rigup/gate.py", "rigup/config.py", "rigup/inventory.py")]

# (path, function) -> (calls allowed, why)
ALLOWED = {
    ("rigup/gpu/catalogue.py", "cuda_version"): (1, "a version version_tuple or the nvcc regex (ASCII digits) passed, "
                                                    "or the catalogue's own"),
    ("rigup/gpu/catalogue.py", "version_tuple"): (1, "each part fullmatched [0-9]{1,9} first"),
    ("rigup/gpu/catalogue.py", "driver_branches"): (1, "catalogue.yml's own list (rigup's file)"),
    ("rigup/gpu/driver.py", "branch_of"): (1, "fullmatched [0-9]{1,6} first"),
    ("rigup/gpu/driver.py", "driver_step"): (3, "nvidia_driver_branch, validated by its Form (int) at the run's start"),
    ("rigup/gpu/facts.py", "parse_listening_ports"): (1, "/proc/net/tcp's port fullmatched [0-9A-Fa-f]{1,4} first"),
    ("rigup/gpu/facts.py", "parse_cuda_toolkits"): (1, "map(int) of a version the nvcc regex took (ASCII digits)"),
    ("rigup/gpu/facts.py", "_hex"): (1, "fullmatched 0x[0-9A-Fa-f]{1,4} first"),
    ("rigup/gpu/plan.py", "_card_plan"): (1, "catalogue.yml's power range (rigup's file)"),
    ("rigup/gpu/xid.py", "catalogue"): (1, "rigup/gpu/xid.yml's codes (rigup's file)"),
    ("rigup/gpu/xid.py", "events"): (2, "the Xid line regex's code group: ASCII digits, bounded"),
    ("rigup/fleet.py", "parse_loads"): (1, "a figure numbers.number already read, within bounds"),
    ("rigup/gate.py", "measured_tps"): (1, "a JSON number already checked (int or float, positive)"),
    ("rigup/gate.py", "journal_exit"): (1, "the journal line regex's status=([0-9]+)"),
    ("rigup/config.py", "parse_form"): (2, "a form's bounds in a role's defaults.yml comment (rigup's file)"),
    ("rigup/inventory.py", "cli_value"): (1, "pyinfra_cli's parse_cli_arg, mirrored (tests/unit/test_inventory.py); "
                                             "rigup.config refuses what it misreads"),
}


def calls() -> dict[tuple[str, str], int]:
    """{(path, innermost function): calls of int()/float() on a non-literal, and map(int|float, ...)}."""
    found: dict[tuple[str, str], int] = {}

    def walk(node: ast.AST, rel: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                converts = child.func.id in ("int", "float") and child.args and not isinstance(child.args[0], ast.Constant)
                maps = child.func.id == "map" and child.args and isinstance(child.args[0], ast.Name) \
                    and child.args[0].id in ("int", "float")
                if converts or maps:
                    found[(rel, inner)] = found.get((rel, inner), 0) + 1
            walk(child, rel, inner)

    for path in READERS:
        rel = str(path.relative_to(ROOT))
        walk(ast.parse(path.read_text(), rel), rel, "<module>")
    return found


def test_the_readers_convert_numbers_only_where_a_reason_says_so():
    found = calls()
    print("\n" + "\n".join(f"{p} {f}: {n}" for (p, f), n in sorted(found.items())))
    over = {k: n for k, n in found.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert not over, (f"int()/float() of a value in a reader of host text or configuration (they take '١٢' and "
                      f"'1_000', raise on '²'): {over}; read it with rigup.boundary.numbers (number, whole)")


def test_the_allow_list_names_only_what_is_there():
    found = calls()
    assert not [k for k in ALLOWED if k not in found], "an allow-list entry whose calls are gone: remove it"
