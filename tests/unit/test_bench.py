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
