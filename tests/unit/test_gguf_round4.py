"""Two GGUF headers rigup sized that llama.cpp will not load (issue 61, round 4): heads wider than the
embedding with no key_length (G2: k_len 32 // 64 = 0 sized the KV cache "not counted", C10's class
through the one door _at_least_1 did not guard), and a first shard whose split.count disagrees with
the shards its name says (G13). Each is refused, naming the keys."""

import pytest

from shipped.gguf import GGUFRefused, kv_figures, metadata, split_problem
from roles.model_fetch import hub as hub_module
from roles.model_fetch.hub import HubRefused
from tests.lab.hub import gguf_bytes
from tests.runs import own_run
from tests.unit.test_model_fetch_hub import COMMIT, hub_serving

LLAMA = {"general.architecture": "llama", "llama.block_count": 32, "llama.embedding_length": 32,
         "llama.attention.head_count": 64, "llama.attention.head_count_kv": 8}


def test_G2_heads_wider_than_the_embedding_without_key_length_are_refused():
    with pytest.raises(GGUFRefused, match="head_count 64 over llama.embedding_length 32") as e:
        kv_figures(metadata(gguf_bytes(LLAMA, {})))
    print(e.value)
    sized = kv_figures(metadata(gguf_bytes({**LLAMA, "llama.attention.key_length": 128}, {})))
    print(sized)
    assert sized["kv_gib_per_1k_tokens"] > 0   # a key_length given: sized as llama.cpp reads it


@pytest.mark.parametrize("count, path, why", [
    (3, "m-00001-of-00002.gguf", "split.count 3 in its header, but its name says 2 file(s)"),
    (2, "m.gguf", "split.count 2 in its header, but its name says 1 file(s)"),
    (0, "q/m-00001-of-00002.gguf", "split.count 0"),
    (2, "m-00001-of-00002.gguf", None), (1, "m.gguf", None), (None, "m-00001-of-00002.gguf", None),
])
def test_G13_a_first_shards_split_count_is_held_to_its_name(count, path, why):
    meta = {} if count is None else {"split.count": count, "split.no": 0}
    got = split_problem(meta, path)
    print(count, path, "->", got)
    assert got == why if why is None else why in got


def head_refused(monkeypatch, split: dict, why: str) -> None:
    """hub._head of m-00001-of-00002.gguf whose header holds ``split`` is refused with ``why``."""
    body = gguf_bytes({"general.architecture": "llama", "llama.block_count": 32, **split}, {})
    endpoint, server = hub_serving(lambda path, ranged: (206, body))
    monkeypatch.setattr(hub_module, "_kept", lambda key: None)
    try:
        with own_run(), pytest.raises(HubRefused, match=why) as e:   # a run of its own: nothing asked yet
            hub_module._head(endpoint, "org/x", COMMIT, "m-00001-of-00002.gguf", None, len(body))
    finally:
        server.shutdown()
    print(e.value)


def test_G13_the_hub_head_of_such_a_shard_is_refused(monkeypatch):
    head_refused(monkeypatch, {"split.count": 3}, "split.count 3 in its header, but its name says 2")


@pytest.mark.parametrize("number, why", [
    (1, "split.no 1 in its header"), (None, "split.no none in its header"), (0, None)])
def test_N27_a_first_file_of_a_set_is_split_no_0(number, why):
    """re4 N27: split.count 2 and split.no 1 in m-00001-of-00002.gguf was sized and fetched; llama.cpp
    throws "illegal split file idx: 1 ... must be loaded with the first split"."""
    meta = {"split.count": 2} if number is None else {"split.count": 2, "split.no": number}
    got = split_problem(meta, "m-00001-of-00002.gguf")
    print(meta, "->", got)
    assert got == why if why is None else why in got
    with pytest.raises(GGUFRefused, match="split.no"):
        split_problem({"split.count": 2, "split.no": True}, "m-00001-of-00002.gguf")
    assert split_problem({"split.count": 1, "split.no": 3}, "m.gguf") is None   # one file: llama.cpp reads no index


def test_N27_the_hub_head_of_a_first_file_numbered_1_is_refused(monkeypatch):
    head_refused(monkeypatch, {"split.count": 2, "split.no": 1}, "split.no 1 in its header")
