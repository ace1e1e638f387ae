"""Drift behind rigup's back is found and fixed although converged roles register no operation
(rigup/probe.py): on lab1, one property of one role at a time is changed by hand (a directory's
mode, an installed script, a model file, the build link, a card's power limit, the guard's
configuration, a unit's drop-in, the node exporter's arguments, a timer stopped); the next converge
names the roles before it converged without an operation, changes that role and brings the property
back; a last converge registers no operation at all."""

import re

import pytest

from tests.conftest import on_host
from tests.converge import converge

pytestmark = pytest.mark.lab

MODEL_DIR = "/srv/models/gemma-270m"   # models_dir (roles/model_fetch/defaults.yml) / the model's name
# (role, what is changed, the command that changes it, the command whose output shows the property)
CASES = [
    ("base", "the state directory's mode", "chmod 0755 /var/lib/rigup", "stat -c %a:%U:%G /var/lib/rigup"),
    ("model_fetch", "the fetch script", "echo '# drift' >> /opt/rigup/bin/rigup-fetch",
     "sha256sum /opt/rigup/bin/rigup-fetch"),
    ("model_fetch", "a model file (cut by 4 KiB)",
     f"f=$(find -L {MODEL_DIR} -name '*.gguf' | head -n 1); truncate -s -4096 \"$f\"",
     f"find -L {MODEL_DIR} -name '*.gguf' -exec sha256sum {{}} +"),
    ("llama_cpp", "the build link", "ln -sfn /tmp /opt/rigup/llama.cpp/current", "readlink /opt/rigup/llama.cpp/current"),
    ("gpu_power", "GPU 0's power limit (gpu_power_watts: 300)", # by UUID, as rigup sets it: test_gpu_power reads every setter nvidia-smi was called with
     "nvidia-smi -i \"$(nvidia-smi -i 0 --query-gpu=uuid --format=csv,noheader)\" -pl 150 >/dev/null",
     "nvidia-smi -i 0 --query-gpu=power.limit --format=csv,noheader"),
    ("gpu_guard", "the guard's configuration", "echo ' ' >> /etc/rigup/gpu-guard.json",
     "sha256sum /etc/rigup/gpu-guard.json"),
    ("llama_server", "the instance's drop-in",
     "echo '# drift' >> /etc/systemd/system/rigup-llama@gemma.service.d/rigup.conf && systemctl daemon-reload",
     "sha256sum /etc/systemd/system/rigup-llama@gemma.service.d/rigup.conf"),
    ("metrics", "the node exporter's arguments", "echo '# drift' >> /etc/default/prometheus-node-exporter",
     "sha256sum /etc/default/prometheus-node-exporter"),
    ("gpu_guard", "its timer, stopped", "systemctl stop rigup-gpu-guard.timer", "systemctl is-active rigup-gpu-guard.timer || true"),
]


@pytest.mark.parametrize("role,what,change,show", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_drift_on_each_role_is_found_and_fixed(lab, second_converge, role, what, change, show):
    name = lab.hosts()[0]["name"]
    data = ["--data", "gpu_power_watts=300"] if "gpu_power_watts" in what else []
    if data:   # the lab's a100s leave the cards' limits alone: rigup sets 300 W first
        converge("inventory/lab.py", "--limit", name, *data)
    before = on_host(lab, name, show)
    on_host(lab, name, change)
    assert on_host(lab, name, show) != before, f"{what}: the change did not take"
    try:
        run = converge("inventory/lab.py", "--limit", name, *data)
        fixed = on_host(lab, name, show)
    finally:
        if data:   # and back to the card's default
            converge("inventory/lab.py", "--limit", name)
    assert run.returncode == 0, run.output[-4000:]
    changed = run.changed_on(name)
    skipped = re.search(rf"\[{name}\] nothing to do in ([^(]*) \(.*", run.output)
    print(f"\n{role}: {what} changed by hand; the next converge ({run.seconds:.1f} s) changed {changed}; "
          f"the probe: {skipped.group(0) if skipped else 'none'}")
    assert fixed == before, f"{what} was not brought back"
    if role != "base":   # the roles before it were checked and registered nothing
        assert skipped and "base.apply" in skipped.group(1), run.output[-3000:]
    assert changed and any(c.startswith(role) for c in changed), changed


def test_then_a_converge_registers_no_operation(lab, second_converge):
    name = lab.hosts()[0]["name"]
    run = converge("inventory/lab.py", "--limit", name)
    assert run.returncode == 0 and run.totals["changed"] == 0, run.output[-4000:]
    line = re.search(rf"\[{name}\] every role converged \(\d+ roles, \d+ steps, (\d+) operations checked, none to run\)",
                     run.output)
    print(f"\na converge with nothing to do: {run.seconds:.1f} s, {line.group(0) if line else run.output[-800:]}")
    assert line and int(line.group(1)) > 20
    assert f"[{name}] unchanged" in run.output.split("--> rigup: what happened to each host", 1)[1]
