"""Issue 47: a lying or broken host does not crash what reads it. Numbers a host prints are read
with bounds (rigup/text.py ``number``: ASCII digits, at most 18 before the point, finite): a
5000-digit power draw, ``inf``, ``1e400``, ``nan``, Arabic-Indic or superscript digits become
"unknown" for that field; the card, the row and the other cards stay."""

from pathlib import Path

import pytest

from rigup.fleet import parse_cards, parse_serving
from rigup.gpu.catalogue import version_tuple
from rigup.gpu.driver import branch_of
from rigup.gpu.facts import parse_free_disk, parse_gpus
from rigup.text import number

LINE = (Path(__file__).parent.parent / "fixtures/facts/a100-query-nounits.csv").read_text().splitlines()[0]
HOSTILE = {"5000 digits": "9" * 5000, "inf": "inf", "1e400": "1e400", "nan": "nan",
           "Arabic-Indic digits": "١٢٣", "a superscript": "²", "hex": "0x1f4", "an escape": "3\x1b[2J"}


@pytest.mark.parametrize("what", HOSTILE)
def test_a_cards_absurd_draw_is_unknown_and_the_others_are_read(what):
    cells = LINE.split(",")
    cells[12] = " " + HOSTILE[what]                       # power.draw
    second = LINE.replace(LINE.split(",")[0], "1", 1)
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
    """roles/gpu_guard/guard.py parse_sample (the host's python3): a line with a superscript index,
    an ``inf`` draw, a ``nan`` temperature, 5000 digits: that card's problem, named; the next card
    read and judged."""
    from roles.gpu_guard.guard import parse_sample

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
    """rigup/throughput.py (the watchdog's and bench's completion) against a real loopback server
    whose timings.predicted_per_second is absurd: the wall-clock rate stands, finite."""
    import http.server
    import threading

    from rigup import throughput

    body = ('{"usage": {"completion_tokens": 8}, "timings": {"predicted_per_second": %s}}' % reported).encode()

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
