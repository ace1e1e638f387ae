"""roles/model_fetch's refusals: pure functions of a host's plan, facts and data (see
rigup/refusal.py). What only the hub can tell (an unknown revision, a pattern that matches
nothing, an incomplete shard set, a peer without the model) the role refuses itself, before
any byte, from its own probe.

    check_config    an entry of models that is wrong, by key path (or that the hub answered
                    something hostile for: roles/model_fetch/hub.py)
    check_endpoint  hf_endpoint that is not an https:// URL (http:// only with hf_endpoint_insecure,
                    never with a token)
    check_disk      a model (size_gib) larger than the free disk where it goes; the files of
                    another revision at dest do not count (a revision change fetches next to it)
"""

from __future__ import annotations

import re

from rigup.models import hub_endpoint, models
from rigup.names import revision_dir
from rigup.refusal import Refusal, config_refusals

GIB = 1024 ** 3
ENDPOINT = re.compile(r"(https?)://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")


def check_config(plan: dict, facts: dict, data: dict) -> list[Refusal]:
    """An entry of models that is wrong: its name, an unknown or mistyped key, a repo that is not
    the hub's org/name, a revision that is not a full commit, an unknown family; or one the hub
    answered something hostile for when asked on the controller (a commit that is not 40 hex, a
    listing with an unsafe, duplicate or unhashed path, a compressed listing or header, a next
    page on another origin)."""
    return config_refusals(models(data)[1])


def check_endpoint(plan: dict, facts: dict, data: dict) -> list[Refusal]:
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
    return []


def check_disk(plan: dict, facts: dict, data: dict) -> list[Refusal]:
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


CHECKS = (check_config, check_endpoint, check_disk)
