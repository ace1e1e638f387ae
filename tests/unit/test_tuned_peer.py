"""A peer's ``llama_server_tuned`` or ``llama_server_instances`` that is no map (a host_vars typo)
read by another host's role (rigup/rpc.py heads_of on a worker, Prometheus's targets on a monitoring
host, the balancer's gateway): ConfigError naming that host and the key, never an AttributeError
naming neither (issue 61, round 9 TU1)."""

import pytest

from rigup.config import Config, ConfigError
from rigup.instances.llama_server import instances, normalised
from rigup.instances.tuned import tuned_lines
from rigup.rpc import heads_of

SERVING = {"g": {"model": "m", "port": 8080, "rpc_workers": ["lab2"]}}


@pytest.mark.parametrize("key, value", [("llama_server_tuned", ["x"]), ("llama_server_tuned", "x"),
                                        ("llama_server_instances", ["x"]), ("llama_server_instances", 3)])
def test_a_peers_map_that_is_no_map_is_refused_naming_the_host_and_key(key, value):
    peer = Config("lab1", {"llama_server_tuned": {}, "llama_server_instances": SERVING, key: value})
    for read in (lambda: normalised(peer), lambda: heads_of("lab2", {"lab1": peer}), lambda: tuned_lines(peer),
                 lambda: instances(peer)):
        with pytest.raises(ConfigError) as refused:
            read()
        assert str(refused.value).startswith(f"host lab1: {key} is a {type(value).__name__}, not a map")
    print(f"\nlab1's {key}: {value!r} -> ConfigError: {refused.value}")


def test_an_unset_or_null_map_is_none_and_a_good_peer_is_read():
    peer = Config("lab1", {"llama_server_tuned": None, "llama_server_instances": SERVING})
    print(f"\nheads_of lab2 with lab1's tuned null: {heads_of('lab2', {'lab1': peer})}")
    assert list(normalised(peer)) == ["g"] and normalised(Config("lab3", {})) == {}
