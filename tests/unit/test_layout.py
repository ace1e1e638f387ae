"""Where code lives (issue 64): ``rigup/`` is the roles' library, and what only a play needs lives
in ``plays/``. Read from the syntax tree of every module, never by importing it."""

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


def test_no_module_of_rigup_or_roles_imports_matplotlib():
    """The plays' charts (plays/charts.py: bench.py and tune.py hand them to plays/bench.py and
    plays/tuning.py) are the only code that draws: the library and the roles never need matplotlib."""
    found = sorted(str(p.relative_to(ROOT)) for p in modules("rigup", "roles", "shipped")
                   if any(m.split(".")[0] == "matplotlib" for m in imported(tree(p))))
    assert found == []
    assert "matplotlib" in imported(tree(ROOT / "plays/charts.py"))


def test_the_library_and_the_roles_never_import_the_plays_engines():
    """plays/ holds code only a play needs (plays/__init__.py): rigup/ and roles/ never import from it."""
    found = sorted(str(p.relative_to(ROOT)) for p in modules("rigup", "roles", "shipped")
                   if any(m.split(".")[0] == "plays" for m in imported(tree(p))))
    assert found == []


def test_the_library_docstring_names_all_of_it():
    """rigup/__init__.py's docstring names each module and package of the library (``name``)."""
    doc = ast.get_docstring(tree(ROOT / "rigup" / "__init__.py"))
    parts = {p.stem for p in (ROOT / "rigup").glob("*.py") if p.stem != "__init__"} \
        | {p.parent.name for p in (ROOT / "rigup").glob("*/__init__.py")}
    assert len(parts) > 30 and sorted(n for n in parts if f"``{n}``" not in doc) == []


# -- module-level registries ---------------------------------------------------------------------

# Methods that change their object in place (containers, and threading.Event's set).
MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend", "insert", "remove",
            "discard", "appendleft", "extendleft", "sort", "reverse", "move_to_end", "set"}
CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "WeakKeyDictionary",
              "WeakValueDictionary", "WeakSet", "bytearray"}


def top_level(module: ast.Module) -> dict[str, ast.expr | None]:
    """Every name the module binds outside its functions and classes (in an ``if`` or ``try`` at the
    top too): its value where it is a plain assignment, else None."""
    found: dict[str, ast.expr | None] = {}

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                            found[name.id] = node.value if target is name else None
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    walk([n for n in inner if isinstance(n, ast.stmt)] +
                         [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])
    walk(module.body)
    return found


def container(value: ast.expr | None) -> bool:
    """A dict, list or set, by literal, comprehension or call (defaultdict, WeakKeyDictionary, ...)."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    func = value.func if isinstance(value, ast.Call) else None
    return (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "") \
        in CONTAINERS


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def shallow(fn: ast.AST) -> list[ast.AST]:
    """The nodes of ``fn``'s own body: not those of a function (or lambda) defined in it, though
    that function itself is listed."""
    out, todo = [], list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))
    return out


def changed_in_functions(module: ast.Module) -> set[str]:
    """The names a function (or lambda) of the module changes without binding them itself: in place
    (``X[k] = v``, ``del X[k]``, ``X[k] += 1``, ``X.a = v``, ``X.append(...)`` and the other
    MUTATORS), or rebound under ``global X``."""
    found: set[str] = set()

    def base(target: ast.expr) -> str | None:
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        return target.id if isinstance(target, ast.Name) else None

    def visit(fn, shadowed: set[str]) -> None:
        nodes = shallow(fn)
        declared = {n for s in nodes if isinstance(s, ast.Global) for n in s.names}
        args = fn.args
        bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        bound |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        shadowed = (shadowed | bound) - declared
        found.update(declared)   # a name a function declares global is one it rebinds
        for node in nodes:
            if isinstance(node, FUNCTIONS):
                visit(node, shadowed)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
                if node.func.value.id not in shadowed:
                    found.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                    if isinstance(target, (ast.Subscript, ast.Attribute)) and base(target) not in shadowed:
                        found.add(base(target))

    for node in shallow(module):
        if isinstance(node, FUNCTIONS):
            visit(node, set())
    return {n for n in found if n}


def registries(module: ast.Module) -> set[str]:
    """The module's registries: a module-level name a function changes (:func:`changed_in_functions`),
    and a module-level container whose name is not ALL_CAPS (run state by its name, whoever
    changes it). An ALL_CAPS table no function changes is a constant; dunders (``__all__``) are not
    state."""
    changed = changed_in_functions(module)
    return {n for n, value in top_level(module).items() if not n.startswith("__")
            and (n in changed or container(value) and not n.isupper())}


# Today's registries, each named with who fills it and who reads it (issue 64: they move into one
# Run object, or go). A new one fails here; one that is gone fails until its row is removed: the
# count only goes down.
REGISTRIES = {
    "rigup/run.py:_RUNS": "pyinfra State -> its Run (rigup.run.of): every field of a run's state, each named "
                          "with who fills and reads it; its at_end hooks print at exit",
    "rigup/text.py:_STYLED": "the texts click.style wrote in this process (styled fills, the newest 4096); "
                             "terminal_text keeps their colours only: process-wide as click.style is",
}


def test_module_registries():
    """Every module of rigup/, roles/ and plays/ read for its module-level registries (:func:`registries`):
    exactly REGISTRIES, each with a line saying who fills and who reads it."""
    found = {f"{p.relative_to(ROOT)}:{name}" for p in modules("rigup", "roles", "plays", "shipped")
             for name in registries(tree(p))}
    new, gone = sorted(found - set(REGISTRIES)), sorted(set(REGISTRIES) - found)
    assert not new, f"new module-level registries (keep run state in the run's object, not a module): {new}"
    assert not gone, f"gone: remove their rows from REGISTRIES: {gone}"


def test_the_registry_rule_on_each_shape():
    source = '''
TABLE = {"a": 1}                 # a constant: ALL_CAPS, never changed
CACHE = {}
seen = []                        # lower case: state by its name
_cfg = None
__all__ = ["x"]
if True:
    _late = set()
BOX = SimpleNamespace()
EVENT = threading.Event()
def f(key, seen_here):
    global _cfg
    _cfg = key
    CACHE[key] = 1
    BOX.x = 1
    EVENT.set()
    TABLE.get(key)
def g():
    TABLE = {}
    TABLE["x"] = 1               # its own TABLE
    def h():
        TABLE.clear()            # g's
'''
    assert registries(ast.parse(source)) == {"CACHE", "seen", "_cfg", "_late", "BOX", "EVENT"}
