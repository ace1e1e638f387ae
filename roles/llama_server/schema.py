"""The form of an entry of ``llama_server_instances`` (name -> instance), with each key's
default and meaning; :func:`instances` reads them normalised, with problems by key path.

Adding a llama-server flag: a key here, its argument in command.py (``argv``), the flag in
OWNED_FLAGS (extra_args may not give it again), a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.config import once
from rigup.entries import Key
from rigup.models import SERVING_KEYS, ServingInstance, owned_flag_problems
from rigup.models import instances as _entries
from roles.llama_server.tuned import tuned, with_tuned

if TYPE_CHECKING:
    from rigup.config import Config

# llama.cpp's KV cache types (-ctk, -ctv: common/arg.cpp kv_cache_types).
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class LlamaInstance(ServingInstance):
    """One entry of ``llama_server_instances``, normalised (every key present)."""

    ctx: int | str
    parallel: int | str
    ngl: int
    n_cpu_moe: int | None
    flash_attn: str
    batch: int | None
    ubatch: int | None
    cache_type_k: str | None
    cache_type_v: str | None
    cache_ram: int | None
    split_mode: str
    tensor_split: str | None
    main_gpu: int | None
    jinja: bool
    metrics: bool
    replicas: int | str
    gpus_per_replica: int | str | None
    min_tokens_per_s: float | None
    rpc_workers: list[str]


LLAMA_INSTANCE: dict[str, Key] = {
    **SERVING_KEYS,
    "ctx": Key("count", "auto", "-c: total tokens of context, shared by the slots; auto (or N): rigup sizes it "
                              "(replicas.py sizing: slots of 8,192 tokens, as many as the VRAM left after the "
                              "weights holds, at most 32; the plan says why)"),
    "parallel": Key("count", "auto", "--parallel: slots, requests served at once; auto (or N): see ctx"),
    "ngl": Key("int -1..", 99, "-ngl: layers on the GPUs (99 or -1: all)"),
    "n_cpu_moe": Key("int 0.. or null", None, "--n-cpu-moe: the first N layers' MoE expert weights stay in host RAM "
                                             "(a MoE model larger than the VRAM, with ngl 99); null: none"),
    "flash_attn": Key("one of on|off|auto", "auto", "-fa"),
    "cache_type_k": Key(f"one of {'|'.join(CACHE_TYPES)} or null", None,
                        "-ctk: the K cache's type (null: llama.cpp's f16); roles/llama_server/traps.yml says which "
                        "types flash attention has kernels for"),
    "cache_type_v": Key(f"one of {'|'.join(CACHE_TYPES)} or null", None,
                        "-ctv: the V cache's type (null: f16); a quantized one needs flash attention"),
    "cache_ram": Key("int -1.. or null", None,
                     "-cram: MiB of host RAM for llama-server's prompt cache (null: llama.cpp's 8192; 0: off; -1: "
                     "no limit). On one H200 at 32 concurrent, 0 served 1.41x the tok/s: with the cache on, each "
                     "new request on a used slot first copies that slot's KV state to RAM, one after another "
                     "(tests/gpu/results/2026-12-02-h200-admission.md); tune.py measures it per host"),
    "batch": Key("int 1.. or null", None, "-b: the logical batch, in tokens (null: llama.cpp's 2048)"),
    "ubatch": Key("int 1.. or null", None, "-ub: the physical batch, in tokens (null: llama.cpp's 512)"),
    "split_mode": Key("one of none|layer|row|tensor", "layer", "-sm: how a model is split over GPUs"),
    "tensor_split": Key("str or null", None, "-ts: shares per GPU, e.g. '16,16,17,0'"),
    "main_gpu": Key("int 0.. or null", None, "-mg: the GPU (of the instance's own, in order) for the whole model with "
                                            "split_mode none, or for intermediate results and the KV cache with row; "
                                            "null: llama.cpp's 0"),
    "jinja": Key("bool", True, "--jinja (the model's chat template) or --no-jinja"),
    "metrics": Key("bool", True, "--metrics: Prometheus metrics at /metrics"),
    "replicas": Key("count", 1, "auto or N: servers behind a balancer on host:port (roles/balancer), each "
                              "its own unit rigup-llama@NAME-K on 127.0.0.1:port+1+K (replicas.py)"),
    "gpus_per_replica": Key("count or null", None, "auto (the fewest GPUs that hold the model) or N; null: the host's "
                                         "GPUs shared out evenly (one replica: all of them)"),
    "min_tokens_per_s": Key("float 0.. or null", None, "the throughput watchdog's floor (roles/watchdog): "
                                                       "restarted after watchdog_bad_checks checks below it; null: "
                                                       "50% of the tok/s the health gate measured at the (re)start; "
                                                       "0: not watched"),
    "rpc_workers": Key("list of str", [], "hosts of the inventory whose llama.cpp RPC server (roles/rpc_worker) takes "
                                          "layers of this instance: --rpc ADDRESS:PORT,...; for models that do not "
                                          "fit one host (it costs tok/s and load time); one server (replicas 1)"),
}

_NUMBERS = re.compile(r"\d+(\.\d+)?(,\d+(\.\d+)?)*")
# llama-server flags rigup sets from an instance's keys alone (in extra_args they are refused):
# flag -> the key (None: the instance's name, --alias).
OWNED_FLAGS = {"-ctk": "cache_type_k", "--cache-type-k": "cache_type_k", "-b": "batch", "--batch-size": "batch",
               "-ub": "ubatch", "--ubatch-size": "ubatch", "-cram": "cache_ram", "--cache-ram": "cache_ram",
               "-ncmoe": "n_cpu_moe", "--n-cpu-moe": "n_cpu_moe", "-mg": "main_gpu", "--main-gpu": "main_gpu",
               "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
               "--host": "host", "--port": "port", "--api-key": "api_key", "--api-key-file": "api_key",
               "-m": "model", "--model": "model", "-mu": "model", "--model-url": "model", "-hf": "model",
               "-hfr": "model", "--hf-repo": "model", "--rpc": "rpc_workers", "-a": None, "--alias": None}


def instances(data: Config, gpu_count: int | None = None) -> tuple[dict[str, LlamaInstance], list[tuple[str, str]]]:
    """The host's ``llama_server_instances``, normalised, and (key path, problem) for each wrong
    entry; ``gpu_count`` (when known) bounds tensor_split. Made once per run for each ``gpu_count``
    of a host's configuration (rigup.config.once): read it, never change it."""
    return once(data, ("llama_server_instances", gpu_count), lambda: _instances(data, gpu_count))


def _instances(data: Config, gpu_count: int | None) -> tuple[dict[str, LlamaInstance], list[tuple[str, str]]]:
    def problems(entry: dict, where: str, model) -> list[tuple[str, str]]:
        found = owned_flag_problems(entry["extra_args"], OWNED_FLAGS, where)
        if found or entry.get("tensor_split") is None:
            return found
        split = entry["tensor_split"].replace(" ", "")
        if not _NUMBERS.fullmatch(split):
            return [(f"{where}.tensor_split", "expected numbers separated by commas "
                                              f"(e.g. '16,16,17,0'), got {entry['tensor_split']!r}")]
        if gpu_count is not None and len(split.split(",")) > gpu_count:
            return [(f"{where}.tensor_split", f"{len(split.split(','))} shares for {gpu_count} GPUs on this host")]
        return []
    flags, wrong = tuned(data, LLAMA_INSTANCE)
    found, problems_ = _entries(data, "llama_server_instances", LLAMA_INSTANCE, problems, with_tuned(data, flags))
    return found, wrong + problems_
