"""Every python3 rigup starts on a host runs isolated from the site directories (issue 61, round 7's
R1): ``python3 -s -E -S`` (no user site, no PYTHON* variable, no site module: no .pth file runs at
start and no dist-packages module is found), never ``-I`` (since 3.11 it implies -P, which drops the
program's own directory, where rigup_throughput.py and rigup_xid.py are). Debian's /usr/local is
2775 root:staff: a staff user's .pth in /usr/local/lib/python3.X/dist-packages ran as root at every
watchdog tick. Read from the sources, so that a new unit, command or program cannot forget:

- each Exec*= line of templates/*.j2 that runs python3;
- each string of rigup/, roles/ and the plays that runs python3 (a unit's systemd-run, an
  operation's shell command), but for the places listed in PENDING with why;
- each host program run by its own path (a unit's or an operation's command, its shebang's
  interpreter line): ``#!/usr/bin/python3 -sES`` (the kernel passes one argument: -s -E -S at once).
"""

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "# rigup: runs on hosts"
SHEBANG = "#!/usr/bin/python3 -sES"
# python3 run as a command: its options, then its program (a path, a placeholder, a quoted word, -c
# or - for standard input); "command -v python3" and prose are no such command
RUNS = re.compile(r"(?<![\w/.-])(?:/usr/bin/)?python3(?:\.\d+)?(?P<flags>(?:[ \t]+-[A-Za-z]+)*)[ \t]+(?:-[ \t]|[/{$'\"])")
# places whose python3 is not isolated yet, each another fixer's file (drop the entry once it is):
# (file, the text around it) -> why it waits
PENDING: dict = {}
SHEBANG_PENDING: dict = {}


def unisolated(text: str) -> list[str]:
    """Each python3 command in ``text`` that lacks one of -s, -E, -S."""
    def given(flags: str) -> set[str]:
        letters = set("".join(f[1:] for f in flags.split()))
        return letters | ({"s", "E"} if "I" in letters else set())   # -I: -E, -s and no script directory
    return [m.group(0) for m in RUNS.finditer(text) if not {"s", "E", "S"} <= given(m.group("flags"))]


def test_the_pattern_finds_python3_commands_and_not_prose():
    assert unisolated("ExecStart=/usr/bin/python3 {{ script }} check") == ["/usr/bin/python3 {"]
    assert unisolated("a; python3 -c 'import x'") and unisolated("python3 - probe <<EOF") and unisolated("python3 /x")
    assert unisolated("python3 -u /x") and unisolated("python3 -I /x")
    assert not unisolated("/usr/bin/python3 -s -E -S {{ script }}") and not unisolated("python3 -sES -u /x")
    assert not unisolated("command -v python3 >/dev/null") and not unisolated("python3 is missing on the host; fix")


def test_each_unit_template_runs_python3_isolated():
    found = {}
    for path in sorted((ROOT / "templates").glob("*.j2")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*Exec\w*=", line) and unisolated(line):
                found[f"{path.name}:{n}"] = line
    checked = [p.name for p in (ROOT / "templates").glob("*.j2") if "python3" in p.read_text()]
    print(sorted(checked))
    assert len(checked) >= 5 and found == {}, found


def strings(tree: ast.Module):
    """(line, text) of each string of the module but its docstrings: an f-string with {} for each
    placeholder (adjacent f-strings are one)."""
    docs, parts = set(), set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            parts |= {id(v) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | parts:
            yield node.lineno, node.value


def test_each_python3_command_rigup_runs_on_a_host_is_isolated():
    files = [p for d in ("rigup", "roles") for p in sorted((ROOT / d).rglob("*.py"))] + sorted(ROOT.glob("*.py"))
    found, pending = {}, set()
    for path in files:
        name = str(path.relative_to(ROOT))
        for line, text in strings(ast.parse(path.read_text())):
            for command in unisolated(text):
                waits = [k for k in PENDING if k[0] == name and k[1] in text]
                if waits:
                    pending |= set(waits)
                else:
                    found[f"{name}:{line}"] = command
    assert found == {}, f"python3 without -s -E -S (or list it in PENDING with why): {found}"
    assert pending == set(PENDING), f"isolated now: drop from PENDING {set(PENDING) - pending}"


def test_each_host_program_run_by_its_path_starts_isolated():
    programs = sorted(str(p.relative_to(ROOT)) for d in ("rigup", "roles") for p in (ROOT / d).rglob("*.py")
                      if MARK in "".join(p.read_text().splitlines(keepends=True)[:3]))
    lines = {p: (ROOT / p).read_text().splitlines()[0] for p in programs}
    wrong = {p: first for p, first in lines.items()
             if first.startswith("#!") and first != SHEBANG and p not in SHEBANG_PENDING}
    assert wrong == {}, wrong
    assert {p for p in SHEBANG_PENDING if lines[p] != SHEBANG} == set(SHEBANG_PENDING), "isolated now: drop it"
    assert sum(first == SHEBANG for first in lines.values()) >= 5


# the programs rigup's units run, as their roles install them (the name, the files beside it), with
# arguments that start them and end at once (some on a configuration this machine lacks): each
# imports what it needs under -s -E -S
INSTALLED = {
    "rigup-watchdog": ("roles/watchdog/watchdog.py", {"rigup_throughput.py": "rigup/throughput.py"}, ["--help"]),
    "rigup-metrics-relay": ("roles/metrics/relay.py", {"rigup_throughput.py": "rigup/throughput.py"}, ["--help"]),
    "rigup-gpu-guard": ("roles/gpu_guard/guard.py", {"rigup_xid.py": "rigup/gpu/xid.py"}, ["--config", "/none", "check"]),
    "rigup-fetch": ("roles/model_fetch/fetcher.py", {}, ["--help"]),
    "rigup-burnin": ("roles/burnin/acceptance.py", {"rigup_xid.py": "rigup/gpu/xid.py"}, ["--help"]),
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
