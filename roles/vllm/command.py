"""vLLM's pin, patch series, environment file, command line and drop-in, as pure functions
(roles/vllm installs them; tests/unit/test_vllm*.py checks them without a host)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import re
from pathlib import Path

from rigup.boundary.formats import env_file_line, systemd_quote, unit_comment
from rigup.boundary import owned
from rigup.config import Config, ConfigError, GIT_URL, ROOT
from rigup.contract import flag_args
from rigup.contract.vllm import DROPIN, FLAGS, KEY, api_name
from rigup.templates import render
from rigup.text import shown
from rigup.units import replica_inst, replica_name, visible_devices
from rigup.instances.vllm import VllmInstance, env_problems, partition_problem, secret_variable

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan

ENV_FILE = "/etc/rigup/vllm/{}.env"
KEY_FILE = KEY      # VLLM_API_KEY=<key>, made on the host (api_key: true)
KEY_PREFIX = "VLLM_API_KEY="
UNIT = "/etc/systemd/system/rigup-vllm@.service"
STAMP = ".rigup-stamp.json"
RAY_DIR = "/var/lib/rigup/vllm/ray"      # a Ray node's HOME and RAY_TMPDIR (roles/vllm/cluster.py)
_HEX40 = re.compile(r"[0-9a-f]{40}")
# vllm_git_url: a git URL as rigup.config.GIT_URL reads one, but never in clear (http://, git://),
# or an absolute path on the host
_LOCAL_GIT = re.compile(r"/[^\s'\"\\;`$]*")
_VERSION_TEXT = r"[0-9]+(\.[0-9]+)*([.+-]?[0-9A-Za-z.+-]*)?"
_VERSION = re.compile(_VERSION_TEXT)  # 0.33.0, 0.11.0rc1, 0.9.2+cu128
_SHORT = re.compile(r"[0-9a-f]{7,39}")
# a pip requirement pinned exactly: NAME (PEP 508), optional [extras], ==VERSION
_REQUIREMENT = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                          r"==(" + _VERSION_TEXT + ")")


def git_url(data: Config) -> str:
    """``vllm_git_url``, checked (a git URL git reads as no option, never in clear, or an absolute
    path on the host); raises ConfigError naming the key."""
    url = str(data.get("vllm_git_url"))
    if not (_LOCAL_GIT.fullmatch(url) or GIT_URL.fullmatch(url) and not url.startswith(("http://", "git://"))):
        raise ConfigError(f"vllm_git_url: expected https://, ssh://, file://, git@host:path or an absolute "
                          f"path, got {url!r} (git would read another as an option or a transport)")
    return url


# vllm_netrc_src on the host: git reads $HOME/.netrc (libcurl's netrc), pip and uv $NETRC
NETRC_HOME = "/etc/rigup/vllm-auth"
NETRC = f"{NETRC_HOME}/.netrc"


def netrc_text(data: Config) -> str | None:
    """The text of ``vllm_netrc_src`` (a file on the controller), cut to the machines the install
    fetches from (:func:`fetched_from`), or None without one; ConfigError naming the key when it is
    not a regular file of the operator's that no other user could have written or may read, or no
    netrc of those machines (rigup.boundary.owned: never a ``default`` entry)."""
    src = data.get("vllm_netrc_src")
    if not src:
        return None
    try:
        return owned.netrc(owned.read(str(src), "vllm_netrc_src", secret=True), f"vllm_netrc_src: {src}",
                           fetched_from(data))
    except owned.Unreadable as e:
        raise ConfigError(str(e)) from None


# pip's and uv's default index, which a netrc may log in to as to any other
PYPI = ("pypi.org", "files.pythonhosted.org")


def fetched_from(data: Config) -> set[str]:
    """The machines vLLM's install fetches from: ``vllm_git_url``'s host, the host of each URL in
    ``vllm_pip_args`` and in ``vllm_install_env``'s values (UV_INDEX_URL ...), and PyPI's."""
    from urllib.parse import urlsplit

    hosts, url = set(PYPI), str(data.get("vllm_git_url") or "")
    scp = re.fullmatch(r"[^@/:]+@([^:/]+):.*", url)     # git@host:path, git's scp-like form
    if scp:
        hosts.add(scp.group(1))
    words = [url, *map(str, data.get("vllm_pip_args") or []), *map(str, (data.get("vllm_install_env") or {}).values())]
    for word in " ".join(words).replace("=", " ").split():
        try:
            found = urlsplit(word).hostname if "://" in word else None
        except ValueError:
            found = None
        if found:
            hosts.add(found)
    return hosts


def short_commit(data: Config) -> str | None:
    """``vllm_git_commit`` when it is a short commit id (7-39 lowercase hex) of a ``vllm_git_url``:
    the host expands it (roles/vllm/facts.py VllmCommit, :func:`expanded`)."""
    commit = data.get("vllm_git_commit")
    return str(commit) if data.get("vllm_git_url") and commit and _SHORT.fullmatch(str(commit)) else None


def expanded(data: Config, found: dict | None) -> str | None:
    """The full commit a short ``vllm_git_commit`` names in ``vllm_git_url``, from what the host
    found (``found``: VllmCommit's value); None when the commit is not short, or while the host has
    no git to expand it with (roles/base installs it: the role waits a converge). Raises ConfigError
    naming vllm_git_commit when the host could not fetch the repository, or when no commit or
    several start with it."""
    short = short_commit(data)
    if not short or not found or not found.get("git"):
        return None
    url, commits = data["vllm_git_url"], found.get("commits") or []
    if not found.get("fetched"):
        raise ConfigError(f"vllm_git_commit: {short!r} is short, and the host could not fetch {url} to expand it: "
                          f"{found.get('error') or 'git clone failed'}")
    if not commits:
        raise ConfigError(f"vllm_git_commit: no commit of {url} starts with {short!r} (its branches and tags, "
                          "fetched on the host): check it, or pin the full 40-hex commit")
    if len(commits) > 1:
        raise ConfigError(f"vllm_git_commit: {short!r} is ambiguous in {url}: {len(commits)} commits start with it "
                          f"({', '.join(commits[:4])}{', ...' if len(commits) > 4 else ''}): give more digits, "
                          "or the full 40-hex commit")
    if not _HEX40.fullmatch(commits[0]) or not commits[0].startswith(short):
        raise ConfigError(f"vllm_git_commit: the host expanded {short!r} to '{shown(commits[0], 60)}', not a 40-lowercase-hex "
                          "commit that starts with it")
    return commits[0]


def extra_packages(data: Config) -> list[str]:
    """``vllm_extra_packages``, each an exact pip requirement ``name==version`` (or
    ``name[extra,...]==version``), none of them vLLM itself nor named twice; raises ConfigError
    naming the item."""
    out, seen = [], {}
    for i, item in enumerate(data.get("vllm_extra_packages") or []):
        match = _REQUIREMENT.fullmatch(str(item))
        if not match:
            raise ConfigError(f"vllm_extra_packages[{i}]: expected an exact pip requirement NAME==VERSION "
                              f"(e.g. \"exllamav3==1.4.8\"; no range, URL, marker or option), got {item!r}")
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        if name == "vllm":
            raise ConfigError(f"vllm_extra_packages[{i}]: {item!r} is vLLM itself, which vllm_pip_version or "
                              "vllm_git_url pins")
        if name in seen:
            raise ConfigError(f"vllm_extra_packages[{i}]: {name} is listed twice (also item {seen[name]})")
        seen[name] = i
        out.append(str(item))
    return out


def pin(data: Config, full_commit: str | None = None) -> dict:
    """The pin: ``{"pip": VERSION}`` or ``{"git": URL, "commit": SHA}`` (``full_commit``: a short
    vllm_git_commit expanded on the host, :func:`expanded`), with ``extra`` (vllm_extra_packages,
    when any: they are part of what the stamp names, so a change reinstalls) and its ``id`` (the
    virtualenv's directory name); raises ConfigError naming the key when it is not one."""
    url, commit, version = data.get("vllm_git_url"), data.get("vllm_git_commit"), data.get("vllm_pip_version")
    extra = extra_packages(data)
    more = {"extra": extra} if extra else {}
    if url:
        if version:
            raise ConfigError(f"vllm_pip_version: {version!r} and vllm_git_url are both set; set one")
        url = git_url(data)
        if short_commit(data) and full_commit:
            commit = full_commit
        elif not commit or not _HEX40.fullmatch(str(commit)):
            raise ConfigError(f"vllm_git_commit: expected the full 40-hex commit of {url}, or a short one (7-39 "
                              f"hex, expanded on the host), got {commit!r} (a branch or tag moves; pin the commit)")
        return {"git": url, "commit": str(commit), **more, "id": f"git-{commit[:12]}"}
    if commit:
        raise ConfigError(f"vllm_git_commit: {commit!r} is set but vllm_git_url is null")
    if not version:
        raise ConfigError("vllm_pip_version: null, and vllm_git_url is null: pin vLLM with an exact "
                          "version (e.g. \"0.33.0\") or a git URL and a full commit")
    if not _VERSION.fullmatch(str(version)) or str(version).lower() == "latest":
        raise ConfigError(f"vllm_pip_version: expected an exact version such as \"0.33.0\", got {version!r} "
                          "(no ranges, no 'latest': a pin must not move)")
    return {"pip": str(version), **more, "id": f"pip-{version}"}


def uv(data: Config) -> dict | None:
    """With ``vllm_installer: uv``: ``{"version", "dir"}`` (uv pinned, in its own virtualenv under
    vllm_dir), else None; raises ConfigError naming the key when the version is not exact."""
    if data.get("vllm_installer", "pip") != "uv":
        return None
    version = str(data.get("vllm_uv_version") or "")
    if not _VERSION.fullmatch(version):
        raise ConfigError(f"vllm_uv_version: expected an exact version such as \"0.9.7\", got {version!r}")
    return {"version": version, "dir": f"{str(data.get('vllm_dir', '/opt/rigup/vllm')).rstrip('/')}/uv-{version}"}


def read_manifest(text: str) -> dict[str, str]:
    """``sha256sum`` output (``HEX  NAME`` or ``HEX *NAME``) as name -> hex."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([0-9a-fA-F]{64})\s+\*?(.+)", line)
        if not match:
            raise ConfigError(f"vllm_patch_manifest: not a sha256sum line: {line!r}")
        out[Path(match.group(2).strip()).name] = match.group(1).lower()
    return out


def owned_text(path: Path, where: str) -> str:
    """The text of the controller file ``path`` that ``where`` names (the manifest, a patch), read
    only when no other user could have written it or a directory on its path (rigup.boundary.owned):
    the manifest pins the patches, and root installs the patched tree on every host (round 10, AR1)."""
    try:
        path.stat()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path}: {e.strerror}") from None
    try:
        return owned.read(path, where, limit=PATCH_LIMIT)
    except owned.NotOwned as e:
        raise ConfigError(str(e)) from None


# The most a patch (or the manifest) may hold: a vLLM fix is far smaller.
PATCH_LIMIT = 16 << 20


def patches(data: Config, root: Path = ROOT) -> list[dict]:
    """The patch series in order: ``[{"name", "sha256", "text"}]``, each checked against the
    manifest on the controller (before any host changes); raises ConfigError naming the key."""
    listed = data.get("vllm_patches") or []
    if not listed:
        return []
    if not data.get("vllm_git_url"):
        raise ConfigError("vllm_patches: a patch series needs a git checkout to apply to: set vllm_git_url "
                          "and vllm_git_commit (a pip install has no source tree)")
    manifest_path = data.get("vllm_patch_manifest")
    if not manifest_path:
        raise ConfigError("vllm_patch_manifest: required with vllm_patches (a sha256sum file of the patches)")
    manifest_file = Path(manifest_path) if Path(manifest_path).is_absolute() else root / manifest_path
    manifest = read_manifest(owned_text(manifest_file, "vllm_patch_manifest"))
    out, seen = [], set()
    for i, item in enumerate(listed):
        path = Path(item) if Path(item).is_absolute() else root / item
        name = path.name
        if name in seen:
            raise ConfigError(f"vllm_patches[{i}]: {name} is listed twice")
        seen.add(name)
        text = owned_text(path, f"vllm_patches[{i}]")
        digest = hashlib.sha256(text.encode()).hexdigest()
        if name not in manifest:
            raise ConfigError(f"vllm_patches[{i}]: {name} is not in the manifest {manifest_file}")
        if manifest[name] != digest:
            raise ConfigError(f"vllm_patches[{i}]: {name} has sha256 {digest}, but the manifest "
                              f"{manifest_file} says {manifest[name]}: refused, nothing changed")
        out.append({"name": name, "sha256": digest, "text": text})
    return out


def stamp(the_pin: dict, series: list[dict], data: Config) -> str:
    """What the virtualenv was made from; a change reinstalls it (and restarts its instances)."""
    return json.dumps({"pin": {k: v for k, v in the_pin.items() if k != "id"},
                       "patches": [[p["name"], p["sha256"]] for p in series],
                       # digests, not values: an index URL with credentials must not land in a 0644 file
                       "pip_args": sha(json.dumps(list(data.get("vllm_pip_args") or []))),
                       "install_env": {str(k): sha(str(v))[:16]
                                       for k, v in sorted((data.get("vllm_install_env") or {}).items())},
                       # the default's absolute spelling (root runs no python3 PATH finds) is the python3 that made
                       # the venvs before it: the same stamp, no reinstall for the spelling alone
                       "python": {"/usr/bin/python3": "python3"}.get(data.get("vllm_python", ""), data.get("vllm_python", "python3")),
                       # only for uv: a pip venv keeps the stamp (and the venv) it had before this key
                       **({"installer": f"uv=={uv(data)['version']}"} if uv(data) else {})}, sort_keys=True)


def _value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def env_vars(name: str, inst: VllmInstance, data: Config, plan: Plan) -> dict[str, str]:
    """The instance's environment, in the order written: HOME and caches, the layer partition,
    NCCL/Gloo knobs, then vllm_env and the instance's env (which win)."""
    state, cache = f"/var/lib/rigup/vllm/{name}", f"/var/cache/rigup/vllm/{name}"
    env = {"HOME": state, "XDG_CACHE_HOME": cache, "HF_HOME": f"{cache}/hf", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": f"{cache}/vllm", "TRITON_CACHE_DIR": f"{cache}/triton",
           "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if inst.get("pp_partition"):
        env["VLLM_PP_LAYER_PARTITION"] = partition(inst)
    if inst.get("gpus"):
        env["CUDA_VISIBLE_DEVICES"] = inst["gpus"].replace(" ", "")
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    elif ((plan or {}).get("burnin") or {}).get("quarantined"):   # the accepted cards only (roles/burnin)
        env["CUDA_VISIBLE_DEVICES"] = visible_devices((plan or {}).get("cards") or [])
    p2p = data.get("vllm_nccl_p2p_disable")
    if p2p is None:
        p2p = "cmp170hx" in (plan or {}).get("card_classes", [])
    if p2p:
        env["NCCL_P2P_DISABLE"] = "1"
    env["NCCL_NVLS_ENABLE"] = _value(bool(data.get("vllm_nccl_nvls_enable")))
    if data.get("vllm_nccl_ib_disable") is not None:
        env["NCCL_IB_DISABLE"] = _value(bool(data["vllm_nccl_ib_disable"]))
    if data.get("vllm_socket_ifname"):
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = data["vllm_socket_ifname"]
    if data.get("vllm_host_ip"):
        env["VLLM_HOST_IP"] = data["vllm_host_ip"]
    for where, extra in (("vllm_env", data.get("vllm_env") or {}),
                         (f"vllm_instances.{name}.env", inst.get("env") or {})):
        for key, why in env_problems(extra, where) + [(f"{where}.{k}", "a secret typed into the configuration: "
                                                       "rigup writes none into the env file") for k in extra
                                                      if secret_variable(str(k))]:
            raise ConfigError(f"{key}: {why}")
        env.update((str(key), _value(value)) for key, value in extra.items())
    return env


def partition(inst: VllmInstance) -> str:
    """VLLM_PP_LAYER_PARTITION, checked again here (preflight checks it first, with the same
    rule: rigup/instances/vllm.py); raises ConfigError."""
    why = partition_problem(inst["pp_partition"], inst.get("pp", 1), inst.get("layers"))
    if why:
        raise ConfigError(f"vllm_instances.{inst.get('_name', '?')}.pp_partition: {why}")
    return str(inst["pp_partition"]).replace(" ", "")


def env_text(name: str, env: dict[str, str]) -> str:
    """The EnvironmentFile (systemd's syntax: double quotes, backslash escapes, no expansion)."""
    lines = [f"# Installed by rigup (roles/vllm) for instance {unit_comment(name, 'an instance name')}."]
    lines += [env_file_line(key, value) for key, value in env.items()]
    return "\n".join(lines) + "\n"


def speculative_config(inst: VllmInstance, draft_path: str | None) -> str | None:
    """``--speculative-config``'s JSON: the instance's ``speculative`` keys (method,
    num_speculative_tokens, ...) and the drafter's directory as ``model`` (``draft_path``: the dest
    of its ``draft_model``), as the CMP 170HX reports run DFlash and DSpark drafters; None for neither."""
    config = {**(inst.get("speculative") or {}), **({"model": draft_path} if draft_path else {})}
    return json.dumps(config, sort_keys=True, separators=(",", ":")) if config else None


def argv(name: str, inst: VllmInstance, venv: str, model_path: str, draft_path: str | None = None) -> list[str]:
    """``vllm serve`` for one instance: --host and --port always explicit (vLLM binds every
    interface by default), the flags of its contract (rigup/contract/vllm.py: parallel sizes, memory
    fraction, the served name) and, with a drafter or ``speculative``, --speculative-config."""
    args = [f"{venv}/bin/vllm", "serve", model_path, "--host", inst["host"], "--port", inst["port"],
            *flag_args(FLAGS, {**inst, "served_model_name": api_name(name, inst)})]
    spec = speculative_config(inst, draft_path)
    args += ["--speculative-config", spec] if spec else []
    return [str(a) for a in args + list(inst["extra_args"])]


def dropin_text(name: str, inst: VllmInstance, venv: str, model_path: str, marker: str, unit_sha: str,
                stamp_sha: str, env_sha: str, model_revision: str | None, wait: list[str],
                unit: str | None = None, balancer: dict | None = None, ray_wait: list[str] | None = None,
                draft: dict | None = None, command: list[str] | None = None) -> str:
    """The drop-in rigup-vllm@UNIT.service.d/rigup.conf (``unit``: the instance ``name``, or one
    of its replicas NAME-K, whose environment file is its own and whose served name and key are
    the instance's); its comment names what restarts it when it changes (unit, install stamp,
    environment file, model revision, the drafter's completion marker); for a replica, the
    balancer's hooks (``balancer``: {"ready": argv, "drain": argv}); on a Ray head, ``ray_wait``
    (the wait for every node, which also lets it write Ray's session files: roles/vllm/cluster.py);
    with a drafter, ``draft`` ({"path", "marker", "sha"}: its dest, its marker, the marker's sha256).
    ExecStart: ``command``, the server's argv as the serving plan made it, filled by the role's
    operation; else :func:`argv` of ``venv``, ``model_path`` and the drafter's path."""
    return render("vllm-dropin.conf.j2", ray_wait=[systemd_quote(a) for a in ray_wait] if ray_wait else None,
                  ray_dir=RAY_DIR, name=unit_comment(name, "an instance's name"), unit_sha=unit_sha,
                  stamp_sha=stamp_sha, env_sha=env_sha, model_revision=unit_comment(model_revision, f"{name}: its model's revision"),
                  marker=systemd_quote(marker),
                  env_file=ENV_FILE.format(unit or name),
                  key_file=KEY_FILE.format(name) if inst.get("api_key") else None,
                  wait=[systemd_quote(a) for a in wait],
                  balancer={k: [systemd_quote(a) for a in v] for k, v in balancer.items()} if balancer else None,
                  draft_marker=systemd_quote(draft["marker"]) if draft else None,
                  draft_sha=draft["sha"][:12] if draft else None,
                  argv=[systemd_quote(a) for a in command or argv(name, inst, venv, model_path, draft and draft["path"])])


def backend_name(name: str) -> str:
    """The HAProxy backend of a replicated vLLM instance (roles/balancer's config, the drain helper)."""
    return f"vllm-{name}"


def servers(name: str, inst: VllmInstance, groups: list[list[int]], plan: Plan) -> list[dict]:
    """Each server of the instance (``groups``: the GPU indexes of each replica, checks.replica_groups):
    ``unit`` (NAME, or NAME-K per replica), ``inst`` (a replica on 127.0.0.1, port + 1 + K), ``env``
    (a replica's CUDA_VISIBLE_DEVICES: its cards' UUIDs) and ``gpus`` (the indexes the VRAM wait
    watches: ``gpus`` of the instance for one server)."""
    if len(groups) <= 1:
        return [{"unit": name, "inst": inst, "env": {}, "gpus": (inst.get("gpus") or "").replace(" ", "")}]
    cards = {c["index"]: c for c in plan.get("cards", [])}
    return [{"unit": replica_name(name, k), "inst": replica_inst(inst, k),
             "env": {"CUDA_VISIBLE_DEVICES": visible_devices([cards[i] for i in group])},
             "gpus": ",".join(str(i) for i in group)} for k, group in enumerate(groups)]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
