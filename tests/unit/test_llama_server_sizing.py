"""ctx and parallel chosen by rigup when an instance leaves them auto (roles/llama_server/replicas.py
``sizing``/``sized``): slots of 8,192 tokens, as many as 80% of the VRAM left after the weights
holds, at most 32; the plan says why; the VRAM check passes on what was chosen."""

import pytest

from rigup import models as models_module
from rigup.gpu.plan import hardware_plan
from roles.llama_server.checks import layouts, plan_lines
from roles.llama_server.command import argv
from roles.llama_server.replicas import MAX_SLOTS, SLOT_TOKENS, sizing
from tests.unit.hosts import REV, answered, data, host, refusals

KV_8B = 0.125   # GiB per 1k tokens: Llama 3 8B's f16 KV cache (32 layers x 8 KV heads x 128 x 2 x 2 bytes)


def one(gib: float, kv: float | None = KV_8B, trained: int | None = None, gpu_enabled: bool = True, **inst):
    """A host's configuration with instance ``m`` of a model of ``gib`` GiB whose GGUF header (as
    the hub's answer gives it on the controller: roles/model_fetch/hub.py) says ``kv`` and ``trained``."""
    d = data(models={"m": {"repo": "acme/m-GGUF", "revision": REV, "size_gib": gib}}, gpu_enabled=gpu_enabled,
             llama_server_instances={"m": {"model": "m", "port": 8081, **inst}})
    entry = models_module.models(d)[0]["m"]
    gguf = {"architecture": "llama", "layers": 32, "kv_gib_per_1k_tokens": kv, "context_length": trained}
    return answered(d, {models_module.hub_key(models_module.hub_endpoint(d), entry): {"gguf": gguf}})


def card(mib: int, n: int = 1) -> dict:
    gpus = [{"index": i, "uuid": f"GPU-{i}", "bus_id": f"00000000:{i + 1:02x}:00.0", "pci_device_id": "0x233510DE",
             "compute_capability": [9, 0], "memory_total_mib": mib} for i in range(n)]
    return hardware_plan(gpus, {"version": "580.159.04", "loaded": True}, [])


def chosen(plan: dict, d: dict):
    inst, lay, why = layouts(plan, d, why=True)["m"]
    return inst["ctx"], inst["parallel"], why


def test_an_8x_a100_host_plans_32_slots_of_8192_and_says_why():
    plan, facts = host("a100")
    d = one(16)
    ctx, parallel, why = chosen(plan, d)
    lines = plan_lines(plan, d)
    print("\n".join(lines))
    assert (ctx, parallel) == (MAX_SLOTS * SLOT_TOKENS, MAX_SLOTS) and ctx // parallel >= 8192
    assert lines[1] == f"llama:     m: {why}" and why.startswith("ctx 262,144 = 32 slots x 8,192 tokens: ")
    assert "GiB of VRAM left after the weights (16.0 GiB)" in why and why.endswith("at most 32 slots; cache_ram 0: with 32 slots the host-RAM prompt cache delays new requests")
    assert not [r for r in refusals(plan, facts, d) if r.check == "vram"]
    args = argv("m", layouts(plan, d)["m"][0], "/b/llama-server", "/m.gguf")
    assert args[args.index("-c") + 1] == "262144" and args[args.index("--parallel") + 1] == "32"
    assert args[args.index("-cram") + 1] == "0"


def test_one_h200_with_an_8b_f16_model_gets_32_slots():
    ctx, parallel, why = chosen(card(143771), one(14.96))
    print(why)
    assert (ctx, parallel) == (262144, 32) and "124.4 GiB of VRAM left" in why


def test_replicas_are_sized_on_their_own_gpus():
    plan, facts = host("a100")
    d = one(120, replicas="auto", gpus_per_replica="auto")   # 4 replicas x 2 A100s: 38 GiB left each
    ctx, parallel, why = chosen(plan, d)
    assert layouts(plan, d)["m"][1].replicas == 4
    assert parallel == int((2 * 80 - 120 - 2) * 0.8 / KV_8B * 1000) // SLOT_TOKENS and ctx == parallel * SLOT_TOKENS
    assert not [r for r in refusals(plan, facts, d) if r.check == "vram"]


def test_a_small_card_gets_one_slot_of_what_fits_and_no_room_is_refused():
    ctx, parallel, why = chosen(card(10240), one(8))      # 1 GiB left: 6,553 tokens of KV cache
    assert (ctx, parallel) == (6144, 1) and why.startswith("1 slot of 6,144 tokens: 1.0 GiB of VRAM left")
    plan = card(10240)
    d = one(9.5)
    assert chosen(plan, d)[:2] == (SLOT_TOKENS, 1)
    vram = [r for r in refusals(plan, host("a100")[1], d) if r.check == "vram"]
    assert vram and "8,192 tokens" in vram[0].why


@pytest.mark.parametrize("inst, want", [
    ({"ctx": 65536}, (65536, 8, "8 slots of 8,192 tokens (ctx 65,536 is set; parallel: one slot per 8,192 tokens, "
                                 "at most 32)")),
    ({"parallel": 4}, (32768, 4, "ctx 32,768 = 4 slots x 8,192 tokens (parallel is set)")),
    ({"ctx": 4096, "parallel": 2}, (4096, 2, None)),
    ({"ctx": 1024}, (1024, 1, "1 slot of 1,024 tokens (ctx 1,024 is set; parallel: one slot per 8,192 tokens, "
                              "at most 32)")),
])
def test_what_the_instance_sets_is_kept(inst, want):
    assert chosen(card(143771), one(14.96, **inst)) == want


def test_a_model_trained_for_less_than_8192_tokens_gets_slots_of_its_own_length():
    ctx, parallel, why = chosen(card(143771), one(14.96, trained=2048))
    assert (ctx, parallel) == (32 * 2048, 32) and "x 2,048 tokens" in why


@pytest.mark.parametrize("plan, d, reason", [
    (hardware_plan([], {"loaded": False}, []), one(1, gpu_enabled=False), "on the CPU"),
    (card(143771), one(14.96, ngl=20), "layers left on the CPU (ngl)"),
    (card(143771), one(14.96, kv=None), "its KV cache per token is not known"),
])
def test_without_the_figures_one_slot_of_8192(plan, d, reason):
    ctx, parallel, why = chosen(plan, d)
    assert (ctx, parallel) == (8192, 1) and why == f"1 slot of 8,192 tokens ({reason}: rigup sizes slots from the VRAM only)"


def test_sizing_is_pure_arithmetic():
    inst = {"ctx": "auto", "parallel": "auto", "ngl": 99}
    model = {"size_gib": 10.0, "gguf": {"kv_gib_per_1k_tokens": 0.5}}
    # 2 x 24 GiB - 10 - 2 = 36 GiB; 80%: 57,600 tokens; 7 slots of 8,192
    assert sizing(inst, model, [24.0, 24.0])[:2] == (7 * 8192, 7)


def test_several_slots_from_the_vram_turn_the_host_ram_prompt_cache_off_unless_set():
    model = {"size_gib": 10.0, "gguf": {"kv_gib_per_1k_tokens": 0.5}}
    size = sizing({"ctx": "auto", "parallel": "auto", "ngl": 99}, model, [24.0, 24.0])
    assert size.cache_ram == 0 and size.why.endswith("; cache_ram 0: with 7 slots the host-RAM prompt cache delays new requests")
    assert sizing({"ctx": "auto", "parallel": "auto", "ngl": 99, "cache_ram": 4096}, model, [24.0, 24.0]).cache_ram is None
    assert sizing({"ctx": "auto", "parallel": 4, "ngl": 99}, model, [24.0, 24.0]).cache_ram is None   # the user's slots
    assert sizing({"ctx": "auto", "parallel": "auto", "ngl": 99}, model, [12.5]).cache_ram is None   # one slot
