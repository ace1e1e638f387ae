"""rigup/state.py's Batch: several facts' commands in one shell, each fact's own process on its part."""

import subprocess

from pyinfra.api import FactBase

from rigup.files import FileStates
from rigup.state import Batch


def run(command) -> list[str]:
    text = command if isinstance(command, str) else command.get_raw_value()
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True).stdout.splitlines()


def shell_fact(command: str, requires: str | None = None, default=None) -> type[FactBase]:
    """A fact running ``command`` (when ``requires`` is installed) whose value is its output lines."""
    return type("ShellFact", (FactBase,), {
        "command": lambda self: command, "requires_command": lambda self: requires,
        "process": lambda self, output: output, "default": staticmethod(lambda: default)})


Fails = shell_fact("echo half; false")
NeedsSh = shell_fact("(echo sub)", requires="sh")
NeedsAbsent = shell_fact("rigup-no-such-command", requires="rigup-no-such-command")
HereDocument = shell_fact("cat <<'EOF'\none\nEOF")
Empty = shell_fact("true", default={"empty": True})


def test_a_batch_gives_each_fact_what_it_gives_alone(tmp_path):
    (tmp_path / "f").write_text("x")
    paths = [str(tmp_path / "f"), str(tmp_path), str(tmp_path / "missing")]
    alone = FileStates()
    expected = alone.process(run(alone.command(paths=paths)))
    batch = Batch()
    reads = [(FileStates, {"paths": paths}), (Fails, {}), (NeedsAbsent, {}), (Empty, {}),
             (FileStates, {"paths": paths[:1]}), (HereDocument, {}), (NeedsSh, {})]
    values = batch.process(run(batch.command(reads=reads)))
    print(values)
    # a failed command and a missing required command are left out: the caller reads those alone
    assert sorted(values) == [0, 3, 4, 5, 6]
    assert values[0] == expected and values[0][paths[2]] is None and values[0][paths[1]]["kind"] == "d"
    assert values[3] == {"empty": True}
    assert values[4] == {paths[0]: expected[paths[0]]}
    assert values[5] == ["one"]     # a here-document's end stays on a line of its own
    assert values[6] == ["sub"]     # "( (" is two subshells in any sh, never bash's "(("


def test_a_line_like_the_mark_from_a_fact_does_not_split_it(tmp_path):
    """Each batch has a mark of its own: a fact's output cannot end another fact's part."""
    marks = {Batch().command(reads=[(Empty, {})]).get_raw_value().split("'")[1].split()[0] for _ in range(3)}
    assert len(marks) == 3
