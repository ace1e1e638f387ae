"""The form of an entry of ``vllm_instances`` (name -> instance), with each key's default and
meaning, and the rules its values follow (pipeline partition, GPU list, environment);
:func:`instances` reads them normalised, with problems by key path; :func:`normalised` the same
shape for the readers beyond the role."""

from __future__ import annotations

import math
import re
from typing import Any

from rigup.boundary.core import Unreadable, keys_as_read
from rigup.contract import doc_line
from rigup.contract.vllm import FLAGS, HELD_OFF, OTHER, OWN_FLAGS, SHORT, WORD_VALUES, held_off, owned
from rigup.config import Config, once
from rigup.entries import Key, unknown_reference
from rigup.gpu.catalogue import family_of
from rigup.text import query_secret_name, secret_name
from rigup.models import ModelEntry, SERVING_KEYS, ServingInstance, credential_problems, flag_values, of_form, \
    owned_flag_problems
from rigup.models import instances as _entries


class VllmInstance(ServingInstance):
    """One entry of ``vllm_instances``, normalised (every key present)."""

    tp: int
    pp: int
    pp_partition: str | None
    gpu_memory_utilization: float
    served_model_name: str | None
    layers: int | None
    gpus: str | None
    env: dict[str, Any]
    replicas: int | str
    gpus_per_replica: int | str | None
    draft_model: str | None
    speculative: dict[str, Any]


VLLM_INSTANCE: dict[str, Key] = {   # rigup/contract/vllm.py's rows
    **SERVING_KEYS,
    **{f.key: Key(f.form, f.default, doc_line(f)) for f in FLAGS},
    **{r.key: Key(r.form, r.default, r.doc) for r in OTHER},
}

_INTS = re.compile(r"[0-9]+(,[0-9]+)*")
# vllm serve's flags rigup sets from an instance's keys (in extra_args they are refused; vLLM also
# reads --served_model_name and abbreviations such as --serv): flag -> the key.
OWNED_FLAGS = owned()
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# vLLM's options of one letter that take a value (-O: --compilation-config, or --optimization-level in later
# releases; -q: --quantization): argparse reads one glued to its value, -OVALUE, as -O VALUE (round 15 V42:
# -O{"backend": "mod.f"} imported the backend). Options of more letters (-tp, -sc) take no glued value.
GLUED = ("-O", "-q")


def unglued(arg: str) -> str:
    """``arg`` with a one-letter option glued to its value (``-O{...}``, ``-O3``) as ``-O={...}``; any
    other as it is (``-O.key=v``, ``-O=3`` and ``-tp`` among them)."""
    return f"{arg[:2]}={arg[2:]}" if arg[:2] in GLUED and arg[2:3] not in ("", "=", ".") else arg


def short(name: str) -> str:
    """A single-dash option's name as argparse reads it: a short option as it is; a prefix of vLLM's short
    options (contract ``SHORT``) as the one it starts (``-c``: ``-cc``, ``-s``: ``-sc``; argparse takes a unique
    prefix of a single-dash option, and where vLLM has two that it starts it refuses the command anyway)."""
    if name.startswith("--") or len(name) < 2 or name in SHORT:
        return name
    starts = [s for s in SHORT if s.startswith(name)]
    return starts[0] if len(starts) == 1 else name


def spelled(args: list) -> list[str]:
    """extra_args as vLLM's FlexibleArgumentParser reads a flag's name: after ``--``, ``_`` is ``-``;
    ``--flag.key`` and ``-f.key`` (a JSON option's key, after one dash too: vllm/utils/argparse_utils.py
    takes any ``-`` argument with a ``.`` in its name, round 12 V17's ``-sc.model=/x``) are ``--flag``
    and ``-f``, up to its ``=``; ``-OVALUE`` is ``-O=VALUE`` (:func:`unglued`); a prefix of a short
    option is that option (:func:`short`); the value as given (``--speculative-config.model x`` gives
    --speculative-config)."""
    def one(arg: str) -> str:
        if not arg.startswith("-"):
            return arg
        key, sep, value = unglued(arg).partition("=")
        name = short(key.split(".", 1)[0])
        return (name.replace("_", "-") if name.startswith("--") else name) + sep + value
    return [one(str(a)) for a in args]


# A value of a JSON option that is no JSON yet names no key either: -O3, -Odecode (the optimisation level)
_WORD = re.compile(r"[A-Za-z0-9_.+-]*", re.ASCII)


def json_keys(args: list, keys) -> tuple[list[str], list[str]]:
    """Each of ``keys`` (``--option.key``: a key of a JSON option, e.g.
    ``--structured-outputs-config.reasoning_parser_plugin``) that ``args`` give, as vLLM reads them: a
    JSON object after the option or its ``=``, read as vLLM's json.loads reads it (a key given twice, a
    ``\\u`` escape: rigup.boundary.core.keys_as_read), each key at every depth judged; or a dotted
    ``--option.key[.key...][+]`` (``=value`` or the next item: each part judged, and the keys of a value
    that is a JSON object); abbreviations, short options and ``_`` for ``-`` in the option, either in the
    key. And each such option whose value json.loads does not read and which is no plain word (``-O3``):
    rigup cannot tell what vLLM (or an older one's literal_eval) takes from it, so it is refused whole
    (issue 61, round 16 V49: rigup searched the raw text, where ``back\\u0065nd`` never stands)."""
    options = sorted({key.split(".")[0] for key in keys})

    def named(flag: str, found) -> list[str]:
        return [f"{flag}.{k.rstrip('+').replace('-', '_')}" for k in found]

    items = [unglued(str(a)) for a in args]
    dotted = [a.startswith("-") and "." in a.partition("=")[0] for a in items]
    out, unread = [], []
    for flag, value in flag_values(spelled([a if not d else "" for a, d in zip(items, dotted)]), options,
                                   abbrev=True, exact=OWN_FLAGS):
        if value is None:
            continue
        try:
            out += named(flag, keys_as_read(str(value), f"{flag}'s JSON"))
        except Unreadable:
            unread += [] if _WORD.fullmatch(str(value)) else [flag]
    for i, arg in enumerate(items):
        name, sep, value = arg.partition("=")
        if dotted[i]:
            option, *path = name.split(".")
            value = value if sep else items[i + 1] if i + 1 < len(items) else ""
            try:
                inside = keys_as_read(value, "a dotted value")
            except Unreadable:
                inside = []   # vLLM takes it as a string (or a number: 80g)
            out += [k for flag, _ in flag_values(spelled([option]), options, abbrev=True, exact=OWN_FLAGS)
                    for k in named(flag, path + inside)]
    return [k for k in out if k in keys], unread


def held_off_problems(args: list, allow, where: str) -> list[tuple[str, str]]:
    """(``WHERE.extra_args``, why) for each flag of a vLLM feature beyond inference (contract
    ``HELD_OFF``) that ``allow`` (the host's vllm_allow) does not name, under every spelling
    vLLM's argparse reads (:func:`spelled`, and abbreviations such as ``--trust-remote``), and each
    key of a JSON option that turns one on (:func:`json_keys`: --structured-outputs-config's
    reasoning_parser_plugin, as JSON or dotted; such an option whose value rigup cannot read as vLLM
    does), and a flag of ``WORD_VALUES`` given other than a word
    vLLM knows (``--distributed-executor-backend mod.Cls``: ``ray`` and ``mp`` are no code;
    ``--generation-config /a/folder``: ``auto`` and ``vllm`` name no file)."""
    held, keys = held_off(allow), held_off(allow, "keys")
    code = {flag: feature for flag, (feature, _, _) in WORD_VALUES.items() if feature not in allow}
    given = [flag for flag, _ in flag_values(spelled(args), held, abbrev=True, exact=OWN_FLAGS)]
    named, unread = json_keys(args, keys)
    given += named
    given += [flag for flag, value in flag_values(spelled(args), code, abbrev=True, exact=OWN_FLAGS)
              if not re.fullmatch(WORD_VALUES[flag][1], str(value))]
    found = [(f"{where}.extra_args", f"gives {flag}, vLLM's {feature}, off on a shared endpoint "
              f"({HELD_OFF[feature].opens}): drop it, or add {feature} to vllm_allow")
             for flag in given for feature in [held.get(flag) or keys.get(flag) or code[flag]]]
    for flag in unread:
        inside = sorted(k for k in keys if k.startswith(f"{flag}."))
        features = sorted({keys[k] for k in inside})
        found.append((f"{where}.extra_args", f"gives {flag} a value that is no JSON as vLLM reads it (json.loads) "
                      f"nor a plain word, so rigup cannot tell whether it sets {', '.join(inside)} (vLLM's "
                      f"{' and '.join(features)}, off on a shared endpoint): give {flag} a JSON object, or add "
                      f"{' and '.join(features)} to vllm_allow"))
    return found


def held_off_env_problems(env: dict, allow, where: str) -> list[tuple[str, str]]:
    """(``WHERE.NAME``, why) for each variable of ``env`` (vllm_env, an instance's env) that turns on a
    vLLM feature beyond inference that ``allow`` does not name, whatever its value."""
    held = held_off(allow, "env")
    return [(f"{where}.{name}", f"{name} turns on vLLM's {held[name]}, off on a shared endpoint "
             f"({HELD_OFF[held[name]].opens}): drop it, or add {held[name]} to vllm_allow")
            for name in env if name in held]


def partition_problem(partition: str, pp: int, layers: int | None) -> str | None:
    """Why ``partition`` (VLLM_PP_LAYER_PARTITION) does not fit ``pp`` stages of ``layers``."""
    parts = str(partition).replace(" ", "")
    if not _INTS.fullmatch(parts):
        return f"expected layer counts separated by commas (e.g. '13,11,11,10'), got {partition!r}"
    counts = [int(n) for n in parts.split(",")]
    if len(counts) != pp:
        return f"{len(counts)} stages in {partition!r}, but pp is {pp}"
    if 0 in counts:
        return f"a stage of {partition!r} has no layers"
    if layers is not None and sum(counts) != layers:
        return f"{partition!r} sums to {sum(counts)} layers, but the model has {layers}"
    return None


# An instance's env and vllm_env take only variables that tune (issue 61, round 12 V11/V12): an allow-list,
# where rounds 10 and 11 kept a deny-list (LD_*, PYTHON*, *_PLUGIN, the compiled-code caches) that each round
# outgrew: the stack under vLLM (glibc, Python, OpenSSL, the compilers its JIT builds run, Triton, Inductor,
# FlashInfer, NCCL, the hub) reads more variables naming code or a place to load it from than a list keeps up
# with (round 12: HOME, TMPDIR, PATH, GCONV_PATH, OPENSSL_CONF, NCCL_CONF_FILE, CC, CUDA_HOME, TRITON_PTXAS_PATH,
# TRITON_CACHE_MANAGER...). A name is taken when it is one of TUNING; or of a family that tunes (TUNING_FAMILIES:
# VLLM_, NCCL_, CUDA_, TORCH_NCCL_) and none of its words names a place, a program or code (PLACE_WORDS: NCCL_CONF_FILE,
# NCCL_NET_PLUGIN, CUDA_HOME, CUDA_CACHE_PATH, VLLM_NCCL_SO_PATH, VLLM_CACHE_ROOT are not); or, outside every
# family the stack reads (STACK_FAMILIES) and the platform's own names (PLATFORM, and any one-word name that holds
# a place word: CLASSPATH), a name none of whose words is a place: a patched vLLM's own knob
# (DSV4_LOGITS_ROW_CHUNK, docs/cmp170hx.md), which nothing but that patch reads. vLLM's held-off variables
# (contract HELD_OFF) are vllm_allow's to open; secrets (secret_variable: VLLM_API_KEY, HF_TOKEN) check_open_without_key's.
TUNING = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "TOKENIZERS_PARALLELISM",
    "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_DISABLE_XET",
    "HF_XET_HIGH_PERFORMANCE", "NVIDIA_TF32_OVERRIDE", "TORCH_CUDA_ARCH_LIST",
    "TORCHINDUCTOR_COMPILE_THREADS", "TORCH_COMPILE_DEBUG", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_CPP_LOG_LEVEL",
    "TORCH_DISTRIBUTED_DEBUG", "TRITON_PRINT_AUTOTUNING", "VLLM_DISABLE_COMPILE_CACHE", "CUDA_CACHE_DISABLE",
    # Python's that load nothing (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONWARNINGS ... do)
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8"})
TUNING_FAMILIES = ("VLLM_", "NCCL_", "CUDA_", "TORCH_NCCL_", "UCX_")
STACK_FAMILIES = (
    "LD_", "PYTHON", "GCONV_", "OPENSSL_", "SSL_", "CURL_", "REQUESTS_", "GIT_", "BASH_", "MALLOC_", "GLIBC_", "LC_",
    "XDG_", "TORCH", "PYTORCH_", "TRITON_", "HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_",
    "SAFETENSORS_", "FLASHINFER_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GLOO_", "NVIDIA_", "NV_", "NVCC_",
    "CUBLAS", "CUDNN_", "CUFILE_", "NVTE_", "UCX_", "NVSHMEM_", "NIXL_", "RAY_", "DG_", "DEEP_", "XLA_", "TF_", "JAX_",
    "NUMBA_", "CUPY_", "OUTLINES_", "XGRAMMAR_", "TIKTOKEN_", "CMAKE_", "UV_", "PIP_", "VIRTUAL_ENV", "CONDA_", "S3_",
    "AWS_", "HTTP_", "HTTPS_", "NO_PROXY", "ALL_PROXY", "SYSTEMD_", "DBUS_", "MODELSCOPE_", "MASTER_", "OMPI_", "PMIX_",
    "MPI", "ZMQ_", "NODE_", "JAVA_", "PERL", "RUBY", "GEM_", "LUA_", "TCL", "TK_", "KRB5", "GNUTLS_", "NSS_", "LOCAL_RANK",
    # the media and OpenCL loaders (cv2's video); ccache's compiler check (a command), coverage's start file,
    # matplotlib's backend (module://: imported)
    "OCL_", "OPENCV_", "LIBVA_", "VK_", "MESA_", "EGL_", "__EGL_", "__GLX_", "CCACHE_", "COVERAGE_", "MPL")
# glibc's, the shell's and the toolchain's names of one word (glibc's unsecvars.h among them)
PLATFORM = frozenset({
    "HOME", "PATH", "TMPDIR", "TMP", "TEMP", "TEMPDIR", "SHELL", "ENV", "IFS", "PS4", "CDPATH", "CC", "CXX", "CPP", "FC",
    "LD", "AR", "AS", "NM", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDLIBS", "LIBS", "MAKEFLAGS", "MFLAGS",
    "TERM", "TERMINFO", "TERMCAP", "LANG", "LANGUAGE", "LOCPATH", "NLSPATH", "TZ", "TZDIR", "HOSTALIASES",
    "LOCALDOMAIN", "USER", "LOGNAME", "MAIL", "EDITOR", "VISUAL", "PAGER", "BROWSER", "DISPLAY", "MAGIC", "RANK",
    "PWD", "OLDPWD", "MANPATH", "INFOPATH", "CLASSPATH", "NETRC", "CURLOPT", "WORLD_SIZE", "LISTEN_FDS", "LISTEN_PID",
    "NOTIFY_SOCKET", "INVOCATION_ID", "CREDENTIALS_DIRECTORY", "RUNTIME_DIRECTORY", "STATE_DIRECTORY",
    "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY", "DO_NOT_TRACK_FILE"})
PLACE_WORDS = frozenset({
    "HOME", "PATH", "PATHS", "DIR", "DIRS", "DIRECTORY", "ROOT", "FILE", "FILES", "PLUGIN", "PLUGINS", "MODULE",
    "MODULES", "LIB", "LIBS", "LIBRARY", "SO", "DLL", "BIN", "EXE", "EXECUTABLE", "CMD", "COMMAND", "PROGRAM", "SHELL",
    "COMPILER", "CLS", "CLASS", "MANAGER", "FACTORY", "HOOK", "HOOKS", "IMPORT", "PRELOAD", "LOCATION", "PREFIX",
    "CONF", "CONFIG", "CFG", "RC", "URL", "URI", "ENDPOINT", "SERVER", "TMPDIR", "TEMP", "TMP",
    # a loader's list of libraries (OCL_ICD_FILENAMES, OCL_ICD_VENDORS), a library or driver by name
    # (OPENCV_OPENCL_RUNTIME, LIBVA_DRIVER_NAME), a logging stream (VLLM_LOGGING_STREAM: ext://module imports)
    "FILENAME", "FILENAMES", "VENDORS", "RUNTIME", "DRIVER", "DRIVERS", "STREAM",
    # a listener's or a peer's address (NCCL_RAS_ADDR: NCCL's RAS listener; VLLM_DP_MASTER_IP, VLLM_PORT)
    "ADDR", "ADDRESS", "IP", "HOST", "HOSTNAME", "PORT"})
# of a tuning family, yet each opens something (issue 61, round 14 V34): VLLM_ALLOW_INSECURE_SERIALIZATION lets
# vLLM's processes send each other pickles (code run on load); VLLM_TRACE_FUNCTION writes a line for every
# function call into the temporary directory's vllm/, without bound (the unit's PrivateTmp keeps it from other
# users, not from filling the disk); VLLM_USE_MODELSCOPE fetches models from ModelScope's hub, past rigup's
# model_fetch and the offline hub it sets; VLLM_ENABLE_RESPONSES_API_STORE keeps every Responses API answer in
# the server's memory, never dropped (vllm/envs.py: "will cause a memory leak"), each read back by its id;
# NCCL_COMM_ID puts NCCL's bootstrap root, a listener rank 0 opens, at the address it names, with NCCL's fixed
# magic in place of a random one (bootstrap.cc); NCCL_RAS_ENABLE switches NCCL's RAS subsystem, a listener in
# every rank (NCCL_RAS_ADDR, by default localhost:28028) answering the job's state: NCCL 2.24 and later run it
# by default, so refusing the name keeps NCCL's default, as refusing its address does
DENIED = frozenset({"VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_TRACE_FUNCTION", "VLLM_USE_MODELSCOPE",
                    "VLLM_ENABLE_RESPONSES_API_STORE", "NCCL_COMM_ID", "NCCL_RAS_ENABLE"})
# the end of a name that is a place too (VLLM_ASSETS_CACHE, HF_MODULES_CACHE): CACHE elsewhere tunes (VLLM_DISABLE_COMPILE_CACHE)
PLACE_ENDS = ("_CACHE",)
# HEADER(S): request headers a client sends, an Authorization among them (OTEL_EXPORTER_OTLP_HEADERS,
# OTEL_EXPORTER_OTLP_TRACES_HEADERS="Authorization=Bearer ...", read by the exporter --otlp-traces-endpoint
# turns on: round 15 V47)
# PWD (MYSQL_PWD: MySQL's clients' password), CREDENTIAL(S), COOKIE(S), JWT: round 16 V52
# The variables roles/vllm/command.py env_vars writes for an instance -> the key that sets it (None: rigup's own:
# the server's home and caches, the offline hub, no usage stats). Given again in env or vllm_env it would win over
# what rigup checked (issue 61, round 13 V28: CUDA_VISIBLE_DEVICES served a card the burn-in quarantined).
RIGUP_SETS: dict[str, str | None] = {
    "CUDA_VISIBLE_DEVICES": "vllm_instances.NAME.gpus (and the burn-in's accepted cards)",
    "CUDA_DEVICE_ORDER": "vllm_instances.NAME.gpus", "VLLM_PP_LAYER_PARTITION": "vllm_instances.NAME.pp_partition",
    "NCCL_P2P_DISABLE": "vllm_nccl_p2p_disable", "NCCL_NVLS_ENABLE": "vllm_nccl_nvls_enable",
    "NCCL_IB_DISABLE": "vllm_nccl_ib_disable", "NCCL_SOCKET_IFNAME": "vllm_socket_ifname",
    "GLOO_SOCKET_IFNAME": "vllm_socket_ifname", "VLLM_HOST_IP": "vllm_host_ip",
    **dict.fromkeys(("HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR",
                     "TORCHINDUCTOR_CACHE_DIR", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"))}


def secret_variable(name: str) -> bool:
    """Whether ``name`` holds a secret: typed into the configuration it passes through every run's output, and the
    env file is one rigup writes for the service (issue 61, round 12 V14; round 13 V22 the other spellings; rounds
    16-19: glued, numbered, plural). A name of the tuning families (VLLM_, NCCL_, CUDA_, TORCH_NCCL_, UCX_) by the words
    of rigup.text.secret_name, the one list (VLLM_API_KEY, HF_TOKEN, *_PASSWORD2, X_PRIVATEKEY, *_HEADERS,
    AUTHORIZATION; VLLM_MAX_TOKENS and VLLM_KEYBOARD_X are none); any other name, which no part of vLLM reads,
    by the wider rule of a query parameter's (a secret's word inside another: MONKEY_PATCH and OLDPWD_X are
    refused, the price of closing the spellings no list ends). TUNING's names and the platform's are none (PWD:
    the working directory, refused as the platform's)."""
    name = name.upper()
    if name in PLATFORM or name in TUNING:
        return False
    return secret_name(name) if name.startswith(TUNING_FAMILIES) else query_secret_name(name)


def tunes(name: str) -> bool:
    """Whether an instance's env or vllm_env may give ``name`` (the allow-list above), judged in upper case
    (libcurl and Python's urllib read http_proxy too)."""
    name = name.upper()
    words = set(name.split("_"))
    if name in TUNING:
        return True
    if words & PLACE_WORDS or name.endswith(PLACE_ENDS) or name in PLATFORM or name in DENIED:
        return False
    if name.startswith(TUNING_FAMILIES):
        return True
    if name.startswith(STACK_FAMILIES):
        return False
    return "_" in name or not any(w in name for w in PLACE_WORDS if len(w) > 2)


def env_problems(env: dict, where: str) -> list[tuple[str, str]]:
    """Each key of ``env`` that is not NAME: a one-line string, number or bool, that rigup sets for the
    instance itself (:data:`RIGUP_SETS`), or that rigup does not let tune the server (:func:`tunes`);
    vLLM's held-off variables (vllm_allow opens them) and secrets (check_open_without_key) are refused by
    their own checks."""
    held = held_off(kind="env")

    def why(key: str, value) -> str | None:
        if not ENV_NAME.fullmatch(key) or isinstance(value, (dict, list)) or "\n" in str(value):
            return "expected NAME: a one-line string, number or bool"
        if key.upper() in RIGUP_SETS:
            return f"{key} is one rigup sets for the instance: " + \
                (f"set {RIGUP_SETS[key.upper()]} in its place" if RIGUP_SETS[key.upper()] else "drop it")
        if key in held or secret_variable(key) or tunes(key):
            return None
        return (f"{key} is not a variable rigup lets tune vLLM: the loader, Python, NCCL, Triton, the compilers or "
                "another library under vLLM loads code or files from where such a variable points, and rigup sets "
                "the server's HOME, caches and PATH itself; drop it (what tunes: VLLM_*, NCCL_*, CUDA_*, TORCH_NCCL_* "
                "naming no path, file, plugin or program, OMP_NUM_THREADS, PYTORCH_CUDA_ALLOC_CONF, ...: "
                "rigup/instances/vllm.py TUNING; a patched vLLM's own knob of two words or more, none a place, passes)")
    return [(f"{where}.{key}", problem) for key, value in env.items() if (problem := why(str(key), value))]


def speculative_problems(entry: dict, where: str, declared: dict) -> list[tuple[str, str]]:
    """A ``draft_model`` that is not a key of ``models`` (``declared``), and ``speculative`` keys
    that are not names or values that are not one-line scalars; its ``model`` is the drafter's."""
    found = []
    draft = entry["draft_model"]
    if draft is not None and draft not in declared:
        found.append((f"{where}.draft_model", unknown_reference(draft, declared, "models")))
    for key, value in entry["speculative"].items():
        if key == "model":
            found.append((f"{where}.speculative.model", "the drafter is a key of models: set draft_model (its dest "
                                                        "is fetched, checked and passed as model)"))
        elif not ENV_NAME.fullmatch(str(key)) or isinstance(value, (dict, list)) or value is None \
                or "\n" in str(value) or isinstance(value, float) and not math.isfinite(value):
            found.append((f"{where}.speculative.{key}", "expected NAME: a one-line string, number or bool"))
    return found


def _family_layers(model: ModelEntry | None) -> int | None:
    """The layer count rigup/gpu/models.yml gives the model's family (``num_hidden_layers``), if any."""
    value = (family_of(model) or {}).get("num_hidden_layers") if model else None
    return int(value) if isinstance(value, int) else None


def instances(data: Config, gpu_count: int | None = None) -> tuple[dict[str, VllmInstance], list[tuple[str, str]]]:
    """The host's ``vllm_instances``, normalised, and (key path, problem) for each wrong entry;
    ``gpu_count`` (when known) bounds tp x pp. Made once per run for each ``gpu_count``
    of a host's configuration (rigup.config.once): read it, never change it."""
    return once(data, ("vllm_instances", gpu_count), lambda: _instances(data, gpu_count))


def _instances(data: Config, gpu_count: int | None) -> tuple[dict[str, VllmInstance], list[tuple[str, str]]]:
    allow = data.get("vllm_allow") if isinstance(data.get("vllm_allow"), list) else ()   # else its form refuses it

    def problems(entry: dict, where: str, model) -> list[tuple[str, str]]:
        gpus_needed = entry["tp"] * entry["pp"]
        found = owned_flag_problems(spelled(entry["extra_args"]), OWNED_FLAGS, where, abbrev=True, exact=OWN_FLAGS) + \
            held_off_problems(entry["extra_args"], allow, where) + held_off_env_problems(entry["env"], allow, f"{where}.env")
        if str(entry["served_model_name"] or "").startswith("-"):
            found.append((f"{where}.served_model_name", f"{entry['served_model_name']!r} starts with '-': vLLM would "
                                                        "read it as an option"))
        if isinstance(entry["gpus_per_replica"], int) and entry["gpus_per_replica"] != gpus_needed:
            found.append((f"{where}.gpus_per_replica", f"{entry['gpus_per_replica']} GPUs, but a vLLM replica takes "
                                                       f"tp {entry['tp']} x pp {entry['pp']} = {gpus_needed}"))
        if gpu_count is not None and gpus_needed > gpu_count:
            found.append((f"{where}.tp", f"tp {entry['tp']} x pp {entry['pp']} = {gpus_needed} GPUs, "
                                         f"but this host has {gpu_count}"))
        if entry["pp_partition"] is not None:
            why = partition_problem(entry["pp_partition"], entry["pp"], entry["layers"] or _family_layers(model))
            found += [(f"{where}.pp_partition", why)] if why else []
        elif entry["layers"] is not None and entry["pp"] > entry["layers"]:
            found.append((f"{where}.pp", f"pp {entry['pp']} stages for {entry['layers']} layers"))
        if entry["gpus"] is not None:
            gpus = entry["gpus"].replace(" ", "")
            if not _INTS.fullmatch(gpus):
                found.append((f"{where}.gpus", f"expected GPU indices separated by commas (e.g. '0,1'), "
                                               f"got {entry['gpus']!r}"))
            elif len(gpus.split(",")) != gpus_needed:
                found.append((f"{where}.gpus", f"{len(gpus.split(','))} GPUs for tp {entry['tp']} x "
                                               f"pp {entry['pp']} = {gpus_needed}"))
        found += speculative_problems(entry, where, data.get("models") or {})
        return found + env_problems(entry["env"], f"{where}.env")
    found, wrong = _entries(data, "vllm_instances", VLLM_INSTANCE, problems)
    # vllm_env is read where vLLM serves, and on a Ray node (its workers' environment: roles/vllm/cluster.py)
    host_env = data.get("vllm_env") if data.get("vllm_instances") or data.get("vllm_ray_role") else None
    return found, wrong + (held_off_env_problems(host_env, allow, "vllm_env") + credential_problems(host_env, "vllm_env")
                           if isinstance(host_env, dict) else [])


def normalised(data: Config) -> dict[str, VllmInstance]:
    """The host's vLLM instances for the readers beyond the role (through
    :func:`rigup.instances.every`: the balancer, plays/bench.py, status.py), by name in order:
    :func:`instances`' shape, each entry of its own form (the rules across entries and ``models``
    are :func:`instances`', which preflight checks). Made once per run for a host's configuration
    (rigup.config.once): read it, never change it."""
    return formed(data)[0]


def formed(data: Config) -> tuple[dict[str, VllmInstance], list[tuple[str, str]]]:
    """:func:`normalised`, and (key path, problem) for each entry it leaves out."""
    return once(data, ("vllm_instances", "normalised"),
                lambda: of_form("vllm_instances", data.get("vllm_instances") or {}, VLLM_INSTANCE))
