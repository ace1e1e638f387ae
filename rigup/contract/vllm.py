"""vLLM's contract: one row per instance key that becomes a flag of ``vllm serve`` (:data:`FLAGS`),
the instance's other keys (:data:`OTHER`) and the flags rigup writes from the instance itself
(:data:`FIXED`), as rigup/contract/llama_server.py is llama-server's. Made from them: the entry form
of ``vllm_instances`` (rigup/instances/vllm.py), the command line's flags (roles/vllm/command.py
``argv``), the flags extra_args may not give again (vLLM's argparse also takes ``--served_model_name``
and abbreviations: rigup/instances/vllm.py checks with them; short options: :data:`SHORT`) and the generated docs.
"""

from __future__ import annotations

from typing import NamedTuple

from rigup.contract import MAPS, OWN, Flag, Row, owned_by

KEY = MAPS["vllm_instances"]   # VLLM_API_KEY=<key>, made on the host (api_key: true)
DROPIN = "/etc/systemd/system/rigup-vllm@{}.service.d/rigup.conf"

# vLLM's short options of the long ones rigup judges (vllm/engine/arg_utils.py: add_argument("--compilation-config",
# "-cc", ...), "--speculative-config", "-sc", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp"):
# short -> long. -O was --compilation-config's until --optimization-level took it, and rigup reads it as the
# former, the stricter. A row here spells every key and flag of its long option (issue 61, round 16 V50: -cc's
# backend passed where --compilation-config's and -O's were refused), and argparse takes a prefix of one too
# (-c for -cc, -s for -sc: rigup/instances/vllm.py spelled()).
SHORT: dict[str, str] = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
                         "-sc": "--speculative-config", "-cc": "--compilation-config", "-O": "--compilation-config"}


def spellings(option: str) -> tuple[str, ...]:
    """``option`` and its short options (:data:`SHORT`)."""
    return (option, *(s for s, long in SHORT.items() if long == option))


# In the order the command line gives them (a new row goes last: no drop-in changes for the order).
FLAGS: tuple[Flag, ...] = (
    Flag("tp", "int 1..", 1, spellings("--tensor-parallel-size"), "GPUs each layer is split over (tensor parallel)"),
    Flag("pp", "int 1..", 1, spellings("--pipeline-parallel-size"), "pipeline stages the layers are split into"),
    Flag("gpu_memory_utilization", "float 0.05..1", 0.9, ("--gpu-memory-utilization",),
         "the share of each GPU's memory vLLM takes"),
    Flag("served_model_name", "str or null", None, ("--served-model-name",),
         "the model's name in the API (default: the instance's name)"),
    Flag("speculative", "map", {}, spellings("--speculative-config"),
         "--speculative-config's other keys, e.g. {method: dflash, num_speculative_tokens: 7} (its model is "
         "draft_model's dest)", write=OWN),
)

# The instance's keys that are no flag of their own (after rigup/contract's SERVING).
OTHER: tuple[Row, ...] = (
    Row("pp_partition", "str or null", None, "VLLM_PP_LAYER_PARTITION: layers per stage, e.g. '13,11,11,10'"),
    Row("layers", "int 1.. or null", None, "num_hidden_layers: pp_partition must sum to it"),
    Row("gpus", "str or null", None, "CUDA_VISIBLE_DEVICES, e.g. '0,1,2,3' (default: all)"),
    Row("env", "map", {}, "more environment for this instance: variables that tune only (vllm_env's rule)"),
    Row("replicas", "count 1..1024", 1, "auto or N: servers of tp x pp GPUs each (rigup-vllm@NAME-K) behind roles/balancer"),
    Row("gpus_per_replica", "count or null", None, "auto or N: a replica's GPUs, which are tp x pp (null: tp x pp)"),
    Row("draft_model", "str or null", None, "a key of models: the drafter, whose dest is --speculative-config's model"),
)

BY_KEY: dict[str, Flag] = {f.key: f for f in FLAGS}

# Flags rigup writes from the instance itself: spelling -> the key.
# --hf-token: the hub token rigup keeps in a root-only file for the fetch; in argv it is in ps, the unit and
# the journal (issue 61, re-round 4 N38; llama-server's -hft is owned the same way)
# --uds: a Unix socket in place of --host and --port, where neither the health gate nor HAProxy reaches it
FIXED: dict[str, str | None] = {"--host": "host", "--port": "port", "--api-key": "api_key", "--model": "model",
                                "--hf-token": "model", "--uds": "host"}

class HeldOff(NamedTuple):
    """A feature of vLLM beyond inference (rigup/contract/llama_server.py HeldOff's fields, and
    ``keys``): the keys of vLLM's JSON options that turn it on inside such an option, spelled
    ``--option.key`` (issue 61, round 12 V8: ``--structured-outputs-config '{"reasoning_parser_plugin":
    ...}'``, its ``=`` form and ``--structured-outputs-config.reasoning_parser_plugin`` imported a file that
    --reasoning-parser-plugin is held off for)."""

    flags: tuple[str, ...]
    env: tuple[str, ...]
    opens: str
    keys: tuple[str, ...] = ()


# Features of vLLM beyond inference that a shared endpoint holds off until an operator allows them by name
# (``vllm_allow``), as llama-server's are (rigup/contract/llama_server.py HELD_OFF): every flag (vLLM's
# argparse also reads ``--flag_name``, ``--flag=value``, ``--flag.key value`` and abbreviations:
# rigup/instances/vllm.py checks with them) and every variable of vllm_env and an instance's env that turns
# one on. Read from vLLM's own source (vllm-project/vllm, 2026): vllm/entrypoints/openai/cli_args.py
# (FrontendArgs, make_arg_parser), vllm/config/model.py (ModelConfig), vllm/config/parallel.py,
# vllm/config/structured_outputs.py, vllm/config/kv_events.py, vllm/envs.py, vllm/entrypoints/serve/ (the
# routers) and vllm/utils/argparse_utils.py (FlexibleArgumentParser). A negation (--no-trust-remote-code,
# --no-enable-lora) turns a feature off and is no spelling of it here. vLLM's --api-key guards /v1, /v2,
# /inference and /cohere alone (vllm/entrypoints/serve/middleware/authenticate.py): the paths below answer
# without it.
HELD_OFF: dict[str, HeldOff] = {
    # ModelConfig.allowed_local_media_path ("This is a security risk. Should only be enabled in trusted
    # environments."); vllm/multimodal/utils.py MediaConnector loads a file:// URL under it
    "local_media": HeldOff(("--allowed-local-media-path",), (),
                           "a request loads any file under that directory on the host by file:// URL as an "
                           "image, video or audio input, which the model then describes to that client"),
    # ModelConfig.trust_remote_code: transformers' AutoConfig/AutoModel/AutoTokenizer with trust_remote_code
    "remote_code": HeldOff(("--trust-remote-code",), (),
                           "the model repository's own Python (its configuration_*.py, modeling_*.py, "
                           "tokenizer code) run on the host as the service user at every start"),
    # LoRAConfig (--enable-lora) and FrontendArgs.lora_modules (name=path or JSON): the adapters' paths on the
    # host are each model card's root in GET /v1/models (vllm/entrypoints/openai/models/serving.py)
    "lora": HeldOff(("--enable-lora", "--lora-modules"), (),
                    "LoRA adapters loaded from paths on the host, each a model any client may name, and "
                    "GET /v1/models answers each adapter's path on the host"),
    # envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING: vllm/entrypoints/serve/lora/api_router.py attaches its routes only
    # then; VLLM_LORA_RESOLVER_CACHE_DIR and VLLM_LORA_RESOLVER_HF_REPO_LIST: the LoRA resolver plugins
    "runtime_lora": HeldOff((), ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_LORA_RESOLVER_CACHE_DIR",
                                 "VLLM_LORA_RESOLVER_HF_REPO_LIST"),
                            "POST /v1/load_lora_adapter: any client loads an adapter from any path on the host or "
                            "any hub repository it names into the server every other client shares, and "
                            "POST /v1/unload_lora_adapter drops one; the resolver variables load an adapter a "
                            "request names from a directory or hub repositories"),
    # envs.VLLM_SERVER_DEV_MODE: vllm/entrypoints/serve/dev/ (cache, rlhf, rpc, server_info, sleep), mounted
    # by register_vllm_dev_api_routers with "SECURITY WARNING: Development endpoints are enabled!"
    "dev_mode": HeldOff((), ("VLLM_SERVER_DEV_MODE",),
                        "vLLM's development endpoints, outside the API key's paths: POST /collective_rpc (any "
                        "method run on every worker), /reset_prefix_cache, /sleep, /wake_up, /pause, "
                        "/update_weights (one client changes or stops the server for every other) and "
                        "GET /server_info (the whole configuration)"),
    # Python imported from a path or module the value names: FrontendArgs.middleware (an import path added to
    # the app), .tool_parser_plugin and StructuredOutputsConfig.reasoning_parser_plugin (a file imported:
    # ToolParserManager.import_tool_parser), ModelConfig.logits_processors (class names) and
    # .logits_processor_pattern (a request's logits_processors matching it are imported by name),
    # ParallelConfig.worker_cls and .worker_extension_cls, SchedulerConfig.scheduler_cls (resolve_obj_by_qualname;
    # ParallelConfig.distributed_executor_backend too, when it is a class path: WORD_VALUES),
    # CompilationConfig.backend (a qualname imported; --compilation-config, -O) and .cache_dir (compiled
    # artifacts loaded from there: rigup's are under VLLM_CACHE_ROOT, whose variable is refused) and
    # .debug_dump_path (written there), .inductor_passes (a pass name -> a function's qualname, imported) and
    # .inductor_compile_config (torch inductor's own config: trace.debug_dir written, cpp.cxx the compiler run),
    # FrontendArgs.log_config_file
    # and VLLM_LOGGING_CONFIG_PATH (logging.config.dictConfig: a "()" key imports its factory),
    # VLLM_RUST_FRONTEND_PATH (the binary run as the frontend, with VLLM_USE_RUST_FRONTEND=1)
    "plugins": HeldOff(("--middleware", "--tool-parser-plugin", "--reasoning-parser-plugin", "--logits-processors",
                        "--logits-processor-pattern", "--worker-cls", "--worker-extension-cls", "--scheduler-cls",
                        "--log-config-file"),
                       ("VLLM_LOGGING_CONFIG_PATH", "VLLM_RUST_FRONTEND_PATH"),
                       "code from a path or module the value names, run in the server as the service user "
                       "(--logits-processor-pattern: a class a request names, imported; --compilation-config's "
                       "cache_dir: compiled code loaded from that directory, debug_dump_path: the compiled graphs "
                       "written into it, in place of rigup's own cache; inductor_passes: functions imported by "
                       "name; inductor_compile_config: torch inductor's settings, the compiler it runs (cpp.cxx) "
                       "and where it writes (trace.debug_dir))",
                       ("--structured-outputs-config.reasoning_parser_plugin",
                        *(f"{o}.{k}" for o in spellings("--compilation-config")
                          for k in ("backend", "cache_dir", "debug_dump_path", "inductor_passes",
                                    "inductor_compile_config")))),
    # make_arg_parser's --config: FlexibleArgumentParser._pull_args_from_config reads a YAML of options
    "config_file": HeldOff(("--config",), (),
                           "every option in a YAML file on the host, which rigup does not read: any feature here, "
                           "a bind or a port of its own"),
    # FrontendArgs.enable_log_outputs requires enable_log_requests; VLLM_DEBUG_LOG_API_SERVER_RESPONSE:
    # vllm/entrypoints/serve/middleware/log_response.py
    "log_prompts": HeldOff(("--enable-log-requests", "--enable-log-outputs"), ("VLLM_DEBUG_LOG_API_SERVER_RESPONSE",),
                           "every client's prompt (and with --enable-log-outputs its answer; the variable: every "
                           "response body) in the journal"),
    # FrontendArgs.enable_prompt_tokens_details: usage.prompt_tokens_details.cached_tokens
    "cache_details": HeldOff(("--enable-prompt-tokens-details",), (),
                             "usage.prompt_tokens_details.cached_tokens in every answer: how much of a prompt the "
                             "prefix cache held, which tells one client whether another sent the same text before"),
    # FrontendArgs.enable_tokenizer_info_endpoint ("May expose chat templates and other tokenizer configuration")
    "tokenizer_info": HeldOff(("--enable-tokenizer-info-endpoint",), (),
                              "GET /tokenizer_info, outside the API key's paths: the chat template and the "
                              "tokenizer's configuration, any client's"),
    # FrontendArgs.trust_request_chat_template
    "request_template": HeldOff(("--trust-request-chat-template",), (),
                                "a request's own chat_template: Jinja that any client writes, rendered on the host"),
    # FrontendArgs.tool_server ("WARNING: The `demo` Python tool executes model-generated code in Docker without
    # network isolation by default")
    "tool_server": HeldOff(("--tool-server",), (),
                           "tool servers (host:port) the server calls for a request's tools, or demo: a browser "
                           "and a Python interpreter that runs model-written code in Docker, with the network"),
    # KVEventsConfig: endpoint "tcp://*:5557" by default; its BlockStored events carry each block's token ids
    "kv_events": HeldOff(("--kv-events-config",), (),
                         "a ZeroMQ publisher (by default tcp://*:5557, every interface, no authentication) of every "
                         "KV cache block stored, with its token ids: every client's prompt, to anyone who connects"),
    # KVTransferConfig (--kv-transfer-config: kv_connector_module_path is imported by name, KVConnectorFactory)
    # and ECTransferConfig (--ec-transfer-config, ec_connector_module_path): connectors such as P2pNcclConnector
    # (kv_ip, kv_port), NixlConnector (its side channel, VLLM_NIXL_SIDE_CHANNEL_HOST) or Mooncake listen, and send
    # and receive the KV cache (every client's prompt, as tensors) to and from peers
    "kv_transfer": HeldOff(("--kv-transfer-config", "--ec-transfer-config"), (),
                           "a KV connector: a module imported by name (kv_connector_module_path), and a listener "
                           "that sends every client's KV cache (its prompt) to peers and takes theirs, outside "
                           "the API key"),
    # ProfilerConfig (--profiler-config) and the older VLLM_TORCH_PROFILER_DIR and VLLM_TORCH_CUDA_PROFILE (the
    # CUDA profiler: the same routes, round 14 V34): vllm/entrypoints/serve/profile/api_router.py attach_router
    "profiler": HeldOff(("--profiler-config",), ("VLLM_TORCH_PROFILER_DIR", "VLLM_TORCH_CUDA_PROFILE"),
                        "POST /start_profile and /stop_profile, outside the API key's paths: any client runs the "
                        "torch profiler, whose traces are written into a directory on the host (or CUDA's)"),
    # FrontendArgs.allowed_origins (default ["*"]), .allow_credentials, .allowed_methods, .allowed_headers:
    # Starlette's CORSMiddleware (with "*" and credentials it echoes the Origin, credentials allowed)
    "cors": HeldOff(("--allowed-origins", "--allow-credentials", "--allowed-methods", "--allowed-headers"), (),
                    "vLLM's CORS settings by hand; with --allow-credentials and vLLM's default origins (\"*\") any "
                    "web page a user opens may call the API as that user's browser"),
    # ModelConfig.enable_prompt_embeds: a request's prompt_embeds (base64) read with torch.load (CVE-2025-62164)
    "prompt_embeds": HeldOff(("--enable-prompt-embeds",), (),
                             "a request's prompt_embeds: any client's base64 tensor read with torch.load in the server"),
    # Files on the host named by their path (issue 61, round 14 V32): ModelConfig.tokenizer, .hf_config_path and
    # .generation_config (a folder: WORD_VALUES), LoadConfig.download_dir and model_loader_extra_config's
    # TensorizerConfig keys (tensorizer_uri, tensorizer_dir, lora_dir: weights and adapters; encryption_keyfile),
    # FrontendArgs.chat_template (vllm/entrypoints/chat_utils.py opens the value as a path first, and only when
    # that fails reads it as the template itself), .ssl_keyfile, .ssl_certfile, .ssl_ca_certs (vLLM's own TLS)
    "files": HeldOff(("--tokenizer", "--hf-config-path", "--download-dir", "--chat-template", "--ssl-keyfile",
                      "--ssl-certfile", "--ssl-ca-certs"), (),
                     "files on the host trusted by their path, which rigup neither fetched nor checked (another "
                     "user's, where they may write them): the tokenizer, the model's configuration and generation "
                     "defaults, weights (--download-dir; --load-format tensorizer's tensorizer_uri), the chat "
                     "template every prompt is rendered through, the TLS key and certificates; rigup serves the "
                     "model it fetched and checked, with that model's own files",
                     tuple(f"--model-loader-extra-config.{k}"
                           for k in ("tensorizer_uri", "tensorizer_dir", "lora_dir", "encryption_keyfile"))),
}


# Flags whose value is a word vLLM knows (the pattern), or else opens a feature: flag -> (the feature, the
# words, what any other value is). --distributed-executor-backend: a class path imported (Executor.get_class:
# resolve_obj_by_qualname; ray and mp stay); --generation-config: the folder its generation_config.json is read
# from (auto, the model's own, and vllm, none, stay).
WORD_VALUES: dict[str, tuple[str, str, str]] = {
    "--distributed-executor-backend": ("plugins", r"[^.]*", "a class path"),
    "--generation-config": ("files", r"auto|vllm", "a folder's path")}


def held_off(allow=(), kind: str = "flags") -> dict[str, str]:
    """Every flag (``kind="env"``: every variable; ``"keys"``: every ``--option.key``) of a feature of
    :data:`HELD_OFF` not in ``allow`` -> its feature."""
    return {s: name for name, f in HELD_OFF.items() if name not in allow for s in getattr(f, kind)}


# vLLM's own flags that start another checked flag's name (argparse takes a flag given whole as it is,
# never as an abbreviation): `--reasoning-parser deepseek_r1` is no `--reasoning-parser-plugin`. Each
# read from vllm/entrypoints/openai/cli_args.py and vllm/engine/arg_utils.py.
OWN_FLAGS = frozenset({"--reasoning-parser", "--tool-call-parser", "--enable-lora", "--config-format", "--model-impl",
                       "--enable-log-requests", "--lora-modules", "--kv-transfer-config"})


def api_name(name: str, entry: dict) -> str:
    """The model's name in the API of instance ``name`` (what a client sends as "model"): its
    served_model_name, else the instance's name."""
    return entry.get("served_model_name") or name


def owned() -> dict[str, str | None]:
    """Every spelling extra_args may not give -> its key."""
    return owned_by(FLAGS, FIXED)
