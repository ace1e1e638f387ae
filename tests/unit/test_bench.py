"""bench.py's pieces without hosts (rigup/bench.py): the instances it measures, its command on a
host (everything quoted), the fact's parsing, and the reports: Markdown, JSON and the fleet's
PNG, read back (size, not blank, one line per host in its colour)."""

import json
import shlex

import pytest

from rigup import bench

DATA = {"llama_server_instances": {"glm": {"model": "m", "port": 8081},
                                   "keyed": {"model": "m", "port": 8082, "host": "10.0.0.5", "api_key": True}},
        "vllm_instances": {"qwen": {"model": "q", "port": 8000, "served_model_name": "Qwen 3"}}}


def test_targets_and_the_command_on_the_host():
    found = bench.targets(DATA)
    assert [(t["name"], t["engine"], t["url"], t["key"], t["model"]) for t in found] == [
        ("glm", "llama-server", "http://127.0.0.1:8081", None, None),
        ("keyed", "llama-server", "http://10.0.0.5:8082", "/etc/rigup/llama-server/keyed.key", None),
        ("qwen", "vllm", "http://127.0.0.1:8000", None, "Qwen 3")]
    command = bench.sweep_command(found[2], [1, 4], 64, 2, bench.SCRIPT_WORD)
    assert shlex.split(command) == ["python3", "$t", "sweep", "http://127.0.0.1:8000", "--levels", "1,4",
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
    """Pixels of each of bench.COLORS in the PNG at ``path`` (within a small tolerance)."""
    from matplotlib import image
    import numpy

    pixels = (image.imread(path)[:, :, :3] * 255).astype(int)
    counts = []
    for colour in bench.COLORS:
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
    written = bench.write_reports(results, tmp_path)
    assert sorted(p.name for p in written) == ["fleet.png", "rig-1.json", "rig-1.md", "rig-2.json", "rig-2.md"]
    md = (tmp_path / "rig-2.md").read_text()
    assert "| 4 | 8 | 0 | 240.0 | 60.0 |" in md and "Not measured: URLError: refused" in md
    assert json.loads((tmp_path / "rig-1.json").read_text())["instances"]["glm"]["levels"][3]["total_tps"] == 400
    pixels, counts = count_colours(tmp_path / "fleet.png")
    print(f"\nfleet.png {pixels.shape[1]}x{pixels.shape[0]}, pixels per line colour: {counts[:3]}")
    assert pixels.shape[:2] == (bench.PLOT_SIZE_IN[1] * bench.PLOT_DPI, bench.PLOT_SIZE_IN[0] * bench.PLOT_DPI)
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
    assert runs == [{"name": "glm", "model": "/srv/models/m/x/m Q4-00001-of-00002.gguf", "ngl": 0},
                    {"name": "keyed", "model": "/srv/models/m/x/m Q4-00001-of-00002.gguf", "ngl": 99}]
    assert bench.llama_runs(data, {**seen, "llama_bench": False})[0]["error"].startswith("no llama-bench in the build")
    assert bench.llama_bench_args("pp4096") == ["-p", "4096", "-n", "0"]
    assert bench.llama_bench_args("tg128") == ["-p", "0", "-n", "128"]
    with pytest.raises(ValueError):
        bench.llama_bench_args("pp")
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
