"""Every file the serving roles write for a host, rendered from tests/unit/hosts.py's fixtures and
held byte-for-byte to tests/fixtures/serving/ (issue 64: the snapshot taken before the serving
path is refactored, so that a refactor which changes what a host runs fails here, naming the file).

Each case is a host (a fact fixture's plan) with its data; :func:`rendered` walks it as
roles/llama_server and roles/vllm ``apply`` and their ``instance`` operations do, with what those
read on the host fixed here (the model's first GGUF file, the llama.cpp build, the markers'
revisions): the template unit, each server's drop-in, its ExecStart argv (``argv.json``), a
router's preset, a replicated instance's backends file, vLLM's environment files, and a Ray
node's unit and allow-list. A case's files live in ``tests/fixtures/serving/<case>/``.

A change meant to change what hosts run regenerates them (then read the diff):
``.venv/bin/python -m tests.unit.test_serving_snapshot --update``."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from rigup.gpu.plan import hardware_plan
from rigup.models import models
from rigup.names import guard_file, marker_path
from rigup.rpc import endpoint
from rigup.serving import balancer_hooks
from rigup.templates import render
from roles.llama_server.command import (NO_CACHE, argv, backend_name, dropin_text, fronted, preset_text,
                                       queue_limits, queued, servers)
from roles.llama_server.replicas import chosen
from roles.llama_server.schema import instances as llama_instances
from roles.vllm import cluster
from roles.vllm import command as cmd
from roles.vllm.checks import replica_groups
from roles.vllm.schema import instances as vllm_instances
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
    """What roles/llama_server installs for ``d`` on a host of ``plan`` (its ``apply`` and
    ``instance``; ``workers``: the data of the RPC workers its instances name)."""
    wanted, problems = llama_instances(d)
    assert problems == [], problems
    entries = models(d)[0]
    binary = f"{d['llama_cpp_dir']}/current/bin/llama-server"
    laid = {name: chosen(inst, entries[inst["model"]], plan, d, entries)[:2] for name, inst in wanted.items()}
    wanted = {name: {**inst, **laid[name][0]} for name, inst in wanted.items()}
    plans = {name: servers(name, wanted[name], laid[name][1]) for name in wanted}
    unit_text = render("llama_server-unit.service.j2", user=d["rigup_user"], guard_file=guard_file(d),
                       start_timeout=max(600, d["llama_server_health_timeout"]),
                       fabric=bool((plan.get("fabric") or {}).get("nvswitches")))
    unit_sha = hashlib.sha256(unit_text.encode()).hexdigest()[:12]
    out = {"rigup-llama@.service": unit_text}
    for name, srv in sorted(plans.items()):
        inst = wanted[name]
        if fronted(inst, srv):
            out[f"backends/{backend_name(name)}.json"] = json.dumps(
                {"bind": inst["host"], "port": inst["port"],
                 "servers": [[s["unit"], s["inst"]["host"], s["inst"]["port"]] for s in srv if not s.get("pinned")],
                 **(queue_limits(inst, d["llama_server_health_timeout"]) if queued(inst) else {})}, indent=2) + "\n"
        for server in srv:
            sinst = server["inst"]
            hooks = balancer_hooks(backend_name(name), server["unit"], sinst["port"], d) \
                if fronted(inst, srv) and not server.get("pinned") else None
            rpc = [endpoint(w, workers[w]) for w in inst["rpc_workers"]]
            env = {**server["env"], "LLAMA_CACHE": NO_CACHE.format(name)} if sinst["also"] else server["env"]
            keys = [sinst["model"], *(sinst["also"] or [])]
            paths = {k: f"{entries[k]['dest']}/{GGUF}" for k in keys}
            revisions = {k: entries[k]["revision"] for k in keys}
            preset = preset_text(name, sinst, paths, revisions) if sinst["also"] else None
            digest = hashlib.sha256(preset.encode()).hexdigest() if preset else None
            text = dropin_text(name, sinst, binary, paths[sinst["model"]], BUILD, unit_sha,
                               revisions[sinst["model"]], env, hooks, rpc, d["llama_server_rpc_wait"], preset=digest,
                               allow=d["llama_server_allow"], origins=d["llama_server_cors_origins"])
            out[f"rigup-llama@{server['unit']}/rigup.conf"] = text
            if preset:
                out[f"rigup-llama@{server['unit']}/{name}.models.ini"] = preset
            out[f"rigup-llama@{server['unit']}/argv.json"] = json.dumps(
                {"marker": marker_path(entries[sinst["model"]]["dest"]), "env": env,
                 "argv": argv(name, sinst, binary, paths[sinst["model"]], rpc, d["llama_server_allow"])},
                indent=2) + "\n"
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
    """What roles/vllm installs for ``d`` on a host of ``plan`` (its ``apply`` and ``instance``;
    ``me``: the host's inventory name in a Ray cluster, None outside one)."""
    wanted, problems = vllm_instances(d)
    assert problems == [], problems
    entries = models(d)[0]
    ray_role = d["vllm_ray_role"]
    if ray_role == "head":
        wanted = {n: {**i, "extra_args": ["--distributed-executor-backend", "ray", *i["extra_args"]]}
                  for n, i in wanted.items()}
    plans = {name: cmd.servers(name, inst, replica_groups(plan, inst), plan) for name, inst in wanted.items()}
    markers = {name: marker_path(entries[inst["model"]]["dest"]) for name, inst in wanted.items()}
    drafts = {name: marker_path(entries[inst["draft_model"]]["dest"]) if inst["draft_model"] else None
              for name, inst in wanted.items()}
    the_pin = cmd.pin(d)
    vllm_dir = d["vllm_dir"].rstrip("/")
    pin_dir, venv = f"{vllm_dir}/{the_pin['id']}", f"{vllm_dir}/{the_pin['id']}/venv"
    stamp = cmd.stamp(the_pin, cmd.patches(d), d)
    wait_script, ray_script = f"{vllm_dir}/bin/rigup-vllm-wait-vram", f"{vllm_dir}/bin/rigup-ray-wait"
    unit_text = cmd.render("vllm-unit.service.j2", user=d["rigup_user"], guard_file=guard_file(d),
                           start_timeout=max(900, d["vllm_health_timeout"]), stop_timeout=120, restart_sec=30,
                           fabric=bool((plan.get("fabric") or {}).get("nvswitches")))
    out = {"rigup-vllm@.service": unit_text, "stamp.json": stamp + "\n"}
    fleet = ray_fleet(me, d) if ray_role else {}
    if ray_role:
        env = cluster.node_env(cmd.env_vars("ray", {}, d, plan), cluster.node_ip(me, d))
        out["rigup-ray.service"] = cluster.unit_text(me, fleet, venv, env, d["rigup_user"], guard_file(d), ray_script)
        out["ray.nft"] = cluster.firewall_text(me, fleet)
    for name, srv in sorted(plans.items()):
        inst = wanted[name]
        if len(srv) > 1:
            out[f"backends/{cmd.backend_name(name)}.json"] = json.dumps(
                {"bind": inst["host"], "port": inst["port"],
                 "servers": [[s["unit"], s["inst"]["host"], s["inst"]["port"]] for s in srv]}, indent=2) + "\n"
        ray_env = cluster.instance_env(me, fleet) if ray_role == "head" else {}
        for server in srv:
            env = cmd.env_text(name, {**cmd.env_vars(server["unit"], {**inst, "_name": name}, d, plan),
                                      **ray_env, **server["env"]})
            wait = [wait_script, str(d["vllm_vram_free_mib"]), str(d["vllm_vram_wait_seconds"])]
            wait += ["-i", server["gpus"]] if server["gpus"] else []
            hooks = balancer_hooks(cmd.backend_name(name), server["unit"], server["inst"]["port"], d) \
                if len(srv) > 1 else None
            ray_wait = (cluster.wait_argv(venv, ray_script, cluster.gcs(me, fleet), int(d["vllm_ray_wait_seconds"]),
                                          cluster.expected(me, fleet)) if ray_role == "head" else None)
            model_path = markers[name].rsplit("/", 1)[0]
            draft = {"path": drafts[name].rsplit("/", 1)[0], "marker": drafts[name],
                     "sha": hashlib.sha256(b"the drafter's marker").hexdigest()} if drafts[name] else None
            text = cmd.dropin_text(name, server["inst"], venv, model_path, markers[name], cmd.sha(unit_text)[:12],
                                   cmd.sha(stamp)[:12], cmd.sha(env)[:12], entries[inst["model"]]["revision"], wait,
                                   unit=server["unit"], balancer=hooks, ray_wait=ray_wait, draft=draft)
            out[f"rigup-vllm@{server['unit']}/rigup.conf"] = text
            out[f"rigup-vllm@{server['unit']}/{server['unit']}.env"] = env
            out[f"rigup-vllm@{server['unit']}/argv.json"] = json.dumps(
                {"pin_dir": pin_dir, "argv": cmd.argv(name, server["inst"], venv, model_path, draft and draft["path"])},
                indent=2) + "\n"
    return out


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
