"""Every python3 rigup starts on a host runs isolated from the site directories (issue 61, round 7's
R1): ``python3 -s -E -S`` (no user site, no PYTHON* variable, no site module: no .pth file runs at
start and no dist-packages module is found), never ``-I`` alone (since 3.11 it implies -P, which
drops the program's own directory, where rigup_throughput.py and rigup_xid.py are). Debian's
/usr/local is 2775 root:staff: a staff user's .pth in /usr/local/lib/python3.X/dist-packages ran as
root at every watchdog tick. Read from the sources, so that a new unit, command or program cannot
forget (round 7b's P1-P4: the shapes the first guard missed):

- each python3 command of templates/*.j2, a unit's Exec*= line or a script's line, where a Jinja
  placeholder of a python interpreter (``{{ python | q }}``: vllm_python) is a python3 word;
- each string of rigup/, roles/ and the plays that runs python3 (a unit's systemd-run, an
  operation's shell command), and each argv the code builds word by word (``StringCommand(...,
  "python3", script)``, ``["python3", ...]``): ``-m``, here-documents and a bare script count;
- each host program's first line, as its source has it and as roles install it (the ``text=`` or
  ``src=`` of an install, evaluated): ``#!/usr/bin/python3 -sES`` (the kernel passes one argument:
  -s -E -S at once).
"""

import ast
import functools
import importlib
import io
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "# rigup: runs on hosts"
SHEBANG = "#!/usr/bin/python3 -sES"
# python3 run as a command: its options, then its program (a path, a placeholder, a quoted word, a
# script name, -m MODULE, -c, - or a redirection for standard input); "command -v python3" and prose
# are no such command. A path to another python (a venv's .../bin/python) is that venv's.
PYTHON = r"(?:/usr/bin/)?python3?(?:\.\d+)?"
RUNS = re.compile(rf"(?<![\w/.-]){PYTHON}(?P<flags>(?:[ \t]+(?:-[WX][ \t]*[^\s-]\S*|-[A-Za-z]+))*)"
                  r"(?:[ \t]+-m[ \t]*[A-Za-z_][\w.]*|[ \t]+-(?:[ \t]|$)|[ \t]*<|[ \t]+[/{$'\"]|[ \t]+[\w.-]*\.py\b)")
# a name whose value is a python interpreter: python, vllm_python, a template's {{ python }}
INTERPRETER = re.compile(r"(?i)(?:\w+_)?python3?(?:\.\d+)?")
# places whose python3 is not isolated yet, each another fixer's file (drop the entry once it is):
# (file, the text around it) -> why it waits
PENDING: dict = {}
SHEBANG_PENDING: dict = {}


def unisolated(text: str) -> list[str]:
    """Each python3 command in ``text`` that lacks one of -s, -E, -S."""
    def given(flags: str) -> set[str]:
        letters = set("".join(f[1:] for f in flags.split() if f.startswith("-") and f[1:2] not in "WX"))
        return letters | ({"s", "E"} if "I" in letters else set())   # -I: -E, -s and no script directory
    return [m.group(0) for m in RUNS.finditer(text) if not {"s", "E", "S"} <= given(m.group("flags"))]


def test_the_pattern_finds_python3_commands_and_not_prose():
    assert unisolated("ExecStart=/usr/bin/python3 {{ script }} check") == ["/usr/bin/python3 {"]
    assert unisolated("a; python3 -c 'import x'") and unisolated("python3 - probe <<EOF") and unisolated("python3 /x")
    assert unisolated("python3 -u /x") and unisolated("python3 -I /x")
    # round 7b's P4: -m, a here-document, a bare script, exec, python3.11, -X with its value
    assert unisolated("python3 -m venv /v") and unisolated("python3 <<EOF") and unisolated("python3 <<'EOF'")
    assert unisolated("python3 script.py a") and unisolated("exec python3 smoke.py") and unisolated("python3.11 -m x")
    assert unisolated("python3 -X dev /x") and unisolated("python3 -s -E -m venv /v") and unisolated("python3 -")
    assert not unisolated("/usr/bin/python3 -s -E -S {{ script }}") and not unisolated("python3 -sES -u /x")
    assert not unisolated("python3 -s -E -S -m venv /v") and not unisolated("python3 -I -S <<EOF")
    assert not unisolated("python3 -X importtime -sES x.py")
    assert not unisolated("command -v python3 >/dev/null") and not unisolated("python3 is missing on the host; fix")
    assert not unisolated('"$pin_dir/venv/bin/python" -c x') and not unisolated("raylet python3 python")


def name_of(node: ast.AST) -> str | None:
    """The name a value is read by: ``python``, ``x.python``, ``data["vllm_python"]``, ``d.get("python")``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def interpreter(node: ast.AST) -> bool:
    return bool(INTERPRETER.fullmatch(name_of(node) or ""))


def template_interpreters() -> dict[str, set[str]]:
    """For each template, the names of its variables that hold a python interpreter: every render's
    keyword whose value is read by such a name (``python=data["vllm_python"]``: vllm-install's
    ``python``), and any variable so named."""
    found: dict[str, set[str]] = {}
    for path in python_files():
        for node in ast.walk(parsed(path)):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).endswith(".j2")):
                found.setdefault(node.args[0].value, set()).update(
                    k.arg for k in node.keywords if k.arg and (interpreter(k.value) or INTERPRETER.fullmatch(k.arg)))
    return found


def template_text(path: Path, names: set[str]) -> str:
    """The template with each placeholder of a python interpreter written as the word python3."""
    def word(m):
        return "python3" if m.group(1) in names or INTERPRETER.fullmatch(m.group(1)) else m.group(0)
    return re.sub(r"\{\{-?\s*(\w+)\s*(?:\|[^}]*)?-?\}\}", word, path.read_text())


def test_each_template_runs_python3_isolated():
    names, found, checked = template_interpreters(), {}, []
    assert "python" in names.get("vllm-install.sh.j2", set()), names.get("vllm-install.sh.j2")
    for path in sorted((ROOT / "templates").glob("*.j2")):
        text = template_text(path, names.get(path.name, set()))
        if RUNS.search(text):
            checked.append(path.name)
        for n, line in enumerate(text.splitlines(), 1):
            if unisolated(line):
                found[f"{path.name}:{n}"] = line
        first = text.split("\n", 1)[0]
        if first.startswith("#!") and "python" in first and first != SHEBANG:
            found[f"{path.name}:1"] = first
    print(sorted(checked))
    assert len(checked) >= 6 and "vllm-install.sh.j2" in checked and found == {}, found


def python_files() -> list[Path]:
    return [p for d in ("rigup", "roles", "plays", "shipped") for p in sorted((ROOT / d).rglob("*.py"))] + sorted(ROOT.glob("*.py"))


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def strings(tree: ast.Module):
    """(line, text) of each string of the module but its docstrings: an f-string with {} for each
    placeholder, python3 for one of a python interpreter (adjacent f-strings are one); and each
    argv built word by word that holds a python3 word (a call's arguments, a list's or a tuple's
    items), its words joined by blanks: a string as itself, a name bound to a string as that
    string, one of a python interpreter as python3, anything else as {}."""
    docs, parts, bound = set(), set(), {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            docs.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            parts |= {id(v) for v in node.values}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            bound.update((t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name))

    def word(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in bound:
            return bound[node.id]
        return "python3" if interpreter(node) else "{}"

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else
                                       "python3" if interpreter(v.value) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | parts:
            yield node.lineno, node.value
        items = (node.args if isinstance(node, ast.Call) else
                 node.elts if isinstance(node, (ast.List, ast.Tuple)) else [])
        words = [word(item) for item in items]
        if any(re.fullmatch(r"(?:/usr/bin/)?python3(?:\.\d+)?", w) for w in words):   # not a key "python"
            yield node.lineno, " ".join(words)


def test_argv_words_and_python_names_are_read_as_commands():
    found = lambda src: [c for _, t in strings(ast.parse(src)) for c in unisolated(t)]   # noqa: E731
    assert found('StringCommand("timeout", "10", "python3", QuoteString(s))')       # round 7b's P1
    assert found('run(["/usr/bin/python3", "-u", script])') and found('PY = "python3"\nrun((PY, "-m", "x"))')
    assert found('f"{data[\'vllm_python\']} -m venv {d}"') and found('run([python, "-c", code])')
    assert not found('StringCommand("timeout", "python3", "-s", "-E", "-S", QuoteString(s))')
    assert not found('RAY = ("raylet", "python3", "python")') and not found('run([f"{venv}/bin/python", s])')


def test_each_python3_command_rigup_runs_on_a_host_is_isolated():
    found, pending = {}, set()
    for path in python_files():
        name = str(path.relative_to(ROOT))
        for line, text in strings(parsed(path)):
            for command in unisolated(text):
                waits = [k for k in PENDING if k[0] == name and k[1] in text]
                if waits:
                    pending |= set(waits)
                else:
                    found[f"{name}:{line}"] = command
    assert found == {}, f"python3 without -s -E -S (or list it in PENDING with why): {found}"
    assert pending == set(PENDING), f"isolated now: drop from PENDING {set(PENDING) - pending}"


def test_each_host_program_run_by_its_path_starts_isolated():
    programs = sorted(str(p.relative_to(ROOT)) for d in ("rigup", "roles", "plays", "shipped") for p in (ROOT / d).rglob("*.py")
                      if MARK in "".join(p.read_text().splitlines(keepends=True)[:3]))
    lines = {p: (ROOT / p).read_text().splitlines()[0] for p in programs}
    wrong = {p: first for p, first in lines.items()
             if first.startswith("#!") and first != SHEBANG and p not in SHEBANG_PENDING}
    assert wrong == {}, wrong
    assert {p for p in SHEBANG_PENDING if lines[p] != SHEBANG} == set(SHEBANG_PENDING), "isolated now: drop it"
    assert sum(first == SHEBANG for first in lines.values()) >= 5


def test_no_python_shebang_is_written_in_code_but_the_isolated_one():
    """A shebang spelled in a string (round 7b's P2: rigup-share's ``"#!/usr/bin/python3\\n" + ...``)."""
    firsts = {f"{p.relative_to(ROOT)}:{line}": text.split("\n", 1)[0] for p in python_files()
              for line, text in strings(parsed(p)) if text.startswith("#!")}
    found = {where: first for where, first in firsts.items() if "python" in first and first != SHEBANG}
    assert found == {}, found


# what an install's text= or src= may be made of to be evaluated here (a file's text, a part of it)
METHODS = {"read_text", "split", "rsplit", "splitlines", "replace", "strip", "lstrip", "join", "with_name", "getvalue"}
MAKERS = {"str", "Path", "StringIO", "program_text"}


def plain(node: ast.AST) -> bool:
    """Whether the expression reads only the module's names, strings and files (evaluating it runs
    nothing else)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            ok = (isinstance(f, ast.Attribute) and f.attr in METHODS) or (isinstance(f, ast.Name) and f.id in MAKERS)
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "render":
                ok = all(isinstance(a, ast.Constant) for a in n.args) and not n.keywords
            if not ok:
                return False
        elif not isinstance(n, (ast.Constant, ast.Name, ast.Attribute, ast.BinOp, ast.Add, ast.Div, ast.Subscript,
                                ast.Slice, ast.UnaryOp, ast.USub, ast.Load, ast.keyword, ast.Tuple, ast.List)):
            return False
    return True


def installed() -> dict[str, str]:
    """Each file a role installs whose content the code fixes (``text=`` or ``src=`` of a call, a
    program of rigup/files.py's ``program``, or a name bound to a file's ``read_text()`` or to a
    ``program_text``, evaluated in its module): where it is (file:line and the operation's or the
    name) -> the text."""
    from rigup.files import program_text
    out = {}
    for path in [p for p in python_files() if p.is_relative_to(ROOT / "roles") or p.is_relative_to(ROOT / "rigup")]:
        tree, module = parsed(path), None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                given = [ast.keyword("text", node.value)] if any(   # DRAIN_SOURCE = program_text(...)
                    isinstance(n, ast.Attribute) and n.attr == "read_text" or isinstance(n, ast.Name) and n.id == "program_text"
                    for n in ast.walk(node.value)) else []
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "program" \
                    and node.args:   # rigup/files.py program(PATH, ..., beside=B): the texts of PATH and of B's modules
                given = [ast.keyword("text", ast.fix_missing_locations(ast.copy_location(
                    ast.Call(ast.Name("program_text", ast.Load()), [node.args[0]], []), node)))]
                given += [k for k in node.keywords if k.arg == "beside"]
            else:
                given = [k for k in node.keywords if k.arg in ("text", "src")] if isinstance(node, ast.Call) else []
            for k in given:
                if not plain(k.value):
                    continue
                if module is None:
                    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
                try:
                    value = eval(compile(ast.Expression(k.value), str(path), "eval"),
                                 {**vars(module), "program_text": program_text})
                except Exception:   # noqa: BLE001 - a name of the function's own: not fixed by the code
                    continue
                if k.arg == "beside":   # the modules program() puts beside it
                    for module in value:
                        out[f"{path.relative_to(ROOT)}:{node.lineno} {module}"] = program_text(module)
                    continue
                if isinstance(value, io.StringIO):
                    value = value.getvalue()
                elif isinstance(value, Path) or (isinstance(value, str) and "\n" not in value
                                                 and os.path.isfile(value)):
                    value = Path(value).read_bytes().decode(errors="replace")   # smoke.gguf too
                label = node.targets[0].id if isinstance(node, ast.Assign) else next(
                    (n.value.value for n in node.keywords if n.arg == "name" and isinstance(n.value, ast.Constant)), "")
                out[f"{path.relative_to(ROOT)}:{node.lineno} {label}"] = value
    return out


def test_each_host_program_starts_isolated_as_its_role_installs_it():
    texts = installed()
    firsts = {where: text.split("\n", 1)[0] for where, text in texts.items() if isinstance(text, str)}
    programs = {where: first for where, first in firsts.items() if first.startswith("#!") and "python" in first}
    print(sorted(programs))
    for name in ("Install rigup-share", "Install rigup-fetch", "DRAIN_SOURCE"):
        assert [w for w in programs if w.endswith(name)], (name, programs)
    assert len(programs) >= 8, programs
    assert {w: first for w, first in programs.items() if first != SHEBANG} == {}


# the programs rigup's units run, as their roles install them (the name, the files beside it), with
# arguments that start them and end at once (some on a configuration this machine lacks): each
# imports what it needs under -s -E -S
INSTALLED = {
    "rigup-watchdog": ("roles/watchdog/shipped/watchdog.py", {"rigup_throughput.py": "shipped/throughput.py"}, ["--help"]),
    "rigup-metrics-relay": ("roles/metrics/shipped/relay.py", {"rigup_throughput.py": "shipped/throughput.py"}, ["--help"]),
    "rigup-gpu-guard": ("roles/gpu_guard/shipped/guard.py", {"rigup_xid.py": "shipped/xid.py"}, ["--config", "/none", "check"]),
    "rigup-fetch": ("roles/model_fetch/shipped/fetcher.py", {}, ["--help"]),
    "rigup-burnin": ("roles/burnin/shipped/acceptance.py", {"rigup_xid.py": "shipped/xid.py"}, ["--help"]),
}


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no /usr/bin/python3")
@pytest.mark.parametrize("name", sorted(INSTALLED))
def test_each_unit_program_runs_isolated_with_only_what_is_installed_beside_it(tmp_path, name):
    source, beside, args = INSTALLED[name]
    (tmp_path / name).write_text((ROOT / source).read_text())
    for dest, src in beside.items():
        (tmp_path / dest).write_text((ROOT / src).read_text())
    run = subprocess.run(["/usr/bin/python3", "-s", "-E", "-S", str(tmp_path / name), *args], cwd="/",
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    print(name, run.returncode, run.stdout[-300:], run.stderr[-300:])
    assert not {"ImportError", "ModuleNotFoundError", "not beside it"} & set(re.findall(r"\w+Error|not beside it", run.stderr))
