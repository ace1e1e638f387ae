"""The guard's debounce, history and bounded nvidia-smi call (roles/gpu_guard/shipped/guard.py), on
hand-made samples and the simulated nvidia-smi (tests/lab/nvidia_smi.py) run as a real process."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary.numbers import number
from rigup.config import group_vars
from roles.gpu_guard import guard_config
from roles.gpu_guard.checks import check_debounce
from roles.gpu_guard.shipped.guard import debounced, evaluate, keep, parse_sample, read_cards, reading, run_bounded, unit_timeout_s

LAB = Path(__file__).resolve().parents[1] / "lab"
CONFIG = {"window_s": 10, "interval_s": 2, "smi_timeout_s": 3, "debounce": {"bad": 2, "of": 3},
          "by_pci_id": {"10de:20c2": {"class": "cmp170hx", "draw_w": 200, "temp_c": 72}}, "default": {"temp_c": 85}}
GOOD = "0, GPU-a, 00000000:07:00.0, 0x20C210DE, 100.00, 180.00, 40"
NA = "0, GPU-a, 00000000:07:00.0, 0x20C210DE, [N/A], 180.00, 40"


def judged(history: list[dict], t: float, *lines: str) -> list[dict]:
    """``history`` with one more sample of ``lines`` at ``t``, judged as the guard does."""
    cards, lost = parse_sample(list(lines))
    history = keep(history, CONFIG, t) + [{"t": t, "cards": cards, "lost": lost}]
    history[-1]["bad"] = evaluate(history, CONFIG, t)
    return history


def run(*samples: str) -> list[tuple[str | None, int]]:
    """The debounce's answer after each of ``samples`` (one line each, 2 s apart)."""
    history, out = [], []
    for i, line in enumerate(samples):
        history = judged(history, 2 * i, line)
        out.append(debounced(history, CONFIG))
    return out


def test_one_na_sample_does_not_trip_two_of_three_do():
    answers = run(GOOD, NA, GOOD, GOOD, NA, GOOD, NA)
    assert [reason for reason, _ in answers][:6] == [None] * 6          # NA, GOOD, GOOD, NA: never 2 of 3
    assert [count for _, count in answers] == [0, 1, 1, 1, 1, 1, 2]
    assert answers[-1][0] == "telemetry lost: GPU 0 (GPU-a, 00000000:07:00.0) reads power.draw [N/A], temperature.gpu 40"


def test_k_of_n_counts_every_kind_of_bad_sample():
    hot = GOOD.replace(", 40", ", 80")
    assert run(hot, NA)[-1] == ("telemetry lost: GPU 0 (GPU-a, 00000000:07:00.0) reads power.draw [N/A], "
                                "temperature.gpu 40", 2)
    assert "temperature 80 C > 72 C" in run(NA, GOOD, hot)[-1][0]
    single = {**CONFIG, "debounce": {"bad": 1, "of": 1}}                 # the old behaviour: trips at once
    assert debounced(judged([], 0, NA), single)[0].startswith("telemetry lost")


def test_the_average_stays_over_the_window_while_history_covers_the_debounce():
    history = []
    for t in range(0, 30, 2):
        history = judged(history, t, GOOD.replace("100.00", "230.00"))
    assert [s["t"] for s in history] == list(range(8, 30, 2))           # horizon max(10, 4 * (2 + 3)) = 20 s
    assert "average draw 230.0 W over 10 s (6 samples) > 200 W" in history[-1]["bad"]
    slow = {**CONFIG, "debounce": {"bad": 2, "of": 6}}                   # 7 periods of 5 s: 35 s kept
    assert len(keep([{"t": t} for t in range(0, 65, 5)], slow, 60)) == 8


def test_config_unit_timeout_and_debounce_checks():
    conf = guard_config({**group_vars("all"), "gpu_guard_smi_timeout": 7})
    assert (conf["smi_timeout_s"], conf["interval_s"], conf["debounce"]) == (7, 10, {"bad": 2, "of": 3})
    assert unit_timeout_s(7) == 7 + 2 + 10 + 4 * (20 + 2) + 10
    assert check_debounce({}, {}, {"gpu_guard_debounce_bad": 3, "gpu_guard_debounce_samples": 3}) == []
    (r,) = check_debounce({}, {}, {"gpu_guard_debounce_bad": 4, "gpu_guard_debounce_samples": 3})
    assert (r.what, r.why) == ("gpu_guard_debounce_bad", "expected at most gpu_guard_debounce_samples (3), got 4")


def test_run_bounded_kills_the_whole_process_group():
    started = time.monotonic()
    rc, out = run_bounded(["sh", "-c", "echo begun; sleep 300 & sleep 300"], 1)    # a child holds the pipe
    took = time.monotonic() - started
    print(f"a call with a pipe-holding child came back in {took:.2f} s (timeout 1 s)")
    assert rc is None and out == "begun\n" and took < 3
    assert run_bounded(["sh", "-c", "echo ok; exit 3"], 5) == (3, "ok\n")


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """The simulated nvidia-smi (a100 profile) first on PATH; returns its `sim` command."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(json.loads((LAB / "gpu_profiles.json").read_text())["a100"]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(LAB / "nvidia_smi.py")
    for key, value in (("RIGUP_GPU_SIM_PROFILE", profile), ("RIGUP_GPU_SIM_RUN", tmp_path / "run"),
                       ("RIGUP_GPU_SIM_LIB", tmp_path / "lib"), ("PATH", f"{bin_dir}:{os.environ['PATH']}")):
        monkeypatch.setenv(key, str(value))
    return lambda *args: subprocess.run(["nvidia-smi", "sim", *args], check=True)


def test_a_hung_nvidia_smi_is_lost_telemetry_and_leaves_nothing(smi, capsys):
    smi("set", "-i", "3", "--na", "power.draw")
    cards, lost = read_cards({"smi_timeout_s": 5})
    assert len(cards) == 8 and lost == ["GPU 3 (%s, 00000000:4E:00.0) reads power.draw [N/A], temperature.gpu 39"
                                        % cards[3]["uuid"]]
    smi("set", "--hang", "1")
    started = time.monotonic()
    assert read_cards({"smi_timeout_s": 1}) == ([], ["nvidia-smi did not answer within 1 s"])
    took = time.monotonic() - started
    assert "<4>rigup-gpu-guard: nvidia-smi did not answer within 1 s; killed it and its process group" \
        in capsys.readouterr().out
    print(f"hung nvidia-smi: sample lost after {took:.2f} s (timeout 1 s)")
    assert took < 3
    leftovers = subprocess.run(["pgrep", "-f", "^sleep 86400$"], capture_output=True, text=True).stdout
    assert leftovers == ""
    smi("set", "--hang", "0", "-i", "3", "--na", "none")
    assert read_cards({"smi_timeout_s": 5})[1] == []


def test_a_driver_installed_before_its_reboot_is_not_judged_but_a_card_that_fails_is():
    """nvidia-smi's 'Driver/library version mismatch' (exit 18: a driver installed, the host not yet
    rebooted, as during a driver roll) never trips: tripping would stop serving for no card's fault
    and outlive the reboot that cures it. Any other lost telemetry still counts."""
    swapped = "Failed to initialize NVML: Driver/library version mismatch"
    history = []
    for t in range(0, 20, 2):
        cards, lost = parse_sample([swapped], 18)
        history = keep(history, CONFIG, t) + [{"t": t, "cards": cards, "lost": lost}]
        history[-1]["bad"] = evaluate(history, CONFIG, t)
    assert lost == [swapped] and debounced(history, CONFIG) == (None, 0)
    assert run(NA, GOOD, NA)[-1][0].startswith("telemetry lost")


def test_an_nvswitch_fabric_down_drains_at_its_second_look_and_clears_when_it_is_back(tmp_path, monkeypatch, capsys):
    """issue 48: on an NVSwitch host (config ``fabric``) the fabric manager stopped trips the guard
    naming it (serving stopped) when two checks in a row say so (issue 65); once it runs again at the driver's version and every card
    reads Completed/Success, the next check clears the trip (an operator need not) and starts the
    serving units whose start its condition skipped meanwhile (a boot while tripped). A host without
    NVSwitch reads nothing of it. The lab's nvidia-smi (hgx-h100) and a systemctl stand-in."""
    from roles.gpu_guard.shipped import guard

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(json.loads((LAB / "gpu_profiles.json").read_text())["hgx-h100"]))
    bin_dir, state = tmp_path / "bin", tmp_path / "fm.state"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(LAB / "nvidia_smi.py")
    # gemma's start was skipped by the tripped file's condition (a boot while tripped); tiny was stopped by hand
    started = tmp_path / "started"
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\n[ "$1" = is-active ] && {{ cat {state}; exit 0; }}\n'
        'case "$*" in *--all*) printf "rigup-llama@gemma.service loaded inactive dead x\\nrigup-llama@tiny.service '
        'loaded inactive dead x\\n";; show*) printf "Id=rigup-llama@gemma.service\\nActiveState=inactive\\n'
        'ConditionResult=no\\n\\nId=rigup-llama@tiny.service\\nActiveState=inactive\\nConditionResult=yes\\n";; '
        f'start*) echo "$*" >> {started};; esac\nexit 0\n')
    (bin_dir / "systemctl").chmod(0o755)
    ready = tmp_path / "ready"
    for key, value in (("RIGUP_GPU_SIM_PROFILE", profile), ("RIGUP_GPU_SIM_RUN", tmp_path / "run"),
                       ("RIGUP_GPU_SIM_LIB", tmp_path / "lib"), ("RIGUP_GPU_SIM_FABRIC", ready),
                       ("PATH", f"{bin_dir}:{os.environ['PATH']}")):
        monkeypatch.setenv(key, str(value))
    config = {**CONFIG, "tripped_file": str(tmp_path / "tripped.json"), "samples_file": str(tmp_path / "s.json"),
              "metrics_file": str(tmp_path / "m.prom"), "units": [], "default": {"temp_c": 85, "draw_w": 800},
              "by_pci_id": {}, "fabric": {"service": "nvidia-fabricmanager.service"}}
    assert guard.fabric_problem({**config, "fabric": None}, [], []) == (None, True)
    state.write_text("inactive\n")
    assert guard.check(config) == 0
    assert not Path(config["tripped_file"]).exists()          # one answer: no drain (issue 65)
    assert "rigup_gpu_fabric_up 0" in Path(config["metrics_file"]).read_text().splitlines()
    assert guard.check(config) == 0                            # the second in a row: drained
    record = json.loads(Path(config["tripped_file"]).read_text())
    assert "rigup_gpu_fabric_up 0" in Path(config["metrics_file"]).read_text().splitlines()
    print(record["reason"])
    assert record["fabric"] is True and record["reason"] == "the NVSwitch fabric: nvidia-fabricmanager.service is inactive"
    state.write_text("active\n")                  # running, not registered yet (another version, or starting)
    assert guard.fabric_problem(config, *guard.read_cards(config)) == ("8 of 8 cards read fabric In Progress, N/A", True)
    # a read that lost telemetry (a hung nvidia-smi) says nothing of the fabric: neither tripped on nor cleared
    assert guard.fabric_problem(config, [], ["nvidia-smi did not answer within 3 s"]) == \
        ("not read (nvidia-smi did not answer within 3 s)", False)
    guard.check(config)
    assert Path(config["tripped_file"]).exists()
    ready.write_text("580.105.08\n")             # registered at the driver's version
    subprocess.run(["nvidia-smi", "sim", "set", "--hang", "1"], check=True)   # but the cards' read hangs: not cleared
    guard.check({**config, "smi_timeout_s": 1})
    assert Path(config["tripped_file"]).exists()
    subprocess.run(["nvidia-smi", "sim", "set", "--hang", "0"], check=True)
    assert guard.fabric_problem(config, *guard.read_cards(config)) == (None, True)
    assert not started.exists()
    guard.check(config)
    assert not Path(config["tripped_file"]).exists()
    print(started.read_text())                   # what its condition skipped starts now; what a hand stopped does not
    assert started.read_text() == "start rigup-llama@gemma.service\n"
    guard.check(config)                          # judged again: serving, the fabric up in the metrics
    assert "rigup_gpu_fabric_up 1" in Path(config["metrics_file"]).read_text().splitlines()
    out = capsys.readouterr().out
    assert "TRIPPED: the NVSwitch fabric" in out and "the NVSwitch fabric is back" in out
    assert "the NVSwitch fabric: nvidia-fabricmanager.service is inactive (1 of 2 checks in a row" in out


def fabric_host(tmp_path, monkeypatch, answers):
    """An NVSwitch host of the lab's nvidia-smi (hgx-h100, its fabric registered) whose ``systemctl
    is-active`` answers each check the next of ``answers`` ("active", "inactive", or "slow": no
    answer for 30 s); other systemctl verbs answer nothing. Its guard's config."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(json.loads((LAB / "gpu_profiles.json").read_text())["hgx-h100"]))
    (tmp_path / "ready").write_text(json.loads(profile.read_text())["driver_version"])
    bin_dir, queue = tmp_path / "bin", tmp_path / "answers"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(LAB / "nvidia_smi.py")
    queue.write_text("\n".join(answers) + "\n")
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\n[ "$1" = is-active ] || exit 0\nnext=$(head -n 1 {queue}); sed -i 1d {queue}\n'
        '[ "$next" = slow ] && exec sleep 30\necho "$next"\n[ "$next" = active ]\n')
    (bin_dir / "systemctl").chmod(0o755)
    for key, value in (("RIGUP_GPU_SIM_PROFILE", profile), ("RIGUP_GPU_SIM_RUN", tmp_path / "run"),
                       ("RIGUP_GPU_SIM_LIB", tmp_path / "lib"), ("RIGUP_GPU_SIM_FABRIC", tmp_path / "ready"),
                       ("PATH", f"{bin_dir}:{os.environ['PATH']}")):
        monkeypatch.setenv(key, str(value))
    return {**CONFIG, "tripped_file": str(tmp_path / "tripped.json"), "samples_file": str(tmp_path / "s.json"),
            "metrics_file": str(tmp_path / "m.prom"), "units": [], "default": {"temp_c": 85, "draw_w": 800},
            "by_pci_id": {}, "smi_timeout_s": 2, "fabric": {"service": "nvidia-fabricmanager.service"}}


def test_one_slow_fabric_manager_answer_drains_nothing(tmp_path, monkeypatch, capsys):
    """issue 65: one `systemctl is-active nvidia-fabricmanager` slower than the guard's timeout (or
    one that says inactive) between good ones drains nothing: each look alone is logged and shown
    (rigup_gpu_fabric_up 0); two in a row drain the host; a good answer between two bad ones starts
    the count again. Each check's verdict printed."""
    from roles.gpu_guard.shipped import guard

    answers = ["active", "slow", "active", "inactive", "active", "slow", "slow"]
    config = fabric_host(tmp_path, monkeypatch, answers)
    seen, said = [], []
    for answer in answers:
        started = time.monotonic()
        assert guard.check(config) == 0
        up = [ln for ln in Path(config["metrics_file"]).read_text().splitlines() if ln.startswith("rigup_gpu_fabric_up")]
        seen.append((answer, Path(config["tripped_file"]).exists()))
        said.append(f"is-active {answer}: {time.monotonic() - started:.1f} s, tripped {seen[-1][1]}, {up}")
        if Path(config["tripped_file"]).exists():
            break
    assert seen == [("active", False), ("slow", False), ("active", False), ("inactive", False), ("active", False),
                    ("slow", False), ("slow", True)]
    record = json.loads(Path(config["tripped_file"]).read_text())
    out = capsys.readouterr().out
    print("\n".join(said + [record["reason"]]))
    assert record["fabric"] is True and record["reason"] == "the NVSwitch fabric: nvidia-fabricmanager.service is not answering"
    assert out.count("(1 of 2 checks in a row") == 3 and out.count("TRIPPED") == 1


def test_an_nvswitch_hosts_cards_and_fabric_are_read_in_one_call(tmp_path, monkeypatch, smi):
    """issue 48: on an NVSwitch host (config ``fabric``) the guard's one nvidia-smi per check reads
    the cards' fabric registration too (no second call); the stand-in's HGX cards read In
    Progress until its fabric manager runs at the driver's version; the metrics say whether the
    fabric carries CUDA (rigup_gpu_fabric_up), on such a host only."""
    from roles.gpu_guard.shipped.guard import metrics_text
    profile = json.loads((LAB / "gpu_profiles.json").read_text())["hgx-h100"]
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    ready = tmp_path / "fabric-ready"
    monkeypatch.setenv("RIGUP_GPU_SIM_FABRIC", str(ready))
    config = {"smi_timeout_s": 5, "fabric": {"service": "nvidia-fabricmanager.service"}}
    cards, lost = read_cards(config)
    assert lost == [] and len(cards) == 8 and {c["fabric"] for c in cards} == {"In Progress, N/A"}
    ready.write_text(profile["driver_version"])
    cards, _ = read_cards(config)
    assert {c["fabric"] for c in cards} == {"Completed, Success"} and cards[0]["memory.used"] is not None
    assert "fabric" not in read_cards({"smi_timeout_s": 5})[0][0]      # elsewhere: not asked for
    queries = [ln for ln in subprocess.run(["nvidia-smi", "sim", "calls"], capture_output=True, text=True).stdout.splitlines()
               if "--query-gpu" in ln]
    print(f"nvidia-smi calls of three guard reads: {len(queries)}")
    assert len(queries) == 3 and all("fabric.state" in q for q in queries[:2])
    up = [ln for ln in metrics_text(cards, [], False, config, 0.0).splitlines() if ln.startswith("rigup_gpu_fabric_up")]
    down = metrics_text([], None, True, config, 0.0, None, "nvidia-fabricmanager.service is inactive")
    assert up == ["rigup_gpu_fabric_up 1"] and "rigup_gpu_fabric_up 0" in down.splitlines()
    assert "fabric_up" not in metrics_text(cards, [], False, {}, 0.0)


@settings(max_examples=60, deadline=1000)
@given(text=st.one_of(st.text(st.sampled_from(list("0123456789+-.eE_ \t\n\r\x0b\x0c\x85\xa0\u2003\u2028\u0661\u00b2")),
                              max_size=16), st.text(max_size=6),
                      st.from_regex(r"-?0*[0-9]{1,10}(\.[0-9]{1,13})?", fullmatch=True),
                      st.sampled_from(["350\x85", "\u2003350", "350\u2028", "350\xa0", "nan", "inf", "1e999", "3_5",
                                       "0350", "\u0663\u0665\u0660", "\t350\n", "350\r"])),
       digits=st.sampled_from([9, 12]))
def test_a_reading_is_numbers_number_unsigned(text, digits):
    """The guard's reader (it ships alone) is rigup.boundary.numbers's rule for a figure printed
    unsigned: what it reads, numbers.number reads the same; what it refuses is signed, has more than
    ``digits`` digits before the point, or is no number of the boundary's."""
    got = reading(text, digits)
    theirs = number(text, float, 0)
    bare = text.strip(" \t\r\n\f\v")   # the boundary's blanks (str.strip() takes U+0085 too)
    assert got == theirs if got is not None else (
        theirs is None or bare[0] in "+-" or len(bare.split(".")[0]) > digits)


def test_a_cell_with_a_unicode_blank_is_lost_telemetry():
    """issue 61 round 9 H2: nvidia-smi's cell "350\x85" (or U+2003, U+2028, U+00A0 about it) was a draw of
    350 (str.strip() and float() take those blanks); now it is no reading, as numbers.number says, and
    the card's telemetry is lost; a U+0085 does not end the line either (str.splitlines() did)."""
    for text in ("350\x85", "\u2003350", "350\u2028", "350\xa0"):
        print(f"reading({text!r}) -> {reading(text)} (numbers.number: {number(text, float, 0)})")
        assert reading(text) is None and number(text, float, 0) is None
    cards, lost = parse_sample(["0, GPU-a, 00000000:4E:00.0, 0x20B010DE, 350\x85, 300, 85"], 0)
    print(f"draw '350\\x85' -> cards {[(c['draw'], c['temp']) for c in cards]}; lost {lost}")
    assert [c["draw"] for c in cards] == [None] and "reads power.draw" in lost[0]
    from roles.gpu_guard.shipped.guard import parse_journal
    stamps = ["1700000000500000", "\u0661\u0667", "1_700", "1e400", "017", 1700]
    got = [t for t, _ in parse_journal("\n".join(json.dumps({"__REALTIME_TIMESTAMP": v, "MESSAGE": "m"}) for v in stamps))[0]]
    print(f"journal stamps {stamps!r} -> {got}")
    assert got == [1700000000.5, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_a_signed_or_zero_padded_draw_or_temperature_is_lost_telemetry():
    """issue 61 (red team item 23): '-00350' was a draw of -350 W judged and exported, '0085' a
    temperature of 85 C: each is now a reading the card does not give (its telemetry lost)."""
    cards, lost = parse_sample(["0, GPU-a, 00000000:4E:00.0, 0x20B010DE, -00350, 300, 0085"], 0)
    print(f"cards {[(c['draw'], c['temp']) for c in cards]}; lost {lost}")
    assert [(c["draw"], c["temp"]) for c in cards] == [(None, None)] and "reads power.draw -00350" in lost[0]
    assert [reading(t) for t in ("350.5", "0", "0.5", "85", "-1", "+85", "085", "\u0668\u0665", "1e3")] == \
        [350.5, 0.0, 0.5, 85.0, None, None, None, None, None]


# ----------------------------------------------------------------------------- the guard's own records (issue 61)
from roles.gpu_guard.shipped import guard as G   # noqa: E402 (the module, for monkeypatching its journal and boot)
from rigup.boundary.fields import PCI_BUS_ID   # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)
# a state file's shapes: the real keys, each holding anything
XID_STATE = st.fixed_dictionaries({}, optional={k: JSON for k in ("boot", "cursor", "read", "last_t", "seen", "events")}
                                  | {"cards": st.dictionaries(st.sampled_from(["0000:2b:00", "0000:07:00"]), JSON
                                     | st.fixed_dictionaries({}, optional={k: JSON for k in ("counts", "recent", "suspect", "link")}),
                                                              max_size=2)})


def guard_dir(tmp_path, tripped=None, xid=None, samples=None) -> dict:
    config = {"tripped_file": str(tmp_path / "tripped"), "samples_file": str(tmp_path / "samples.json"),
              "xid": {"state_file": str(tmp_path / "xid.json"), "catalogue": {}}, "units": ["rigup-llama@*"],
              "window_s": 10, "interval_s": 2, "smi_timeout_s": 3}
    for key, value in (("tripped_file", tripped), ("samples_file", samples)):
        if value is not None:
            Path(config[key]).write_text(json.dumps(value))
    if xid is not None:
        Path(config["xid"]["state_file"]).write_text(json.dumps(xid))
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    return config


def test_status_of_a_tripped_file_that_is_no_map_says_tripped_not_a_traceback(tmp_path):
    """round 2 B6/B7: a tripped file holding a JSON list, a suspect mark that is true (not a map):
    `rigup-gpu-guard status` ended in a traceback; it says tripped (the file is there: the check stops
    serving whatever it holds) and the card suspect, exit 3."""
    config = guard_dir(tmp_path, tripped=[1], xid={"cards": {"0000:2b:00": {"suspect": True}, "0000:07:00": ["x"]}})
    done = subprocess.run([sys.executable, G.__file__, "--config", str(tmp_path / "cfg.json"), "status"],
                          capture_output=True, text=True, timeout=60)
    print(done.stdout, done.stderr)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "tripped at an unknown time: (no reason recorded: the tripped file does not read)" in done.stdout
    assert "card 0000:2b:00: Xid none this boot; SUSPECT since an unknown time" in done.stdout
    Path(config["tripped_file"]).write_text("not json")   # load() takes it as none: still there, still tripped
    assert G.main(["--config", str(tmp_path / "cfg.json"), "status"]) == 3


def test_an_xid_card_entry_or_a_samples_time_not_of_its_form_is_left_out_and_the_check_goes_on(tmp_path, monkeypatch):
    """round 2 B8/B10: an Xid state card entry that is a list ended every check in a traceback (the
    host unguarded, failing open), as did a sample whose "t" is text; each is left out."""
    monkeypatch.setattr(G, "read_kernel_log", lambda config, state: ([], None))
    monkeypatch.setattr(G, "boot_id", lambda: "new")
    config = guard_dir(tmp_path, xid={"boot": "old", "cards": {"0000:2b:00": ["x"], "0000:07:00": {"suspect": True}}})
    state, trip = G.xid_check(config, [], [], 1e9)
    assert trip is None and list(state["cards"]) == ["0000:07:00"] and state["cards"]["0000:07:00"]["suspect"]
    history = G.samples_of([{"t": "1", "cards": []}, {"t": 5, "cards": [{"uuid": "GPU-a", "draw": "x"}, {"uuid": "GPU-b", "draw": 3}]}])
    assert G.keep(history, CONFIG, 6) == [{"t": 5, "cards": [{"uuid": "GPU-b", "draw": 3}], "lost": [], "bad": None}]


def test_a_quarantined_record_whose_bus_id_is_no_bus_id_sets_no_card_aside(tmp_path):
    """round 2 B9: a quarantined record with bus_id "0" matched every 'device handle' line as a
    substring: a card off the bus was not lost telemetry. Only PCI bus ids are set aside, compared whole."""
    (tmp_path / "burnin.json").write_text(json.dumps({"GPU-x": {"passed": False, "bus_id": "0"},
                                                      "GPU-y": {"passed": False, "bus_id": "00000000:0F:00.0"}}))
    (tmp_path / "testing.json").write_text(json.dumps(["2B", 7, "00000000:47:00.0"]))
    aside = G.set_aside({"burnin": {"results": str(tmp_path / "burnin.json"), "testing": str(tmp_path / "testing.json")}})
    assert aside == {"00000000:0F:00.0", "00000000:47:00.0"}
    off = "Unable to determine the device handle for GPU0000:2B:00.0: Unknown Error"
    assert parse_sample([off], 15, ("0",)) == ([], [off])
    assert parse_sample([off], 15, ("0000:2b:00.0",)) == ([], [])
    assert parse_sample([off], 15, ("000:2b:00.0",)) == ([], [off])   # a tail of the id is not the id


def test_the_guards_bus_id_pattern_is_the_boundarys():
    assert G.PCI_BUS_ID.pattern == PCI_BUS_ID.pattern


@settings(max_examples=150, deadline=1000)
@given(tripped=JSON, xid=XID_STATE | JSON, samples=st.lists(JSON | st.fixed_dictionaries(
    {"t": st.floats() | st.integers() | st.text(max_size=3)}, optional={"cards": JSON, "lost": JSON, "bad": JSON, "fabric": JSON}),
    max_size=4))
def test_any_json_in_the_guards_state_files_reads_typed_never_a_traceback(tmp_path_factory, tripped, xid, samples):
    """Property (issue 61): whatever JSON root's state files hold, the typed readers give their form,
    a check's Xid part and its history, status and clear end without a traceback; a tripped file
    that is there is always a trip."""
    tmp_path = tmp_path_factory.mktemp("guard")
    config = guard_dir(tmp_path, xid=xid, samples=samples)
    Path(config["tripped_file"]).write_text(json.dumps(tripped))   # null too: the file is there
    state = G.xid_state_of(xid)
    assert all(type(n) is int for c in state["cards"].values() for n in c["counts"].values())
    record = G.tripped_of(tripped)
    assert isinstance(record["reason"], str) and all(isinstance(u, str) for u in record.get("stopped", []))
    history = G.keep(G.samples_of(samples), {"window_s": 10}, 1e9)
    G.evaluate(history + [{"t": 1e9, "cards": [], "lost": []}], {"window_s": 10}, 1e9)
    G.debounced(history, {})
    G.metrics_text([], None, True, config, 1e9, G.read_xid_state(config))
    old = (G.read_kernel_log, G.boot_id)
    G.read_kernel_log, G.boot_id = (lambda c, s: ([], None)), (lambda: "b")
    try:
        G.xid_check(config, [], [], 1e9)
    finally:
        G.read_kernel_log, G.boot_id = old
    assert G.main(["--config", str(tmp_path / "cfg.json"), "status"]) == 3


def test_a_record_whose_passed_or_cleared_does_not_read_sets_its_card_aside_as_quarantined(tmp_path):
    """rerun3's NB7/NB8: a failed record with cleared "no", or passed "false", read as not
    quarantined: its card judged (and a metric of 0) while rigup-burnin and the controller keep it out."""
    recs = {"GPU-a": {"passed": False, "cleared": "no", "bus_id": "00000000:4E:00.0"},
            "GPU-b": {"passed": "false", "bus_id": "00000000:4F:00.0"},
            "GPU-c": {"passed": True, "cleared": [], "bus_id": "00000000:50:00.0"},
            "GPU-d": {"passed": False, "cleared": {"at": 1, "by": "op"}, "bus_id": "00000000:51:00.0"},
            "GPU-e": {"passed": True, "bus_id": "00000000:52:00.0"},
            "GPU-f": {"passed": False, "cleared": {}, "bus_id": "00000000:53:00.0"}}
    (tmp_path / "burnin.json").write_text(json.dumps(recs))
    aside = G.set_aside({"burnin": {"results": str(tmp_path / "burnin.json")}})
    assert aside == {"00000000:4E:00.0", "00000000:4F:00.0", "00000000:50:00.0", "00000000:53:00.0"}


def test_the_guards_quarantine_rule_is_rigup_burnins():
    """One rule, two copies (each host program ships alone): their bodies held equal."""
    import ast
    import inspect
    from roles.burnin.shipped import acceptance

    def body(f):
        node = ast.parse(inspect.getsource(f)).body[0]
        return [ast.unparse(n) for n in node.body[1:]]   # the docstring apart
    assert body(G.quarantined) == body(acceptance.quarantined)


def test_a_suspect_mark_that_does_not_read_is_still_a_mark():
    """rerun2's N12: a mark of {}, [], 0 or "" read as no mark: the card's units no longer held stopped."""
    for mark in ({}, [], 0, "", "yes", {"since": 1}):
        got = G.xid_state_of({"cards": {"0000:2b:00": {"suspect": mark}}})["cards"]["0000:2b:00"]["suspect"]
        assert got == {"since": "an unknown time", "line": "(the guard's record of it does not read)"}, mark
    for none in (None, False):
        assert G.xid_state_of({"cards": {"0000:2b:00": {"suspect": none}}})["cards"]["0000:2b:00"]["suspect"] is None
    assert G.xid_state_of({"cards": {"0000:2b:00": {}}})["cards"]["0000:2b:00"]["suspect"] is None
