"""rigup-burnin's own records file and the files it writes (round 3 of issue 61: H1, H4, H5): a
records file that does not read is refused, named, and never written over (its quarantines stay
on the host); every file it writes goes through its copy of the host programs' ``replace`` (a
link planted at any temp name is never followed); a malformed ``--expect-mib`` is a usage error."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from roles.burnin.shipped import acceptance

PROGRAM = acceptance.__file__
U = [f"GPU-{i:08d}-0000-0000-0000-000000000001" for i in range(2)]
FAILED = {U[0]: {"passed": False, "failed": ["VRAM: 3 mismatched words"]}, U[1]: {"passed": True}}


def burnin(*argv):
    return subprocess.run([sys.executable, PROGRAM, *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text", [json.dumps(FAILED) + "\n,", json.dumps(FAILED)[:-3], '{"a": NaN}',
                                  '{"%s": {"passed": true}, "%s": {"passed": false}}' % (U[0], U[0]),
                                  "[1, 2]", '{"%s": [1]}' % U[0], "\udcff" * 3,
                                  # rerun3's NB4: 1e400 is JSON that parses to inf (NaN was refused)
                                  '{"%s": {"passed": false, "failed": ["x"], "seconds": 1e400}}' % U[0],
                                  # NB7, NB8: a clearing that is no clearing, a passed that is text
                                  '{"%s": {"passed": false, "failed": ["x"], "cleared": "no"}}' % U[0],
                                  '{"%s": {"passed": "false", "failed": ["x"]}}' % U[0],
                                  # rerun1's N46, N47: a status that ended in a traceback
                                  '{"%s": {"passed": false, "failed": [1, 2]}}' % U[0],
                                  '{"%s": {"passed": true, "figures": [1]}}' % U[0],
                                  '{"%s": {"passed": true, "level": []}}' % U[0]])
def test_a_records_file_that_does_not_read_is_refused_named_and_left_as_it_is(tmp_path, text):
    """H1: one stray byte after the JSON read as {}, and ``clear`` then erased every quarantine."""
    res = tmp_path / "burnin.json"
    res.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = res.read_bytes()
    with pytest.raises(acceptance.Unreadable, match=str(res)):
        acceptance.load(str(res))
    for argv in (["clear", U[1]], ["clear", "all"], ["status"], ["run", "--cards", U[1]]):
        done = burnin(*argv, "--results", str(res), *(["--metrics", str(tmp_path / "m.prom")] if argv[0] != "status" else []))
        assert done.returncode == 2 and str(res) in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
        assert res.read_bytes() == before and not (tmp_path / "m.prom").exists()
    print(done.stderr.strip())


def test_no_file_or_an_empty_one_is_no_records_yet(tmp_path):
    assert acceptance.load(str(tmp_path / "none.json")) == {}
    (tmp_path / "empty.json").write_text("\n")
    assert acceptance.load(str(tmp_path / "empty.json")) == {}
    (tmp_path / "good.json").write_text(json.dumps(FAILED))
    assert acceptance.load(str(tmp_path / "good.json")) == FAILED
    done = burnin("clear", U[0], "--results", str(tmp_path / "good.json"), "--metrics", str(tmp_path / "m.prom"))
    assert done.returncode == 0 and acceptance.load(str(tmp_path / "good.json"))[U[0]]["cleared"]["by"] == "the operator"


def test_the_metrics_never_follow_a_link_planted_at_a_temp_name(tmp_path):
    """H4: rigup_burnin.prom was written through ``PATH.PID.tmp`` (the pid is predictable) in a
    directory the node exporter's package made; now a random dot-name opened O_EXCL|O_NOFOLLOW."""
    d = tmp_path / "node-exporter"
    d.mkdir()
    victim = tmp_path / "victim.conf"
    victim.write_text("root's file\n")
    target = d / "rigup_burnin.prom"
    for planted in (f"{target.name}.{os.getpid()}.tmp", f".{target.name}.{os.getpid()}.tmp"):
        os.symlink(victim, d / planted)
    acceptance.write_metrics(str(target), FAILED)
    acceptance.save(str(d / "burnin.json"), FAILED)
    acceptance.write_json(str(d / "run.json"), FAILED)
    assert victim.read_text() == "root's file\n"
    assert "rigup_gpu_quarantined" in target.read_text() and oct(target.stat().st_mode & 0o777) == "0o644"
    assert json.loads((d / "burnin.json").read_text()) == FAILED == json.loads((d / "run.json").read_text())


@pytest.mark.parametrize("value", ["GPU-1=lots", "GPU-1=٣", "GPU-1=²", "GPU-1", "=5", "GPU-1=-5", "GPU-1=1e3"])
def test_a_malformed_expect_mib_is_a_usage_error_naming_the_option(tmp_path, value):
    """H5: ``--expect-mib GPU-1=lots`` ended in a ValueError traceback."""
    done = burnin("run", "--cards", "GPU-1", "--expect-mib", value, "--results", str(tmp_path / "r.json"))
    assert done.returncode == 2 and "--expect-mib" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert acceptance.expected_mib("GPU-1=81920,GPU-2=40960") == {"GPU-1": 81920, "GPU-2": 40960}
    assert acceptance.expected_mib("") == {}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=10)


@settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=120), JSON.map(json.dumps),
                      st.sampled_from(["[" * 100000, '{"a": Infinity}', "\ufeff{}", "{}" * 3, "9" * 5000])))
def test_any_records_file_is_records_or_unreadable_naming_it(tmp_path, text):
    """The program's own reader (``load``) under any text: a mapping of card ids to mappings, or
    :class:`acceptance.Unreadable` naming the file; never another exception, never {} for a file
    that holds something else."""
    path = tmp_path / "burnin.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        got = acceptance.load(str(path))
    except acceptance.Unreadable as e:
        assert str(path) in str(e)
        return
    assert isinstance(got, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in got.items())
    assert got or not text.strip() or json.loads(text) == {}


def test_status_reads_a_figure_it_keeps_untyped_of_another_form_without_a_traceback(tmp_path):
    """rerun1's N47 past the reader: ``gemm``, ``power`` or a section of ``figures`` that is no
    mapping (load keeps what it does not type) is left out of status's line, not a traceback."""
    rec = {"passed": True, "level": "standard", "figures": {"vram": [1], "soak": "x"}, "gemm": [2], "power": 3,
           "flagged": 4}
    (tmp_path / "burnin.json").write_text(json.dumps({U[0]: rec}))
    done = burnin("status", "--results", str(tmp_path / "burnin.json"))
    assert done.returncode == 0 and "passed in None s" in done.stdout, done.stderr


def test_the_records_rules_this_program_carries_are_the_controllers():
    """The constants of the rules both readers hold (rigup/boundary/burnin.py and this program's copy)."""
    from rigup.boundary import burnin as controller
    from rigup.boundary.fields import CONTROL, ID
    assert (acceptance.RECORDS_SCHEMA, acceptance.MAX_CARDS, acceptance.MAX_DEPTH, acceptance.TEXT_MAX,
            acceptance.AT_MAX) == (controller.SCHEMA, controller.MAX_CARDS, controller.MAX_DEPTH, controller.TEXT_MAX,
                                   controller.AT_MAX)
    assert tuple(acceptance.LEVELS) == controller.LEVELS
    assert acceptance.CARD_ID.pattern == ID.pattern and acceptance.CONTROL.pattern == CONTROL.pattern


# a record's fields as either reader types them: values of each kind, no text that reads as a number
# (the controller's number reader takes "12" too; this program, which never writes one, refuses it)
WORDS = st.text(alphabet="ab -\n\x07", max_size=6)
VALUE = st.none() | st.booleans() | st.integers(-3, 1 << 64) | st.floats(allow_nan=False) | WORDS \
    | st.lists(WORDS | st.integers(-3, 3), max_size=2) | st.dictionaries(st.sampled_from(["at", "by", "z"]),
                                                                      st.none() | WORDS | st.integers(-3, 1 << 40), max_size=2)
FIELDS = ("schema", "passed", "failed", "level", "at", "seconds", "index", "bus_id", "name", "key", "figures", "cleared")


@settings(max_examples=400, deadline=1000)
@given(st.fixed_dictionaries({"passed": st.booleans() | VALUE}, optional={f: VALUE | st.sampled_from(["standard", 1, 2, "00000000:4E:00.0", True])
                                           for f in FIELDS if f != "passed"}),
       st.sampled_from([U[0], "../x", ""]))
def test_a_record_reads_here_exactly_when_the_controller_reads_it_and_is_quarantined_alike(rec, uuid):
    """rerun3's NB7 as a class: rigup-burnin's reader (``record_fault``, with load's shape) and the
    controller's (rigup/boundary/burnin.py) read the same records and refuse the same ones; where
    both read, ``quarantined`` (one rule, the GPU guard's copy too) says the same of each."""
    from rigup.boundary import Unreadable, burnin as controller
    from roles.gpu_guard.shipped import guard
    text = json.dumps({uuid: rec})
    try:
        theirs = controller.records(text, "h:f")
    except Unreadable:
        theirs = None
    fault = "not a card id" if not acceptance.CARD_ID.fullmatch(uuid) else acceptance.record_fault(rec)
    assert (fault is None) == (theirs is not None), (fault, rec)
    if theirs is not None:
        typed = theirs.cards.get(uuid)
        assert typed is None or acceptance.quarantined(typed) == acceptance.quarantined(rec)
    assert guard.quarantined(rec) == acceptance.quarantined(rec)
    assert fault is not None or isinstance(rec.get("passed"), bool)   # what it reads, it reads typed


def test_clear_by_a_text_its_reader_refuses_is_refused_and_a_fifo_at_the_records_path_is_not_waited_on(tmp_path):
    """Round 6 BA1: ``clear --by`` of 300 characters wrote a record every later load refused (exit 2 for
    every command); BA17: a FIFO at the records path blocked rigup-burnin in open() for ever."""
    import subprocess
    import sys
    from pathlib import Path
    prog = str(Path(acceptance.__file__))
    results = tmp_path / "burnin.json"
    results.write_text(json.dumps({"GPU-00000000-0000-0000-0000-000000000001": {"passed": False, "failed": ["VRAM: 3"],
                                                                               "level": "quick", "at": 1}}))
    before = results.read_text()
    run = subprocess.run([sys.executable, prog, "clear", "all", "--results", str(results), "--metrics",
                          str(tmp_path / "x.prom"), "--by", "x" * 300], capture_output=True, text=True, timeout=60)
    print(run.returncode, run.stderr.strip()[-160:])
    assert run.returncode == 2 and "--by" in run.stderr and results.read_text() == before
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    run = subprocess.run([sys.executable, prog, "status", "--results", str(fifo)], capture_output=True, text=True, timeout=20)
    print(run.returncode, run.stderr.strip()[-160:])
    assert run.returncode != 0 and "not a regular file" in run.stderr
