"""bench.py's llama-bench on one lab host that serves Gemma 3 270M with llama-server (CPU build,
deploy.py): llama-bench of the build ``current`` points to, on the instance's model, writes its
rows (pp64, pp4096, tg16: short ones, issue 45; the defaults' pp512 and tg128 took 71 s here)
into the host's Markdown and JSON beside the concurrency table. Each test may take 20 s
(bench_llama_timeout_s): pp64 and tg16 take a few, pp4096 on the lab's 2 shared cores about 27 s
at best, so its row says, on such a machine, that it was stopped (llama-bench killed for real).
The converge also shows the watchdog's default floor at work: the health gate recorded its tok/s
on the host, and the watchdog (no min_tokens_per_s) judges against half of it."""

import json

import pytest

from tests.conftest import on_host
from tests.converge import converge
from tests.roles.watch_lab import run_play

pytestmark = pytest.mark.lab
TESTS = ["pp64", "pp4096", "tg16"]
LIMIT_S = 20


def test_bench_writes_llama_bench_rows(lab, tmp_path):
    name = lab.hosts()[0]["name"]
    # group_vars/lab.yml's gemma without its min_tokens_per_s: 0 (no watchdog there): the watchdog
    # judges it by its default floor, whatever an earlier module left on the host
    gemma = {"model": "gemma-270m", "port": 8081, "ctx": 4096, "parallel": 2, "ngl": 0}
    deployed = converge("inventory/lab.py", "--limit", name, "--data",
                        f"llama_server_instances={json.dumps({'gemma': gemma})}")
    print(f"\ndeploy.py on {name}: {deployed.seconds:.1f} s")
    gated = json.loads(on_host(lab, name, "cat /var/lib/rigup/gate/rigup-llama@gemma.service.json"))
    owner = on_host(lab, name, "stat -c '%U %a' /var/lib/rigup/gate/rigup-llama@gemma.service.json").strip()
    try:
        watched = json.loads(on_host(lab, name, "cat /etc/rigup/watchdog.json"))["instances"]["gemma"]
        on_host(lab, name, "systemctl start rigup-watchdog.service")
        floor = on_host(lab, name, "grep '^rigup_watchdog_floor_tokens_per_second' "
                                   "/var/lib/prometheus/node-exporter/rigup_watchdog.prom").split()[-1]
        print(f"gate record: {gated} ({owner}); watchdog floor {floor} tok/s")
        assert owner == "root 644" and gated["tps"] > 0 and watched["floor"] is None
        assert float(floor) == pytest.approx(gated["tps"] / 2, abs=0.01)
        out = tmp_path / "out"
        settings = {"bench_levels": [1, 2], "bench_max_tokens": 16, "bench_rounds": 1, "bench_out": str(out),
                    "bench_llama_tests": TESTS, "bench_llama_reps": 1, "bench_llama_timeout_s": LIMIT_S}
        run = run_play(tmp_path, "bench.py", {name: settings})
        progress = [ln.strip() for ln in run.output.splitlines() if "bench: " in ln]
        print("\n".join(progress) + f"\nbench.py: {run.seconds:.1f} s")
        assert any(f"[{name}] bench: 1 instance(s)" in ln and "llama-bench tok/s: gemma pp64" in ln for ln in progress)
        day = next(out.iterdir())
        result = json.loads((day / f"{name}.json").read_text())["instances"]["gemma"]
        rows = result["llama_bench"]
        print("llama-bench rows: " + "; ".join(json.dumps(r, sort_keys=True) for r in rows))
        assert [r["test"] for r in rows] == TESTS
        assert all(r["tps"] > 0 and r["backend"] == "CPU" for r in rows if r["test"] != "pp4096")
        assert "tps" in rows[1] or rows[1]["skipped"] == f"stopped after {LIMIT_S} s (bench_llama_timeout_s)"
        assert [lv["concurrency"] for lv in result["levels"]] == [1, 2] and result["levels"][0]["failed"] == 0
        md = (day / f"{name}.md").read_text()
        print(md)
        assert "| test | tok/s | ± | backend | threads | build |" in md
        assert f"| pp64 | {rows[0]['tps']:.1f} |" in md and f"| tg16 | {rows[2]['tps']:.1f} |" in md
        assert "| concurrency | requests | failed | total tok/s | per-request tok/s |" in md
    finally:   # the host as the lab's play leaves it (no watchdog): the next module's converge changes nothing
        converge("inventory/lab.py", "--limit", name)
