"""llama-server's contract: one row per instance key that becomes a flag (:data:`FLAGS`), and the
flags rigup writes from the instance itself (:data:`FIXED`). Everything else is made from them:
the entry form of ``llama_server_instances`` (rigup/instances/llama_server.py), the command line
(roles/llama_server/command.py :func:`args`), the flags extra_args may not give again (policy
``owned``; ``also``: extra_args may give it again, the last one wins, and preflight's checks read
that one), what tune.py sweeps (``sweep``) and how it spells it (:func:`spellings`), the keys of
``llama_server_tuned``, the smoke's check of a new build's ``--help`` (roles/llama_cpp/shipped/smoke.py:
a flag the build does not know fails the host, naming it) and the generated docs.

Adding a valued llama-server flag: a row here and a test, then ``make docs``.

A row: ``key`` (the instance key), ``form`` (rigup/config.py's form language), ``default``,
``spellings`` (llama.cpp's common/arg.cpp; the first is written), ``doc``, ``policy``, ``write``
(``value``: ``FLAG VALUE``, none when the value is null; ``switch``: the flag when true;
``pair``: the first spelling when true, the second when false), ``sweep`` (tune.py sets it) and
``since`` (where the flag first appeared in llama.cpp, for the reader: a build's own ``--help``
is what is checked).

Standard library only (and rigup/contract/__init__.py): tests/gpu imports it with a plain python3.
The tuner on a host reads none of it: plays/tuning.py writes the swept rows' spellings into its
spec (``flags``).
"""

from __future__ import annotations

from typing import NamedTuple

from rigup.contract import ALSO, MAPS, OWNED, PAIR, SWITCH, VALUE, Flag, Row, doc_line, flag_args, owned_by

# the files of an instance NAME on a host (roles/llama_server writes them; tune.py, the metrics,
# the watchdog and bench.py read them): .format(NAME)
KEY = MAPS["llama_server_instances"]
DROPIN = "/etc/systemd/system/rigup-llama@{}.service.d/rigup.conf"

# llama.cpp's KV cache types (-ctk, -ctv: common/arg.cpp kv_cache_types).
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


# In the order the command line gives them (a new row goes last: the drop-ins of hosts already
# serving keep their text, so nothing restarts for the order).
FLAGS: tuple[Flag, ...] = (
    Flag("ctx", "count 1..16777216", "auto", ("-c", "--ctx-size"),
         "total tokens of context, shared by the slots; auto (or N): rigup sizes it (replicas.py sizing: slots of "
         "8,192 tokens, as many as the VRAM left after the weights holds, at most 32; the plan says why)", sweep=True),
    Flag("parallel", "count", "auto", ("--parallel", "-np"), "slots, requests served at once; auto (or N): see ctx",
         sweep=True),
    Flag("ngl", "int -1..", 99, ("-ngl", "--gpu-layers", "--n-gpu-layers"), "layers on the GPUs (99 or -1: all)",
         policy=ALSO, sweep=True),
    Flag("flash_attn", "one of on|off|auto", "auto", ("-fa", "--flash-attn"), "flash attention", policy=ALSO,
         sweep=True, since="PR #5021 (2024); on|off|auto since 2025"),
    Flag("split_mode", "one of none|layer|row|tensor", "layer", ("-sm", "--split-mode"),
         "how a model is split over GPUs", policy=ALSO, sweep=True),
    Flag("jinja", "bool", True, ("--jinja", "--no-jinja"), "the model's chat template (--jinja) or llama.cpp's own",
         write=PAIR, since="PR #11016 (2025); --no-jinja later"),
    Flag("batch", "int 1.. or null", None, ("-b", "--batch-size"),
         "the logical batch, in tokens (null: llama.cpp's 2048)", sweep=True),
    Flag("ubatch", "int 1.. or null", None, ("-ub", "--ubatch-size"),
         "the physical batch, in tokens (null: llama.cpp's 512)", sweep=True),
    Flag("cache_type_k", f"one of {'|'.join(CACHE_TYPES)} or null", None, ("-ctk", "--cache-type-k"),
         "the K cache's type (null: llama.cpp's f16); roles/llama_server/traps.yml says which types flash attention "
         "has kernels for", sweep=True),
    Flag("cache_type_v", f"one of {'|'.join(CACHE_TYPES)} or null", None, ("-ctv", "--cache-type-v"),
         "the V cache's type (null: f16); a quantized one needs flash attention", sweep=True),
    Flag("cache_ram", "int -1.. or null", None, ("-cram", "--cache-ram"),
         "MiB of host RAM for llama-server's prompt cache (null: llama.cpp's 8192; 0: off; -1: no limit). On one "
         "H200 at 32 concurrent, 0 served 1.41x the tok/s: with the cache on, each new request on a used slot first "
         "copies that slot's KV state to RAM, one after another (tests/gpu/results/2026-12-02-h200-admission.md); "
         "tune.py measures it per host", sweep=True, since="PR #16391 (2025-10)"),
    Flag("n_cpu_moe", "int 0.. or null", None, ("--n-cpu-moe", "-ncmoe"),
         "the first N layers' MoE expert weights stay in host RAM (a MoE model larger than the VRAM, with ngl 99); "
         "null: none", sweep=True, since="PR #15077 (2025-08)"),
    Flag("main_gpu", "int 0.. or null", None, ("-mg", "--main-gpu"),
         "the GPU (of the instance's own, in order) for the whole model with split_mode none, or for intermediate "
         "results and the KV cache with row; null: llama.cpp's 0", sweep=True),
    Flag("tensor_split", "str or null", None, ("-ts", "--tensor-split"), "shares per GPU, e.g. '16,16,17,0'",
         sweep=True),
    Flag("metrics", "bool", True, ("--metrics",), "Prometheus metrics at /metrics (roles/metrics scrapes them)",
         write=SWITCH),
    Flag("cache_reuse", "int 0.. or null", None, ("--cache-reuse",),
         "the smallest chunk, in tokens, of a new prompt that is reused from a slot's KV cache by shifting it (a "
         "client that resends a long history with parts dropped or moved); null: llama.cpp's 0, off",
         since="PR #9866 (2024-10); a request's n_cache_reuse since PR #17858 (2025-12)"),
    Flag("reasoning_budget", "int -1.. or null", None, ("--reasoning-budget",),
         "tokens a reasoning model may think before its answer is forced (0: no thinking, -1: unlimited); null: "
         "llama.cpp's -1", since="2025 as -1 or 0; a budget of N tokens since 2026 (llama-swap#584)"),
    Flag("sleep_idle_s", "int 1.. or null", None, ("--sleep-idle-seconds",),
         "the model and its KV cache leave the GPUs after this many seconds without a request and load again on "
         "the next (which waits for the load; a router's models each on their own); null: never. The throughput "
         "watchdog then judges the server only after requests were served since its last check (read from /metrics, "
         "which neither wakes it nor counts as a request): it never wakes it; needs metrics",
         since="PR #18228 (2025-12)"),
)

# The instance's keys that are no flag of their own (after rigup/contract's SERVING, the keys of every
# serving entry).
OTHER: tuple[Row, ...] = (
    Row("replicas", "count 1..1024", 1, "auto or N: servers behind a balancer on host:port (roles/balancer), each its own unit "
                                "rigup-llama@NAME-K on 127.0.0.1:port+1+K (replicas.py)"),
    Row("gpus_per_replica", "count or null", None, "auto (the fewest GPUs that hold the model) or N; null: the host's "
                                                  "GPUs shared out evenly (one replica: all of them)"),
    Row("min_tokens_per_s", "float 0.. or null", None, "the throughput watchdog's floor (roles/watchdog): restarted "
                                                       "after watchdog_bad_checks checks below it; null: 50% of the tok/s "
                                                       "the health gate measured at the (re)start; 0: not watched"),
    Row("rpc_workers", "list of str", [], "hosts of the inventory whose llama.cpp RPC server (roles/rpc_worker) takes "
                                          "layers of this instance: --rpc ADDRESS:PORT,...; for models that do not fit "
                                          "one host (it costs tok/s and load time); one server (replicas 1)"),
    Row("also", "list of name", [], "more keys of models served on the same port: llama-server's router mode "
                                    "(--models-preset, one child process per loaded model on a loopback port the kernel "
                                    "picks); a request names its model by its key; the instance's own model is loaded "
                                    "at start, another on the first request for it; the instance's flags apply to each; "
                                    "one server (replicas 1, no rpc_workers)"),
    Row("models_max", "count 1..", "auto", "router mode (also): models loaded at once (--models-max); beyond it the "
                                           "least recently used is unloaded. auto: as many of the set's models (its "
                                           "pinned ones aside) as fit at once on the router's cards beside the pinned "
                                           "ones, the largest first (each at its weights + KV cache at its ctx + 1 GiB "
                                           "per GPU), at least 1 (the plan says why); N: the VRAM plan counts the N "
                                           "largest"),
    Row("queue", "int 1.. or null", None, "router mode (also): a bound on waiting requests. HAProxy (roles/balancer) "
                                          "takes the instance's port, the router moves to 127.0.0.1:port+1; at most "
                                          "parallel x models_max at the router, this many more wait (each at most "
                                          "llama_server_health_timeout s, as long as a load may take), beyond them 429 with "
                                          "Retry-After; null: no bound (the router queues every request)"),
    Row("per_model", "map", {}, "router mode (also): flags of one model of the set, by its key, e.g. {tiny: {ctx: "
                                "4096, cache_type_k: q8_0}}: any flag key but metrics and sleep_idle_s (ctx and "
                                "parallel as numbers); the VRAM plan counts each model at its own. A key given "
                                "here leaves the command line for the preset (llama-server puts its command line "
                                "before a preset): the instance's value in [*], each model's own in its section. "
                                "Two more keys for a model of also: pinned: true, it leaves the router (never "
                                "evicted) for a server of its own, unit rigup-llama@NAME.MODEL on the instance's "
                                "host at port + 2 + i (i: its place among the pinned, in also's order), on the "
                                "router's cards, with the instance's key and flags (and its own), answering as "
                                "MODEL (--alias; a gateway sends requests naming it there); the instance's ctx set, not auto; "
                                "load_on_startup: true, "
                                "the router loads it at start too (the instance's own model always)"),
)
# per_model's keys that are no flag: a model pinned beside the router, one loaded at the router's start
PER_MODEL_OWN = ("pinned", "load_on_startup")
# A pinned model's server (roles/llama_server): rigup-llama@NAME.MODEL, .format(NAME, MODEL)
PINNED_UNIT = "{}.{}"
# The flag keys a model of a router's set may set for itself (per_model): not the router's own
PER_MODEL = tuple(f.key for f in FLAGS if f.key not in ("metrics", "sleep_idle_s"))
# Router mode (``also``): the models' presets, one section per model (roles/llama_server writes it: .format(NAME))
PRESET = "/etc/rigup/llama-server/{}.models.ini"
# The HAProxy backend of a replicated instance or a queued router (roles/balancer; the relay reads its queue): .format(NAME)
BACKEND = "llama-{}"

# Every flag by which llama-server takes a model from elsewhere than the -m rigup sets (fetched, sized and
# pinned by revision): a download of the model or one beside it (a draft, a projector) at start, or the file
# within a repository it downloads. Read from llama.cpp's common/arg.cpp (its set_env LLAMA_ARG_*_URL, _REPO, _HF_FILE): -dr (Docker
# Hub) was missing and replaced the model rigup planned (issue 61, round 6 LS1). Local files of other models
# (-md, -mm) are the operator's to give.
DOWNLOADS = ("-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo",
             "-mmu", "--mmproj-url", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf",
             # the hub token of those downloads: none is left to make, and a token in argv is in ps, the
             # unit and the journal (round 4 C6)
             "-hft", "--hf-token",
             # a TTS vocoder from the hub (llama-server's README; newer than the lab's tree: refused before it is)
             "-hfv", "-hfrv", "--hf-repo-v", "-hffv", "--hf-file-v")
# Flags rigup writes from the instance itself: spelling -> the key (None: the instance's name).
FIXED: dict[str, str | None] = {
    "-m": "model", "--model": "model", **dict.fromkeys(DOWNLOADS, "model"), "-a": None, "--alias": None,
    "--host": "host", "--port": "port", "--api-key": "api_key",
    "--api-key-file": "api_key", "--rpc": "rpc_workers", "--models-preset": "also", "--models-dir": "also",
    "--models-max": "models_max", "--models-autoload": "also", "--no-models-autoload": "also"}

BY_KEY: dict[str, Flag] = {f.key: f for f in FLAGS}

class HeldOff(NamedTuple):
    """A feature of llama-server beyond inference that a shared endpoint holds off until an operator
    allows it by name (``llama_server_allow``): every flag spelling (common/arg.cpp) and
    ``LLAMA_ARG_*`` variable (its ``set_env``) that turns it on, and what it opens."""

    flags: tuple[str, ...]
    env: tuple[str, ...]
    opens: str


# Read from llama.cpp's common/arg.cpp and tools/server/*.cpp (the lab's b8779 tree); a negation
# (--no-slots, --no-agent, LLAMA_ARG_NO_*) turns a feature off and is no spelling of it here.
HELD_OFF: dict[str, HeldOff] = {
    "slots": HeldOff(("--slots", "--slot-save-path"), ("LLAMA_ARG_ENDPOINT_SLOTS",),
                     "GET /slots: every slot's prompt and what it generated so far, any client's (llama-server "
                     "serves it by default: rigup writes --no-slots); --slot-save-path: POST /slots/ID saves and "
                     "restores KV caches as files on the host"),
    "props": HeldOff(("--props",), ("LLAMA_ARG_ENDPOINT_PROPS",),
                     "POST /props: one client changes the server's global settings for every other"),
    "tools": HeldOff(("--tools", "--tools-runtime"), ("LLAMA_ARG_TOOLS", "LLAMA_ARG_TOOLS_RUNTIME"),
                     "/tools: built-in tools a client runs on the host as the service user (exec_shell_command, "
                     "a shell; read_file, write_file, edit_file, grep_search ...), or in a container or over SSH "
                     "(--tools-runtime)"),
    "agent": HeldOff(("-ag", "--agent"), ("LLAMA_ARG_AGENT",),
                     "every built-in tool (a shell included) and the MCP CORS proxy at once"),
    "mcp": HeldOff(("--mcp-servers-config", "--mcp-servers-json", "--ui-mcp-proxy", "--webui-mcp-proxy"),
                   ("LLAMA_ARG_MCP_SERVERS_CONFIG", "LLAMA_ARG_MCP_SERVERS_JSON", "LLAMA_ARG_UI_MCP_PROXY"),
                   "MCP servers that llama-server starts or connects to, their tools at /tools; /cors-proxy, "
                   "which fetches any URL a client names from the host's network"),
    "log_prompts": HeldOff(("--log-prompts-dir", "--log-file"), ("LLAMA_ARG_LOG_FILE",),
                           "every client's prompt written to a directory on the host; --log-file: llama-server's "
                           "log in a file of the service user's choosing, outside the journal's retention and "
                           "access (round 4 C3)"),
    "verbose_log": HeldOff(("-v", "--verbose", "--log-verbose", "-lv", "--verbosity", "--log-verbosity"),
                           ("LLAMA_ARG_LOG_VERBOSITY",),
                           "llama-server's debug log (SRV_DBG) in the journal: every streamed chunk of every "
                           "client's answer, and with a build that logs requests their bodies, prompts included"),
    # a flag that reads a file into what a client is answered serves that file: GET /props answers the
    # chat template and the UI config, and a /completion answer its generation settings' grammar
    "files": HeldOff(("--path", "--media-path", "--chat-template-file", "--grammar-file", "-jf", "--json-schema-file",
                      "--ui-config-file", "--webui-config-file"),
                     ("LLAMA_ARG_STATIC_PATH", "LLAMA_ARG_CHAT_TEMPLATE_FILE", "LLAMA_ARG_UI_CONFIG_FILE"),
                     "--path: the files under a directory on the host served to any client as static files; "
                     "--media-path: a request loads any file under a directory on the host by file:// URL; "
                     "--chat-template-file, --ui-config-file: that file's text in GET /props (chat_template, "
                     "ui_settings), any client's; --grammar-file, --json-schema-file: that file's text as the "
                     "grammar of every /completion answer's generation_settings"),
    "cors": HeldOff(("--cors-origins", "--cors-credentials"), ("LLAMA_ARG_CORS_ORIGINS", "LLAMA_ARG_CORS_CREDENTIALS"),
                    "llama-server's own CORS settings by hand; by default it echoes any Origin with credentials "
                    "allowed (any web page a user opens may call the API as that user's browser), so rigup "
                    "writes LLAMA_ARG_CORS_ORIGINS from llama_server_cors_origins (none: no origin)"),
    "lora": HeldOff(("--lora", "--lora-scaled"), (),
                    "POST /lora-adapters: one client sets the LoRA adapters' scales for every other (the server's "
                    "global adapters; a request's own \"lora\" field is its own), and GET /lora-adapters names "
                    "their files on the host (issue 61, round 9 I1)"),
    "control_vectors": HeldOff(("--control-vector", "--control-vector-scaled", "--control-vector-layer-range"), (),
                               "a control vector read from a file on the host (a path rigup neither fetches nor "
                               "checks) and added to every layer's output for every client's answers (issue 61, "
                               "round 11 C4)"),
    "models_admin": HeldOff((), (),
                            "a router's POST /models (downloads a model from the hub onto the host), DELETE /models "
                            "(deletes one), POST /models/load and /models/unload: no flag turns them off; the gateway "
                            "and an instance's own HAProxy (replicas, a router's queue) answer them 403, and a router "
                            "alone on its port has no hub cache to download into (LLAMA_CACHE: a path it cannot make) "
                            "and no model it may delete (its preset's are not removable)"),
}
# The variable rigup writes with the allowed origins (an empty value: llama-server sets no origin's
# Access-Control-Allow-Origin; an unknown variable is ignored by an older build, where a flag would fail
# the smoke's check of its --help)
CORS_ENV = "LLAMA_ARG_CORS_ORIGINS"


def held_off_flags(allow=()) -> dict[str, str]:
    """Every spelling of a feature of :data:`HELD_OFF` not in ``allow`` -> its feature."""
    return {s: name for name, f in HELD_OFF.items() if name not in allow for s in f.flags}


def held_off_env(allow=()) -> dict[str, str]:
    """Every variable of a feature of :data:`HELD_OFF` not in ``allow`` -> its feature."""
    return {v: name for name, f in HELD_OFF.items() if name not in allow for v in f.env}


def written_env(origins=()) -> dict[str, str]:
    """What rigup writes into every llama-server's environment: the allowed CORS ``origins``
    (llama_server_cors_origins; none: an empty value, which sets no origin). With ``cors`` allowed,
    a --cors-origins of extra_args still wins (llama-server reads its command line after it)."""
    return {CORS_ENV: ",".join(origins)}


def written_flags(allow=()) -> list[str]:
    """The flags rigup writes to hold off what llama-server serves by default: ``--no-slots`` unless
    ``slots`` is allowed."""
    return [] if "slots" in allow else ["--no-slots"]

SWEPT: tuple[str, ...] = tuple(f.key for f in FLAGS if f.sweep)


def key_file(name: str, inst: dict) -> str | None:
    """Instance ``name``'s API key file on its host (``inst``: the instance), or None without
    ``api_key``."""
    return KEY.format(name) if inst.get("api_key") else None


def api_model(name: str, entry: dict) -> str:
    """The model a request names to reach instance ``name`` (its ``entry``): its own name (its
    --alias), or for a router (``also``) its own model's key of models."""
    return entry["model"] if entry.get("also") else name


def queued(entry: dict) -> bool:
    """A router with a bounded queue (``also`` and ``queue``): HAProxy (roles/balancer) on its port,
    the router behind it on port + 1 (llama_server's units and the metrics relay read it alike)."""
    return bool(entry.get("also")) and entry.get("queue") is not None


def pinned(entry: dict) -> dict[str, int]:
    """A router's pinned models (``per_model: {M: {pinned: true}}``, models of ``also``), each ->
    the port of its own server: the instance's port + 2 + i, i its place among the pinned in
    also's order (port + 1 is a queued router's). {} for any other entry; not validated (preflight
    refuses a wrong one before a converge reads it)."""
    own, port = entry.get("per_model") or {}, entry.get("port")
    if not isinstance(entry.get("also"), list) or not isinstance(own, dict) or type(port) is not int:
        return {}
    chosen = [m for m in entry["also"] if isinstance(own.get(m), dict) and own[m].get("pinned") is True]
    return {m: port + 2 + i for i, m in enumerate(chosen)}


def owned() -> dict[str, str | None]:
    """Every spelling extra_args may not give (policy ``owned``, and :data:`FIXED`) -> its key."""
    return owned_by(FLAGS, FIXED)


def spellings(keys=None) -> dict[str, tuple[str, ...]]:
    """key -> its spellings (the first is written), for ``keys`` (default: every row), with
    ``port`` and ``host`` (what the tuner's own servers change)."""
    rows = {f.key: f.spellings for f in FLAGS if keys is None or f.key in keys}
    return {**rows, "port": ("--port",), "host": ("--host",)}


def args(inst: dict) -> list:
    """The flags of :data:`FLAGS` for an instance (its values as they are, in the table's order);
    a router's keys that some model sets for itself (``per_model``) are the preset's
    (:func:`preset_values`), not the command line's."""
    moved = {k for flags in (inst.get("per_model") or {}).values() for k in flags}
    return flag_args([f for f in FLAGS if f.key not in moved], inst)


def preset_values(values: dict) -> list[tuple[str, str]]:
    """(key, value) of a router's preset for flag keys ``values`` (key -> value): the flag's long
    spelling without its dashes (llama-server's preset keys), a pair or switch as true/false, a null
    left out (the engine's default); roles/llama_server/command.py writes each as a line."""
    out = []
    for f in FLAGS:
        if f.key not in values or values[f.key] is None:
            continue
        name = next(s for s in f.spellings if s.startswith("--")).lstrip("-")
        value = values[f.key]
        out.append((name, str(bool(value)).lower() if f.write in (PAIR, SWITCH) else str(value)))
    return out
