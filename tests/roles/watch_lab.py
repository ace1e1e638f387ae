"""Helpers of the "watch it run" lab tests (test_model_fetch_metrics.py, test_watchdog.py,
test_bench.py): a play of a few roles, an inventory that wraps inventory/lab.py with per-host data
(and the first host in the group `monitoring`), Prometheus's API on the monitoring host, and the
engine stand-in (tests/lab/engine_stub.py) as a host's serving unit."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from tests.conftest import on_host
from tests.converge import ROOT, pyinfra

# Preflight judges base and the roles played (an engine stand-in holds a serving port here, which
# llama_server's port check would rightly refuse: that role is not played).
PLAY = """from pyinfra import host
from roles import base, preflight
from rigup.config import configure
import importlib
roles = [importlib.import_module("roles." + name).ROLE for name in {roles!r}]   # their records (rigup/role.py)
cfg = configure(host, [base.ROLE, *roles])
plan = preflight.run([base.ROLE, *roles], cfg)
base.apply(plan, cfg)
for role in roles:
    role.apply(plan, cfg)
"""
INVENTORY = """import json as _json, runpy as _runpy
from rigup.config import group_vars as _group_vars
_base = _runpy.run_path({lab_inventory!r})
_extra = _json.loads({extra!r})
def _with(group):
    hosts, data = group
    return ([(n, {{**d, **_extra.get(n, {{}})}}) for n, d in hosts], data)
a100 = _with(_base["a100"])
none = _with(_base["none"])
lab = _with(_base["lab"])
if {monitoring!r}:
    monitoring = (lab[0][:1], _group_vars("monitoring"))
all = _base["all"]
"""
ENGINE = ROOT / "tests/lab/engine_stub.py"
UNIT = "rigup-llama@{}.service"


def play(tmp_path: Path, roles: list[str], data: dict[str, dict], *args: str, monitoring: bool = False,
         check: bool = True):
    """preflight, base and ``roles`` on the hosts of ``data`` ({host: {var: value}}, over the lab
    group's), run as a user runs pyinfra; fails the test when it fails and ``check``."""
    deploy = tmp_path / f"play_{int(time.monotonic() * 1000)}.py"
    deploy.write_text(PLAY.format(roles=roles))
    return run_play(tmp_path, str(deploy), data, *args, monitoring=monitoring, check=check)


def run_play(tmp_path: Path, deploy: str, data: dict[str, dict], *args: str, monitoring: bool = False,
             check: bool = True):
    """pyinfra's ``deploy`` (a play: deploy.py, bench.py, ...) on the hosts of ``data``."""
    inventory = tmp_path / f"inventory_{int(time.monotonic() * 1000)}.py"
    inventory.write_text(INVENTORY.format(lab_inventory=str(ROOT / "inventory/lab.py"), extra=json.dumps(data),
                                          monitoring=monitoring))
    run = pyinfra(str(inventory), deploy, *(a for h in data for a in ("--limit", h)), *args)
    if check:
        assert run.returncode == 0, run.output[-5000:]
    return run


# Where Prometheus listens on its host: the --web.listen-address that roles/metrics wrote.
LISTEN = "$(sed -n 's/.*--web.listen-address=\\([^ \"]*\\).*/\\1/p' /etc/default/prometheus)"


def api(lab, monitor: str, path: str, **params) -> dict:
    """Prometheus's HTTP API on the monitoring host, asked there (at the address it binds)."""
    args = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    answer = json.loads(on_host(lab, monitor, f"curl -s -G {args} http://{LISTEN}/api/v1/{path}"))
    assert answer["status"] == "success", answer
    return answer["data"]


def until(predicate, timeout: float = 60, poll: float = 0.5):
    """The first true value of ``predicate()`` within ``timeout`` s, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    return None


def serve_stub(lab, name: str, instance: str, port: int, tps: float, slots: int = 4, extra: tuple = (),
               enabled: bool = False) -> None:
    """The engine stand-in as ``rigup-llama@INSTANCE`` on ``name`` (127.0.0.1:PORT, ``tps`` tokens
    a second until it is told to slow down; ``extra`` arguments), running; ``enabled``: started
    at boot too."""
    on_host(lab, name, f"mkdir -p /opt/rigup-lab && printf %s {shlex.quote(ENGINE.read_text())} "
                       "> /opt/rigup-lab/engine_stub.py")
    argv = ["/usr/bin/python3", "/opt/rigup-lab/engine_stub.py", "--port", str(port), "--tps", str(tps),
            "--slots", str(slots), *extra]
    unit = (f"[Unit]\nDescription=rigup lab: engine stand-in {instance}\n[Service]\nExecStart={shlex.join(argv)}\n"
            + ("[Install]\nWantedBy=multi-user.target\n" if enabled else ""))
    # an instance rigup serves there already (an earlier test's): its drop-in would replace the
    # stand-in's ExecStart; kept aside, with whether it was enabled and running, until unserve_stub
    svc = UNIT.format(instance)
    dropins = f"/etc/systemd/system/{svc}.d"
    on_host(lab, name, f"if [ -d {dropins} ]; then rm -rf {dropins}.lab-saved && mkdir {dropins}.lab-saved && "
                       f"{{ systemctl is-enabled -q {svc} && touch {dropins}.lab-saved/.enabled; "
                       f"systemctl is-active -q {svc} && touch {dropins}.lab-saved/.active; "
                       f"mv {dropins} {dropins}.lab-saved/dropins; }}; fi; systemctl stop {svc} 2>/dev/null; true")
    on_host(lab, name, f"printf %s {shlex.quote(unit)} > /etc/systemd/system/{svc} && systemctl daemon-reload && "
                       + (f"systemctl enable -q {svc} && " if enabled else "") + f"systemctl restart {svc}")
    ready = until(lambda: lab.ssh(name, f"curl -sf http://127.0.0.1:{port}/health").returncode == 0, 30)
    assert ready, f"the engine stand-in on {name} never answered"


def unserve_stub(lab, name: str, instance: str) -> None:
    """The stand-in's unit stopped and removed; rigup's drop-in of that instance, if it had one,
    back, enabled and running as it was."""
    unit = UNIT.format(instance)
    dropins, saved = f"/etc/systemd/system/{unit}.d", f"/etc/systemd/system/{unit}.d.lab-saved"
    lab.ssh(name, f"systemctl stop {unit}; systemctl disable -q {unit} 2>/dev/null; "
                  f"rm -f /etc/systemd/system/{unit}; systemctl daemon-reload; if [ -d {saved} ]; then "
                  f"mv {saved}/dropins {dropins} && systemctl daemon-reload && "
                  f"{{ [ ! -e {saved}/.enabled ] || systemctl enable -q {unit}; }} && "
                  f"{{ [ ! -e {saved}/.active ] || systemctl start {unit}; }}; rm -rf {saved}; fi")
