"""rigup/boundary/results.py: the typed readers of a sweep's result (the rigup user writes it; it
becomes host_vars), a llama.cpp build's stamp and the controller's record of a build artifact.
Whatever a party writes there is refused naming where (Unreadable) or read within bounds, never
another exception; and at the call sites a bad result writes nothing, a bad stamp crashes nothing."""

import json
import math
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api import OperationError

from plays import fleet
from rigup.boundary import results
from rigup.boundary.core import Unreadable
from rigup.contract.llama_server import SWEPT, spellings
from tests.runs import own_run

ROOT = Path(__file__).resolve().parents[2]
WHERE = "rig-07:/var/lib/rigup/tuner/out/g.json"
SHA = "ab" * 32
KEY = "0123456789abcdef"

POINT = {"stage": 1, "flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on"}, "status": "ok", "tps": 90.0,
         "levels": [{"concurrency": 4, "total_tps": 90.0, "requests": 8}], "argv": ["/b/llama-server"]}
BASE = {"stage": 0, "flags": {}, "status": "ok", "tps": 50.0, "levels": [{"concurrency": 4, "total_tps": 50.0}]}
RESULT = {"schema": 1, "concurrency": 4, "levels": [4], "budget_s": 900.0, "points": [BASE, POINT], "baseline": BASE,
          "best": POINT, "ratio": 1.8, "spent_s": 61.0, "stopped": None, "layers": 48}
STAMP = {"id": "b8779-0123456789", "ref": "b8779", "commit": "c" * 40, "seconds": 300, "compiler": "c++ (Debian 12.2.0) 12.2.0",
         "cmake": "cmake version 3.25.1"}
RECORD = {"schema": 1, "key": KEY, "sha256": SHA, "size": 4096, "host": "lab1", "path": f"/opt/rigup/llama.cpp/artifacts/{KEY}.tar.gz",
          "build_id": "b8779-0123456789", "ref": "b8779", "commit": "c" * 40, "time": 1700000000,
          "runtime": {"os": "debian 12", "glibc": "2.36", "machine": "x86_64", "toolkit": None, "cpu_flags": ["avx2"]}}

# JSON as a party may write it: every shape, numbers at and past the bounds, text with what a shell reads
numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from([0, -1, 1, 2**31, 10**12, 1e308, -0.0, 4.5, 2**31 - 1]))
texts = st.one_of(st.text(max_size=40), st.sampled_from(["NaN", "1e400", "0x10", "--host 0.0.0.0", "3,4", "1_000",
                                                          " 16384", "16384\n", "٣", "../x", "on", "row", "q8_0"]))
json_values = st.recursive(st.one_of(st.none(), numbers, texts),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                           max_leaves=12)


def read_or_refused(reader, value, *args):
    """What ``reader`` makes of ``value``: its record, or None when it refused naming WHERE."""
    try:
        return reader(value, WHERE, *args)
    except Unreadable as e:
        assert e.where.startswith(WHERE) and e.why, e
        return None


def replaced(doc: dict, path: tuple, value) -> dict:
    """``doc`` (nested maps) with the field at ``path`` set to ``value``."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def within(result: dict) -> None:
    """Every field a reader returned is of its type and within its bounds."""
    for point in [result["best"], result["baseline"], *result["points"]]:
        if point is None:
            continue
        assert point["status"] in results.STATUSES and set(point["flags"]) <= set(SWEPT)
        assert point.get("tps") is None or (isinstance(point["tps"], float) and 0 <= point["tps"] <= results.TPS_MAX)
        for key, value in point["flags"].items():
            if key == "tensor_split":
                assert re.fullmatch(r"[0-9.,]+", value)
            elif key in ("flash_attn", "split_mode", "cache_type_k", "cache_type_v"):
                assert isinstance(value, str) and value.isalnum() or "_" in value
            else:
                assert type(value) is int and -1 <= value <= results.INT32
        for level in point.get("levels") or []:
            assert type(level["concurrency"]) is int and math.isfinite(level["total_tps"])
    assert type(result["concurrency"]) is int and 1 <= result["concurrency"] <= results.LEVEL_MAX


# ----------------------------------------------------------------------------- the readers, by property
def test_the_readers_know_every_flag_the_sweep_sets():
    assert set(results.FLAGS) == set(SWEPT)


def test_a_sweep_written_by_rigup_tune_reads_back():
    from plays.shipped import tune
    spec = {"argv": ["/b/llama-server", "-c", "8192", "-np", "2"], "port": 18080, "concurrency": 4, "slot_tokens": 4096,
            "max_parallel": 8, "gpu": True, "gpus": 2, "budget_s": 900, "layers": 40,
            "flags": {k: list(v) for k, v in spellings(SWEPT).items()}}
    n = iter(range(1, 1000))

    def measured(spec, argv, log):
        k = next(n)
        return {"status": "ok", "tps": 40.0 + k, "levels": [{"concurrency": 4, "total_tps": 40.0 + k}]} if k % 5 else \
            {"status": "no-fit", "error": "out of memory"}

    got = tune.tune(spec, measure_point=measured)
    read = results.sweep(json.dumps(got, indent=1), WHERE)
    within(read)
    assert read["best"]["flags"] == got["best"]["flags"] and read["schema"] == results.SCHEMA
    assert any("tensor_split" in p["flags"] for p in read["points"])


@pytest.mark.parametrize("path, value, why", [
    (("best", "tps"), float("nan"), "best: tps"),
    (("best", "tps"), 1e308, "best: tps"),
    (("best", "flags", "ctx"), 10**12, "best: flags.ctx"),
    (("best", "flags", "ctx"), 4096.5, "best: flags.ctx"),
    (("best", "flags", "tensor_split"), "3,4 --host 0.0.0.0", "best: flags.tensor_split"),
    (("best", "flags", "host"), "0.0.0.0", "not a flag the sweep sets"),
    (("best", "flags", "flash_attn"), ["on"], "best: flags.flash_attn"),
    (("points", 0, "levels", 0, "total_tps"), -1, "points[0]: levels[0]: total_tps"),
    (("concurrency",), True, "concurrency"),
    (("schema",), 2, "written by a newer rigup"),
    (("best", "status"), "crash", "did not serve"),
])
def test_a_sweep_out_of_bounds_is_refused_naming_the_host_the_file_and_the_field(path, value, why):
    with pytest.raises(Unreadable) as e:
        results.sweep(replaced(RESULT, path, value), WHERE)
    assert e.value.where.startswith(WHERE) and why in str(e.value), e.value


def test_a_best_no_point_measured_or_a_ratio_its_best_and_baseline_do_not_give_is_refused():
    """Round 3 of issue 61, items 2 and 3: a best of ctx 131072 at 500 tok/s among points all at ctx
    4096 and 10 tok/s was read (and written into host_vars); so was ratio 50 while the best's tok/s
    equals the baseline's."""
    point = {"flags": {"ctx": 4096}, "status": "ok", "tps": 10.0, "levels": [{"concurrency": 1, "total_tps": 10.0}]}
    doc = {"concurrency": 1, "levels": [1], "points": [point], "baseline": point, "best": point, "ratio": 1.0,
           "spent_s": 1.0, "stopped": None}
    assert results.sweep(doc, WHERE)["ratio"] == 1.0
    made_up = {**point, "flags": {"ctx": 131072}, "tps": 500.0}
    for best, why in ((made_up, "not one of the points the sweep measured"),
                      ({**point, "tps": 500.0}, "not one of the points"),          # the flags of a point, not its tok/s
                      ({**point, "flags": {"ctx": 131072}}, "not one of the points")):
        with pytest.raises(Unreadable, match=why) as e:
            results.sweep({**doc, "best": best, "ratio": None}, WHERE)
        print(f"best {best['flags']} at {best['tps']} tok/s -> refused: {e.value}")
        assert e.value.where.startswith(WHERE)
    for ratio, why in ((50.0, "is 1.000"), (1.002, "is 1.000"), (-1, "ratio")):
        with pytest.raises(Unreadable, match=why) as e:
            results.sweep({**doc, "ratio": ratio}, WHERE)
        print(f"ratio {ratio} -> refused: {e.value}")
        assert e.value.where == f"{WHERE}: ratio"
    with pytest.raises(Unreadable, match="no best and baseline"):
        results.sweep({**doc, "baseline": None, "ratio": 1.0}, WHERE)
    # plays/shipped/tune.py's rounding to 3 places, and a sweep still running (no ratio yet), read
    assert results.sweep(RESULT, WHERE)["ratio"] == 1.8
    thirds = {**RESULT, "points": [{**BASE, "tps": 30.0}, POINT], "baseline": {**BASE, "tps": 30.0}, "ratio": 3.0}
    assert results.sweep(thirds, WHERE)["ratio"] == 3.0
    assert results.sweep({**thirds, "points": [{**BASE, "tps": 27.0}, POINT], "baseline": {**BASE, "tps": 27.0},
                          "ratio": round(90 / 27, 3)}, WHERE)["ratio"] == 3.333
    assert results.sweep({**doc, "ratio": None}, WHERE)["ratio"] is None


def test_a_baseline_no_point_measured_or_a_tps_below_the_tuners_floor_is_refused():
    """Round 4 of issue 61: a baseline of 0.5 tok/s that no point measured, with ratio 20, was read
    ('tuned 20.00x'); a baseline of 5e-324 tok/s with ratio null was read and printed 'tuned infx'."""
    point = {"flags": {"ctx": 4096}, "status": "ok", "tps": 10.0}
    doc = {"concurrency": 1, "points": [point], "baseline": point, "best": point, "ratio": 1.0,
           "spent_s": 1.0, "stopped": None}
    for change, why in (({"baseline": {"flags": {}, "status": "ok", "tps": 0.5}, "ratio": 20.0}, "baseline"),
                        ({"baseline": {"flags": {}, "status": "ok", "tps": 5e-324}, "ratio": None}, "neither 0"),
                        ({"points": [{**point, "tps": 0.009}], "best": {**point, "tps": 0.009}}, "neither 0")):
        with pytest.raises(Unreadable, match=why) as e:
            results.sweep({**doc, **change}, WHERE)
        print(f"{change} -> refused: {e.value}")
    assert results.sweep({**doc, "points": [point, {**point, "flags": {}, "status": "failed-requests", "tps": 0.0}]},
                         WHERE)["ratio"] == 1.0   # a point that failed measured 0 tok/s
    for entry in ({"tok_s": 10.0, "baseline_tok_s": 5e-324, "concurrency": 1}, {"tok_s": 1e300, "baseline_tok_s": 1e-300}):
        print(f"tuned_text({entry}) -> {fleet.tuned_text(entry)!r}")
        assert fleet.tuned_text(entry) == "tuned: unreadable"


def test_a_sweep_missing_a_field_or_not_json_is_refused_and_one_without_schema_is_read():
    for key in ("points", "best", "spent_s", "concurrency"):
        with pytest.raises(Unreadable, match=f"no {key}"):
            results.sweep({k: v for k, v in RESULT.items() if k != key}, WHERE)
    for text in ('{"concurrency": NaN}', "[1, 2", "[" * 100000, b"\xff\xfe", "1" * 5000):
        with pytest.raises(Unreadable, match="not"):
            results.sweep(text, WHERE)
    # why it stopped is a server's log line, escapes and all: read, and escaped where it is shown
    stopped = results.sweep(replaced(RESULT, ("stopped",), "\x1b[31mout of memory\r\n"), WHERE)
    from plays import tuning
    assert "\\x1b[31mout of memory\\r\\n" in tuning.markdown("rig-07", "g", stopped)
    old = results.sweep({k: v for k, v in RESULT.items() if k != "schema"} | {"extra": {"kept": 1}}, WHERE)
    assert old["extra"] == {"kept": 1} and old["best"]["argv"] == ["/b/llama-server"]


def twice(doc: dict, key: str, value) -> str:
    """``doc`` as JSON text with ``key`` given again, last, as ``value`` (json.loads would keep that one)."""
    return json.dumps(doc)[:-1] + f", {json.dumps(key)}: {json.dumps(value)}}}"


def test_a_key_given_twice_in_a_record_is_refused_not_taken_last_wins():
    """Round 2 of issue 61, items 17, 22, 23: json keeps the last of a key given twice; another reader the first."""
    for reader, doc, key, value, args in ((results.sweep, RESULT, "best", BASE, ()),
                                          (results.artifact_record, RECORD, "key", "fedcba9876543210", (KEY,)),
                                          (results.stamp, STAMP, "id", "other-1", ())):
        with pytest.raises(Unreadable, match=f"the key '{key}' twice") as e:
            reader(twice(doc, key, value), WHERE, *args)
        print(f"{reader.__name__}: {key!r} twice -> refused: {e.value}")
        assert e.value.where == WHERE
    nested = json.dumps(RESULT).replace('"parallel": 4', '"parallel": 4, "parallel": 64')
    with pytest.raises(Unreadable, match="'parallel' twice"):
        results.sweep(nested, WHERE)


@settings(max_examples=60, deadline=1000)
@given(json_values)
def test_any_json_as_a_sweep_is_refused_or_within_bounds(value):
    got = read_or_refused(results.sweep, value)
    if got is not None:
        within(got)
    read_or_refused(results.sweep, json.dumps(value, allow_nan=True))


@settings(max_examples=60, deadline=1000)
@given(st.sampled_from([("best", "tps"), ("best", "flags", "ctx"), ("best", "flags", "parallel"), ("best", "flags", "ngl"),
                        ("best", "flags", "tensor_split"), ("best", "flags", "split_mode"), ("best", "flags", "batch"),
                        ("best", "flags"), ("best", "levels"), ("points", 1, "levels", 0, "concurrency"), ("levels",),
                        ("concurrency",), ("spent_s",), ("ratio",), ("stopped",), ("baseline",), ("points",)]),
       json_values)
def test_any_value_in_any_field_of_a_sweep_is_refused_or_within_bounds(path, value):
    got = read_or_refused(results.sweep, replaced(RESULT, path, value))
    if got is not None:
        within(got)


@settings(max_examples=60, deadline=1000)
@given(st.sampled_from(sorted(STAMP) + ["schema", "extra"]), json_values, st.one_of(st.none(), texts))
def test_any_value_in_a_stamp_is_refused_or_typed(field, value, build):
    got = read_or_refused(results.stamp, replaced(STAMP, (field,), value), build)
    if got is not None:
        assert results.fields.ID.fullmatch(got["id"]) and (build is None or got["id"] == build)
        assert type(got["seconds"]) is int and results.COMMIT.fullmatch(got["commit"])
    read_or_refused(results.stamp, value)


@settings(max_examples=60, deadline=1000)
@given(st.sampled_from(sorted(RECORD) + [("runtime", "cpu_flags"), ("runtime", "os")]), json_values)
def test_any_value_in_an_artifact_record_is_refused_or_typed(field, value):
    got = read_or_refused(results.artifact_record, replaced(RECORD, field if isinstance(field, tuple) else (field,), value), KEY)
    if got is not None:
        assert got["key"] == KEY and re.fullmatch(r"[0-9a-f]{64}", got["sha256"]) and type(got["size"]) is int
        assert got["path"] is None or (got["path"].startswith("/") and got["path"].endswith(f"/artifacts/{KEY}.tar.gz"))
    read_or_refused(results.artifact_record, value, KEY)


@settings(max_examples=60, deadline=1000)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_is_refused_or_read(text):
    for reader, args in ((results.sweep, ()), (results.stamp, ()), (results.artifact_record, (KEY,)), (results.smoke, ())):
        read_or_refused(reader, text, *args)


# a smoke result as roles/llama_cpp/shipped/smoke.py writes it (run's fields abridged)
SMOKE = {"key": "0123456789abcdef", "ok": True, "seconds": 12.5, "runs": [{"name": "tiny", "ok": True, "tokens": 8}],
         "traps": ["cpu-repack-crash"], "server_args": ["--no-repack"],
         "compare": {"ok": True, "ratio": 1.02, "new_tps": [10.2], "current_tps": [10.0]}}


@settings(max_examples=60, deadline=1000)
@given(st.sampled_from(sorted(SMOKE) + [("compare", "ratio"), ("compare", "ok"), "schema"]), json_values)
def test_any_value_in_a_smoke_result_is_refused_or_typed(field, value):
    got = read_or_refused(results.smoke, replaced(SMOKE, field if isinstance(field, tuple) else (field,), value))
    if got is not None:
        assert type(got["ok"]) is bool and all(results.TRAP_ID.fullmatch(t) for t in got["traps"])
        assert all(results.REMEDY_FLAG.fullmatch(a) for a in got["server_args"])
    read_or_refused(results.smoke, value)


@pytest.mark.parametrize("bad, why", [
    ({"ok": True, "traps": [1, 2], "server_args": 7}, "traps[0]: not a trap's id"),    # the red team's (issue 61, 20)
    ({**SMOKE, "ok": "true"}, "ok: not true or false"),
    ({**SMOKE, "server_args": ["--no-repack", "--host=0.0.0.0"]}, "server_args[1]: not a bare --flag"),
    ({**SMOKE, "compare": {"ok": True, "ratio": -1}}, "compare: ratio: not a finite number"),
    ({k: v for k, v in SMOKE.items() if k != "ok"}, "no ok"),
    # round 33 S33a: the shapes that ended roles/llama_cpp/build.py _smoked in a traceback (it read the runs and
    # the comparison itself), each a host's failed smoke now, naming the field
    ({**SMOKE, "runs": ["x"]}, "runs[0]: not a map"),
    ({**SMOKE, "runs": [None]}, "runs[0]: not a map"),
    ({**SMOKE, "runs": [{"name": "tiny", "tokens": 8}]}, "runs[0]: no ok"),
    ({**SMOKE, "runs": [{"ok": True, "tokens": "eight"}]}, "runs[0]: tokens: not a whole number"),
    ({**SMOKE, "compare": [1]}, "compare: not a map"),
    ({**SMOKE, "compare": {"ok": True, "ratio": "fast"}}, "compare: ratio: not a finite number"),
    ({**SMOKE, "compare": {"ok": True, "ratio": 1.0, "new_tps": 5}}, "compare: new_tps: not a list"),
    ({**SMOKE, "compare": {"ok": True, "ratio": 1.0, "new_tps": ["x"]}}, "compare: new_tps[0]: not a finite number"),
    ({**SMOKE, "compare": {"ok": True, "reason": 7}}, "compare: reason: not text"),
])
def test_a_bad_smoke_result_is_that_builds_smoke_unknown_and_crashes_no_plan(bad, why, monkeypatch):
    import roles.llama_cpp as llama_cpp
    from roles.llama_cpp.facts import parse_state
    with pytest.raises(Unreadable, match=re.escape(why)):
        results.smoke(json.dumps(bad), WHERE)
    state = parse_state(["current=builds/b1-abc", f"smoke=b1-abc {json.dumps(bad)}", f"smoke=b2 {json.dumps(SMOKE)}"])
    print(why, "->", state["smokes"].keys())
    assert list(state["smokes"]) == ["b2"] and state["smokes"]["b2"]["traps"] == ["cpu-repack-crash"]
    monkeypatch.setattr(llama_cpp, "read_once", lambda *a, **kw: state)
    lines = llama_cpp.plan_lines({}, {"llama_cpp_dir": "/opt/llama.cpp", "llama_cpp_rollback": True, "llama_cpp_smoke": False})
    assert not any("trap" in ln for ln in lines), lines


def test_the_build_scripts_stamp_reads_back():
    """The stamp as templates/llama_cpp-build.sh.j2 prints it (its printf, run by bash)."""
    line = next(ln for ln in (ROOT / "templates" / "llama_cpp-build.sh.j2").read_text().splitlines()
                if ln.startswith("printf '{\"id\""))
    fmt = line.split("'")[1]
    out = subprocess.run(["bash", "-c", f"printf '{fmt}' b8779-0123456789 b8779 {'c' * 40} 312 'c++ (Debian) 12' 'cmake 3.25'"],
                         capture_output=True, text=True, check=True).stdout
    assert results.stamp(out, WHERE, "b8779-0123456789")["seconds"] == 312


# ----------------------------------------------------------------------------- the call sites
@pytest.mark.parametrize("bad", [
    replaced(RESULT, ("best", "tps"), float("nan")),
    replaced(RESULT, ("best", "flags", "ctx"), 10**12),
    replaced(RESULT, ("best", "flags", "tensor_split"), "--host 0.0.0.0"),
    {k: v for k, v in RESULT.items() if k != "points"},
    json.dumps(RESULT).replace("90.0", "NaN"),
    "not json",
])
def test_a_bad_sweep_result_writes_no_host_vars_and_fails_that_host(tmp_path, capsys, bad):
    from plays import tuning
    with pytest.raises(OperationError, match="nothing written"):
        tuning.record("rig-07", "g", bad, {"_rigup_site": str(tmp_path)}, ["/b/llama-server"], where=WHERE)
    assert not (tmp_path / "host_vars").exists() and not (tmp_path / "tune_out").exists()
    assert f"refused the sweep's result {WHERE}" in capsys.readouterr().err


def test_a_good_sweep_result_as_text_writes_typed_host_vars(tmp_path):
    import yaml

    from plays import tuning
    text = json.dumps(replaced(RESULT, ("best", "flags", "ctx"), "16384"))   # digits as text: typed as a number
    tuning.record("rig-07", "g", text, {"_rigup_site": str(tmp_path)}, ["/b/llama-server"], "b1", where=WHERE)
    entry = yaml.safe_load((tmp_path / "host_vars" / "rig-07.yml").read_text())["llama_server_tuned"]["g"]
    assert entry["flags"] == {"parallel": 4, "ctx": 16384, "flash_attn": "on"} and entry["tok_s"] == 90.0


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_sweep_is_kept_only_where_no_other_user_can_write(tmp_path, capsys):
    """host_vars/ of nobody's, 0777, a link planted at the old temporary name: the host fails
    naming the directory (rigup.boundary.owned.write); nothing is written through the link."""
    from plays import tuning
    victim = tmp_path / "victim"
    victim.write_text("operator's file\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "rig-07.yml.tmp").symlink_to(victim)
    os.chown(tmp_path / "host_vars", 65534, 65534)
    (tmp_path / "host_vars").chmod(0o777)
    with pytest.raises(OperationError, match="owned by nobody"):
        tuning.record("rig-07", "g", RESULT, {"_rigup_site": str(tmp_path)}, ["/b/llama-server"], where=WHERE)
    print(capsys.readouterr().err)
    assert victim.read_text() == "operator's file\n" and not (tmp_path / "host_vars" / "rig-07.yml").exists()


def _stamps(tmp_path, stamps: dict) -> dict:
    """The builds' fact, run with bash as on a host, over builds/<dir>/rigup-build.json holding ``stamps``."""
    from roles.llama_cpp.facts import LlamaCppState, parse_state
    for name, text in stamps.items():
        (tmp_path / "builds" / name).mkdir(parents=True)
        (tmp_path / "builds" / name / "rigup-build.json").write_text(text)
    out = subprocess.run(["bash", "-c", LlamaCppState().command(str(tmp_path))], capture_output=True, text=True)
    return parse_state(out.stdout.splitlines())


def test_a_bad_stamp_makes_that_build_unknown_and_crashes_no_preflight(tmp_path, monkeypatch):
    import roles.llama_cpp as llama_cpp
    from roles.llama_cpp import handover
    from tests.unit.hosts import data, host

    state = _stamps(tmp_path, {"good-1": json.dumps({"id": "good-1", "seconds": 3}), "b1": json.dumps({"id": ["b1"]}),
                               "other-2": json.dumps({"id": "good-1"}), "nan-3": '{"id": "nan-3", "seconds": NaN}',
                               "half-4": '{"id": "ha', "list-5": "[1, 2]"})
    assert list(state["builds"]) == ["good-1"] and state["builds"]["good-1"]["seconds"] == 3
    assert sorted(state["unreadable"]) == ["b1", "half-4", "list-5", "nan-3", "other-2"]
    assert "another build" in state["unreadable"]["other-2"]
    # preflight's plan lines of the host: its build (b1) is unknown, so compiled, and the line says why
    monkeypatch.setattr(llama_cpp, "read_once", lambda fact, **kw: state)
    monkeypatch.setattr(llama_cpp, "host", SimpleNamespace(name="lab1"))
    monkeypatch.setattr(llama_cpp, "build_id", lambda d, options: "b1")
    d = data(llama_cpp_ref="c" * 40, llama_cpp_artifacts=str(tmp_path / "cache"))
    with own_run():   # the run's choices (rigup/run.py): this test's own
        lines = llama_cpp.plan_lines(host("a100")[0], d)
    said = next(ln for ln in lines if ln.startswith("llama.cpp b1:"))
    assert "compile" in said and "its stamp here did not read" in said, lines


def test_an_artifact_record_out_of_bounds_is_no_record_and_the_host_compiles_saying_why(tmp_path):
    from roles.llama_cpp import artifact, handover
    cache = tmp_path / "cache"
    part = tmp_path / "part"
    part.write_bytes(b"x")
    doc = artifact.kept(str(cache), KEY, part, {"host": "lab1", "build_id": "b1"})
    assert doc["schema"] == results.SCHEMA and artifact.record(str(cache), KEY) == doc
    for field, value in (("sha256", "0" * 63), ("size", 2**50), ("path", "/etc/shadow"), ("host", ["lab1"]),
                         ("key", "fedcba9876543210"), ("schema", 7)):
        (cache / f"{KEY}.json").write_text(json.dumps({**doc, field: value}))
        found, why = artifact.checked_record(str(cache), KEY)
        assert found is None and f"controller:{cache}/{KEY}.json" in why and field.split("_")[0] in why, (field, why)
    assert artifact.checked_record(str(cache), "fedcba9876543210") == (None, None)     # none: nothing to say
    data = {"llama_cpp_handover": True, "llama_cpp_archive": None, "llama_cpp_source": "https://example.invalid/l.git",
            "llama_cpp_ref": "c" * 40, "llama_cpp_artifacts": str(cache)}
    rt = {"os": "debian 12", "glibc": "2.36", "machine": "x86_64", "toolkit": None, "cpu_flags": None}
    key = artifact.key("b1", "c" * 40, rt)
    (cache / f"{key}.json").write_text(json.dumps({**doc, "key": key, "sha256": "not a sha"}))
    with own_run():   # the run's choices (rigup/run.py): this test's own
        got = handover.source("lab2", data, {"builds": {}}, "b1", rt)
    assert got["how"] == "compile" and "its record is unreadable" in got["why"] and "sha256" in got["why"]


# ----------------------------------------------------------------------------- C8: -mg and -ts of the host's GPUs
def on_gpus(flags: dict) -> dict:
    """RESULT whose best (a measured point) sets ``flags`` too."""
    best = {**POINT, "flags": {**POINT["flags"], **flags}}
    return {**RESULT, "points": [BASE, best], "best": best}


@pytest.mark.parametrize("flags, gpus, why", [
    ({"main_gpu": 255}, 1, "main_gpu"),                          # round 2, C8: a host of one GPU
    ({"main_gpu": 1}, 1, "main_gpu"),
    ({"tensor_split": "0,0,0"}, None, "no share above 0"),       # C8: all zero, whatever the GPUs
    ({"tensor_split": "0"}, 4, "no share above 0"),
    ({"tensor_split": "3,4,4"}, 2, "more shares"),
])
def test_a_sweeps_main_gpu_or_tensor_split_the_host_has_no_gpus_for_is_refused(flags, gpus, why):
    """Round 2 of issue 61, C8: a best main_gpu 255 and tensor_split '0,0,0' passed the reader into
    host_vars on a host of 1 GPU (the sweep's spec knows its GPUs: plays.tuning.record hands them over)."""
    with pytest.raises(Unreadable, match=why) as e:
        results.sweep(on_gpus(flags), WHERE, gpus)
    print(f"\n{e.value}")
    assert e.value.where.startswith(WHERE)


def test_a_sweeps_split_over_the_hosts_gpus_reads():
    assert results.sweep(on_gpus({"main_gpu": 1, "tensor_split": "3,4"}), WHERE, 2)["best"]["flags"]["main_gpu"] == 1
    assert results.sweep(on_gpus({"tensor_split": "0,4"}), WHERE)["best"]["flags"]["tensor_split"] == "0,4"


def test_a_sweep_whose_main_gpu_the_host_has_not_writes_no_host_vars(tmp_path, capsys):
    """C8 at the call site: tune.py hands the spec's GPUs to tuning.record."""
    from plays import tuning
    with pytest.raises(OperationError, match="nothing written"):
        tuning.record("rig-07", "g", on_gpus({"main_gpu": 255}), {"_rigup_site": str(tmp_path)}, ["/b/llama-server"],
                      where=WHERE, gpus=1)
    assert not (tmp_path / "host_vars").exists()


@settings(max_examples=60, deadline=1000)
@given(st.sampled_from([("best", "flags", "main_gpu"), ("best", "flags", "tensor_split")]), json_values,
       st.integers(1, 16))
def test_any_main_gpu_or_split_is_refused_or_on_the_hosts_gpus(path, value, gpus):
    doc = on_gpus({})
    doc = {**doc, "points": [BASE, doc["best"]]}
    got = read_or_refused(results.sweep, replaced(doc, path, value), gpus)
    if got is not None:
        within(got)
        flags = got["best"]["flags"]
        assert flags.get("main_gpu", 0) < gpus
        assert "tensor_split" not in flags or (len(flags["tensor_split"].split(",")) <= gpus
                                               and any(float(s) > 0 for s in flags["tensor_split"].split(",")))


# ----------------------------------------------------------------------------- bench.py's readings
LEVEL = {"concurrency": 4, "requests": 8, "failed": 0, "errors": [], "tokens": 512, "seconds": 3.2,
         "total_tps": 160.0, "per_request_tps": 41.5}
LINE = {"url": "http://127.0.0.1:8081", "max_tokens": 64, "rounds": 2, "levels": [LEVEL]}
LLAMA_BENCH = [{"avg_ts": 123.456, "stddev_ts": 1.5, "backends": "CUDA", "n_threads": 16, "build_commit": "3f2a1b9",
                "model_type": "gemma3 270M Q8_0"}]
MARKER = {"repo": "org/a-GGUF", "revision": "c" * 40, "files": ["a.gguf", "UD-Q4/b-00001-of-00002.gguf"],
          "bytes": 123456}


def test_what_throughput_py_writes_reads_back():
    """The line shipped/throughput.py prints (its main) reads as its levels alone."""
    from shipped import throughput
    assert results.throughput(json.dumps(LINE), WHERE) == {"levels": [LEVEL]}
    assert results.throughput({"url": "u", "error": "URLError: refused"}, WHERE) == {"error": "URLError: refused"}
    lv = throughput.level("http://127.0.0.1:9", 1, None, 8, 1, 1)
    assert results.throughput({"levels": [lv]}, WHERE)["levels"][0]["failed"] == 1


@pytest.mark.parametrize("line, why", [
    ('{"levels": [{"concurrency": 1, "requests": 1, "failed": 0, "total_tps": NaN, "per_request_tps": Infinity}]}',
     "not JSON"),                                                      # H3/H6: NaN and Infinity
    ("{not json", "not JSON"),                                         # H3: a '{' line that is not JSON
    ({"levels": "abc"}, "levels"),                                     # H4
    ({"levels": [{**LEVEL, "total_tps": "fast"}]}, "total_tps"),       # H5
    ({"levels": [{**LEVEL, "total_tps": True}]}, "total_tps"),
    ({"levels": [{**LEVEL, "requests": -1}]}, "requests"),
    ({"url": "u"}, "neither levels nor an error"),
    ({"error": ["x"]}, "error"),
])
def test_a_throughput_line_out_of_bounds_is_refused(line, why):
    with pytest.raises(Unreadable, match=why):
        results.throughput(line, WHERE)


@settings(max_examples=100, deadline=1000)
@given(st.sampled_from([("levels",), ("levels", 0), ("levels", 0, "concurrency"), ("levels", 0, "total_tps"),
                        ("levels", 0, "requests"), ("levels", 0, "errors"), ("error",), ("url",)]), json_values)
def test_any_value_in_a_throughput_line_is_refused_or_typed(path, value):
    got = read_or_refused(results.throughput, replaced(LINE, path, value))
    if got is not None:
        assert set(got) in ({"levels"}, {"error"})
        for lv in got.get("levels", []):
            assert all(type(lv[k]) is int and lv[k] >= 0 for k in ("concurrency", "requests", "failed"))
            assert all(isinstance(lv[k], float) and 0 <= lv[k] <= results.TPS_MAX for k in ("total_tps", "per_request_tps"))


@pytest.mark.parametrize("level", [
    {**LEVEL, "requests": 0, "tokens": 0, "seconds": 1.0, "total_tps": 9999999, "per_request_tps": 9999999},   # N4
    {**LEVEL, "requests": 0, "tokens": 0, "seconds": 1.0, "total_tps": 0.0, "per_request_tps": 5.0},
    {**LEVEL, "tokens": 0, "total_tps": 0.0, "per_request_tps": 41.5},
    {k: v for k, v in {**LEVEL, "requests": 0, "per_request_tps": 0.0}.items() if k not in ("tokens", "seconds")},
    {**LEVEL, "total_tps": 9999999.0},                       # 512 tokens over 3.2 s are 160 tok/s
    {**LEVEL, "seconds": 0.0, "tokens": 1, "total_tps": 3.0},
])
def test_a_level_claiming_tok_s_its_counts_do_not_give_is_refused(level):
    """Rerun 2 of issue 61, N4: a level of 0 requests and 0 tokens claiming 9999999 tok/s was read
    as measured: its rate is now its tokens over its seconds, and none without requests and tokens."""
    with pytest.raises(Unreadable, match="tok/s|total_tps") as e:
        results.throughput({"levels": [level]}, WHERE)
    print(e.value)


@settings(max_examples=200, deadline=1000)
@given(tokens=st.integers(0, 10**6), raw=st.floats(0.0006, 1e5), requests=st.integers(1, 4096),
       per_request=st.floats(0, 1e6))
def test_a_level_as_throughput_py_writes_it_reads_back(tokens, raw, requests, per_request):
    """What shipped/throughput.py's level() gives (its seconds rounded to 3 places, total tok/s its tokens
    over the unrounded seconds, to 2) reads back, however the rounding falls."""
    level = {"concurrency": 1, "requests": requests, "failed": 0, "errors": [], "tokens": tokens,
             "seconds": round(raw, 3), "total_tps": round(tokens / raw, 2),
             "per_request_tps": round(per_request, 2) if tokens else 0.0}
    if level["total_tps"] <= results.TPS_MAX:
        assert results.throughput({"levels": [level]}, WHERE) == {"levels": [level]}


def test_llama_benchs_json_reads_back():
    got = results.llama_bench(json.dumps(LLAMA_BENCH), WHERE)
    assert got == {"tps": 123.456, "stddev": 1.5, "backend": "CUDA", "threads": 16, "build": "3f2a1b9",
                   "model": "gemma3 270M Q8_0"}


@pytest.mark.parametrize("doc, why", [
    ([{"avg_ts": True, "stddev_ts": 1.0}], "avg_ts"),                   # H7: true was 1 tok/s
    ('[{"avg_ts": 10.0, "stddev_ts": 1e999}]', "1e999 is past"),        # H7: 1e999 is inf (core.loads: round 9 CORE1)
    ([{"avg_ts": 10.0, "stddev_ts": 1.0, "backends": "CUDA\x1b]0;x\x07"}], "backends"),
    ([{"avg_ts": 10.0, "stddev_ts": 1.0, "build_commit": "|x|"}], "build_commit"),
    ([], "not a list"), ({"avg_ts": 1.0}, "not a list"), ("[" * 100000 + "]" * 100000, "not JSON"),
])
def test_llama_benchs_json_out_of_bounds_is_refused(doc, why):
    with pytest.raises(Unreadable, match=why):
        results.llama_bench(doc, WHERE)


@settings(max_examples=100, deadline=1000)
@given(st.sampled_from(sorted(LLAMA_BENCH[0]) + ["backend"]), json_values)
def test_any_value_in_llama_benchs_json_is_refused_or_typed(field, value):
    got = read_or_refused(results.llama_bench, [{**LLAMA_BENCH[0], field: value}])
    if got is not None:
        assert all(isinstance(got[k], float) and math.isfinite(got[k]) for k in ("tps", "stddev"))
        assert all(v is None or "|" not in v and v.isprintable() for k, v in got.items() if isinstance(v, str))


def test_a_models_marker_reads_back():
    assert results.marker(json.dumps(MARKER), WHERE)["files"] == MARKER["files"]


@pytest.mark.parametrize("doc, why", [
    ("[1, 2]", "not a JSON object"),                                   # H2: a list
    ("[" * 200000 + "]" * 200000, "not JSON"),                         # H1: nested deep
    ({"files": ["../../etc/shadow"]}, "files"), ({"files": "a.gguf"}, "files"), ({"bytes": -1}, "bytes"),
])
def test_a_models_marker_that_is_no_marker_is_refused(doc, why):
    with pytest.raises(Unreadable, match=why):
        results.marker(doc, WHERE)


@settings(max_examples=100, deadline=1000)
@given(json_values)
def test_any_json_as_a_marker_is_refused_or_typed(value):
    got = read_or_refused(results.marker, value)
    if got is not None:
        assert isinstance(got, dict) and all(isinstance(f, str) and ".." not in f.split("/") for f in got.get("files", []))


@pytest.mark.parametrize("size", ["1000", 1.0, True, -1])
def test_a_markers_bytes_is_a_json_int_as_rigup_fetch_reads_it(size):
    """Re-round 6 NM1 (issue 61): "1000" or 1.0 read as complete here and as no marker to rigup-fetch."""
    with pytest.raises(Unreadable) as e:
        results.marker({"files": ["m.gguf"], "repo": "o/m", "revision": "main", "bytes": size}, "lab1:m")
    print(e.value)
    assert "bytes" in str(e.value)
    assert results.marker({"files": ["m.gguf"], "bytes": 1000}, "lab1:m")["bytes"] == 1000
