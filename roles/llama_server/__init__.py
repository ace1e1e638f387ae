"""roles/llama_server: llama.cpp's OpenAI-compatible server, one systemd unit per instance.

What it does to a host, for each of ``llama_server_instances`` (name -> recipe):
- the template unit ``rigup-llama@.service``: runs as ``rigup_user``, SIGINT to stop,
  TimeoutStartSec >= 600, Restart=on-failure with a start limit, after the driver and
  rigup-gpu-power, HOME and caches set, hardened (ProtectSystem=strict, DevicePolicy with
  /dev/nvidia* allowed, ...), kept down while the GPU guard is tripped;
- a drop-in per instance with its ExecStart: the first GGUF shard of its model (from the model's
  completion marker, roles/model_fetch), the llama.cpp build that ``current`` points to (read on
  the host: roles/llama_cpp switches it), ``-ngl -fa -c --parallel --host --port --jinja
  --metrics -sm -ts``, ``--api-key-file`` and extra args;
- with ``api_key: true``, a random key made on the host (never seen by pyinfra or argv) in
  /etc/rigup/llama-server/NAME.key, root:rigup 0640, without trailing whitespace;
- starts an instance only once its model is complete; restarts it only when its unit, drop-in
  (flags, llama.cpp build, model) or key changed; then gates on /health 200 and one real chat
  completion, and shows the unit's journal when that fails. On a GPU build it also fails when
  llama-server logs ``no usable GPU found`` (it would silently run on the CPU).

Variables (roles/llama_server/defaults.yml): llama_server_instances, llama_server_health_timeout,
llama_server_health_prompt; and models / models_dir (roles/model_fetch), rigup_user (roles/base),
llama_cpp_dir (roles/llama_cpp), rigup_state_dir (roles/base). Instance form:
roles/llama_server/schema.py; refusals: roles/llama_server/checks.py.
"""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.operations import python

from rigup.config import role_defaults
from rigup.files import managed
from rigup.gate import answered
from rigup.gpu.plan import build_backend
from rigup.models import first_gguf, serving
from rigup.names import guard_file, marker_path
from rigup.secrets import bearer
from rigup.serving import stale_removed, stale_units, unit_running
from rigup.state import read_once
from roles.llama_server.checks import CHECKS, ports
from roles.llama_server.command import KEY, dropin_text, render
from roles.llama_server.facts import DROPIN, LlamaServerState
from roles.llama_server.schema import instances

__all__ = ["apply", "CHECKS", "ports"]

UNIT = "/etc/systemd/system/rigup-llama@.service"


@operation()
def instance(instance_name: str, inst: dict, marker: str, binary: str, build_link: str, unit_sha: str,
             user: str):
    """Instance ``name``: its key, its drop-in, and its unit enabled and running; restarted only
    when the drop-in (flags, the build ``build_link`` points to, the model) or the key changed.
    Waits (changes nothing) while its model is incomplete."""
    name = instance_name
    marker_file = marker
    found = read_once(LlamaServerState, instances={name: marker_file}, build_link=build_link)
    state = found["instances"].get(name, {})
    marker = state.get("marker")
    if not marker:
        host.noop(f"{name}: waiting for its model ({marker_file} does not exist yet)")
        return
    model_file = first_gguf(marker.get("files", []))
    if not model_file:
        raise OperationError(f"{name}: no GGUF file (or first shard) among the files of "
                             f"{marker_file}: {', '.join(marker.get('files', [])) or 'none'}")
    model_path = marker_file.rsplit("/", 1)[0] + "/" + model_file
    text = dropin_text(name, inst, binary, model_path, found["build"] or "none", unit_sha, marker.get("revision"))
    changed = hashlib.sha256(text.encode()).hexdigest() != state.get("dropin")
    unit = f"rigup-llama@{name}.service"
    yield from unit_running(unit, DROPIN.format(name), text, state, changed,
                            f"{name} runs with its current drop-in and key",
                            key=(KEY.format(name), user, "") if inst["api_key"] else None)


@deploy("llama_server", data_defaults=role_defaults("llama_server"))
def apply(plan: dict):
    data = host.data.dict()
    user, binary = data["rigup_user"], f"{data['llama_cpp_dir']}/current/bin/llama-server"
    wanted, entries = serving(data, instances)
    if wanted is None:
        return
    stale = stale_units("rigup-llama", wanted, plan)
    if stale:
        stale_removed(name=f"llama-server: stop and remove {', '.join(stale)} (no longer configured)",
                      template="rigup-llama", stale=stale)
    if not wanted:
        return
    unit_text = render("llama_server-unit.service.j2", user=user, guard_file=guard_file(data),
                        start_timeout=max(600, data["llama_server_health_timeout"]))
    managed(name="llama-server template unit", dest=UNIT, text=unit_text, paths=[UNIT])
    unit_sha = hashlib.sha256(unit_text.encode()).hexdigest()[:12]
    gpu = build_backend(plan, data) == "cuda"
    for name, inst in sorted(wanted.items()):
        started = instance(name=f"llama-server {name} on {inst['host']}:{inst['port']}",
                           instance_name=name, inst=inst, marker=marker_path(entries[inst["model"]]["dest"]),
                           binary=binary, build_link=f"{data['llama_cpp_dir']}/current", unit_sha=unit_sha,
                           user=user)
        auth = bearer(KEY.format(name)) if inst["api_key"] else ""
        python.call(answered, unit=f"rigup-llama@{name}.service", port=inst["port"], bind=inst["host"], model=name,
                    prompt=data["llama_server_health_prompt"], timeout=data["llama_server_health_timeout"],
                    auth=auth, fail_on_log="no usable GPU found" if gpu else None,  # it would serve from the CPU
                    name=f"llama-server {name} answers", _if=started.did_change)
