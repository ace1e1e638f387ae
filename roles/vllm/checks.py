"""roles/vllm's refusals: pure functions of a host's plan, facts and data (see rigup/refusal.py),
and the ports its instances take.

    check_config    an entry of vllm_instances that is wrong, by key path
    check_open_without_key  bound beyond loopback without an API key, or a secret (VLLM_API_KEY, HF_TOKEN,
                    *_TOKEN, *_KEY...) typed into env or vllm_env
    check_pin       vLLM not pinned to an exact version or a commit of a git URL that git reads as
                    one (a short commit: exactly one of the repository, expanded on the host); a
                    patch series that does not match its sha256 manifest on the controller; extra
                    packages that are not NAME==VERSION
    check_host_ip   vllm_host_ip that is not an IP address
    check_systemd   instances on a host where systemd is not PID 1
    check_vram      weights that leave no room for the KV cache on the instance's cards
    check_vllm_cc   a model family whose stock vLLM kernels need a higher compute capability
    check_replicas  replicas x tp x pp beyond the host's GPUs, a server's port outside 1024..65535
    check_wheel_cuda  a vLLM wheel built for a newer CUDA than the host's driver runs (the wheel's
                    CUDA from a ``+cuXYZ`` tag in vllm_pip_version or a ``.../cuXYZ`` index in
                    vllm_pip_args; unknown: not refused)
    check_ray       (FLEET_CHECKS, with every host's data) a Ray node that cannot join its cluster:
                    no Ray version, no head or one that is no Ray head, another Ray or vLLM than
                    its head's, instances on a worker, no systemd
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.config import Config, ConfigError, host_ip
from rigup.contract import vllm as vllm_contract
from rigup.text import carries_credentials, no_secret_value, secret_name
from rigup.gpu.driver import driver_for_checks
from rigup.gpu.catalogue import family_of, min_driver_for_cuda, newest_cuda_for_driver, version_tuple
from rigup.gpu.plan import Plan, cards_gib_text, gpu_count, gpu_host, unlock_wait, vram_cards
from rigup.models import models, secret_flag
from rigup.refusal import Fleet, Port, Refusal, config_refusals, needs_systemd, serving_exposure, serving_ports
from rigup.units import had_replicas, replica_port
from roles.vllm import command
from roles.vllm.facts import VllmCommit
from rigup.instances.vllm import ENV_NAME, VllmInstance, env_problems, instances, secret_variable

if TYPE_CHECKING:
    from rigup.gpu.facts import Facts

UPSTREAM = re.compile(r"github\.com[/:]vllm-project/vllm(\.git)?/?$", re.I)   # stock vLLM's own repository


def _gpu_bound(plan: Plan, data: Config) -> int | None:
    """The GPUs that bound an instance's tp x pp: the host's, none on a Ray head (its cluster's)."""
    return None if data.get("vllm_ray_role") == "head" else gpu_count(plan)


def _instances(plan: Plan, data: Config) -> dict:
    return instances(data, _gpu_bound(plan, data))[0]


# what ss names as the holder of a Ray node's ports (measured with Ray 2.52.1: raylet; its agents run python3)
RAY_NODE_PROCESSES = ("raylet", "python3", "python")


def ports(plan: Plan, data: Config, fleet=None) -> list[Port]:
    """Each instance's port (with replicas: its balancer's; a single server takes it back from the
    balancer of the replicas it replaces) and each replica's loopback port (port + 1 + K)."""
    found = []
    for name, inst in _instances(plan, data).items():
        where, count = f"vllm_instances.{name}", len(replica_groups(plan, inst))
        if count <= 1:
            balanced = had_replicas("rigup-vllm", name, plan.get("serving_units") or [])
            found.append(Port(inst["port"], where, ("vllm", "haproxy") if balanced else ("vllm",)))
            continue
        found.append(Port(inst["port"], f"{where} (its balancer)", ("haproxy", "vllm")))
        found += [Port(replica_port(inst, k), f"{where} (replica {k})", ("vllm",)) for k in range(count)]
    if data.get("vllm_ray_role"):    # the raylet's and its agents' pinned ports (templates/vllm-ray.service.j2)
        base = int(data["vllm_ray_node_port"])
        found += [Port(p, f"vllm_ray_node_port..+5 (Ray's node port {p})", RAY_NODE_PROCESSES)
                  for p in range(base, base + 6)]
    if data.get("vllm_ray_role") == "head":
        found.append(Port(int(data["vllm_ray_port"]), "vllm_ray_port (the Ray head)", ("gcs_server",)))
        if data.get("vllm_ray_dashboard"):
            found.append(Port(int(data["vllm_ray_dashboard_port"]), "vllm_ray_dashboard_port", ("python", "python3")))
    return found


def replica_groups(plan: Plan, inst: VllmInstance) -> list[list[int]]:
    """The GPU indexes of each replica of an instance: tp x pp GPUs each, ``replicas`` of them
    (auto: as many as the host's GPUs allow, at least one); [] on a host without GPUs."""
    cards = [c["index"] for c in plan.get("cards", [])] if gpu_count(plan) else []
    per = inst["tp"] * inst["pp"]
    count = max(1, len(cards) // per) if inst["replicas"] == "auto" else inst["replicas"]
    if cards and count == 1 and inst["gpus"]:
        return [[int(i) for i in inst["gpus"].replace(" ", "").split(",")]]
    return [cards[k * per:(k + 1) * per] for k in range(count)] if cards else []


def plan_lines(plan: Plan, data: Config, found: dict | None = None) -> list[str]:
    """Preflight's plan lines: the recipe (vLLM from PyPI, a fork at a commit, or a base commit
    plus its patch series; extra packages), the full commit a short vllm_git_commit is (``found``:
    the host's VllmCommit, which roles/vllm reads in preflight's round trip), and each instance's
    replicas, e.g. ``glm: 2 replicas x 4 GPUs (GPU 0-3, 4-7)``, its drafter, and that it waits
    for the unlocked VRAM while an enabled cmpunlocker's cards are locked."""
    instances_ = _instances(plan, data)
    lines = recipe_lines(data, found) if instances_ or data.get("vllm_ray_role") else []
    waits = unlock_wait(plan, data)
    for name, inst in sorted(instances_.items()):
        groups = replica_groups(plan, inst)
        if groups:
            per = inst["tp"] * inst["pp"]
            text = ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)
            lines.append(f"vllm:      {name}: {len(groups)} replica{'s' if len(groups) > 1 else ''} x {per} GPUs "
                         f"(GPU {text})" + (f", drafter {inst['draft_model']}" if inst["draft_model"] else "")
                         + ("; waits for the unlocked VRAM" if waits else ""))
    return lines


def recipe_lines(data: Config, found: dict | None) -> list[str]:
    """What vLLM is installed from, in words; [] when the pin is refused (check_pin says why) or a
    URL carries credentials (check_credentials)."""
    if credentialed(data):
        return []
    try:
        full = command.expanded(data, found)
        short = command.short_commit(data)
        if short and not full:
            return [f"vllm:      vllm_git_commit {short} is expanded with git on the host, which has none yet "
                    "(roles/base installs it): vLLM installs on the next converge"]
        the_pin, series = command.pin(data, full), command.patches(data)
    except ConfigError:
        return []
    if "pip" in the_pin:
        lines = [f"vllm:      vllm=={the_pin['pip']} from PyPI"]
    elif series:
        lines = [f"vllm:      a base plus a patch series: {the_pin['git']} at {the_pin['commit']}, then "
                 + ", ".join(p["name"] for p in series) + " (sha256 checked)"]
    else:
        lines = [f"vllm:      a fork at a commit: {the_pin['git']} at {the_pin['commit']}"]
    if full:
        lines.append(f"vllm:      vllm_git_commit {short} is {full} in {the_pin['git']} (expanded on the host): "
                     f"pin it: vllm_git_commit: \"{full}\"")
    if the_pin.get("extra"):
        lines.append(f"vllm:      extra packages in its virtualenv: {', '.join(the_pin['extra'])}")
    return lines


def credentialed(data: Config) -> list[str]:
    """The keys whose URL carries credentials (``https://user:token@host/...``, a token as any scheme's
    login but ssh's, ``?access_token=``, a tab or line break a URL parser drops: rigup.text.carries_credentials):
    vllm_git_url, any of vllm_pip_args (``--index-url=...``, ``git+https://TOKEN@...``: round 13 SEC6), of
    vllm_install_env's values (UV_INDEX_URL, PIP_EXTRA_INDEX_URL) and of vllm_ray_args. The instances'
    extra_args and env, and vllm_env, are rigup.models.credential_problems' (check_config)."""
    env = data.get("vllm_install_env") if isinstance(data.get("vllm_install_env"), dict) else {}

    def argv(key: str) -> list[tuple[str, str]]:
        return [(f"{key}[{i}]", str(a)) for i, a in enumerate(data.get(key) or [])]
    return [key for key, text in (("vllm_git_url", data.get("vllm_git_url")), *argv("vllm_pip_args"),
                                  *((f"vllm_install_env.{k}", v) for k, v in env.items()), *argv("vllm_ray_args"))
            if carries_credentials(text or "")]


def named_secrets(data: dict) -> list[str]:
    """The items of vllm_pip_args and vllm_ray_args that are the value of a flag named for a secret
    (``["--redis-password", S]``: round 25 V25a), and the variables of vllm_install_env named for one whose
    value is more than a switch (UV_INDEX_PRIVATE_PASSWORD: round 25 V25b; HF_HUB_DISABLE_IMPLICIT_TOKEN: 1,
    UV_KEYRING_PROVIDER, the keyring's route, and HF_TOKEN_PATH are none: round 26 F26a)."""
    env = data.get("vllm_install_env") if isinstance(data.get("vllm_install_env"), dict) else {}
    items = [f"{key}[{i + 1}]" for key in ("vllm_pip_args", "vllm_ray_args")
             for i, (a, _) in enumerate(zip(data.get(key) or [], (data.get(key) or [])[1:])) if secret_flag(a)]
    return items + [f"vllm_install_env.{k}" for k, v in env.items() if _secret_install_variable(str(k), str(v))]


# a name for where or how a secret is, and the values that say so (round 28: SSH_AUTH_SOCK, PYTHON_KEYRING_BACKEND,
# UV_KEYRING_PROVIDER, HF_TOKEN_PATH kept; HF_TOKEN_PATH: S, HF_TOKEN_PROVIDER: S refused, S28d)
_PATH = r"(?:/|~/|\.{1,2}/|\$\{?[A-Z_][A-Z0-9_]*\}?/)\S*"   # (./token, $HOME/.cache/...: round 29; no blank in it)
_WHERE = {"path": _PATH, "file": _PATH, "dir": _PATH, "sock": _PATH, "socket": _PATH,
          "provider": r"auto|disabled|import|subprocess", "backend": r"[A-Za-z_]+(?:\.[A-Za-z_]+)+"}


def _secret_install_variable(name: str, value: str) -> bool:
    """Whether vllm_install_env's ``name`` holds a secret: a word of its name is a secret's (rigup.text.secret_name:
    REDISCLI_AUTH, GITHUB_PAT, PIP_AUTH, round 27 S27c), its value no switch (HF_HUB_DISABLE_IMPLICIT_TOKEN: 1), and
    its last word no :data:`_WHERE` given such a value; GIT_CONFIG_KEY_<n> is git's name of a setting."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", name)]
    where = _WHERE.get(words[-1] if words else "")
    return secret_name(name) and not no_secret_value(value) and not re.fullmatch(r"GIT_CONFIG_KEY_[0-9]+", name) \
        and not (where and re.fullmatch(where, value.strip()))


def check_credentials(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Credentials in vllm_git_url, vllm_pip_args, vllm_install_env or vllm_ray_args would stand in git's,
    pip's or ray's argv or the install script, the plan, the install stamp and logs (issue 47): refused,
    before anything changes or is printed; a tab or line break in one too (a URL parser drops it:
    https://u:ab<TAB>TOKEN@h is u:abTOKEN to pip)."""
    keys = credentialed(data)
    found = [Refusal(f"{', '.join(keys)} carries credentials in its URL",
                     "they would appear in git's, pip's or ray's argv or the install script (any local user reads "
                     "them in ps), in the plan, the install stamp and logs",
                     "give the URL without them, and the credentials in a netrc file on the controller "
                     "('machine HOST login USER password TOKEN', mode 0600) named by vllm_netrc_src: rigup puts it "
                     "in a root-only file on the host, which git, pip and uv read", "credentials")] if keys else []
    named = named_secrets(data)
    found += [Refusal(f"{', '.join(named)} is a secret, by the name it is given under",
                      "it would appear in pip's or ray's argv or the install script (any local user reads them in ps), "
                      "in the plan, the install stamp and logs",
                      "give an index's credentials in a netrc file (vllm_netrc_src) or uv's keyring "
                      "(UV_KEYRING_PROVIDER), and ray's password nowhere in the configuration", "credentials")] if named else []
    if _instances(plan, data) or data.get("vllm_ray_role"):
        try:
            command.netrc_text(data)
        except ConfigError as e:
            key, _, why = str(e).partition(": ")
            found.append(Refusal(key, why, "give a netrc file of yours, mode 0600, or null", "credentials"))
    return found


def check_replicas(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Replicas x tp x pp beyond the host's GPUs, replicas on a host without GPUs (each replica
    is pinned to its tp x pp cards), or a server's port outside 1024..65535 (its port, or a
    replica's port + 1 + K: vLLM runs as the unprivileged rigup user)."""
    found = []
    for name, inst in _instances(plan, data).items():
        groups, where = replica_groups(plan, inst), f"vllm_instances.{name}"
        found += serving_ports(where, "vLLM", inst, len(groups))
        if data.get("vllm_ray_role") == "head" and inst["replicas"] in (1, "auto"):
            continue   # one server, its GPUs the cluster's (Ray places the ranks)
        if any(len(g) < inst["tp"] * inst["pp"] for g in groups):
            found.append(Refusal(f"{where} cannot be laid out", f"{len(groups)} replicas x tp {inst['tp']} x pp "
                                 f"{inst['pp']} GPUs, but this host has {gpu_count(plan)}",
                                 f"lower {where}.replicas, or set it to auto", "replicas"))
        elif not groups and inst["replicas"] not in (1, "auto"):
            found.append(Refusal(f"{where} asks for {inst['replicas']} replicas on a host without GPUs",
                                 "each vLLM replica is pinned to its own tp x pp GPUs",
                                 f"set {where}.replicas: 1, or serve the model with llama_server_instances", "replicas"))
    return found


def check_config(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    found, wrong = instances(data, _gpu_bound(plan, data))
    return config_refusals(wrong + (env_problems(data.get("vllm_env") or {}, "vllm_env")
                                    if found or data.get("vllm_ray_role") else []))


check_config.__doc__ = (   # the held-off features from the contract's table (rigup/contract/vllm.py), as docs/refusals.md shows them
    "An entry of vllm_instances that is wrong: its name, a key, a model or draft_model not in models, tp x pp beyond "
    "the GPUs, a pp_partition that does not fit, gpus, env (a variable rigup sets from a key: CUDA_VISIBLE_DEVICES "
    "from gpus, VLLM_PP_LAYER_PARTITION from pp_partition, the NCCL knobs, VLLM_HOST_IP, HOME and the caches; or one "
    "rigup does not let tune vLLM: an "
    "allow-list of VLLM_*, NCCL_*, CUDA_*, TORCH_NCCL_* naming no path, file, plugin or program, OMP_NUM_THREADS, "
    "PYTORCH_CUDA_ALLOC_CONF... and a patched vLLM's own knobs; HOME, TMPDIR, PATH, LD_*, PYTHONPATH, CUDA_HOME, "
    "NCCL_CONF_FILE... refused), speculative keys that are not names with one-line values (or a "
    "``model``: the drafter is draft_model's), a served_model_name starting with ``-``, or extra_args giving a flag "
    "rigup sets (--host, --port, --uds, --api-key, --model, --served-model-name, -tp, -pp, --gpu-memory-utilization, "
    "--speculative-config, -sc; ``--port=1``, ``--served_model_name``, ``--speculative-config.model``, "
    "``-sc.model``, abbreviations and prefixes of short options, -s, too); a flag or variable of vLLM's features beyond inference that vllm_allow does not name (" +
    ", ".join(f"{name}: {' '.join((*f.flags, *f.env))}" for name, f in vllm_contract.HELD_OFF.items())
    + "".join(f"; {flag} given {what}: {feature}" for flag, (feature, _, what) in vllm_contract.WORD_VALUES.items())
    + "; inside a JSON option, at any depth, its keys read as vLLM's json.loads reads them: " +
    ", ".join(f"{name}: {' '.join(f.keys)}" for name, f in vllm_contract.HELD_OFF.items() if f.keys)
    + "; such an option given text json.loads does not read), in extra_args, env or vllm_env; on a host with instances, a vllm_env key that is not NAME: a one-line value "
    "or one that does not tune (what the env file's writer refuses); a value of an instance (extra_args, env) or of "
    "vllm_env that carries credentials (https://user:token@..., ?token=...).")


def check_pin(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """vLLM not pinned to an exact version or a commit (of a vllm_git_url that is https://, ssh://,
    file://, git@host:path or an absolute path: git reads nothing else as an option): a full one,
    or a short one (7-39 hex) that the host expands to exactly one commit of the fetched
    repository (none, several, or a repository the host cannot fetch are refused); a patch series
    that does not match its sha256 manifest (read on the controller); vllm_extra_packages that
    are not exact pip requirements (NAME==VERSION); or vllm_install_env keys that are not names
    (on a host with instances, or a Ray node: a worker has the virtualenv too)."""
    if not _instances(plan, data) and not data.get("vllm_ray_role"):
        return []
    bad = [k for k in data.get("vllm_install_env") or {} if not ENV_NAME.fullmatch(str(k))]
    if bad:
        return config_refusals([(f"vllm_install_env.{k}", "expected an environment variable name") for k in bad])
    found = (facts.get("reads") or {}).get(VllmCommit.__name__)
    try:
        full = command.expanded(data, found)
        if command.short_commit(data) and not full:   # no git on the host yet: the role waits for roles/base
            command.git_url(data)
            command.extra_packages(data)
        else:
            command.pin(data, full)
        command.patches(data)
        command.uv(data)
    except ConfigError as e:
        key, _, why = str(e).partition(": ")
        return [Refusal(key, why, "pin vLLM with vllm_pip_version (exact) or vllm_git_url with a vllm_git_commit "
                                  "(the full 40 hex, or a short id the host expands to one commit); list patches in "
                                  "vllm_patch_manifest; extra packages as NAME==VERSION", "vllm_pin")]
    return []


def check_open_without_key(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An instance bound beyond loopback (its host: another address, a wildcard such as 0.0.0.0,
    ::0) without api_key, or a secret typed into env or vllm_env: VLLM_API_KEY, the hub's token
    (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HF_OIDC_ID_TOKEN), any *_TOKEN, *_KEY, *_SECRET, *_PASSWORD, *_PWD,
    *_CREDENTIAL, *_COOKIE, *_JWT, a name ending in TOKEN, PASSWORD, SECRET or APIKEY glued (PGPASSWORD,
    APITOKEN), and request headers (OTEL_EXPORTER_OTLP_HEADERS: an Authorization, any *_HEADERS)."""
    found = serving_exposure("vllm_instances", _instances(plan, data))
    host_env = data.get("vllm_env") if isinstance(data.get("vllm_env"), dict) else {}
    for name, inst in _instances(plan, data).items():
        for key in sorted({str(k) for k in (*inst["env"], *host_env) if secret_variable(str(k))}):
            why = "a secret typed into the configuration passes through every run's output, and the env file is one " \
                  "rigup writes for the service" + (", which the gate cannot read" if key == "VLLM_API_KEY" else "")
            fix = (f"remove it and set vllm_instances.{name}.api_key: true (a key made on the host)" if key == "VLLM_API_KEY"
                   else "remove it: the hub's token goes in model_fetch_hf_token_src (a root-only file for the fetch; "
                        "the server reads the fetched model's directory)" if key.upper().startswith(("HF_", "HUGGING"))
                   else "remove it: rigup passes vLLM no secret but its API key (api_key: true)")
            found.append(Refusal(f"vllm_instances.{name}: {key} in env", why, fix, "open_without_key"))
    return found


def check_host_ip(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """vllm_host_ip that is not an IP address (an interface name, a host name, a wildcard): it is
    VLLM_HOST_IP and Ray's node address, which the cluster's allow-list takes."""
    ip = data.get("vllm_host_ip")
    if ip is None or host_ip(str(ip)):   # not a wildcard, nor an IPv6 zone nft would not take
        return []
    return config_refusals([("vllm_host_ip", f"expected this host's IP address on the cluster network, got {ip!r} "
                                             "(an interface name goes in vllm_socket_ifname)")])


def check_systemd(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """vLLM instances on a host where systemd is not PID 1."""
    names = sorted(_instances(plan, data))
    return needs_systemd(facts, [f"vllm_instances ({', '.join(names)})"] if names else [])


def check_vram(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """Weights (size_gib, with the drafter's) at least gpu_memory_utilization x the VRAM of the
    tp x pp cards (after the unlock with cmpunlocker_enabled: serving waits for it)."""
    per_card, unlock_hint = vram_cards(plan, data)
    entries = models(data)[0]
    found = []
    for name, inst in _instances(plan, data).items():
        weights = entries[inst["model"]].get("size_gib")
        draft = (entries.get(inst["draft_model"]) or {}).get("size_gib") if inst["draft_model"] else None
        weights = weights + draft if weights is not None and draft else weights
        cards = per_card[: inst["tp"] * inst["pp"]]
        budget = inst["gpu_memory_utilization"] * sum(cards)
        if weights is None or not per_card or weights < budget:
            continue
        found.append(Refusal(
            f"model {inst['model']} does not fit the VRAM of vllm_instances.{name}",
            f"weights {weights:.1f} GiB >= {budget:.1f} GiB usable (gpu_memory_utilization "
            f"{inst['gpu_memory_utilization']:g} x {cards_gib_text(cards)} for tp {inst['tp']} x pp {inst['pp']}), "
            "leaving nothing for the KV cache",
            f"raise tp or pp (this host has {len(per_card)} GPUs), raise gpu_memory_utilization, or pick a "
            f"smaller checkpoint{unlock_hint}", "vram"))
    return found


def patched(data: Config) -> bool:
    """Whether the pin is a patched vLLM: a git commit with a patch series, or a fork (a git URL
    other than upstream vLLM's) at a commit."""
    url, commit = data.get("vllm_git_url"), data.get("vllm_git_commit")
    return bool(commit and (data.get("vllm_patches") or url and not UPSTREAM.search(str(url))))


def check_vllm_cc(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A vLLM instance whose model family needs kernels for a higher compute capability
    (rigup/gpu/models.yml vllm_min_cc) than the host's cards have. A patched vLLM (a git commit
    with a patch series, as the CMP 170HX recipes of seeds 002/003 run) is the operator's claim
    that it carries those kernels: not refused; so is a fork at a commit (a vllm_git_url other
    than upstream's, github.com/vllm-project/vllm)."""
    if not gpu_host(plan, data) or patched(data):
        return []
    entries = models(data)[0]
    found = []
    for name, inst in _instances(plan, data).items():
        family = family_of(entries[inst["model"]])
        floor = family.get("vllm_min_cc") if family else None
        if not floor:
            continue
        below = sorted({(c["class"], tuple(c["compute_capability"])) for c in plan.get("cards") or []
                        if c.get("compute_capability") and tuple(c["compute_capability"]) < tuple(floor)})
        if not below:
            continue
        cards = ", ".join(f"{cls} cards are cc {cc[0]}.{cc[1]}" for cls, cc in below)
        found.append(Refusal(
            f"vllm_instances.{name} needs compute capability >= {floor[0]}.{floor[1]} for {family['name']}",
            f"stock vLLM's kernels for {family['key']} run only on cc >= {floor[0]}.{floor[1]} "
            f"(rigup/gpu/models.yml, from {', '.join(family['sources'])}); this host's {cards}",
            "serve it with llama.cpp on this host (llama_server_instances), run vLLM on Hopper or newer "
            "(H100, H200, B200), or declare a patched vLLM: a fork at a commit (vllm_git_url, vllm_git_commit) "
            "or a base commit with vllm_patches", "vllm_cc"))
    return found


_CU = re.compile(r"(?:\+|/|\b)cu(1[0-9])([0-9])\b")   # +cu128, .../whl/cu130, cu129: CUDA 12.8, 13.0, 12.9


def wheel_cuda(data: Config) -> tuple[str, str] | None:
    """(CUDA version, where it was read) of the vLLM wheel the host installs, or None when the
    pins do not say (a source build, or the index's default wheel, or URLs with credentials, which
    check_credentials refuses: nothing of theirs is quoted)."""
    if credentialed(data):
        return None
    for key, text in (("vllm_pip_version", data.get("vllm_pip_version")),
                      *((f"vllm_pip_args[{i}]", arg) for i, arg in enumerate(data.get("vllm_pip_args") or []))):
        m = _CU.search(str(text or ""))
        if m:
            return f"{m.group(1)}.{m.group(2)}", f"{key} {text}"
    return None


def check_wheel_cuda(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """vLLM instances whose wheel is built for a newer CUDA than the loaded driver (or the
    nvidia_driver_branch it is changed to) runs (rigup/gpu/catalogue.yml cuda_min_driver): it would
    install, then fail at its first CUDA call."""
    driver, named = driver_for_checks(plan)
    built = wheel_cuda(data)
    if not gpu_host(plan, data) or not data.get("vllm_instances") or not built or version_tuple(driver or "") is None:
        return []
    cuda, where = built
    need = min_driver_for_cuda(cuda)
    if need is None or version_tuple(driver) >= version_tuple(need[1]):
        return []
    newest = newest_cuda_for_driver(driver)
    return [Refusal(
        f"the vLLM wheel is built for CUDA {cuda} ({where}), newer than NVIDIA driver {named} runs",
        f"CUDA {cuda} needs driver >= {need[1]} (rigup/gpu/catalogue.yml cuda_min_driver); driver {named} "
        f"runs CUDA up to {newest or '?'}",
        (f"pin a wheel built for CUDA {newest} or older (e.g. +cu{newest.replace('.', '')}), or " if newest else "")
        + (f"set nvidia_driver_branch to {need[1].split('.')[0]} or newer" if named != driver
           else f"upgrade the NVIDIA driver to >= {need[1]}"), "wheel_cuda")]


def _same(me: str, data: Config, head: str, head_data: dict) -> list[tuple[str, str]]:
    """(key, why) for each of Ray's and vLLM's pins where ``me`` and its ``head`` differ."""
    keys = ("vllm_ray_version", "vllm_pip_version", "vllm_git_url", "vllm_git_commit", "vllm_extra_packages")
    return [(key, f"{me} has {data.get(key)!r} and {head} has {head_data.get(key)!r}: every node of a Ray cluster "
                  "runs the same Ray and vLLM") for key in keys if data.get(key) != head_data.get(key)]


def _ray_ports(data: Config) -> list[Refusal]:
    """vllm_ray_worker_ports that is not a range [FIRST, LAST] clear of Ray's other pinned ports."""
    span = data.get("vllm_ray_worker_ports")
    base = int(data.get("vllm_ray_node_port") or 0)
    pinned = {int(data.get("vllm_ray_port") or 0), *range(base, base + 6)}
    if isinstance(span, list) and len(span) == 2 and span[0] <= span[1] and not pinned & set(range(span[0], span[1] + 1)):
        return []
    return [Refusal(f"vllm_ray_worker_ports: {span!r}", "not [FIRST, LAST] with FIRST <= LAST, clear of vllm_ray_port "
                    f"and vllm_ray_node_port..+5 ({base}..{base + 5})", "set e.g. [10002, 10101]", "ray")]


def check_ray(plan: Plan, facts: Facts, data: Config, fleet: Fleet | None = None) -> list[Refusal]:
    """A Ray node (vllm_ray_role) that cannot join its cluster: no vllm_ray_version; a worker port
    range that is not one or overlaps Ray's other ports; a worker whose
    vllm_ray_head is not a Ray head of the inventory, or that has instances of its own; another
    Ray or vLLM pin than its head's (both sides); no systemd."""
    role = data.get("vllm_ray_role")
    if not role or not fleet:
        return []
    found = needs_systemd(facts, [f"vllm_ray_role {role} (rigup-ray.service)"])
    if not data.get("vllm_ray_version"):
        found.append(Refusal("vllm_ray_version", "null, but this host is a Ray node: Ray from PyPI must be pinned",
                             "set vllm_ray_version to an exact version, e.g. \"2.52.1\", the same on every node",
                             "ray"))
    found += _ray_ports(data)
    me, head = fleet.me, data.get("vllm_ray_head")
    if role == "worker":
        if head not in fleet.hosts or fleet.hosts[head].get("vllm_ray_role") != "head":
            return found + [Refusal(f"vllm_ray_head: {head!r}", "a Ray worker's head must be a host of this inventory "
                                    "with vllm_ray_role: head", "name the head host in vllm_ray_head", "ray")]
        if data.get("vllm_instances"):
            found.append(Refusal("vllm_instances on a Ray worker", f"its GPUs are the cluster's; the head {head} "
                                 "serves", "move the instances to the head", "ray"))
        pairs = [(head, fleet.hosts[head])]
    else:
        pairs = [(w, fleet.hosts[w]) for w in sorted(fleet.hosts) if w != me
                 and fleet.hosts[w].get("vllm_ray_role") == "worker" and fleet.hosts[w].get("vllm_ray_head") == me]
    for other, other_data in pairs:
        found += [Refusal(f"{key} differs from Ray node {other}", why, f"set the same {key} on {me} and {other}", "ray")
                  for key, why in _same(me, data, other, other_data)]
    return found


CHECKS = (check_config, check_credentials, check_pin, check_host_ip, check_open_without_key, check_systemd, check_vram, check_vllm_cc,
          check_replicas, check_wheel_cuda)
FLEET_CHECKS = (check_ray,)
