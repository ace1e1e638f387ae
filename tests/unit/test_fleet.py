"""rigup/fleet.py (status.py's view): the parsers on captured text, the rows, the table and JSON,
and the status command run by a real shell on fake drop-ins and a fake tripped file."""

import json
import subprocess
import time
from pathlib import Path

from rigup import fleet
from rigup.apt import UPDATE_TIMEOUT_S, updated, waiting
from roles.model_fetch.plan import short_progress

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def lines(name):
    return (FIX / name).read_text().splitlines()


def test_cards_from_a100_capture():
    out = fleet.parse_cards(lines("facts/a100-query-nounits.csv") + ["smi_rc=0"])
    assert out["smi"] is None and out["lost"] == 0 and len(out["cards"]) == 8
    card = out["cards"][0]
    assert card["class"] == "a100" and card["limit_w"] == 400.0 and card["vram_total_mib"] > 40000
    assert set(card) == {"index", "class", "draw_w", "limit_w", "temp_c", "vram_used_mib", "vram_total_mib", "link"}
    assert fleet.cards_cell(out) == "8x a100"
    slow = [ln.replace(", 4, 16, 580.105.08, 4, 16", ", 4, 4, 580.105.08, 4, 16") if ln.startswith("3,") else ln
            for ln in lines("facts/a100-query-nounits.csv")]
    assert fleet.cards_cell(fleet.parse_cards(slow + ["smi_rc=0"])) == "8x a100 (GPU 3 x4 of x16 DOWNTRAINED)"


def test_cards_lost_hung_missing_failed():
    lost = fleet.parse_cards(lines("facts/a100-lost-query-nounits.txt") + ["smi_rc=15"])
    assert lost["lost"] >= 1 and lost["smi"] is None          # some cards answered: not "failed"
    assert fleet.parse_cards(["smi_rc=124"])["smi"] == "hung"
    assert fleet.parse_cards([])["smi"] == "missing"
    assert fleet.parse_cards(["NVIDIA-SMI has failed because it couldn't communicate", "smi_rc=9"])["smi"] == "failed (rc 9)"


def test_serving_sections():
    out = fleet.parse_serving(["@@ rigup-llama@gemma.service", "active=active", "port=8081", "health=200",
                               "revision=dc8aac109665e96b4997756aca46909ff5ad7afc",
                               "@@ rigup-vllm@big.service", "active=failed", "port=", "health=000", "revision=None"])
    assert out == [
        {"unit": "rigup-llama@gemma.service", "engine": "llama", "name": "gemma", "active": "active", "port": 8081,
         "health": 200, "revision": "dc8aac109665e96b4997756aca46909ff5ad7afc"},
        {"unit": "rigup-vllm@big.service", "engine": "vllm", "name": "big", "active": "failed", "port": None,
         "health": None, "revision": None}]


def test_guard_and_build():
    assert fleet.parse_guard([]) == {"tripped": False, "reason": None, "time": None}
    rec = {"t": 1, "time": "2026-11-30 10:00:00 +0000", "reason": "card 0 (a100): 450 W average > 400 W"}
    assert fleet.parse_guard(["tripped", json.dumps(rec)]) == {"tripped": True, "reason": rec["reason"],
                                                               "time": rec["time"]}
    assert fleet.parse_guard(["tripped", "{half"])["reason"] == "(no reason recorded)"
    assert fleet.parse_build(["/opt/rigup/llama.cpp/builds/lab-base-3f2a1b"]) == "lab-base-3f2a1b"
    assert fleet.parse_build(["builds/b6123-abc/"]) == "b6123-abc"
    assert fleet.parse_build([]) is None


def test_short_progress():
    assert short_progress("g", {"complete": True}) == "g complete"
    running = {"running": True, "progress": {"bytes": 50, "total": 200, "state": "running"}}
    assert short_progress("g", running) == "g 25.0% running"
    failed = {"progress": {"bytes": 1 << 20, "total": 4 << 20, "state": "failed", "error": "no space left"}}
    assert short_progress("g", failed) == "g failed: no space left (at 1.0 MiB / 4.0 MiB)"
    assert short_progress("g", {}) == "g not here yet"


def _found():
    return {"gpus": lines("facts/a100-query-nounits.csv") + ["smi_rc=0"],
            "build": ["builds/lab-base-3f2a"],
            "serving": ["@@ rigup-llama@gemma.service", "active=active", "port=8081", "health=200",
                        "revision=dc8aac109665e96b4997756aca46909ff5ad7afc"],
            "guard": []}


def test_rows_table_and_json():
    rows = [fleet.host_row("rig-02", _found(), downloads=["gemma-270m complete"], maintenance=True,
                           models={"gemma": "gemma-270m"}),
            fleet.unreachable_row("rig-03", "Could not connect (timed out)"),
            fleet.host_row("rig-01", {}, downloads=[], maintenance=False, models={})]
    table = fleet.render_table(rows).splitlines()
    print("\n".join(table))
    assert [t.split()[0] for t in table] == ["host", "rig-01", "rig-02", "rig-03"]   # sorted by name
    assert "8x a100" in table[2] and "gemma active :8081 200 gemma-270m@dc8aac109665" in table[2]
    assert "lab-base-3f2a" in table[2] and "MAINTENANCE" in table[2] and "gemma-270m complete" in table[2]
    assert table[3].split(None, 1)[1] == "unreachable (Could not connect (timed out))"
    assert table[1].split()[1] == "none"
    data = json.loads(fleet.render_json(rows))
    assert [h["host"] for h in data["hosts"]] == ["rig-01", "rig-02", "rig-03"]
    assert data["hosts"][1]["serving"][0]["model"] == "gemma-270m@dc8aac109665"
    assert data["hosts"][2] == {"host": "rig-03", "reachable": False, "reason": "Could not connect (timed out)"}


def test_status_command_on_a_real_shell(tmp_path):
    """The sections, a here-document among them, through sh; the guard file and the build link
    with quoting-hostile names; no drop-ins on this machine's /etc/systemd (it reads only)."""
    build = tmp_path / "llama dir;x"
    (build / "builds" / "b1").mkdir(parents=True)
    (build / "current").symlink_to("builds/b1")
    tripped = tmp_path / "tripped $(touch pwned)"
    tripped.write_text(json.dumps({"time": "now", "reason": "too hot"}))
    parts = {"build": fleet.build_section(str(build)), "guard": fleet.guard_section(str(tripped)),
             "doc": "cat <<'EOF'\nline one\nEOF", "gpus": fleet.SMI}
    out = subprocess.run(["sh", "-c", fleet.status_command(parts)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = fleet.FleetStatus().process(out.stdout.splitlines())
    assert fleet.parse_build(found["build"]) == "b1"
    assert fleet.parse_guard(found["guard"])["reason"] == "too hot"
    assert found["doc"] == ["line one"]
    assert not (tmp_path / "pwned").exists()


def test_apt_waits_while_a_lock_is_held(tmp_path):
    """rigup.apt.waiting on a real shell: an apt stand-in that fails twice on the lists lock, then
    succeeds; a failure that is not a lock is not retried; the timeout ends the wait."""
    fake = tmp_path / "apt-get"
    fake.write_text('#!/bin/sh\nn=$(cat "$0.n" 2>/dev/null || echo 0); echo $((n+1)) > "$0.n"\n'
                    'if [ "$n" -lt 2 ]; then echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by '
                    'process 7 (apt-get)"; exit 100; fi\necho "done $*"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    ok = subprocess.run(["sh", "-c", waiting("apt-get update", 30)], capture_output=True, text=True, env=env)
    print(ok.stdout)
    assert ok.returncode == 0 and "rigup: waiting: E: Could not get lock /var/lib/apt/lists/lock" in ok.stdout
    assert "done update" in ok.stdout and (tmp_path / "apt-get.n").read_text().strip() == "3"
    other = subprocess.run(["sh", "-c", waiting("echo 'E: Unable to locate package x'; exit 100", 30)],
                           capture_output=True, text=True, env=env)
    assert other.returncode == 100 and "waiting" not in other.stdout
    (tmp_path / "apt-get.n").write_text("-100")
    late = subprocess.run(["sh", "-c", waiting("apt-get update", 1)], capture_output=True, text=True, env=env)
    assert late.returncode == 100 and "still held after 1 s" in late.stdout


def test_download_progress_read_by_a_real_shell(tmp_path):
    """roles/model_fetch's progress_command (no python on the host) on real files: a complete
    model, a failed one, one whose job holds its lock, one not started; names with spaces."""
    import fcntl

    from roles.model_fetch.facts import parse_progress, progress_command

    rev = "a" * 40
    specs = [{"name": n, "dest": str(tmp_path / f"m {n}"), "repo": "o/r", "revision": rev}
             for n in ("done", "failed", "busy", "new")]
    for spec in specs[:3]:
        (Path(spec["dest"]) / ".rigup-fetch").mkdir(parents=True)
    (Path(specs[0]["dest"]) / ".rigup-complete.json").write_text(json.dumps({"repo": "o/r", "revision": rev}))
    (Path(specs[1]["dest"]) / ".rigup-fetch/progress.json").write_text(
        json.dumps({"state": "failed", "error": "no space", "bytes": 1, "total": 4}, indent=1))
    lock = open(Path(specs[2]["dest"]) / ".rigup-fetch/lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    out = subprocess.run(["sh", "-c", progress_command(specs)], capture_output=True, text=True)
    lock.close()
    states = parse_progress(out.stdout.splitlines(), specs)
    assert [short_progress(n, states[n]) for n in ("done", "failed", "busy", "new")] == [
        "done complete", "failed failed: no space (at 1 B / 4 B)", "busy 0 B running", "new not here yet"]


def test_a_hung_apt_update_is_killed_and_run_again(tmp_path):
    """An apt-get update that never ends (apt's http method waiting on a connection its proxy
    closed) is killed by its bound (rigup.apt.updated) and run again by waiting()."""
    fake = tmp_path / "apt-get"
    fake.write_text('#!/bin/sh\nn=$(cat "$0.n" 2>/dev/null || echo 0); echo $((n+1)) > "$0.n"\n'
                    'if [ "$n" -lt 1 ]; then sleep 60; fi\necho "done $*"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    command = updated().replace(f" {UPDATE_TIMEOUT_S} ", " 1 ")
    start = time.monotonic()
    ok = subprocess.run(["sh", "-c", waiting(command, 30)], capture_output=True, text=True, env=env)
    print(ok.stdout, f"{time.monotonic() - start:.1f} s")
    assert ok.returncode == 0 and "timed out: run again" in ok.stdout and "done update" in ok.stdout
    assert time.monotonic() - start < 15
