"""Every fact's ``process()`` (each FactBase subclass of rigup/ and roles/), given whatever a host
prints, returns or raises FactProcessError, never another exception: pyinfra catches that one for
the host alone, while any other (a RecursionError out of a marker of a million '[', a TypeError out
of a name that is a list) leaves the deploy file's load and ends the run for every host (issue 61,
round 1 E11 and E13: the class, held here for each fact there is and each one added later)."""

import ast
import importlib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100000
# the pieces of host output every fact reads by: sections, key=value, JSON a host wrote, numbers in other digits
PIECES = ["", "=", "@@ x", "@@ ", "marker=", "marker.x=", "progress=", "running=1", "units=", "backends=", "stamp=",
          "smoke=", "build=", "##rigup-model ", "##rigup-systemd 1", "##sha", "{", "}", "[", "]", DEEP, '{"a": 1, "a": 2}',
          '{"name": [1]}', "[1]", '"x"', "NaN", "1e400", "\x00", "\udcff", "\u0663", "-1", "9" * 30, ":", " ", "\t", "x",
          "a b c", "[section]", "---", "# x", "ActiveState=x", "\x1b]0;x\x07",
          # whole lines seen to end a run: a marker nested a million deep (E11), a probe's name a list (E13)
          "marker=" + DEEP, "marker.x=" + DEEP, "progress=" + DEEP, "stamp=" + DEEP, "smoke=" + DEEP,
          "##rigup-model " + DEEP, "backend=x " + DEEP, '##rigup-model {"name": [1], "progress": null}', "marker=[1]", 'marker="x"']
LINE = st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join)
# what a fact's command() sets on the instance that its process() reads (as pyinfra calls both on one)
SETUP = {"FileStates": {"paths": ["/a", "/b"]}, "ServiceStates": {"units": ["a.service", "b.service"]}}


def facts() -> list[type]:
    found = []
    for path in sorted([*(ROOT / "rigup").rglob("*.py"), *(ROOT / "roles").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(isinstance(f, ast.FunctionDef) and f.name == "process" for f in n.body)]
        if names:
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
            found += [c for c in (getattr(module, n) for n in names) if issubclass(c, FactBase)]
    return found


FACTS = facts()
# facts known to raise, each with why it is not fixed here (the class's count only goes down)
KNOWN = {"roles.balancer.facts.BalancerState": "a backends file nested past Python's stack (backend=NAME [[[...) raises "
                                               "RecursionError (it catches ValueError only): roles/balancer is another "
                                               "helper's (round 1 of issue 61), reported to the lead"}


def instance(cls: type) -> FactBase:
    fact = cls()
    if cls.__name__ == "Batch":   # its parts' marks: two facts of its own, read as it reads them
        from rigup.files import FileStates
        from rigup.services import ServiceStates
        fact.command([(FileStates, {"paths": ["/a"]}), (ServiceStates, {"units": ["a.service"]})])
    for key, value in SETUP.get(cls.__name__, {}).items():
        setattr(fact, key, value)
    return fact


def test_every_fact_is_found():
    assert len(FACTS) >= 30, [f.__name__ for f in FACTS]


@pytest.mark.parametrize("cls", [pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN[f"{c.__module__}.{c.__name__}"]))
                                 if f"{c.__module__}.{c.__name__}" in KNOWN else c for c in FACTS],
                         ids=lambda c: f"{c.__module__}.{c.__name__}")
@settings(max_examples=80, deadline=None)
@given(st.lists(LINE, max_size=8), st.data())
def test_a_facts_process_raises_nothing_but_fact_process_error(cls, lines, data):
    fact = instance(cls)
    if cls.__name__ == "Batch":   # a host that echoes the batch's mark (it ran the command: it knows it)
        lines = [data.draw(st.sampled_from(["", fact.mark + " ", fact.mark + " rc ", fact.mark + " 0 "])) + ln
                 for ln in lines]
    try:
        fact.process(lines)
    except FactProcessError:
        pass
