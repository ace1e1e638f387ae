"""roles/llama_server: llama.cpp's OpenAI-compatible server, one systemd unit per instance.

What it does to a host, for each of ``llama_server_instances`` (name -> recipe):
- the template unit ``rigup-llama@.service``: runs as ``rigup_user``, SIGINT to stop,
  TimeoutStartSec >= 600, Restart=on-failure with a start limit, after the driver and
  rigup-gpu-power, HOME and caches set, hardened (ProtectSystem=strict, DevicePolicy with
  /dev/nvidia* allowed, ...), kept down while the GPU guard is tripped;
- a drop-in per instance with its ExecStart: the first GGUF shard of its model (from the model's
  completion marker, roles/model_fetch), ``-ngl -fa -c --parallel --host --port --jinja
  --metrics -sm -ts``, ``--api-key-file`` and extra args;
- with ``api_key: true``, a random key made on the host (never seen by pyinfra or argv) in
  /etc/rigup/llama-server/NAME.key, root:rigup 0640, without trailing whitespace;
- starts an instance only once its model is complete; restarts it only when its unit, drop-in
  (flags, llama.cpp build, model) or key changed; then gates on /health 200 and one real chat
  completion, and shows the unit's journal when that fails. On a GPU build it also fails when
  llama-server logs ``no usable GPU found`` (it would silently run on the CPU).

Variables (roles/llama_server/defaults.yml): llama_server_instances, llama_server_health_timeout,
llama_server_health_prompt; and models / models_dir (roles/model_fetch), rigup_user (roles/base),
llama_cpp_dir (roles/llama_cpp). Instance form: roles/preflight/schema.py LLAMA_INSTANCE.
"""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError, StringCommand, deploy, operation
from pyinfra.operations import files, python

from rigup.state import read_once
from rigup.files import managed
from rigup.gate import gate
from rigup.config import role_defaults
from rigup.gpu.plan import build_backend
from roles.llama_cpp.script import build_id, cmake_options
from roles.llama_server.command import KEY, dropin_text, render
from roles.llama_server.facts import DROPIN, LlamaServerState
from roles.model_fetch.facts import first_gguf
from roles.preflight.schema import serving_config

UNIT = "/etc/systemd/system/rigup-llama@.service"
GUARD_FILE = "/var/lib/rigup/gpu-guard.tripped"
MARKER = ".rigup-complete.json"


@operation()
def instance(instance_name: str, inst: dict, marker_path: str, binary: str, build: str, unit_sha: str,
             user: str):
    """Instance ``name``: its key, its drop-in, and its unit enabled and running; restarted only
    when the drop-in or the key changed. Waits (changes nothing) while its model is incomplete."""
    name = instance_name
    state = read_once(LlamaServerState, instances={name: marker_path}).get(name, {})
    marker = state.get("marker")
    if not marker:
        host.noop(f"{name}: waiting for its model ({marker_path} does not exist yet)")
        return
    model_file = first_gguf(marker.get("files", []))
    if not model_file:
        raise OperationError(f"{name}: no GGUF file (or first shard) among the files of "
                             f"{marker_path}: {', '.join(marker.get('files', [])) or 'none'}")
    model_path = marker_path.rsplit("/", 1)[0] + "/" + model_file
    text = dropin_text(name, inst, binary, model_path, build, unit_sha, marker.get("revision"))
    changed = hashlib.sha256(text.encode()).hexdigest() != state.get("dropin")
    unit = f"rigup-llama@{name}.service"
    if inst["api_key"] and not state.get("key"):
        key = KEY.format(name)
        yield StringCommand(  # made on the host: the key never passes through pyinfra or an argv
            f"install -d -m 0750 -g {user} /etc/rigup/llama-server && umask 027 && "
            f"python3 -c 'import secrets; print(secrets.token_hex(32), end=\"\")' > {key}.new && "
            f"chown root:{user} {key}.new && chmod 0640 {key}.new && mv {key}.new {key}")
        changed = True
    if changed:
        yield from files.put._inner(src=StringIO(text), dest=DROPIN.format(name), mode="644")
        yield "systemctl daemon-reload"
        yield f"systemctl enable {unit} && systemctl restart {unit}"
    elif state.get("active") != "active" or state.get("enabled") != "enabled":
        yield f"systemctl enable {unit} && systemctl start {unit}"
    else:
        host.noop(f"{name} runs with its current drop-in and key")


def _gate(state, host, name: str, inst: dict, timeout: int, prompt: str, gpu: bool) -> None:
    """/health 200 and one real completion; on a GPU build, no "no usable GPU found" in the log
    (llama-server would otherwise serve from the CPU without saying so)."""
    auth = (f"-H @<(printf 'Authorization: Bearer %s' \"$(cat {KEY.format(name)})\")"
            if inst["api_key"] else "")
    text = gate(host, f"rigup-llama@{name}.service", inst["port"], name, prompt, timeout, auth=auth,
                fail_on_log="no usable GPU found" if gpu else None)
    host.noop(f"{name} answered: {text!r}")


@deploy("llama_server", data_defaults=role_defaults("llama_server"))
def apply(plan: dict):
    data = host.data.dict()
    config, problems = serving_config(data)
    if problems or not config["llama_server_instances"]:
        return  # preflight refused the problems; nothing to serve is nothing to do
    user = data["rigup_user"]
    unit_text = render("llama_server-unit.service.j2", user=user, guard_file=GUARD_FILE,
                        start_timeout=max(600, data["llama_server_health_timeout"]))
    managed(name="llama-server template unit", dest=UNIT, text=unit_text, paths=[UNIT])
    unit_sha = hashlib.sha256(unit_text.encode()).hexdigest()[:12]
    build = "rollback" if data["llama_cpp_rollback"] else build_id(data, cmake_options(plan, data))
    binary = f"{data['llama_cpp_dir']}/current/bin/llama-server"
    gpu = build_backend(plan, data) == "cuda"
    for name, inst in sorted(config["llama_server_instances"].items()):
        marker = f"{config['models'][inst['model']]['dest']}/{MARKER}"
        started = instance(name=f"llama-server {name} on {inst['host']}:{inst['port']}",
                           instance_name=name, inst=inst,
                           marker_path=marker, binary=binary, build=build, unit_sha=unit_sha,
                           user=user)
        python.call(_gate, name, inst, data["llama_server_health_timeout"],
                    data["llama_server_health_prompt"], gpu,
                    name=f"llama-server {name} answers", _if=started.did_change)
