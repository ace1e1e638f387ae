"""plays/fleet.py (status.py's view): the parsers on captured text, the rows, the table and JSON,
the GPU guard's Xid state read defensively, the table in 120 columns with what is wrong first, and
the status command run by a real shell on fake drop-ins, a fake tripped file and Xid state."""

import json
import subprocess
import time
from pathlib import Path

from hypothesis import given, settings, strategies as st
from pyinfra.api import Config, Inventory, State

from plays import fleet
from rigup import run as run_state
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
    assert set(card) == {"index", "bus", "class", "draw_w", "limit_w", "temp_c", "vram_used_mib", "vram_total_mib",
                         "link"}
    assert [c["bus"] for c in out["cards"]][:4] == ["0000:07:00", "0000:0f:00", "0000:47:00", "0000:4e:00"]
    assert fleet.cards_cell(out) == "8x a100" and fleet.attention_cards(out) == []
    assert fleet.power_cell(out) == "499/3200W 39C"      # the 8 cards' draws summed, over their limits; the hottest
    slow = fleet.parse_cards(_slow_gpu_3() + ["smi_rc=0"])
    assert fleet.cards_cell(slow) == "8x a100"          # the card's row says what
    assert fleet.attention_cards(slow) == [{"name": "GPU 3", "bus": "0000:4e:00",
                                            "problems": [("DOWNTRAINED", "x4 of x16 DOWNTRAINED")]}]


def _slow_gpu_3():
    """The A100 capture with GPU 3 (0000:4e:00) at x4 of its x16 lanes."""
    return [ln.replace(", 4, 16, 580.105.08, 4, 16", ", 4, 4, 580.105.08, 4, 16") if ln.startswith("3,") else ln
            for ln in lines("facts/a100-query-nounits.csv")]


def test_cards_lost_hung_missing_failed():
    lost = fleet.parse_cards(lines("facts/a100-lost-query-nounits.txt") + ["smi_rc=15"])
    assert lost["lost"] >= 1 and lost["smi"] is None          # some cards answered: not "failed"
    assert lost["lost_cards"] == ["0000:47:00"] and fleet.cards_cell(lost) == "7x a100 1 lost"
    assert fleet.attention_cards(lost) == [{"name": "GPU ?", "bus": "0000:47:00",
                                            "problems": [("LOST", "LOST (nvidia-smi cannot reach it)")]}]
    na = fleet.parse_cards(["0, GPU-0a, 00000000:07:00.0, 0x20B210DE, NVIDIA A100-SXM4-80GB, 8.0, 81920, 0, 400.00, "
                            "100.00, 400.00, 400.00, [N/A], 35, Disabled, 4, 16, 580.105.08, 4, 16", "smi_rc=0"])
    assert fleet.power_cell(na) == "?/400W 35C"
    assert fleet.attention_cards(na)[0]["problems"] == [("telemetry lost", "telemetry lost (draw ?, temp 35C)")]
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
    (router,) = fleet.parse_serving(["@@ rigup-llama@duo.service", "active=active", "port=8091", "health=200",
                                     "revision=abc", "models=id:gemma-270m,value:unloaded,id:tiny,value:loaded"])
    assert router["loaded"] == ["tiny"]
    row = {"serving": [{**router, "model": "gemma-270m@abc"}]}
    assert fleet.serving_cell(row) == "duo active :8091 200 gemma-270m@abc [loaded: tiny]"
    assert fleet.loaded_of("") is None and fleet.loaded_of("id:a,value:unloaded") == []


def test_guard_and_build():
    assert fleet.parse_guard([]) == {"tripped": False, "reason": None, "time": None, "xid": {}, "xid_unreadable": None}
    rec = {"t": 1, "time": "2026-11-30 10:00:00 +0000", "reason": "card 0 (a100): 450 W average > 400 W"}
    assert fleet.parse_guard(["tripped", "|" + json.dumps(rec)]) == {"tripped": True, "reason": rec["reason"],
                                                                     "time": rec["time"], "xid": {}, "xid_unreadable": None}
    assert fleet.parse_guard(["tripped", "{half"])["reason"].startswith("(its record does not read: ")


@settings(max_examples=60, deadline=1000)
@given(record=st.one_of(st.text(max_size=40), st.sampled_from(['[' * 200000, '{"a":' * 200000, '{"reason": "x", "reason": "y"}',
                                                              '{"reason": NaN}', '{"reason": {"x": 1}}', "null", "[]"])))
def test_any_tripped_record_is_shown_tripped_never_a_crash(record):
    """Round 2 of issue 61, item 20: a tripped record nested 200000 deep raised RecursionError out of status."""
    guard = fleet.parse_guard(["tripped", record, fleet.XID_MARK, "boot=b", record])
    assert guard["tripped"] is True and isinstance(guard["reason"], str) and guard["xid"] == {} or record.strip() == ""
    if record.startswith("[" * 100):
        print(f"a tripped record nested {len(record)} deep -> tripped, reason {guard['reason']!r}")
    assert fleet.parse_energy([record]) == {} or not record.startswith(("[", "{"))
    assert fleet.parse_build(["/opt/rigup/llama.cpp/builds/lab-base-3f2a1b"]) == "lab-base-3f2a1b"
    assert fleet.parse_build(["builds/b6123-abc/"]) == "b6123-abc"
    assert fleet.parse_build([]) is None
    assert fleet.build_cell({"build": "b6123-3f2a1b9c0d"}) == "b6123-3f2a"     # the hash cut in the table
    assert fleet.build_cell({"build": "mine"}) == "mine" and fleet.build_cell({"build": None}) == "-"
    # the serving build's decode against the one it replaced (its smoke's comparison)
    assert fleet.build_cell({"build": "b6123-3f2a1b9c0d", "build_ratio": 1.016}) == "b6123-3f2a 1.02x"
    assert fleet.parse_build_ratio(["builds/b1", "ratio=0.48"]) == 0.48
    assert fleet.parse_build_ratio(["builds/b1", "ratio=1e9;x"]) is None and fleet.parse_build(["ratio=1"]) is None


SUSPECT = {"since": "2026-12-02 06:40:00 +0000", "line": "NVRM: Xid (PCI:0000:4e:00): 48, pid=7, DBE"}


def xid_state(**cards):
    """The guard's Xid state file (roles/gpu_guard/shipped/guard.py) with ``cards`` (bus: counts or suspect)."""
    return {"boot": "boot-1", "cursor": "s=1", "events": [],
            "cards": {bus: {"counts": {}, "recent": [], "suspect": None, **card} for bus, card in cards.items()}}


def test_xid_state_read_defensively():
    """The guard's Xid state after its marker: counts and suspect per card key; bad JSON, a file cut
    at XID_MAX_BYTES and a state of no cards map are unreadable (named: round 5 C15), wrong types within
    are ignored (never an error); another boot's counts are left out."""
    state = xid_state(**{"0000:4E:00": {"counts": {"application": 1, "memory": 2}, "suspect": SUSPECT},
                         "0000:90:00": {"counts": {"application": 1}}})
    section = ["tripped", "{}", fleet.XID_MARK, "boot=boot-1", json.dumps(state)]
    assert fleet.parse_guard(section)["xid"] == {
        "0000:4e:00": {"counts": {"application": 1, "memory": 2}, "suspect": True, "since": SUSPECT["since"]},
        "0000:90:00": {"counts": {"application": 1}, "suspect": False, "since": None}}
    assert fleet.parse_guard(section)["tripped"] is True                  # the tripped part is read as before
    assert fleet.parse_xid(["boot=boot-2", json.dumps(state)])["0000:4e:00"] == {   # rebooted since: no counts
        "counts": {}, "suspect": True, "since": SUSPECT["since"]}
    multi = json.dumps(state, indent=1).splitlines()                        # however the file is laid out
    assert fleet.parse_xid(["boot=boot-1", "".join(multi)]) == fleet.parse_xid(["boot=", *multi])
    for bad in ("{half", json.dumps(state)[:-40], "[1, 2]", '"text"', "null", "[" * 100000, "",
                json.dumps({"cards": [1]}), json.dumps({"cards": {"0000:4e:00": "hot"}}),
                json.dumps({"cards": {"not a bus": {"counts": {"memory": 3}}}})):
        assert fleet.parse_xid(["boot=boot-1", bad]) == {}, bad
        assert fleet.read_xid(["boot=boot-1", bad])[1] or "cards" in bad, bad   # a cards map of odd entries reads
    odd = {"boot": 7, "cards": {"0000:4e:00": {"counts": {"memory": "2", "bus": True, "gsp": -1, "nvlink": 1.5,
                                                          "firmware": 3}, "suspect": "yes"},
                                "0000:90:00": {"counts": [1], "suspect": {"since": 5}}}}
    assert fleet.parse_xid([json.dumps(odd)]) == {   # a mark that does not read is still one, as the guard holds it
        "0000:4e:00": {"counts": {"firmware": 3}, "suspect": True, "since": None},
        "0000:90:00": {"counts": {}, "suspect": True, "since": None}}
    for mark in ({}, [], 0, ""):   # rerun2's N12, status's side: each read as no mark
        got = fleet.parse_xid([json.dumps({"cards": {"0000:4e:00": {"suspect": mark}}})])["0000:4e:00"]
        assert got["suspect"] is True and got["since"] is None, mark
    for none in (None, False):
        assert fleet.parse_xid([json.dumps({"cards": {"0000:4e:00": {"suspect": none}}})])["0000:4e:00"]["suspect"] is False


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
    assert table[0] == "1 of 3 hosts needs attention: rig-03 (unreachable)"
    assert [t.split()[0] for t in table[1:]] == ["host", "rig-01", "rig-02", "rig-03"]   # sorted by name
    assert table[1].split() == ["host", "cards", "power", "temp", "vram", "build", "serving", "models", "guard"]
    assert "8x a100" in table[3] and "gemma active :8081 200 gemma-270m@dc8aac10 " in table[3]
    assert "499/3200W 39C" in table[3] and "0/640G" in table[3]
    assert "lab-base-3f2a" in table[3] and table[3].endswith(" 1/1     MAINT")
    assert table[4].split(None, 1)[1] == "unreachable (Could not connect (timed out))"
    assert table[2].split()[1] == "none"
    data = json.loads(fleet.render_json(rows))
    assert [h["host"] for h in data["hosts"]] == ["rig-01", "rig-02", "rig-03"]
    assert data["hosts"][1]["serving"][0]["model"] == "gemma-270m@dc8aac10"
    assert data["hosts"][1]["serving"][0]["revision"] == "dc8aac109665e96b4997756aca46909ff5ad7afc"
    assert data["hosts"][1]["downloads"] == ["gemma-270m complete"] and data["hosts"][1]["lost_cards"] == []
    assert data["hosts"][1]["cards"][3]["bus"] == "0000:4e:00" and data["hosts"][1]["guard"]["xid"] == {}
    assert data["hosts"][2] == {"host": "rig-03", "reachable": False, "reason": "Could not connect (timed out)"}



def test_the_rows_are_kept_on_the_run_and_printed_once_at_its_end(capsys):
    """status.py's rows and energy figures live on the run of its State (rigup/run.py), whose end
    prints them with an unreachable row for each host of the run that recorded none."""
    state = State(Inventory((["rig-01", "rig-02", "rig-03"], {})), Config())
    fleet.record_energy(state, {"rig-02": 0.44123})
    for fmt in ("table", "json"):   # the last format asked is the report's
        fleet.record(state, fleet.host_row("rig-02", _found(), downloads=[], maintenance=False, models={}), fmt)
    fleet.record(state, fleet.host_row("rig-01", {}, downloads=[], maintenance=False, models={}), "json")
    run = run_state.of(state)
    assert run.ends == [(fleet.report, state)] and sorted(run.rows) == ["rig-01", "rig-02"]
    run.ends.clear()   # printed here, not at exit
    fleet.report(state)
    data = json.loads(capsys.readouterr().out)
    assert [h["host"] for h in data["hosts"]] == ["rig-01", "rig-02", "rig-03"]
    assert data["hosts"][1]["joules_per_token"] == 0.441 and data["joules_per_token"] == {"rig-02": 0.44123}
    assert data["hosts"][2] == {"host": "rig-03", "reachable": False, "reason": "no reason was logged"}

def _lab_fleet():
    """Four lab hosts as status.py reads them: lab11 typical (8x A100 idle, one instance serving, its
    model downloaded, the guard ok), lab12 with trouble (GPU 3 downtrained and suspect, an Xid on GPU 5,
    the guard tripped and its instance stopped, a download failed), lab13 cut off, lab14 in
    maintenance (its instance stopped) with a card fallen off the bus."""
    typical = {**_found(), "build": ["builds/lab-base-3f2a1b9c0d"]}
    state = xid_state(**{"0000:4e:00": {"counts": {"application": 1, "memory": 2}, "suspect": SUSPECT},
                         "0000:90:00": {"counts": {"application": 1}}})
    stopped = ["@@ rigup-llama@gemma.service", "active=inactive", "port=8081", "health=",
               "revision=dc8aac109665e96b4997756aca46909ff5ad7afc"]
    trouble = {**typical, "gpus": _slow_gpu_3() + ["smi_rc=0"], "serving": stopped,
               "guard": ["tripped", json.dumps({"time": "2026-11-30 09:00:00 +0000",
                                                "reason": "card 0: 450 W average > 400 W"}),
                         fleet.XID_MARK, "boot=boot-1", json.dumps(state)]}
    lost = {**typical, "gpus": lines("facts/a100-lost-query-nounits.txt") + ["smi_rc=15"], "serving": stopped}
    models = {"gemma": "gemma-270m"}
    return [fleet.host_row("lab11", typical, downloads=["gemma-270m complete"], maintenance=False, models=models),
            fleet.host_row("lab12", trouble, downloads=[
                "gemma-270m complete", "big failed: [Errno 28] No space left on device (at 1.0 MiB / 4.0 MiB)"],
                maintenance=False, models=models),
            fleet.unreachable_row("lab13", "Could not connect (timed out)"),
            fleet.host_row("lab14", lost, downloads=["gemma-270m complete"], maintenance=True, models=models)]


def test_an_8_card_host_fits_120_columns_with_what_is_wrong_first():
    """The fleet table in 120 columns: a summary row per host (its cards' total draw / limit, the
    hottest card), the cards that need attention on rows of their own under it, and a first line
    naming the hosts that need attention."""
    typical = fleet.render_table(_lab_fleet()[:1])
    print(f"\n{typical}\n")
    assert typical.splitlines()[1] == ("lab11  8x a100  499/3200W 39C  0/640G  lab-base-3f2a  "
                                       "gemma active :8081 200 gemma-270m@dc8aac10  1/1     ok")
    assert max(map(len, typical.splitlines())) <= 120 and not typical.startswith("1 of")   # nothing wrong
    table = fleet.render_table(_lab_fleet()).splitlines()
    print("\n".join(table))
    print("widths:", [len(ln) for ln in table])
    assert table[0] == ("3 of 4 hosts need attention: lab12 (guard TRIPPED, GPU 3 SUSPECT, GPU 5 Xid, +1 more), "
                        "lab13 (unreachable), and 1 more")        # cut at 120 columns
    assert fleet.host_problems(_lab_fleet()[3]) == ["GPU 0000:47:00 LOST"]
    assert [ln.split()[0] for ln in table if not ln.startswith(" ")][1:] == ["host", "lab11", "lab12", "lab13", "lab14"]
    at = [ln.split()[0] for ln in table].index("lab12")
    assert table[at].split()[:4] == ["lab12", "8x", "a100", "499/3200W"] and table[at].endswith(" TRIPPED")
    assert table[at + 1:at + 6] == [
        "  GPU 3 0000:4e:00  x4 of x16 DOWNTRAINED; Xid application 1, memory 2; SUSPECT since "
        "2026-12-02 06:40:00 +0000",
        "  GPU 5 0000:90:00  Xid application 1",
        "  guard TRIPPED 2026-11-30 09:00:00 +0000: card 0: 450 W average > 400 W",
        "  download big failed: [Errno 28] No space left on device (at 1.0 MiB / 4.0 MiB)",
        "lab13  unreachable (Could not connect (timed out))"]
    assert table[-2].startswith("lab14  7x a100 1 lost  436/2800W 39C  0/560G ") and table[-2].endswith(" MAINT")
    assert table[-1] == "  GPU ? 0000:47:00  LOST (nvidia-smi cannot reach it)"
    assert all(len(ln) <= 120 for ln in table)   # the summary, the hosts' rows (one instance each), the notes
    assert fleet.host_problems(_lab_fleet()[1]) == ["guard TRIPPED", "GPU 3 SUSPECT", "GPU 5 Xid",
                                                    "big download failed"]
    data = json.loads(fleet.render_json(_lab_fleet()))["hosts"]
    assert data[1]["guard"]["xid"]["0000:4e:00"] == {"counts": {"application": 1, "memory": 2}, "suspect": True,
                                                    "since": SUSPECT["since"]}


def test_summary_line():
    """Hosts that need attention by name, their problems (an instance not active, outside
    maintenance), cut to 120 columns; none when all is well."""
    row = fleet.host_row("lab01", _found(), downloads=[], maintenance=False, models={})
    assert fleet.summary_line([row]) is None and fleet.host_problems(row) == []
    row["serving"][0]["active"] = "failed"
    assert fleet.summary_line([row]) == "1 of 1 host needs attention: lab01 (gemma failed)"
    assert fleet.host_problems({**row, "maintenance": True}) == []          # maintenance stops them
    many = [fleet.unreachable_row(f"rig-{i:02d}", "timed out") for i in range(40)]
    line = fleet.summary_line(many)
    print(line)
    assert line.startswith("40 of 40 hosts need attention: rig-00 (unreachable), rig-01 (unreachable)")
    assert len(line) <= 120 and line.endswith("rig-02 (unreachable), and 37 more")


def test_status_command_on_a_real_shell(tmp_path):
    """The sections, a here-document among them, through sh; the guard file and the build link
    with quoting-hostile names; no drop-ins on this machine's /etc/systemd (it reads only)."""
    build = tmp_path / "llama dir;x"
    (build / "builds" / "b1").mkdir(parents=True)
    (build / "current").symlink_to("builds/b1")
    (build / "builds" / "b1" / "rigup-smoke.json").write_text(json.dumps({"ok": True, "compare": {"ratio": 0.97}},
                                                                         sort_keys=True))
    tripped = tmp_path / "tripped $(touch pwned)"
    tripped.write_text(json.dumps({"time": "now", "reason": "too hot"}))
    xid = tmp_path / "xid 'state'; touch pwned2"
    xid.write_text(json.dumps(xid_state(**{"0000:4e:00": {"counts": {"memory": 2}, "suspect": SUSPECT}}), indent=1))
    parts = {"build": fleet.build_section(str(build)), "guard": fleet.guard_section(str(tripped), str(xid)),
             "doc": "cat <<'EOF'\nline one\nEOF", "gpus": fleet.SMI,
             "big": fleet.guard_section(str(tmp_path / "none"), str(tmp_path / "big.json")),
             "none": fleet.guard_section(str(tmp_path / "none"), str(tmp_path / "none"))}
    (tmp_path / "big.json").write_text(json.dumps({"cards": {}, "events": ["x" * fleet.XID_MAX_BYTES]}))   # cut
    out = subprocess.run(["sh", "-c", fleet.status_command(parts)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = fleet.FleetStatus().process(out.stdout.splitlines())
    assert fleet.parse_build(found["build"]) == "b1" and fleet.parse_build_ratio(found["build"]) == 0.97
    guard = fleet.parse_guard(found["guard"])
    assert guard["reason"] == "too hot"
    # boot-1 is not this machine's boot: no counts, the card stays suspect
    assert guard["xid"] == {"0000:4e:00": {"counts": {}, "suspect": True, "since": SUSPECT["since"]}}
    assert found["big"][:2] == [fleet.XID_MARK, f"boot={Path('/proc/sys/kernel/random/boot_id').read_text().strip()}"]
    assert len(found["big"][2]) == fleet.XID_MAX_BYTES + 1 and fleet.parse_guard(found["big"])["xid"] == {}
    assert "more than" in fleet.parse_guard(found["big"])["xid_unreadable"]   # named, never read as no state
    assert found["none"] == [] and fleet.parse_guard(found["none"]) == fleet.parse_guard([])
    assert found["doc"] == ["line one"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def waiting_quick(command: str, timeout: int) -> str:
    """rigup.apt.waiting's shell with 0.2 s between its tries, not 2 (the same loop; a host waits 2 s)."""
    script = waiting(command, timeout)
    assert script.count("sleep 2;") == 1
    return script.replace("sleep 2;", "sleep 0.2;")


def test_apt_waits_while_a_lock_is_held(tmp_path):
    """rigup.apt.waiting on a real shell: an apt stand-in that fails twice on the lists lock, then
    succeeds; a failure that is not a lock is not retried; the timeout ends the wait."""
    fake = tmp_path / "apt-get"
    fake.write_text('#!/bin/sh\nn=$(cat "$0.n" 2>/dev/null || echo 0); echo $((n+1)) > "$0.n"\n'
                    'if [ "$n" -lt 2 ]; then echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by '
                    'process 7 (apt-get)"; exit 100; fi\necho "done $*"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    ok = subprocess.run(["sh", "-c", waiting_quick("apt-get update", 30)], capture_output=True, text=True, env=env)
    print(ok.stdout)
    assert ok.returncode == 0 and "rigup: waiting: E: Could not get lock /var/lib/apt/lists/lock" in ok.stdout
    assert "done update" in ok.stdout and (tmp_path / "apt-get.n").read_text().strip() == "3"
    other = subprocess.run(["sh", "-c", waiting("echo 'E: Unable to locate package x'; exit 100", 30)],
                           capture_output=True, text=True, env=env)
    assert other.returncode == 100 and "waiting" not in other.stdout
    (tmp_path / "apt-get.n").write_text("-100")
    late = subprocess.run(["sh", "-c", waiting_quick("apt-get update", 1)], capture_output=True, text=True, env=env)
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
    ok = subprocess.run(["sh", "-c", waiting_quick(command, 30)], capture_output=True, text=True, env=env)
    print(ok.stdout, f"{time.monotonic() - start:.1f} s")
    assert ok.returncode == 0 and "timed out: run again" in ok.stdout and "done update" in ok.stdout
    assert time.monotonic() - start < 15


def test_a_card_off_the_bus_is_named_as_the_guard_last_saw_it():
    state = {"boot": "b", "cards": {"0000:47:00": {"counts": {"bus": 1}, "suspect": None}},
             "seen": {"0000:47:00": {"index": 2, "uuid": "GPU-2"}, "0000:07:00": {"index": "0"}}}
    xid = fleet.xid_cards(state, "b")
    assert xid["0000:47:00"] == {"counts": {"bus": 1}, "suspect": False, "since": None, "index": 2}
    row = {"cards": [], "lost_cards": ["0000:47:00"], "guard": {"xid": xid}}
    assert fleet.attention_cards(row)[0]["name"] == "GPU 2" and "index" not in xid.get("0000:07:00", {})


def test_joules_per_token_from_prometheus_reaches_the_host_row_and_fits():
    """A monitoring host's answer to rigup:host_joules_per_token: each host's figure, what is not a
    finite positive number left out, nothing on an error or a refused connection; a generating
    host's power cell gains ``0.44J/tok`` and its row still fits 120 columns."""
    answer = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"host": "lab11"}, "value": [1764660000.0, "0.4412"]},
        {"metric": {"host": "lab12"}, "value": [1764660000.0, "+Inf"]},
        {"metric": {"host": "lab13"}, "value": [1764660000.0, "NaN"]},
        {"metric": {}, "value": [1764660000.0, "1"]}, "junk"]}}
    assert fleet.parse_energy([json.dumps(answer)]) == {"lab11": 0.4412}
    assert fleet.parse_energy([]) == {} and fleet.parse_energy(["<html>"]) == {}
    assert fleet.parse_energy([json.dumps({"status": "error", "error": "x"})]) == {}
    assert "rigup:host_joules_per_token" in fleet.energy_section("http://127.0.0.1:9090")
    row = _lab_fleet()[0]
    row["joules_per_token"] = 0.441
    assert fleet.power_cell(row) == "499/3200W 39C 0.44J/tok"
    line = fleet.render_table([row]).splitlines()[1]
    print(line, len(line))
    assert len(line) <= 120


def test_a_routers_loads_come_from_its_relay_and_are_shown_short():
    """issue 49: status.py's loads section (each router's relay, its loads per model) -> the serving
    cell's ``; N loads, last up to S s``; JSON keeps them per model; a model name from the host is
    escaped; a line that is not the relay's is ignored."""
    lines = ["@@ duo", 'rigup_router_model_loads_total{model="gemma-270m"} 3',
             'rigup_router_model_loads_total{model="tiny"} 2', 'rigup_router_model_last_load_seconds{model="tiny"} 0.0731',
             'rigup_router_model_last_load_seconds{model="gemma-270m"} 2.5',
             "rigup_router_queue_waiting 3", "rigup_router_queue_limit 20",
             "@@ other", 'rigup_router_model_loads_total{model="x\x1b[31m"} 1', "garbage 1",
             'rigup_router_model_loads_total{model="y"} 1e999']
    loads = fleet.parse_loads(lines)
    print(loads)
    assert loads["duo"] == {"gemma-270m": {"loads": 3, "last_s": 2.5}, "tiny": {"loads": 2, "last_s": 0.07},
                            fleet.QUEUE: {"waiting": 3, "limit": 20}}
    assert list(loads["other"]) == ["x\\x1b[31m"]
    assert fleet.loads_text(loads["duo"]) == "; 5 loads, last up to 2.5 s; queue 3/20" and fleet.loads_text(None) == ""
    row = {"serving": [{"name": "duo", "active": "active", "port": 8091, "health": 200, "model": "g@1",
                        "loaded": ["tiny"], "loads": loads["duo"]}]}
    assert fleet.serving_cell(row) == "duo active :8091 200 g@1 [loaded: tiny; 5 loads, last up to 2.5 s; queue 3/20]"
    assert "http://10.0.0.1:9101/metrics/duo" in fleet.loads_section("http://10.0.0.1:9101", ["duo"])


def test_status_figures_in_other_digits_underscores_or_text_are_unreadable_never_read_or_a_crash():
    """Red team (issue 61): the relay's queue "٣٣" was read as 33, a build ratio "١.٠٢" as 1.02,
    Prometheus's "1_0" J/token as 10.0 (float() takes it), and host_vars llama_server_tuned.x.tok_s:
    "12" (text) crashed status with a TypeError; each is read through rigup.boundary.numbers now."""
    loads = fleet.parse_loads(["@@ duo", "rigup_router_queue_waiting \u0663\u0663", "rigup_router_queue_limit 20",
                               "rigup_router_queue_waiting 1_0"])
    ratio = [fleet.parse_build_ratio(["builds/b1", f"ratio={r}"]) for r in ("\u0661.\u0660\u0662", "1_0", "1.02")]
    answer = {"status": "success", "data": {"result": [
        {"metric": {"host": h}, "value": [0, v]} for h, v in
        (("a", "1_0"), ("b", "\u0661\u0662"), ("c", "0.4166666666666667"), ("d", "1e-07"), ("e", " 0x1p-2"))]}}
    energy = fleet.parse_energy([json.dumps(answer)])
    tuned = [fleet.tuned_text({"tok_s": t, "baseline_tok_s": 10.0, "concurrency": c})
             for t, c in (("12", 4), (True, 4), (float("nan"), 4), (18.0, "4\x1b[2J"), (18.0, 4))]
    print(f"\n{loads}\n{ratio}\n{energy}\n{tuned}")
    assert loads == {"duo": {fleet.QUEUE: {"limit": 20}}} and ratio == [None, None, 1.02]
    assert energy == {"c": 0.4166666666666667}
    assert tuned == ["tuned: unreadable", "tuned: unreadable", "tuned: unreadable", "tuned 1.80x at ? concurrent",
                     "tuned 1.80x at 4 concurrent"]


def test_a_routers_pinned_model_is_a_server_of_its_own_with_its_model_and_state():
    """issue 63: a model a router pins (per_model: {M: {pinned: true}}) runs as rigup-llama@NAME.M;
    the serving section names it NAME.M, and status.py's configured models (served_models) give it
    its model M: its own entry in the serving cell (state, port, /health, M@revision), a host that
    needs attention while it is down. The router's cell names only what it loads."""
    data = {"llama_server_instances": {"duo": {"model": "g", "also": ["big", "p"], "port": 8091,
                                               "per_model": {"p": {"pinned": True}}},
                                       "solo": {"model": "s", "port": 8081}},
            "vllm_instances": {"v": {"model": "m", "port": 8000}}}
    models = fleet.served_models(fleet.configured("lab1", data))
    assert models == {"duo": "g", "duo.p": "p", "solo": "s", "v": "m"}
    serving = ["@@ rigup-llama@duo.service", "active=active", "port=8091", "health=200", "revision=1",
               "models=id:g,value:loaded,id:big,value:unloaded",
               "@@ rigup-llama@duo.p.service", "active=active", "port=8093", "health=200", "revision=abcdef0123456789"]
    row = fleet.host_row("lab1", {"serving": serving}, downloads=[], maintenance=False, models=models)
    print(fleet.serving_cell(row))
    assert fleet.serving_cell(row) == "duo active :8091 200 g@1 [loaded: g]; duo.p active :8093 200 p@abcdef01"
    assert fleet.host_problems(row) == []
    down = fleet.host_row("lab1", {"serving": serving[:-4] + ["active=failed", "port=8093", "health=000", "revision=a"]},
                          downloads=[], maintenance=False, models=models)
    assert fleet.host_problems(down) == ["duo.p failed"]
    assert [(s["name"], s["model"], s["active"]) for s in down["serving"]] == [("duo", "g@1", "active"),
                                                                             ("duo.p", "p@a", "failed")]


# ----------------------------------------------------------------------------- issue 61, round 2: status's readers in bounds
def test_a_signed_or_out_of_range_port_or_code_is_unknown():
    """round 2 F4/F5: a serving unit's port '-8080' and /health '-1' were shown (':-8080 -1'), a
    relay's 999999999999999999 loads counted; each is unknown now (a port 1..65535, an HTTP status
    100..599, loads below 10**12, a load's seconds below a day)."""
    row = fleet.host_row("h", {"serving": ["@@ rigup-llama@x.service", "active=active", "port=-8080", "health=-1"],
                               "loads": ["@@ x", 'rigup_router_model_loads_total{model="b"} 999999999999999999',
                                         'rigup_router_model_loads_total{model="c"} 3',
                                         'rigup_router_model_last_load_seconds{model="c"} 1e9']},
                         downloads=[], maintenance=False, models={"x": "m"})
    assert (row["serving"][0]["port"], row["serving"][0]["health"]) == (None, None)
    assert row["serving"][0]["loads"] == {"c": {"loads": 3, "last_s": None}}
    ports = [fleet.parse_serving(["@@ u", f"port={p}", f"health={h}"])[0] for p, h in
             (("0", "000"), ("65536", "99"), ("65535", "600"), ("8080", "200"), ("08080", "0200"))]
    assert [(r["port"], r["health"]) for r in ports] == [(None, None), (None, None), (65535, None), (8080, 200), (None, None)]


def test_nvidia_smis_section_is_read_in_bounds():
    """round 2 F9: 200000 identical card lines held status for minutes, each a card. The parser reads
    the first SMI_LINES (a card once); the rest is not understood; the shell's own rc line is the last."""
    line = lines("facts/a100-query-nounits.csv")[0]
    started = time.monotonic()
    out = fleet.parse_cards([line] * 200000 + ["smi_rc=0"])
    assert time.monotonic() - started < 5
    assert len(out["cards"]) == 1 and out["smi"] == "199999 lines not understood"
    assert fleet.parse_cards(["smi_rc=0", "smi_rc=15"])["smi"] == "failed (rc 15)"
    assert fleet.parse_cards(["smi_rc=-1"])["smi"] == "failed (rc None)"


def test_the_smi_section_on_a_real_shell_keeps_its_rc_past_the_line_bound(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ni=0\nwhile [ $i -lt 1000 ]; do echo \"line $i\"; i=$((i+1)); done\nexit 15\n")
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", fleet.status_command({"gpus": fleet.SMI})], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    found = fleet.FleetStatus().process(out.stdout.splitlines())["gpus"]
    assert len(found) == fleet.SMI_LINES + 1 and found[-1] == "smi_rc=15"


@settings(max_examples=200, deadline=1000)
@given(port=st.text(max_size=8), health=st.text(max_size=6),
       loads=st.text(st.sampled_from("0123456789.eE+-"), min_size=1, max_size=12), rc=st.text(max_size=6))
def test_status_figures_are_none_or_within_bounds(port, health, loads, rc):
    """Property: whatever a host prints for a port, a code, a relay's count or nvidia-smi's rc, the
    row holds None or a figure within its bounds."""
    [s] = fleet.parse_serving(["@@ rigup-llama@x.service", f"port={port}", f"health={health}"])
    assert s["port"] is None or 1 <= s["port"] <= 65535
    assert s["health"] is None or 100 <= s["health"] <= 599
    found = fleet.parse_loads(["@@ x", f'rigup_router_model_loads_total{{model="b"}} {loads}'])
    assert all(0 <= m["loads"] < 10**12 for m in found.get("x", {}).values())
    fleet.parse_cards([f"smi_rc={rc}"])


def test_a_watcher_enabled_and_not_active_is_named_among_the_hosts_problems():
    """issue 65: a metrics relay, watchdog timer, GPU guard timer or node exporter that rigup enabled
    and that is not active is named (``metrics relay failed``); one disabled (the watchdog where
    nothing is watched) or not installed is not; systemctl's words of another shape read unknown.
    The section is run through a real sh with a systemctl stand-in on its PATH."""
    lines = ["rigup-metrics-relay.service enabled failed", "rigup-watchdog.timer enabled inactive",
             "rigup-gpu-guard.timer enabled active", "prometheus-node-exporter.service  inactive"]
    assert fleet.parse_watchers(lines) == {"metrics relay": "failed", "watchdog timer": "inactive"}
    assert fleet.parse_watchers(["rigup-watchdog.timer disabled inactive", "sshd.service enabled failed",
                                 "rigup-metrics-relay.service enabled \x1b[31m"]) == {"metrics relay": "unknown"}
    row = fleet.host_row("lab1", {"watchers": lines}, downloads=[], maintenance=False, models={})
    print(fleet.host_problems(row))
    assert fleet.host_problems(row) == ["metrics relay failed", "watchdog timer inactive"]
    assert fleet.host_problems(fleet.host_row("lab1", {}, downloads=[], maintenance=False, models={})) == []


def test_a_timer_whose_service_fails_at_every_run_is_named():
    """rerun3's NW3: the GPU guard's service failing at every run left its timer active and waiting:
    status named nothing, the host unguarded. Each enabled timer's service's last result is read:
    one not ``success`` names the service (``GPU guard failed``), with its unit and where to look."""
    lines = ["rigup-metrics-relay.service enabled active success", "rigup-watchdog.timer enabled active success",
             "rigup-gpu-guard.timer enabled active exit-code", "prometheus-node-exporter.service enabled active success"]
    assert fleet.parse_watchers(lines) == {"GPU guard": "failed"}
    assert fleet.parse_watchers(["rigup-watchdog.timer enabled inactive signal"]) == \
        {"watchdog timer": "inactive", "watchdog": "failed"}
    assert fleet.parse_watchers(["rigup-watchdog.timer disabled inactive exit-code",   # nothing watched there
                                 "rigup-gpu-guard.timer enabled active \x1b[31m",      # another shape: failed
                                 "rigup-metrics-relay.service enabled active exit-code"]) == {"GPU guard": "failed"}
    assert fleet.parse_watchers(["rigup-watchdog.timer enabled active"]) == {}   # an older systemd: no result
    row = fleet.host_row("lab1", {"watchers": lines}, downloads=[], maintenance=False, models={})
    print(fleet.notes(row))
    assert fleet.host_problems(row) == ["GPU guard failed"]
    assert " ".join(ln.strip() for ln in fleet.notes(row)) == ("GPU guard failed (rigup-gpu-guard.service): its last "
                                                              "run failed, its timer runs it again (journalctl -u "
                                                              "rigup-gpu-guard.service)")


def test_the_watchers_section_runs_in_sh(tmp_path):
    stand_in = tmp_path / "systemctl"
    stand_in.write_text('#!/bin/sh\ncase "$1 $2 $3 $4" in\n  "is-enabled rigup-metrics-relay.service  ") echo enabled;;\n'
                        '  "is-active rigup-metrics-relay.service  ") echo failed; exit 3;;\n'
                        '  "is-enabled rigup-gpu-guard.timer  ") echo enabled;;\n'
                        '  "is-active rigup-gpu-guard.timer  ") echo active;;\n'
                        '  "show -p Result --value") [ "$5" = rigup-gpu-guard.service ] && echo exit-code || echo success;;\n'
                        '  is-enabled*) echo "Failed to get unit file state" >&2; exit 1;;\n  *) echo inactive; exit 3;;\nesac\n')
    stand_in.chmod(0o755)
    out = subprocess.run(["sh", "-c", fleet.WATCHERS_SECTION], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True).stdout.splitlines()
    print(out)
    assert fleet.parse_watchers(out) == {"metrics relay": "failed", "GPU guard": "failed"}


@settings(max_examples=200, deadline=1000)
@given(st.lists(st.text(max_size=80), max_size=8))
def test_any_watchers_section_reads_as_known_watchers_and_plain_words(lines):
    found = fleet.parse_watchers(lines)
    assert set(found) <= set(fleet.WATCHERS.values()) | set(fleet.TIMED.values())
    assert all(fleet._STATE.fullmatch(v) for v in found.values())


def test_a_guard_files_line_is_never_a_section_marker_on_a_real_shell(tmp_path):
    """Round 5 C4: a tripped file holding ``##rigup-status:gpus`` ended the guard section, its Xid state
    read as nvidia-smi lines (the suspect card gone from status). Each file's line is behind ``|``."""
    tripped, xid = tmp_path / "tripped", tmp_path / "xid"
    state = xid_state(**{"0000:2b:00": {"suspect": SUSPECT}})
    for text in (f"{fleet.MARK}gpus", f"{fleet.MARK}gpus\n{fleet.XID_MARK}\nboot=x\n{{}}", "tripped", fleet.XID_MARK):
        tripped.write_text(text)
        xid.write_text(f"{fleet.MARK}watchers\n" + json.dumps(state) if text == "tripped" else json.dumps(state))
        out = subprocess.run(["sh", "-c", fleet.status_command({"guard": fleet.guard_section(str(tripped), str(xid)),
                                                                  "gpus": "echo smi_rc=0"})],
                             capture_output=True, text=True, cwd=tmp_path).stdout
        found = fleet.FleetStatus().process(out.splitlines())
        guard = fleet.parse_guard(found["guard"])
        print(f"tripped file {text!r}: sections {sorted(found)}, guard {guard}")
        assert sorted(found) == ["gpus", "guard"] and found["gpus"] == ["smi_rc=0"] and guard["tripped"]
        assert guard["xid"].get("0000:2b:00", {}).get("suspect") or guard["xid_unreadable"]


def test_a_guard_xid_state_that_does_not_read_is_named_never_no_state():
    """Round 5 C15: a state cut at 64 KiB (50 events of long kernel lines) read as {}: no SUSPECT, no note."""
    state = {"boot": "b", "cards": {"0000:2b:00": {"counts": {"memory": 3}, "suspect": {"since": "s", "line": "x"}}},
             "events": [{"t": 1, "card": "0000:2b:00", "line": "NVRM: Xid " + "y" * 1200}] * 50}
    whole = fleet.host_row("h1", {"gpus": ["smi_rc=0"], "guard": [fleet.XID_MARK, "boot=b", "|" + json.dumps(state)]},
                           downloads=[], maintenance=False, models={})
    assert whole["guard"]["xid"]["0000:2b:00"]["suspect"]   # 66 KB: read whole now
    cut = fleet.host_row("h1", {"gpus": ["smi_rc=0"], "guard": [fleet.XID_MARK, "boot=b",
                                                               "|" + json.dumps(state)[:-40]]},
                         downloads=[], maintenance=False, models={})
    table = fleet.render_table([cut])
    print(table)
    assert "Xid state unreadable" in table and fleet.guard_cell(cut) == "?"
    assert fleet.host_problems(cut) == ["Xid state unreadable"]
