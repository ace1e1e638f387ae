"""Hostile values in every name and free-text field, through the real CLI against a lab host:
each converge (and each --dry) is refused with the key path, no command of theirs ever runs on
the host (no marker file appears), and no unit or env file gains a line."""

import json
import re
import shlex

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


UNITS = "grep -r '' /etc/systemd/system/rigup-* /etc/rigup 2>/dev/null | sort"


def units(lab, host) -> str:
    """Every rigup unit, drop-in and env file on the host, with its content."""
    return lab.ssh(host, UNITS).stdout


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
    marks, after = lab.ssh(host, f"ls {MARK}* 2>/dev/null; echo '--- units'; {UNITS}").stdout.split("--- units\n", 1)
    assert marks == "", "a hostile value ran on the host"
    assert after == before and "ExecStartPost=+" not in after and "ExecStartPre=+/bin/touch" not in after


# --- root never follows what the rigup user can place (issue 32; the inventory: rigup/nofollow.py)
DEST = "/srv/models/gemma-270m"      # group_vars/lab.yml's model, the rigup user's directory
FILES = [".rigup-complete.json", ".rigup-fetch/job.json", ".rigup-fetch/progress.json", ".rigup-fetch/state.json",
         ".rigup-fetch/lock", ".rigup-fetch/parts", ".rigup-fetch/ckpt"]
TARGETS = ["/etc/shadow", "/root/rigup-target", "/root/rigup-target-dir"]   # what a plant points at: root's only
READERS = """import json
import click
from pyinfra import host
from plays.bench import Serving
from roles.llama_server.facts import LlamaServerState
from roles.preflight.facts import PathBytes
m = "{dest}/.rigup-complete.json"
s = host.get_fact(LlamaServerState, units={{"gemma": [m, "gemma"]}}, build_link="/opt/rigup/llama.cpp/current")
b = host.get_fact(Serving, markers=[m], binary="/opt/rigup/llama.cpp/current/bin/llama-bench",
                  smoke="/opt/rigup/llama.cpp/current/rigup-smoke.json")
p = host.get_fact(PathBytes, paths=[("{dest}", "dc8aac109665e96b4997756aca46909ff5ad7afc")])
click.echo("##readers " + json.dumps({{"llama_server": s["instances"]["gemma"].get("marker"),
                                      "bench": b["markers"].get(m), "path_bytes": p}}), err=True)
"""


def as_rigup(lab, host, script: str):
    out = lab.ssh(host, f"cd {DEST} && runuser -u rigup -- sh -c {shlex.quote(script)}")
    assert out.returncode == 0, out.stdout + out.stderr


def fingerprints(lab, host) -> str:
    """sha256, mode and owner of every target (a directory: of its listing)."""
    return lab.ssh(host, "for t in " + " ".join(TARGETS) + "; do if [ -d $t ]; then h=$(ls -la $t | sha256sum); "
                   "else h=$(sha256sum < $t); fi; echo \"$t $(stat -c '%a %U:%G' $t) ${h%% *}\"; done").stdout


@pytest.fixture(scope="module")
def as_the_lab_says(lab, second_converge):
    """The first lab host converged to inventory/lab.py's settings: the modules before this one
    leave theirs (a site file's value, a hub token, another play's models)."""
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", lab.hosts()[0]["name"], timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    return run


def test_root_follows_no_symlink_and_opens_no_fifo_the_rigup_user_plants(lab, as_the_lab_says, tmp_path):
    """As the rigup user, a symlink (to /etc/shadow, a root-only file or directory) and then a FIFO
    at every path root touches in the lab's model directory (the marker and the job's files; then
    the job's directory itself): the converge, status.py, the metrics timer and the facts that read
    the marker (llama_server's, bench.py's, preflight's) end at once, the targets are untouched, the
    converge refuses the host naming each planted path; the plants removed, the next converge
    changes nothing."""
    import time

    host = lab.hosts()[0]["name"]
    lab.ssh(host, "printf 'root only %s\\n' $(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' ') > /root/rigup-target && "
                  "chmod 600 /root/rigup-target && mkdir -p -m 700 /root/rigup-target-dir && "
                  "touch /root/rigup-target-dir/kept")
    before = fingerprints(lab, host)
    print(f"\nsysctl: {lab.ssh(host, 'sysctl -n fs.protected_symlinks fs.protected_fifos fs.protected_hardlinks').stdout.split()}"
          f" (protected_symlinks, _fifos, _hardlinks)\ntargets before:\n{before}", end="")
    readers = tmp_path / "readers.py"
    readers.write_text(READERS.format(dest=DEST))
    as_rigup(lab, host, "mkdir .keep && cp -a .rigup-complete.json .rigup-fetch .keep/")   # the real ones, kept
    link = {".rigup-complete.json": "/etc/shadow", ".rigup-fetch/parts": "/root/rigup-target-dir",
            ".rigup-fetch/ckpt": "/root/rigup-target-dir", ".rigup-fetch": "/root/rigup-target-dir"}
    rounds = [("symlink", FILES), ("FIFO", FILES), ("symlink", [".rigup-fetch"]), ("FIFO", [".rigup-fetch"])]
    try:
        for kind, paths in rounds:
            make = " ".join(f"rm -rf {p}; " + (f"ln -s {link.get(p, '/root/rigup-target')} {p};" if kind == "symlink"
                                               else f"mkfifo {p};") for p in paths)
            as_rigup(lab, host, f"rm -rf .rigup-complete.json .rigup-fetch && cp -a .keep/. . && {make}")
            marker = ".rigup-complete.json" in paths   # else the real marker is there
            run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, timeout=300)
            said = [ln.split("refused: ", 1)[1][:150] for ln in run.output.splitlines() if "refused: models." in ln]
            print(f"{kind} at {len(paths)} path(s): converge exit {run.returncode} in {run.seconds:.1f} s; it said:\n  "
                  + "\n  ".join(said))
            assert run.returncode != 0 and run.seconds < 120
            for p in paths:
                what = f"a symlink to {link.get(p, '/root/rigup-target')}" if kind == "symlink" else "a FIFO"
                assert f"{DEST}/{p} is {what}, which rigup never makes there" in run.output, run.output[-3000:]
            status = pyinfra("inventory/lab.py", "status.py", "--limit", host, timeout=120)
            row = next(ln for ln in status.output.splitlines() if ln.startswith(host))
            # the row counts the models downloaded (1/1); one not here has a row of its own under it
            download = ("not here yet" if "  download gemma-270m not here yet" in status.output.splitlines() else
                        "complete" if re.search(r" 1/1 ", row) else None)
            start = time.monotonic()
            timer = lab.ssh(host, "timeout 60 systemctl start rigup-model-metrics.service; echo rc=$?; "
                                  "grep -h 'gemma-270m' /var/lib/prometheus/node-exporter/rigup_model_fetch.prom "
                                  "| grep ' 1$'")
            timer_s = time.monotonic() - start
            facts = pyinfra("inventory/lab.py", str(readers), "--limit", host, timeout=120)
            seen = json.loads(facts.output.split("##readers ", 1)[1].splitlines()[0])
            print(f"  status.py {status.seconds:.1f} s: {download}; metrics timer {timer_s:.1f} s "
                  f"({' '.join(timer.stdout.split())}); facts {facts.seconds:.1f} s: marker read by llama_server's "
                  f"{'no' if seen['llama_server'] is None else 'the real one'}, by bench.py's "
                  f"{'no' if seen['bench'] is None else 'the real one'}; preflight's bytes {seen['path_bytes'][DEST]}")
            assert status.returncode == 0 and download == ("not here yet" if marker else "complete")
            assert status.seconds < 60
            assert "rc=0" in timer.stdout and timer_s < 30
            assert facts.returncode == 0 and (seen["llama_server"] is None) == (seen["bench"] is None) == marker
            assert (seen["path_bytes"][DEST] == 0) == marker, seen
            assert fingerprints(lab, host) == before
    finally:
        as_rigup(lab, host, "rm -rf .rigup-complete.json .rigup-fetch && cp -a .keep/. . && rm -rf .keep")
    after = fingerprints(lab, host)
    print(f"targets after:\n{after}", end="")
    assert after == before
    clean = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, timeout=300)
    print(f"plants removed: converge exit {clean.returncode}, {clean.totals['changed']} changed, {clean.seconds:.1f} s")
    assert clean.returncode == 0 and clean.totals["changed"] == 0, clean.changed_operations()


def test_a_stale_hub_token_goes_with_an_insecure_hub(lab, as_the_lab_says):
    """The lab's hub is http:// (hf_endpoint_insecure): a hub token left on the host from before is
    removed by the next converge, and the one after changes nothing."""
    host = lab.hosts()[0]["name"]
    lab.ssh(host, "umask 077 && printf hf_stale_token > /etc/rigup/hf-token")
    first = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, timeout=300)
    left = lab.ssh(host, "ls /etc/rigup/hf-token 2>&1").stdout.strip()
    second = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, timeout=300)
    print(f"\nstale token: converge {first.seconds:.1f} s changed {first.changed_operations()}; then {left!r}; "
          f"next converge {second.totals['changed']} changed")
    assert first.returncode == 0 and first.changed_operations() == ["model_fetch | No hub token here (/etc/rigup/hf-token)"]
    assert "No such file" in left
    assert second.returncode == 0 and second.totals["changed"] == 0, second.changed_operations()
