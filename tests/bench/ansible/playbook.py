"""The Ansible side of tests/bench_ansible.py: a playbook that does the work rigup's deploy.py
does on a converged lab host, written from rigup's own data and the host's own files.

One task per rigup operation (or per fact of rigup's own that no Ansible module reads), named
after it, in deploy.py's order (roles/__init__.py STEPS):

- rigup's own facts (preflight's HardwareFacts and PathBytes, model_fetch's probe, gpu_power's
  GpuPowerState, rpc_worker's RpcWorkerState, balancer's BalancerState) run as ``shell`` tasks
  with rigup's own command strings (``changed_when: false``), and the decisions rigup takes from
  them are ``when:`` conditions;
- every file rigup manages is a ``copy`` task with the content the file has on the converged
  host (fetched from it: :func:`fetch_files`) and the owner, group and mode of
  :func:`managed_files`, which the converged host must have (:func:`check_files`); directories
  (:func:`directories`) are ``file`` tasks; tests/unit/test_bench_ansible.py holds both tables
  to what the roles declare;
- packages, the user, the build stamp (``creates:``), the ``current`` link, the units and the
  servers rigup would retire use Ansible's modules (apt, user, command, file, systemd_service,
  find, stat);
- what rigup does only after a change (journald restart, daemon-reloads, timer and service
  restarts, the health gate) is a handler, so a converged host runs none of it, as with rigup.

It covers the lab's recipe (tests/lab: an a100 host, a CPU build, one model, one instance
without a watchdog floor, the node exporter and the metrics relay): the roles that do nothing
there (cuda_toolkit, cmpunlocker, vllm) have no tasks, those that only check that nothing is
theirs to do (rpc_worker, balancer, watchdog) check it, and :func:`check_recipe` refuses
another recipe rather than compare different work.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import yaml

from rigup.gpu.facts import GPU_COMMAND, HardwareFacts
from rigup.names import BALANCER_DIR, MARKER, TEXTFILE_DIR, balancer_drain
from rigup.rpc import RPC_UNIT
from roles.gpu_guard import CONFIG as GUARD_CONFIG
from roles.gpu_guard import SERVICE as GUARD_SERVICE
from roles.gpu_guard import TIMER as GUARD_TIMER
from roles.gpu_power import UDEV_RULE
from roles.gpu_power.facts import CONF as POWER_CONF
from roles.gpu_power.facts import UNIT as POWER_UNIT
from roles.gpu_power.facts import GpuPowerState
from roles.balancer.facts import BalancerState
from roles.llama_cpp import BUILD_PACKAGES, RUNTIME_PACKAGES
from roles.llama_cpp.build import build_stamp
from rigup.models import model_dests as model_paths
from rigup.models import models
from roles.llama_server import UNIT as LLAMA_UNIT
from roles.llama_server.facts import DROPIN
from rigup.instances.llama_server import instances as llama_instances
from roles.metrics import NODE_DEFAULT, RELAY, RELAY_CONFIG, RELAY_UNIT
from roles.model_fetch import METRICS_CONFIG, METRICS_PATHS, METRICS_SERVICE, METRICS_TIMER
from roles.model_fetch import specs as model_specs
from roles.model_fetch.facts import ModelFetchState, unit_name
from roles.preflight.facts import PathBytes
from roles.rpc_worker import RpcWorkerState
from rigup.instances.vllm import instances as vllm_instances
from roles.watchdog import TIMER as WATCHDOG_TIMER


def serving_config(data: dict) -> tuple[dict, list]:
    """The host's models and serving instances, normalised, and their problems."""
    parts = {"models": models(data), "llama_server_instances": llama_instances(data),
             "vllm_instances": vllm_instances(data)}
    return {k: v[0] for k, v in parts.items()}, [p for v in parts.values() for p in v[1]]


class Unsafe(str):
    """A string Ansible must not template (rigup's commands hold ``{`` and ``%``): ``!unsafe``."""


yaml.SafeDumper.add_representer(Unsafe, lambda dumper, s: dumper.represent_scalar("!unsafe", str(s)))


def directories(data: dict) -> dict[str, dict]:
    """Every directory the play makes on a lab host -> the rigup operation that makes it, with the
    owner, group and mode the playbook sets (None: left as it is)."""
    prefix, user = data["rigup_prefix"], data["rigup_user"]
    root = {"owner": "root", "group": "root", "mode": "0755"}
    keep = {"owner": None, "group": None, "mode": None}
    return {
        prefix: {"what": f"base: Directory {prefix}", **root},
        # root-written state the service user may read: root:rigup 0750
        data["rigup_state_dir"]: {"what": f"base: Directory {data['rigup_state_dir']}", "owner": "root",
                                  "group": user, "mode": "0750"},
        f"{prefix}/bin": {"what": f"model_fetch: Directory {prefix}/bin", **root},
        "/etc/rigup": {"what": "model_fetch: Directory /etc/rigup", **root},
        data["llama_cpp_ccache_dir"]: {"what": f"llama_cpp: Directory {data['llama_cpp_ccache_dir']}", **keep},
        TEXTFILE_DIR: {"what": f"metrics: {TEXTFILE_DIR}", **keep},
    }


def managed_files(data: dict) -> dict[str, dict]:
    """Every file deploy.py installs on a lab host -> the rigup operation that installs it, with
    the owner, group and mode the playbook sets (:func:`check_files` holds a host to them)."""
    config, _ = serving_config(data)
    prefix = data["rigup_prefix"]
    files = {
        "/etc/apt/apt.conf.d/80rigup": "base: apt: wait for the dpkg lock",
        "/etc/systemd/journald.conf.d/rigup.conf": "base: journald: keep the journal across reboots",
        f"{prefix}/bin/rigup-fetch": "model_fetch: Install rigup-fetch",
        METRICS_CONFIG: f"model_fetch: {METRICS_CONFIG}",
        METRICS_PATHS[1]: f"model_fetch: {METRICS_SERVICE}",
        METRICS_PATHS[2]: f"model_fetch: {METRICS_TIMER}",
        f"{prefix}/bin/rigup-gpu-power": "gpu_power: the boot script",
        f"/etc/systemd/system/{POWER_UNIT}": f"gpu_power: {POWER_UNIT}",
        UDEV_RULE: "gpu_power: apply again when the nvidia module reloads",
        POWER_CONF: "gpu_power: GPU power limits by UUID (the boot configuration)",
        f"{prefix}/bin/rigup-gpu-guard": "gpu_guard: the guard",
        f"{prefix}/bin/rigup_xid.py": "gpu_guard: the guard: rigup_xid.py beside it (shipped/xid.py)",
        GUARD_CONFIG: f"gpu_guard: {GUARD_CONFIG}",
        f"/etc/systemd/system/{GUARD_SERVICE}": f"gpu_guard: {GUARD_SERVICE}",
        f"/etc/systemd/system/{GUARD_TIMER}": f"gpu_guard: {GUARD_TIMER}",
        LLAMA_UNIT: "llama_server: llama-server template unit",
        NODE_DEFAULT: f"metrics: {NODE_DEFAULT}",
        f"{prefix}/bin/rigup-metrics-relay": "metrics: the relay",
        f"{prefix}/bin/rigup_throughput.py": "metrics: the relay: rigup_throughput.py beside it (shipped/throughput.py)",
        RELAY_CONFIG: f"metrics: {RELAY_CONFIG}",
        RELAY_UNIT: f"metrics: {RELAY}",
    }
    for name in sorted(config["llama_server_instances"]):
        files[DROPIN.format(name)] = f"llama_server: llama-server {name} (its drop-in)"
    scripts = {f"{prefix}/bin/rigup-{n}" for n in ("fetch", "gpu-power", "gpu-guard", "metrics-relay")}
    return {path: {"what": what, "owner": "root", "group": "root", "mode": "0755" if path in scripts else "0644"}
            for path, what in files.items()}


def check_recipe(data: dict) -> None:
    """Refuse a recipe whose work this playbook does not mirror."""
    config, problems = serving_config(data)
    assert not problems, problems
    assert data["llama_cpp_backend"] == "cpu" and not data["cmpunlocker_enabled"] and not data["llama_cpp_rollback"]
    assert not config["vllm_instances"] and not data["model_fetch_hf_token_src"] and data["gpu_guard_enabled"]
    assert data["gpu_power_watts"] is None and not data["gpu_power_overrides"] and not data["gpu_power_clocks"]
    assert not any(m.get("fetch_from") for m in config["models"].values())
    assert not any(i["api_key"] or i["replicas"] > 1 or i["rpc_workers"] or i["min_tokens_per_s"] != 0
                   for i in config["llama_server_instances"].values())
    assert data["metrics_enabled"] and not data["prometheus_enabled"] and not data["balancer_gateway"]
    assert not data["rigup_maintenance"] and not data["gpu_guard_clear"]


def fetch_files(ssh, name: str, paths: list[str], dest: Path) -> dict[str, dict]:
    """Copy ``paths`` from host ``name`` (one tar over SSH, a directory without what it holds)
    under ``dest``; their owner, group and mode: ``{path: {"owner", "group", "mode"}}``."""
    out = ssh(name, "tar --no-recursion -C / -cf - " + " ".join(p.lstrip("/") for p in paths) + " | base64 -w0")
    assert out.returncode == 0, f"{name}: {out.stderr}"
    meta = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out.stdout))) as tar:
        for member in tar.getmembers():
            tar.extract(member, dest, filter="data")
            meta["/" + member.name] = {"owner": member.uname, "group": member.gname, "mode": f"0{member.mode:o}"}
    assert sorted(meta) == sorted(paths), f"{name}: missing files: {set(paths) - set(meta)}"
    return meta


def check_files(name: str, data: dict, meta: dict[str, dict]) -> None:
    """The converged host ``name``'s files and directories (``meta``, from :func:`fetch_files`)
    have the owner, group and mode the playbook sets: else every Ansible run would change them."""
    wanted = {p: {k: v for k, v in f.items() if k != "what" and v is not None}
              for p, f in {**managed_files(data), **directories(data)}.items()}
    wrong = [f"{p}: the playbook sets {wanted[p]}, {name} has {meta.get(p)}" for p in wanted
             if {k: (meta.get(p) or {}).get(k) for k in wanted[p]} != wanted[p]]
    assert not wrong, "the playbook does not match the converged host:\n" + "\n".join(wrong)


def _copy(path: str, spec: dict, notify: list[str] | None = None) -> dict:
    task = {"name": spec["what"], "ansible.builtin.copy": {
        "src": f"files/{{{{ inventory_hostname }}}}{path}", "dest": path,
        **{k: spec[k] for k in ("owner", "group", "mode")}}}
    return {**task, "notify": notify} if notify else task


def _directory(path: str, spec: dict) -> dict:
    return {"name": spec["what"], "ansible.builtin.file": {
        "path": path, "state": "directory", **{k: v for k, v in spec.items() if k != "what" and v is not None}}}


def _fact(name: str, command: str, register: str) -> dict:
    return {"name": name, "ansible.builtin.shell": {"cmd": Unsafe(command)}, "register": register,
            "changed_when": False}


def _running(name: str, unit: str) -> dict:
    return {"name": name, "ansible.builtin.systemd_service": {"name": unit, "state": "started", "enabled": True}}


def tasks(data: dict, build_id: str) -> list[dict]:
    """The play's tasks for a host with ``data`` (pyinfra's merged host data) whose llama.cpp
    build is ``build_id``."""
    config, _ = serving_config(data)
    prefix, dests = data["rigup_prefix"], model_paths(data)
    copy = {path: _copy(path, spec) for path, spec in managed_files(data).items()}
    mkdir = {path: _directory(path, spec) for path, spec in directories(data).items()}
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
        mkdir[prefix],
        mkdir[data["rigup_state_dir"]],
        {**copy["/etc/systemd/journald.conf.d/rigup.conf"], "notify": ["restart journald"]},
        _fact("model_fetch: the models' state (ModelFetchState)",
              ModelFetchState().command(specs=model_specs(data, config["models"])), "models"),
        mkdir[f"{prefix}/bin"],
        copy[f"{prefix}/bin/rigup-fetch"],
        mkdir["/etc/rigup"],
    ]
    for name, model in sorted(config["models"].items()):
        state = ("models.stdout_lines | select('match', '##rigup-model ') | map('regex_replace', '^##rigup-model ', '')"
                 f" | map('from_json') | selectattr('name', 'eq', '{name}') | selectattr('complete')")
        job = (f"systemd-run --unit={unit_name(name)} --collect --quiet --property=User={data['rigup_user']} "
               f"/usr/bin/python3 {prefix}/bin/rigup-fetch fetch {model['dest']}/.rigup-fetch/job.json")
        out.append({"name": f"model_fetch: Fetch model {name} (a job when it is not complete)",
                    "ansible.builtin.command": {"cmd": job}, "when": f"{state} | list | length == 0"})
    out += [
        copy[METRICS_CONFIG],
        {**copy[METRICS_PATHS[1]], "notify": daemon_reload},
        {**copy[METRICS_PATHS[2]], "notify": daemon_reload + [f"restart {METRICS_TIMER}"]},
        _running(f"model_fetch: run {METRICS_TIMER}", METRICS_TIMER),
        # as roles/llama_cpp: build tools only where the build is neither there nor received (a
        # host that received its build has none: issue 51); the run-time libraries everywhere
        {"name": "llama_cpp: the build's stamp (LlamaCppState)", "ansible.builtin.stat": {
            "path": build_stamp(build_dir, build_id)}, "register": "stamp"},
        {"name": "llama_cpp: Install llama.cpp's run-time libraries", "ansible.builtin.apt": {
            "name": RUNTIME_PACKAGES, "state": "present"}, "when": "stamp.stat.exists"},
        {"name": "llama_cpp: Install build tools", "ansible.builtin.apt": {"name": BUILD_PACKAGES + RUNTIME_PACKAGES, "state": "present"},
         "when": "not stamp.stat.exists"},
        {**mkdir[data["llama_cpp_ccache_dir"]], "when": "not stamp.stat.exists"},
        {"name": f"llama_cpp: Build llama.cpp {data['llama_cpp_ref']} (the build stamp)", "ansible.builtin.command": {
            "cmd": f"systemd-run --unit=rigup-llama-build --collect --wait --quiet {build_dir}/build-{build_id}.sh",
            "creates": build_stamp(build_dir, build_id)}, "when": "not stamp.stat.exists"},
        {"name": f"llama_cpp: llama.cpp current -> {build_id}", "ansible.builtin.file": {
            "path": f"{build_dir}/current", "src": f"builds/{build_id}", "state": "link"}},
        copy[f"{prefix}/bin/rigup-gpu-power"],
        {**copy[f"/etc/systemd/system/{POWER_UNIT}"], "notify": daemon_reload},
        copy[UDEV_RULE],
        _fact("gpu_power: the cards and their policy (NvidiaGpus, GpuPowerState)",
              f"{GPU_COMMAND}; {GpuPowerState().command()}", "power"),
        copy[POWER_CONF],
        {"name": "gpu_power: GPU power limits by UUID (set what differs)",  # the lab's policy: persistence on, no caps
         "ansible.builtin.command": {"cmd": f"systemctl restart {POWER_UNIT}"},
         "when": "power.stdout is search(', Disabled,')"},
        _running(f"gpu_power: enable {POWER_UNIT}", POWER_UNIT),
        copy[f"{prefix}/bin/rigup-gpu-guard"],
        copy[f"{prefix}/bin/rigup_xid.py"],
        copy[GUARD_CONFIG],
        {**copy[f"/etc/systemd/system/{GUARD_SERVICE}"], "notify": daemon_reload},
        {**copy[f"/etc/systemd/system/{GUARD_TIMER}"], "notify": daemon_reload + [f"restart {GUARD_TIMER}"]},
        _running(f"gpu_guard: run {GUARD_TIMER}", GUARD_TIMER),
        _fact("rpc_worker: no instance names this host a worker (RpcWorkerState)",
              RpcWorkerState().command(build_link=f"{build_dir}/current"), "rpc_worker"),
        {"name": "rpc_worker: retire the worker",
         "ansible.builtin.command": {"cmd": f"systemctl disable --now {RPC_UNIT}"},
         "when": "rpc_worker.stdout is search('^(unit=.|firewall=.|loaded=1)', multiline=True)"},
    ]
    wanted = [f"/etc/systemd/system/rigup-llama@{name}.service.d" for name in sorted(config["llama_server_instances"])]
    out += [
        {"name": "llama_server: the servers and backends rigup configured", "ansible.builtin.find": {
            "paths": ["/etc/systemd/system", BALANCER_DIR], "patterns": ["rigup-llama@*.service.d", "llama-*.json"],
            "file_type": "any"}, "register": "configured"},
        {"name": "llama_server: retire servers no longer wanted", "ansible.builtin.command": {
            "cmd": "rm -rf {{ item }}"},
         "loop": f"{{{{ configured.files | map(attribute='path') | reject('in', {wanted}) | list }}}}"},
        {**copy[LLAMA_UNIT], "notify": daemon_reload},
    ]
    for name, inst in sorted(config["llama_server_instances"].items()):
        marker, unit = f"{config['models'][inst['model']]['dest']}/{MARKER}", f"rigup-llama@{name}.service"
        out += [
            {"name": f"llama_server: {name}: its model's completion marker", "ansible.builtin.stat": {"path": marker},
             "register": f"marker_{name}"},
            {**copy[DROPIN.format(name)], "notify": daemon_reload + [f"restart {unit}"],
             "when": f"marker_{name}.stat.exists"},
            {**_running(f"llama_server: {unit} enabled and running", unit), "when": f"marker_{name}.stat.exists"},
        ]
    out += [
        _fact("balancer: HAProxy in front of replicas (BalancerState)",
              BalancerState().command(drain=balancer_drain(data)), "balancer"),
        {"name": "balancer: nothing to balance: HAProxy stopped and disabled",
         "ansible.builtin.command": {"cmd": "systemctl disable --now -q haproxy"},
         "when": "balancer.stdout is search('^active=active$', multiline=True)"},
        {**copy[NODE_DEFAULT], "notify": ["restart prometheus-node-exporter"]},
        {"name": "metrics: prometheus-node-exporter",
         "ansible.builtin.apt": {"name": ["nftables", "prometheus-node-exporter"], "state": "present"}},
        mkdir[TEXTFILE_DIR],
        _running("metrics: run prometheus-node-exporter", "prometheus-node-exporter"),
        {**copy[f"{prefix}/bin/rigup-metrics-relay"], "notify": [f"restart {RELAY}"]},
        {**copy[RELAY_CONFIG], "notify": [f"restart {RELAY}"]},
        {**copy[RELAY_UNIT], "notify": daemon_reload + [f"restart {RELAY}"]},
        {**copy[f"{prefix}/bin/rigup_throughput.py"], "notify": [f"restart {RELAY}"]},
        _running(f"metrics: run {RELAY}", RELAY),
        # no watched instance (min_tokens_per_s: 0): the timer stopped and disabled, if it is there at all
        {"name": f"watchdog: {WATCHDOG_TIMER} (its unit)", "ansible.builtin.stat": {
            "path": f"/etc/systemd/system/{WATCHDOG_TIMER}"}, "register": "watchdog_timer"},
        {"name": f"watchdog: stop {WATCHDOG_TIMER}", "ansible.builtin.systemd_service": {
            "name": WATCHDOG_TIMER, "state": "stopped", "enabled": False}, "when": "watchdog_timer.stat.exists"},
    ]
    return out


def handlers(data: dict) -> list[dict]:
    """What rigup does only after a change: never run on a converged host."""
    config, _ = serving_config(data)
    restarts = ["systemd-journald", GUARD_TIMER, METRICS_TIMER, "prometheus-node-exporter", RELAY]
    out = [{"name": "systemd daemon-reload", "ansible.builtin.systemd_service": {"daemon_reload": True}},
           *({"name": f"restart {'journald' if u == 'systemd-journald' else u}",
              "ansible.builtin.systemd_service": {"name": u, "state": "restarted"}} for u in restarts)]
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


def write(work: Path, lab_state: dict, data: dict, build_id: str) -> tuple[Path, Path]:
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
             "tasks": tasks(data, build_id), "handlers": handlers(data)}]
    (work / "inventory.yml").write_text(json.dumps(inventory, indent=1))
    (work / "site.yml").write_text(yaml.safe_dump(play, sort_keys=False, width=120))
    return work / "inventory.yml", work / "site.yml"
