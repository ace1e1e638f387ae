"""rigup/state.py's Batch: several facts' commands in one shell, each fact's own process on its part."""

import subprocess

from pyinfra.api import FactBase

from rigup.files import FileStates
from rigup.state import Batch


def run(command, env=None) -> list[str]:
    text = command if isinstance(command, str) else command.get_raw_value()
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True, env=env).stdout.splitlines()


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
    command = batch.command(reads=reads).get_raw_value()
    values = batch.process(run(command))
    print(values)
    # the two FileStates reads (merge_by: paths) are one command over the union of their paths
    assert command.count("for p in ") == 1
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


def test_merged_reads_get_their_own_items_and_others_stay_apart(tmp_path):
    """ServiceStates (merge_by: units) of three roles in one systemctl show; a fact without
    merge_by is never merged, and each read gets only the units it named."""
    from rigup.services import ServiceStates

    batch = Batch()
    reads = [(ServiceStates, {"units": ["a.service"]}), (Empty, {}), (ServiceStates, {"units": ["b.timer", "a.service"]}),
             (Empty, {}), (ServiceStates, {"units": ["c.service"]})]
    command = batch.command(reads=reads).get_raw_value()
    assert command.count("systemctl show") == 1 and "a.service b.timer c.service" in command
    mark = command.split("'")[1].split()[0]
    output = [f"{mark} 0", "active enabled", "inactive disabled", " ", f"{mark} rc 0",
              f"{mark} 1", f"{mark} rc 0", f"{mark} 2", f"{mark} rc 0"]
    values = batch.process(output)
    assert values[0] == {"a.service": ("active", "enabled")}
    assert values[2] == {"b.timer": ("inactive", "disabled"), "a.service": ("active", "enabled")}
    assert values[4] == {"c.service": ("", "")}
    assert values[1] == values[3] == {"empty": True}


Slow = shell_fact("sleep 0.4; echo slow")


def test_the_parts_run_side_by_side_and_print_in_order(tmp_path):
    """Three 0.4 s reads take about 0.4 s, not 1.2; without a temporary directory (mktemp fails)
    they run one after another, with the same values."""
    import os
    import time

    reads = [(Slow, {}), (HereDocument, {}), (Slow, {}), (Fails, {}), (Slow, {})]
    batch = Batch()
    command = batch.command(reads=reads)
    (tmp_path / "tmp").mkdir()
    start = time.monotonic()
    values = batch.process(run(command, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")}))
    side_by_side = time.monotonic() - start
    batch = Batch()
    command = batch.command(reads=reads)
    start = time.monotonic()
    alone = batch.process(run(command, env={**os.environ, "TMPDIR": str(tmp_path / "no-such-dir")}))
    one_by_one = time.monotonic() - start
    print(f"3 reads of 0.4 s: {side_by_side:.2f} s side by side, {one_by_one:.2f} s one after another")
    assert values == alone == {0: ["slow"], 1: ["one"], 2: ["slow"], 4: ["slow"]}
    assert side_by_side < 1.0 <= one_by_one
    assert not list((tmp_path / "tmp").iterdir())    # its directory removed


def test_a_part_without_its_rc_line_is_read_alone():
    """A part whose last line could not be written (its file on a full /tmp) gives no value."""
    batch = Batch()
    command = batch.command(reads=[(Empty, {}), (HereDocument, {})]).get_raw_value()
    mark = command.split("'")[1].split()[0]
    assert batch.process([f"{mark} 0", f"{mark} 1", "one", f"{mark} rc 0"]) == {1: ["one"]}
