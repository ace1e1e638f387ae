"""roles/model_fetch's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py). What only the hub can tell (an unknown revision, a pattern that matches
nothing, an incomplete shard set, a peer without the model) the role refuses itself, before
any byte, from its own probe.

    check_config    an entry of models that is wrong, by key path (or that the hub answered
                    something hostile for: roles/model_fetch/hub.py)
    check_endpoint  hf_endpoint that is not an https:// URL (http:// only with hf_endpoint_insecure,
                    never with a token); a model_fetch_hf_token_src another user could have
                    written (rigup/boundary/owned.py), or that holds no token
    check_dest      a dest inside rigup's own directories or holding one, shared by two models, or
                    inside another model's
    check_disk      a model (size_gib) larger than the free disk where it goes; the files of
                    another revision at dest do not count (a revision change fetches next to it)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

from rigup.boundary.core import Unreadable
from rigup.models import hub_endpoint, models
from rigup.names import TEXTFILE_DIR, revision_dir
from rigup.refusal import Refusal, config_refusals
from roles.model_fetch.hub import token

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config

GIB = 1024 ** 3
ENDPOINT = re.compile(r"(https?)://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")


def check_config(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """An entry of models that is wrong: its name, an unknown or mistyped key, a repo that is not
    the hub's org/name, a revision that is not a full commit, an unknown family; or one the hub
    answered something hostile for when asked on the controller (a commit that is not 40 hex, a
    listing with an unsafe, duplicate or unhashed path, a compressed listing or header, a next
    page on another origin)."""
    return config_refusals(models(data)[1])


def check_endpoint(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """hf_endpoint that is not an https:// URL (the download job sends the hub token there), or
    http:// without hf_endpoint_insecure, which never goes with model_fetch_hf_token_src.

    Without hf_endpoint, the controller's HF_ENDPOINT is judged (rigup.models.hub_endpoint)."""
    endpoint, insecure = hub_endpoint(data), data.get("hf_endpoint_insecure") is True
    origin = "" if data.get("hf_endpoint") else " (from HF_ENDPOINT in the controller's environment)"
    url = ENDPOINT.fullmatch(endpoint)
    if not url:
        return config_refusals([("hf_endpoint", f"expected an https:// URL, got {endpoint!r}{origin}")])
    if url.group(1) == "http" and not insecure:
        return config_refusals([("hf_endpoint", f"{endpoint!r}{origin} is http://: listings, files and a token "
                                                "would travel in clear; use https://, or set hf_endpoint_insecure: "
                                                "true for a hub on a trusted network (never with a token)")])
    if insecure and data.get("model_fetch_hf_token_src"):
        return config_refusals([("hf_endpoint_insecure", "true with model_fetch_hf_token_src: a token is never "
                                                         "sent to a hub that may be http://; drop one of them")])
    if data.get("model_fetch_hf_token_src"):
        try:
            token(data)
        except Unreadable as e:   # another user could have written it, or it is no token
            return config_refusals([("model_fetch_hf_token_src", e.why)])
    return []


def check_disk(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A model (size_gib) larger than the free disk where it goes, net of what is there."""
    free_disk = facts.get("free_disk") or {}
    present = facts.get("model_bytes") or {}
    found = []
    for name, model in models(data)[0].items():
        size = model.get("size_gib")
        free = free_disk.get(model["dest"])
        if size is None or free is None:
            continue
        stage = revision_dir(model["dest"], model["revision"])
        have = ((present.get(model["dest"]) or 0) + (present.get(stage) or 0)) / GIB
        need = max(size - have, 0.0)
        if need * GIB <= free:
            continue
        free_gib = free / GIB
        found.append(Refusal(
            f"not enough free disk for model {name}",
            f"it needs {need:.1f} GiB more at {model['dest']} ({size:.1f} GiB in all, {have:.1f} GiB already "
            f"there) and that filesystem has {free_gib:.1f} GiB free",
            f"free {need - free_gib:.1f} GiB there, or set models.{name}.dest (or models_dir) to a "
            "filesystem with room", "disk"))
    return found


# rigup's own directories, by the key that sets them (or what the path is): root writes, reads or
# runs what is there, so no model's directory (the rigup user's) may be in one or hold one.
OWN_DIRS = (("rigup_prefix", None), ("rigup_state_dir", None), ("llama_cpp_dir", None),
            ("llama_cpp_ccache_dir", None), ("vllm_dir", None), ("cmpunlocker_dir", None),
            ("/etc/rigup", "rigup's configuration and keys"), ("/var/lib/rigup", "the serving units' state"),
            ("/var/cache/rigup", "the serving units' caches"), ("/run/rigup", "the converge lock"),
            (TEXTFILE_DIR, "the node exporter's textfile directory"))


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_dest(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """A model's dest inside one of rigup's own directories (rigup_prefix, rigup_state_dir,
    /etc/rigup, the build, ccache, vLLM and unlocker directories, the serving units' state and
    caches, the textfile directory) or holding one, or the same as another model's dest, or inside
    it: the rigup user owns a model's directory, and root must never find there what it writes or
    runs (rigup.nofollow)."""
    entries = models(data)[0]
    raw = data.get("models") or {}
    own = [(str(data[key]).rstrip("/") or "/", f"{key} ({data[key]})") if data.get(key) else None
           for key, what in OWN_DIRS if what is None] + [(path, f"{path} ({what})") for path, what in OWN_DIRS if what]
    found = []
    for name, model in entries.items():
        dest, key = model["dest"], f"models.{name}.dest"
        origin = "" if (raw.get(name) or {}).get("dest") else f" (models_dir/{name})"
        for place in filter(None, own):
            if _within(dest, place[0]) or _within(place[0], dest):
                where = "is" if dest == place[0] else "is inside" if _within(dest, place[0]) else "holds"
                found.append((key, f"{dest}{origin} {where} {place[1]}: the rigup user owns a model's directory, "
                                   "and root writes, reads or runs what is in rigup's (give the models a directory "
                                   "of their own, e.g. /srv/models)"))
                break
        for other, theirs in entries.items():
            if other == name:
                continue
            if dest == theirs["dest"] and name < other:
                found.append((key, f"{dest} is also models.{other}.dest: each model needs a directory of its own"))
            elif _within(dest, theirs["dest"]) and dest != theirs["dest"]:
                found.append((key, f"{dest} is inside models.{other}.dest ({theirs['dest']}): each model needs a "
                                   "directory of its own, outside every other"))
    return config_refusals(found)


def check_warm(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """The models with ``warm: true`` larger together (size_gib) than model_fetch_warm_max_ram of
    the host's RAM: the page cache would evict them again, and the host's own work with them."""
    warm = {n: m["size_gib"] for n, m in models(data)[0].items() if m["warm"] and m.get("size_gib") is not None}
    ram = (facts.get("cpu") or {}).get("mem_bytes")
    if not warm or not ram:
        return []
    total, most = sum(warm.values()), data["model_fetch_warm_max_ram"] * ram / GIB
    if total <= most:
        return []
    return [Refusal(f"the warm models do not fit the page cache ({', '.join(f'{n} {g:.1f} GiB' for n, g in warm.items())})",
                    f"{total:.1f} GiB > {data['model_fetch_warm_max_ram']:g} of the host's {ram / GIB:.1f} GiB of RAM "
                    f"({most:.1f} GiB, model_fetch_warm_max_ram)",
                    "warm fewer models (models.NAME.warm: false), or raise model_fetch_warm_max_ram", "ram")]


CHECKS = (check_config, check_endpoint, check_dest, check_disk, check_warm)
