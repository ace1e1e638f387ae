"""The GPU guard's Xid triage (roles/gpu_guard/shipped/guard.py): the journal's JSON, the units' cards,
and what each class of event does, with the serving units and systemctl given as functions. On a
lab host, with the journal and systemd: tests/roles/test_gpu_guard.py."""

import json

from shipped import xid
from rigup.gpu.catalogue import xid_codes
from roles.gpu_guard.shipped import guard
from roles.gpu_guard import xid_config
from tests.unit.hosts import data

CARDS = [{"index": i, "uuid": f"GPU-{i}", "bus_id": f"00000000:{b}:00.0"} for i, b in enumerate(("07", "0F", "47"))]
LINE = "NVRM: Xid (PCI:0000:{}:00): {}, pid=4242, name=llama-server, words"


def config(**xid_keys):
    return {"units": ["rigup-llama@*"], "xid": {**xid_config(data(rigup_state_dir="/var/lib/rigup")), **xid_keys}}


def entry(t: float, bus: str, code: int) -> tuple[float, str]:
    return t, LINE.format(bus, code)


def units(config, cards):
    return [{"unit": "rigup-llama@a.service", "cards": {"0000:07:00"}, "since": 100.0},
            {"unit": "rigup-llama@b.service", "cards": {"0000:0f:00"}, "since": 100.0},
            {"unit": "rigup-llama@late.service", "cards": {"0000:0f:00"}, "since": 300.0}]


def test_the_journals_json_gives_time_message_and_cursor_and_bytes_are_read_too():
    out = "\n".join([json.dumps({"__CURSOR": "s=1", "__REALTIME_TIMESTAMP": "1700000000500000", "MESSAGE": "a"}),
                     "not json", json.dumps({"__CURSOR": "s=2", "__REALTIME_TIMESTAMP": "1700000001000000",
                                             "MESSAGE": list(b"NVRM: Xid \xff")})])
    entries, cursor = guard.parse_journal(out)
    assert entries == [(1700000000.5, "a"), (1700000001.0, "NVRM: Xid \ufffd")] and cursor == "s=2"


def test_a_units_cards_come_from_its_cuda_visible_devices_by_uuid_or_index():
    blocks = guard.unit_blocks("Id=rigup-llama@a.service\nEnvironment=CUDA_VISIBLE_DEVICES=GPU-1,2 X=1\n"
                               "ActiveEnterTimestamp=@1700000000\n\nId=rigup-llama@b.service\nEnvironment=\n")
    assert [b["Id"] for b in blocks] == ["rigup-llama@a.service", "rigup-llama@b.service"]


def test_an_application_fault_restarts_only_the_units_on_that_card_started_before_it():
    acted, state = [], {}
    trip = guard.triage(config(), state, [entry(200.0, "0f", 13)], CARDS, 200.0, units,
                        lambda verb, u: acted.append((verb, u)) or "")
    assert trip is None and acted == [("restart", ["rigup-llama@b.service"])]   # not a's card, late started after
    assert state["cards"]["0000:0f:00"]["counts"] == {"application": 1}
    assert state["events"][-1]["done"] == "restarted rigup-llama@b.service" and "0F" not in state["events"][-1]["card"]


def test_memory_faults_make_the_card_suspect_at_the_count_within_the_window():
    state, c = {}, config(suspect_count=2, suspect_window_s=3600)
    guard.triage(c, state, [entry(0.0, "47", 48)], CARDS, 0.0, units)
    guard.triage(c, state, [entry(5000.0, "47", 48)], CARDS, 5000.0, units)    # the first is out of the window
    assert not state["cards"]["0000:47:00"]["suspect"]
    guard.triage(c, state, [entry(5100.0, "47", 63)], CARDS, 5100.0, units)
    assert state["cards"]["0000:47:00"]["suspect"]["line"] == LINE.format("47", 63)
    assert state["cards"]["0000:47:00"]["counts"] == {"memory": 3} and "SUSPECT" in state["events"][-1]["done"]
    metrics = guard.xid_metrics(state, CARDS)
    assert 'rigup_gpu_suspect{bus="0000:47:00",gpu="2"} 1' in metrics
    assert 'rigup_gpu_xid_events{bus="0000:47:00",gpu="2",class="memory"} 3' in metrics


def test_fallen_off_the_bus_trips_and_reboots_only_when_opted_in_and_within_the_days_budget(tmp_path):
    trip = guard.triage(config(), {}, [entry(1.0, "07", 79)], CARDS, 1.0, units)
    assert trip == {"reason": f"Xid 79 (bus: GPU has fallen off the bus) on GPU 0 (GPU-0, 0000:07:00): {LINE.format('07', 79)}",
                    "reboot": False}
    budget = tmp_path / "reboots.json"
    c = config(reboot=True, max_reboots=1, reboots_file=str(budget))
    state = {}
    assert guard.triage(c, state, [entry(1.0, "07", 79)], CARDS, 1.0, units)["reboot"] is True
    budget.write_text(json.dumps({"day": guard.reboots_today(str(budget), 1.0)[0], "count": 1}))
    state = {}
    assert guard.triage(c, state, [entry(2.0, "07", 79)], CARDS, 2.0, units)["reboot"] is False
    assert state["events"][-1]["done"].endswith("no reboot: 1 of 1 today done")


def test_a_card_off_the_bus_is_named_as_an_earlier_sample_saw_it():
    state = {}
    guard.triage(config(), state, [], CARDS, 0.0, units)
    trip = guard.triage(config(), state, [entry(1.0, "47", 79)], CARDS[:2], 1.0, units)
    assert trip["reason"].startswith("Xid 79 (bus: GPU has fallen off the bus) on GPU 2 (GPU-2, 0000:47:00, not answering): ")
    assert 'rigup_gpu_xid_events{bus="0000:47:00",gpu="2",class="bus"} 1' in guard.xid_metrics(state, CARDS[:2])


def test_an_unknown_code_or_card_is_logged_and_counted(capsys):
    state = {}
    assert guard.triage(config(), state, [entry(1.0, "aa", 999), (1.0, "kernel: usb 1-1")], CARDS, 1.0, units) is None
    assert state["cards"] == {"0000:aa:00": {"counts": {"unknown": 1}, "recent": [], "suspect": None}}
    assert "on the card at 0000:aa:00: counted, not acted on: no card of this host has that bus id" in capsys.readouterr().out


def test_an_xid_for_a_bus_id_not_on_this_host_trips_nothing():
    """Issue 47: a fallen-off-the-bus line naming a card this host has never sampled and its PCI bus
    does not list: counted and logged, no drain, no reboot."""
    state = {}
    assert guard.triage(config(reboot=True), state, [entry(1.0, "aa", 79)], CARDS, 1.0, units) is None
    assert state["events"][-1]["done"].startswith("counted, not acted on: no card of this host")
    assert guard.triage(config(reboot=True), {}, [entry(1.0, "47", 79)], CARDS, 1.0, units)["reason"].startswith("Xid 79")


def test_fifty_application_faults_in_one_check_restart_a_unit_once():
    acted, state = [], {}
    guard.triage(config(), state, [entry(200.0 + i / 100, "0f", 13) for i in range(50)], CARDS, 201.0, units,
                 lambda verb, u: acted.append((verb, u)) or "")
    print(f"\n50 Xid 13 on one card in one check: {len(acted)} restart(s): {acted}")
    assert acted == [("restart", ["rigup-llama@b.service"])]
    assert state["cards"]["0000:0f:00"]["counts"] == {"application": 50}
    assert sum(e["done"].startswith("counted; acted on already") for e in state["events"]) == 49


def test_the_config_carries_the_catalogue_and_the_lab_reads_only_its_own_identifier():
    c = xid_config(data(rigup_state_dir="/var/lib/rigup/"))
    assert c["catalogue"]["79"]["action"] == "drain_host" and c["match"] == "_TRANSPORT=kernel"
    assert c["state_file"] == "/var/lib/rigup/gpu-guard-xid.json" and len(c["catalogue"]) == len(xid_codes())
    assert xid_config(data(gpu_guard_xid_source="lab"))["match"] == "SYSLOG_IDENTIFIER=rigup-lab-kernel"


def test_a_lost_cursor_reads_this_boot_again_but_not_the_lines_already_judged(tmp_path, monkeypatch):
    calls, lines = [], [json.dumps({"__CURSOR": f"s={i}", "__REALTIME_TIMESTAMP": str(i * 1_000_000),
                                    "MESSAGE": LINE.format("07", 13)}) for i in (1, 2, 3)]

    def journal(argv, timeout):
        calls.append(argv[-1])
        return (1, "Failed to seek to cursor") if argv[-1].startswith("--after-cursor") else (0, "\n".join(lines))
    monkeypatch.setattr(guard, "run_bounded", journal)
    state = {"cursor": "s=gone", "last_t": 2.0, "read": True}
    entries, cursor = guard.read_kernel_log(config(), state)
    assert calls == ["--after-cursor=s=gone", "-b"] and [t for t, _ in entries] == [3.0] and cursor == "s=3"
    assert state["last_t"] == 3.0


def test_the_first_read_of_this_boots_log_counts_its_lines_and_acts_on_none():
    acted, state = [], {}
    trip = guard.triage(config(), state, [entry(1.0, "07", 79), entry(2.0, "0f", 13)], CARDS, 3.0, units,
                        lambda verb, u: acted.append(verb) or "", judge=False)
    assert trip is None and acted == [] and state["cards"]["0000:07:00"]["counts"] == {"bus": 1}
    assert state["events"][-1]["done"] == "counted (before the guard's first check: not acted on)"


def test_a_link_below_its_maximum_generation_counts_only_under_load(capsys):
    """Cards idle at Gen1: a card's generation is judged only while it is at least LOADED_PERCENT busy.
    Below its maximum then, it is kept in the state (this boot's), logged once and exported; a
    loaded sample at its maximum takes it away; status.py shows it as DOWNTRAINED."""
    from plays import fleet

    line = ("{i}, GPU-{i}, 00000000:{b}:00.0, 0x20B210DE, 61.0, 400.0, 39, 10, 1410, {u}, {g}, 16, 4, 16")
    cards, lost = guard.parse_sample([line.format(i=0, b="07", u=3, g=1), line.format(i=1, b="0F", u=97, g=3),
                                      line.format(i=2, b="47", u=95, g=4)])
    assert not lost and cards[1]["pcie.link.gen.max"] == 4.0 and cards[1]["pcie.link.width.max"] == 16.0
    state: dict = {}
    guard.links_under_load(state, cards, 1764660000.0)
    guard.links_under_load(state, cards, 1764660010.0)                  # the same: logged once
    assert set(state["cards"]) == {"0000:0f:00"}                        # GPU 0 idles at Gen1: not judged
    assert state["cards"]["0000:0f:00"]["link"]["gen"] == 3 and state["cards"]["0000:0f:00"]["recent"] == []
    assert capsys.readouterr().out.count("PCIe link at Gen3 of Gen4 under load (97% busy)") == 1
    metrics = "\n".join(guard.xid_metrics(state, cards))
    print(metrics)
    assert 'rigup_gpu_pcie_gen_under_load{bus="0000:0f:00",gpu="1",max="4"} 3' in metrics
    shown = fleet.xid_cards(state)
    assert shown["0000:0f:00"]["slow_link"] == "Gen3 of Gen4 under load"
    problems = fleet.card_problems({"draw_w": 61, "temp_c": 39, "link": {"downtrained": True, "why": "x4 of x16"}},
                                   shown["0000:0f:00"])
    assert problems == [("DOWNTRAINED", "x4 of x16, Gen3 of Gen4 under load DOWNTRAINED")]
    back, _ = guard.parse_sample([line.format(i=1, b="0F", u=90, g=4)])
    guard.links_under_load(state, back, 1764660020.0)
    assert "link" not in state["cards"]["0000:0f:00"] and "back at Gen4" in capsys.readouterr().out


def test_an_nvswitch_sxid_fatal_drains_the_host_and_a_non_fatal_is_counted():
    """issue 48: SXid events of the board's NVSwitches (their event lines, as the switch driver
    writes them, with the lines of more data that follow each): a fatal one drains the host (the
    NVLink traffic through the switch stalls), a non-fatal one is logged and counted per switch;
    a switch not of this host's plan is counted, not acted on. The guard's config names the
    switches from the plan (guard_config)."""
    sw = "nvidia-nvswitch{n}: SXid (PCI:0000:{b}:00.0): {code}, {rest}"
    lines = [sw.format(n=3, b="c6", code=22013, rest="Non-fatal, Link 44 Minion Link DLREQ interrupt"),
             sw.format(n=3, b="c6", code=22013, rest="Severity 0 Engine instance 44 Sub-engine instance 00"),
             sw.format(n=3, b="c6", code=22013, rest="Data {0x0000002b, 0x0000002b}"),
             "[  38.1] host kernel: " + sw.format(n=1, b="c4", code=20034, rest="Fatal, Link 30 LTSSM Fault Up"),
             "llama-server: nvidia-nvswitch1: SXid (PCI:0000:c4:00.0): 20034, Fatal, quoted"]   # not the driver's line
    found = xid.events(lines, {})
    assert [(e["card"], e["code"], e["action"], e["kind"]) for e in found] == [
        ("0000:c6:00", 22013, "log", "SXid"), ("0000:c4:00", 20034, "drain_host", "SXid")]
    from rigup.gpu import fabric
    plan = {"fabric": fabric.fabric_plan(["0000:c4:00.0", "0000:c6:00.0"], [], None)}
    from roles.gpu_guard import guard_config
    c = {**config(), "fabric": guard_config(data(rigup_state_dir="/var/lib/rigup"), plan)["fabric"]}
    assert c["fabric"]["switches"] == ["0000:c4:00", "0000:c6:00"]
    state = {}
    trip = guard.triage(c, state, [(200.0, ln) for ln in lines], CARDS, 200.0, units, lambda verb, u: "")
    print(trip["reason"])
    assert trip["reason"].startswith("SXid 20034 (nvswitch: NVSwitch fatal error (SXid)") and "the NVSwitch at 0000:c4:00" \
        in trip["reason"]
    assert state["cards"]["0000:c6:00"]["counts"] == {"nvswitch": 1} and state["events"][0]["done"] == "logged"
    elsewhere = {}
    assert guard.triage(config(), elsewhere, [(200.0, lines[3])], CARDS, 200.0, units) is None
    assert elsewhere["events"][0]["done"].startswith("counted, not acted on")


def test_checks_that_find_no_kernel_line_write_the_state_once(tmp_path, monkeypatch):
    """A journal with no kernel line (a container's) gives no cursor: kept as None, it made every
    check's state differ from its typed read, and the guard wrote its Xid state at every check (the
    lab's preflight saw /var/lib/rigup change under it)."""
    cfg = config(state_file=str(tmp_path / "xid.json"))
    monkeypatch.setattr(guard, "read_kernel_log", lambda c, s: ([], None))
    monkeypatch.setattr(guard, "boot_id", lambda: "b1")
    monkeypatch.setattr(guard, "serving_units", lambda c, cards: [])
    saved = []
    real = guard.save
    monkeypatch.setattr(guard, "save", lambda path, state: (saved.append(path), real(path, state)))
    for i in range(3):
        guard.xid_check(cfg, CARDS, [], 1000.0 + i)
    print(f"3 checks, {len(saved)} write(s)")
    assert len(saved) == 1
