"""One way to the terminal (issue 61, class 5): text from a host reaches the operator escaped.

Every line rigup prints goes through rigup.text (``say`` a line, ``shown`` a cell or a value,
``shown_lines`` a journal or a table; ``json.dumps`` for data, whose ensure_ascii escapes every
control character). The programs that run on hosts import only the standard library, so each that
prints text it did not write itself has its own copy of ``shown``, held here to rigup.text's.

The syntax tree of every .py of rigup/, roles/ and the plays is read: a call to print, click.echo,
click.secho, sys.stdout.write, sys.stderr.write, a logger or pyinfra's host.log/log_styled whose
text is built from a value (a name, an f-string placeholder, ``+``, ``%``, ``.format``, any other
call) fails the test unless that value went through one of those. A function of the tree whose every
``return`` is such text counts as one of them (fleet.render_json returns json.dumps(...)).
"""

from __future__ import annotations

import ast
import functools
import importlib
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rigup.text import shown, shown_lines

ROOT = Path(__file__).resolve().parents[2]
PLAYS = ("deploy.py", "status.py", "shards.py", "tune.py", "roll.py", "bench.py", "preflight.py", "config.py")
HOST_MARK = "# rigup: runs on hosts"
ESCAPING = {"shown", "say", "shown_lines"}     # rigup.text's (and a host program's own shown), and json.dumps
LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


@functools.cache
def sources() -> dict[str, ast.Module]:
    files = [p for d in ("rigup", "roles", "plays", "shipped") for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / p for p in PLAYS]
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in files}


def host_program(path: str) -> bool:
    return HOST_MARK in "".join((ROOT / path).read_text().splitlines(keepends=True)[:3])


def name_of(func: ast.expr) -> str:
    """``print``, ``click.echo``, ``sys.stderr.write``, ``host.log``: a called name, dotted."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = name_of(func.value)
        return f"{inner}.{func.attr}" if inner else ""
    return ""


def is_sink(func: ast.expr) -> bool:
    """A call that writes to the terminal (or to a log the operator reads there)."""
    name = name_of(func)
    head, _, attr = name.rpartition(".")
    return (name in {"print", "click.echo", "click.secho", "sys.stdout.write", "sys.stderr.write"}
            or (head.split(".")[-1] in {"logger", "logging", "log"} and attr in LEVELS)
            or (head.split(".")[-1] == "host" and attr == "log") or attr == "log_styled")


def escapes(call: ast.Call, safe_functions: set[str]) -> bool:
    """A call whose result is escaped text: rigup.text's (or a host program's copy), json.dumps, or
    a function of the tree that returns only such text."""
    name = name_of(call.func)
    last = name.rsplit(".", 1)[-1]
    return last in ESCAPING or name == "json.dumps" or last in safe_functions


def safe(node: ast.expr | None, safe_functions: set[str]) -> bool:
    """Text that holds nothing from outside unescaped: constants (and the module's own __doc__),
    and f-strings, ``+``, ``%``, conditionals, slices and string methods of such text only."""
    ok = lambda n: safe(n, safe_functions)   # noqa: E731
    if node is None or isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id == "__doc__"
    if isinstance(node, ast.JoinedStr):
        return all(ok(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return ok(node.left) and ok(node.right)
    if isinstance(node, ast.Tuple):
        return all(map(ok, node.elts))
    if isinstance(node, ast.IfExp):
        return ok(node.body) and ok(node.orelse)
    if isinstance(node, ast.Subscript):
        return ok(node.value) and ok(node.slice)
    if isinstance(node, ast.Slice):
        return ok(node.lower) and ok(node.upper) and ok(node.step)
    if isinstance(node, ast.UnaryOp):
        return ok(node.operand)
    if isinstance(node, ast.Call):
        if escapes(node, safe_functions):
            return True
        if name_of(node.func) == "click.style":    # colour around text: the text decides
            return bool(node.args) and ok(node.args[0])
        return (isinstance(node.func, ast.Attribute) and ok(node.func.value)   # "x".join(...), __doc__.split(...)
                and all(map(ok, node.args)) and all(ok(k.value) for k in node.keywords))
    return False


def safe_functions(trees: dict[str, ast.Module]) -> set[str]:
    """Names of the tree's functions whose every ``return`` is safe text (every definition of that
    name, in any file), to a fixed point."""
    returns: dict[str, list[list[ast.expr | None]]] = {}    # name: each definition's returned values
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                returns.setdefault(node.name, []).append([r.value for r in ast.walk(node) if isinstance(r, ast.Return)])
    found: set[str] = set()
    while more := {name for name, defs in returns.items() if name not in found and all(
            values and all(v is not None and safe(v, found) for v in values) for values in defs)}:
        found |= more
    return found


def raw_prints(path: str, tree: ast.Module, functions: set[str], host: bool = False) -> list[str]:
    """``path:line: call`` for each call of a sink with text not known escaped (``host``: a host
    program, whose own shown() and say() may print)."""
    if path == "rigup/text.py":   # say() itself: the one way out
        return []
    exempt: set[int] = set()       # a host program's own shown()/say()
    if host:
        exempt = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in {"shown", "say"}
                  for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in exempt or not is_sink(node.func):
            continue
        texts = list(node.args) + [k.value for k in node.keywords if k.arg == "message"]
        if not all(safe(t, functions) for t in texts):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:160]}")
    return found


def raw_in(snippet: str) -> list[str]:
    tree = ast.parse(snippet)
    return raw_prints("snippet.py", tree, safe_functions({"snippet.py": tree}))


@pytest.mark.parametrize("snippet", [
    "print(x)", "print(f'{x}')", "print('a', x)", "click.echo('a' + x, err=True)", "sys.stderr.write('%s' % x)",
    "logger.info('x %s', y)", "logging.warning(f'{y}')", "host.log_styled(reason, fg='red')", "host.log(x)",
    "print(''.join(x))", "print('{}'.format(x))", "click.echo(click.style(f'{x}', fg='red'))",
    "click.secho(message=x)", "print(render(x))\ndef render(x):\n    return str(x)", "print(f'<{p}>{shown(t)}')",
])
def test_the_check_finds_a_raw_print(snippet):
    assert raw_in(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "print('done')", "print()", "print(shown(x))", "say(f'{x}')", "click.echo(json.dumps(x))",
    "print('##m ' + json.dumps(x))", "print(__doc__.split('\\n\\n')[1], file=sys.stderr)", "print(f'a {shown(x)}')",
    "click.echo(click.style(shown(x), fg='red'), err=True)", "host.log(text.shown(x))", "print(shown_lines(j, 300, None))",
    "print(render(x))\ndef render(x):\n    return json.dumps(x)", "print(shown(x) if y else 'none')",
])
def test_the_check_passes_escaped_text(snippet):
    assert not raw_in(snippet), snippet


def test_every_print_site_goes_through_rigup_text():
    trees = sources()
    functions = safe_functions(trees)
    found = [line for path, tree in trees.items() for line in raw_prints(path, tree, functions, host_program(path))]
    assert found == [], "text printed raw (through rigup.text.say/shown, or json.dumps for data):\n" + "\n".join(found)


# ----------------------------------------------------------------------------- shown itself
UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}   # controls (C0, C1, ESC, DEL), bidi, separators
HOSTILE = ["\x1b[2J", "\x1b]0;pwned\x07", "\x9b31m", "\r", "\n", "\x00", "\x7f", "\u202e", "\u2066", "\u2028",
           "\u200f", "\ud800", "\\x1b", "é", "漢", "\U0001f600", " "]
texts = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=())),                      # anything, surrogates too
    st.lists(st.sampled_from(HOSTILE) | st.text(max_size=5), max_size=40).map("".join),
    st.builds(lambda part, n: part * n, st.text(min_size=1, max_size=8) | st.sampled_from(HOSTILE), st.integers(0, 900)),
)
limits = st.integers(0, 400)


def check_one_line(text: str, limit: int, out: str) -> None:
    assert all(unicodedata.category(c) not in UNSAFE_CATEGORIES and c.isprintable() for c in out), ascii(out)
    assert len(out) <= limit + len(f"... ({len(text)} more characters)"), (len(out), limit)
    if text.isprintable() and len(text) <= limit:
        assert out == text     # plain text as it is


@settings(max_examples=60, deadline=1000)
@given(texts, limits)
def test_shown_is_one_printable_bounded_line(text, limit):
    check_one_line(text, limit, shown(text, limit))
    check_one_line(text, 200, shown(text))


@settings(max_examples=40, deadline=1000)
@given(st.lists(texts, max_size=8).map("\n".join), st.integers(1, 300))
def test_shown_lines_is_printable_lines(text, limit):
    out = shown_lines(text, limit, None)
    assert out == "" or out.count("\n") == text.count("\n")     # a line of text, a line shown
    for line in out.split("\n"):
        assert all(c.isprintable() for c in line) and len(line) <= limit + len(f"... ({len(text)} more characters)")


@functools.cache
def host_copies() -> dict[str, object]:
    """Each host program that has its own ``shown``: its module."""
    return {path: importlib.import_module(path[:-3].replace("/", ".").removesuffix(".__init__"))
            for path, tree in sources().items()
            if host_program(path) and any(isinstance(n, ast.FunctionDef) and n.name == "shown" for n in tree.body)}


def test_the_host_programs_that_print_have_their_copy():
    assert {"roles/gpu_guard/shipped/guard.py", "roles/metrics/shipped/relay.py", "roles/watchdog/shipped/watchdog.py",
            "roles/burnin/shipped/acceptance.py", "roles/model_fetch/shipped/fetcher.py"} <= set(host_copies()), sorted(host_copies())
    # the check trusts these names: each definition is rigup.text's or a host program's copy tested below
    defined = {f"{path}:{node.name}" for path, tree in sources().items() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name in ESCAPING and path != "rigup/text.py"}
    assert defined == {f"{path}:shown" for path in host_copies()}, defined


@settings(max_examples=60, deadline=1000)
@given(texts, limits)
def test_each_host_programs_shown_is_rigup_texts(text, limit):
    for path, module in host_copies().items():
        assert module.shown(text, limit) == shown(text, limit), path
        assert module.shown(text) == shown(text), path
