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
    assert model_fetch.ports({}, data(), fleet) == [(8091, "model_fetch_share_port", ("rigup-share",), ())]
    assert model_fetch.ports({}, data(), Fleet("rig-02", fleet.hosts)) == []
    plan, facts = host("h100", listening_ports={8091: "python3"})
    (r,) = refusals(plan, facts, data(models={"glm": GLM}), fleet)
    assert r.what == "port 8091 of model_fetch_share_port is already taken"


def test_warm_models_larger_than_their_share_of_the_ram_are_refused():
    """issue 49: models with warm: true (kept in the page cache) beyond model_fetch_warm_max_ram of
    the host's RAM (its MemTotal, read with the CPU) are refused, naming each and the RAM."""
    d = glm_llama()
    d["models"]["glm"]["warm"] = True
    plan, facts = host("h100", cpu={"mem_bytes": 256 * GIB})
    (r,) = only(refusals(plan, facts, data(**d)), "ram")
    print(r.line("h"))
    assert r.what == "the warm models do not fit the page cache (glm 186.0 GiB)"
    assert r.why == "186.0 GiB > 0.5 of the host's 256.0 GiB of RAM (128.0 GiB, model_fetch_warm_max_ram)"
    assert refusals(plan, facts, data(model_fetch_warm_max_ram=0.8, **d)) == []
    plan, facts = host("h100", cpu={"mem_bytes": 512 * GIB})
    assert refusals(plan, facts, data(**d)) == []


def test_the_warm_pass_reads_each_complete_models_files_through_vmtouch(tmp_path, monkeypatch, capsys):
    """rigup-fetch warm: vmtouch -t on the files the marker lists (each inside the model's
    directory); a model not complete yet is skipped; a marker naming a path outside is refused."""
    import json

    from roles.model_fetch.shipped import fetcher
    calls = tmp_path / "calls"
    vmtouch = tmp_path / "vmtouch"
    vmtouch.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    vmtouch.chmod(0o755)
    monkeypatch.setattr(fetcher, "VMTOUCH", str(vmtouch))
    for name, files in (("a", ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]), ("evil", ["../a/x.gguf"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".rigup-complete.json").write_text(json.dumps({"files": files}))
    (tmp_path / "b").mkdir()
    config = tmp_path / "warm.json"
    config.write_text(json.dumps({"models": [{"name": n, "dest": str(tmp_path / n)} for n in ("a", "b", "evil")],
                                  "marker": ".rigup-complete.json", "token_file": "/nonexistent"}))
    assert fetcher.main(["warm", str(config)]) == 1
    out = capsys.readouterr().out
    print(out)
    assert calls.read_text().splitlines() == [f"-q -t -m 1048576G -- {tmp_path}/a/m-00001-of-00002.gguf "
                                              f"{tmp_path}/a/m-00002-of-00002.gguf"]
    assert "b: not complete yet, skipped" in out and "evil: its marker does not read (files: '../a/x.gguf': a '..' component" in out
