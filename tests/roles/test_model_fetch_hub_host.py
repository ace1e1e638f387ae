"""model_fetch's controller side on a lab host: a branch as revision refused by preflight with the
pin to write (host, key, file), then fetched at that commit with --data models_allow_unpinned=true;
the endpoint from the controller's HF_ENDPOINT. The lab hub is http:// (hf_endpoint_insecure:
true, inventory/lab.py), so the controller's HF_TOKEN goes nowhere: not to the host
(/etc/rigup/hf-token), not to the hub, not into pyinfra's output (a token travels only over
https://: tests/unit/test_model_fetch_hostile_hub.py)."""

import os
import re

import pytest

from tests.conftest import on_host
from tests.roles.test_model_fetch import converge, marker, play  # noqa: F401 - play is a fixture

pytestmark = pytest.mark.lab
TOKEN = "hf_lab_host_token_0123456789"


@pytest.fixture(scope="module")
def one_host():
    """A lab host: the session's lab when one runs, else a lab of one host for this module."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    from tests.lab import hub, lab

    mine = not lab.STATE_FILE.exists()
    if mine:
        lab.up(1, "a100")
    try:
        hub.serve()
        yield lab, hub
    finally:
        if mine:
            lab.down()


def test_branch_pinned_then_fetched_and_no_token_sent_in_clear(one_host, play, tmp_path):  # noqa: F811
    lab, hub = one_host
    name = lab.hosts()[0]["name"]
    gguf = hub.CACHE / "hubhost.gguf"
    if not gguf.exists():
        lab.write(gguf, hub.gguf_bytes({"general.architecture": "llama", "llama.block_count": 4,
                                        "llama.embedding_length": 256, "llama.attention.head_count": 4},
                                       {"blk.0.weight": os.urandom(2 << 20)}))
    commit = hub.publish("lab/hubhost-gguf", {"model.gguf": gguf})
    dest = "/srv/models/hubhost"
    on_host(lab, name, f"rm -rf {dest} /etc/rigup/hf-token")
    models = {"hubhost": {"repo": "lab/hubhost-gguf", "revision": "main", "wait": True}}
    env = {"HF_ENDPOINT": hub.url(), "HF_TOKEN": TOKEN}
    host_data = {name: {"models": models, "hf_endpoint": None}}
    hub.reset()

    refused = converge(play, tmp_path, host_data, check=False, env=env)
    assert refused.returncode != 0
    line = next(ln for ln in refused.output.splitlines() if f"[{name}] refused: models.hubhost.revision" in ln)
    print(line.strip())
    assert re.search(r"models\.hubhost\.revision \([^)]+\): main is " + commit + "; pin it", line)
    assert on_host(lab, name, f"test -e {dest} && echo yes || echo no").strip() == "no"

    run = converge(play, tmp_path, host_data, "--data", "models_allow_unpinned=true", env=env)
    print(next(ln for ln in run.output.splitlines() if "models.hubhost.revision: main is" in ln).strip())
    print(next(ln for ln in run.output.splitlines() if "models.hubhost.size_gib" in ln).strip())
    done = marker(lab, name, dest)
    assert done and done["revision"] == commit
    assert on_host(lab, name, "test -e /etc/rigup/hf-token && echo yes || echo no").strip() == "no"
    assert TOKEN not in refused.output + run.output
    seen = hub._call("/_lab/tokens")
    print(f"tokens the hub saw, by client: { {k: len(v) for k, v in seen.items()} }; run {run.seconds:.1f} s")
    assert not any(TOKEN in v for v in seen.values())
