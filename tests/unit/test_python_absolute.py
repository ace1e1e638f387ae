"""Every python3 rigup starts on a host is /usr/bin/python3, by that path (issue 61, round 8): root's
PATH finds /usr/local/bin first, and Debian's /usr/local/bin is 2775 root:staff, so a bare ``python3``
in a unit, a template, an operation's shell command or an argv ran a staff user's python3 as root.
Read from the sources as tests/unit/test_python_isolated.py reads them (its pattern of a python3
command, its strings and argvs of rigup/, roles/ and the plays, the templates), and the defaults of
every variable that names an interpreter (``vllm_python``)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.unit.test_python_isolated import RUNS, parsed, python_files, strings

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"


def bare(text: str) -> list[str]:
    """Each python3 command in ``text`` whose interpreter is not /usr/bin/python3 by that path."""
    return [m.group(0) for m in RUNS.finditer(text) if not m.group(0).startswith(PYTHON + " ")]


def test_the_pattern_finds_a_bare_python3_and_not_the_absolute_one():
    found = {t: bare(t) for t in ("python3 -s -E -S x.py", "timeout -k 10 60 python3 -s -E -S {}",
                                  "runuser -u u -- python3 -sES /d/rigup_tune.py", "env A=1 python3 -s -E -S -u {} fetch",
                                  "python3 -s -E -S - probe X <<'EOF'", "/usr/bin/python3 -s -E -S -c {}",
                                  "[ -x /usr/bin/python3 ] || exit", "ExecStart=/usr/bin/python3 -sES {{ script }}")}
    for text, got in found.items():
        print(f"{text!r}: {got}")
    assert [t for t, got in found.items() if got] == list(found)[:5]


def test_each_python3_command_in_the_code_is_usr_bin_python3():
    found = {f"{p.relative_to(ROOT)}:{line}": command for p in python_files() for line, text in strings(parsed(p))
             for command in bare(text)}
    print(f"bare python3 commands in rigup/, roles/ and the plays: {found}")
    assert found == {}


def test_each_python3_command_in_a_template_is_usr_bin_python3():
    found, checked = {}, []
    for path in sorted((ROOT / "templates").glob("*.j2")):
        text = path.read_text()
        checked += [path.name] if RUNS.search(text) else []
        found.update({f"{path.name}:{n}": line.strip() for n, line in enumerate(text.splitlines(), 1) if bare(line)})
    print(f"templates that run python3: {checked}; bare: {found}")
    assert len(checked) >= 5 and found == {}


def test_each_variable_naming_a_python_defaults_to_an_absolute_path():
    """A template's ``{{ python | q }}`` (vllm-install.sh.j2) is the variable's value: its default is
    /usr/bin/python3 (an operator may name another interpreter by its path)."""
    defaults = {}
    for path in sorted((ROOT / "roles").glob("*/defaults.yml")) + sorted((ROOT / "group_vars").glob("*.yml")):
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if re.fullmatch(r"(?:\w+_)?python3?", key):
                defaults[f"{path.relative_to(ROOT)} {key}"] = value
    print(defaults)
    assert defaults and all(v is None or str(v).startswith("/") for v in defaults.values()), defaults
    assert defaults["roles/vllm/defaults.yml vllm_python"] == PYTHON
