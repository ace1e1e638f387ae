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
    "rigup/config.py": "cli_value: the operator's own --data value on their command line, as pyinfra's CLI reads it",
}


def calls(path: Path) -> list[int]:
    """The lines of ``json.loads(...)`` and ``json.load(...)`` in ``path``."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in ("loads", "load")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"]


def test_outside_json_is_parsed_by_the_boundary():
    found = {}
    for path in sorted([p for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("rigup/boundary/") or MARK in "".join(path.read_text().splitlines(keepends=True)[:3]):
            continue
        lines = calls(path)
        if lines:
            found[rel] = lines
    unexplained = {p: lines for p, lines in found.items() if p not in ALLOWED}
    assert not unexplained, f"json.load(s) outside the boundary (use rigup.boundary.core.loads): {unexplained}"
    assert set(ALLOWED) <= set(found), f"allowed but gone (drop them from ALLOWED): {set(ALLOWED) - set(found)}"


# A host program parses with its own copy of the rule (a try that catches RecursionError, or a loads()
# that turns it into ValueError); each bare json.load(s) of one is named here with why it stays, and the
# list only goes down (round 4 W1: rigup-watchdog's reader of an HTTP error body caught ValueError alone,
# so a server answering 3000 '[' was "the check failed", never a bad check, never restarted).
HOST_ALLOWED = {
    ("roles/burnin/shipped/acceptance.py", "dcgm"): "dcgmi's JSON (NVIDIA's tool, run as root)",
    ("roles/gpu_guard/shipped/guard.py", "parse_journal"): "journalctl -o json: journald's own flat objects",
    ("roles/llama_cpp/shipped/smoke.py", "main"): "its spec from the role (argv or root's file)",
    ("roles/metrics/shipped/relay.py", "main"): "its configuration, root's file written by roles/metrics",
    ("roles/model_fetch/shipped/fetcher.py", "probe"): "the role's spec in argv (base64)",
    ("roles/model_fetch/shipped/fetcher.py", "switch"): "the role's spec in argv (base64)",
    ("roles/model_fetch/shipped/fetcher.py", "prune"): "the role's spec in argv (base64)",
    ("roles/model_fetch/shipped/fetcher.py", "as_owner"): "its own child's answer on a pipe (json.dump of a value read "
                                                  "within the stack)",
}
CATCHES = {"RecursionError", "Exception", "BaseException", "RuntimeError"}


def host_bare_calls() -> set[tuple[str, str]]:
    """(file, function) of each json.load(s) in a host program outside a try that catches RecursionError."""
    found = set()
    for path in sorted(p for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")):
        text = path.read_text()
        if MARK not in "".join(text.splitlines(keepends=True)[:3]):
            continue
        tree = ast.parse(text)
        parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for line in calls(path):
            node = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line
                        and isinstance(n.func, ast.Attribute) and n.func.attr in ("loads", "load"))
            caught, function, child, up = False, "<module>", node, parent.get(node)
            while up is not None:
                if isinstance(up, ast.Try) and child in up.body:
                    caught = caught or any(h.type is None or CATCHES & {getattr(t, "id", getattr(t, "attr", ""))
                                           for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])}
                                           for h in up.handlers)
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)) and function == "<module>":
                    function = up.name
                child, up = up, parent.get(up)
            if not caught:
                found.add((str(path.relative_to(ROOT)), function))
    return found


def test_a_host_programs_json_is_parsed_within_the_stack():
    found = host_bare_calls()
    print(f"{len(found)} functions of host programs parse JSON bare, each named: {sorted(found)}")
    assert not found - set(HOST_ALLOWED), ("a host program parses JSON with no RecursionError caught (catch it beside "
                                           f"ValueError, or use its loads copy): {sorted(found - set(HOST_ALLOWED))}")
    assert not set(HOST_ALLOWED) - found, f"allowed but gone (drop them): {sorted(set(HOST_ALLOWED) - found)}"
