"""Hostile values in every name and free-text field, through the real CLI against a lab host:
each converge (and each --dry) is refused with the key path, no command of theirs ever runs on
the host (no marker file appears), and no unit or env file gains a line."""

import json

import pytest

from tests.converge import pyinfra

pytestmark = pytest.mark.lab
REV = "0123456789abcdef0123456789abcdef01234567"
MARK = "/tmp/rigup-pwned"
MODEL = {"repo": "org/model-GGUF", "revision": REV}


def touch(n: int) -> str:
    return f"$(touch {MARK}-{n})"


def inst(**kw):
    return {"model": "m", "port": 8181, **kw}


CASES = [
    ("models.", {"models": {touch(1): MODEL}}),
    ("llama_server_instances.", {"models": {"m": MODEL}, "llama_server_instances": {touch(2): inst()}}),
    ("llama_server_instances.x;touch", {"models": {"m": MODEL},
                                        "llama_server_instances": {f"x;touch {MARK}-3;#": inst()}}),
    ("llama_server_instances.x.extra_args", {"models": {"m": MODEL}, "llama_server_instances": {
        "x": inst(extra_args=[f"--foo\nExecStartPost=+/bin/touch {MARK}-4"])}}),
    ("vllm_instances.x.served_model_name", {"models": {"m": MODEL}, "vllm_pip_version": "0.33.0",
                                            "vllm_instances": {"x": inst(served_model_name=f"a\nExecStartPost=+/bin/touch {MARK}-5")}}),
    ("vllm_instances.x.env", {"models": {"m": MODEL}, "vllm_pip_version": "0.33.0",
                              "vllm_instances": {"x": inst(env={"OK": f"1\nExecStartPre=+/bin/touch {MARK}-6"})}}),
    ("models.m.dest", {"models": {"m": {**MODEL, "dest": f"/srv/{touch(7)}"}}}),
    ("rigup_user", {"rigup_user": f"rigup;touch {MARK}-8"}),
    ("rigup_prefix", {"rigup_prefix": f"/opt/rigup;touch {MARK}-9"}),
    ("llama_server_instances.x.host", {"models": {"m": MODEL}, "llama_server_instances": {"x": inst(host=touch(10))}}),
    ("llama_cpp_ref", {"llama_cpp_ref": f"--upload-pack=touch {MARK}-11"}),
    ("models.m.dest", {"models": {"m": {**MODEL, "dest": "/etc"}}}),
]


def units(lab, host) -> str:
    """Every rigup unit, drop-in and env file on the host, with its content."""
    return lab.ssh(host, "grep -r '' /etc/systemd/system/rigup-* /etc/rigup 2>/dev/null | sort").stdout


@pytest.mark.parametrize("where, values", CASES, ids=[c[0] for c in CASES])
def test_hostile_values_are_refused_and_run_nothing(lab, where, values):
    host = lab.hosts()[0]["name"]
    before = units(lab, host)
    args = [a for k, v in values.items() for a in ("--data", f"{k}={json.dumps(v)}")]
    for dry in (True, False):
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, *(["--dry"] if dry else []), *args,
                      timeout=300)
        assert run.returncode != 0, run.output[-3000:]
        assert where in run.output, run.output[-3000:]
        print(f"{'--dry ' if dry else ''}{where}: refused in {run.seconds:.1f} s")
    assert lab.ssh(host, f"ls {MARK}* 2>/dev/null").stdout == "", "a hostile value ran on the host"
    after = units(lab, host)
    assert after == before and "ExecStartPost=+" not in after and "ExecStartPre=+/bin/touch" not in after
