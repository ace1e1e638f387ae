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

from roles.burnin import acceptance

PROGRAM = acceptance.__file__
U = [f"GPU-{i:08d}-0000-0000-0000-000000000001" for i in range(2)]
FAILED = {U[0]: {"passed": False, "failed": ["VRAM: 3 mismatched words"]}, U[1]: {"passed": True}}


def burnin(*argv):
    return subprocess.run([sys.executable, PROGRAM, *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text", [json.dumps(FAILED) + "\n,", json.dumps(FAILED)[:-3], '{"a": NaN}',
                                  '{"%s": {"passed": true}, "%s": {"passed": false}}' % (U[0], U[0]),
                                  "[1, 2]", '{"%s": [1]}' % U[0], "\udcff" * 3])
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
