"""vLLM across two lab hosts with Ray (roles/vllm/cluster.py): Ray from PyPI (through the lab's
proxy) in the vLLM virtualenv of both hosts, rigup-ray.service as head on lab1 and worker on lab2,
the cluster formed by the units (``ray status`` on the head shows 2 nodes), and the head's vLLM
instance (the stand-in engine, tests/lab/vllm_stub.py: the lab has no GPU) started only once every
node has joined, with ``--distributed-executor-backend ray``. The play runs preflight, base, vllm
and the balancer only (tests/roles/vllm_only.py)."""

import json
import re
import shlex
import subprocess

import pytest

from rigup import config
from tests.conftest import on_host
from tests.converge import pyinfra
from tests.lab import vllm_stub

pytestmark = pytest.mark.lab
PLAY = "tests/roles/vllm_only.py"
HEAD, WORKER, OTHER = "lab1", "lab2", "lab3"
UNIT, INSTANCE = "rigup-ray.service", "rigup-vllm@tiny.service"
DEST = "/srv/models/tiny-stub"
REV = "1" * 40
PORT = 8095
RAY_VERSION = "2.52.1"
STUB_URL = "file:///root/vllm-stub/vllm-stub.git"
VENV = "/opt/rigup/vllm/git-*/venv"


@pytest.fixture(scope="module")
def stub(tmp_path_factory, lab):
    """The stand-in vLLM's bare repository on both hosts (a worker needs the same virtualenv)."""
    tmp = tmp_path_factory.mktemp("vllm-stub")
    commit = vllm_stub.make_repo(tmp / "repo")
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp / "repo"), str(tmp / "vllm-stub.git")], check=True)
    tar = subprocess.run(["tar", "c", "-C", str(tmp), "vllm-stub.git"], check=True, capture_output=True).stdout
    for name in (HEAD, WORKER):
        subprocess.run(lab.ssh_argv(name) + ["--", "rm -rf /root/vllm-stub && mkdir -p /root/vllm-stub && "
                                             "tar x -C /root/vllm-stub"], input=tar, check=True)
    return commit


def run(commit: str, check: bool = True, worker_over: dict | None = None, **head_over):
    """The play on lab1 (Ray head, the instance) and lab2 (its worker)."""
    lab_vars = config.load_yaml(config.GROUP_VARS_DIR / "lab.yml")
    common = {"models": {**lab_vars["models"], "tiny": {"repo": "rigup-lab/tiny-stub", "revision": REV, "dest": DEST}},
              "vllm_git_url": STUB_URL, "vllm_git_commit": commit,
              "vllm_pip_args": ["--no-index", "--no-build-isolation"], "vllm_health_timeout": 120,
              "vllm_ray_wait_seconds": 120,
              # small nodes: the lab's 2 cores and RAM are shared (Ray's default store is 30% of RAM)
              "vllm_ray_args": ["--num-cpus", "1", "--object-store-memory", "80000000"]}
    instance = {"model": "tiny", "port": PORT, "pp": 2, "pp_partition": "3,3", "layers": 6,
                "gpu_memory_utilization": 0.5, "extra_args": ["--enforce-eager"]}
    hosts = {HEAD: {"vllm_ray_role": "head", "vllm_ray_version": RAY_VERSION, "vllm_instances": {"tiny": instance},
                    **head_over},      # host data: --data would set it on every host, over this
             WORKER: {"vllm_ray_role": "worker", "vllm_ray_head": HEAD, "vllm_ray_version": RAY_VERSION,
                      **(worker_over or {})}}
    data = [a for k, v in common.items() for a in ("--data", f"{k}={json.dumps(v)}")]
    result = pyinfra("inventory/lab.py", PLAY, "--limit", HEAD, "--limit", WORKER, *data, timeout=900,
                     env={"RIGUP_LAB_HOST_DATA": json.dumps(hosts)})
    if check and result.returncode != 0:
        from tests.lab import lab
        journals = {h: lab.ssh(h, f"journalctl -u {UNIT} --no-pager -o cat | tail -40").stdout for h in (HEAD, WORKER)}
        raise AssertionError(f"{result.output[-4000:]}\n{json.dumps(journals, indent=1)}")
    return result


@pytest.fixture(scope="module")
def ray(lab, stub):
    """The model's marker on the head, then the play twice; everything Ray and vLLM removed after."""
    marker = json.dumps({"repo": "rigup-lab/tiny-stub", "revision": REV, "files": ["config.json"], "bytes": 2})
    on_host(lab, HEAD, f"mkdir -p {DEST} && echo '{{}}' > {DEST}/config.json && "
                       f"printf '%s' {shlex.quote(marker)} > {DEST}/.rigup-complete.json && chmod -R a+rX {DEST}")
    try:
        first = run(stub)
        again = run(stub)
        print(f"\nRay cluster (2 nodes) first converge: {first.seconds:.1f} s; again: {again.seconds:.1f} s")
        yield {"first": first, "again": again, "addresses": {h["name"]: h["address"] for h in lab.hosts()}}
    finally:
        for name in (HEAD, WORKER):
            lab.ssh(name, f"systemctl disable --now {INSTANCE} {UNIT} 2>/dev/null; "
                          "nft delete table inet rigup_ray 2>/dev/null; rm -f /etc/rigup/ray.nft; "
                          "rm -rf /etc/systemd/system/rigup-vllm@* /etc/systemd/system/rigup-ray.service /etc/rigup/vllm "
                          f"/root/vllm-stub /opt/rigup/vllm {DEST} /var/lib/rigup/vllm; systemctl daemon-reload")


def ray_status(lab, addresses) -> str:
    return on_host(lab, HEAD, f"{VENV}/bin/ray status --address {addresses[HEAD]}:6379 2>&1")


def test_the_units_form_a_two_node_cluster(lab, ray):
    status = ray_status(lab, ray["addresses"])
    print(f"\nray status on {HEAD}:\n{status}")
    active = status.split("Active:", 1)[1].split("Pending:", 1)[0]
    assert len(re.findall(r"^\s*1 node_[0-9a-f]+", active, re.M)) == 2, status
    for name in (HEAD, WORKER):
        version = on_host(lab, name, f"{VENV}/bin/ray --version").strip()
        assert version.endswith(RAY_VERSION), version
        assert on_host(lab, name, f"systemctl is-active {UNIT}").strip() == "active"
    args = on_host(lab, WORKER, "ps -eo args | grep '[r]ay start'")
    assert f"--address {ray['addresses'][HEAD]}:6379" in args and f"--node-ip-address {ray['addresses'][WORKER]}" in args


def test_ray_binds_no_dashboard_and_runs_as_rigup(lab, ray):
    listening = on_host(lab, HEAD, "ss -ltnpH")
    print(f"\nlisteners on {HEAD}:\n{listening}")
    assert ":8265 " not in listening      # the dashboard is off by default
    users = on_host(lab, HEAD, f"ps -o user= -p $(systemctl show -p MainPID --value {UNIT})").strip()
    assert users == "rigup"


def test_the_head_instance_runs_on_the_cluster(lab, ray):
    assert on_host(lab, HEAD, f"systemctl is-active {INSTANCE}").strip() == "active"
    info = json.loads(on_host(lab, HEAD, f"curl -sf http://127.0.0.1:{PORT}/rigup-stub"))
    line = " ".join(info["argv"][1:])
    print(f"\nvllm (stub) on {HEAD}: {line}")
    assert "--pipeline-parallel-size 2" in line and "--distributed-executor-backend ray" in line
    assert info["env"]["RAY_ADDRESS"] == f"{ray['addresses'][HEAD]}:6379"
    assert info["env"]["VLLM_PP_LAYER_PARTITION"] == "3,3"
    journal = on_host(lab, HEAD, f"journalctl -u {INSTANCE} --no-pager -o cat")
    assert f"has every expected node: {ray['addresses'][HEAD]}, {ray['addresses'][WORKER]}" in journal


def test_second_run_changes_nothing(ray):
    print(f"\nsecond converge: {ray['again'].totals}")
    assert ray["again"].totals["changed"] == 0, ray["again"].changed_operations()


def probe(lab, name: str, address: str, port: int) -> str:
    """What host ``name`` gets connecting to ``address``:``port`` (``rc=0``: connected)."""
    return on_host(lab, name, f"timeout 5 bash -c ': <>/dev/tcp/{address}/{port}' 2>&1; echo rc=$?").strip()


def test_only_the_cluster_reaches_rays_ports(lab, ray):
    """lab3, not a Ray node, gets a reset on the head's GCS port and a raylet port; the worker connects."""
    lab.up(1, "none", first=3)     # removed when the module ends (tests/conftest.py)
    head = ray["addresses"][HEAD]
    for port in (6379, 6380):      # the GCS; the raylet (vllm_ray_node_port)
        outside, member = probe(lab, OTHER, head, port), probe(lab, WORKER, head, port)
        print(f"\n{OTHER} -> {head}:{port}: {outside}\n{WORKER} -> {head}:{port}: {member}")
        assert outside.endswith("rc=1") and "refused" in outside
        assert member == "rc=0"
    table = on_host(lab, HEAD, "nft list table inet rigup_ray")
    print(table)
    assert f"ip saddr {{ {head}, {ray['addresses'][WORKER]} }} accept" in table


def test_every_port_ray_listens_on_is_pinned(lab, ray):
    """Ray's listeners on the head (TCP, beyond loopback) all lie in the allow-list's ports."""
    allowed = {6379, *range(6380, 6386), *range(10002, 10102)}
    listening = on_host(lab, HEAD, "ss -ltnpH")
    ray_lines = [ln for ln in listening.splitlines() if re.search(r'"(gcs_server|raylet|ray::|python|default_worker|'
                                                                 r'agent|dashboard)', ln) and "127.0.0.1:" not in ln]
    ports = sorted({int(ln.split()[3].rsplit(":", 1)[1]) for ln in ray_lines})
    print(f"\nRay's listeners on {HEAD}: {ports}; outside the list: {sorted(set(ports) - allowed)}\n" + "\n".join(ray_lines))
    assert ports and set(ports) <= allowed


def test_another_ray_version_is_refused_naming_host_and_key(ray, stub):
    result = run(stub, check=False, vllm_ray_version="2.52.0")
    assert result.returncode != 0
    line = next(ln for ln in result.output.splitlines() if "vllm_ray_version differs" in ln)
    print(f"\n{line.strip()}")
    assert "lab1 has '2.52.0' and lab2 has '2.52.1'" in result.output


def test_a_missing_worker_holds_the_head_instance_and_is_named(lab, ray):
    on_host(lab, WORKER, f"systemctl stop {UNIT}")
    try:
        wait = on_host(lab, HEAD, f"systemctl show -p ExecStartPre --value {INSTANCE} | grep -o 'argv\\[\\]=[^;]*rigup-ray-wait[^;]*'")
        argv = wait.split("=", 1)[1].strip().split()
        argv[3] = "20"       # the same wait, bounded at 20 s
        out = lab.ssh(HEAD, "runuser -u rigup -- " + " ".join(shlex.quote(a) for a in argv), timeout=300)
        print(f"\nrc {out.returncode}: {out.stderr.strip()}")
        assert out.returncode == 1 and f"lacks node(s) {ray['addresses'][WORKER]}" in out.stderr
    finally:
        on_host(lab, WORKER, f"systemctl start {UNIT}")


def test_a_node_no_longer_wanted_is_retired(lab, ray, stub):
    result = run(stub, worker_over={"vllm_ray_role": None})
    print(f"\nchanged: {result.changed_operations()}")
    assert lab.ssh(WORKER, f"test -e /etc/systemd/system/{UNIT}").returncode == 1
    assert lab.ssh(WORKER, "pgrep -f 'ray start'").returncode == 1
    assert lab.ssh(WORKER, "nft list table inet rigup_ray").returncode == 1     # its allow-list gone too
    print(ray_status(lab, ray["addresses"]).split("Pending:")[0])   # the worker drops out once its heartbeats stop
    assert on_host(lab, HEAD, f"systemctl is-active {INSTANCE}").strip() == "active"   # waits for the head alone
