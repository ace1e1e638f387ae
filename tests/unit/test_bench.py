"""bench.py's pieces without hosts (plays/bench.py): the instances it measures, its command on a
host (everything quoted), the fact's parsing, and the reports: Markdown, JSON and the fleet's
PNG, read back (size, not blank, one line per host in its colour)."""

import json
import shlex

import pytest
from hypothesis import given, settings, strategies as st

from pyinfra.api import Config, Inventory, State

from plays import bench, charts
from rigup import run as run_state

DATA = {"llama_server_instances": {"glm": {"model": "m", "port": 8081, "replicas": 2},
                                   "keyed": {"model": "m", "port": 8082, "host": "10.0.0.5", "api_key": True}},
        "vllm_instances": {"qwen": {"model": "q", "port": 8000, "served_model_name": "Qwen 3"}}}


def test_targets_and_the_command_on_the_host():
    found = bench.targets(DATA)
    assert [(t["name"], t["engine"], t["url"], t["key"], t["model"]) for t in found] == [
        ("glm", "llama-server", "http://127.0.0.1:8081", None, None),
        ("keyed", "llama-server", "http://10.0.0.5:8082", "/etc/rigup/llama-server/keyed.key", None),
        ("qwen", "vllm", "http://127.0.0.1:8000", None, "Qwen 3")]
    command = bench.sweep_command(found[2], [1, 4], 64, 2, bench.SCRIPT_WORD)
    assert shlex.split(command) == ["/usr/bin/python3", "-I", "-S", "$t", "sweep", "http://127.0.0.1:8000", "--levels", "1,4",
                                    "--max-tokens", "64", "--rounds", "2", "--model", "Qwen 3"]
    fact = bench.Throughput()
    text = fact.command(found, [1, 4], 64, 2)
    assert text.startswith("t=$(mktemp)") and "RIGUP_BENCH_EOF\n" in text and text.endswith('rm -f "$t"')
    assert fact.process(["##rigup-bench glm", '{"levels": []}', "##rigup-bench keyed", '{"error": "URLError: x"}']) == {
        "glm": {"levels": []}, "keyed": {"error": "URLError: x"}}


def levels(scale):
    return [{"concurrency": n, "requests": 2 * n, "failed": 0, "tokens": 0, "seconds": 1.0,
             "total_tps": scale * min(n, 4), "per_request_tps": scale} for n in (1, 2, 4, 8)]


def result(host, instances):
    return {"host": host, "date": "2026-11-30 12:00:00", "max_tokens": 64, "rounds": 2, "instances": instances}


def count_colours(path):
    """Pixels of each of charts.COLORS in the PNG at ``path`` (within a small tolerance)."""
    from matplotlib import image
    import numpy

    pixels = (image.imread(path)[:, :, :3] * 255).astype(int)
    counts = []
    for colour in charts.COLORS:
        rgb = numpy.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        counts.append(int((numpy.abs(pixels - rgb).sum(axis=2) < 30).sum()))
    return pixels, counts


def test_reports_markdown_json_and_a_plot_with_one_line_per_host(tmp_path):
    pytest.importorskip("matplotlib", reason="requirements-dev.txt installs it")
    results = {"rig-1": result("rig-1", {"glm": {"engine": "llama-server", "url": "http://127.0.0.1:8081",
                                                  "levels": levels(100)}}),
               "rig-2": result("rig-2", {"glm": {"engine": "llama-server", "url": "http://127.0.0.1:8081",
                                                  "levels": levels(60)},
                                         "down": {"engine": "llama-server", "url": "http://127.0.0.1:8090",
                                                  "error": "URLError: refused"}})}
    written = bench.write_reports(results, tmp_path, charts.plot)
    assert sorted(p.name for p in written) == ["fleet.png", "rig-1.json", "rig-1.md", "rig-2.json", "rig-2.md"]
    md = (tmp_path / "rig-2.md").read_text()
    assert "| 4 | 8 | 0 | 240.0 | 60.0 |" in md and "Not measured: URLError: refused" in md
    assert json.loads((tmp_path / "rig-1.json").read_text())["instances"]["glm"]["levels"][3]["total_tps"] == 400
    pixels, counts = count_colours(tmp_path / "fleet.png")
    print(f"\nfleet.png {pixels.shape[1]}x{pixels.shape[0]}, pixels per line colour: {counts[:3]}")
    assert pixels.shape[:2] == (charts.PLOT_SIZE_IN[1] * charts.PLOT_DPI, charts.PLOT_SIZE_IN[0] * charts.PLOT_DPI)
    assert (pixels.sum(axis=2) < 600).mean() > 0.01                       # not blank
    assert counts[0] > 1000 and counts[1] > 1000 and counts[2] < 50      # two lines: rig-1/glm, rig-2/glm


def test_replicas_are_measured_through_the_balancer_and_each_on_its_own():
    units = ["rigup-llama@glm-0.service", "rigup-llama@glm-1.service", "rigup-llama@glm2.service"]
    found = bench.targets(DATA, units)
    assert [(t["name"], t["url"], t["via"]) for t in found if t["engine"] == "llama-server"] == [
        ("glm", "http://127.0.0.1:8081", "balancer"), ("glm-0", "http://127.0.0.1:8082", "replica"),
        ("glm-1", "http://127.0.0.1:8083", "replica"), ("keyed", "http://10.0.0.5:8082", None)]


def test_llama_bench_runs_on_the_served_model_with_every_argument_quoted():
    data = {"models_dir": "/srv/models", "models": {"m": {"repo": "o/m", "revision": "a" * 40}},
            "llama_server_instances": {"glm": {"model": "m", "port": 8081, "ngl": 0}, "keyed": {"model": "m", "port": 8082}}}
    marker = "/srv/models/m/.rigup-complete.json"
    assert bench.model_markers(data) == {"glm": marker, "keyed": marker}
    seen = bench.Serving().process(["##unit rigup-llama@glm.service", f"##marker {marker}",
                                    '{"files": ["x/m Q4-00001-of-00002.gguf", "x/m Q4-00002-of-00002.gguf"]}',
                                    "##llama-bench"])
    assert seen["units"] == ["rigup-llama@glm.service"] and seen["llama_bench"] is True
    runs = bench.llama_runs(data, seen)
    assert runs == [{"name": "glm", "dest": "/srv/models/m", "model": "/srv/models/m/x/m Q4-00001-of-00002.gguf", "ngl": 0},
                    {"name": "keyed", "dest": "/srv/models/m", "model": "/srv/models/m/x/m Q4-00001-of-00002.gguf",
                     "ngl": 99}]
    assert bench.llama_runs(data, {**seen, "llama_bench": False})[0]["error"].startswith("no llama-bench in the build")
    assert bench.llama_bench_args("pp4096") == ["-p", "4096", "-n", "0"]
    assert bench.llama_bench_args("tg128") == ["-p", "0", "-n", "128"]
    assert bench.llama_bench_args("pp") is None   # none, never an exception inside a fact's command (round 10, B4)
    command = bench.LlamaBench().command(runs[:1], "/opt/rigup/llama.cpp/current/bin/llama-bench", ["pp512"], 2, 60)
    assert "-m '/srv/models/m/x/m Q4-00001-of-00002.gguf' -ngl 0 -r 2 -o json -p 512 -n 0" in command
    rows = bench.LlamaBench().process([
        "##llama-bench glm pp512", '[{"avg_ts": 812.345, "stddev_ts": 3.1, "backends": "CPU", "n_threads": 2, '
        '"build_commit": "abc1234", "model_type": "gemma3 270M Q4_K_M"}]', "##rc 0 60",
        "##llama-bench glm pp4096", "##rc 124 60", "##llama-bench glm tg128", "##rc 1 60"])["glm"]
    assert rows == [{"test": "pp512", "tps": 812.35, "stddev": 3.1, "backend": "CPU", "threads": 2, "build": "abc1234",
                     "model": "gemma3 270M Q4_K_M"},
                    {"test": "pp4096", "skipped": "stopped after 60 s (bench_llama_timeout_s)"},
                    {"test": "tg128", "error": "llama-bench failed (exit 1)"}]
    md = bench.markdown("rig-1", result("rig-1", {"glm": {"engine": "llama-server", "url": "http://127.0.0.1:8081",
                                                          "llama_bench": rows, "levels": levels(10)}}))
    print("\n" + md)
    assert "| pp512 | 812.4 | 3.1 | CPU | 2 | abc1234 |" in md
    assert "| pp4096 | stopped after 60 s (bench_llama_timeout_s) | | | | |" in md


SMOKE_MET = json.dumps({"key": "0123456789abcdef", "ok": True, "seconds": 3.2, "runs": [], "traps": ["cpu-repack-crash"],
                        "server_args": ["--no-repack"]})
ROW = ('[{"avg_ts": 640.2, "stddev_ts": 2.0, "backends": "CPU", "n_threads": 2, "build_commit": "abc1234", '
       '"model_type": "t"}]')
NONE = {"traps": [], "server_args": []}
RUN = {"name": "glm", "dest": "/srv/models/m", "model": "/srv/models/m/m.gguf", "ngl": 0}
BINARY = "/opt/rigup/llama.cpp/current/bin/llama-bench"


def test_the_repack_trap_comes_from_the_llama_cpp_catalogue():
    assert bench.REPACK.id == "cpu-repack-crash"
    assert bench.REPACK.ref == "https://github.com/ggml-org/llama.cpp/issues/20824"
    assert bench.REPACK_CODES == (132, 134, 135, 139)       # SIGILL, SIGABRT, SIGBUS, SIGSEGV (Linux)


@pytest.mark.parametrize("text, expected", [
    (SMOKE_MET, {"traps": ["cpu-repack-crash"], "server_args": ["--no-repack"]}),
    (json.dumps({"ok": True, "traps": [], "server_args": ["--no-repack"]}), {**NONE, "server_args": ["--no-repack"]}),
    (json.dumps({"ok": True, "traps": [], "server_args": []}), NONE),
    (json.dumps({"ok": False, "traps": ["cpu-repack-crash"], "server_args": ["--no-repack"]}), NONE),
    (json.dumps({"ok": "true", "traps": ["cpu-repack-crash"]}), NONE),
    (json.dumps({"ok": True, "traps": "cpu-repack-crash", "server_args": "--no-repack"}), NONE),
    (json.dumps({"ok": True, "traps": ["Bad Id", 7, None, "cpu-repack-crash"],
                 "server_args": ["--no-repack; rm -rf /", "--threads 4", "-t", "--x=1", 3, "--no-repack"]}),
     NONE),     # a record that does not read is none, as the converge's reader refuses it (round 33)
    (json.dumps({"ok": True, "traps": ["cpu-repack-crash"], "server_args": ["--no-repack"]}),
     {"traps": ["cpu-repack-crash"], "server_args": ["--no-repack"]}),
    (json.dumps(["ok"]), NONE),
    ('{"ok": true, "traps": ["cpu-repack', NONE),        # half-written
    ("[" * 100000, NONE),
    ("", NONE),
    (None, NONE),
])
def test_the_serving_builds_smoke_result_only_bare_flags_and_ids_count(text, expected):
    assert bench.smoke_remedy(text) == expected


def test_serving_reads_the_smoke_result_in_its_one_command_and_runs_get_the_remedy():
    command = bench.Serving().command(["/srv/models/m/.rigup-complete.json"], BINARY,
                                      "/opt/rigup/llama.cpp/cur rent/rigup-smoke.json")
    assert "tr -d '\\n' < '/opt/rigup/llama.cpp/cur rent/rigup-smoke.json' 2>/dev/null" in command
    assert command.count("rigup-smoke.json") == 1
    marker = "/srv/models/m/.rigup-complete.json"
    out = [f"##marker {marker}", '{"files": ["m.gguf"]}', f"##smoke {SMOKE_MET}", "##llama-bench"]
    seen = bench.Serving().process(out)
    assert seen["smoke"] == {"traps": ["cpu-repack-crash"], "server_args": ["--no-repack"]}
    assert seen["markers"][marker] == {"files": ["m.gguf"]} and bench.repack_remedy(seen["smoke"])
    assert bench.Serving().process(["##smoke", "##llama-bench"])["smoke"] == NONE
    assert not bench.repack_remedy(bench.Serving().process(["##smoke {]"])["smoke"])
    assert bench.repack_remedy({"traps": [], "server_args": ["--no-repack"]})
    data = {"models_dir": "/srv/models", "models": {"m": {"repo": "o/m", "revision": "a" * 40}},
            "llama_server_instances": {"glm": {"model": "m", "port": 8081, "ngl": 0}}}
    assert bench.llama_runs(data, seen) == [{"name": "glm", "dest": "/srv/models/m", "model": "/srv/models/m/m.gguf",
                                             "ngl": 0, "trap": "cpu-repack-crash"}]
    assert "trap" not in bench.llama_runs(data, {**seen, "smoke": bench.smoke_remedy(None)})[0]


def test_llama_bench_argv_with_repack_off_and_the_retry_only_for_pp_while_repacking():
    assert bench.llama_bench_argv(BINARY, RUN, "pp512", 2, 60, True) == [
        "rigup_as_owner", "/srv/models/m", "timeout", "60", BINARY, "-m", "/srv/models/m/m.gguf", "-ngl", "0", "-r", "2", "-o", "json",
        "-p", "512", "-n", "0", "--repack", "0"]
    assert "--repack" not in bench.llama_bench_argv(BINARY, RUN, "tg128", 2, 60, False)
    assert bench.retries("pp4096", False) and not bench.retries("pp4096", True) and not bench.retries("tg128", False)
    remedied = bench.LlamaBench().command([{**RUN, "trap": "cpu-repack-crash"}], BINARY, ["pp512", "tg128"], 2, 60)
    assert remedied.count("--repack 0") == 2 and "case" not in remedied and "##llama-bench-retry" not in remedied
    plain = bench.LlamaBench().command([{**RUN, "model": "/srv/m/it's.gguf"}], BINARY, ["pp512", "tg128"], 2, 60)
    assert plain.count("case $rc in 132|134|135|139) echo '##llama-bench-retry glm pp512'; ") == 1
    assert plain.count("--repack 0") == 1 and "-m '/srv/m/it'\"'\"'s.gguf'" in plain


@pytest.mark.parametrize("code, name", [
    (139, "SIGSEGV"), ("139", "SIGSEGV"), (-11, "SIGSEGV"), (134, "SIGABRT"), (135, "SIGBUS"), (132, "SIGILL"),
    (137, "SIGKILL"), (-9, "SIGKILL"), (0, None), (1, None), ("124", None), (127, None), (128, None), (300, None),
    ("", None), (None, None), ("x", None)])
def test_a_signal_is_named_from_the_exit_status(code, name):
    assert bench.crash_signal(code) == name


def test_a_crash_is_named_the_other_tests_keep_their_rows_and_a_pp_crash_retried_names_the_trap():
    assert bench.crash_text("pp512", "SIGSEGV") == "llama-bench crashed (SIGSEGV) on pp512"
    assert bench.crash_text("pp4096", "SIGKILL") == "llama-bench was killed (SIGKILL) on pp4096"
    rows = bench.LlamaBench().process([
        "##llama-bench glm pp512", "[", "##rc 139 60", "##llama-bench-retry glm pp512", ROW, "##rc 0 60",
        "##llama-bench glm pp4096", "", "##rc 139 60", "##llama-bench-retry glm pp4096", "", "##rc 134 60",
        "##llama-bench glm tg128", ROW, "##rc 0 60",
        "##llama-bench keyed pp512", "", "##rc 137 60", "##llama-bench keyed tg128", "", "##rc -11 60",
        "##llama-bench keyed tg256", '[{"avg_ts": null}]', "##rc 0 60", "##llama-bench keyed pp1", '[7]', "##rc 0 60",
        "##llama-bench-retry keyed pp1", ROW, "##rc 0 60"])
    glm, keyed = rows["glm"], rows["keyed"]
    assert [r["test"] for r in glm] == ["pp512", "pp4096", "tg128"]
    assert glm[0]["tps"] == 640.2 and glm[0]["trap"] == "cpu-repack-crash" and glm[0]["repack"] == 0
    assert glm[0]["crashed"] == "llama-bench crashed (SIGSEGV) on pp512"
    assert glm[0]["note"].startswith("trap cpu-repack-crash: --repack 0 after llama-bench crashed (SIGSEGV) on pp512 "
                                     "(https://github.com/ggml-org/llama.cpp/issues/20824)")
    assert "rebuild and prove llama.cpp on this host (deploy.py)" in glm[0]["note"]
    assert glm[1] == {"test": "pp4096", "signal": "SIGSEGV", "error": "llama-bench crashed (SIGSEGV) on pp4096; again "
                      "with --repack 0: llama-bench crashed (SIGABRT) on pp4096"}
    assert glm[2]["tps"] == 640.2 and "trap" not in glm[2]
    assert keyed == [{"test": "pp512", "error": "llama-bench was killed (SIGKILL) on pp512", "signal": "SIGKILL"},
                     {"test": "tg128", "error": "llama-bench crashed (SIGSEGV) on tg128", "signal": "SIGSEGV"},
                     {"test": "tg256", "error": "llama-bench failed (exit 0)"},
                     {"test": "pp1", "error": "llama-bench failed (exit 0)"},
                     {"test": "pp1", "tps": 640.2, "stddev": 2.0, "backend": "CPU", "threads": 2, "build": "abc1234",
                      "model": "t"}]                    # a retry with no crash before it is a row of its own
    assert bench.LlamaBench().process(["junk", "##llama-bench", "##llama-bench-retry glm pp512", "##rc 124 60"]) == {
        "glm": [{"test": "pp512", "skipped": "stopped after 60 s (bench_llama_timeout_s)"}]}


FAKE_LLAMA_BENCH = """#!/bin/sh
# llama-bench as issue #20824 has it: batched prompt processing dies on SIGSEGV while repacking
case " $* " in
  *" --repack 0 "*) ;;
  *" -p 0 "*) ;;
  *) kill -s SEGV $$ ;;
esac
printf '[\\n  {"avg_ts": 10.5, "stddev_ts": 0.5, "backends": "CPU", "n_threads": 2, "build_commit": "abc",\\n'
printf '   "model_type": "tiny"}\\n]\\n'
"""


def test_llama_bench_on_a_shell_crash_retry_and_remedy(tmp_path):
    import shutil
    import subprocess
    if not (shutil.which("timeout") and shutil.which("sh")):
        pytest.skip("needs sh and coreutils' timeout")
    fake = tmp_path / "llama bench"
    fake.write_text(FAKE_LLAMA_BENCH)
    fake.chmod(0o755)
    runs = [{**RUN, "name": "glm"}, {**RUN, "name": "fixed", "trap": "cpu-repack-crash"}]
    command = bench.LlamaBench().command(runs, str(fake), ["pp512", "tg128"], 1, 30)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60).stdout.splitlines()
    found = bench.LlamaBench().process(out)
    print("\n" + "\n".join(out))
    assert [(r["test"], r.get("tps"), r.get("trap"), r.get("crashed")) for r in found["glm"]] == [
        ("pp512", 10.5, "cpu-repack-crash", "llama-bench crashed (SIGSEGV) on pp512"), ("tg128", 10.5, None, None)]
    assert [(r["test"], r.get("tps"), r.get("crashed")) for r in found["fixed"]] == [("pp512", 10.5, None),
                                                                                      ("tg128", 10.5, None)]


def test_the_report_and_the_progress_line_say_the_trap_and_the_crash(tmp_path, capsys):
    retried_rows = bench.LlamaBench().process(["##llama-bench glm pp512", "##rc 139 60",
                                               "##llama-bench-retry glm pp512", ROW, "##rc 0 60",
                                               "##llama-bench glm tg128", "", "##rc 139 60"])
    remedied_rows = bench.LlamaBench().process(["##llama-bench fixed pp512", ROW, "##rc 0 60"])
    runs = [{**RUN, "name": "glm"}, {**RUN, "name": "fixed", "trap": "cpu-repack-crash"},
            {"name": "old", "error": "no GGUF"}]
    llama = bench.llama_results(runs, {**retried_rows, **remedied_rows})
    assert llama["fixed"] == [{"test": "pp512", "tps": 640.2, "stddev": 2.0, "backend": "CPU", "threads": 2,
                               "build": "abc1234", "model": "t", "trap": "cpu-repack-crash", "repack": 0,
                               "note": "trap cpu-repack-crash: --repack 0, met by the serving build's smoke inference"}]
    assert llama["old"] == [{"test": "llama-bench", "error": "no GGUF"}]
    inst = {"engine": "llama-server", "url": "http://127.0.0.1:8081", "levels": levels(10)}
    md = bench.markdown("rig-1", result("rig-1", {n: {**inst, "llama_bench": rows} for n, rows in llama.items()}))
    assert "| pp512 | 640.2 | 2.0 | CPU | 2 | abc1234 |" in md
    assert "| tg128 | llama-bench crashed (SIGSEGV) on tg128 | | | | |" in md
    assert "\n- trap cpu-repack-crash: --repack 0, met by the serving build's smoke inference\n" in md
    assert "\n- trap cpu-repack-crash: --repack 0 after llama-bench crashed (SIGSEGV) on pp512 (https://" in md
    rig, run = host("rig-1")
    run.bench.update(out=tmp_path, plot=None)   # its end set: record() adds no report
    targets = [{"name": n, "engine": "llama-server", "url": "http://127.0.0.1:8081"} for n in ("fixed", "glm")]
    bench.record(rig, {"bench_max_tokens": 64, "bench_rounds": 2}, {"fixed": {"levels": levels(10)}}, targets, 1.0,
                 {n: llama[n] for n in ("fixed", "glm")})
    line = capsys.readouterr().err.strip()
    with capsys.disabled():
        print("\n" + md + "\n" + line)
    assert ("llama-bench tok/s: fixed pp512 640.2 [trap cpu-repack-crash: --repack 0, met by the serving build's "
            "smoke inference]; ") in line
    assert "; glm pp512 640.2, tg128 llama-bench crashed (SIGSEGV) on tg128 [trap cpu-repack-crash: --repack 0 " \
           "after llama-bench crashed (SIGSEGV) on pp512 (https://github.com/ggml-org/llama.cpp/issues/20824)" in line
    saved = json.loads(json.dumps(run.results["rig-1"]))
    assert saved["instances"]["fixed"]["llama_bench"][0]["note"].startswith("trap cpu-repack-crash: --repack 0")


# ---------------------------------------------------------------- round 2 of issue 61: H1-H9
MARKER = "/srv/models/m/.rigup-complete.json"
BENCH_DATA = {"models_dir": "/srv/models", "models": {"m": {"repo": "o/m", "revision": "a" * 40}},
              "llama_server_instances": {"glm": {"model": "m", "port": 8081, "ngl": 0}}}


@pytest.mark.parametrize("line", ["[" * 200000 + "]" * 200000,                  # H1: RecursionError
                                  "[1, 2]",                                       # H2: .get of a list
                                  '{"files": ["../../etc/shadow.gguf"]}', '{"files": "m.gguf"}', "NaN",
                                  '{"files": ["m.gguf"], "files": ["x.gguf"]}'])
def test_a_marker_that_is_no_marker_is_that_model_not_benched(line):
    """H1/H2: the rigup user's marker nested deep raised RecursionError out of Serving's process (only
    ValueError was caught), and one that is a list broke llama_runs: each ended bench.py's run for every host."""
    seen = bench.Serving().process([f"##marker {MARKER}", line, "##llama-bench"])
    assert seen["markers"] == {MARKER: None}
    assert bench.llama_runs(BENCH_DATA, seen) == [{"name": "glm", "error": f"no model GGUF at {MARKER}"}]


def test_a_unit_line_with_no_unit_is_skipped():
    """H9: '##unit ' with nothing after it raised IndexError."""
    assert bench.Serving().process(["##unit ", "##unit rigup-llama@glm.service loaded active"])["units"] == [
        "rigup-llama@glm.service"]


LEVEL = {"concurrency": 1, "requests": 2, "failed": 0, "tokens": 16, "seconds": 0.5, "total_tps": 32.0,
         "per_request_tps": 16.5, "errors": []}


@pytest.mark.parametrize("line", [
    '{"levels": [{"concurrency": 1, "requests": 1, "failed": 0, "total_tps": NaN, "per_request_tps": Infinity}]}',  # H6
    "{not json",                                                                                             # H3
    json.dumps({"levels": "abc"}),                                                                           # H4
    json.dumps({"levels": [{**LEVEL, "total_tps": "fast"}]}),                                                # H5
    "{" + "[" * 100000,
])
def test_a_throughput_line_that_does_not_read_is_that_instance_not_measured(tmp_path, line):
    """H3-H6: throughput.py's line read with json.loads and merged over the target without a schema:
    a '{' line that is not JSON raised in the fact, levels 'abc' or total_tps 'fast' in the report, NaN kept."""
    found = bench.Throughput().process(["##rigup-bench glm", line])
    print(found)
    assert set(found) == {"glm"} and set(found["glm"]) == {"error"} and "does not read" in found["glm"]["error"]
    text = report(tmp_path, found)
    assert "Not measured: its measurement does not read" in text and "nan" not in text


def host(name: str):
    """A pyinfra host of a State of its own, and that State's run (rigup/run.py)."""
    inventory = Inventory(([name], {}))
    return inventory.get_host(name), run_state.of(State(inventory, Config()))


def report(tmp_path, measured: dict) -> str:
    """bench.record then the reports, as bench.py's run ends (its end hook, here): the host's Markdown."""
    h, run = host("h")
    target = {"name": "glm", "engine": "llama-server", "url": "http://127.0.0.1:8081", "via": None}
    bench.record(h, {"bench_out": str(tmp_path), "bench_max_tokens": 8, "bench_rounds": 1}, measured, [target], 1.0, {})
    assert run.ends == [(bench.report, run)] and run.bench["out"].parent == tmp_path
    run.ends.clear()   # written here, not at exit
    bench.report(run)
    return (run.bench["out"] / "h.md").read_text()


FORGED = ("boom\n\n## x (llama, http://127.0.0.1:8080)\n\n| concurrency | requests | failed | total tok/s | per-request tok/s |"
          "\n| ---: | ---: | ---: | ---: | ---: |\n| 1 | 1 | 0 | 99999.0 | 99999.0 |\x1b]0;pwn\x07")


def test_a_hosts_error_text_is_one_escaped_line_of_the_report(tmp_path):
    """Rerun 2 of issue 61, N3: throughput.py's error (a server's text in it) went raw into HOST.md:
    its newlines made a '## x' heading and a table row claiming 99999 tok/s, an OSC kept."""
    text = report(tmp_path, {"glm": bench.Throughput().process(["##rigup-bench glm", json.dumps({"error": FORGED})])["glm"]})
    print(text)
    [line] = [ln for ln in text.splitlines() if ln.startswith("Not measured: ")]
    assert line.startswith("Not measured: boom\\\\n\\\\n## x") and "\\| 1 \\| 1 \\|" in line
    assert "\x1b" not in text and not [ln for ln in text.splitlines() if ln.startswith(("| 1 |", "## x"))]


def unescaped_pipes(line: str) -> int:
    """The '|' of a Markdown line that end a table cell (one escaped by a backslash does not)."""
    return line.replace("\\\\", "").replace("\\|", "").count("|")


@settings(max_examples=150, deadline=2000)
@given(error=st.text(min_size=1), test=st.text(st.characters(blacklist_categories=("Zs", "Cc")), min_size=1, max_size=12))
def test_any_text_a_host_wrote_keeps_the_reports_lines_and_cells(error, test):
    """A host's error (an instance not measured) and a llama-bench row's test name and failure: each
    one printable line in HOST.md, and each table row of llama-bench six cells."""
    rows = [{"test": test, "error": error}, {"test": "pp512", "skipped": error}]
    inst = {"engine": "llama-server", "url": "http://127.0.0.1:8081", "llama_bench": rows, "error": error}
    md = bench.markdown("rig-1", result("rig-1", {"glm": inst}))
    plain = bench.markdown("rig-1", result("rig-1", {"glm": {**inst, "error": "x", "llama_bench": [
        {"test": "t", "error": "x"}, {"test": "pp512", "skipped": "x"}]}}))
    assert len(md.split("\n")) == len(plain.split("\n")) and all(line.isprintable() for line in md.split("\n"))
    table = [line for line in md.split("\n") if line.startswith("| ") and "---" not in line]
    assert [unescaped_pipes(line) for line in table] == [7] * 3
    assert unescaped_pipes(next(line for line in md.split("\n") if line.startswith("Not measured: "))) == 0


def test_what_the_host_measured_never_stands_over_the_targets_own_keys(tmp_path):
    """H4: the line's url and engine (and levels 'abc', handed to record by any caller) were merged over the target."""
    text = report(tmp_path, {"glm": {"levels": [LEVEL], "url": "http://evil", "engine": "x"}})
    assert "## glm (llama-server, http://127.0.0.1:8081)" in text and "evil" not in text and "| 1 | 2 | 0 | 32.0 | 16.5 |" in text
    assert "Not measured: its measurement does not read" in report(tmp_path, {"glm": {"levels": "abc"}})


@pytest.mark.parametrize("doc", ['[{"avg_ts": true, "stddev_ts": 1.0, "backends": "CUDA"}]',   # H7: 1 tok/s
                                 '[{"avg_ts": 10.0, "stddev_ts": 1e999, "backends": "CUDA"}]',  # H7: inf
                                 '[{"avg_ts": 10.0, "stddev_ts": 1.0, "backends": "CUDA\\u001b]0;x\\u0007"}]',
                                 '[{"avg_ts": 10.0, "stddev_ts": 1.0, "build_commit": "|x|"}]',
                                 "[" * 100000])
def test_llama_benchs_json_out_of_bounds_is_a_failed_row(doc):
    """H7: avg_ts true was read as 1 tok/s, an infinite stddev kept, a backend with OSC and a build
    '|x|' (a cell of the report's table) kept."""
    assert bench.llama_bench_row("tg128", doc, "##rc 0 60") == {"test": "tg128", "error": "llama-bench failed (exit 0)"}


def test_llama_benchs_own_json_is_a_row():
    assert bench.llama_bench_row("pp512", ROW, "##rc 0 60")["tps"] == 640.2


@pytest.mark.parametrize("code", ["\u0661\u0663\u0669", "139.0", "+139x", "1_39", " 139\n"[:-1] + "\u00b2"])
def test_an_exit_status_is_ascii_digits(code):
    """H8: int() read the Arabic-Indic '١٣٩' as 139, a SIGSEGV."""
    assert bench.crash_signal(code) is None


def test_a_test_whose_output_was_cut_before_its_status_is_a_failed_row():
    """Found by tests/unit/test_fact_process.py: no '##rc' line after an attempt (the output cut off)
    raised ValueError (unpacking) out of LlamaBench's process: the run ended for every host."""
    assert bench.LlamaBench().process(["##llama-bench glm pp512", ROW[:20]]) == {
        "glm": [{"test": "pp512", "error": "llama-bench failed (exit ?)"}]}


def test_a_replica_unit_is_measured_once_at_a_port_below_the_instances_replicas():
    """Round 5 E6: active units gemma-99999, gemma-01 and gemma-1 gave [1, 1, 99999]: replica 1 measured
    twice, and port+1+99999 (past 65535) asked with the instance's key."""
    units = ["rigup-llama@gemma-99999.service", "rigup-llama@gemma-01.service", "rigup-llama@gemma-1.service",
             "rigup-llama@gemma-3.service", "rigup-llama@gemma-١.service"]
    print(bench.replica_numbers("gemma", units, 3, 8080), bench.replica_numbers("gemma", units, 1024, 65530))
    assert bench.replica_numbers("gemma", units, 3, 8080) == [1]
    assert bench.replica_numbers("gemma", units, 1024, 65530) == [1, 3]   # 65530 + 1 + 3 is a port, no more


@settings(max_examples=200, deadline=None)
@given(ks=st.lists(st.text("0123456789١", min_size=1, max_size=6), max_size=8),
       replicas=st.integers(1, 1024), port=st.integers(1, 65535))
def test_any_active_units_give_each_replica_once_within_its_count_and_ports(ks, replicas, port):
    units = [f"rigup-llama@m-{k}.service" for k in ks]
    got = bench.replica_numbers("m", units, replicas, port)
    assert got == sorted(set(got)) and all(k < replicas and port + 1 + k <= 65535 for k in got)
    assert all(f"rigup-llama@m-{k}.service" in units for k in got)
