"""llama-server's LoRA adapters on a shared endpoint (issue 61, round 9 I1): ``--lora FILE`` (or
``--lora-scaled``) in an instance's extra_args is held off as POST /props is (contract HELD_OFF
``lora``) unless llama_server_allow names lora, and every HAProxy frontend answers POST
/lora-adapters 403 (config HELD_PATHS): one client's POST set the adapters' scales for every other."""

import re

import pytest

from rigup.contract import llama_server as contract
from rigup.instances.llama_server import instances
from roles.balancer.config import HELD_PATHS, haproxy_cfg, held
from tests.unit.hosts import data, glm_llama

WHERE = "llama_server_instances.glm.extra_args"


@pytest.mark.parametrize("args", [["--lora", "/srv/models/x/l.gguf"], ["--lora=/srv/l.gguf"],
                                  ["--lora-scaled", "/srv/l.gguf:1"], ["--lora_scaled", "/srv/l.gguf:0.5"]])
def test_a_lora_flag_is_held_off_unless_allowed(args):
    refused = [why for path, why in instances(data(**glm_llama(extra_args=args)))[1] if path == WHERE]
    allowed = [why for path, why in instances(data(**glm_llama(extra_args=args), llama_server_allow=["lora"]))[1]
               if path == WHERE]
    print(f"\nextra_args {args}: {refused}; with llama_server_allow [lora]: {allowed or 'passes'}")
    assert len(refused) == 1 and "llama-server's lora" in refused[0] and "POST /lora-adapters" in refused[0]
    assert refused[0].endswith("add lora to llama_server_allow") and allowed == []


def test_haproxy_answers_post_lora_adapters_403_unless_lora_is_allowed():
    backend = {"name": "llama-x", "bind": "127.0.0.1", "port": 8081, "servers": [["x", "127.0.0.1", 8082]]}
    rule = "!METH_GET { path,url_dec -m reg /lora-adapters/?$ }"
    shut, opened = haproxy_cfg([backend], data()), haproxy_cfg([backend], data(llama_server_allow=["lora"]))
    print(f"\nheld paths without lora: {[why for why, _ in held([])['paths']]}; the rule in the config: "
          f"{rule in shut}; with lora allowed: {rule in opened}")
    assert rule in shut and rule not in opened
    assert re.fullmatch(r"/lora-adapters/?", "/lora-adapters/") and ("lora",) in [f for f, _, _ in HELD_PATHS]
    assert contract.HELD_OFF["lora"].flags == ("--lora", "--lora-scaled")
