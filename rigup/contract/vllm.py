"""vLLM's contract: one row per instance key that becomes a flag of ``vllm serve`` (:data:`FLAGS`),
the instance's other keys (:data:`OTHER`) and the flags rigup writes from the instance itself
(:data:`FIXED`), as rigup/contract/llama_server.py is llama-server's. Made from them: the entry form
of ``vllm_instances`` (rigup/instances/vllm.py), the command line's flags (roles/vllm/command.py
``argv``), the flags extra_args may not give again (vLLM's argparse also takes ``--served_model_name``
and abbreviations: rigup/instances/vllm.py checks with them) and the generated docs.
"""

from __future__ import annotations

from rigup.contract import MAPS, OWN, Flag, Row, owned_by

KEY = MAPS["vllm_instances"]   # VLLM_API_KEY=<key>, made on the host (api_key: true)
DROPIN = "/etc/systemd/system/rigup-vllm@{}.service.d/rigup.conf"

# In the order the command line gives them (a new row goes last: no drop-in changes for the order).
FLAGS: tuple[Flag, ...] = (
    Flag("tp", "int 1..", 1, ("--tensor-parallel-size", "-tp"), "GPUs each layer is split over (tensor parallel)"),
    Flag("pp", "int 1..", 1, ("--pipeline-parallel-size", "-pp"), "pipeline stages the layers are split into"),
    Flag("gpu_memory_utilization", "float 0.05..1", 0.9, ("--gpu-memory-utilization",),
         "the share of each GPU's memory vLLM takes"),
    Flag("served_model_name", "str or null", None, ("--served-model-name",),
         "the model's name in the API (default: the instance's name)"),
    Flag("speculative", "map", {}, ("--speculative-config", "-sc"),
         "--speculative-config's other keys, e.g. {method: dflash, num_speculative_tokens: 7} (its model is "
         "draft_model's dest)", write=OWN),
)

# The instance's keys that are no flag of their own (after rigup/contract's SERVING).
OTHER: tuple[Row, ...] = (
    Row("pp_partition", "str or null", None, "VLLM_PP_LAYER_PARTITION: layers per stage, e.g. '13,11,11,10'"),
    Row("layers", "int 1.. or null", None, "num_hidden_layers: pp_partition must sum to it"),
    Row("gpus", "str or null", None, "CUDA_VISIBLE_DEVICES, e.g. '0,1,2,3' (default: all)"),
    Row("env", "map", {}, "more environment for this instance"),
    Row("replicas", "count 1..1024", 1, "auto or N: servers of tp x pp GPUs each (rigup-vllm@NAME-K) behind roles/balancer"),
    Row("gpus_per_replica", "count or null", None, "auto or N: a replica's GPUs, which are tp x pp (null: tp x pp)"),
    Row("draft_model", "str or null", None, "a key of models: the drafter, whose dest is --speculative-config's model"),
)

BY_KEY: dict[str, Flag] = {f.key: f for f in FLAGS}

# Flags rigup writes from the instance itself: spelling -> the key.
# --hf-token: the hub token rigup keeps in a root-only file for the fetch; in argv it is in ps, the unit and
# the journal (issue 61, re-round 4 N38; llama-server's -hft is owned the same way)
FIXED: dict[str, str | None] = {"--host": "host", "--port": "port", "--api-key": "api_key", "--model": "model",
                                "--hf-token": "model"}


def api_name(name: str, entry: dict) -> str:
    """The model's name in the API of instance ``name`` (what a client sends as "model"): its
    served_model_name, else the instance's name."""
    return entry.get("served_model_name") or name


def owned() -> dict[str, str | None]:
    """Every spelling extra_args may not give -> its key."""
    return owned_by(FLAGS, FIXED)
