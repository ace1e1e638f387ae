"""Issue 61, round 9: host text that reached the operator's terminal raw through an OperationError or
a no-op's line (P1 a build log's tail, C1 the module probe's line, LC1 a ``current``/``previous``
link, L1 a marker's file names) and a marker read without a schema (L2). Each is now read by its
reader into its form, or escaped where the text is made; tests/unit/test_operation_errors.py keeps
the class from coming back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api import OperationError

from rigup.boundary.fields import CONTROL
from rigup.models import first_gguf
from rigup.units import parse_instances
from roles.cmpunlocker.facts import MARK, module_path, parse_unlock_state
from roles.cmpunlocker.steps import verify
from roles.llama_cpp.facts import build_link, parse_state

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2028")


def _raw(text: str) -> bool:
    return any(c in text for c in RAW)


def test_p1_a_failed_jobs_log_tail_is_escaped(monkeypatch):
    """P1: the build log's last lines (a compiler quoting source text) in the OperationError."""
    import rigup.progress as progress

    class Out:
        def __init__(self, lines):
            self.stdout_lines = lines

    class Host:
        name = "h1"

        def run_shell_command(self, command, **kw):
            if command.startswith("tail -n 30"):
                return True, Out([f"cc1: error: {OSC52} \x1b[2J\x1b[31mdone", "second\u2028line\x85"])
            return True, Out(["running=0", "done=0", "line=", "last="])

    monkeypatch.setattr(progress, "host", Host())
    with pytest.raises(OperationError) as e:
        progress.waited("llama.cpp build b1", "rigup-llama-build.service", "/opt/llama.cpp/builds/b1.log", "false",
                        True, 10)
    text = str(e.value)
    print("input: a log line holding OSC 52, CSI 2J, U+2028, U+0085 -> OperationError:", repr(text))
    assert not _raw(text) and "\\x1b]52;c;" in text and "\\u2028" in text
    assert text.splitlines() == ["llama.cpp build b1 failed; last lines of its log (/opt/llama.cpp/builds/b1.log):",
                                 "cc1: error: \\x1b]52;c;ZWNobyBwd25lZA==\\x07 \\x1b[2J\\x1b[31mdone",
                                 "second\\u2028line\\x85"]


def test_c1_the_module_probes_line_is_a_path_or_none():
    """C1: modinfo's line holding an escape sequence reached the unlock's verdict (an OperationError)."""
    bad = f"/lib/modules/6.1/kernel/{OSC52}\x1b[2Jnvidia.ko"
    state = parse_unlock_state([f"{MARK}module", bad, f"{MARK}boot", "b1"])
    _, problems = verify(state["gpus"], state["module"], {"cmpunlocker_module_probe": "modinfo -n nvidia"})
    why = "; ".join(problems)
    print(f"input: module line {bad!r} -> module {state['module']!r}; the verdict: {why!r}")
    assert state["module"] is None and not _raw(why) and "printed no module path" in why
    good = "/lib/modules/6.1.0-26-amd64/updates/cmpunlocker/nvidia.ko"
    assert parse_unlock_state([f"{MARK}module", good])["module"] == good
    assert verify([], good, {"cmpunlocker_module_probe": "x"}) == (False, [])


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_c1_module_path_reads_any_line_as_a_path_of_plain_characters_or_none(line):
    got = module_path(line)
    assert got is None or (got == line and got.startswith("/") and not CONTROL.search(got) and got.isprintable())


def test_lc1_a_current_or_previous_link_is_a_build_or_none():
    """LC1: readlink's text, as it is, in the no-op ``current is ...`` (printed with -v)."""
    link = f"builds/b1{OSC52}\x1b[2J"
    state = parse_state([f"current={link}", f"previous={link}"])
    print(f"input: current and previous -> {link!r}; read: {state['current']!r}, {state['previous']!r}")
    assert state["current"] is None and state["previous"] is None
    for target, want in [("builds/b1-abc", "builds/b1-abc"), ("builds/b8779-0123456789", "builds/b8779-0123456789"),
                         ("/opt/llama.cpp/builds/b1", None), ("builds/../x", None), ("builds/", None),
                         ("builds/a/b", None), ("", None), ("b1", None)]:
        assert parse_state([f"current={target}"])["current"] == want, target


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_lc1_build_link_reads_any_target_as_builds_id_or_none(target):
    got = build_link(target)
    assert got is None or (got == target and got.startswith("builds/") and "/" not in got[7:]
                           and got[7:] not in ("", ".", "..") and got.isprintable())


@pytest.mark.parametrize("marker", [
    '{"files": ["\\u001b]0;owned\\u0007x.bin", "\\u001b[2J"]}',   # L1: a file name holding OSC and CSI
    '{"files": null}', '{"files": [1, 2]}', '{"files": "abc.gguf"}',   # L2: no schema
    '{"files": ["../x.gguf"]}', '{"files": ["a.gguf"], "bytes": "1000"}', '[1]', '{"files": ["a\\u2028b.gguf"]}',
])
def test_l1_l2_a_marker_not_of_its_form_is_no_marker(marker):
    """L1, L2: the model's marker (whoever writes the model's directory writes it) read by
    rigup.boundary.results marker: one not of its form is none (the instance waits for its model),
    so no file name of it is printed raw and no TypeError ends the operation."""
    _, inst = parse_instances(["@@ g", "marker=" + marker, "marker.m=" + marker])
    print(f"input: marker {marker!r} -> {inst['g']['marker']!r}, markers {inst['g']['markers']!r}")
    assert inst["g"]["marker"] is None and inst["g"]["markers"] == {"m": None}


def test_a_marker_of_its_form_is_kept_and_its_files_are_plain():
    text = '{"files": ["config.json", "m/model-00001-of-00002.gguf", "m/model-00002-of-00002.gguf"], ' \
           '"repo": "org/m", "revision": "abc", "bytes": 1000, "schema": 1}'
    _, inst = parse_instances(["@@ g", "marker=" + text])
    marker = inst["g"]["marker"]
    print("read:", marker)
    assert marker["files"][1] == "m/model-00001-of-00002.gguf" and marker["revision"] == "abc"
    assert first_gguf(marker["files"]) == "m/model-00001-of-00002.gguf"
    _, inst = parse_instances(["@@ g", 'marker={"files": ["README.md"]}'])   # no GGUF: the error names plain names
    assert first_gguf(inst["g"]["marker"]["files"]) is None and ", ".join(inst["g"]["marker"]["files"]) == "README.md"
