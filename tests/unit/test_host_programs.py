"""The programs that run on hosts (docs/layout.md, "Programs that run on hosts"): each marked, each
importing only the standard library and the other host programs (as the package module on the
controller, or as the name it is installed under next to it on a host), and the marked ones are
the table's. What a plain python3 on a bare host or the GPU machine can run. Each lives in a
``shipped/`` folder and reaches a host through rigup/files.py alone (``program``, ``program_text``)."""

import ast
import re
import sys
from pathlib import Path

from rigup.files import SHIPPED, beside_name, program_text

ROOT = Path(__file__).resolve().parents[2]
MARK = "# rigup: runs on hosts"
# imports beyond the standard library, and why
ALLOWED = {"roles/vllm/shipped/ray_wait.py": {"ray._raylet"}}  # runs in Ray's own venv, with Ray's client of its GCS


def marked() -> set[str]:
    return {str(p.relative_to(ROOT)) for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")
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
    own |= {beside_name(p).removesuffix(".py") for p in programs}
    wrong = {}
    for p in sorted(programs):
        outside = {m for m in imports(ROOT / p) if m.split(".")[0] not in sys.stdlib_module_names
                   and m not in own and m.rsplit(".", 1)[0] not in own
                   and not any(m == a or m.startswith(a + ".") for a in ALLOWED.get(p, ()))}
        if outside:
            wrong[p] = sorted(outside)
    assert wrong == {}, wrong


# ------------------------------------------------------------------ files a host program writes
# Root's host programs write in directories another user may own or write (the node exporter's
# textfile directory as its package made it, a model's directory, HAProxy's run directory): one
# writer, ``replace`` (a random dot-name opened O_EXCL|O_NOFOLLOW, then a rename: a link planted at
# any name is never followed), copied into each program that writes a file and held equal here.
# Every other open for writing is one of these, each with the reason its directory is safe to it:
WRITES_ELSEWHERE = {
    ("plays/shipped/tune.py", "measure"): "a point's log in the tuner's directory (plays/tuning.py workdir: root's, 0750); "
                                  "tune.py refuses the host before any run where anything there is not root's own file",
    ("plays/shipped/tune.py", "write"): "RESULT.tmp beside RESULT in the same root-only tuner directory (tune.py's Unsafe check)",
    ("roles/llama_cpp/shipped/smoke.py", "attempt"): "the build's smoke.log in llama_cpp_dir/builds/ID: root's, made by "
                                             "root's build or unpack in the same converge",
    ("roles/llama_cpp/shipped/smoke.py", "rpc_server"): "the same smoke.log of root's build directory",
    ("roles/llama_cpp/shipped/smoke.py", "smoke"): "smoke.log emptied and rigup-smoke.json.tmp, in root's build directory",
    ("roles/model_fetch/shipped/fetcher.py", "overwrite_json"): "a job's progress in place (r+b, a full disk's last word), in "
                                                        "the job's directory, by the job (systemd-run User=rigup_user)",
    ("roles/model_fetch/shipped/fetcher.py", "fetch_file"): "a download's part file, appended by the job as the rigup user in "
                                                    "the model's directory that user owns: a link there reaches "
                                                    "only what that user may write already",
    ("roles/model_fetch/shipped/fetcher.py", "fetch"): "the job's lock file, as the rigup user in its own job directory",
}
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}


def writes(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, what) of each open for writing in ``path``: open()/X.open() with a
    mode that writes, appends or creates (or a mode that is not a constant), os.open with a flag that
    writes and no O_NOFOLLOW, and X.write_text/X.write_bytes."""
    found = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                fn = child.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
                owner = ast.unparse(fn.value) if isinstance(fn, ast.Attribute) else None
                mode = None
                if name == "open" and owner is None:
                    mode = child.args[1] if len(child.args) > 1 else \
                        next((k.value for k in child.keywords if k.arg == "mode"), None)
                elif name == "open" and owner != "os" and child.args and isinstance(child.args[0], ast.Constant):
                    mode = child.args[0]   # Path.open("w"); an opener's .open(request) has no mode
                if mode is not None and not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                                             and not set(mode.value) & set("wax+")):
                    found.append((here, child.lineno, f"open(..., {ast.unparse(mode)})"))
                if name == "open" and owner == "os" and len(child.args) > 1:
                    flags = {n.attr for n in ast.walk(child.args[1]) if isinstance(n, ast.Attribute)}
                    if flags & WRITE_FLAGS and "O_NOFOLLOW" not in flags:
                        found.append((here, child.lineno, f"os.open(..., {ast.unparse(child.args[1])})"))
                if name in ("write_text", "write_bytes") and owner is not None:
                    found.append((here, child.lineno, f"{owner}.{name}"))
            visit(child, here)

    visit(ast.parse(path.read_text()), "<module>")
    return [(f, line, what) for f, line, what in found if f != "replace"]


def test_every_host_program_writes_through_replace_or_a_listed_reason():
    """Round 3's H4 as a class: rigup-burnin wrote its Prometheus file through ``PATH.PID.tmp`` (a
    predictable name, a plain open) where a planted link was followed. No host program opens a
    file for writing but through ``replace``, or at a place listed above with its reason."""
    found = {(p, f): (line, what) for p in sorted(marked()) for f, line, what in writes(ROOT / p)}
    for key, (line, what) in sorted(found.items()):
        print(f"{key[0]}:{line} {key[1]}: {what}")
    assert set(found) - set(WRITES_ELSEWHERE) == set(), \
        f"an open for writing outside replace() (use the program's replace, or list it with its reason): " \
        f"{ {k: v for k, v in found.items() if k not in WRITES_ELSEWHERE} }"
    assert set(WRITES_ELSEWHERE) - set(found) == set(), "a listed place no longer writes: drop it from the list"


def test_the_writer_is_one_function_copied_into_each_host_program_that_writes():
    """``replace`` is one function: each host program that carries it carries the guard's, to the
    letter (it ships alone), and those that write in another user's reach carry it."""
    copies = {}
    for p in sorted(marked()):
        for node in ast.parse((ROOT / p).read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "replace":
                copies[p] = ast.unparse(node)
    print(sorted(copies))
    assert {"roles/gpu_guard/shipped/guard.py", "roles/watchdog/shipped/watchdog.py", "roles/model_fetch/shipped/fetcher.py",
            "roles/burnin/shipped/acceptance.py", "roles/balancer/shipped/drain.py"} <= set(copies)
    assert len(set(copies.values())) == 1, "the copies of replace() differ"


# ------------------------------------------------------------------ a host program's import of another
# A host program imports the host programs its role installs next to it through ``beside`` alone (issue
# 61, round 8 R1: four spellings, one of which ran a rigup_xid.py from the prefix's parent as root): one
# function, copied into each, by that file's path, never through sys.path.
IMPORTS_ANOTHER = {"roles/burnin/shipped/acceptance.py", "roles/gpu_guard/shipped/guard.py", "roles/metrics/shipped/relay.py",
                   "roles/watchdog/shipped/watchdog.py", "plays/shipped/tune.py"}


def copies_of(function: str) -> dict[str, str]:
    return {p: ast.unparse(node) for p in sorted(marked()) for node in ast.parse((ROOT / p).read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name == function}


def test_a_host_program_imports_another_through_the_one_beside_and_never_through_sys_path():
    copies = copies_of("beside")
    print(f"beside() in {sorted(copies)}: {len(set(copies.values()))} text(s)")
    assert IMPORTS_ANOTHER <= set(copies) and len(set(copies.values())) == 1, "the copies of beside() differ"
    own = {beside_name(p).removesuffix(".py") for p in marked()} | {"rigup", "roles", "plays", "shipped"}
    other_ways = {}
    for p in sorted(marked()):
        tree = ast.parse((ROOT / p).read_text())
        tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "beside")]
        found = [ast.unparse(n) for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and ast.unparse(n) in ("sys.path", "importlib.util.spec_from_file_location")
                 or isinstance(n, ast.Import) and {a.name.split(".")[0] for a in n.names} & own
                 or isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] in own]
        found += [f"{p} imports {n}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
        if found:
            other_ways[p] = found
    print(f"other imports of a host program: {other_ways}")
    assert other_ways == {}


def beside_in(program: Path):
    """``beside`` as it runs in ``program`` (its __file__), from roles/gpu_guard/shipped/guard.py's copy."""
    node = next(n for n in ast.parse((ROOT / "roles/gpu_guard/shipped/guard.py").read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == "beside")
    namespace = {"__file__": str(program)}
    exec(compile(ast.Module([node], []), "beside", "exec"), namespace)
    return namespace["beside"]


def test_beside_runs_a_root_owned_file_only_and_never_one_another_user_could_write(tmp_path):
    import os
    import subprocess
    nobody = 65534
    bin_ = tmp_path / "opt/rigup/bin"
    bin_.mkdir(parents=True)
    beside = beside_in(bin_ / "rigup-program")
    ran = tmp_path / "ran"
    body = f"open({str(ran)!r}, 'a').write(__name__ + '\\n')\nVALUE = 7\n"
    seen = {}

    def attempt(case: str, name: str) -> str:
        try:
            module = beside(name, "rigup/none.py", "roles/none/none.py")
        except ImportError as e:
            seen[case] = f"refused: {e}"
        else:
            seen[case] = "absent: None" if module is None else f"run: VALUE {module.VALUE}"
        sys.modules.pop(name.removesuffix(".py"), None)
        return seen[case]

    assert attempt("absent", "rigup_absent.py") == "absent: None"
    for case, mode, owner in (("root 0644", 0o644, 0), ("root 0664 (group-writable)", 0o664, 0),
                              ("root 0646 (other-writable)", 0o646, 0), (f"uid {nobody} 0644", 0o644, nobody)):
        name = f"rigup_{len(seen)}.py"
        (bin_ / name).write_text(body)
        os.chown(bin_ / name, owner, 0)
        os.chmod(bin_ / name, mode)
        attempt(case, name)
    (tmp_path / "real.py").write_text(body)
    (bin_ / "rigup_link.py").symlink_to(tmp_path / "real.py")     # root's own file, through a link
    attempt("a link to root's 0644 file", "rigup_link.py")
    os.mkfifo(bin_ / "rigup_fifo.py")                              # would block a plain open: not read
    attempt("a FIFO", "rigup_fifo.py")
    for case, got in seen.items():
        print(f"{case:32} {got}")
    assert seen["root 0644"] == "run: VALUE 7"
    assert all(got.startswith("refused: ") for case, got in seen.items() if case not in ("absent", "root 0644"))
    assert "a link" in seen["a link to root's 0644 file"] and "-rw-rw-r--" in seen["root 0664 (group-writable)"]
    assert ran.read_text().splitlines() == ["rigup_1"]               # the one file run is root's 0644 one
    # as a program runs it (a plain python3 with -sES, the guard's unit): a group-writable rigup_xid.py is never run
    guard = bin_ / "rigup-gpu-guard"
    guard.write_text((ROOT / "roles/gpu_guard/shipped/guard.py").read_text())
    (bin_ / "rigup_xid.py").write_text(f"open({str(ran)!r}, 'a').write('xid\\n')\n")
    os.chmod(bin_ / "rigup_xid.py", 0o664)
    r = subprocess.run(["/usr/bin/python3", "-sES", str(guard), "--config", "/none", "status"], capture_output=True,
                       text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})
    print(f"the guard with a 0664 rigup_xid.py beside it: {r.stdout.splitlines()[:1]}")
    assert "the Xid triage is off" in r.stdout and "is not run: -rw-rw-r--" in r.stdout
    assert ran.read_text().splitlines() == ["rigup_1"]


def test_beside_in_the_source_tree_gives_the_package_module():
    from shipped import throughput
    beside = beside_in(ROOT / "roles/watchdog/shipped/watchdog.py")
    got = beside("rigup_throughput.py", "shipped/throughput.py", "roles/watchdog/shipped/watchdog.py")
    print(f"in the tree: {got.__name__} from {got.__file__}")
    assert got is throughput
    assert beside("rigup_throughput.py", "shipped/throughput.py", "roles/other/other.py") is None   # not where it is


def test_beside_in_a_source_tree_imports_it_as_the_rest_of_the_tree_is(tmp_path):
    """A checkout made with umask 002 (Debian's for a user with a private group: 0664 files) is imported
    as Python imports the rest of it: the file check is for the file a role installs beside a program
    on a host, which root runs."""
    import os
    (tmp_path / "roles/r").mkdir(parents=True)
    (tmp_path / "treepkg").mkdir()
    for f, text in (("treepkg/__init__.py", ""), ("treepkg/mod.py", "VALUE = 7\n")):
        (tmp_path / f).write_text(text)
        os.chmod(tmp_path / f, 0o664)
    beside = beside_in(tmp_path / "roles/r/r.py")
    try:
        got = beside("rigup_mod.py", "treepkg/mod.py", "roles/r/r.py")
        print(f"a 0664 tree file: {got.__name__} VALUE {got.VALUE}")
        assert got.VALUE == 7 and got.__file__ == str(tmp_path / "treepkg/mod.py")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("treepkg.mod", "treepkg"):
            sys.modules.pop(name, None)


# ------------------------------------------------------------------ where they live, and the one way out
# A file is shipped to hosts if and only if it lies in a shipped/ folder (a role's, plays/, or the
# top-level one for the modules several share): rigup/ ships nothing.
def shipped_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in ROOT.rglob("shipped/*.py")
            if p.name != "__init__.py" and not {".venv", ".git", "tests"} & set(p.relative_to(ROOT).parts)}


def test_the_marked_programs_are_the_files_of_the_shipped_folders():
    found = shipped_files()
    print(f"{len(found)} host programs: {sorted(found)}")
    assert marked() == found and all(SHIPPED.fullmatch(p) for p in found), marked() ^ found
    assert not [p for p in found if p.startswith("rigup/")]


def test_no_roles_init_binds_the_global_shipped():
    """Importing ``roles.R.shipped.X`` sets the attribute ``shipped`` of ``roles.R`` (importlib sets each
    submodule on its parent): a role's ``__init__`` whose global ``shipped`` were the top-level package
    (``import shipped.xid``) would find its own subpackage there instead. ``from shipped import xid``."""
    found = {}
    for init in sorted((ROOT / "roles").glob("*/__init__.py")):
        for node in ast.walk(ast.parse(init.read_text())):
            bound = []
            if isinstance(node, ast.Import):
                bound = [a.asname or a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                bound = [a.asname or a.name for a in node.names]
            elif isinstance(node, (ast.Name,)) and isinstance(node.ctx, ast.Store):
                bound = [node.id]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound = [node.name]
            if "shipped" in bound:
                found.setdefault(str(init.relative_to(ROOT)), []).append(node.lineno)
    assert found == {}, found


def controller_sources() -> list[Path]:
    """What runs on the controller: rigup/, roles/, plays/ (their shipped/ folders left out) and the plays."""
    return sorted(p for d in ("rigup", "roles", "plays") for p in (ROOT / d).rglob("*.py")
                  if "shipped" not in p.relative_to(ROOT).parts) + sorted(ROOT.glob("*.py"))


SENDERS = {"program", "program_text", "program_paths"}   # rigup/files.py's: the one way a program leaves


def _called(node) -> str | None:
    fn = node.func
    return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None


def _docstrings(tree) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def constants() -> dict[str, dict[str, object]]:
    """Each controller module's module-level constants that are strings or tuples of strings, by module
    name (``plays.tuning``) and name."""
    out = {}
    for p in controller_sources():
        mod = str(p.relative_to(ROOT))[:-3].replace("/", ".").removesuffix(".__init__")
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, str) or isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                    out.setdefault(mod, {})[node.targets[0].id] = value
    return out


def resolve(node, mod: str, tree, known: dict):
    """The value of ``node`` (a literal, a module constant, or one imported from another module)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name):
        if node.id in known.get(mod, {}):
            return known[mod][node.id]
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == node.id for a in n.names):
                name = next(a.name for a in n.names if (a.asname or a.name) == node.id)
                return known.get(n.module, {}).get(name)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        for other, names in known.items():
            if other.rsplit(".", 1)[-1] == node.value.id and node.attr in names:
                return names[node.attr]
    return None


def sends() -> list[tuple[str, str, str, object, object]]:
    """(file, line, called, first argument, beside) of each call of :data:`SENDERS` in the controller's
    code (rigup/files.py's own calls left out), each argument resolved (:func:`resolve`)."""
    known, out = constants(), []
    for p in controller_sources():
        rel = str(p.relative_to(ROOT))
        if rel == "rigup/files.py":
            continue
        mod, tree = rel[:-3].replace("/", ".").removesuffix(".__init__"), ast.parse(p.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and _called(n) in SENDERS and n.args:
                beside = next((k.value for k in n.keywords if k.arg == "beside"), None)
                if _called(n) == "program_paths" and len(n.args) > 1:
                    beside = n.args[1]
                out.append((rel, n.lineno, _called(n), resolve(n.args[0], mod, tree, known),
                            () if beside is None else resolve(beside, mod, tree, known)))
    return out


def test_every_host_program_leaves_through_rigup_files_alone():
    """Section (a) of the placement (issue 64): a host program's path appears in the controller's code
    only as what rigup/files.py's ``program``/``program_text``/``program_paths`` are handed (or a module
    constant handed to them); no path is built to one (``with_name``, ``/``) and no ``__file__`` of a
    shipped module is read: a program's bytes on a host are program_text's, and every program leaves."""
    programs, known = marked(), constants()
    names = {Path(p).name for p in programs}
    handed = set()
    for rel, line, called, first, beside in sends():
        assert (called == "program_paths" or isinstance(first, str) and first in programs), (rel, line, first)
        handed |= {first} if called != "program_paths" else set()
        handed |= set(beside or ())
    handed_names = {getattr(a, "id", None) or a.attr for args in ast_all_sends() for a in args
                    if isinstance(a, (ast.Name, ast.Attribute))}
    wrong = []
    for p in controller_sources():
        rel, tree = str(p.relative_to(ROOT)), ast.parse(p.read_text())
        mod, docs = rel[:-3].replace("/", ".").removesuffix(".__init__"), _docstrings(tree)
        passed = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n) in SENDERS
                  for a in ast.walk(n)}
        constant_nodes = {id(c): t.id for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                          and isinstance(t := n.targets[0], ast.Name) for c in ast.walk(n.value)}
        shipped_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                         and n.module and "shipped" in n.module.split(".") for a in n.names}
        shipped_names |= {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                          for a in n.names if a.asname and "shipped" in a.name.split(".")}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                if n.value in programs and id(n) not in passed and constant_nodes.get(id(n)) is None:
                    wrong.append(f"{rel}:{n.lineno}: {n.value!r} not handed to rigup/files.py")
                if n.value in names:
                    wrong.append(f"{rel}:{n.lineno}: a path built to {n.value!r}")
            if isinstance(n, ast.Attribute) and n.attr == "__file__" and isinstance(n.value, ast.Name) \
                    and n.value.id in shipped_names:
                wrong.append(f"{rel}:{n.lineno}: {n.value.id}.__file__ read")
        for name in set(constant_nodes.values()):   # a module constant naming a program is handed over
            value = known.get(mod, {}).get(name)
            values = value if isinstance(value, tuple) else (value,)
            if set(values) & programs and name not in handed_names:
                wrong.append(f"{rel}: {name} names a host program and is handed to no sender")
    print(f"handed to rigup/files.py: {sorted(handed)}")
    assert wrong == [], wrong
    assert handed == programs, f"host programs that never leave: {sorted(programs - handed)}"


def ast_all_sends() -> list[list]:
    """The argument nodes of every call of :data:`SENDERS` in the controller's code."""
    return [[x for a in [*n.args, *(k.value for k in n.keywords)] for x in ast.walk(a)]
            for p in controller_sources() for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Call) and _called(n) in SENDERS]


def besides_of(program: str) -> set[str]:
    """The ``tree`` arguments of the ``beside()`` calls in ``program``: the modules it imports beside it."""
    return {ast.literal_eval(n.args[1]) for n in ast.walk(ast.parse((ROOT / program).read_text()))
            if isinstance(n, ast.Call) and _called(n) == "beside" and len(n.args) == 3}


def test_a_role_ships_exactly_what_its_program_imports_beside_it():
    """Section (b): each ``program(..., beside=B)`` call's ``B`` is the modules its program's
    ``beside()`` calls import (a module left out would be a program that ends at its start on the
    host; one too many, a file nobody reads), and a program sent by ``program_text`` alone (the
    fetcher's probe, bench.py's script, the drain helper, the smoke) imports none beside it."""
    seen = {}
    for rel, line, called, first, beside in sends():
        if called == "program":
            seen[f"{rel}:{line} {first}"] = (set(beside), besides_of(first))
        elif called == "program_text":
            seen[f"{rel}:{line} {first} (sent alone)"] = (set(), besides_of(first))
    for where, (given, imported) in sorted(seen.items()):
        print(f"{where}: ships {sorted(given)}, imports {sorted(imported)}")
    assert {w: v for w, v in seen.items() if v[0] != v[1]} == {}
    assert len([w for w in seen if "(sent alone)" not in w]) >= 8


def test_no_shipped_text_ends_a_heredoc_it_is_sent_in():
    """Section (c): the fetcher's probe and bench.py's script are sent in a heredoc; a line of the
    program that is its delimiter would end it there, and run the rest as shell."""
    for p in sorted(marked()):
        lines = set(program_text(p).splitlines())
        assert not lines & {"RIGUP_FETCH_EOF", "RIGUP_BENCH_EOF"}, p


def test_program_refuses_a_file_that_is_no_host_program_and_a_missing_path():
    import pytest
    from rigup.files import program, program_paths
    with pytest.raises(ValueError, match="no host program"):
        program_text("rigup/files.py")
    with pytest.raises(ValueError, match="not among the role's paths"):
        program("roles/gpu_guard/shipped/guard.py", "/b/g", ["/b/g"], name="g", beside=("shipped/xid.py",))
    assert program_paths("/b/g", ("shipped/xid.py", "shipped/gguf.py")) == ["/b/g", "/b/rigup_xid.py", "/b/rigup_gguf.py"]
