"""llama-server's command line and its systemd drop-in for one instance, as pure functions:
roles/llama_server installs the drop-in; tests/gpu/check.py runs its ExecStart on a GPU machine."""

from __future__ import annotations

from rigup.templates import render
from rigup.units import systemd_quote

KEY = "/etc/rigup/llama-server/{}.key"


def argv(name: str, inst: dict, binary: str, model_path: str) -> list[str]:
    """llama-server's command line for one instance (every flag explicit, --port always)."""
    args = [binary, "-m", model_path, "--alias", name, "--host", inst["host"], "--port", inst["port"],
            "-c", inst["ctx"], "--parallel", inst["parallel"], "-ngl", inst["ngl"],
            "-fa", inst["flash_attn"], "-sm", inst["split_mode"],
            "--jinja" if inst["jinja"] else "--no-jinja"]
    if inst["tensor_split"]:
        args += ["-ts", inst["tensor_split"]]
    if inst["metrics"]:
        args.append("--metrics")
    if inst["api_key"]:
        args += ["--api-key-file", KEY.format(name)]
    return [str(a) for a in args + list(inst["extra_args"])]


def dropin_text(name: str, inst: dict, binary: str, model_path: str, build: str, unit_sha: str,
                model_revision: str) -> str:
    """The drop-in rigup-llama@NAME.service.d/rigup.conf: ExecStart, and in a comment what
    restarts the instance when it changes (unit, llama.cpp build, model revision)."""
    return render("llama_server-dropin.conf.j2", name=name, unit_sha=unit_sha, build=build,
                  model_revision=model_revision, model_path=systemd_quote(model_path),
                  argv=[systemd_quote(a) for a in argv(name, inst, binary, model_path)])
