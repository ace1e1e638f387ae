"""Issue 47: a lying or broken host does not crash what reads it, and a bad answer is that host's
problem in its own row. Numbers a host prints are read with bounds (rigup/text.py ``number``:
ASCII digits, at most 18 before the point, finite): a 5000-digit power draw, ``inf``, ``1e400``,
``nan``, Arabic-Indic or superscript digits become "unknown" for that field; the card, the row and
the other cards stay. The readers: status.py's row (plays/fleet.py host_row and the table), the
driver plan (rigup/gpu/facts.py parse_driver, rigup/gpu/driver.py driver_step, preflight's
refusals) and the GPU guard's judgement (roles/gpu_guard/shipped/guard.py parse_sample, evaluate). Each
case prints what it produced."""

import json
import re
from pathlib import Path

import pytest

from plays import fleet
from plays.fleet import parse_cards, parse_serving
from shipped import throughput
from rigup.gpu.catalogue import version_tuple
from rigup.gpu.driver import branch_of, driver_step
from rigup.gpu.facts import GPU_FIELDS, parse_driver, parse_free_disk, parse_gpus
from rigup.boundary.numbers import number
from roles.gpu_guard.shipped import guard
from tests.unit.hosts import data, host, refusals
from tests.unit.test_nvidia_driver import DEBIAN
from tests.unit.world import remade

_remade = remade(throughput)   # its opener's socket made again after any gevent patch (tests/unit/world.py)

HOSTILE = {"5000 digits": "9" * 5000, "19 digits": "1" * 19, "inf": "inf", "1e400": "1e400", "nan": "nan",
           "Arabic-Indic digits": "١٢٣", "a superscript": "²", "hex": "0x1f4", "an escape": "3\x1b[2J"}
LINE = (Path(__file__).parent.parent / "fixtures/facts/a100-query-nounits.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("what", HOSTILE)
def test_a_cards_absurd_draw_is_unknown_and_the_others_are_read(what):
    cells = LINE.split(",")
    cells[12] = " " + HOSTILE[what]                       # power.draw
    second = CSV[1]   # another card (one card's row twice is one card: parse_gpus skips the second)
    gpus = parse_gpus([",".join(cells), second])
    assert len(gpus) == 2 and gpus[0]["power_draw_w"] is None and gpus[1]["power_draw_w"] is not None
    cards = parse_cards([",".join(cells), second, "smi_rc=0"])
    print(f"{what}: draw {cards['cards'][0]['draw_w']}, the other card {cards['cards'][1]['draw_w']} W")
    assert [c["draw_w"] is None for c in cards["cards"]] == [True, False] and cards["smi"] is None


@pytest.mark.parametrize("what", HOSTILE)
def test_an_absurd_index_port_health_or_rc_is_unknown_not_a_crash(what):
    text = HOSTILE[what]
    assert parse_gpus([LINE.replace(LINE.split(",")[0], text, 1)]) == []     # not a card line
    rows = parse_serving(["@@ rigup-llama@gemma.service", f"port={text}", f"health={text}", "active=active"])
    assert rows[0]["port"] is None and rows[0]["health"] is None and rows[0]["active"] == "active"
    assert parse_cards([f"smi_rc={text}"])["smi"] is not None
    assert parse_free_disk([text]) is None


@pytest.mark.parametrize("column, text", [(2, "00000000:4E:00.0/../../../../etc"), (2, "00000000:4E:00.0\x1b[2J"),
                                          (1, "GPU-1'; rm -rf / #\x1b]0;x\x07"), (2, "4E:00.0"), (1, "1")])
def test_a_card_whose_bus_id_or_uuid_is_no_id_is_that_rows_problem(column, text):
    """Issue 61, second round: a card's bus id or UUID (an argv word of nvidia-smi -i, a record's key)
    that is no PCI address or GPU UUID makes the row unreadable (counted as a line not understood);
    the other card is read, and [N/A] is still an unknown field of a card."""
    cells = LINE.split(",")
    cells[column] = " " + text
    second = CSV[1]   # another card (one card's row twice is one card: parse_gpus skips the second)
    gpus = parse_gpus([",".join(cells), second])
    cards = parse_cards([",".join(cells), second, "smi_rc=0"])
    print(f"{text!r}: cards {[g['index'] for g in gpus]}, smi {cards['smi']!r}")
    assert [g["index"] for g in gpus] == [1] and cards["smi"] == "1 line not understood"
    cells[column] = " [N/A]"
    assert parse_gpus([",".join(cells)])[0][("uuid", "bus_id")[column - 1]] is None


def test_the_bounds():
    assert number("700.00") == 700.0 and number("42", int) == 42 and number(" 7.9 ", int) == 7
    assert [number(v) for v in ("1" * 19, "-1" + "0" * 17, "1.0000000000001")] == [None, -1e17, None]


@pytest.mark.parametrize("version", ["99999999999999999999999.1", "580.x", "", "5" * 5000, "٥٨٠.٩٥", "²", None])
def test_an_absurd_driver_version_is_no_version(version):
    """The driver plan reads the host's driver with branch_of and version_tuple: an absurd answer
    is "unreadable" (None), never an exception."""
    branch = branch_of(version)
    print(f"{str(version)[:24]!r}: branch {branch}, version {version_tuple(version)}")
    assert branch is None or (version == "580.x" and branch == 580)     # its head is a branch
    assert version_tuple(version) is None
    assert branch_of("580.105.08") == 580 and version_tuple("580.105.08") == (580, 105, 8)


def test_the_guards_check_judges_every_good_card_past_a_malformed_line():
    """roles/gpu_guard/shipped/guard.py parse_sample (the host's python3): a line with a superscript index,
    an ``inf`` draw, a ``nan`` temperature, 5000 digits: that card's problem, named; the next card
    read and judged."""
    from roles.gpu_guard.shipped.guard import parse_sample

    good = "1, GPU-b, 00000000:0F:00.0, 0x20B210DE, 100.00, 400.00, 40"
    lines = ["², GPU-a, 00000000:07:00.0, 0x20B210DE, 100.00, 400.00, 40",
             "0, GPU-c, 00000000:47:00.0, 0x20B210DE, inf, 400.00, nan",
             "2, GPU-d, 00000000:4E:00.0, 0x20B210DE, " + "9" * 5000 + ", 400.00, 41", good]
    cards, lost = parse_sample(lines)
    print(f"\ncards read: {[(c['index'], c['draw'], c['temp']) for c in cards]}; problems: {[p[:60] for p in lost]}")
    assert [(c["index"], c["draw"], c["temp"]) for c in cards] == [(0, None, None), (2, None, 41.0), (1, 100.0, 40.0)]
    assert len(lost) == 3 and lost[0].startswith("², GPU-a") and all(len(p) <= 300 for p in lost)


@pytest.mark.parametrize("reported", ["Infinity", "NaN", "1e308", "-5", "true"])
def test_a_servers_absurd_own_rate_gives_way_to_the_measured_one(reported):
    """shipped/throughput.py (the watchdog's and bench's completion) against a real loopback server
    whose timings.predicted_per_second is absurd: the wall-clock rate stands, finite."""
    import http.server
    import threading

    from shipped import throughput

    body = ('{"choices": [{"message": {"content": "eight words of text a real answer would hold"}}], '
            '"usage": {"completion_tokens": 8}, "timings": {"predicted_per_second": %s}}' % reported).encode()

    class Server(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        one = throughput.completion(f"http://127.0.0.1:{server.server_port}", max_tokens=8, timeout=5)
    finally:
        server.shutdown()
    print(f"{reported}: {one}")
    assert one["tokens"] == 8 and 0 < one["tps"] < 1e7


# ---- the readers: status.py's row, the driver plan, the GPU guard's judgement
CSV = (Path(__file__).parent.parent / "fixtures/facts/a100-query-nounits.csv").read_text().splitlines()
NUMERIC = {key: i for i, (_, key, kind) in enumerate(GPU_FIELDS) if kind in ("int", "float") and key != "index"}


def row_of(gpus: list[str], **found) -> dict:
    return fleet.host_row("lab1", {"gpus": gpus, **found}, downloads=[], maintenance=False, models={})


def with_cell(line: str, i: int, value: str) -> str:
    cells = line.split(",")
    cells[i] = " " + value
    return ",".join(cells)


# ----------------------------------------------------------------------------- status.py's row
@pytest.mark.parametrize("key", NUMERIC)
@pytest.mark.parametrize("what", HOSTILE)
def test_a_cards_absurd_figure_is_unknown_in_its_own_row(what, key):
    row = row_of([with_cell(CSV[0], NUMERIC[key], HOSTILE[what]), CSV[1], "smi_rc=0"])
    table, doc = fleet.render_table([row]), fleet.render_json([row])
    cards = {"draw_w": "power_draw_w", "limit_w": "power_limit_w", "temp_c": "temperature_c",
             "vram_used_mib": "memory_used_mib", "vram_total_mib": "memory_total_mib"}
    print(f"{what} as {key}: {table.splitlines()[-1 if 'attention' not in table else 2][:110]}")
    assert row["reachable"] and len(row["cards"]) == 2
    for field, source in cards.items():
        if source == key:
            assert row["cards"][0][field] is None and row["cards"][1][field] is not None
    assert not re.search(r"(?i)\b(inf|nan)\b|\x1b", table)
    json.loads(doc, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))   # no NaN, Infinity
    if key in cards.values() and key != "temperature_c":   # a summed figure: "+?" for the card not understood
        assert "+?" in table


def test_the_cells_say_which_sums_miss_a_card():
    row = row_of([with_cell(with_cell(CSV[0], NUMERIC["power_limit_w"], "1e400"), NUMERIC["memory_used_mib"], "nan"),
                  CSV[1], "smi_rc=0"])
    print(f"power {fleet.power_cell(row)!r}, vram {fleet.vram_cell(row)!r}")
    assert fleet.power_cell(row) == "124/400+?W 38C" and fleet.vram_cell(row) == "0+?/160G"


@pytest.mark.parametrize("what", HOSTILE)
def test_a_line_that_is_no_card_is_the_hosts_problem_not_a_vanished_card(what):
    row = row_of([with_cell(CSV[0], 0, HOSTILE[what]), CSV[1], "smi_rc=0"],
                 serving=["@@ rigup-llama@gemma.service", f"port={HOSTILE[what]}", f"health={HOSTILE[what]}",
                          "active=active"])
    table = fleet.render_table([row])
    print(f"{what} as the index:\n{table}")
    assert row["smi"] == "1 line not understood" and len(row["cards"]) == 1
    assert "nvidia-smi 1 line not understood" in table.splitlines()[0]
    assert row["serving"][0]["port"] is None and ":? - " in fleet.serving_cell(row)


@pytest.mark.parametrize("value", ["١٢٣", "nan", "inf", "-inf", "1e400", "9" * 5000, "²", ["1"], None])
def test_an_absurd_energy_figure_is_left_out(value):
    answer = {"status": "success", "data": {"result": [{"metric": {"host": "lab1"}, "value": [0, value]},
                                                        {"metric": {"host": "lab2"}, "value": [0, "0.4412345678901234"]}]}}
    found = fleet.parse_energy([json.dumps(answer)])
    print(f"{str(value)[:12]!r}: {found}")
    assert found == {"lab2": 0.4412345678901234}


def test_the_guards_state_with_absurd_numbers_is_read_without_them():
    huge = "9" * 4000
    state = ('{"boot": "b", "cards": {"0000:07:00": {"counts": {"bus": %s, "memory": 2}, "link": {"gen": %s, '
             '"gen_max": 5}}}, "seen": {"0000:07:00": {"index": %s}}}' % (huge, huge, huge))
    row = row_of([CSV[0], "smi_rc=0"], guard=["@@ xid", "boot=b", state])
    table = fleet.render_table([row])
    print(table)
    assert row["guard"]["xid"]["0000:07:00"] == {"counts": {"memory": 2}, "suspect": False, "since": None}
    assert len(table) < 400


# ----------------------------------------------------------------------------- the driver plan
DRIVERS = {"23 digits": "99999999999999999999999.1", "580.x": "580.x", "empty": "", "5000 digits": "5" * 5000,
           "Arabic-Indic": "٥٨٠.٩٥", "an escape": "580.1\x1b[2J"}


def test_a_readable_driver_still_plans_as_before():
    _, facts = host("a100")
    facts["reads"] = {"DriverHost": DEBIAN}
    assert driver_step(facts, data(nvidia_driver_branch=580)) is None
    assert driver_step(facts, data(nvidia_driver_branch=535))["why"] == "driver 580.105.08 is loaded, not branch 535"
    assert parse_driver(["--- proc", "--- smi", "NVIDIA-SMI has failed because it couldn't communicate"])["loaded"] is False


@pytest.mark.parametrize("label", DRIVERS)
def test_an_unreadable_driver_version_is_named_in_the_plan_never_a_crash(label):
    """A lying host's driver version: the driver step says it is loaded and names it escaped and
    bounded ("not a version of any branch" when no branch can be read; the plan's driver line is
    made from it), and preflight's refusals run."""
    plan, facts = host("a100")
    facts["driver"] = {**facts["driver"], "version": DRIVERS[label]}
    facts["reads"] = {"DriverHost": DEBIAN}
    step = driver_step(facts, data(nvidia_driver_branch=535))
    print(f"{label}: {step['why']}")
    assert "\x1b" not in step["why"] and len(step["why"]) < 140
    if not DRIVERS[label]:      # nothing said: as no driver
        assert step["why"].startswith("no NVIDIA driver answers")
        return
    assert step["why"].startswith("driver ") and step["why"].endswith("is loaded, not branch 535")
    assert ("not a version of any branch" in step["why"]) == (branch_of(DRIVERS[label]) is None)
    plan = {**plan, "driver": facts["driver"], "driver_step": step}
    for line in [r.line("h") for r in refusals(plan, facts, data(nvidia_driver_branch=535))]:
        assert "\x1b" not in line and len(line) < 1000, line


# ----------------------------------------------------------------------------- the GPU guard's check
CONFIG = {"window_s": 10, "default": {"temp_c": 85, "draw_w": 300}}
GOOD = "1, GPU-b, 00000000:0F:00.0, 0x20B210DE, 100.00, 400.00, 40"
HOT = "2, GPU-c, 00000000:47:00.0, 0x20B210DE, 350.00, 400.00, 95"


@pytest.mark.parametrize("bad", [
    "², GPU-a, 00000000:07:00.0, 0x20B210DE, 100.00, 400.00, 40",
    "0, GPU-a\x1b[2J, 00000000:07:00.0, 0x20B210DE, inf, 400.00, nan",
    "0, GPU-a, 00000000:07:00.0, 0x20B210DE, " + "9" * 5000 + ", 400.00, 41",
    "0, GPU-a, 00000000:07:00.0, 0x20B210DE, ١٢٣, 400.00, 1e400",
    "\x1b]0;owned\x07 the cards are fine",
])
def test_one_malformed_line_leaves_the_other_cards_judged(bad):
    history = []
    for t in (0, 2, 4, 6):
        cards, lost = guard.parse_sample([bad, GOOD, HOT])
        history.append({"t": t, "cards": cards, "lost": lost})
    why = guard.evaluate(history, CONFIG, 6)
    print(f"{bad[:40]!r}: {why[:400]}")
    assert why.startswith("telemetry lost: ") and "\x1b" not in why and "\x07" not in why and len(why) < 1000
    assert "GPU 2 (GPU-c, 00000000:47:00.0, unknown class): temperature 95 C > 85 C" in why
    assert "GPU 2 (GPU-c, 00000000:47:00.0, unknown class): average draw 350.0 W over 6 s (4 samples) > 300 W" in why
    assert "GPU 1 " not in why                               # judged, and fine


def test_a_good_sample_is_judged_as_before():
    cards, lost = guard.parse_sample([GOOD])
    assert lost == [] and guard.evaluate([{"t": 0, "cards": cards, "lost": lost}], CONFIG, 0) is None


def test_a_units_absurd_start_time_and_journal_stamp_do_not_end_the_check(monkeypatch):
    monkeypatch.setattr(guard, "running_units", lambda config: ["rigup-llama@a.service"])
    monkeypatch.setattr(guard, "run_bounded", lambda argv, timeout: (
        0, "Id=rigup-llama@a.service\nEnvironment=\nActiveEnterTimestamp=@²\n"))
    units = guard.serving_units({}, guard.parse_sample([GOOD])[0])
    entries, _ = guard.parse_journal('{"__REALTIME_TIMESTAMP": 1e400, "MESSAGE": "x"}\n'
                                     '{"__REALTIME_TIMESTAMP": "١٢٣", "MESSAGE": "y"}')
    print(f"units {units}, journal {entries}")
    assert units[0]["since"] == 0.0 and entries[0] == (0.0, "x")
    assert [guard.reading(v) for v in ("inf", "nan", "²", "١٢", "9" * 10, "41", "-3.5")] == [
        None, None, None, None, None, 41.0, None]   # issue 61: unsigned
