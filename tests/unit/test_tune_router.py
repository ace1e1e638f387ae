"""tune.py on a router (issue 63): each model of the set swept alone (plays/tuning.py ``model_argv``:
the server its router would start for it), its result kept under the router's ``models`` in
``llama_server_tuned`` (rigup/instances/tuned.py), laid over that model's ``per_model`` on the
next converge; a tuned model no longer of the set is ignored with a plan line, a malformed entry
refused by its key path. Single servers: tests/unit/test_tuned.py and test_tune.py, unchanged."""

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from plays import tuning
from rigup.boundary import fields
from rigup.boundary.core import Unreadable
from rigup.contract import llama_server as contract
from plays.shipped.tune import flags_of
from roles.llama_server import ROLE
from roles.llama_server.checks import check_config
from roles.llama_server.command import argv, preset_text
from rigup.instances.llama_server import instances
from rigup.instances.tuned import tuned_lines
from tests.unit.hosts import REV, data, host

MODELS = {"a": {"repo": "org/a-GGUF", "revision": REV, "size_gib": 3.0},
          "b": {"repo": "org/b-GGUF", "revision": REV, "size_gib": 3.3}}
FLAGS = contract.spellings(contract.SWEPT)   # the spec's flags (plays/tuning.py spec)
PATHS = {"a": "/srv/models/a/a.gguf", "b": "/srv/models/b/b-00001-of-00002.gguf"}
RESULT = {"concurrency": 4, "levels": [4], "spent_s": 61.0, "stopped": None, "ratio": 1.5,
          "baseline": {"flags": {}, "tps": 50.0, "status": "ok"},
          "best": {"flags": {"parallel": 4, "ctx": 32768, "flash_attn": "on"}, "tps": 75.0, "status": "ok"},
          "points": [{"flags": {}, "status": "ok", "tps": 50.0, "levels": [{"concurrency": 4, "total_tps": 50.0}]},
                     {"flags": {"parallel": 4, "ctx": 32768, "flash_attn": "on"}, "tps": 75.0, "status": "ok",
                      "levels": [{"concurrency": 4, "total_tps": 75.0}]}]}


def router(tuned=None, **inst) -> dict:
    return data(models=MODELS, llama_server_tuned=tuned or {},
                llama_server_instances={"x": {"model": "a", "port": 8081, "ctx": 8192, "parallel": 2, "also": ["b"],
                                              "models_max": 1, "cache_type_k": "f16", **inst}})


# ---------------------------------------------------------------- the sweep of each model, alone

def served(d: dict) -> tuple[list[str], dict]:
    """The router's ExecStart and its preset as the host holds them (roles/llama_server writes both)."""
    found, problems = instances(d)
    assert problems == []
    text = preset_text("x", found["x"], PATHS, {"a": REV, "b": REV})
    return argv("x", found["x"], "/opt/rigup/llama.cpp/current/llama-server", "/unused"), \
        tuning.Preset().process(text.splitlines())


def test_each_model_is_swept_as_the_server_its_router_would_start_for_it():
    """The router's flags, the preset's [*] and the model's own section, -m its file; none of the
    router's own flags: the same flags as a server of that model alone."""
    routed, preset = served(router(jinja=True, per_model={"b": {"ctx": 16384, "cache_type_k": "q8_0", "jinja": False}}))
    print(" ".join(routed))
    alone = {m: tuning.model_argv(routed, preset["sections"], m) for m in ("a", "b")}
    for m, (got, why) in alone.items():
        print(f"{m}: {' '.join(got)}")
        assert why == "" and got[:3] == [routed[0], "-m", PATHS[m]]
        assert not any(a.startswith("--models-") for a in got) and "load-on-startup" not in " ".join(got)
    a, b = flags_of(alone["a"][0], FLAGS), flags_of(alone["b"][0], FLAGS)
    assert (a["ctx"], a["parallel"], a["cache_type_k"]) == ("8192", "2", "f16") and "--jinja" in alone["a"][0]
    assert (b["ctx"], b["parallel"], b["cache_type_k"]) == ("16384", "2", "q8_0") and "--no-jinja" in alone["b"][0]
    assert "--jinja" not in alone["b"][0]
    # as a server of b alone: every flag the contract writes, the same values
    mine, _ = instances(router(jinja=True, also=[], models_max=1, ctx=16384, cache_type_k="q8_0", model="b"))
    single = argv("x", {**mine["x"], "jinja": False}, routed[0], PATHS["b"])
    assert {k: v for k, v in flags_of(single, FLAGS).items() if k not in ("port", "host")} == \
        {k: v for k, v in b.items() if k not in ("port", "host")}


@pytest.mark.parametrize("sections, why", [
    ({"a": {"model": "/a.gguf"}}, "not in the router's preset"),
    ({"b": {"model": "b.gguf"}}, "not an absolute path"),
    ({"b": {"model": "/b.gguf", "rope-freq-base": "1e6"}}, "the preset sets rope-freq-base: no flag rigup writes"),
])
def test_a_model_the_preset_does_not_hold_as_rigup_writes_it_is_not_swept(sections, why):
    got, said = tuning.model_argv(["/b/llama-server", "--models-preset", "/p.ini"], sections, "b")
    assert got is None and why in said


def test_each_models_job_stops_the_router_and_writes_its_own_result():
    d = data(rigup_state_dir="/var/lib/rigup")
    unit, command, log, done = tuning.job(tuning.model_job("x", "b"), d, "x")
    assert unit == "rigup-tune-x:b" and log == "/var/lib/rigup/tuner/x:b.log" and done == "/var/lib/rigup/tuner/x:b.done"
    assert "systemctl stop rigup-llama@x.service" in command and "systemctl start rigup-llama@x.service" in command
    assert "/var/lib/rigup/tuner/out/x:b.json" in command
    assert tuning.job("g", d, None) == tuning.job("g", d)   # a single server's job as it was


# ---------------------------------------------------------------- the record, and the converge after it

def test_each_models_result_is_kept_beside_the_others_under_the_routers_models(tmp_path, capsys):
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "rig-07.yml").write_text(
        "rigup_batch: 2\nllama_server_tuned:\n  g: {flags: {parallel: 8}}\n  x: {models: {gone: {flags: {}}}}\n")
    site = {"_rigup_site": str(tmp_path)}
    tuning.record("rig-07", "x", RESULT, site, ["/b/llama-server"], "b1", model="a")
    fa = {"flags": {"flash_attn": "on"}, "tps": 75.0, "status": "ok", "levels": [{"concurrency": 4, "total_tps": 75.0}]}
    tuning.record("rig-07", "x", dict(RESULT, best=fa, points=[RESULT["points"][0], fa]), site, [], model="b")
    said = capsys.readouterr().err
    doc = yaml.safe_load((tmp_path / "host_vars" / "rig-07.yml").read_text())
    tuned = doc["llama_server_tuned"]
    print(said)
    assert doc["rigup_batch"] == 2 and tuned["g"] == {"flags": {"parallel": 8}}
    assert sorted(tuned["x"]) == ["models"] and sorted(tuned["x"]["models"]) == ["a", "b", "gone"]
    assert tuned["x"]["models"]["a"]["flags"] == {"parallel": 4, "ctx": 32768, "flash_attn": "on"}
    assert tuned["x"]["models"]["a"]["tok_s"] == 75.0 and tuned["x"]["models"]["a"]["build"] == "b1"
    assert tuned["x"]["models"]["b"]["flags"] == {"flash_attn": "on"}
    day = next((tmp_path / "tune_out").iterdir())
    assert sorted(p.name for p in day.glob("*.md")) == ["rig-07-x-a.md", "rig-07-x-b.md"]
    assert "[rig-07] tune x a: {'parallel': 4, 'ctx': 32768, 'flash_attn': 'on'}: 75.0 tok/s" in said


def test_the_next_converge_serves_each_model_with_its_own_flags():
    """Each model's tuned flags over its per_model entry (the operator's other keys kept): in its
    preset section, off the router's command line (llama-server puts the command line first)."""
    tuned = {"x": {"models": {"a": {"flags": {"parallel": 4, "ctx": 32768}, "tok_s": 75.0},
                              "b": {"flags": {"flash_attn": "on", "ctx": 8192}}}}}
    found, problems = instances(router(tuned, per_model={"b": {"ctx": 16384, "cache_type_k": "q8_0"}}))
    assert problems == []
    assert found["x"]["per_model"] == {"a": {"parallel": 4, "ctx": 32768},
                                       "b": {"ctx": 8192, "cache_type_k": "q8_0", "flash_attn": "on"}}
    assert (found["x"]["ctx"], found["x"]["parallel"]) == (8192, 2)   # the router's own: as they were
    routed = argv("x", found["x"], "/b/llama-server", "/unused")
    text = preset_text("x", found["x"], PATHS)
    print(text)
    assert "-c" not in routed and "--parallel" not in routed and "-fa" not in routed
    sections = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
    assert sections[sections.index("[a]"):] == [
        "[a]", f"model = {PATHS['a']}", "load-on-startup = true", "ctx-size = 32768", "parallel = 4",
        "[b]", f"model = {PATHS['b']}", "ctx-size = 8192", "flash-attn = on", "cache-type-k = q8_0"]
    # and what the next sweep starts for a: the tuned flags are its baseline
    alone, _ = tuning.model_argv(routed, tuning.preset_sections(text.splitlines(), "p"), "a")
    assert (flags_of(alone, FLAGS)["ctx"], flags_of(alone, FLAGS)["parallel"]) == ("32768", "4")


def test_a_tuned_model_no_longer_of_the_set_is_ignored_with_a_plan_line():
    tuned = {"x": {"models": {"zz": {"flags": {"parallel": 64}}, "b": {"flags": {"parallel": 4}}}}}
    d = router(tuned)
    found, problems = instances(d)
    assert problems == [] and found["x"]["per_model"] == {"b": {"parallel": 4}}
    lines = tuned_lines(d)
    print("\n".join(lines))
    assert lines == ["llama:     x: llama_server_tuned.x.models.zz: ignored, zz is not a model of its set (a, b); "
                     "remove the entry, or tune it again"]
    plan, _ = host("a100")
    assert lines[0] in ROLE.plan_lines(plan, d)   # preflight prints it
    single = data(models=MODELS, llama_server_instances={"x": {"model": "a", "port": 8081}}, llama_server_tuned=tuned)
    assert instances(single)[1] == [] and "x has no also" in tuned_lines(single)[0]


@pytest.mark.parametrize("entry, path", [
    ({"models": {"b": {"flags": {"parallel": 0}}}}, "llama_server_tuned.x.models.b.flags.parallel"),
    ({"models": {"b": {"flags": {"ctx": "auto"}}}}, "llama_server_tuned.x.models.b.flags.ctx"),
    ({"models": {"b": {"flags": {"rope": 3}}}}, "llama_server_tuned.x.models.b.flags.rope"),
    ({"models": {"b": {"flags": {}, "tok_s": "fast"}}}, "llama_server_tuned.x.models.b.tok_s"),
    ({"models": {"b": "parallel=4"}}, "llama_server_tuned.x.models.b"),
    ({"models": ["b"]}, "llama_server_tuned.x.models"),
])
def test_a_malformed_tuned_model_is_refused_by_its_key_path(entry, path):
    """Refused at preflight as every configuration value (preflight adds the file it came from:
    host_vars/<host>.yml, read as the host's data)."""
    plan, _ = host("a100")
    refused = check_config(plan, {}, router({"x": entry}))
    print("\n".join(r.line("rig-07") for r in refused))
    assert [r.what for r in refused] == [path]


# ---------------------------------------------------------------- the preset's text, read back

TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from("[]=;#*\n\t "), max_size=30)


@settings(max_examples=60, deadline=1000)
@given(st.lists(TEXT | st.sampled_from(["[a]", "[*]", "model = /a.gguf", "ctx-size = 4096", "version = 1", "; c"]),
                max_size=12))
def test_a_preset_reads_as_sections_of_printable_values_or_is_unreadable(lines):
    try:
        got = tuning.preset_sections(lines, "x.models.ini")
    except Unreadable as e:
        assert e.where.startswith("x.models.ini"), e
        return
    for section, values in got.items():
        assert section in ("", "*") or fields.ID.fullmatch(section)
        assert all(k.isprintable() and v.isprintable() and v == v.strip(" \t") and v for k, v in values.items())


def test_what_the_role_writes_reads_back_and_a_preset_too_long_is_unreadable():
    found, _ = instances(router(per_model={"b": {"ctx": 16384}}))
    text = preset_text("x", found["x"], PATHS, {"a": REV, "b": REV})
    assert tuning.preset_sections(text.splitlines(), "p") == {
        "": {"version": "1"}, "*": {"ctx-size": "8192"}, "a": {"model": PATHS["a"], "load-on-startup": "true"},
        "b": {"model": PATHS["b"], "ctx-size": "16384"}}
    assert tuning.Preset().process(["[a]", "[a]"]) == {"error": "its preset: line 2: section [a] given twice"}
    with pytest.raises(Unreadable, match="lines"):
        tuning.preset_sections(["; x"] * (tuning.PRESET_LINES + 1), "p")


def test_a_pinned_model_is_swept_in_its_own_server_which_its_job_stops():
    """A pinned model (per_model: {M: {pinned: true}}) serves from rigup-llama@x.M beside the router:
    tune.py sweeps that server's own command line and stops that unit alone; its flags go under
    the router's models as any other's, and its server takes them (its per_model entry)."""
    d = data(rigup_state_dir="/var/lib/rigup")
    unit = contract.PINNED_UNIT.format("x", "b")
    assert "rigup-llama@x.b.service.d/rigup.conf" in tuning.ExecStart().command(unit)
    _, command, _, _ = tuning.job(tuning.model_job("x", "b"), d, unit)
    assert "systemctl stop rigup-llama@x.b.service" in command and "rigup-llama@x.service" not in command
    found, problems = instances(data(models={**MODELS, "c": MODELS["a"]}, llama_server_tuned={
        "x": {"models": {"b": {"flags": {"parallel": 8, "ctx": 65536}}}}}, llama_server_instances={"x": {
            "model": "a", "port": 8081, "ctx": 8192, "parallel": 2, "also": ["b", "c"], "models_max": 1,
            "per_model": {"b": {"pinned": True}}}}))
    assert problems == [] and found["x"]["per_model"]["b"] == {"pinned": True, "parallel": 8, "ctx": 65536}
