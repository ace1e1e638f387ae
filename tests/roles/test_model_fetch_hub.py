"""model_fetch's controller side (roles/model_fetch/hub.py, huggingface_hub) against the lab hub
(tests/lab/hub.py): a branch and a tag resolved to their commit and printed as the pin, size_gib
from the hub's sizes, an unknown family's layers and KV size from the GGUF header read with a
Range request, one listing per repo@commit for every host of a run, the token from HF_TOKEN
sent, HF_ENDPOINT honoured, a clear line when the hub does not know the repo.

No lab host is needed: the hub alone (on the lab gateway when a lab is up, else on a loopback
address of this lab's id), asked as a play asks it (the role's ``resolve``, called by
rigup.config when a host's configuration is first read), figures printed."""

import os

import pytest

from rigup.config import Config
from rigup.models import models
from roles.llama_server.replicas import need_gib
from roles.model_fetch import hub as controller
from tests.runs import own_run

pytestmark = pytest.mark.lab

LLAMA_KV = {"general.architecture": "llama", "general.name": "hubtest", "llama.block_count": 22,
            "llama.embedding_length": 2048, "llama.attention.head_count": 32, "llama.attention.head_count_kv": 4}
REPO = "lab/hubtest-gguf"
TENSOR = 4 << 20


@pytest.fixture(scope="module")
def hub():
    """(the hub module, main's commit, v1's commit): the repo published twice, v1 a tag on the first."""
    if os.geteuid() != 0:
        pytest.skip("the lab hub's state directory needs root")
    from tests.lab import hub as lab_hub
    from tests.lab import lab

    mine = not lab.STATE_FILE.exists() and not lab_hub.PID.exists()
    lab_hub.serve(None if lab.STATE_FILE.exists() else f"127.0.{int(lab.LAB_ID or 0)}.1")
    gguf = lab_hub.CACHE / "hubtest.gguf"
    if not gguf.exists():
        lab.write(gguf, lab_hub.gguf_bytes(LLAMA_KV, {"blk.0.weight": os.urandom(TENSOR)}))
    readme, readme2 = lab_hub.CACHE / "hubtest-readme.md", lab_hub.CACHE / "hubtest-readme2.md"
    lab.write(readme, "first\n")
    lab.write(readme2, "second, a larger file\n")
    v1 = lab_hub.publish(REPO, {"model.gguf": gguf, "README.md": readme})
    lab_hub._git(lab_hub.MODELS / REPO, "tag", "-f", "v1", v1)
    main = lab_hub.publish(REPO, {"model.gguf": gguf, "README.md": readme2})
    yield lab_hub, main, v1
    if mine:
        lab_hub.stop()


@pytest.fixture(autouse=True)
def run(monkeypatch, tmp_path):
    """Each test is one controller run (tests/runs.py, rigup/run.py: the hub's answers and calls):
    nothing asked or recorded yet, nothing kept from before."""
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path / "cache"))
    with own_run() as fresh:
        yield fresh


def configured(data: dict) -> Config:
    """``data`` as a host's configuration in a run: the hub asked when it is first read."""
    return Config("h", data, (controller.resolve,))


def requests(lab_hub, what: str) -> int:
    return sum(what in line for line in lab_hub.LOG.read_text().splitlines()) if lab_hub.LOG.exists() else 0


def test_branch_tag_size_and_header(hub, monkeypatch, run):
    lab_hub, main, v1 = hub
    monkeypatch.setenv("HF_TOKEN", "hf_lab_token_from_env")
    data = {"hf_endpoint": lab_hub.url(), "models": {
        "a": {"repo": REPO, "revision": "main"},
        "b": {"repo": REPO, "revision": "v1", "include": ["*.gguf"]},
        "c": {"repo": REPO, "revision": main, "include": ["*.gguf"]},
    }}
    lab_hub.reset()
    trees, infos = requests(lab_hub, f"/api/models/{REPO}/tree/"), requests(lab_hub, f"/api/models/{REPO}/revision/")
    hosts = [configured(data) for _ in range(4)]   # four hosts of one run
    lines = [line for cfg in hosts for line in controller.lines(cfg)]
    trees = requests(lab_hub, f"/api/models/{REPO}/tree/") - trees
    infos = requests(lab_hub, f"/api/models/{REPO}/revision/") - infos
    reads = [k for k in run.hub_calls if k[0] == "gguf"]
    header_bytes = sum(run.hub_answers[k]["read_bytes"] for k in reads)
    print(*lines[:4], sep="\n")
    print(f"hub requests for 4 hosts x 3 models: {infos} revision lookups, {trees} listings, "
          f"{header_bytes} bytes of the {TENSOR + 256}-byte GGUF read for its header")
    assert f"models.a.revision: main is {main}; pin it" in lines
    assert f"models.b.revision: v1 is {v1}; pin it" in lines
    assert any(line.startswith("models.b: family unknown; GGUF header of model.gguf (llama): 22 layers, "
                               "KV cache 0.021 GiB per 1k tokens") for line in lines)
    assert infos == 2 and trees == 2   # main and v1 looked up once; one listing per repo@commit
    # a Range request of the first MiB for each commit (main, v1), not the 4 MiB file
    assert len(reads) == 2 and header_bytes == 2 * controller.HEAD_BYTES[0]
    assert lab_hub.bytes_served() <= header_bytes
    assert "hf_lab_token_from_env" in [t for ts in lab_hub._call("/_lab/tokens").values() for t in ts]

    entries, problems = models(hosts[0])
    assert sorted(entries) == ["c"] and [key for key, _ in problems] == ["models.a.revision", "models.b.revision"]
    assert f"pin it (revision: {v1})" in problems[1][1]
    gguf_gib = (os.path.getsize(lab_hub.CACHE / "hubtest.gguf")) / (1 << 30)
    assert entries["c"]["size_gib"] == pytest.approx(gguf_gib, abs=1e-4)
    need = need_gib(entries["c"], {"ngl": 99, "ctx": 32768}, 1)
    print(f"VRAM need of c at ctx 32768: weights {need.weights:.4f} GiB + KV {need.kv:.3f} GiB + "
          f"{need.overhead} GiB = {need.total:.3f} GiB")
    assert need.kv == pytest.approx(0.021 * 32.768)

    allowed = models(configured({**data, "models_allow_unpinned": True}))[0]
    assert allowed["a"]["revision"] == main and allowed["b"]["revision"] == v1 and allowed["a"]["pinned_from"] == "main"
    assert allowed["a"]["size_gib"] > allowed["b"]["size_gib"] > 0   # a: every file; b: the GGUF alone


def test_endpoint_from_the_environment_and_unknown_repo(hub, monkeypatch):
    lab_hub, main, _ = hub
    monkeypatch.setenv("HF_ENDPOINT", lab_hub.url())
    monkeypatch.delenv("HF_TOKEN", raising=False)
    data = {"hf_endpoint": None, "models": {"x": {"repo": REPO, "revision": "main", "size_gib": 1.0},
                                            "gone": {"repo": "lab/not-here", "revision": "main"}}}
    data = configured(data)
    lines = controller.lines(data)
    print(*lines, sep="\n")
    assert f"models.x.revision: main is {main}; pin it" in lines
    assert any(line.startswith("models.gone: the hub did not answer what preflight needs: RepositoryNotFoundError")
               and lab_hub.url() in line for line in lines)
    problems = dict(models(data)[1])
    assert "could not resolve (RepositoryNotFoundError" in problems["models.gone.revision"]


def test_what_a_commit_holds_is_asked_once_ever(hub):
    """A second run (the in-run memory cleared) asks the hub nothing about a pinned commit: its
    listing and its header are kept on the controller (RIGUP_CACHE_DIR), as a commit never changes."""
    lab_hub, main, _ = hub
    data = {"hf_endpoint": lab_hub.url(), "models": {"c": {"repo": REPO, "revision": main, "include": ["*.gguf"]}}}
    with own_run() as first_run:
        first_lines = controller.lines(configured(data))
    first = sorted(k[0] for k in first_run.hub_calls)
    with own_run() as next_run:
        cfg = configured(data)
        lines = controller.lines(cfg)
    print(f"\nfirst run asked the hub {first}; the next run {next_run.hub_calls}")
    assert first == ["gguf", "tree"] and next_run.hub_calls == [] and lines == first_lines
    entries, problems = models(cfg)
    assert problems == [] and entries["c"]["size_gib"] and entries["c"]["gguf"]["layers"] == 22
