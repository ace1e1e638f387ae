"""What tune.py reads on a host before it sweeps (plays/tuning.py's facts, ``spec`` and
``model_argv``; plays/shipped/tune.py ``_count``), as a hostile or hand-edited host gives it (round 2 of
issue 61: C1, C3, J3, J5, J6). Each case is the round's reproduction; a record that does not read
refuses that host alone (the play's load-time code raises nothing: pyinfra ends the run for every
host on an exception there, tests at the end)."""

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from plays import tuning
from plays.shipped import tune
from rigup.boundary.core import Unreadable
from rigup.boundary.formats import systemd_env
from rigup.contract.llama_server import written_env
from roles.cuda_toolkit import unit_env
from tests.unit.hosts import REV, data, host

ROOT = Path(__file__).resolve().parents[2]
D = {"llama_server_tune_concurrency": None, "llama_server_tune_port": 18080, "llama_server_tune_levels": None,
     "llama_server_tune_max_parallel": 16, "llama_server_tune_budget_s": 600, "llama_server_tune_max_tokens": 64,
     "rigup_state_dir": "/var/lib/rigup"}


# ---------------------------------------------------------------- C1: nvidia-smi's GPU count
@pytest.mark.parametrize("line, gpus", [("G 2", 2), ("G \u00b2", 0), ("G \u0663", 0), ("G -1", 0), ("G 02", 0),
                                        ("G 1_0", 0), ("G ", 0), ("G 99999999999999999999", 0)])
def test_the_gpu_count_is_ascii_digits_else_none(line, gpus):
    """C1/C2: isdigit() then int(): 'G ²' raised a bare ValueError in tune.py's load-time code (the run
    ended for every host) and 'G ٣' was 3 GPUs."""
    got = tuning.ServingEnv().process([line])
    print(f"\n{line!r}: {got}")
    assert got["gpus"] == gpus and "error" not in got


@settings(max_examples=200, deadline=1000)
@given(st.lists(st.text(max_size=80).map(lambda t: t.replace("\n", "")), max_size=6))
def test_any_serving_env_lines_read_or_say_why_never_raise(lines):
    got = tuning.ServingEnv().process(lines)
    assert isinstance(got["gpus"], int) and 0 <= got["gpus"] <= 1024
    assert got.get("error") is None or isinstance(got["error"], Unreadable)


def test_a_drop_in_line_with_an_unclosed_quote_is_unreadable_not_raised():
    """A hand-edited drop-in with an unclosed quote: shlex raised ValueError out of both facts."""
    got = tuning.ExecStart().process(['/opt/llama-server -m "/srv/m.gguf'])
    env = tuning.ServingEnv().process(['E "CUDA_VISIBLE_DEVICES=0', "G 1"])
    print(f"\n{got}\n{env}")
    assert isinstance(got, Unreadable) and "ExecStart" in got.where and "closing" in got.why
    assert isinstance(env["error"], Unreadable) and "Environment=" in env["error"].where


# ---------------------------------------------------------------- C3: -c and --parallel of the drop-in
# The sweep's context and slots are the serving plan's (issue 64), never read back from the drop-in:
# a drop-in whose -c or --parallel is no count is not the plan's (the play's cases below).


def test_a_preset_value_with_blanks_stays_one_word_of_the_models_argv():
    """J3: a router's preset 'ctx-size = 4096 --host 0.0.0.0' became one argv word '-c' '4096 --host
    0.0.0.0' (spec's int() raised in tune.py's load-time code; the preset is now compared with the
    plan's first, plays/tuning.py preset_differences)."""
    secs = tuning.preset_sections(["[a]", "model = /srv/a.gguf", "ctx-size = 4096 --host 0.0.0.0"], "p")
    alone, why = tuning.model_argv(["/opt/llama-server", "--models-preset", "/p.ini"], secs, "a")
    assert why == "" and alone[-2:] == ["-c", "4096 --host 0.0.0.0"]
    assert tuning.preset_differences({"": {}, "a": {"model": "/srv/a.gguf", "ctx-size": "4096"}}, secs,
                                     {"a": "/srv"}) == ["its preset's [a] ctx-size = 4096 --host 0.0.0.0, the plan's 4096"]


def test_the_plans_counts_give_the_slots_context():
    argv = tuning.ExecStart().process(["/opt/llama-server -m /srv/m.gguf -c 32768 --parallel 4"])
    assert tuning.spec("x", argv, D, True, None, {"gpus": 2}, ctx=32768, parallel=4)["slot_tokens"] == 8192


# ---------------------------------------------------------------- J5: a preset model's path
@pytest.mark.parametrize("path", ["/srv/../../etc/shadow", "/srv/./m.gguf", "/srv//m.gguf", "/srv/m.gguf/..",
                                  "/srv/m\x1b[2J.gguf", "srv/m.gguf", "/"])
def test_a_preset_models_path_with_a_dot_part_is_not_swept(path):
    """J5: a router's preset model '/srv/../../etc/shadow' became the sweep's -m."""
    secs = tuning.preset_sections(["[a]", f"model = {path}"], "p") if "\x1b" not in path else {"a": {"model": path}}
    got, why = tuning.model_argv(["/opt/llama-server", "--models-preset", "/p.ini"], secs, "a")
    print(f"\n{path!r}: {why}")
    assert got is None and "not an absolute path" in why and "\x1b" not in why


def test_a_preset_models_normal_path_is_swept():
    secs = tuning.preset_sections(["[a]", "model = /srv/models/a/UD-Q4/a-00001-of-00002.gguf"], "p")
    got, why = tuning.model_argv(["/opt/llama-server", "--models-preset", "/p.ini"], secs, "a")
    assert why == "" and got[:3] == ["/opt/llama-server", "-m", "/srv/models/a/UD-Q4/a-00001-of-00002.gguf"]


# ---------------------------------------------------------------- J6: a flag's count in the sweep (host program)
@pytest.mark.parametrize("text, count", [("--5", None), ("-5", -5), ("+5", 5), ("5.0", None), ("1_0", None),
                                         (" 7 ", 7), ("-", None), ("99999999999", None)])
def test_a_flags_count_takes_one_sign_and_ascii_digits(text, count):
    """J6: _count stripped every '-' before isdigit(), then int('--5') raised in the sweep."""
    assert tune._count(text) == count


@given(st.text(max_size=30))
def test_any_text_is_a_count_or_none(text):
    got = tune._count(text)
    assert got is None or (type(got) is int and -(2 ** 31) <= got < 2 ** 31)


# ---------------------------------------------------------------- the play: that host refused, the run goes on
def DATA(**inst) -> dict:
    return data(models={"a": {"repo": "org/a-GGUF", "revision": REV, "size_gib": 3.0},
                        "b": {"repo": "org/b-GGUF", "revision": REV, "size_gib": 1.0}},
                llama_server_instances={"x": {"model": "a", "port": 8081, "ngl": 0, **inst}})


def PLAN(d: dict) -> dict:
    from rigup.serving import serving_plan
    from roles.llama_server import LLAMA

    plan, _ = host("h100")
    return {**plan, "serving": serving_plan([LLAMA], d, plan)}


def test_round7b_a_hand_edited_cuda_env_is_named_in_the_play(monkeypatch):
    """cuda.env's PATH and LD_LIBRARY_PATH are the sweep's servers' too: a value other than the one
    roles/cuda_toolkit writes for the host (/home/eve/bin first), or the file missing, refuses the sweep."""
    assert [c.split("=")[0] for c in CUDA_ENV] == ["C PATH", "C LD_LIBRARY_PATH"]
    edited = [c.replace("C PATH=", "C PATH=/home/eve/bin:") for c in WRITTEN]
    for env in (edited, [c for c in WRITTEN if not c.startswith("C ")]):
        did = play(monkeypatch, {"ExecStart": [installed()], "ServingEnv": [*env, "G 1"]})
        assert not did["put"] and any("PATH" in s and "converge deploy.py first" in s for s in did["said"]), did["said"]


def installed(**inst) -> str:
    """x's ExecStart as a converge writes it from the plan (roles/llama_server/command.py argv), its model's file
    under the model's directory."""
    from rigup.models import models
    from roles.llama_server.command import argv

    d = DATA(**inst)
    x = PLAN(d)["serving"]["llama-server"]["x"].servers[0]["inst"]
    return " ".join(argv("x", x, f"{d['llama_cpp_dir']}/current/bin/llama-server",
                         models(d)[0]["a"]["dest"] + "/a-Q4.gguf"))


# the Environment= lines every drop-in has (contract.written_env: no CORS origin), as ServingEnv reads them
# and /etc/rigup/cuda.env's lines as roles/cuda_toolkit writes them for this host (compared: round 7b U4)
CUDA_ENV = ["C " + line for line in (unit_env(PLAN(DATA()), DATA()) or "").splitlines() if line and line[0] != "#"]
WRITTEN = [*CUDA_ENV, *("E " + systemd_env(k, v) for k, v in written_env().items())]


def play(monkeypatch, facts: dict[str, list[str]], **inst):
    """tune.py run as pyinfra runs it for one host, its facts the host's ``facts`` (a fact's name ->
    its output lines); (what it did: failed hosts, refusals, files put, lines said)."""
    import pyinfra
    from pyinfra.operations import files, python, server

    from rigup import config, summary
    import rigup.files
    import rigup.text

    from roles import preflight

    did = {"failed": set(), "refused": {}, "put": [], "said": [], "calls": []}
    d = DATA(**inst)
    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    fake = Host(name="h1")
    fake.state = SimpleNamespace(fail_hosts=lambda hosts: did["failed"].update(h.name for h in hosts), failed_hosts=set())
    def get_fact(cls, **kw):   # as pyinfra: one fact object, its command, then its process of the output
        fact = cls()
        fact.command(**kw)
        return [] if cls is tuning.Unsafe else fact.process(facts[cls.__name__]) if cls.__name__ in facts \
            else cls.default()
    fake.get_fact = get_fact
    fake.run_shell_command = lambda **kw: (False, None)
    monkeypatch.setattr(pyinfra, "host", fake)
    monkeypatch.setattr(config, "configure", lambda h, roles=(): d)
    monkeypatch.setattr(preflight, "run", lambda roles, data: PLAN(data))   # the plan deploy.py's preflight makes
    monkeypatch.setattr(summary, "refused", lambda h, why: did["refused"].update({h.name: why}))
    monkeypatch.setattr(summary, "fail", lambda h, why: did["refused"].update({h.name: why}) or did["failed"].add(h.name))
    monkeypatch.setattr(rigup.text, "say", lambda text, **kw: did["said"].append(text))
    monkeypatch.setattr(files, "directory", lambda **kw: None)
    monkeypatch.setattr(files, "file", lambda **kw: did.setdefault("absent", []).append(kw["path"]))
    monkeypatch.setattr(files, "put", lambda **kw: did["put"].append(kw["dest"]) or did.setdefault("specs", {}).update(
        {kw["dest"]: json.loads(kw["src"].getvalue())} if kw["dest"].endswith(".spec.json") else {}))
    # the tuner and the modules beside it (rigup.files.program: managed files, read on the host)
    monkeypatch.setattr(rigup.files, "program", lambda path, dest, paths, **kw: did["put"].extend(paths))
    monkeypatch.setattr(server, "shell", lambda **kw: None)
    monkeypatch.setattr(python, "call", lambda **kw: did["calls"].append(kw["name"]))
    runpy.run_path(str(ROOT / "tune.py"))
    return did


@pytest.mark.parametrize("facts, why", [
    ({"ExecStart": ['/opt/llama-server -m "/srv/m.gguf'], "ServingEnv": ["G 1"]}, "ExecStart"),
    ({"ExecStart": ["/opt/llama-server -m /srv/m.gguf"], "ServingEnv": ['E "A=1', "G 1"]}, "Environment="),
])
def test_a_drop_in_that_does_not_read_refuses_that_host_and_raises_nothing(monkeypatch, facts, why):
    """C3 at the play: ZeroDivisionError and ValueError in tune.py's load-time code ended the run for
    every host (pyinfra's UnexpectedExternalError); now that host alone is refused, naming the
    drop-in, and none of its sweeps is set up."""
    did = play(monkeypatch, facts)
    print(f"\n{did}")
    assert did["failed"] == {"h1"} and why in " ".join(did["refused"]["h1"]) + " ".join(did["said"])
    assert tuning.DROPIN.format("x") in " ".join(did["said"])
    assert not [p for p in did["put"] if p.endswith(".spec.json")]


@pytest.mark.parametrize("swap, why", [
    (("--parallel 1", "--parallel 0"), "installed --parallel 0, the plan's 1"),   # C3: divided by zero
    (("-c 8192", "-c \u00b2"), "installed -c \u00b2, the plan's 8192"),               # C4: int() raised
    (("-c 8192", "-c 1_0_0_0_0"), "installed -c 1_0_0_0_0, the plan's 8192"),     # C5: was 10000
])
def test_a_drop_ins_count_that_is_not_the_plans_is_refused_not_read(monkeypatch, swap, why):
    """C3-C5: the drop-in's -c and --parallel are no longer read as counts; one that is not the
    plan's refuses that instance, naming both, and nothing is set up on the host."""
    line = installed()
    assert swap[0] in line
    did = play(monkeypatch, {"ExecStart": [line.replace(swap[0], swap[1])], "ServingEnv": ["G 1"]})
    print(f"\n{did['said']}")
    assert any(why in said and "converge deploy.py first" in said for said in did["said"])
    assert not did["put"] and did["calls"] == ["tune.py: the instances not the plan's (converge deploy.py first)"]


def test_a_drop_in_that_reads_is_swept(monkeypatch):
    did = play(monkeypatch, {"ExecStart": [installed()], "ServingEnv": [*WRITTEN, "G \u00b2"]})
    assert did["failed"] == set() and did["refused"] == {} and not [s for s in did["said"] if "refused" in s]
    assert [p for p in did["put"] if p.endswith(".spec.json")] == ["/var/lib/rigup/tuner/x.spec.json"]


def test_a_router_is_swept_a_model_at_a_time_where_its_unit_and_preset_are_the_plans(monkeypatch):
    """A router's drop-in and preset as the converge writes them from the plan: each model swept alone
    (x:a, x:b), with the plan's context; its preset with another ctx of b's: refused, naming it."""
    from rigup.models import models
    from roles.llama_server.command import argv, preset_text

    router = {"also": ["b"], "models_max": 1, "ctx": 8192, "parallel": 2, "per_model": {"b": {"ctx": 4096}}}
    d = DATA(**router)
    x = PLAN(d)["serving"]["llama-server"]["x"].servers[0]["inst"]
    line = " ".join(argv("x", x, f"{d['llama_cpp_dir']}/current/bin/llama-server", "/unused"))
    paths = {k: models(d)[0][k]["dest"] + f"/{k}.gguf" for k in ("a", "b")}
    preset = preset_text("x", x, paths, {"a": REV, "b": REV}).splitlines()
    env = [*WRITTEN, "E LLAMA_CACHE=/etc/rigup/llama-server/x.no-cache", "G 1"]   # a router's children keep no model cache
    did = play(monkeypatch, {"ExecStart": [line], "ServingEnv": env, "Preset": preset}, **router)
    print(f"\n{did['said']}")
    assert [p for p in did["put"] if p.endswith(".spec.json")] == \
        ["/var/lib/rigup/tuner/x:a.spec.json", "/var/lib/rigup/tuner/x:b.spec.json"]
    assert did["failed"] == set() and not [s for s in did["said"] if "refused" in s]
    # each model's context and slots: the plan's (b's own ctx of its per_model, a's the router's)
    assert [did["specs"][f"/var/lib/rigup/tuner/x:{m}.spec.json"]["slot_tokens"] for m in "ab"] == [4096, 2048]
    other = [ln.replace("ctx-size = 4096", "ctx-size = 2048") for ln in preset]
    did = play(monkeypatch, {"ExecStart": [line], "ServingEnv": env, "Preset": other}, **router)
    assert any("tune x: its preset's [b] ctx-size = 2048, the plan's 4096: converge deploy.py first" in said
               for said in did["said"]), did["said"]
    assert not did["put"]
