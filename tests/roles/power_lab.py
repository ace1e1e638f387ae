"""Helpers shared by the gpu_power, gpu_guard, cmpunlocker and burnin lab tests."""

import contextlib
import json

from tests.conftest import on_host
from tests.converge import pyinfra

PLAY = "tests/roles/power_only.py"
TRIPPED = "/var/lib/rigup/gpu-guard.tripped"
# A serving stand-in as the llama_server role writes them: after the power unit, not while tripped.
SERVING_UNIT = """[Unit]
Description=serving stand-in %i
After=rigup-gpu-power.service
ConditionPathExists=!/var/lib/rigup/gpu-guard.tripped

[Service]
ExecStartPre=/bin/sh -c 'echo "serving starts; limits: $$(nvidia-smi --query-gpu=uuid,power.limit --format=csv,noheader | paste -s -d";" -)"'
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


def data(**values) -> list[str]:
    out = []
    for key, value in values.items():
        out += ["--data", f"{key}={json.dumps(value)}"]
    return out


def play(host: str, *args: str, check: bool = True, file: str = PLAY):
    run = pyinfra("inventory/lab.py", file, "--limit", host, *args, timeout=600)
    if check:
        assert run.returncode == 0, run.output[-5000:]
    return run


@contextlib.contextmanager
def own_host(lab, profile: str = "a100"):
    """A lab host of its own (a trip or a quarantine acts on the whole host), removed afterwards."""
    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    lab.up(1, profile, first=first)
    try:
        yield f"lab{first}"
    finally:
        lab.remove(f"lab{first}")


def cards(lab, host: str) -> list[dict]:
    out = on_host(lab, host, "nvidia-smi --query-gpu=index,uuid,pci.bus_id,power.limit,persistence_mode,"
                             "memory.total,pcie.link.gen.current,name --format=csv,noheader,nounits")
    keys = ("index", "uuid", "bus_id", "limit", "persistence", "memory", "gen", "name")
    return [dict(zip(keys, (c.strip() for c in line.split(",")))) for line in out.splitlines()]


def calls(lab, host: str) -> list[list[str]]:
    """Every nvidia-smi argv on the host so far (the simulator's log)."""
    return [json.loads(line)["argv"] for line in on_host(lab, host, "rigup-gpu-sim calls").splitlines()]


def install_serving_unit(lab, host: str) -> None:
    on_host(lab, host, f"printf '%s' {json_quote(SERVING_UNIT)} > /etc/systemd/system/rigup-llama@.service && "
                       "systemctl daemon-reload && systemctl enable -q rigup-llama@test.service && "
                       "systemctl start rigup-llama@test.service")


def json_quote(text: str) -> str:
    import shlex
    return shlex.quote(text)
