"""Round 10 of issue 61, lesser cases: each refused at its reader (see /tmp/redteam/round10.md)."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api.exceptions import InventoryError

from plays import fleet
from rigup.boundary.numbers import whole


def test_n1_build_ratio_strips_ascii_blanks_alone():
    """N1: 'ratio=1.5\\x85' read 1.5 (str.strip() inside next() took U+0085); ASCII's blanks alone now."""
    for line, want in (("ratio=1.5\x85", None), ("ratio=1.5\u2028", None), ("ratio=1.5\xa0", None),
                       ("ratio= 1.5\t\r", 1.5), ("ratio=1.02", 1.02)):
        got = fleet.parse_build_ratio([line])
        print(f"parse_build_ratio([{line!r}]) -> {got!r} (want {want!r})")
        assert got == want


VAGRANT = Path(__file__).resolve().parents[2] / "inventory" / "vagrant.py"
BLOCK = "Host rigup-vm1\n  HostName 127.0.0.1\n  Port {}\n  IdentityFile /x/.vagrant/machines/rigup-vm1/libvirt/private_key\n"


def _vagrant() -> dict:
    """inventory/vagrant.py's functions, without its `vagrant ssh-config` call."""
    ns: dict = {"__file__": str(VAGRANT)}
    exec(compile(VAGRANT.read_text().split("\nvagrant = ")[0], str(VAGRANT), "exec"), ns)
    return ns


def test_i1_vagrant_port_is_the_boundarys_whole_number():
    """I1: inventory/vagrant.py read Port with int() ('٢٢٢٢', '2_222' -> 2222; 99999, 0 kept; '²' a traceback)."""
    ns, block = _vagrant(), BLOCK
    for port in ("\u0662\u0662\u0662\u0662", "2_222", "\u00b2", "99999", "0", "-22", "2222\x85", "0x16"):
        with pytest.raises(InventoryError) as e:
            ns["_host"](ns["_ssh_configs"](block.format(port))[0])
        print(f"Port {port!r}: refused: {e.value}")
        assert "rigup-vm1" in str(e.value)
    for port, want in (("2222", 2222), ("65535", 65535)):
        got = ns["_host"](ns["_ssh_configs"](block.format(port))[0])[1]["ssh_port"]
        print(f"Port {port!r} -> {got}")
        assert got == want


@settings(max_examples=200, deadline=None)
@given(port=st.text(st.sampled_from(list("0123456789+-._ex\t\x0b\x0c\x85\xa0\u2028\u0662\u00b2")), max_size=8))
def test_i1_vagrant_port_property(port):
    """Any Port text: the port numbers.whole reads (1..65535), or refused naming the VM."""
    ns = _vagrant()
    want = whole(port.strip(" \t\x0b\x0c"), 65535)   # an empty Port too is refused
    try:
        got = ns["_host"](ns["_ssh_configs"](BLOCK.format(port))[0])[1]["ssh_port"]
    except InventoryError as e:
        assert not want and "rigup-vm1" in str(e), port
    else:
        assert got == want and got > 0, port


@pytest.mark.parametrize("text,key", [("llama_server_tuned: [1]\n", "llama_server_tuned is a list"),
                                      ("llama_server_tuned: text\n", "llama_server_tuned is a str"),
                                      ("llama_server_tuned: {g: [1]}\n", "llama_server_tuned.g is no map"),
                                      ("llama_server_tuned: {g: {models: [1]}}\n", "llama_server_tuned.g.models is no map"),
                                      ("- 1\n- 2\n", "the file is a list")])
def test_t1_tunes_host_vars_file_is_refused_naming_the_file_and_key(tmp_path, text, key):
    """T1: write_host_vars gave a TypeError after the sweep (llama_server_tuned: [1]) or replaced a file
    that is a list; now tuning.host_vars refuses it naming the file and key, and nothing is written."""
    from plays import tuning
    from rigup.boundary.core import Unreadable

    (tmp_path / "host_vars").mkdir()
    path = tmp_path / "host_vars" / "lab1.yml"
    path.write_text(text)
    for call in (lambda: tuning.host_vars("lab1", str(tmp_path)),
                 lambda: tuning.write_host_vars("lab1", {"g": {"models": {"m": {"tok_s": 2.0}}}}, str(tmp_path))):
        with pytest.raises(Unreadable) as e:
            call()
        print(f"{text!r}: refused: {e.value}")
        assert str(path) in e.value.where and key in e.value.why
    assert path.read_text() == text


def test_t1_tune_reads_the_host_vars_before_any_sweep():
    """T1: tune.py refuses the host (refusals: none of its sweeps runs) where its host_vars file does not read."""
    source = (Path(__file__).resolve().parents[2] / "tune.py").read_text()
    read, sweeps = source.find("tuning.host_vars(host.name"), source.find("if todo and not unsafe and not refusals:")
    print(f"tune.py reads host_vars at {read}, starts the sweeps at {sweeps}")
    assert 0 < read < sweeps and "refusals.append(f\"tune: {e.where} does not read\")" in source[read:sweeps]


YAML_VALUE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
                          lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.sampled_from(["g", "models", "flags"]), c,
                                                                                       max_size=3)), max_leaves=8)


@settings(max_examples=100, deadline=None)
@given(doc=st.one_of(YAML_VALUE, st.fixed_dictionaries({"llama_server_tuned": YAML_VALUE})))
def test_t1_host_vars_property(doc):
    """Any document: tuning.host_vars returns a map whose llama_server_tuned is maps of maps, or Unreadable."""
    import tempfile

    import yaml

    from plays import tuning
    from rigup.boundary.core import Unreadable
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "host_vars").mkdir()
        (Path(site) / "host_vars" / "lab1.yml").write_text(yaml.safe_dump(doc))
        try:
            _, got = tuning.host_vars("lab1", site)
        except Unreadable as e:
            assert "lab1.yml" in e.where
            return
        tuned = got.get("llama_server_tuned") or {}
        assert isinstance(got, dict) and isinstance(tuned, dict)
        assert all(isinstance(v, dict) and isinstance(v.get("models", {}), dict) for v in tuned.values())


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "PYTHONPATH", "PYTHONSTARTUP",
                                  "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONBREAKPOINT", "PYTHONWARNINGS"])
def test_v3_vllm_env_refuses_the_loaders_and_interpreters_variables(name):
    """V3: vllm_instances.q.env {LD_PRELOAD: /tmp/x.so} was kept: the vLLM server loaded what another user put there."""
    from rigup.instances.vllm import env_problems

    for where in ("vllm_env", "vllm_instances.q.env"):
        got = env_problems({name: "/tmp/x.so", "VLLM_LOGGING_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}, where)
        print(f"{where} {name}: {got}")
        assert [k for k, _ in got] == [f"{where}.{name}"] and "loader" in got[0][1]


def test_g1_a_name_given_twice_is_refused_before_haproxy():
    """G1: llama_server_instances.g and vllm_instances.g on one host made 'server lab1' twice in gateway-g;
    a router r's model b and another host's instance r.b made two backends gateway-r.b: HAProxy's check
    failed every gateway's config. problems() refuses both, naming them."""
    from roles.balancer.config import gateway_backends, problems

    hosts = {"gw": {"balancer_gateway": True},
             "lab1": {"llama_server_instances": {"g": {"model": "g", "port": 8081}},
                      "vllm_instances": {"g": {"model": "g", "port": 8082}}}}
    got = problems(gateway_backends("gw", hosts, "127.0.0.1"))
    print("one host, both engines:", got)
    assert any("'gateway-g'" in p and "'lab1'" in p and "twice" in p for p in got)
    backends = [{"name": "gateway-r.b", "bind": "127.0.0.1", "port": 8081, "servers": [["lab1", "lab1", 8081, False]]},
                {"name": "gateway-r.b", "bind": "127.0.0.1", "port": 8082, "servers": [["lab2", "lab2", 8082, False]]}]
    got = problems(backends)
    print("two backends of one name:", got)
    assert len(got) == 1 and "'gateway-r.b'" in got[0] and "two backends" in got[0]
    fine = {"gw": {"balancer_gateway": True}, "lab1": {"llama_server_instances": {"g": {"model": "g", "port": 8081}}},
            "lab2": {"vllm_instances": {"g": {"model": "g", "port": 8082}}}}
    assert problems(gateway_backends("gw", fine, "127.0.0.1")) == []


def test_g3_a_peers_settings_are_read_typed_naming_the_peer_and_key():
    """G3: a gateway-, monitor- or head-only run read peers' settings raw: rigup_maintenance "false" was
    true, balancer_gateway "no" a gateway, metrics_address '10.0.0.9/x?y=' a target, rpc_worker_port
    '٥٠٠٥٢' 50052 and True 1. Each is a ConfigError naming the host and the key now."""
    from rigup import rpc
    from rigup.config import Config, ConfigError
    from roles.balancer.config import gateway_backends
    from roles.metrics.prometheus import targets

    g = {"llama_server_instances": {"g": {"model": "g", "port": 8081}}}
    cases = [("rigup_maintenance", "false", lambda d: gateway_backends("gw", {"gw": {"balancer_gateway": True}, "lab1": d}, "0.0.0.0")),
             ("balancer_gateway", "no", lambda d: gateway_backends("gw", {"gw": {"balancer_gateway": True}, "lab1": d}, "0.0.0.0")),
             ("llama_server_allow", "slots", lambda d: gateway_backends("gw", {"gw": {"balancer_gateway": True}, "lab1": d}, "0.0.0.0")),
             ("metrics_address", "10.0.0.9/x?y=", lambda d: targets("mon", [("lab1", d)])),
             ("metrics_node_exporter_port", "9100", lambda d: targets("mon", [("lab1", d)])),
             ("rpc_worker_port", "\u0665\u0660\u0660\u0665\u0662", lambda d: rpc.port(d)),
             ("rpc_worker_port", True, lambda d: rpc.port(d))]
    for key, value, read in cases:
        with pytest.raises(ConfigError) as e:
            read(Config("lab1", {**g, "ssh_hostname": "10.0.0.2", key: value}))
        print(f"{key}: {value!r}: {e.value}")
        assert "host lab1" in str(e.value) and key in str(e.value)
    ok = Config("lab1", {**g, "ssh_hostname": "10.0.0.2", "rpc_worker_port": 50052, "rigup_maintenance": False})
    assert rpc.port(ok) == 50052 and rpc.endpoint("lab1", ok) == "10.0.0.2:50052"
    assert gateway_backends("gw", {"gw": {"balancer_gateway": True}, "lab1": ok}, "0.0.0.0")[0]["servers"] == \
        [["lab1", "10.0.0.2", 8081, False]]


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(["rigup_maintenance", "balancer_gateway", "llama_server_allow", "metrics_address",
                            "metrics_relay_port", "rpc_worker_port"]),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True), st.text(max_size=8),
                       st.lists(st.sampled_from(["slots", "x", 1]), max_size=2)))
def test_g3_peer_value_property(key, value):
    """Any value of a peer's key: peer_value returns it where its form takes it, else ConfigError naming host and key."""
    from rigup.config import Config, ConfigError, declared, peer_value
    form = declared()[key].form
    try:
        got = peer_value(Config("lab1", {key: value}), key)
    except ConfigError as e:
        assert form.problem(value) and "host lab1" in str(e) and key in str(e)
    else:
        assert form.problem(value) is None and got is value


def test_g3_a_peers_instance_not_of_its_form_is_named_not_dropped():
    """G3: a peer's instance port "8081" (text) was left out of every backend without a word."""
    from rigup.config import Config, ConfigError
    from roles.balancer.config import gateway_backends

    peer = Config("lab1", {"llama_server_instances": {"g": {"model": "g", "port": "8081"}}})
    with pytest.raises(ConfigError) as e:
        gateway_backends("gw", {"gw": {"balancer_gateway": True}, "lab1": peer}, "0.0.0.0")
    print(f"port '8081': {e.value}")
    assert "host lab1" in str(e.value) and "llama_server_instances.g" in str(e.value)
