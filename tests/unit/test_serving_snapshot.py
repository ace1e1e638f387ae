"""Every file the serving roles write for a host, rendered from tests/unit/hosts.py's fixtures and
held byte-for-byte to tests/fixtures/serving/ (issue 64: the snapshot taken before the serving
path is refactored, so that a refactor which changes what a host runs fails here, naming the file).

Each case is a host (a fact fixture's plan) with its data; :func:`walked` runs the serving walk
itself (rigup.serving ``serve`` with the role's Engine, what its ``apply`` calls) with its
operation calls recorded (rigup.probe), then each server's operation body with what it reads on
the host fixed here (the model's first GGUF file, the llama.cpp build, the markers' revisions):
the template unit, each server's drop-in, its ExecStart argv (``argv.json``: the serving plan's,
rigup.serving Server ``argv``, its slots filled as the operation fills them), a router's preset,
a replicated instance's backends file, vLLM's environment files and install stamp, and a Ray
node's unit and allow-list. A case's files live in ``tests/fixtures/serving/<case>/``.

A change meant to change what hosts run regenerates them (then read the diff):
``.venv/bin/python -m tests.unit.test_serving_snapshot --update``."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

from rigup import run as run_state, serving
from rigup import state as state_module
from rigup.contract.llama_server import PRESET
from rigup.gpu.plan import hardware_plan
from rigup.models import models
from rigup.names import BALANCER_DIR
from rigup.serving import filled, serve, serving_plan
from roles.llama_server import LLAMA as LLAMA_SERVER, UNIT
from roles.llama_server.facts import DROPIN
from roles.vllm import VLLM as VLLM_ENGINE, cluster
from roles.vllm import command as cmd
from tests.unit.hosts import GLM, REV, data, glm_llama, host

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "serving"
BUILD = "lab-base-6e7ad8c66d"            # what ``current`` points to (LlamaServerState's build)
GGUF = "UD-Q4_K_XL/model-00001-of-00004.gguf"   # a model's first GGUF file, as its marker lists it
MODELS = {"a": {"repo": "org/a-GGUF", "revision": REV, "size_gib": 30.0},
          "b": {"repo": "org/b-GGUF", "revision": "1" * 40, "size_gib": 20.0},
          "c": {"repo": "org/c-GGUF", "revision": "2" * 40, "size_gib": 8.0}}
GEMMA = {"repo": "rigup-lab/gemma-3-270m-GGUF", "revision": REV, "size_gib": 0.25}
VLLM_MODELS = {"glm": {"repo": "org/glm-4.5-air", "revision": REV, "size_gib": 60.0},
               "draft": {"repo": "org/glm-draft", "revision": "3" * 40, "size_gib": 2.0}}


def quarantined(plan: dict) -> dict:
    """``plan`` with card 1 quarantined by roles/burnin (left out of the cards every server may use)."""
    out = [c for c in plan["cards"] if c["index"] == 1]
    return {**plan, "cards": [c for c in plan["cards"] if c["index"] != 1],
            "burnin": {"quarantined": [{"uuid": c["uuid"], "index": 1, "bus_id": c.get("bus_id"), "failed": ["vram"]}
                                       for c in out]}}


def downtrained(profile: str) -> dict:
    """A host whose GPU 0 trained at PCIe x4 (the plan names another main GPU)."""
    _, facts = host(profile)
    slow = [dict(g, pcie_width=4) if g["index"] == 0 else g for g in facts["gpus"]]
    return hardware_plan(slow, facts["driver"], [])


def cpu_plan() -> dict:
    return hardware_plan([], {"loaded": False}, [])


# -- llama_server --------------------------------------------------------------------------------

# case -> (the host's plan, its data, its RPC workers' data by inventory name)
LLAMA = {
    "llama-single-a100": lambda: (host("a100")[0], data(**glm_llama()), {}),
    "llama-single-flags-h100": lambda: (host("h100")[0], data(
        **glm_llama(ctx=32768, parallel=4, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0",
                    host="0.0.0.0", api_key=True, batch=2048, ubatch=512,
                    extra_args=["--temp", "0.6", "--top-k", "40"]),
        llama_server_allow=["slots"], llama_server_cors_origins=["https://chat.example.org"]), {}),
    "llama-single-tensor-split-h100": lambda: (host("h100")[0], data(
        **glm_llama(ctx=16384, parallel=2, tensor_split="3,3,2,2", split_mode="row", ngl=80)), {}),
    "llama-single-cmp170hx": lambda: (host("cmp170hx")[0], data(
        models={"gemma": GEMMA}, llama_server_instances={"gemma": {"model": "gemma", "port": 8080}}), {}),
    "llama-downtrained-a100": lambda: (downtrained("a100"), data(
        llama_cpp_backend="cuda", models={"glm": GLM},
        llama_server_instances={"glm": {"model": "glm", "port": 8080, "ctx": 8192, "parallel": 1}}), {}),
    "llama-quarantined-h100": lambda: (quarantined(host("h100")[0]), data(
        models={"gemma": GEMMA}, llama_server_instances={"gemma": {"model": "gemma", "port": 8080}}), {}),
    "llama-replicas-a100": lambda: (host("a100")[0], data(
        models={"m": {"repo": "acme/m-GGUF", "revision": REV, "size_gib": 120}},
        llama_server_instances={"m": {"model": "m", "port": 8081, "replicas": "auto", "gpus_per_replica": "auto",
                                      "host": "0.0.0.0", "api_key": True}}), {}),
    "llama-replicas-h100-fleet-key": lambda: (host("h100")[0], data(
        models={"gemma": GEMMA},
        llama_server_instances={"gemma": {"model": "gemma", "port": 8090, "replicas": 2, "gpus_per_replica": 1,
                                          "api_key": True, "ctx": 8192, "parallel": 2}},
        fleet_api_key=True), {}),
    "llama-replicas-cpu": lambda: (cpu_plan(), data(
        gpu_enabled=False, models={"m": {"repo": "acme/m-GGUF", "revision": REV, "size_gib": 0.25}},
        llama_server_instances={"m": {"model": "m", "port": 8081, "replicas": 2, "ngl": 0}}), {}),
    "llama-two-instances-h100": lambda: (host("h100")[0], data(
        models={"gemma": GEMMA, **MODELS},
        llama_server_instances={"gemma": {"model": "gemma", "port": 8080, "ctx": 4096, "parallel": 1},
                                "a": {"model": "a", "port": 8085, "ctx": 8192, "parallel": 2,
                                      "reasoning_budget": 0}}), {}),
    "llama-router-a100": lambda: (host("a100")[0], data(
        models=MODELS, llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 4096, "parallel": 1,
                                                      "also": ["b", "c"]}}), {}),
    "llama-router-per-model-h100": lambda: (host("h100")[0], data(
        models=MODELS, llama_server_instances={"x": {
            "model": "a", "port": 8081, "ctx": 8192, "parallel": 2, "also": ["b", "c"], "models_max": 2,
            "per_model": {"b": {"ctx": 16384, "load_on_startup": True}, "c": {"cache_type_k": "q8_0"}}}}), {}),
    "llama-router-queue-h100": lambda: (host("h100")[0], data(
        models=MODELS, llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 4096, "parallel": 2,
                                                      "also": ["b"], "queue": 20, "host": "0.0.0.0",
                                                      "api_key": True}}), {}),
    "llama-router-pinned-h100": lambda: (host("h100")[0], data(
        models=MODELS, llama_server_instances={"x": {
            "model": "a", "port": 8081, "ctx": 4096, "parallel": 1, "also": ["b", "c"],
            "per_model": {"c": {"pinned": True, "ctx": 2048}, "b": {"flash_attn": "on"}}}}), {}),
    "llama-tuned-h100": lambda: (host("h100")[0], data(
        **glm_llama(), llama_server_tuned={"glm": {"flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on",
                                                             "batch": 2048, "ubatch": 512}, "tok_s": 142.1}}), {}),
    "llama-tuned-router-h100": lambda: (host("h100")[0], data(
        models=MODELS,
        llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 4096, "parallel": 1, "also": ["b"]}},
        llama_server_tuned={"x": {"models": {"a": {"flags": {"parallel": 2, "ctx": 8192}},
                                             "b": {"flags": {"flash_attn": "on"}}}}}), {}),
    "llama-rpc-head-h100": lambda: (host("h100")[0], data(
        **glm_llama(ctx=65536, parallel=8, ngl=99, flash_attn="on", rpc_workers=["rig-02", "rig-03"]),
        ssh_hostname="10.0.0.1", llama_server_rpc_wait=60),
        {"rig-02": data(ssh_hostname="10.0.0.2"), "rig-03": data(ssh_hostname="fd00::3", rpc_worker_port=50060)}),
}


def llama_files(plan: dict, d: dict, workers: dict) -> dict[str, str]:
    """What roles/llama_server installs for ``d`` on a host of ``plan`` (``workers``: the data of
    the RPC workers its instances name, by inventory name)."""
    out: dict[str, str] = {}
    for call in walked(LLAMA_SERVER, plan, d, "rig-01", {"config_of": workers.__getitem__}):
        kw = call.kwargs
        if "unit_name" not in kw:
            out.update(_written(kw))
            continue
        unit, name, sinst = kw["unit_name"], kw["instance_name"], kw["inst"]
        model_path = f"{kw['units'][unit][0].rsplit('/', 1)[0]}/{GGUF}"
        keys = [sinst["model"], *(sinst["also"] or [])]
        markers = {k: {"files": [GGUF], "revision": models(d)[0][k]["revision"]} for k in keys}
        state = {"build": BUILD, "remedy": [], "instances": {unit: {"marker": markers[sinst["model"]],
                                                                      "markers": markers}}}
        texts = _body(call, "roles.llama_server", state)
        out[f"rigup-llama@{unit}/rigup.conf"] = texts[DROPIN.format(unit)]
        if sinst["also"]:
            out[f"rigup-llama@{unit}/{name}.models.ini"] = texts[PRESET.format(name)]
        out[f"rigup-llama@{unit}/argv.json"] = json.dumps(   # the plan's argv, filled as the operation fills it
            {"marker": kw["units"][unit][0], "env": kw["env"],
             "argv": filled(kw["argv"], model_file=model_path, rpc=",".join(kw["rpc"]))}, indent=2) + "\n"
    return out


# -- vllm ----------------------------------------------------------------------------------------

def _vllm(**inst) -> dict:
    return {"models": VLLM_MODELS, "vllm_instances": {"glm": {"model": "glm", "port": 8000, **inst}}}


VLLM = {
    "vllm-single-h100": lambda: (host("h100")[0], data(**_vllm(tp=4)), None),
    "vllm-flags-h100": lambda: (host("h100")[0], data(
        **_vllm(tp=2, pp=2, pp_partition="12,12", layers=24, gpu_memory_utilization=0.85, served_model_name="glm-air",
                host="0.0.0.0", api_key=True, env={"VLLM_LOGGING_LEVEL": "DEBUG", "X_QUOTED": 'say "hi" $HOME'},
                extra_args=["--max-model-len", "32768"]),
        vllm_env={"NCCL_DEBUG": "WARN"}, vllm_socket_ifname="eth1", vllm_nccl_ib_disable=True), None),
    "vllm-gpus-a100": lambda: (host("a100")[0], data(**_vllm(tp=2, gpus="4,5")), None),
    "vllm-replicas-h100": lambda: (host("h100")[0], data(
        **_vllm(tp=2, replicas="auto", api_key=True), fleet_api_key=True), None),
    "vllm-draft-a100": lambda: (host("a100")[0], data(
        **_vllm(tp=4, draft_model="draft", speculative={"method": "eagle", "num_speculative_tokens": 3})), None),
    "vllm-cmp170hx-git": lambda: (host("cmp170hx")[0], data(
        **_vllm(tp=2, pp=3), vllm_pip_version=None, vllm_git_url="https://github.com/example/vllm.git",
        vllm_git_commit=REV, vllm_installer="uv", vllm_uv_version="0.9.7",
        vllm_extra_packages=["exllamav3==1.4.8"]), None),
    "vllm-quarantined-h100": lambda: (quarantined(host("h100")[0]), data(**_vllm(tp=2)), None),
    "vllm-ray-head-h100": lambda: (host("h100")[0], data(
        **_vllm(tp=4, pp=2), ssh_hostname="10.0.0.1", vllm_ray_role="head", vllm_ray_version="2.52.1",
        vllm_socket_ifname="eth1"), "rig-01"),
    "vllm-ray-worker-h100": lambda: (host("h100")[0], data(
        ssh_hostname="10.0.0.2", vllm_ray_role="worker", vllm_ray_head="rig-01", vllm_ray_version="2.52.1",
        vllm_socket_ifname="eth1"), "rig-02"),
}


def ray_fleet(me: str, d: dict) -> dict:
    """The cluster a Ray case's host is part of: head rig-01 (10.0.0.1), workers rig-02 (10.0.0.2)
    and rig-03 (fd00::3, with the dashboard's address given); ``d`` is ``me``'s data."""
    hosts = {"rig-01": data(ssh_hostname="10.0.0.1", vllm_ray_role="head", vllm_ray_version="2.52.1",
                            vllm_ray_dashboard=True),
             "rig-02": data(ssh_hostname="10.0.0.2", vllm_ray_role="worker", vllm_ray_head="rig-01",
                            vllm_ray_version="2.52.1"),
             "rig-03": data(ssh_hostname="fd00::3", vllm_ray_role="worker", vllm_ray_head="rig-01",
                            vllm_ray_version="2.52.1")}
    return {**hosts, me: d}


def vllm_files(plan: dict, d: dict, me: str | None) -> dict[str, str]:
    """What roles/vllm installs for ``d`` on a host of ``plan`` (``me``: the host's inventory name
    in a Ray cluster, None outside one)."""
    out: dict[str, str] = {}
    fleet = ray_fleet(me, d) if me else {}
    for call in walked(VLLM_ENGINE, plan, d, me or "rig-01", {"fleet_data": lambda host: fleet}):
        kw = call.kwargs
        if "stamp" in kw and "series" in kw:          # the pin's install
            out["stamp.json"] = kw["stamp"] + "\n"
        elif kw.get("path") == cluster.FIREWALL:
            out["ray.nft"] = kw["text"]
        elif "venv" in kw and "text" in kw:           # the Ray node
            out["rigup-ray.service"] = kw["text"]
        elif "unit_name" not in kw:
            out.update(_written(kw))
        else:
            unit, name = kw["unit_name"], kw["instance_name"]
            state = {"instances": {unit: {"marker": {"revision": models(d)[0][kw["inst"]["model"]]["revision"]},
                                          "draft": hashlib.sha256(b"the drafter's marker").hexdigest(),
                                          "env": cmd.sha(kw["env"])}}}
            out[f"rigup-vllm@{unit}/rigup.conf"] = _body(call, "roles.vllm", state)[cmd.DROPIN.format(unit)]
            out[f"rigup-vllm@{unit}/{unit}.env"] = kw["env"]
            out[f"rigup-vllm@{unit}/argv.json"] = json.dumps(
                {"pin_dir": kw["pin_dir"], "argv": filled(kw["argv"], vllm=f"{kw['venv']}/bin/vllm")}, indent=2) + "\n"
    return out


# -- the walk ------------------------------------------------------------------------------------

def walked(engine, plan: dict, d: dict, me: str, role_names: dict) -> list:
    """The operation calls ``serve(engine, plan, d)`` makes on host ``me`` (its plan's ``serving``
    made as preflight makes it: rigup.serving ``serving_plan``), recorded (rigup.probe),
    with ``role_names`` (the role module's names: what it reads of its peers) replaced."""
    module = importlib.import_module(engine.server.__module__)
    fake = SimpleNamespace(name=me, state=_State(current_deploy_filename=None), loop_position=[],
                           in_deploy=False, current_deploy_name=None, current_deploy_kwargs=None,
                           current_deploy_data=None, inventory=SimpleNamespace(get_host=lambda name: name))
    with pytest.MonkeyPatch.context() as mp, ctx_host.use(fake):
        for name, value in role_names.items():
            mp.setattr(module, name, value)
        mp.setattr(state_module, "will_read", lambda *a, **k: None)   # no batch: nothing is read
        mp.setattr(serving, "will_read", lambda *a, **k: None)
        recording = run_state.of(fake.state).recording
        recording[me] = []
        serve(engine, {**plan, "serving": serving_plan([engine], d, plan)}, d)   # as preflight plans it
        return recording[me]


class _State(SimpleNamespace):
    """A State of the fake host: its run (rigup/run.py) is keyed by it, weakly (by identity)."""

    __hash__ = object.__hash__


def _written(kw: dict) -> dict[str, str]:
    """A template unit or a backends file, by its path under the case's folder (other files: none)."""
    dest = kw.get("dest", "")
    if dest in (UNIT, cmd.UNIT):
        return {dest.rsplit("/", 1)[1]: kw["text"]}
    if dest.startswith(BALANCER_DIR + "/"):
        return {f"backends/{dest.rsplit('/', 1)[1]}": kw["text"]}
    return {}


def _body(call, module_name: str, state: dict) -> dict[str, str]:
    """The files a server's operation writes (its drop-in, a router's preset), by path: its body run
    with ``state`` as what it reads on the host."""
    module, texts = importlib.import_module(module_name), {}

    def running(unit, dropin, text, *args, **kwargs):
        texts[dropin] = text
        yield from ()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "read_once", lambda fact, **kwargs: state)
        mp.setattr(module, "unit_running", running)
        mp.setattr(module, "written", lambda path, text, **kwargs: texts.setdefault(path, text))
        list(call.op._inner(**{k: v for k, v in call.kwargs.items() if k != "name" and not k.startswith("_")}))
    return texts


# -- the snapshot --------------------------------------------------------------------------------

def rendered(case: str) -> dict[str, str]:
    """Every file of ``case`` (a key of LLAMA or VLLM), by its path under the case's folder."""
    if case in LLAMA:
        return llama_files(*LLAMA[case]())
    return vllm_files(*VLLM[case]())


CASES = sorted([*LLAMA, *VLLM])


def stored(case: str) -> dict[str, str]:
    folder = SNAPSHOTS / case
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_file_is_as_the_snapshot_holds_it(case):
    now, before = rendered(case), stored(case)
    assert sorted(now) == sorted(before), f"{case}: the files rendered differ from the snapshot's"
    for path, text in now.items():
        assert text == before[path], f"{case}/{path} differs from tests/fixtures/serving/{case}/{path}"


def test_the_snapshot_holds_no_case_no_longer_rendered():
    assert sorted(p.name for p in SNAPSHOTS.iterdir() if p.is_dir()) == CASES


def update() -> None:
    """Write every case's files to tests/fixtures/serving/ (the folder replaced)."""
    import shutil
    if SNAPSHOTS.exists():
        shutil.rmtree(SNAPSHOTS)
    for case in CASES:
        for path, text in rendered(case).items():
            (SNAPSHOTS / case / path).parent.mkdir(parents=True, exist_ok=True)
            (SNAPSHOTS / case / path).write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.unit.test_serving_snapshot --update")
    update()
