"""The VRAM plan of an llama.cpp RPC group on the lab (roles/llama_server check_rpc_vram): the
head's preflight reads its worker's GPUs from the worker's own facts (over SSH, even when the
worker is outside --limit), prints the split over both hosts, and refuses a group that does not
fit, naming the instance. Preflight only (tests/roles/preflight_only.py): nothing changes."""

import json

import pytest

from tests.converge import pyinfra

pytestmark = pytest.mark.lab
HEAD, WORKER = "lab1", "lab2"
MODEL = {"repo": "rigup-lab/gemma-3-270m-GGUF", "revision": "dc8aac109665e96b4997756aca46909ff5ad7afc",
         "include": ["*.gguf"]}
ENV = {"RIGUP_LAB_HOST_DATA": json.dumps({HEAD: {"llama_server_instances": {"gemma": {
    "model": "gemma-270m", "port": 8081, "ctx": 4096, "parallel": 2, "ngl": 99, "rpc_workers": [WORKER]}}}})}


def plan(size_gib: float):
    """Preflight of the head alone (--limit), with the model sized ``size_gib``."""
    models = {"gemma-270m": {**MODEL, "size_gib": size_gib}}
    return pyinfra("inventory/lab.py", "tests/roles/preflight_only.py", "--limit", HEAD, "--dry",
                   "--data", f"models={json.dumps(models)}", timeout=300, env=ENV)


def lines(run, text: str) -> list[str]:
    return [ln.strip() for ln in run.output.splitlines() if text in ln]


def test_a_group_that_fits_prints_its_split_over_both_hosts(lab):
    run = plan(0.25)
    (line,) = lines(run, "RPC group needs")
    print(f"\n{line}")
    assert run.returncode == 0, run.output[-3000:]
    assert "lab1 8 x 80.0 GiB" in line and "lab2 8 x 80.0 GiB" in line and line.endswith("= 1280.0 GiB")


def test_a_group_that_does_not_fit_is_refused(lab):
    run = plan(1300.0)     # 1300 + KV + 16 x 1 GiB > 2 x 8 x 80 GiB
    (line,) = lines(run, "does not fit the VRAM of llama_server_instances.gemma and its RPC workers")
    print(f"\n{line}")
    assert run.returncode != 0
    assert "lab1 8 x 80.0 GiB" in line and "lab2 8 x 80.0 GiB" in line and "rpc_workers" in line
