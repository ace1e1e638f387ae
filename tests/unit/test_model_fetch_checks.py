"""roles/model_fetch/checks.py and rigup/models.py: model entries and free disk (no hosts)."""

from rigup.models import models
from tests.unit.hosts import GIB, GLM, REV, data, glm_llama, host, only, refusals


def test_7_not_enough_disk_gives_both_sizes():
    plan, facts = host("h100", free_disk={"/": 50 * GIB, "/srv/models/glm": 50 * GIB})
    (r,) = only(refusals(plan, facts, data(**glm_llama())), "disk")
    assert r.what == "not enough free disk for model glm"
    assert "needs 186.0 GiB more at /srv/models/glm" in r.why and "has 50.0 GiB free" in r.why
    assert "free 136.0 GiB there" in r.fix


def test_7_bytes_already_downloaded_count():
    plan, facts = host("h100", free_disk={"/srv/models/glm": 50 * GIB},
                       model_bytes={"/srv/models/glm": 150 * GIB})
    assert refusals(plan, facts, data(**glm_llama())) == []


def test_7_dest_and_models_dir_are_used():
    d = glm_llama()
    d["models"]["glm"]["dest"] = "/data/glm"
    entries, problems = models(data(**d))
    assert problems == [] and entries["glm"]["dest"] == "/data/glm"
    entries, _ = models(data(models_dir="/big", **glm_llama()))
    assert entries["glm"]["dest"] == "/big/glm"


def test_config_model_problems():
    plan, facts = host("h100")
    d = {"models": {"glm": {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": "main", "family": "glm5"},
                    "bad": {"revision": REV}}}
    found = only(refusals(plan, facts, data(**d)), "config")
    paths = {r.what: r.why for r in found}
    assert "expected a full 40-hex commit id, got 'main'" in paths["models.glm.revision"]
    assert "'glm5' is not a family of rigup/gpu/models.yml" in paths["models.glm.family"]
    assert paths["models.bad.repo"] == "required (str)"


def test_the_share_port_is_claimed_on_a_host_peers_copy_from():
    from rigup.refusal import Fleet
    from roles import model_fetch
    peer = {"models": {"glm": {**GLM, "fetch_from": "rig-01"}}}
    fleet = Fleet("rig-01", {"rig-01": data(models={"glm": GLM}), "rig-02": peer})
    assert model_fetch.ports({}, data(), fleet) == [(8091, "model_fetch_share_port", ("rigup-share",))]
    assert model_fetch.ports({}, data(), Fleet("rig-02", fleet.hosts)) == []
    plan, facts = host("h100", listening_ports={8091: "python3"})
    (r,) = refusals(plan, facts, data(models={"glm": GLM}), fleet)
    assert r.what == "port 8091 of model_fetch_share_port is already taken"
