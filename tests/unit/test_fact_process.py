"""No exception escapes from a fact's ``process()`` (issue 61, the class of round 2's C1, C3, H1,
H3): a fact is processed in the play's load-time code, where pyinfra ends the run for every host on
any exception, so a host that prints something unexpected must fail alone (its fact returns a
refusal, an error or nothing), never the run.

Every ``FactBase`` of rigup/ and roles/ is found in the source (a new fact is held to it without
being listed), and its ``process`` is given hostile output: JSON nested deeper than Python's stack,
a shell line with an unclosed quote, digits that are not ASCII (``²``, ``٣``), NaN and 1e400, a key
twice, each alone and after each section mark its module prints (``##marker ``, ``@@ `` ...)."""

import importlib
import inspect
import re
from pathlib import Path

import pytest
from pyinfra.api import FactBase

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = ["[" * 5000, '{"a": ' * 3000, '"', "a 'b", "a \"b", "\u00b2", "\u0663", "", " ", "\x00", "-- ", "NaN",
           "1e400", "[1, 2]", '{"a": 1, "a": 2}', "x=y=z", '"A=1', "\t", ":::", "0079", "-1", "9" * 30, "true", "null",
           '"x"', "\x1b]0;x\x07", "\u2028", "1_0"]
# a section mark a fact's command prints before a part of its output (##marker PATH, @@ NAME,
# ##rigup-cmp:stamp ...), in the source once each {CONSTANT} of a module-level string is put in
MARK = re.compile(r"""(?:##|@@|==)[A-Za-z0-9_.:-]*[ =]?""")
KEY = re.compile(r"""echo \\?["']?([A-Za-z_][A-Za-z0-9_.]*=)""")   # a key=value line: echo backend=...
CONSTANT = re.compile(r"""^([A-Z_][A-Z0-9_]*) = ['"]([^'"\n]*)['"]""", re.M)


def marks(path: Path) -> list[str]:
    """The section marks of ``path``'s facts (:data:`MARK`), and no mark."""
    text = path.read_text()
    for name, value in CONSTANT.findall(text):
        text = text.replace("{" + name + "}", value)
    return sorted(set(MARK.findall(text)) | set(KEY.findall(text))) + [""]

# facts whose process() reads what their command() set (the paths or units asked for): pyinfra calls
# command() first on the same object, so they are not called here without it
NEEDS_COMMAND = {"rigup/files.py:FileStates", "rigup/services.py:ServiceStates", "rigup/state.py:Batch"}
# known not to hold yet: (fact -> why), each to be fixed in its own file (the count only goes down)
KNOWN = {
}


def facts() -> dict[str, tuple[type, Path]]:
    """Every FactBase subclass defined in rigup/ and roles/, by ``path:name``."""
    found = {}
    for base in ("rigup", "roles", "plays", "shipped"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if "FactBase" not in path.read_text():
                continue
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
            for name, cls in vars(module).items():
                if inspect.isclass(cls) and issubclass(cls, FactBase) and cls is not FactBase and cls.__module__ == module.__name__:
                    found[f"{path.relative_to(ROOT)}:{name}"] = (cls, path)
    return found


FACTS = facts()


def test_the_facts_are_found():
    assert len(FACTS) >= 30 and "plays/tuning.py:ServingEnv" in FACTS and "plays/bench.py:Serving" in FACTS
    assert NEEDS_COMMAND | set(KNOWN) <= set(FACTS), "an entry of NEEDS_COMMAND or KNOWN names no fact"


@pytest.mark.parametrize("name", sorted(set(FACTS) - NEEDS_COMMAND))
def test_no_exception_escapes_a_facts_process(name):
    cls, path = FACTS[name]
    raised = None
    for mark in marks(path):
        for line in HOSTILE:
            for lines in ([mark + line], [mark, line], [mark + "x", line], [mark + "x " + line], [mark + line, mark + line]):
                try:
                    cls().process(lines)
                except Exception as e:  # noqa: BLE001 (any exception is the finding)
                    raised = raised or f"{lines!r:.80}: {type(e).__name__}: {str(e)[:120]}"
    if name in KNOWN:
        print(f"\n{name}: known ({KNOWN[name]}); now: {raised or 'holds: remove it from KNOWN'}")
        return
    assert raised is None, f"{name}.process raised on {raised}"



def _commanded(name: str) -> FactBase:
    """A fact of NEEDS_COMMAND as pyinfra holds it: its command() called first on the same object."""
    from rigup.files import FileStates
    from rigup.services import ServiceStates

    fact = FACTS[name][0]()
    args = {"rigup/files.py:FileStates": {"paths": ["/a", "/b"]}, "rigup/services.py:ServiceStates": {"units": ["a", "b"]},
            "rigup/state.py:Batch": {"reads": [(FileStates, {"paths": ["/a"]}), (ServiceStates, {"units": ["a"]})]}}[name]
    fact.command(**args)
    return fact


@pytest.mark.parametrize("name", sorted(NEEDS_COMMAND))
def test_no_exception_escapes_a_facts_process_after_its_command(name):
    """The facts that read what their command() set, given it: rigup/state.py Batch's lines too,
    with its mark (the host ran the command, so it knows it) before another word, an rc outside a
    part, a part's number out of range (round 1 of issue 61: IndexError, ValueError, TypeError
    escaped Batch.process)."""
    raised = None
    fact = _commanded(name)   # one object: Batch's mark is drawn at random by its command()
    mark = fact.mark + " " if name.endswith("Batch") else ""
    for line in HOSTILE:
        for lines in ([line], [mark + line], [mark, line], [mark + "rc " + line], [mark + "0", mark + "rc " + line],
                      [mark + "7", line, mark + "rc 0"], [mark + "-1"], [mark + "rc"], [mark + "0 " + line, mark + "rc 0"]):
            try:
                fact.process(lines)
            except Exception as e:  # noqa: BLE001 (any exception is the finding)
                raised = raised or f"{lines!r:.80}: {type(e).__name__}: {str(e)[:120]}"
    assert raised is None, f"{name}.process raised on {raised}"
