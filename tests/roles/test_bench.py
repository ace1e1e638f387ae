"""bench.py on the lab's 2 hosts, each serving the engine stand-in (tests/lab/engine_stub.py) as
rigup-llama@gemma on 127.0.0.1:8081 at its own rate (150 and 300 tok/s a request, 4 slots): it
writes each host's Markdown and JSON and the fleet's PNG, which this test opens: its size, not
blank, one line per host (found by its colour); the figures follow the stand-ins' rates."""

import json

import pytest

from plays import charts
from tests.roles.watch_lab import run_play, serve_stub, unserve_stub
from tests.unit.test_bench import count_colours

pytestmark = pytest.mark.lab
RATES = (150, 300)
LEVELS = [1, 2, 4, 8]


def test_bench_writes_markdown_json_and_a_plot_with_one_line_per_host(lab, tmp_path):
    pytest.importorskip("matplotlib", reason="requirements-dev.txt installs it")
    names = [h["name"] for h in lab.hosts()][:2]
    out = tmp_path / "out"
    settings = {"llama_server_instances": {"gemma": {"model": "gemma-270m", "port": 8081}},
                "bench_levels": LEVELS, "bench_max_tokens": 30, "bench_rounds": 2, "bench_out": str(out),
                "bench_llama_tests": []}   # llama-bench's rows: tests/roles/test_bench_llama.py
    try:
        for name, tps in zip(names, RATES):
            serve_stub(lab, name, "gemma", 8081, tps=tps, slots=4)
        run = run_play(tmp_path, "bench.py", {name: settings for name in names})
    finally:
        for name in names:
            unserve_stub(lab, name, "gemma")
    progress = [ln.strip() for ln in run.output.splitlines() if "bench: " in ln]
    print("\n" + "\n".join(progress) + f"\nbench.py on 2 hosts: {run.seconds:.1f} s")
    assert all(any(f"[{n}] bench: 1 instance(s)" in ln for ln in progress) for n in names)
    day = next(out.iterdir())
    assert sorted(p.name for p in day.iterdir()) == sorted([f"{n}{s}" for n in names for s in (".md", ".json")]
                                                           + ["fleet.png"])
    for name, tps in zip(names, RATES):
        levels = json.loads((day / f"{name}.json").read_text())["instances"]["gemma"]["levels"]
        print(f"{name} ({tps} tok/s a request, 4 slots): " + "; ".join(
            f"{lv['concurrency']}: {lv['total_tps']} total, {lv['per_request_tps']} per request" for lv in levels))
        assert [lv["concurrency"] for lv in levels] == LEVELS and all(lv["failed"] == 0 for lv in levels)
        # the stand-in paces its tokens; a loaded 2-core machine only slows it (a plumbing test: the
        # measuring itself is checked against check.py on the H200, tests/gpu/results)
        assert 0.5 * tps < levels[0]["per_request_tps"] <= tps * 1.01
        assert levels[2]["total_tps"] > 1.8 * levels[0]["total_tps"]          # 4 slots at once
        md = (day / f"{name}.md").read_text()
        assert "| concurrency | requests | failed | total tok/s | per-request tok/s |" in md and "| 8 | 16 | 0 |" in md
    pixels, counts = count_colours(day / "fleet.png")
    print(f"fleet.png {pixels.shape[1]}x{pixels.shape[0]}, pixels per line colour: {counts[:3]}")
    assert pixels.shape[:2] == (charts.PLOT_SIZE_IN[1] * charts.PLOT_DPI, charts.PLOT_SIZE_IN[0] * charts.PLOT_DPI)
    assert (pixels.sum(axis=2) < 600).mean() > 0.01
    assert counts[0] > 1000 and counts[1] > 1000 and counts[2] < 50       # one line per host, no third
