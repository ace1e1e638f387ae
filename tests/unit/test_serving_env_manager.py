"""tune.py's ServingEnv reads the manager's environment (issue 61, round 9 SE2): systemd gives every
service it starts the variables of ``systemctl show-environment`` (``systemctl set-environment
LD_PRELOAD=/x.so``, system.conf's DefaultEnvironment=), which ``systemctl show -p Environment UNIT``
never lists; one the unit does not set itself, and not the manager's own (PATH, the locale), is named
and the sweep refused, as a drop-in's variable rigup does not write is. On this machine's shell,
with a ``systemctl`` first on PATH printing what systemd prints."""

import subprocess

import pytest
from hypothesis import given, strategies as st

from rigup import tuning
from tests.unit.test_round8_tune import OWN, SHA, CUDA, UNIT_TEXT, dropin, shown


def served(tmp_path, manager: str) -> dict:
    (tmp_path / "rigup.conf").write_text(dropin(unit_sha=SHA))
    (tmp_path / "cuda.env").write_text(CUDA)
    (tmp_path / "unit").write_text(UNIT_TEXT)
    (tmp_path / "show").write_text(shown())
    (tmp_path / "manager").write_text(manager)
    (tmp_path / "systemctl").write_text('#!/bin/sh\ncase "$1" in show) cat "$(dirname "$0")/show";; '
                                        'show-environment) cat "$(dirname "$0")/manager";; *) exit 1;; esac\n')
    (tmp_path / "systemctl").chmod(0o755)
    fact = tuning.ServingEnv()
    command = fact.command("g")
    for real, scratch in ((OWN, "rigup.conf"), ("/etc/rigup/cuda.env", "cuda.env"), (tuning.UNIT_FILE, "unit")):
        command = command.replace(real, str(tmp_path / scratch))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout.splitlines()
    return fact.process(out)


HOST = "LANG=C.UTF-8\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin\n"


@pytest.mark.parametrize("extra, named", [
    ("LD_PRELOAD=/x.so\n", "LD_PRELOAD=/x.so"),
    ("\"PYTHONPATH=/home/eve lib\"\n", "PYTHONPATH=/home/eve lib"),
    ("$'GGML_X=a\\nb'\n", "GGML_X="),
    ("not a variable\n", "does not read"),
])
def test_a_manager_variable_the_unit_does_not_set_is_named(tmp_path, extra, named):
    got = served(tmp_path, HOST + extra)
    print(f"\nsystemctl show-environment adds {extra.strip()!r}: {got.get('error')}")
    assert got["error"].where == "rigup-llama@g.service" and named in got["error"].why
    assert "systemd gives every service" in got["error"].why or "does not read" in got["error"].why


def test_the_managers_own_and_what_the_unit_sets_itself_pass(tmp_path):
    got = served(tmp_path, HOST + "LC_ALL=C\nCUDA_VISIBLE_DEVICES=3\nHOME=/root\n")   # the unit sets those
    print(f"\nthe manager's PATH, locale, and variables the unit sets itself: {got.get('error')}")
    assert "error" not in got


@given(st.lists(st.text(max_size=40), max_size=6), st.sets(st.sampled_from(["A", "PATH", "LD_PRELOAD"])))
def test_any_manager_lines_are_read_or_named_never_raised(lines, unit):
    said = tuning._manager(lines, unit)
    assert len(said) <= len(lines)
    assert not any(line.startswith("LD_PRELOAD=") for line in lines) or "LD_PRELOAD" in unit or said
