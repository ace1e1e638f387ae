"""The controller's side of tests/gpu/router_tune/router_tune.py (issue 63), with the checkout's venv:

    PYTHONPATH=. .venv/bin/python tests/gpu/router_tune/prepare.py sweep       # -> .gpu/router-tune.json
    PYTHONPATH=. .venv/bin/python tests/gpu/router_tune/prepare.py serve DIR   # DIR: the sweep's x-a.json, x-b.json
                                                                     # -> .gpu/router-tuned.json
``/BIN`` and ``/W/`` stand for the build's bin directory and the GPU machine's work directory."""

import json
import sys
import tempfile
from pathlib import Path

from plays import tuning
from rigup import config
from roles.llama_server.command import argv, preset_text
from rigup.instances.llama_server import instances
from tests.unit.hosts import REV, data

MODELS = {m: {"repo": f"org/{m}-GGUF", "revision": REV, "size_gib": 0.01} for m in "ab"}
PATHS = {"a": "/W/a.gguf", "b": "/W/b.gguf"}
ROUTER = {"x": {"model": "a", "port": 8186, "ctx": 4096, "parallel": 1, "also": ["b"], "models_max": 1,
                "per_model": {"b": {"ctx": 2048}}}}
TUNE = {"rigup_state_dir": "/W/state", "llama_server_tune_budget_s": 75, "llama_server_tune_levels": [4],
        "llama_server_tune_concurrency": 4, "llama_server_tune_max_parallel": 8, "llama_server_tune_max_tokens": 32,
        "llama_server_tune_port": 8190}


def served(tuned: dict) -> tuple[list[str], str]:
    found, problems = instances(data(models=MODELS, llama_server_instances=ROUTER, llama_server_tuned=tuned, **TUNE))
    assert not problems, problems
    return argv("x", found["x"], "/BIN/llama-server", "/unused"), preset_text("x", found["x"], PATHS, {m: REV for m in "ab"})


if sys.argv[1] == "sweep":
    routed, preset = served({})
    sections = tuning.preset_sections(preset.splitlines(), "x.models.ini")
    specs = {m: tuning.spec(tuning.model_job("x", m), tuning.model_argv(routed, sections, m)[0],
                            data(**TUNE), True, None, {"env": {}, "gpus": 1},   # each model's ctx: the plan's
                            ctx=ROUTER["x"]["per_model"].get(m, {}).get("ctx", ROUTER["x"]["ctx"]), parallel=1)
             for m in "ab"}
    Path(".gpu/router-tune.json").write_text(json.dumps({"router_argv": routed, "preset": preset, "specs": specs}, indent=1))
else:
    site = tempfile.mkdtemp()
    (Path(site) / "host_vars").mkdir()
    for m in "ab":
        text = (Path(sys.argv[2]) / f"x-{m}.json").read_text()
        tuning.record("gpu", "x", text, {"_rigup_site": site}, [], None, where=f"x-{m}.json", model=m)
    routed, preset = served(config.host_vars("gpu", Path(site))["llama_server_tuned"])
    Path(".gpu/router-tuned.json").write_text(json.dumps({"router_argv": routed, "preset": preset}, indent=1))
    print(f"{site}/host_vars/gpu.yml; {site}/tune_out")
