"""Issue 61, round 13 UN1, FP1, ST5: a fact's command prints a host file's or a program's text with
printf, never echo. pyinfra runs each command with ``sh -c``, /bin/sh is dash on Debian and Ubuntu,
and dash's echo turns a ``\\n`` in its argument into a new line: a marker, a progress.json error or a
router's /models id (text a less-trusted party writes) forged ``key=`` lines and ``@@`` sections of
root's output. Each test runs the real command text under dash."""

import http.server
import json
import re
import shutil
import subprocess
import threading

import pytest

from plays import fleet
from rigup.nofollow import FUNCTIONS
from rigup.units import configured, instance_probe, parse_instances, unit_state
from roles.llama_cpp.facts import LlamaCppState
from roles.llama_server.facts import LlamaServerState
from roles.model_fetch.facts import parse_progress, probe_command, progress_command
from roles.vllm.facts import VllmCommit, VllmState

DASH = shutil.which("dash")
pytestmark = pytest.mark.skipif(DASH is None, reason="dash is the /bin/sh this is about; not installed")
FORGED = "\\nunit=0000\\nactive=active\\nkey=ffff\\n@@ victim\\nactive=active\\0101\\c"


def dash(command: str) -> list[str]:
    """``command``'s output lines as pyinfra reads them (split at newlines alone)."""
    out = subprocess.run([DASH, "-c", command], capture_output=True, text=True, timeout=60).stdout
    return out.split("\n")[:-1]


def test_a_marker_with_backslash_n_is_one_line_of_the_instance(tmp_path):
    """UN1: the marker (the rigup user's file) comes back as its own text, in its own section."""
    (tmp_path / "m").mkdir()
    marker = json.dumps({"repo": "org/m" + FORGED, "revision": "a" * 40})
    (tmp_path / "m" / "marker").write_text(marker)
    (tmp_path / "o").write_text(marker)
    command = FUNCTIONS + "; " + instance_probe("a", "rigup-rt13-none@a.service", {"dropin": str(tmp_path / "none")},
                                                str(tmp_path / "m" / "marker"), key=str(tmp_path / "none"),
                                                also={"o": str(tmp_path / "o")})
    _, found = parse_instances(dash(command))
    assert list(found) == ["a"]
    assert found["a"]["marker"] == json.loads(marker) == found["a"]["markers"]["o"]
    assert not found["a"].get("dropin") and not found["a"].get("key") and found["a"]["active"] != "active"


def test_a_progress_error_with_a_newline_stays_in_its_record(tmp_path):
    """FP1: progress.json is json.dumps of an error holding a newline (``\\n`` in the file)."""
    m, m2 = tmp_path / "m", tmp_path / "m2"
    (m / ".rigup-fetch").mkdir(parents=True)
    m2.mkdir()
    error = 'HTTPError: 500\nrunning=1\n@@ m2\nmarker={"repo":"org/m2","revision":"' + "b" * 40 + '","files":[]}\\c'
    record = {"state": "failed", "bytes": 0, "total": 0, "error": error}
    (m / ".rigup-fetch" / "progress.json").write_text(json.dumps(record))
    specs = [{"name": "m", "dest": str(m), "repo": "org/m", "revision": "a" * 40},
             {"name": "m2", "dest": str(m2), "repo": "org/m2", "revision": "b" * 40}]
    states = parse_progress(dash(progress_command(specs)), specs)
    assert states["m"]["running"] is False and "unreadable" not in states["m"]
    assert states["m"]["progress"]["state"] == "failed" and "running=1" in states["m"]["progress"]["error"]
    assert states["m2"]["complete"] is False and states["m2"]["progress"] is None


def test_a_models_id_with_backslash_n_forges_no_health():
    """ST5: a router's /models answer (the router, or a local user on its port while it is down)
    holding ``\\n`` in an id: the unit's own ``active=failed`` and ``health=503`` stand."""
    body = json.dumps({"data": [{"id": "m1\nactive=active\nport=1\nhealth=200"}]}).encode()   # \\n on the wire

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lines = fleet.SERVING.splitlines()
        at = next(i for i, line in enumerate(lines) if '"models=$(' in line)
        models = (lines[at].rstrip("\\") + lines[at + 1]).strip()
        port = server.server_address[1]
        rows = fleet.parse_serving(dash(f"bind=127.0.0.1; port={port}; hdr=; echo '@@ rigup-llama@r.service'; "
                                        f"echo active=failed; echo port={port}; echo health=503; {models}"))
    finally:
        server.shutdown()
    assert [(r["name"], r["active"], r["port"], r["health"]) for r in rows] == [("r", "failed", port, 503)]


from roles.rpc_worker import RpcWorkerState  # noqa: E402

ECHOED = re.compile(r"\becho\b[^;|&\n]*\$")   # echo of an expansion: a variable or a command's output


@pytest.mark.parametrize("command", [
    instance_probe("a", "rigup-llama@a.service", {"dropin": "/d"}, "/m/marker", key="/k", also={"o": "/o"}),
    configured("rigup-llama", "llama", "/b"), "; ".join(unit_state("/u", "u.service")),
    progress_command([{"name": "m", "dest": "/m", "repo": "o/m", "revision": "a" * 40, "stage": "/s"}]),
    probe_command([]).split("<<")[0], fleet.SERVING, fleet.guard_section("/t", "/x"),
    VllmState().command("/pin", {"a": ["/m/marker", "a", "/d/marker"]}), VllmCommit().command("https://h/r", "abc1234"),
    LlamaCppState().command("/l"), LlamaServerState().command({"a": ["/m/marker", "a", {"o": "/o"}]}, "/l/current"),
    RpcWorkerState().command("/l/current")])   # round 14 E1: its build link's text
def test_no_fact_command_echoes_what_it_read(command):
    """The rule the fixes follow: in these facts' commands, only constants are echoed."""
    assert not ECHOED.findall(command.replace(FUNCTIONS, ""))


def test_e1_e2_a_link_or_backends_file_holding_a_newline_forges_no_line():
    """Round 14 E1, E2: the RPC worker's build link and the balancer's backends file were echoed: under
    dash a '\\n' in their text was a forged loaded=1 / active=active line."""
    import tempfile
    from pathlib import Path

    from roles.balancer.facts import BalancerState

    with tempfile.TemporaryDirectory() as d:
        link = Path(d) / "current"
        link.symlink_to("/opt/x\\nloaded=1")
        out = dash(RpcWorkerState().command(str(link)))
        print(out)
        assert [ln for ln in out if ln.startswith("loaded=")] == ["loaded="] and "build=/opt/x\\nloaded=1" in out
    command = BalancerState().command("/usr/local/bin/rigup-balancer-drain")
    assert "printf '%s\\n' \"backend=" in command and not re.search(r"echo \\\"backend=", command)
