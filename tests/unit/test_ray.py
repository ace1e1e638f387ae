"""vLLM across hosts with Ray (roles/vllm/cluster.py, check_ray): the rendered units and the
refusals, without hosts."""

from rigup.refusal import Fleet
from roles.vllm import cluster
from tests.unit.hosts import data, host, only, refusals

VENV = "/opt/rigup/vllm/pip-0.33.0/venv"
SCRIPT = "/opt/rigup/vllm/bin/rigup-ray-wait"
NFT = "+/usr/sbin/nft -f /etc/rigup/ray.nft"     # the allow-list, loaded before Ray listens
PORTS = ("--node-manager-port 6380 --object-manager-port 6381 --dashboard-agent-listen-port 6382 "
         "--dashboard-agent-grpc-port 6383 --metrics-export-port 6384 --runtime-env-agent-port 6385 "
         "--min-worker-port 10002 --max-worker-port 10101")


def ray_fleet(head: dict | None = None, worker: dict | None = None) -> dict:
    """A Ray head rig-01 (10.0.0.1) and its worker rig-02 (10.0.0.2), both Ray 2.52.1."""
    return {"rig-01": data(**{"ssh_hostname": "10.0.0.1", "vllm_ray_role": "head", "vllm_ray_version": "2.52.1",
                              **(head or {})}),
            "rig-02": data(**{"ssh_hostname": "10.0.0.2", "vllm_ray_role": "worker", "vllm_ray_head": "rig-01",
                              "vllm_ray_version": "2.52.1", **(worker or {})})}


def exec_lines(text: str, key: str) -> list[str]:
    return [ln[len(key):] for ln in text.splitlines() if ln.startswith(key)]


def test_head_and_worker_units_bind_the_inventory_addresses():
    hosts = ray_fleet()
    env = cluster.node_env({"NCCL_SOCKET_IFNAME": "eth1"}, "10.0.0.1")
    head = cluster.unit_text("rig-01", hosts, VENV, env, "rigup", "/g", SCRIPT)
    worker = cluster.unit_text("rig-02", hosts, VENV, env, "rigup", "/g", SCRIPT)
    print(exec_lines(head, "ExecStart="), exec_lines(worker, "ExecStart="), sep="\n")
    assert exec_lines(head, "ExecStart=") == [f"{VENV}/bin/ray start --block --node-ip-address 10.0.0.1 "
                                              f"--disable-usage-stats {PORTS} --head --port 6379 --include-dashboard=false"]
    assert exec_lines(head, "ExecStartPre=") == [NFT]
    assert exec_lines(worker, "ExecStart=") == [f"{VENV}/bin/ray start --block --node-ip-address 10.0.0.2 "
                                                f"--disable-usage-stats {PORTS} --address 10.0.0.1:6379"]
    assert exec_lines(worker, "ExecStartPre=") == [NFT, f"{VENV}/bin/python {SCRIPT} 10.0.0.1:6379 300 10.0.0.1"]
    assert "Environment=RAY_TMPDIR=/var/lib/rigup/vllm/ray" in head.splitlines()
    assert "Environment=NCCL_SOCKET_IFNAME=eth1" in head.splitlines() and "0.0.0.0" not in head + worker
    dash = cluster.argv("rig-01", ray_fleet({"vllm_ray_dashboard": True, "vllm_host_ip": "192.168.1.1"}), VENV)
    assert dash[dash.index("--dashboard-host") + 1] == "192.168.1.1" == dash[dash.index("--node-ip-address") + 1]


def test_the_allow_list_admits_only_the_cluster_to_every_ray_port():
    hosts = ray_fleet()
    hosts["rig-03"] = data(ssh_hostname="fd00::3", vllm_ray_role="worker", vllm_ray_head="rig-01")
    hosts["rig-09"] = data(ssh_hostname="10.0.0.9")      # not a Ray node: not admitted
    text = cluster.firewall_text("rig-02", hosts)
    print(text)
    ports = "{ 6379, 6380-6385, 10002-10101 }"
    assert f"tcp dport {ports} ip saddr {{ 10.0.0.1, 10.0.0.2 }} accept" in text
    assert f"tcp dport {ports} ip6 saddr {{ fd00::3 }} accept" in text
    assert f'iifname "lo" tcp dport {ports} accept' in text
    assert text.rstrip().splitlines()[-3].strip() == f"tcp dport {ports} reject with tcp reset"
    assert text.splitlines()[3:5] == ["table inet rigup_ray", "delete table inet rigup_ray"]   # load twice: one table
    assert cluster.firewall_text("rig-01", hosts) == text     # the same list on every node
    dash = cluster.firewall_text("rig-01", ray_fleet({"vllm_ray_dashboard": True}))
    assert "tcp dport { 6379, 6380-6385, 10002-10101, 8265 } ip saddr { 10.0.0.1, 10.0.0.2 } accept" in dash


def test_a_worker_port_range_that_is_not_one_is_refused():
    plan, facts = host("h100")
    for bad in ([10101, 10002], [6000, 6400], [10002]):
        hosts = ray_fleet(worker={"vllm_ray_worker_ports": bad})
        (refusal,) = only(refusals(plan, facts, hosts["rig-02"], Fleet("rig-02", hosts)), "ray")
        print(refusal.line("rig-02"))
        assert refusal.what.startswith("vllm_ray_worker_ports")


def test_the_head_instance_waits_for_every_node():
    hosts = ray_fleet()
    hosts["rig-03"] = data(ssh_hostname="10.0.0.3", vllm_ray_role="worker", vllm_ray_head="rig-01")
    assert cluster.workers_of("rig-01", hosts) == ["rig-02", "rig-03"]
    assert cluster.expected("rig-01", hosts) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert cluster.instance_env("rig-01", hosts)["RAY_ADDRESS"] == "10.0.0.1:6379"


def test_a_good_cluster_passes_with_pp_beyond_the_head_gpus():
    plan, facts = host("h100")    # 4 GPUs; pp 8 spans the cluster
    hosts = ray_fleet({"vllm_instances": {"q": {"model": "q", "port": 8000, "pp": 8}},
                       "models": {"q": {"repo": "a/b", "revision": "0" * 40}}})
    assert refusals(plan, facts, hosts["rig-01"], Fleet("rig-01", hosts)) == []
    assert refusals(plan, facts, hosts["rig-02"], Fleet("rig-02", hosts)) == []


def test_another_ray_or_vllm_version_is_refused_on_both_sides():
    plan, facts = host("h100")
    hosts = ray_fleet(worker={"vllm_ray_version": "2.60.0", "vllm_pip_version": "0.34.0"})
    found = only(refusals(plan, facts, hosts["rig-02"], Fleet("rig-02", hosts)), "ray")
    print("\n".join(r.line("rig-02") for r in found))
    assert [r.what for r in found] == ["vllm_ray_version differs from Ray node rig-01",
                                       "vllm_pip_version differs from Ray node rig-01"]
    assert "rig-02 has '2.60.0' and rig-01 has '2.52.1'" in found[0].why
    head = only(refusals(plan, facts, hosts["rig-01"], Fleet("rig-01", hosts)), "ray")
    assert [r.what for r in head][0] == "vllm_ray_version differs from Ray node rig-02"


def test_a_worker_without_a_head_or_pin_is_refused():
    plan, facts = host("h100")
    hosts = ray_fleet(worker={"vllm_ray_head": "rig-09", "vllm_ray_version": None})
    found = only(refusals(plan, facts, hosts["rig-02"], Fleet("rig-02", hosts)), "ray")
    assert [r.what for r in found] == ["vllm_ray_version", "vllm_ray_head: 'rig-09'"]


def test_a_ray_node_port_held_by_another_process_is_refused():
    """Ray's six node ports on every node (the GCS port on the head) are checked like a server's:
    Ray's own processes (a converge again) pass, another process is named."""
    hosts = ray_fleet()
    ours = {6379: "gcs_server", 6380: "raylet", 6381: "raylet", 6385: "python3", 22: "sshd"}
    for name in hosts:
        plan, facts = host("h100", listening_ports=ours)
        assert refusals(plan, facts, hosts[name], Fleet(name, hosts)) == []
    plan, facts = host("h100", listening_ports={**ours, 6383: "nginx"})
    found = only(refusals(plan, facts, hosts["rig-02"], Fleet("rig-02", hosts)), "ports")
    print("\n".join(r.line("rig-02") for r in found))
    assert [r.what for r in found] == ["port 6383 of vllm_ray_node_port..+5 (Ray's node port 6383) is already taken"]
    assert "process nginx" in found[0].why
