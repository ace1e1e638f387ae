"""The pure replica planning of roles/llama_server (replicas.py), each replica's command line
(command.py), the balancer's config (roles/balancer/config.py) and their refusals."""

from rigup.gpu.plan import format_plan, hardware_plan
from roles.balancer.config import gateway_backends, haproxy_cfg
from roles.llama_server.checks import plan_lines, ports
from roles.llama_server.command import replica_commands, servers
from roles.llama_server.replicas import layout, layout_text
from roles.llama_server.replicas import sized as resolve
from rigup.instances.llama_server import instances
from tests.unit.hosts import GLM, REV, data, host, only, refusals

GEMMA = {"repo": "rigup-lab/gemma-3-270m-GGUF", "revision": REV, "size_gib": 0.25}


def sized(gib: float, **inst) -> dict:
    """A host's data with one instance ``m`` of a model of ``gib`` GiB (family unknown: no KV)."""
    return data(models={"m": {"repo": "acme/m-GGUF", "revision": REV, "size_gib": gib}},
                llama_server_instances={"m": {"model": "m", "port": 8081, **inst}})


def laid(profile_or_plan, d: dict):
    plan = host(profile_or_plan)[0] if isinstance(profile_or_plan, str) else profile_or_plan
    inst = instances(d)[0]["m"]
    return layout(inst, d["models"]["m"], plan, d)


def test_a_model_that_fits_two_a100s_gives_4_replicas_of_2():
    lay = laid("a100", sized(120, replicas="auto", gpus_per_replica="auto"))   # 120 + 2 > 80, <= 160
    print(layout_text("glm", lay))
    assert [[c["index"] for c in g] for g in lay.groups] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout_text("glm", lay) == "glm: 4 replicas x 2 GPUs (GPU 0-1, 2-3, 4-5, 6-7)"


def test_a_model_that_fits_one_h100_gives_4_replicas_of_1():
    lay = laid("h100", sized(30, replicas="auto"))
    assert lay.replicas == 4 and [len(g) for g in lay.groups] == [1, 1, 1, 1] and not lay.problem
    assert layout_text("q", lay) == "q: 4 replicas x 1 GPUs (GPU 0, 1, 2, 3)"


def test_a_model_that_needs_more_than_half_keeps_one_server_over_every_gpu():
    lay = laid("a100", sized(400, replicas="auto", gpus_per_replica="auto"))   # needs 6 of 8
    assert lay.replicas == 1 and len(lay.groups[0]) == 8


def test_defaults_are_todays_single_server():
    lay = laid("a100", sized(120))
    assert lay.replicas == 1 and len(lay.groups[0]) == 8
    assert [p.port for p in ports(*host("a100")[:1], sized(120))] == [8081]


def test_a_model_that_fits_nowhere_is_refused():
    plan, facts = host("h100")
    found = only([r for r in refusals(plan, facts, sized(400, replicas="auto", gpus_per_replica="auto"))
                  if r.check != "ports"], "vram")
    print(found[0].line("h100"))
    assert "400.0 GiB" in found[0].why


def test_a_replica_too_small_for_the_model_is_refused():
    plan, facts = host("a100")
    found = only(refusals(plan, facts, sized(120, replicas=8)), "vram")
    assert "per replica (8 replicas)" in found[0].why and "1 x 80.0 GiB" in found[0].why


def test_more_gpus_than_the_host_has_is_refused():
    plan, facts = host("h100")
    found = only(refusals(plan, facts, sized(10, replicas=3, gpus_per_replica=2)), "replicas")
    assert "3 replicas x 2 GPUs = 6 GPUs, but this host has 4" in found[0].why


def test_a_main_gpu_beyond_a_servers_own_gpus_is_refused():
    plan, facts = host("h100")
    found = only(refusals(plan, facts, sized(10, replicas=2, gpus_per_replica=2, main_gpu=2)), "replicas")
    assert found[0].what == "llama_server_instances.m.main_gpu is 2, but each of its servers has 2 GPUs (0..1)"
    assert not refusals(plan, facts, sized(10, replicas=2, gpus_per_replica=2, main_gpu=1))


def test_bad_values_are_refused_by_key_path():
    plan, facts = host("h100")
    found = only(refusals(plan, facts, sized(10, replicas=0, gpus_per_replica="many")), "config")
    assert [r.what for r in found] == ["llama_server_instances.m.replicas", "llama_server_instances.m.gpus_per_replica"]


def test_cpu_host_runs_n_replicas_without_pinning():
    plan = hardware_plan([], {"loaded": False}, [])
    d = sized(0.25, replicas=2, ngl=0)
    d["gpu_enabled"] = False
    lay = laid(plan, d)
    assert lay.replicas == 2 and not lay.gpu
    assert plan_lines(plan, d) == ["llama:     m: 2 replicas on the CPU", "llama:     m: 1 slot of 8,192 tokens "
                                   "(on the CPU: rigup sizes slots from the VRAM only)"]
    inst = resolve(instances(d)[0]["m"], d["models"]["m"], plan, d)[0]
    runs = replica_commands("m", inst, lay, "/bin/llama-server", "/m.gguf")
    assert "-c 8192 --parallel 1" in " ".join(runs[0]["argv"])
    assert [r["unit"] for r in runs] == ["m-0", "m-1"] and [r["env"] for r in runs] == [{}, {}]
    assert "--port 8082" in " ".join(runs[0]["argv"]) and "--port 8083" in " ".join(runs[1]["argv"])
    assert "--host 127.0.0.1" in " ".join(runs[1]["argv"]) and "--alias m" in " ".join(runs[1]["argv"])
    assert [(p.port, p.owners) for p in ports(plan, d)] == [
        (8081, ("haproxy", "llama-server")), (8082, ("llama-server",)), (8083, ("llama-server",))]


def test_one_server_takes_its_port_back_from_the_balancer_of_its_replicas_only():
    """replicas: 2 -> 1 on the same port: HAProxy holds it at preflight; rigup's (the host has
    rigup-llama@m-K units) is no refusal, another HAProxy, or one with no replicas of m, is."""
    plan, facts = host("a100")
    d, held = sized(10), {**facts, "listening_ports": {8081: "haproxy"}}
    assert only(refusals(plan, held, d), "ports")[0].what == "port 8081 of llama_server_instances.m is already taken"
    had = {**plan, "serving_units": ["rigup-llama@m-0", "rigup-llama@m-1", "rigup-llama@mm-0"]}
    assert [r for r in refusals(had, held, d) if r.check == "ports"] == []
    other = {**plan, "serving_units": ["rigup-llama@mm-0"]}
    assert only(refusals(other, held, d), "ports")


def test_replicas_are_pinned_by_uuid_and_ports_collide_in_preflight():
    plan, facts = host("a100")
    d = sized(120, replicas="auto", gpus_per_replica="auto", host="0.0.0.0", api_key=True)
    inst, lay, _ = resolve(instances(d)[0]["m"], d["models"]["m"], plan, d)
    runs = replica_commands("m", inst, lay, "/bin/llama-server", "/m.gguf")
    uuids = [c["uuid"] for c in plan["cards"]]
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in runs] == [",".join(uuids[i:i + 2]) for i in (0, 2, 4, 6)]
    assert "--api-key-file /etc/rigup/llama-server/m.key" in " ".join(runs[3]["argv"])
    d["llama_server_instances"]["other"] = {"model": "m", "port": 8083}
    found = [r for r in refusals(plan, facts, d) if r.check == "ports"]
    assert found and "llama_server_instances.m (replica 1)" in found[0].why


def test_haproxy_config_and_gateway():
    hosts = {"gw": {"balancer_gateway": True},
             "lab1": {"ssh_hostname": "10.0.0.11", "llama_server_instances": {"gemma": {"model": "g", "port": 8081}}},
             "lab2": {"ssh_hostname": "10.0.0.12", "llama_server_instances": {"gemma": {"model": "g", "port": 8081}},
                      "rigup_maintenance": True}}
    gateway = gateway_backends("gw", hosts, "0.0.0.0")
    assert gateway == [{"name": "gateway-gemma", "bind": "0.0.0.0", "port": 8081,
                        "servers": [["lab1", "10.0.0.11", 8081, False], ["lab2", "10.0.0.12", 8081, True]],
                        "key": False, "allow": []}]
    text = haproxy_cfg(gateway, data())
    assert "rigup-fleet-key" not in text
    for line in ("bind 0.0.0.0:8081", "balance leastconn", "option httpchk GET /health",
                 "http-check expect status 200", "server lab1 10.0.0.11:8081 check\n",
                 "server lab2 10.0.0.12:8081 check disabled\n", "retry-on conn-failure",
                 "bind 127.0.0.1:8404", "use-service prometheus-exporter", "stats socket /run/haproxy/admin.sock",
                 "http-request deny deny_status 403 if !METH_GET { path,url_dec -m sub /models }"):   # issue 49
        assert line in text, line


def test_a_gateway_checks_the_fleet_key_of_keyed_instances_only():
    hosts = {"gw": {"balancer_gateway": True},
             "lab1": {"llama_server_instances": {"gemma": {"model": "g", "port": 8081, "api_key": True},
                                                   "open": {"model": "g", "port": 8090}}},
             "lab2": {"llama_server_instances": {"gemma": {"model": "g", "port": 8081, "api_key": True}}}}
    gateway = gateway_backends("gw", hosts, "0.0.0.0", fleet_key=True)
    assert {b["name"]: b["key"] for b in gateway} == {"gateway-gemma": True, "gateway-open": False}
    assert not any(b["key"] for b in gateway_backends("gw", hosts, "0.0.0.0"))   # per-host keys: forwarded only
    text = haproxy_cfg(gateway, data())
    gemma, open_ = text.split("frontend gateway-gemma")[1], text.split("frontend gateway-open")[1]
    check = ("http-request deny deny_status 401 unless { path /health } || "
             "{ req.hdr(authorization) -m str -f /etc/haproxy/rigup-fleet-key.lst }")
    assert check in gemma.split("backend ")[0] and check not in open_


def test_the_fleet_key_is_one_root_only_file_on_the_controller(tmp_path):
    from rigup.secrets import fleet_api_key
    src = tmp_path / "rigup" / "api-key"
    assert fleet_api_key({"fleet_api_key": False, "fleet_api_key_src": str(src)}) is None and not src.exists()
    key = fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    assert len(key) == 64 and oct(src.stat().st_mode & 0o777) == "0o600"
    assert fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)}) == key


def test_vllm_replicas_are_served_pinned_and_balanced():
    from roles.vllm import command as vcmd
    from roles.vllm.checks import plan_lines as vllm_lines
    from roles.vllm.checks import ports as vllm_ports
    from roles.vllm.checks import replica_groups
    from rigup.instances.vllm import instances as vllm_instances
    plan, facts = host("h100")
    d = data(models={"m": {"repo": "acme/m", "revision": REV, "size_gib": 10}},
             vllm_instances={"m": {"model": "m", "port": 8081, "tp": 2, "replicas": "auto", "api_key": True}})
    assert vllm_lines(plan, d) == ["vllm:      vllm==0.33.0 from PyPI", "vllm:      m: 2 replicas x 2 GPUs (GPU 0-1, 2-3)"]
    assert [r for r in refusals(plan, facts, d) if r.check not in ("vllm_cc",)] == []
    assert [(p.port, p.owners) for p in vllm_ports(plan, d)] == [
        (8081, ("haproxy", "vllm")), (8082, ("vllm",)), (8083, ("vllm",))]
    inst = vllm_instances(d)[0]["m"]
    srv = vcmd.servers("m", inst, replica_groups(plan, inst), plan)
    uuids = [c["uuid"] for c in plan["cards"]]
    assert [(s["unit"], s["inst"]["host"], s["inst"]["port"], s["gpus"]) for s in srv] == [
        ("m-0", "127.0.0.1", 8082, "0,1"), ("m-1", "127.0.0.1", 8083, "2,3")]
    assert srv[1]["env"] == {"CUDA_VISIBLE_DEVICES": ",".join(uuids[2:4])}
    hooks = {"ready": ["/opt/rigup/bin/rigup-balancer-drain", "ready", "vllm-m", "m-1", "8083"],
             "drain": ["/opt/rigup/bin/rigup-balancer-drain", "drain", "vllm-m", "m-1"]}
    text = vcmd.dropin_text("m", srv[1]["inst"], "/v", "/srv/m", "/srv/m/.rigup-complete.json", "u", "s", "e", "r",
                            ["/w"], unit="m-1", balancer=hooks)
    for line in ("EnvironmentFile=/etc/rigup/vllm/m-1.env", "EnvironmentFile=/etc/rigup/vllm/m.key",
                 "--host 127.0.0.1 --port 8083", "--served-model-name m",
                 "ExecStartPost=-+/opt/rigup/bin/rigup-balancer-drain ready vllm-m m-1 8083",
                 "ExecStop=-+/opt/rigup/bin/rigup-balancer-drain drain vllm-m m-1"):
        assert line in text, line
    one = vcmd.dropin_text("m", inst, "/v", "/srv/m", "/srv/m/.rigup-complete.json", "u", "s", "e", "r", ["/w"])
    assert "ExecStop" not in one and "EnvironmentFile=/etc/rigup/vllm/m.env" in one
    d["vllm_instances"]["m"]["replicas"] = 3
    assert "this host has 4" in only([r for r in refusals(plan, facts, d) if r.check != "vllm_cc"], "replicas")[0].why


PURE = """
import importlib.util, json, sys
sys.modules['pyinfra'] = None
sys.path.insert(0, '.')
def load(path):
    spec = importlib.util.spec_from_file_location('m_' + path.rsplit('/', 1)[1][:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
from rigup.gpu.plan import hardware_plan
replicas, command = load('roles/llama_server/replicas.py'), load('roles/llama_server/command.py')
gpus = [{'index': i, 'uuid': f'GPU-{i}', 'bus_id': f'00000000:0{i}:00.0', 'pci_device_id': '0x233510DE',
         'compute_capability': [9, 0], 'memory_total_mib': 143771} for i in range(2)]
plan = hardware_plan(gpus, {'version': '580.159.04', 'loaded': True}, [])
inst = {'model': 'bench', 'port': 8181, 'host': '127.0.0.1', 'ctx': 65536, 'parallel': 8, 'ngl': 99,
        'flash_attn': 'on', 'split_mode': 'layer', 'tensor_split': None, 'jinja': True, 'metrics': True,
        'api_key': False, 'extra_args': [], 'replicas': 'auto', 'gpus_per_replica': 'auto'}
lay = replicas.layout(inst, {'repo': 'x/llama-8b', 'size_gib': 13.5}, plan, {'gpu_enabled': True})
print(replicas.layout_text('bench', lay))
print(json.dumps(command.replica_commands('bench', inst, lay, '/b/llama-server', '/m.gguf')))
"""


def test_replica_commands_for_a_2_gpu_plan_without_pyinfra():
    """What the lead runs on a 2-GPU machine: both modules load by path with pyinfra unimportable."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", PURE], capture_output=True, text=True, timeout=60,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0, out.stderr
    line, runs = out.stdout.splitlines()[0], json.loads(out.stdout.splitlines()[1])
    assert line == "bench: 2 replicas x 1 GPUs (GPU 0, 1)"
    assert [(r["unit"], r["env"]["CUDA_VISIBLE_DEVICES"]) for r in runs] == [("bench-0", "GPU-0"), ("bench-1", "GPU-1")]
    assert runs[1]["argv"][:7] == ["/b/llama-server", "-m", "/m.gguf", "--alias", "bench", "--host", "127.0.0.1"]
    assert "--port" in runs[1]["argv"] and runs[1]["argv"][runs[1]["argv"].index("--port") + 1] == "8183"


def test_a_downtrained_card_is_flagged_and_is_not_the_main_gpu():
    """GPU 0 of 8 A100s at x4 of x16: the plan warns, names another main GPU, and the one server
    over every GPU lists GPU 0 last in CUDA_VISIBLE_DEVICES (its device 0 is the main GPU); with
    tensor_split set, the order stays and the plan says so. A healthy host gets no pin (no change)."""
    plan, facts = host("a100")
    slow = [dict(g, pcie_width=4) if g["index"] == 0 else g for g in facts["gpus"]]
    bad = hardware_plan(slow, facts["driver"], [])
    assert bad["cards"][0]["link"] == {"link": "x4 Gen4", "downtrained": True, "why": "x4 of x16"}
    assert "GPU 0 (00000000:07:00.0): PCIe x4 of x16 DOWNTRAINED" in format_plan(bad)
    d = data(llama_cpp_backend="cuda", models={"glm": GLM},
             llama_server_instances={"glm": {"model": "glm", "port": 8080, "ctx": 8192, "parallel": 1}})
    lines = plan_lines(bad, d)
    print("\n".join(lines))
    assert "llama:     glm: main GPU 1 (its first visible device); GPU 0 (x4 of x16) last" in lines
    inst = instances(d)[0]["glm"]
    (one,) = servers("glm", inst, layout(inst, d["models"]["glm"], bad, d))
    uuids = one["env"]["CUDA_VISIBLE_DEVICES"].split(",")
    assert uuids[-1] == bad["cards"][0]["uuid"] and uuids[0] == bad["cards"][1]["uuid"] and len(uuids) == 8
    (healthy,) = servers("glm", inst, layout(inst, d["models"]["glm"], plan, d))
    assert healthy["env"] == {}
    split = {**inst, "tensor_split": "1,1,1,1,1,1,1,1"}
    assert servers("glm", split, layout(split, d["models"]["glm"], bad, d))[0]["env"] == {}
    d["llama_server_instances"]["glm"]["tensor_split"] = "1,1,1,1,1,1,1,1"
    assert any("keep tensor_split's order" in ln for ln in plan_lines(bad, d))


def test_row_split_over_narrow_links_gets_a_plan_line_preferring_layer_split():
    """6 CMP 170HX at x4 (the reports: Gen2 x4, no P2P) with -sm row: the plan says layer split is
    the faster choice and why, and keeps the setting; layer split, or 8 A100s at x16, say nothing."""
    plan, _ = host("cmp170hx")
    d = data(llama_cpp_backend="cuda", models={"glm": GLM},
             llama_server_instances={"glm": {"model": "glm", "port": 8080, "ctx": 8192, "parallel": 1, "split_mode": "row"}})
    lines = [ln for ln in plan_lines(plan, d) if "narrow links" in ln]
    print("\n".join(lines))
    assert lines and lines[0].startswith("llama:     glm: split_mode row over narrow links (GPU 0 x4 Gen1, GPU 1 x4 Gen1")
    assert lines[0].endswith("split_mode layer moves them once per card and is the faster choice here (the reports' "
                             "recipes chose it for this); rigup keeps your setting")
    d["llama_server_instances"]["glm"]["split_mode"] = "layer"
    assert not [ln for ln in plan_lines(plan, d) if "narrow links" in ln]
    d["llama_server_instances"]["glm"]["split_mode"] = "row"
    assert not [ln for ln in plan_lines(host("a100")[0], d) if "narrow links" in ln]
