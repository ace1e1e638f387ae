"""A configuration error fails that host alone (issue 61, G3 of round 10): pyinfra ends the whole run
at an exception from any host's play file, so a play's body runs inside rigup.config.host_only,
which names the host and its reasons, fails it, and lets the others load. Real pyinfra: a State of
two hosts whose play files pyinfra_cli loads (in a process of its own: pyinfra_cli patches sockets
with gevent), no host connected (loading a play touches none)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state
from pyinfra_cli.util import load_deploy_file

inventory = Inventory((["good", ("bad", {"apt_lock_timeout": "forever"}), "peer"], {}))
state = State(inventory, Config())
ctx_state.set(state)
for h in inventory:
    state.activate_host(h)
load_deploy_file(state, sys.argv[1])
print("failed:", sorted(h.name for h in state.failed_hosts), "active:", sorted(h.name for h in state.active_hosts))
"""

PLAY = """
from pyinfra import host
from rigup.config import config_of, configure, host_only, peer_value

with host_only(host):
    configure(host)
    if host.name == "peer":   # a peer's setting read typed: a ConfigError from another host's data
        peer_value(config_of(host.inventory.get_host("bad")), "apt_lock_timeout")
    print("loaded", host.name)
"""


def test_a_configuration_error_fails_that_host_alone_and_the_others_load(tmp_path):
    (tmp_path / "play.py").write_text(PLAY)
    (tmp_path / "run.py").write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "play.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stderr
    assert "loaded good" in run.stdout and "loaded bad" not in run.stdout and "loaded peer" not in run.stdout
    assert "failed: ['bad', 'peer'] active: ['good']" in run.stdout
    assert "[bad] invalid configuration for host bad" in run.stderr and "[bad] " in run.stderr
    assert "apt_lock_timeout: expected int" in run.stderr and "Traceback" not in run.stderr


def test_every_play_reads_its_configuration_inside_host_only():
    """Each play at the checkout's top (deploy.py, preflight.py, status.py, bench.py, tune.py) and the
    lab's plays read a host's configuration (configure, check_host) inside ``with host_only(host):``
    (round 12: status.py, bench.py and tune.py still ended the run for every host)."""
    import ast

    plays = sorted(ROOT.glob("*.py"))
    outside = []
    for path in plays:
        tree = ast.parse(path.read_text())
        inside = {id(n) for w in ast.walk(tree) if isinstance(w, ast.With)
                  and any("host_only" in ast.unparse(i.context_expr) for i in w.items) for n in ast.walk(w)}
        outside += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and ast.unparse(n.func) in ("configure", "check_host") and id(n) not in inside]
    print("plays:", [p.name for p in plays], "outside host_only:", outside)
    assert outside == []
