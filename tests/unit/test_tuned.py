"""llama_server_tuned (rigup/instances/tuned.py), host_vars (rigup.config) and tune.py's pieces on
the controller (plays/tuning.py): what a sweep found becomes the host's data, and the converge's."""

import tempfile
from pathlib import Path

import yaml
from hypothesis import given, settings, strategies as st

from plays import charts, tuning
from rigup import config
from rigup.boundary.core import Unreadable
from roles.llama_server.command import argv
from rigup.instances.llama_server import instances
from tests.unit.hosts import REV, data

RESULT = {"concurrency": 4, "levels": [1, 4], "spent_s": 61.0, "stopped": None, "ratio": 1.8,
          "baseline": {"flags": {}, "tps": 50.0, "status": "ok"},
          "best": {"flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on"}, "tps": 90.0, "status": "ok"},
          "points": [{"flags": {}, "status": "ok", "tps": 50.0, "levels": [{"concurrency": 1, "total_tps": 30.0}]},
                     {"flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on"}, "tps": 90.0, "status": "ok"}]}


def served(**tuned):
    return data(models={"m": {"repo": "a/b-GGUF", "revision": REV}},
                llama_server_instances={"g": {"model": "m", "port": 8081, "ctx": 4096, "parallel": 2}},
                llama_server_tuned=tuned)


def test_tuned_flags_replace_the_instances_own_keys():
    found, problems = instances(served(g={"flags": {"parallel": 4, "ctx": 16384, "flash_attn": "on"}, "tok_s": 90.0}))
    assert problems == [] and (found["g"]["ctx"], found["g"]["parallel"], found["g"]["flash_attn"]) == (16384, 4, "on")
    assert "-c 16384 --parallel 4" in " ".join(argv("g", found["g"], "/b/llama-server", "/m.gguf"))


def test_a_wrong_tuned_entry_is_named_by_its_key_path():
    _, problems = instances(served(g={"flags": {"parallel": 0, "rope": 3}}, gone={"flags": {}}))
    paths = [p for p, _ in problems]
    assert paths == ["llama_server_tuned.g.flags.parallel", "llama_server_tuned.g.flags.rope", "llama_server_tuned.gone"]


def test_a_sweeps_result_becomes_host_vars_and_the_hosts_data(tmp_path):
    found = tuning.entry(RESULT, "lab-base-1234567890")
    assert found["flags"] == {"parallel": 4, "ctx": 16384, "flash_attn": "on"} and found["tok_s"] == 90.0
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "rig-07.yml").write_text("rigup_batch: 2\nllama_server_tuned: {other: {flags: {}}}\n")
    path = tuning.write_host_vars("rig-07", {"g": found}, str(tmp_path))
    doc = yaml.safe_load(path.read_text())
    assert path.read_text().startswith("# Written by tune.py") and doc["rigup_batch"] == 2
    assert set(doc["llama_server_tuned"]) == {"other", "g"}
    assert config.host_vars("rig-07", tmp_path)["llama_server_tuned"]["g"]["flags"]["parallel"] == 4


@settings(max_examples=60, deadline=1000)
@given(host=st.one_of(st.text(max_size=20), st.sampled_from(["../group_vars/all", "..", "a/b", "/etc/x", "lab1",
                                                            "gpu-1.example.org", "fd00::1", "10.0.0.7", "rig_07"])))
def test_a_host_name_names_its_host_vars_file_or_is_refused(host):
    """Round 2 of issue 61, item 18: an inventory host named ../group_vars/all wrote group_vars/all.yml."""
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "host_vars").mkdir()
        try:
            path = tuning.write_host_vars(host, {"g": {"flags": {}, "tok_s": 1.0}}, site)
        except Unreadable as e:
            assert repr(host)[:40] in e.where, e
            assert sorted(p.name for p in Path(site).rglob("*")) == ["host_vars"]
            if host == "../group_vars/all":
                print(f"write_host_vars({host!r}) -> refused: {e}")
            return
        assert path.parent == Path(site) / "host_vars" and path.name == f"{host}.yml", (host, path)


def test_an_inventorys_hosts_get_their_host_vars(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "rig-07.yml").write_text("llama_server_tuned: {g: {flags: {parallel: 4}}}\n")
    inventory = tmp_path / "mine.py"
    module = {"__file__": str(inventory), "rigs": ["rig-07", ("rig-08", {"ssh_port": 2222})]}
    config.all_group(module, site=str(tmp_path))
    hosts = dict(h if isinstance(h, tuple) else (h, {}) for h in module["rigs"][0])
    assert hosts["rig-07"]["llama_server_tuned"]["g"]["flags"] == {"parallel": 4} and hosts["rig-08"] == {"ssh_port": 2222}


def test_the_job_stops_the_unit_sweeps_as_the_rigup_user_and_always_starts_it_again():
    d = data(rigup_state_dir="/var/lib/rigup")
    unit, command, log, done = tuning.job("g", d)
    assert unit == "rigup-tune-g" and log == "/var/lib/rigup/tuner/g.log" and done == "/var/lib/rigup/tuner/g.done"
    assert "/var/lib/rigup/tuner/out/g.json" in command      # the sweep writes only in the rigup user's out/
    stop, sweep, start = command.index("systemctl stop"), command.index("runuser -u rigup"), command.index("systemctl start")
    assert stop < sweep < start and "rc=$?" in command[sweep:start]
    spec = tuning.spec("g", ["/b/llama-server", "-c", "8192", "--parallel", "2"], d, True, None, ctx=8192, parallel=2)
    assert spec["concurrency"] == 2 and spec["slot_tokens"] == 4096 and spec["levels"] == [2]
    assert spec["env"] == {} and spec["gpus"] == 1 and spec["logs"] == "/var/lib/rigup/tuner/out"


def test_what_another_user_placed_in_the_tuners_directory_is_named(tmp_path):
    """tuning.Unsafe run for real on a directory with plants: a link, a FIFO, a file of another
    user, ``out`` of the wrong owner; root's own regular files and ``out`` of the user pass."""
    import os
    import pwd
    import subprocess

    def unsafe(folder, user):
        run = subprocess.run(tuning.Unsafe().command(str(folder), user), shell=True, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return tuning.Unsafe().process(run.stdout.splitlines())

    me, uid = pwd.getpwuid(os.getuid()).pw_name, os.getuid()
    d = tmp_path / "tuner"
    assert unsafe(d, me) == []                              # not made yet
    d.mkdir()
    (d / "out").mkdir()
    (d / "rigup_tune.py").write_text("")
    found = unsafe(d, me)
    assert found == ([] if uid == 0 else [("d", me, str(d))])     # the directory itself is root's, or named
    (d / "g.spec.json").symlink_to("/etc/shadow")
    os.mkfifo(d / "g.log")
    kinds = {p.rsplit("/", 1)[1]: k for k, _, p in unsafe(d, me)}
    assert kinds["g.spec.json"] == "l" and kinds["g.log"] == "p" and "out" not in kinds
    assert ("d", me, str(d / "out")) in unsafe(d, "nobody")          # out/ must be the rigup user's
    print(f"\nnamed: {unsafe(d, 'nobody')}")


def test_the_sweeps_servers_get_the_units_environment_and_its_gpus():
    lines = ["C PATH=/usr/local/cuda-12.8/bin:/usr/bin", "C LD_LIBRARY_PATH=/usr/local/cuda-12.8/lib64",
             'E "CUDA_VISIBLE_DEVICES=GPU-b,GPU-a"', "G 8"]
    served = tuning.ServingEnv().process(lines + ["B /opt/rigup/llama.cpp/builds/b6123-3f2a1b9c0d"])
    assert served == {"env": {"PATH": "/usr/local/cuda-12.8/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda-12.8/lib64",
                              "CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"}, "gpus": 2,   # its own 2 of the host's 8
                      "build": "b6123-3f2a1b9c0d"}
    assert tuning.ServingEnv().process(["G 8", "B a b"]) == {"env": {}, "gpus": 8, "build": None}
    spec = tuning.spec("g", ["/b/llama-server", "-c", "8192"], data(rigup_state_dir="/var/lib/rigup"), True, None, served,
                       ctx=8192, parallel=1)
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-a" and spec["gpus"] == 2


def test_status_says_how_much_faster_the_tuned_flags_were():
    from plays.fleet import serving_cell, tuned_text
    assert tuned_text(tuning.entry(RESULT, None)) == "tuned 1.80x at 4 concurrent" and tuned_text(None) is None
    row = {"serving": [{"name": "g", "active": "active", "port": 8081, "health": 200, "model": "m@dc8aac109665",
                        "tuned": "tuned 1.80x at 4 concurrent"}]}
    assert serving_cell(row) == "g active :8081 200 m@dc8aac109665 (tuned 1.80x at 4 concurrent)"


def test_a_kept_sweep_writes_host_vars_a_table_and_a_plot(tmp_path, capsys):
    tuning.record("rig-07", "g", RESULT, {"_rigup_site": str(tmp_path)}, ["/b/llama-server"], plot=charts.plot)
    said = capsys.readouterr().err
    day = next((tmp_path / "tune_out").iterdir())
    assert "[rig-07] tune g: {'parallel': 4, 'ctx': 16384, 'flash_attn': 'on'}: 90.0 tok/s, 1.8x" in said
    assert (day / "rig-07-g.md").read_text().startswith("# tune.py: rig-07 g")
    assert (day / "rig-07-g.png").read_bytes()[:4] == b"\x89PNG"
    assert yaml.safe_load((tmp_path / "host_vars" / "rig-07.yml").read_text())["llama_server_tuned"]["g"]["tok_s"] == 90.0


def test_a_tuned_instance_of_a_model_pinned_by_the_hub_keeps_its_model():
    """The tuned flags are laid over the instances alone: the configuration, with the hub's pin of
    the model's branch, is what the instance's model is read from (a copy of the whole data lost it)."""
    from rigup.models import hub_endpoint, hub_key
    from tests.unit.hosts import answered

    d = data(models={"m": {"repo": "a/b-GGUF", "revision": "main"}}, models_allow_unpinned=True,
             llama_server_instances={"g": {"model": "m", "port": 8081}},
             llama_server_tuned={"g": {"flags": {"parallel": 4}}})
    cfg = answered(d, {hub_key(hub_endpoint(d), {"repo": "a/b-GGUF", "revision": "main", "include": []}): {"commit": REV}})
    found, problems = instances(cfg)
    assert problems == [] and found["g"]["parallel"] == 4
