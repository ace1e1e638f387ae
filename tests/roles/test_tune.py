"""tune.py on the lab (CPU, Gemma 3 270M, group_vars/lab.yml's instance served with one slot, -c
2048 --parallel 1, for a target of 4 concurrent): a sweep within its budget finds flags at least as
fast as the instance's at the target concurrency, writes them to the site's host_vars/<host>.yml,
and starts the instance again; the next converge serves with them (status.py says so) and the one
after changes nothing."""

import json

import pytest
import yaml

from tests.conftest import on_host
from tests.converge import converge, pyinfra

pytestmark = pytest.mark.lab
TUNE = ["--data", "llama_server_tune_budget_s=90", "--data", "llama_server_tune_concurrency=4",
        "--data", "llama_server_tune_max_tokens=32"]
ONE_SLOT = ["--data", "llama_server_instances=" + json.dumps(
    {"gemma": {"model": "gemma-270m", "port": 8081, "ctx": 2048, "parallel": 1, "ngl": 0}})]


def test_a_sweep_finds_flags_at_least_as_fast_and_the_next_converge_serves_with_them(lab, second_converge, tmp_path):
    host = lab.hosts()[0]["name"]
    (tmp_path / "group_vars").mkdir()
    env = {"RIGUP_SITE": str(tmp_path)}
    try:
        converge("inventory/lab.py", "--limit", host, *ONE_SLOT)
        run = pyinfra("inventory/lab.py", "tune.py", "--limit", host, *ONE_SLOT, *TUNE, env=env, timeout=900)
        said = [ln.strip() for ln in run.output.splitlines() if f"[{host}] tune gemma:" in ln]
        print(f"\ntune.py: exit {run.returncode} in {run.seconds:.1f} s\n" + "\n".join(said[-8:]))
        assert run.returncode == 0, run.output[-4000:]
        tuned = yaml.safe_load((tmp_path / "host_vars" / f"{host}.yml").read_text())["llama_server_tuned"]["gemma"]
        print(f"host_vars: {tuned}")
        assert tuned["tok_s"] >= tuned["baseline_tok_s"] and tuned["concurrency"] == 4
        assert tuned["build"] and tuned["build"].startswith("lab-base-")   # the drop-in's build
        assert on_host(lab, host, "systemctl is-active rigup-llama@gemma").strip() == "active"
        applied = converge("inventory/lab.py", "--limit", host, *ONE_SLOT, env=env)
        dropin = on_host(lab, host, "grep ^ExecStart=. /etc/systemd/system/rigup-llama@gemma.service.d/rigup.conf")
        flags = tuned["flags"]
        print(f"converge with the site: {applied.totals['changed']} changed, {applied.seconds:.1f} s; "
              f"ExecStart: {dropin.strip()[:200]}")
        assert applied.totals["changed"] > 0 if flags else applied.totals["changed"] == 0, applied.changed_operations()
        if "parallel" in flags:
            assert f"--parallel {flags['parallel']}" in dropin and f"-c {flags['ctx']}" in dropin
        again = converge("inventory/lab.py", "--limit", host, *ONE_SLOT, env=env)
        assert again.totals["changed"] == 0, again.changed_operations()
        status = pyinfra("inventory/lab.py", "status.py", "--limit", host, *ONE_SLOT, env=env, timeout=120)
        assert "(tuned " in status.output and "x at 4 concurrent)" in status.output, status.output[-2000:]
    finally:
        converge("inventory/lab.py", "--limit", host)   # back to group_vars/lab.yml's flags
