"""The Ansible side of tests/bench_ansible.py: a playbook that does the work rigup's deploy.py
does on a converged lab host, written from rigup's own data and the host's own files.

One task per rigup operation (or per fact of rigup's own that no Ansible module reads), named
after it, in deploy.py's order:

- rigup's own facts (preflight's HardwareFacts and PathBytes, model_fetch's probe, gpu_power's
  GpuPowerState) run as ``shell`` tasks with rigup's own command strings (``changed_when:
  false``), and the decisions rigup takes from them are ``when:`` conditions;
- every file rigup manages is a ``copy`` task with the content, owner, group and mode the file
  has on the converged host (fetched from it: :func:`fetch_files`);
- packages, the user, directories, the build stamp (``creates:``), the ``current`` link and the
  units use Ansible's modules (apt, user, file, command, systemd_service);
- what rigup does only after a change (journald restart, daemon-reload, the health gate) is a
  handler, so a converged host runs none of it, as with rigup.

It covers the lab's recipe (tests/lab: an a100 host, a CPU build, one model, one instance): the
roles that do nothing there (cuda_toolkit, cmpunlocker, vllm) have no tasks, and
:func:`check_recipe` refuses another recipe rather than compare different work.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import yaml

from rigup.gpu.facts import GPU_COMMAND, HardwareFacts
from roles.gpu_guard import CONFIG as GUARD_CONFIG
from roles.gpu_guard import SERVICE as GUARD_SERVICE
from roles.gpu_guard import TIMER as GUARD_TIMER
from roles.gpu_power import UDEV_RULE
from roles.gpu_power.facts import CONF as POWER_CONF
from roles.gpu_power.facts import UNIT as POWER_UNIT
from roles.gpu_power.facts import GpuPowerState
from roles.llama_cpp import BUILD_PACKAGES
from rigup.models import model_dests as model_paths
from rigup.models import models
from rigup.names import MARKER
from roles.llama_server import UNIT as LLAMA_UNIT
from roles.llama_server.facts import DROPIN
from roles.llama_server.schema import instances as llama_instances
from roles.model_fetch import specs as model_specs
from roles.model_fetch.facts import ModelFetchState, unit_name
from roles.preflight.facts import PathBytes
from roles.vllm.schema import instances as vllm_instances


def serving_config(data: dict) -> tuple[dict, list]:
    """The host's models and serving instances, normalised, and their problems."""
    parts = {"models": models(data), "llama_server_instances": llama_instances(data),
             "vllm_instances": vllm_instances(data)}
    return {k: v[0] for k, v in parts.items()}, [p for v in parts.values() for p in v[1]]


class Unsafe(str):
    """A string Ansible must not template (rigup's commands hold ``{`` and ``%``): ``!unsafe``."""


yaml.SafeDumper.add_representer(Unsafe, lambda dumper, s: dumper.represent_scalar("!unsafe", str(s)))


def managed_files(data: dict) -> dict[str, str]:
    """Every file deploy.py installs on a lab host -> the rigup operation that installs it."""
    config, _ = serving_config(data)
    prefix = data["rigup_prefix"]
    files = {
        "/etc/apt/apt.conf.d/80rigup": "base: apt: wait for the dpkg lock",
        "/etc/systemd/journald.conf.d/rigup.conf": "base: journald: keep the journal across reboots",
        f"{prefix}/bin/rigup-fetch": "model_fetch: Install rigup-fetch",
        f"{prefix}/bin/rigup-gpu-power": "gpu_power: the boot script",
        f"/etc/systemd/system/{POWER_UNIT}": f"gpu_power: {POWER_UNIT}",
        UDEV_RULE: "gpu_power: apply again when the nvidia module reloads",
        POWER_CONF: "gpu_power: GPU power limits by UUID (the boot configuration)",
        f"{prefix}/bin/rigup-gpu-guard": "gpu_guard: the guard",
        GUARD_CONFIG: f"gpu_guard: {GUARD_CONFIG}",
        f"/etc/systemd/system/{GUARD_SERVICE}": f"gpu_guard: {GUARD_SERVICE}",
        f"/etc/systemd/system/{GUARD_TIMER}": f"gpu_guard: {GUARD_TIMER}",
        LLAMA_UNIT: "llama_server: llama-server template unit",
    }
    for name in sorted(config["llama_server_instances"]):
        files[DROPIN.format(name)] = f"llama_server: llama-server {name} (its drop-in)"
    return files


def check_recipe(data: dict) -> None:
    """Refuse a recipe whose work this playbook does not mirror."""
    config, problems = serving_config(data)
    assert not problems, problems
    assert data["llama_cpp_backend"] == "cpu" and not data["cmpunlocker_enabled"] and not data["llama_cpp_rollback"]
    assert not config["vllm_instances"] and not data["model_fetch_hf_token_src"] and data["gpu_guard_enabled"]
    assert data["gpu_power_watts"] is None and not data["gpu_power_overrides"] and not data["gpu_power_clocks"]
    assert not any(m.get("fetch_from") for m in config["models"].values())
    assert not any(i["api_key"] for i in config["llama_server_instances"].values())


def fetch_files(ssh, name: str, paths: list[str], dest: Path) -> dict[str, dict]:
    """Copy ``paths`` from host ``name`` (one tar over SSH) under ``dest``; their owner, group
    and mode: ``{path: {"owner", "group", "mode"}}``."""
    out = ssh(name, "tar -C / -cf - " + " ".join(p.lstrip("/") for p in paths) + " | base64 -w0")
    assert out.returncode == 0, f"{name}: {out.stderr}"
    meta = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out.stdout))) as tar:
        for member in tar.getmembers():
            tar.extract(member, dest, filter="data")
            meta["/" + member.name] = {"owner": member.uname, "group": member.gname, "mode": f"0{member.mode:o}"}
    assert sorted(meta) == sorted(paths), f"{name}: missing files: {set(paths) - set(meta)}"
    return meta


def _copy(path: str, meta: dict, what: str, notify: list[str] | None = None) -> dict:
    task = {"name": what, "ansible.builtin.copy": {"src": f"files/{{{{ inventory_hostname }}}}{path}", "dest": path,
                                                   **meta}}
    return {**task, "notify": notify} if notify else task


def _fact(name: str, command: str, register: str) -> dict:
    return {"name": name, "ansible.builtin.shell": {"cmd": Unsafe(command)}, "register": register,
            "changed_when": False}


def tasks(data: dict, build_id: str, meta: dict[str, dict]) -> list[dict]:
    """The play's tasks for a host with ``data`` (pyinfra's merged host data) whose llama.cpp
    build is ``build_id``; ``meta``: owner, group and mode of each managed file."""
    config, _ = serving_config(data)
    files = managed_files(data)
    prefix, dests = data["rigup_prefix"], model_paths(data)
    copy = {path: _copy(path, meta[path], what) for path, what in files.items()}
    build_dir = data["llama_cpp_dir"]
    daemon_reload = ["systemd daemon-reload"]
    out = [
        _fact("preflight: hardware facts (HardwareFacts)", HardwareFacts().command(paths=["/", *dests]), "hardware"),
        _fact("preflight: model bytes (PathBytes)", PathBytes().command(paths=dests), "model_bytes"),
        copy["/etc/apt/apt.conf.d/80rigup"],
        {"name": "base: Install base packages",
         "ansible.builtin.apt": {"name": data["base_packages"] + data["base_extra_packages"], "state": "present"}},
        {"name": f"base: System user {data['rigup_user']}",
         "ansible.builtin.user": {"name": data["rigup_user"], "system": True, "home": data["rigup_state_dir"],
                                  "shell": "/usr/sbin/nologin", "create_home": False}},
        {"name": f"base: Directory {prefix}", "ansible.builtin.file": {
            "path": prefix, "state": "directory", "owner": "root", "group": "root", "mode": "0755"}},
        {"name": f"base: Directory {data['rigup_state_dir']}", "ansible.builtin.file": {
            "path": data["rigup_state_dir"], "state": "directory", "owner": data["rigup_user"],
            "group": data["rigup_user"], "mode": "0750"}},
        {**copy["/etc/systemd/journald.conf.d/rigup.conf"], "notify": ["restart journald"]},
        {"name": "llama_cpp: Install build tools", "ansible.builtin.apt": {"name": BUILD_PACKAGES, "state": "present"}},
        {"name": f"llama_cpp: Directory {data['llama_cpp_ccache_dir']}",
         "ansible.builtin.file": {"path": data["llama_cpp_ccache_dir"], "state": "directory"}},
        {"name": f"llama_cpp: Build llama.cpp {data['llama_cpp_ref']} (the build stamp)", "ansible.builtin.command": {
            "cmd": f"systemd-run --unit=rigup-llama-build --collect --wait --quiet {build_dir}/build-{build_id}.sh",
            "creates": f"{build_dir}/builds/{build_id}/rigup-build.json"}},
        {"name": f"llama_cpp: llama.cpp current -> {build_id}", "ansible.builtin.file": {
            "path": f"{build_dir}/current", "src": f"builds/{build_id}", "state": "link"}},
        _fact("model_fetch: the models' state (ModelFetchState)",
              ModelFetchState().command(specs=model_specs(data, config["models"])), "models"),
        {"name": f"model_fetch: Directory {prefix}/bin", "ansible.builtin.file": {
            "path": f"{prefix}/bin", "state": "directory", "owner": "root", "group": "root", "mode": "0755"}},
        copy[f"{prefix}/bin/rigup-fetch"],
    ]
    for name, model in sorted(config["models"].items()):
        state = ("models.stdout_lines | select('match', '##rigup-model ') | map('regex_replace', '^##rigup-model ', '')"
                 f" | map('from_json') | selectattr('name', 'eq', '{name}') | selectattr('complete')")
        job = (f"systemd-run --unit={unit_name(name)} --collect --quiet --property=User={data['rigup_user']} "
               f"/usr/bin/python3 {prefix}/bin/rigup-fetch fetch {model['dest']}/.rigup-fetch/job.json")
        out.append({"name": f"model_fetch: Fetch model {name} (a job when it is not complete)",
                    "ansible.builtin.command": {"cmd": job}, "when": f"{state} | list | length == 0"})
    out += [
        copy[f"{prefix}/bin/rigup-gpu-power"],
        {**copy[f"/etc/systemd/system/{POWER_UNIT}"], "notify": daemon_reload},
        copy[UDEV_RULE],
        _fact("gpu_power: the cards and their policy (NvidiaGpus, GpuPowerState)",
              f"{GPU_COMMAND}; {GpuPowerState().command()}", "power"),
        copy[POWER_CONF],
        {"name": "gpu_power: GPU power limits by UUID (set what differs)",  # the lab's policy: persistence on, no caps
         "ansible.builtin.command": {"cmd": f"systemctl restart {POWER_UNIT}"},
         "when": "power.stdout is search(', Disabled,')"},
        {"name": f"gpu_power: enable {POWER_UNIT}",
         "ansible.builtin.systemd_service": {"name": POWER_UNIT, "state": "started", "enabled": True}},
        copy[f"{prefix}/bin/rigup-gpu-guard"],
        copy[GUARD_CONFIG],
        {**copy[f"/etc/systemd/system/{GUARD_SERVICE}"], "notify": daemon_reload},
        {**copy[f"/etc/systemd/system/{GUARD_TIMER}"], "notify": daemon_reload + [f"restart {GUARD_TIMER}"]},
        {"name": f"gpu_guard: run {GUARD_TIMER}",
         "ansible.builtin.systemd_service": {"name": GUARD_TIMER, "state": "started", "enabled": True}},
        {**copy[LLAMA_UNIT], "notify": daemon_reload},
    ]
    for name, inst in sorted(config["llama_server_instances"].items()):
        marker, unit = f"{config['models'][inst['model']]['dest']}/{MARKER}", f"rigup-llama@{name}.service"
        out += [
            {"name": f"llama_server: {name}: its model's completion marker", "ansible.builtin.stat": {"path": marker},
             "register": f"marker_{name}"},
            {**copy[DROPIN.format(name)], "notify": daemon_reload + [f"restart {unit}"],
             "when": f"marker_{name}.stat.exists"},
            {"name": f"llama_server: {unit} enabled and running",
             "ansible.builtin.systemd_service": {"name": unit, "state": "started", "enabled": True},
             "when": f"marker_{name}.stat.exists"},
        ]
    return out


def handlers(data: dict) -> list[dict]:
    """What rigup does only after a change: never run on a converged host."""
    config, _ = serving_config(data)
    out = [{"name": "restart journald", "ansible.builtin.systemd_service": {"name": "systemd-journald",
                                                                            "state": "restarted"}},
           {"name": "systemd daemon-reload", "ansible.builtin.systemd_service": {"daemon_reload": True}},
           {"name": f"restart {GUARD_TIMER}", "ansible.builtin.systemd_service": {"name": GUARD_TIMER,
                                                                                 "state": "restarted"}}]
    for name, inst in sorted(config["llama_server_instances"].items()):
        unit = f"rigup-llama@{name}.service"
        out += [{"name": f"restart {unit}", "ansible.builtin.systemd_service": {"name": unit, "state": "restarted"},
                 "notify": f"gate {name}"},
                {"name": f"gate {name}", "ansible.builtin.uri": {
                    "url": f"http://127.0.0.1:{inst['port']}/v1/chat/completions", "method": "POST",
                    "body_format": "json", "timeout": data["llama_server_health_timeout"],
                    "body": {"model": name, "max_tokens": 16,
                             "messages": [{"role": "user", "content": data["llama_server_health_prompt"]}]}}}]
    return out


def write(work: Path, lab_state: dict, data: dict, build_id: str, meta: dict[str, dict]) -> tuple[Path, Path]:
    """Write ``inventory.yml`` (the lab's hosts, its key and known_hosts, strict host key
    checking) and ``site.yml`` under ``work``; return their paths."""
    check_recipe(data)
    inventory = {"lab": {
        "hosts": {h["name"]: {"ansible_host": h["address"]} for h in lab_state["hosts"]},
        "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": lab_state["ssh_key"],
                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab_state['known_hosts']} "
                                            "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
                 "ansible_python_interpreter": "/usr/bin/python3"}}}
    play = [{"name": "rigup's deploy.py, as Ansible tasks", "hosts": "lab",
             "tasks": tasks(data, build_id, meta), "handlers": handlers(data)}]
    (work / "inventory.yml").write_text(json.dumps(inventory, indent=1))
    (work / "site.yml").write_text(yaml.safe_dump(play, sort_keys=False, width=120))
    return work / "inventory.yml", work / "site.yml"
