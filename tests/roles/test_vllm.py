"""roles/vllm on the lab, with a stand-in for vLLM (tests/lab/vllm_stub.py): a small python package
named ``vllm`` in a real git repository, whose ``vllm serve`` answers /health and chat completions.
Real vLLM is not run here: the lab has no GPU, and a CPU build of vLLM is too heavy for CI. What
is proven: the pin's venv from git at a commit, the patch series (applied in order, re-applying a
no-op, a patch that does not apply or a sha256 mismatch refused before anything changes), the
environment file, the unit (systemd-analyze verify), the VRAM wait, the health gate and restarts
only on change. The play runs preflight, base and vllm only (tests/roles/vllm_only.py)."""

import json
import re
import shlex
import subprocess
import time

import pytest

from rigup import config
from tests.conftest import on_host
from tests.converge import pyinfra
from tests.lab import vllm_stub

pytestmark = pytest.mark.lab
PLAY = "tests/roles/vllm_only.py"
UNIT = "rigup-vllm@tiny.service"
DEST = "/srv/models/tiny-stub"
REV = "1" * 40
PORT = 8095  # not 8091: model_fetch_share_port
STUB_URL = "file:///root/vllm-stub/vllm-stub.git"


def with_data(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--data", f"{k}={json.dumps(v)}")]


@pytest.fixture(scope="module")
def stub(tmp_path_factory, lab):
    """The stub repository (pushed to the first lab host as a bare repo), its patches and manifests."""
    tmp = tmp_path_factory.mktemp("vllm-stub")
    commit = vllm_stub.make_repo(tmp / "repo")
    patches = vllm_stub.make_patches(tmp / "repo", tmp / "patches")
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp / "repo"), str(tmp / "vllm-stub.git")], check=True)
    host = lab.hosts()[0]["name"]
    tar = subprocess.run(["tar", "c", "-C", str(tmp), "vllm-stub.git"], check=True, capture_output=True).stdout
    subprocess.run(lab.ssh_argv(host) + ["--", "rm -rf /root/vllm-stub && mkdir -p /root/vllm-stub && "
                                         "tar x -C /root/vllm-stub"], input=tar, check=True)
    series = [str(patches["0001-greeting.patch"]), str(patches["0002-patch-level.patch"])]
    return {"commit": commit, "patches": patches, "series": series, "tmp": tmp,
            "manifest": str(vllm_stub.manifest(patches.values(), tmp / "SHA256SUMS"))}


def recipe(stub, **over) -> dict:
    lab_vars = config.load_yaml(config.GROUP_VARS_DIR / "lab.yml")
    instance = {"model": "tiny", "port": PORT, "pp": 2, "pp_partition": "3,3", "layers": 6,
                "gpu_memory_utilization": 0.5, "extra_args": ["--enforce-eager"]}
    values = {
        "models": {**lab_vars["models"], "tiny": {"repo": "rigup-lab/tiny-stub", "revision": REV, "dest": DEST}},
        "vllm_instances": {"tiny": instance},
        "vllm_git_url": STUB_URL, "vllm_git_commit": stub["commit"],
        "vllm_patches": stub["series"], "vllm_patch_manifest": stub["manifest"],
        "vllm_pip_args": ["--no-index", "--no-build-isolation"], "vllm_installer": "pip",  # the stub, offline
        "vllm_health_timeout": 60,
        # the stand-in loads for 1 s (2 by default), refusing connections meanwhile: the gate (a poll
        # every 2 s) still finds it loading at its first poll, and serving at its second, not third
        "vllm_env": {"VLLM_STUB_LOAD_SECONDS": "1"},
    }
    values.update(over)
    return values


def play(host, values, check=True, env=None):
    run = pyinfra("inventory/lab.py", PLAY, "--limit", host, *with_data(values), timeout=600, env=env)
    if check:
        assert run.returncode == 0, run.output[-5000:]
    return run


def started_at(lab, host):
    return on_host(lab, host, f"systemctl show -p ActiveEnterTimestampMonotonic --value {UNIT}").strip()


def snapshot(lab, host):
    """What a refused run must leave as it was: the install, its stamp, the unit's start time."""
    return on_host(lab, host, "cat /opt/rigup/vllm/git-*/.rigup-stamp.json 2>&1; "
                              "git -C /opt/rigup/vllm/git-*/src diff 2>&1 | sha256sum; "
                              "ls -la --time-style=full-iso /opt/rigup/vllm/git-*/venv/bin/vllm 2>&1; "
                              f"ls /etc/systemd/system/ | grep vllm; "
                              f"systemctl show -p ActiveEnterTimestampMonotonic --value {UNIT}")


@pytest.fixture(scope="module")
def host(lab, stub):
    """The first lab host: the model's directory and completion marker written here (no fetch),
    then the play twice."""
    name = lab.hosts()[0]["name"]
    marker = json.dumps({"repo": "rigup-lab/tiny-stub", "revision": REV, "files": ["config.json"], "bytes": 2})
    on_host(lab, name, f"mkdir -p {DEST} && echo '{{}}' > {DEST}/config.json && "
                       f"printf '%s' {shlex.quote(marker)} > {DEST}/.rigup-complete.json && chmod -R a+rX {DEST}")
    first = play(name, recipe(stub), env={"RIGUP_PROGRESS_INTERVAL_S": "1"})  # a line a second
    again = play(name, recipe(stub))
    print(f"\nvllm (stub) first converge: {first.seconds:.1f} s; again: {again.seconds:.1f} s")
    yield {"name": name, "first": first, "again": again}
    # leave the host as the other modules expect it: no vLLM unit, no stub model
    lab.ssh(name, "systemctl disable --now rigup-vllm@tiny.service rigup-vllm@other.service "
                  "rigup-vllm@tiny-0.service rigup-vllm@tiny-1.service haproxy 2>/dev/null; rm -f /etc/rigup/balancer/*; "
                  "rm -rf /etc/systemd/system/rigup-vllm@* /etc/rigup/vllm /root/vllm-stub "
                  f"{DEST}; systemctl daemon-reload")


def stub_info(lab, host):
    return json.loads(on_host(lab, host, f"curl -sf http://127.0.0.1:{PORT}/rigup-stub"))


def test_the_install_prints_its_progress(host):
    """The install runs as its own unit; the converge prints its state every second, then the end."""
    lines = [ln.strip() for ln in host["first"].output.splitlines() if "] vllm install git-" in ln]
    print("\n" + "\n".join(lines))
    assert len(lines) >= 2 and lines[-1].split(": ", 1)[1].startswith("done in ")
    assert all(ln.startswith(f"[{host['name']}] ") for ln in lines)
    assert not any("] vllm install" in ln for ln in host["again"].output.splitlines())


def test_installs_patches_serves_and_passes_the_gate(lab, host):
    first = host["first"]
    changed = " ".join(first.changed_operations())
    assert "vllm tiny answers" in changed and "vllm virtualenv git-" in changed
    diff = on_host(lab, host["name"], "git -C /opt/rigup/vllm/git-*/src diff")
    assert '+GREETING = "hello from the patched stub"' in diff and "+PATCH_LEVEL = 2" in diff
    assert on_host(lab, host["name"], f"systemctl is-active {UNIT}").strip() == "active"
    assert stub_info(lab, host["name"])["patch_level"] == 2  # 0002 on top of 0001, in order
    answer = on_host(lab, host["name"], f"curl -s -H 'Content-Type: application/json' -d "
                                        f"'{{\"model\": \"tiny\", \"messages\": []}}' "
                                        f"http://127.0.0.1:{PORT}/v1/chat/completions")
    assert json.loads(answer)["choices"][0]["message"]["content"] == "hello from the patched stub"


def test_second_run_changes_nothing(host):
    assert host["again"].totals["changed"] == 0, host["again"].changed_operations()


def test_runs_as_rigup_with_explicit_flags(lab, host):
    info = stub_info(lab, host["name"])
    line = " ".join(info["argv"][1:])
    assert line.startswith(f"serve {DEST} --host 127.0.0.1 --port {PORT} --tensor-parallel-size 1 "
                           "--pipeline-parallel-size 2 --gpu-memory-utilization 0.5 --served-model-name tiny")
    assert info["extra"] == ["--enforce-eager"]
    users = on_host(lab, host["name"], f"ps -o user= -p $(systemctl show -p MainPID --value {UNIT})").strip()
    assert users == "rigup"


def test_env_file_has_the_validated_partition_and_caches(lab, host):
    env = stub_info(lab, host["name"])["env"]
    assert env["VLLM_PP_LAYER_PARTITION"] == "3,3"
    assert env["HOME"] == "/var/lib/rigup/vllm/tiny" and env["HF_HOME"] == "/var/cache/rigup/vllm/tiny/hf"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert on_host(lab, host["name"], "stat -c '%U:%G %a' /etc/rigup/vllm/tiny.env").strip() == "root:rigup 640"
    on_host(lab, host["name"], "test -s /var/lib/rigup/vllm/tiny/stub-was-here")  # HOME writable


def test_unit_verifies_and_says_how_hardened(lab, host):
    on_host(lab, host["name"], f"systemd-analyze verify {UNIT}")
    unit = on_host(lab, host["name"], f"systemctl cat {UNIT}")
    for line in ("KillMode=control-group", "KillSignal=SIGINT", "TimeoutStartSec=900", "RestartSec=30",
                 "ConditionPathExists=!/var/lib/rigup/gpu-guard.tripped"):
        assert line in unit
    out = on_host(lab, host["name"], f"systemd-analyze security {UNIT} | tail -1")
    exposure = float(re.search(r"exposure level for \S+: ([\d.]+)", out).group(1))
    print(f"\nsystemd-analyze security {UNIT}: {exposure}")
    assert exposure <= 5.0, out


def test_the_vram_wait_waits_for_busy_cards(lab, host):
    wait = "/opt/rigup/vllm/bin/rigup-vllm-wait-vram"
    on_host(lab, host["name"], "rigup-gpu-sim set -i 1 --memory-used 30000")
    try:
        # a 1 s timeout: a look, its 2 s sleep and a second look before it gives up (3 s: a third)
        busy = lab.ssh(host["name"], f"{wait} 1024 1")
        assert busy.returncode == 1 and "GPU 1: 30000 MiB" in busy.stderr, busy
        assert lab.ssh(host["name"], f"{wait} 1024 3 -i 0").returncode == 0  # only its own cards
    finally:
        on_host(lab, host["name"], "rigup-gpu-sim set -i 1 --memory-used 0")
    assert "VRAM free" in on_host(lab, host["name"], f"{wait} 1024 3")


def test_a_sha256_mismatch_is_refused_before_anything_changes(lab, host, stub):
    before = snapshot(lab, host["name"])
    bad = vllm_stub.manifest(stub["patches"].values(), stub["tmp"] / "BADSUMS", wrong="0002-patch-level.patch")
    run = play(host["name"], recipe(stub, vllm_patch_manifest=str(bad)), check=False)
    assert run.returncode != 0
    assert "vllm_patches[1]: 0002-patch-level.patch has sha256" in run.output
    assert snapshot(lab, host["name"]) == before


def test_a_patch_that_does_not_apply_is_refused_before_anything_changes(lab, host, stub):
    before = snapshot(lab, host["name"])
    series = stub["series"] + [str(stub["patches"]["0003-does-not-apply.patch"])]
    run = play(host["name"], recipe(stub, vllm_patches=series), check=False)
    assert run.returncode != 0
    assert "patch 0003-does-not-apply.patch does not apply" in run.output
    assert snapshot(lab, host["name"]) == before
    assert stub_info(lab, host["name"])["patch_level"] == 2


def test_a_bad_pin_is_refused_naming_the_key(lab, host, stub):
    before = snapshot(lab, host["name"])
    run = play(host["name"], recipe(stub, vllm_git_commit="main"), check=False)
    assert run.returncode != 0 and "vllm_git_commit: expected the full 40-hex commit" in run.output
    assert snapshot(lab, host["name"]) == before


def test_a_bad_partition_is_refused_by_preflight(lab, host, stub):
    before = snapshot(lab, host["name"])
    values = recipe(stub)
    values["vllm_instances"]["tiny"]["pp_partition"] = "4,3"
    run = play(host["name"], values, check=False)
    assert run.returncode != 0 and "'4,3' sums to 7 layers, but the model has 6" in run.output
    assert snapshot(lab, host["name"]) == before


def test_restarts_only_on_change_and_reinstalls_when_the_series_changes(lab, host, stub):
    before = started_at(lab, host["name"])
    play(host["name"], recipe(stub))
    assert started_at(lab, host["name"]) == before
    run = play(host["name"], recipe(stub, vllm_patches=stub["series"][:1]))  # 0001 alone: new stamp
    assert "vllm virtualenv" in " ".join(run.changed_operations())
    assert "vllm tiny answers" in " ".join(run.changed_operations())
    assert started_at(lab, host["name"]) != before
    assert stub_info(lab, host["name"])["patch_level"] == 0
    play(host["name"], recipe(stub))  # back to the full series
    assert stub_info(lab, host["name"])["patch_level"] == 2


def test_waits_without_a_model_marker(lab, host, stub):
    on_host(lab, host["name"], f"mv {DEST}/.rigup-complete.json /root/marker")
    try:
        values = recipe(stub)
        values["vllm_instances"]["other"] = {"model": "tiny", "port": PORT + 1}
        run = play(host["name"], values)
        assert "vllm other answers" not in " ".join(run.changed_operations())
        assert lab.ssh(host["name"], "test -e /etc/systemd/system/rigup-vllm@other.service.d").returncode != 0
    finally:
        on_host(lab, host["name"], f"mv /root/marker {DEST}/.rigup-complete.json")


def test_a_tripped_gpu_guard_keeps_it_down(lab, host):
    name = host["name"]
    on_host(lab, name, f"touch /var/lib/rigup/gpu-guard.tripped && systemctl restart {UNIT}")
    try:
        assert on_host(lab, name, f"systemctl show -p ConditionResult --value {UNIT}").strip() == "no"
        assert lab.ssh(name, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    finally:
        on_host(lab, name, f"rm -f /var/lib/rigup/gpu-guard.tripped && systemctl start {UNIT}")
    deadline = time.monotonic() + 30
    while lab.ssh(name, f"curl -sf http://127.0.0.1:{PORT}/health").returncode != 0:
        assert time.monotonic() < deadline, "the stub did not come back"
        time.sleep(1)


def test_a_pip_pin_gets_its_own_venv(lab, host, stub):
    """vllm_pip_version from a local index (--find-links): venv pip-0.0.1, the unit switches to it."""
    name, repo = host["name"], stub["tmp"] / "repo"
    wheels = stub["tmp"] / "wheels"
    wheels.mkdir(exist_ok=True)
    subprocess.run(["python3", "-c", f"import stub_backend; stub_backend.build_wheel({str(wheels)!r})"],
                   cwd=repo, check=True)
    tar = subprocess.run(["tar", "c", "-C", str(stub["tmp"]), "wheels"], check=True, capture_output=True).stdout
    subprocess.run(lab.ssh_argv(name) + ["--", "rm -rf /root/wheels && tar x -C /root"], input=tar, check=True)
    before = started_at(lab, name)
    run = play(name, recipe(stub, vllm_git_url=None, vllm_git_commit=None, vllm_patches=[], vllm_pip_version="0.0.1",
                            vllm_pip_args=["--no-index", "--find-links", "/root/wheels"]))
    assert "vllm virtualenv pip-0.0.1 (0 patches)" in " ".join(run.changed_operations())
    assert started_at(lab, name) != before
    info = stub_info(lab, name)
    assert info["argv"][0].startswith("/opt/rigup/vllm/pip-0.0.1/venv/bin/") and info["patch_level"] == 0
    play(name, recipe(stub))  # back to the git pin and its series: its venv is still there
    assert stub_info(lab, name)["patch_level"] == 2


def test_api_key_made_on_the_host_enforced_and_never_shown(lab, host, stub):
    """api_key: true: VLLM_API_KEY made on the host in a root-only file read by systemd; /v1 needs
    it, the gate sends it, and it is in no argv, drop-in or pyinfra output."""
    name = host["name"]
    values = recipe(stub)
    values["vllm_instances"]["tiny"]["api_key"] = True
    run = play(name, values)
    key_file = "/etc/rigup/vllm/tiny.key"
    assert on_host(lab, name, f"stat -c '%U %G %a' {key_file}").split() == ["root", "rigup", "640"]
    key = on_host(lab, name, f"cat {key_file}").removeprefix("VLLM_API_KEY=")
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert key not in run.output and key not in on_host(lab, name, "ps -eo args")
    assert key not in on_host(lab, name, f"cat /etc/systemd/system/{UNIT}.d/rigup.conf /etc/rigup/vllm/tiny.env")
    ask = f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/v1/models"
    assert on_host(lab, name, ask) == "401"
    assert on_host(lab, name, ask.replace("curl ", f"curl -H 'Authorization: Bearer {key}' ")) == "200"
    assert play(name, values).totals["changed"] == 0
    play(name, recipe(stub))                  # back without the key
    assert on_host(lab, name, ask) == "200"


def test_replicas_behind_the_balancer_and_back_to_one_server(lab, host, stub):
    """replicas: 2 (pp 2: GPUs 0-1 and 2-3): units tiny-0 and tiny-1 pinned by UUID on 127.0.0.1
    port + 1 + K, HAProxy (roles/balancer) on the instance's port spreading requests over both;
    again: 0 changes; then replicas: 1 on the same port: the replicas retired, rigup's HAProxy
    stopped and disabled, the single server answers; again: 0 changes."""
    name, values = host["name"], recipe(stub)
    values["vllm_instances"]["tiny"]["replicas"] = 2
    first, again = play(name, values), play(name, values)
    print(f"vllm replicas 2: first converge {first.seconds:.1f} s, again {again.totals}")
    assert again.totals["changed"] == 0, again.changed_operations()
    uuids = on_host(lab, name, "nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    for k in (0, 1):
        info = json.loads(on_host(lab, name, f"curl -sf http://127.0.0.1:{PORT + 1 + k}/rigup-stub"))
        assert info["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids[2 * k:2 * k + 2])
        assert " ".join(info["argv"][1:]).startswith(f"serve {DEST} --host 127.0.0.1 --port {PORT + 1 + k} ")
    ask = (f"curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Content-Type: application/json' -d "
           f"'{{\"model\": \"tiny\", \"messages\": []}}' http://127.0.0.1:{PORT}/v1/chat/completions")
    codes = on_host(lab, name, f"for i in $(seq 20); do {ask}; done").split()
    rows = [r.split(",") for r in on_host(lab, name, "echo 'show stat' | socat stdio /run/haproxy/admin.sock")
            .splitlines() if r.startswith("vllm-tiny,tiny-")]
    spread = {r[1]: int(r[7]) for r in rows}
    print(f"20 chat completions through HAProxy on :{PORT}: {codes.count('200')} answered 200; "
          f"per replica (show stat stot): {spread}")
    assert codes == ["200"] * 20 and sorted(spread) == ["tiny-0", "tiny-1"] and min(spread.values()) >= 5
    single = recipe(stub)
    back, again = play(name, single), play(name, single)
    state = on_host(lab, name, "systemctl is-active haproxy; systemctl is-enabled haproxy; "
                               f"systemctl is-active {UNIT}; ls /etc/systemd/system /etc/rigup/balancer; true").split()
    print(f"vllm replicas 2 -> 1: {back.seconds:.1f} s; haproxy {state[0]}/{state[1]}, {UNIT} {state[2]}; "
          f"again {again.totals}")
    assert state[:3] == ["inactive", "disabled", "active"] and not any("tiny-" in s for s in state)
    assert again.totals["changed"] == 0, again.changed_operations()
    assert on_host(lab, name, f"for i in $(seq 3); do {ask}; done").split() == ["200"] * 3


# argv of every git and python process on the host while the wrappers are there (issue 47)
ARGV_LOG = "/var/log/rigup-lab-argv.log"
WRAP = (f"printf '%s\\n' '#!/bin/sh' 'printf \"git %s\\\\n\" \"$*\" >> {ARGV_LOG}' 'exec /usr/bin/git \"$@\"' "
        "> /usr/local/bin/git && chmod 755 /usr/local/bin/git && "
        "for d in /etc/python3.*; do cp -a $d/sitecustomize.py $d/sitecustomize.py.lab-saved 2>/dev/null; "
        f"printf '%s\\n' 'import sys' 'try:' '    open(\"{ARGV_LOG}\", \"a\").write(\"python \" + \" \".join(sys.argv) + chr(10))' "
        "'except OSError:' '    pass' "
        ">> $d/sitecustomize.py; done")
UNWRAP = ("rm -f /usr/local/bin/git; for d in /etc/python3.*; do if [ -e $d/sitecustomize.py.lab-saved ]; then "
          "mv $d/sitecustomize.py.lab-saved $d/sitecustomize.py; else rm -f $d/sitecustomize.py; fi; done")


def test_credentials_for_git_and_an_index_reach_them_from_a_root_file_only(lab, host, stub, tmp_path):
    """A git server and a package index that need a login (the lab hub's /_auth/, https, Basic):
    vllm_netrc_src on the controller becomes /etc/rigup/vllm-auth/.netrc (root, 0600); git clones
    the pin's commit and pip fetches a pinned wheel with it; the password is in no argv (git and
    every python process recorded by wrappers), the journal, pyinfra's output, the plan or a stamp;
    without vllm_netrc_src the file is removed."""
    from tests.lab import hub as hub_module, lab as lab_module

    name, user, password = host["name"], *hub_module.AUTH
    auth = hub_module.AUTH_DIR
    subprocess.run(["rm", "-rf", str(auth)], check=True)
    (auth / "wheels").mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(stub["tmp"] / "repo"), str(auth / "vllm-stub.git")], check=True)
    subprocess.run(["git", "-C", str(auth / "vllm-stub.git"), "update-server-info"], check=True)   # dumb HTTP
    subprocess.run(["python3", "-c", f"import stub_backend; stub_backend.build_wheel({str(auth / 'wheels')!r})"],
                   cwd=stub["tmp"] / "repo", check=True)
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine {lab_module.GATEWAY} login {user} password {password}\n")
    netrc.chmod(0o600)
    origin = f"https://{lab_module.GATEWAY}/_auth"
    cert = ["--cert", "/etc/ssl/certs/ca-certificates.crt"]   # the host's store holds the lab CA
    on_host(lab, name, f"rm -f {ARGV_LOG}; {WRAP}")
    hub_module.reset()
    try:
        runs = [play(name, recipe(stub, vllm_git_url=f"{origin}/vllm-stub.git", vllm_netrc_src=str(netrc),
                                  vllm_pip_args=["--no-index", "--no-build-isolation", *cert])),
                play(name, recipe(stub, vllm_git_url=None, vllm_git_commit=None, vllm_patches=[], vllm_pip_version="0.0.1",
                                  vllm_netrc_src=str(netrc),
                                  vllm_pip_args=["--no-index", "--no-cache-dir", "--find-links", f"{origin}/wheels/",
                                                 *cert]))]
        pip_pin = stub_info(lab, name)
        seen = [r for r in hub_module.requests() if r["path"].startswith("/_auth/")]
        stat = on_host(lab, name, "stat -c '%U %a' /etc/rigup/vllm-auth /etc/rigup/vllm-auth/.netrc").split()
        argv = on_host(lab, name, f"cat {ARGV_LOG}")
        looked = {"argv": argv, "pyinfra's output": "".join(r.output for r in runs),
                  "the journal": on_host(lab, name, "journalctl -q --no-pager -o cat --since -10min"),
                  "stamps and install logs": on_host(lab, name, "cat /opt/rigup/vllm/*/.rigup-* /opt/rigup/vllm/*/install.log "
                                                               "2>/dev/null; true"),
                  "units and /etc/rigup": lab.ssh(name, "grep -r '' /etc/systemd/system/rigup-* /etc/rigup/vllm* "
                                                        "--exclude=.netrc 2>/dev/null").stdout}
    finally:
        on_host(lab, name, UNWRAP)
    back = play(name, recipe(stub))    # no vllm_netrc_src: the file goes
    gone = lab.ssh(name, "test -e /etc/rigup/vllm-auth/.netrc").returncode != 0
    print(f"\n/_auth/ requests: {len(seen)} ({sum(r['auth'] for r in seen)} with credentials, "
          f"{sum(r['https'] for r in seen)} over https); recorded argv: {len(argv.splitlines())} lines "
          f"({sum('git ' in ln for ln in argv.splitlines())} git, {sum('/bin/pip install' in ln for ln in argv.splitlines())} pip); "
          f"netrc {stat}; after a converge without it: {'removed' if gone else 'still there'}\n"
          + "\n".join(f"  {r['path']} {'with' if r['auth'] else 'without'} credentials" for r in seen))
    assert pip_pin["argv"][0].startswith("/opt/rigup/vllm/pip-0.0.1/venv/bin/")
    assert any(r["auth"] and "/info/refs" in r["path"] for r in seen)                   # git, with the login
    assert any(r["auth"] and r["path"].endswith(".whl") for r in seen)                  # pip, with the login
    assert re.search(r"^git .*\b(fetch|clone)\b.*/_auth/vllm-stub\.git", argv, re.M) and "/bin/pip install" in argv
    assert stat == ["root", "700", "root", "600"] and gone
    for where, text in looked.items():
        assert password not in text, where
    assert back.returncode == 0 and "vllm: no credentials" in " ".join(back.changed_operations())
