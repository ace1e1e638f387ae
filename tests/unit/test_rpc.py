"""llama.cpp RPC across hosts (rigup/rpc.py, roles/rpc_worker, rpc_workers of roles/llama_server):
the rendered command lines, the allow-list, which hosts are workers, and the refusals (no hosts)."""

import subprocess

from rigup.refusal import Fleet
from rigup.rpc import heads_of, wait_argv
from roles.llama_server.command import dropin_text
from rigup.instances.llama_server import instances
from roles.rpc_worker.command import firewall_text, unit_text
from tests.unit.hosts import data, glm_llama, host, only, refusals

BIN = "/opt/rigup/llama.cpp/current"
MODEL = "/srv/models/m/model-f16.gguf"


def exec_lines(text: str, key: str = "ExecStart=") -> list[str]:
    return [ln[len(key):] for ln in text.splitlines() if ln.startswith(key) and ln != key]


def rpc_fleet(head_inst: dict, **worker) -> tuple[dict, Fleet]:
    """A head rig-01 (10.0.0.1) whose instance ``glm`` has ``head_inst``, and a worker rig-02 (10.0.0.2)."""
    head = data(**glm_llama(**head_inst), ssh_hostname="10.0.0.1")
    hosts = {"rig-01": head, "rig-02": data(ssh_hostname="10.0.0.2", **worker)}
    return head, Fleet("rig-01", hosts)


def test_the_two_gpu_loopback_command_lines():
    """What the lead runs on the 2x H200 machine: the head on GPU 0 with --rpc to a worker on GPU 1,
    both on loopback (the role's own renderers; the head's CUDA_VISIBLE_DEVICES as a replica's)."""
    d = data(**glm_llama(ctx=65536, parallel=8, ngl=99, flash_attn="on", rpc_workers=["gpu1"]))
    inst = instances(d)[0]["glm"]
    head = dropin_text("glm", inst, f"{BIN}/bin/llama-server", MODEL, "builds/x", "sha", "rev",
                       env={"CUDA_VISIBLE_DEVICES": "0"}, rpc=["127.0.0.1:50052"])
    worker = unit_text(f"{BIN}/bin", "127.0.0.1", 50052, ["gpu0"], "rigup", "/run/rigup/gpu-guard-tripped",
                       "builds/x", "1")
    print("head:  ", exec_lines(head, "Environment="), exec_lines(head)[0])
    print("worker:", exec_lines(worker, "Environment="), exec_lines(worker)[0])
    assert exec_lines(head) == [f"{BIN}/bin/llama-server -m {MODEL} --alias glm --host 127.0.0.1 --port 8081 -c 65536 "
                                "--parallel 8 -ngl 99 -fa on -sm layer --jinja --metrics --no-slots --rpc 127.0.0.1:50052"]
    assert exec_lines(worker) == [f"{BIN}/bin/ggml-rpc-server -H 127.0.0.1 -p 50052"]
    assert exec_lines(head, "Environment=") == ["CUDA_VISIBLE_DEVICES=0", "LLAMA_ARG_CORS_ORIGINS="]
    assert exec_lines(worker, "Environment=") == ["CUDA_VISIBLE_DEVICES=1"]
    assert "ExecStartPre=+/usr/sbin/nft -f /etc/rigup/rpc.nft" in worker.splitlines()


def test_the_head_waits_for_its_workers_within_its_bound():
    """The ExecStartPre argv, run here against a closed port: it fails after the bound, naming it."""
    closed = "127.0.0.1:9"   # discard: nothing listens there
    run = subprocess.run(wait_argv([closed], 2), capture_output=True, text=True, timeout=20)
    print(f"rc {run.returncode}: {run.stderr.strip()}")
    assert run.returncode == 1
    assert f"rigup: RPC worker {closed} does not answer (waited 2 s" in run.stderr
    d = data(**glm_llama(rpc_workers=["rig-02"], ctx=8192, parallel=1))
    text = dropin_text("glm", instances(d)[0]["glm"], "/x/llama-server", MODEL, "b", "s", "r", rpc=["10.0.0.2:50052"],
                       rpc_wait=30)
    (pre,) = [ln for ln in text.splitlines() if ln.startswith("ExecStartPre=/bin/bash")]
    assert "$$SECONDS" in pre and pre.endswith(" 30 10.0.0.2:50052")   # systemd reads $$ as $


def test_the_allow_list_admits_only_the_heads():
    text = firewall_text(50052, ["10.0.0.1", "fd00::1"])
    assert "tcp dport { 50052 } ip saddr { 10.0.0.1 } accept" in text
    assert "tcp dport { 50052 } ip6 saddr { fd00::1 } accept" in text
    assert text.index("accept") < text.index("reject with tcp reset")
    assert text.splitlines()[3:5] == ["table inet rigup_rpc", "delete table inet rigup_rpc"]   # load twice: one table


def test_workers_are_the_hosts_an_instance_names():
    hosts = {"rig-01": glm_llama(rpc_workers=["rig-02", "rig-03"]), "rig-02": glm_llama(), "rig-03": {}}
    assert heads_of("rig-02", hosts) == heads_of("rig-03", hosts) == ["rig-01"]
    assert heads_of("rig-01", hosts) == []


def test_a_good_group_passes_and_preflight_prints_the_split_and_cost():
    plan, facts = host("a100")
    head, fleet = rpc_fleet({"rpc_workers": ["rig-02"]})
    assert refusals(plan, facts, head, fleet) == []
    from roles.llama_server.checks import plan_lines
    (line,) = [ln for ln in plan_lines(plan, head) if "RPC" in ln and " slot" not in ln]
    print(line)
    assert "-ngl 99 layers split over this host's devices and the RPC workers rig-02" in line
    assert "0.8-0.9x the tok/s" in line and "slower load" in line


def test_a_worker_not_in_the_inventory_or_itself_is_refused():
    plan, facts = host("a100")
    head, fleet = rpc_fleet({"rpc_workers": ["rig-09", "rig-01"]})
    found = only(refusals(plan, facts, head, fleet), "rpc")
    assert [r.what for r in found] == ["llama_server_instances.glm.rpc_workers: rig-09",
                                       "llama_server_instances.glm.rpc_workers: rig-01"]
    assert "'rig-09' is not a host of this inventory" in found[0].why
    assert "rig-01 is this host itself" in found[1].why


def test_a_worker_without_the_rpc_server_or_another_ref_is_refused_on_both_sides():
    plan, facts = host("a100")
    head, fleet = rpc_fleet({"rpc_workers": ["rig-02"]}, llama_cpp_ref="b9000", llama_cpp_targets=["llama-server"])
    found = only(refusals(plan, facts, head, fleet), "rpc")
    whys = [r.why for r in found]
    print("\n".join(r.line("rig-01") for r in found))
    assert ("rig-01 builds llama.cpp b8779 (llama_cpp_ref) and rig-02 builds b9000: the RPC protocol is "
            "version-bound") in whys
    assert "rig-02 does not build ggml-rpc-server (its llama_cpp_targets), so it cannot run rigup-rpc" in whys
    worker = only(refusals(plan, facts, fleet.hosts["rig-02"], Fleet("rig-02", fleet.hosts)), "rpc")
    assert [r.what for r in worker] == ["llama_cpp_ref differs from its head rig-01"]
    assert "set the same llama_cpp_ref on rig-02 and rig-01" in worker[0].fix


def test_rpc_with_replicas_and_a_named_address_are_refused():
    plan, facts = host("a100")
    head, fleet = rpc_fleet({"rpc_workers": ["rig-02"], "replicas": 2})
    (r,) = only(refusals(plan, facts, head, fleet), "rpc")
    assert r.what == "llama_server_instances.glm.rpc_workers with 2 replicas"
    head, fleet = rpc_fleet({"rpc_workers": ["rig-02"]})
    fleet.hosts["rig-02"]["ssh_hostname"] = "rig-02.example.lan"
    (r,) = only(refusals(plan, facts, head, fleet), "rpc")
    assert "inventory address 'rig-02.example.lan' is not one host's IP address" in r.why
    fleet.hosts["rig-02"]["ssh_hostname"] = "fe80::1%x } accept"   # an IPv6 zone: ipaddress keeps it verbatim
    (r,) = only(refusals(plan, facts, head, fleet), "rpc")
    assert "is not one host's IP address" in r.why


def test_a_worker_takes_its_port_and_needs_systemd():
    plan, facts = host("a100", systemd=False, listening_ports={22: "sshd", 50052: "python3"})
    _, fleet = rpc_fleet({"rpc_workers": ["rig-02"]})
    found = refusals(plan, facts, fleet.hosts["rig-02"], Fleet("rig-02", fleet.hosts))
    assert sorted(r.check for r in found) == ["ports", "systemd"]
    assert any("rigup-rpc.service (the RPC worker of rig-01)" in r.what for r in found)


def group_fleet(worker_profile: str | None, ctx: int, **worker) -> tuple[dict, dict, dict, Fleet]:
    """An h100 head rig-01 (4 x 79.6 GiB) whose glm (186 GiB) has ``ctx`` and the RPC worker
    rig-02, whose plan is that of ``worker_profile`` (None: its GPUs cannot be read)."""
    plan, facts = host("h100")
    head, fleet = rpc_fleet({"rpc_workers": ["rig-02"], "ctx": ctx}, **worker)
    plans = {"rig-02": host(worker_profile)[0] if worker_profile else None}
    return plan, facts, head, Fleet("rig-01", fleet.hosts, plans.get)


def test_an_rpc_group_that_fits_over_both_hosts_passes_and_prints_the_split():
    from roles.llama_server.checks import fleet_plan_lines
    plan, facts, head, fleet = group_fleet("h100", 5_000_000)   # 186 + 150 + 8 = 344 > 318.6 alone
    assert [r.check for r in refusals(plan, facts, head, Fleet("rig-01", fleet.hosts))] == []
    assert refusals(plan, facts, head, fleet) == []
    (line,) = fleet_plan_lines(plan, head, fleet)
    print(line)
    assert line == ("llama:     glm: RPC group needs 344.0 GiB (weights 186.0 + KV 150.0 + overhead 8.0) over "
                    "rig-01 4 x 79.6 GiB (~172.0 GiB) + rig-02 4 x 79.6 GiB (~172.0 GiB) = 637.2 GiB")


def test_an_rpc_group_that_does_not_fit_is_refused_naming_the_hosts_and_key():
    plan, facts, head, fleet = group_fleet("h100", 16_000_000)   # 186 + 480 + 8 = 674 > 637.2 (ctx: at most 2**24)
    (r,) = only(refusals(plan, facts, head, fleet), "vram")
    print(r.line("rig-01"))
    assert r.what == "model glm does not fit the VRAM of llama_server_instances.glm and its RPC workers"
    assert r.why.startswith("weights 186.0 GiB + KV cache 480.0 GiB + 8.0 GiB overhead (1 GiB per GPU) = 674.0 GiB > "
                            "rig-01 4 x 79.6 GiB")
    assert "rig-02 4 x 79.6 GiB" in r.why and "llama_server_instances.glm.rpc_workers" in r.fix


def test_an_rpc_group_counts_only_the_worker_cards_it_uses_and_refuses_unknown_gpus():
    plan, facts, head, fleet = group_fleet("h100", 7_000_000, rpc_worker_cuda_devices="0")
    (r,) = only(refusals(plan, facts, head, fleet), "vram")   # 186 + 210 + 5 = 401 > 5 x 79.6 (all 4 of rig-02: fits)
    assert "rig-02 1 x 79.6 GiB" in r.why and "= 398.2 GiB" in r.why
    assert refusals(*group_fleet("h100", 7_000_000)[:3], group_fleet("h100", 7_000_000)[3]) == []
    plan, facts, head, fleet = group_fleet(None, 8192)
    (r,) = only(refusals(plan, facts, head, fleet), "vram")
    assert r.what == "llama_server_instances.glm.rpc_workers: the VRAM of rig-02 cannot be read"
