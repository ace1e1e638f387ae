"""The benches' code that needs no lab (tests/bench_*.py; bench_ansible's in test_bench_ansible.py):
each one imports, parses its arguments (and refuses bad ones), and writes its tables and results
files from synthetic samples, so that none rots unseen between two runs of a bench."""

import json

import pytest

from tests import bench_fetch, bench_fleet, bench_lab, bench_noop, bench_overlap, bench_smoke
from tests.converge import Run


def test_fetch_sizes_and_its_table():
    assert (bench_fetch.parse([]).mib, bench_fetch.parse([]).hosts) == (256, 3)
    small = bench_fetch.parse(["--mib", "32", "--hosts", "2"])
    assert (small.mib, small.hosts) == (32, 2)
    for bad in (["--hosts", "1"], ["--mib", "4"]):
        with pytest.raises(SystemExit):
            bench_fetch.parse(bad)
    text = bench_fetch.table([("throughput ratio role / hf download (goal >= 0.95)", "1.02"),
                              ("2-host fan-out: hub bytes / model bytes (goal 1x)", "1.00x (33554432 bytes)")])
    print("\n" + text)
    assert text.splitlines()[0].split() == ["what", "value"]
    column = len("throughput ratio role / hf download (goal >= 0.95)") + 2   # the longest label, two spaces
    assert [line[column:] for line in text.splitlines()] == ["value", "1.02", "1.00x (33554432 bytes)"]


def sample(wall: float, cpu: float = 1.0, hosts_cpu: float = 0.5) -> bench_fleet.Sample:
    return bench_fleet.Sample(wall, cpu, 100.0, hosts_cpu, Run(0, "", wall))


def test_fleet_arguments_summary_page_and_files(tmp_path):
    args = bench_fleet.parse(["--sizes", "8,1", "--rounds", "2"])
    assert args.size_list == [1, 8] and args.rounds == 2 and not args.keep
    for bad in (["--sizes", "1,x"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            bench_fleet.parse(bad)
    samples = {1: {"converge": [sample(2.0), sample(2.2)], "status": [sample(1.0), sample(1.0)]},
               8: {"converge": [sample(2.4, 3.0, 4.0), sample(2.8, 3.0, 4.0)], "status": [sample(1.5), sample(1.3)]}}
    sizes = bench_fleet.summary(samples)
    assert sizes[8]["converge"] == {"wall_s": [2.4, 2.8], "median_s": 2.6, "ratio": 1.24, "cpu_s_median": 3.0,
                                    "hosts_cpu_s_median": 4.0, "peak_rss_mib": 100}
    result = {"date": "2026-12-02", "command": "python -m tests.bench_fleet --sizes 1,8", "commit": "abc1234",
              "what_ran": "deploy.py", "cpus": 2, "load_before": [1, 1, 1], "load_after": [2, 2, 2],
              "memory_mib": {"MemTotal": 8000, "MemAvailable": 6000}, "idle_hosts_cpu_s_per_s": 0.1,
              "first": {"first_converge_lab1_s": 50.0}, "sizes": sizes}
    result["bounds"] = bench_fleet.bounds(result)
    assert result["bounds"][8] == {"shared_cores": round((3.0 + 4.0) / 2 / 2.1, 2), "controller": round(3.0 / 2.1, 2)}
    result["slopes"] = bench_fleet.slopes(result)
    page = bench_fleet.markdown(result)
    print("\n" + page)
    assert "| 8 | converge | 2.40 2.80 | 2.60 | 1.24x | 3.00 | 100 | 4.00 |" in page
    assert "8 hosts <= 1.3x: 1.24x (met)" in page
    per_host = result["slopes"]["converge"]["cpu_s_per_host"]
    assert per_host == round((3.0 - sizes[1]["converge"]["cpu_s_median"]) / 7, 4)
    assert f"converge {per_host:.3f} s/host" in page and "PROJECTION (not measured)" in page
    assert "converge <= 0.05 s/host" in page and "8 hosts' controller CPU <= 2x 1 host's wall" in page
    stem = bench_fleet.save(result, page, "fleet", tmp_path)
    assert stem.with_suffix(".md").read_text() == page
    assert json.loads(stem.with_suffix(".json").read_text())["sizes"]["8"]["converge"]["median_s"] == 2.6
    assert bench_fleet.limit(bench_fleet.names(2)) == ["--limit", "lab1", "--limit", "lab2"]


def test_overlap_build_seconds_and_results(tmp_path):
    run = Run(0, "    [lab1] llama.cpp build lab-base-1a2b: 40% (120 s)\n"
                 "    [lab1] llama.cpp build lab-base-1a2b: done in 301 s\n", 320.0)
    assert bench_overlap.build_seconds(run, "lab1") == 301
    with pytest.raises(RuntimeError, match="no build on lab2"):
        bench_overlap.build_seconds(run, "lab2")
    figures = {"a_s": 330.0, "build_s": 301, "b_s": 300.0, "c_s": 350.0, "load_s": 5.0, "model_mib": 241.4,
               "rate_kib_s": 821.0, "max_plus_load_s": 335.0, "sum_s": 635.0, "ratio": 1.045, "ccache": False}
    stem = bench_overlap.write_results(figures, tmp_path)
    page = stem.with_suffix(".md").read_text()
    print("\n" + page.splitlines()[-1])
    assert "c / (max(a, b) + load) = 1.04 (goal <= 1.1); c / (a + b + load) = 0.55." in page
    assert json.loads(stem.with_suffix(".json").read_text()) == figures


def test_smoke_arguments_figures_and_results(tmp_path):
    assert bench_smoke.parse(["--rounds", "1"]).rounds == 1
    with pytest.raises(SystemExit):
        bench_smoke.parse(["--rounds", "0"])
    figures = bench_smoke.figures_of({"on": [14.0, 15.0, 16.0], "off": [10.0, 11.0, 12.0]}, [3.1, 3.3, 3.2])
    assert (figures["smoke_adds_s"], figures["ratio_on_off"], figures["smoke_script_s_median"]) == (4.0, 1.364, 3.2)
    out = bench_smoke.write_results(figures, tmp_path)
    page = out.with_suffix(".md").read_text()
    print("\n" + page.splitlines()[-1])
    assert "| on | 15.00 s | 3 |" in page and "The smoke adds 4.00 s (1.36x)" in page
    assert json.loads(out.read_text())["rounds"] == 3


def test_noop_arguments_and_report():
    with pytest.raises(SystemExit):
        bench_noop.parse([])              # --base is required
    assert bench_noop.parse(["--base", "eb4a244"]).rounds == 5
    text = bench_noop.report({"base": ([2.0, 2.2, 2.1], [1.0, 1.2, 1.1]),
                              "this tree": ([2.1, 2.3, 2.2], [1.1, 1.3, 1.2])}, "eb4a244")
    print("\n" + text)
    assert text.splitlines()[-2:] == ["this tree / base (eb4a244), wall: 1.05x",
                                      "this tree / base (eb4a244), controller CPU: 1.09x"]
    assert "median 2.10" in text.splitlines()[0] and "controller CPU s: 1.00 1.20 1.10; median 1.10" in text


def test_lab_table():
    text = bench_lab.table([("lab-up, 1 host", 12.34), ("second converge, per host", 1.5)])
    print("\n" + text)
    assert text.splitlines() == ["what".ljust(25) + "  seconds", "lab-up, 1 host".ljust(25) + "     12.3",
                                 "second converge, per host" + "      1.5"]
