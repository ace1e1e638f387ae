"""Outside JSON is read through rigup/boundary/ (issue 61): a record another party writes (a build's
smoke result, a journal, a marker, a stamp) has one typed reader there, and a second reader beside
it believes what the first refuses (round 3, SM3: roles/llama_server/facts.py parsed
rigup-smoke.json itself and applied flags from a file the boundary refused). This test reads the
syntax tree of the controller's code (rigup/, roles/, the plays; not rigup/boundary/ and not the
host programs, which carry their own standard-library readers) and fails on any ``json.loads`` or
``json.load`` outside the functions below, each named with why it stays: the list only shrinks."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, function) -> why it parses JSON itself; move one to the boundary and take it off the list
ALLOWED = {
    ("rigup/config.py", "cli_value"): "the operator's own --data value on the command line, as pyinfra reads it",
    ("roles/model_fetch/hub.py", "_once"): "the hub's answers rigup kept itself, read through owned.read; checked "
                                          "by hub.py's checked_files afterwards",
    ("rigup/gate.py", "gate"): "a completion's answer: only whether it holds text is used, any other shape is a "
                               "failed gate (ValueError, KeyError, IndexError, TypeError caught)",
    # not yet through the boundary: second readers left of round 3 (named so that the list only shrinks)
    ("plays/bench.py", "smoke_remedy"): "rigup-smoke.json, item by item (trap ids, bare flags): decides only "
                                        "llama-bench's --repack 0; to go through results.smoke",
    ("plays/bench.py", "llama_bench_row"): "llama-bench's JSON row; to go through results.llama_bench",
    ("plays/bench.py", "Throughput.process"): "throughput.py's line; to go through results.throughput",
    ("plays/bench.py", "Serving.process"): "a model's completion marker; to go through results.marker",
    ("roles/cmpunlocker/facts.py", "parse_unlock_state"): "the unlock stamp rigup writes as root; a reader to add",
    ("roles/llama_cpp/build.py", "_smoked"): "smoke.py's result on its stdout (the same record as "
                                             "rigup-smoke.json); to go through results.smoke",
    ("roles/balancer/facts.py", "BalancerState.process"): "the balancer's backends files rigup writes as root; "
                                                          "a reader to add",
}


def parsers() -> set[tuple[str, str]]:
    """(file, Class.function or function) of every json.loads/json.load call outside the boundary
    and the host programs."""
    files = [p for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    found = set()
    for path in files:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        if rel.startswith("rigup/boundary/") or "# rigup: runs on hosts" in text[:400]:
            continue

        def visit(node: ast.AST, scope: list[str]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, scope + [child.name])
                    continue
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                        child.func.attr in ("loads", "load") and isinstance(child.func.value, ast.Name) and \
                        child.func.value.id == "json":
                    found.add((rel, ".".join(s for s in scope) or "<module>"))
                visit(child, scope)
        visit(ast.parse(text), [])
    return found


def short(found: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """A method's name is Class.method; a function nested in another, its outer function's."""
    out = set()
    for rel, scope in found:
        parts = scope.split(".")
        key = (rel, scope)
        if key not in ALLOWED and len(parts) > 1:
            key = (rel, parts[0]) if (rel, parts[0]) in ALLOWED else (rel, ".".join(parts[:2]))
        out.add(key)
    return out


def test_no_json_parser_outside_the_boundary_but_the_named_ones():
    found = short(parsers())
    new = sorted(found - set(ALLOWED))
    gone = sorted(set(ALLOWED) - found)
    print(f"{len(found)} functions parse JSON outside rigup/boundary/; off the list now (remove them): {gone}")
    assert not new, ("JSON parsed outside rigup/boundary/: read it through the record's reader there "
                     f"(rigup.boundary.results, burnin, hosttext...), or name it in ALLOWED with why: {new}")
