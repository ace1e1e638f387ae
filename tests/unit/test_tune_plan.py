"""tune.py sweeps from the serving plan (issue 64): the host's installed server is read only to be
compared with the plan's (plays/tuning.py ``differences``, ``preset_differences``); an instance
whose unit is missing or differs is refused, naming the difference. The plan's argv is built by
roles/llama_server/command.py ``argv``, as the converge writes the drop-in."""

from hypothesis import given, settings, strategies as st

from plays import tuning
from rigup.serving import serving_plan
from roles.llama_server import LLAMA
from roles.llama_server.command import argv, preset_text
from roles.llama_server.facts import REMEDIES
from tests.unit.hosts import REV, data, host

GEMMA = {"repo": "rigup-lab/gemma-3-270m-GGUF", "revision": REV, "size_gib": 0.25}
DIR = "/srv/models/gemma"
FILE = f"{DIR}/gemma-3-270m-Q8_0.gguf"


def planned(**inst) -> list[str]:
    """gemma's argv as the converge writes it from the serving plan of an H100 host."""
    plan, _ = host("h100")
    d = data(models={"gemma": GEMMA}, llama_server_instances={"gemma": {"model": "gemma", "port": 8081, **inst}})
    (server,) = serving_plan([LLAMA], d, plan)["llama-server"]["gemma"].servers
    return argv("gemma", server["inst"], "/opt/rigup/llama.cpp/current/bin/llama-server", FILE)


def test_the_installed_server_as_the_plan_makes_it_is_no_difference():
    want = planned(ctx=8192, parallel=2)
    assert tuning.differences(want, list(want), DIR, REMEDIES) == []
    # a build's remedy (roles/llama_cpp's smoke) is the host's, not the plan's
    assert tuning.differences(want, [*want, "--no-repack"], DIR, REMEDIES) == []


def test_a_context_that_differs_is_named_with_both_values():
    want, have = planned(ctx=8192, parallel=2), planned(ctx=4096, parallel=2)
    assert tuning.differences(want, have, DIR, REMEDIES) == ["installed -c 4096, the plan's 8192"]
    # the long spelling, or --x=v, is the same setting
    spelled = [a.replace("-c", "--ctx-size=4096") if a == "-c" else a for a in want]
    spelled.remove("8192")
    assert tuning.differences(want, spelled, DIR) == ["installed -c 4096, the plan's 8192"]


def test_a_flag_that_differs_or_is_only_on_one_side_is_named():
    want = planned(ctx=8192, parallel=2)
    have = [a if a != "auto" else "on" for a in want]   # -fa auto -> on
    assert tuning.differences(want, have, DIR) == ["installed -fa on, the plan's auto"]
    assert tuning.differences(want, [*want, "--mlock"], DIR) == ["installed --mlock, the plan's without --mlock"]
    assert tuning.differences(want, [a for a in want if a != "--metrics"], DIR) == \
        ["installed without --metrics, the plan's --metrics"]
    # a remedy the plan has in its extra_args is the plan's: compared
    assert tuning.differences([*want, "--no-repack"], want, DIR, REMEDIES) == \
        ["installed without --no-repack, the plan's --no-repack"]


def test_a_missing_unit_a_model_elsewhere_and_other_cards_are_named():
    want = planned(ctx=8192, parallel=2)
    assert tuning.differences(want, None, DIR) == ["no drop-in on the host (the unit is missing)"]
    elsewhere = [a if a != FILE else "/tmp/other/gemma.gguf" for a in want]
    assert tuning.differences(want, elsewhere, DIR) == [f"installed -m /tmp/other/gemma.gguf, the plan's a file of {DIR}"]
    assert tuning.differences(want, want, DIR, planned_env={"CUDA_VISIBLE_DEVICES": "GPU-a"},
                              installed_env={"CUDA_VISIBLE_DEVICES": "GPU-b", "PATH": "/usr/bin"}) == \
        ["installed CUDA_VISIBLE_DEVICES=GPU-b, the plan's CUDA_VISIBLE_DEVICES=GPU-a"]
    assert tuning.differences(want, want, DIR, installed_env={"CUDA_VISIBLE_DEVICES": "GPU-b"}) == \
        ["installed CUDA_VISIBLE_DEVICES=GPU-b, the plan's without CUDA_VISIBLE_DEVICES"]


def test_a_routers_preset_is_compared_by_section_and_key():
    inst = {"model": "a", "also": ["b"], "models_max": 1, "ctx": 8192, "parallel": 2, "port": 8081,
            "per_model": {"b": {"ctx": 16384}}, "host": "0.0.0.0"}
    paths = {"a": "/srv/a/a.gguf", "b": "/srv/b/b.gguf"}
    dirs = {"a": "/srv/a", "b": "/srv/b"}

    def sections(**over):
        return tuning.preset_sections(preset_text("x", {**inst, **over}, paths, {"a": REV}).splitlines(), "p")

    want = sections()
    assert tuning.preset_differences(want, sections(), dirs) == []
    assert tuning.preset_differences(want, sections(per_model={"b": {"ctx": 4096}}), dirs) == \
        ["its preset's [b] ctx-size = 4096, the plan's 16384"]
    moved = {**want, "b": {**want["b"], "model": "/etc/b.gguf"}}
    assert tuning.preset_differences(want, moved, dirs) == ["its preset's [b] model /etc/b.gguf, the plan's a file of /srv/b"]
    up = {**want, "b": {**want["b"], "model": "/srv/b/../../etc/shadow"}}   # as -m: a normal path (round 7 T3)
    assert tuning.preset_differences(want, up, dirs) == \
        ["its preset's [b] model /srv/b/../../etc/shadow, the plan's a file of /srv/b"]
    assert tuning.preset_differences(want, {k: v for k, v in want.items() if k != "b"}, dirs) == \
        ["its preset lacks [b], the plan's has it"]


WORDS = st.one_of(st.sampled_from(["-c", "--ctx-size", "--parallel", "-fa", "--jinja", "--no-jinja", "-m", "4096",
                                   "-1", "--x=1", "-", "--", "=", ""]), st.text(max_size=12))


@settings(max_examples=300, deadline=1000)
@given(st.lists(WORDS, min_size=1, max_size=12), st.lists(WORDS, min_size=1, max_size=12))
def test_any_installed_command_line_gives_lines_never_raises(want, have):
    """The installed command line is the host's text: any words read, or are named, and nothing raises; a
    command line is never different from itself."""
    assert tuning.differences(want, list(want), "/srv") == tuning.differences(want, list(want), "/srv")
    assert [d for d in tuning.differences(want, list(want)) if not d.startswith("installed -m")] == []
    found = tuning.differences(want, have, "/srv", REMEDIES, {"A": "1"}, {"CUDA_VISIBLE_DEVICES": "x"})
    assert all(isinstance(d, str) and d.isprintable() and len(d) < 2000 for d in found)


def test_round7_an_installed_server_the_plan_does_not_make_is_named():
    """Round 7 of issue 61 (T3-T6): a root-written drop-in the comparison passed, whose server the sweep then ran."""
    want = planned(ctx=8192, parallel=2)
    # T3: a -m that starts with the model's directory and leaves it (model_argv refuses '..' for a router's)
    for path in (f"{DIR}/../../../home/eve/evil.gguf", f"{DIR}/./x.gguf", f"{DIR}//x.gguf", f"{DIR}/"):
        assert tuning.differences(want, [a if a != FILE else path for a in want], DIR, REMEDIES) == \
            [f"installed -m {path}, the plan's a file of {DIR}"]
    # T4: a variable the plan does not set (the sweep's servers run with it); cuda.env's own (HOST_ENV) are the host's
    assert tuning.HOST_ENV == {"PATH", "LD_LIBRARY_PATH"}
    assert tuning.differences(want, want, DIR, REMEDIES, {"A": "1"},
                              {"A": "1", "LD_PRELOAD": "/home/eve/x.so", "LLAMA_ARG_HF_REPO": "eve/x", "PATH": "/usr/bin"}) == \
        ["installed LD_PRELOAD=/home/eve/x.so, the plan's without LD_PRELOAD",
         "installed LLAMA_ARG_HF_REPO=eve/x, the plan's without LLAMA_ARG_HF_REPO"]
    # T5: a remedy is the host's given once, as its smoke gives it (no value)
    assert tuning.differences(want, [*want, "--no-repack", "/etc/shadow"], DIR, REMEDIES) == \
        ["installed --no-repack /etc/shadow, the plan's without --no-repack"]
    assert tuning.differences(want, [*want, "--no-repack", "--no-repack"], DIR, REMEDIES) == \
        ["installed --no-repack; --no-repack, the plan's without --no-repack"]
    assert tuning.differences(want, [*want, "--no-repack=x"], DIR, REMEDIES) == \
        ["installed --no-repack x, the plan's without --no-repack"]
    # T6: a word before the first flag (llama-server reads it)
    assert tuning.differences(want, [want[0], "/home/eve/x.gguf", *want[1:]], DIR, REMEDIES) == \
        ["installed /home/eve/x.gguf before its flags, the plan's no word before its flags"]
    assert tuning.settings(["/bin/x", "a", "b", "-c", "1"]) == {"": [("a", "b")], "-c": [("1",)]}


NAMES = st.one_of(st.sampled_from(["PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "A"]),
                  st.text(max_size=12))


@settings(max_examples=300, deadline=1000)
@given(st.lists(WORDS, min_size=1, max_size=12), st.lists(WORDS, min_size=1, max_size=12),
       st.dictionaries(NAMES, st.text(max_size=12), max_size=4), st.dictionaries(NAMES, st.text(max_size=12), max_size=4),
       st.sampled_from(["/srv", "/srv/", "/srv/m"]))
def test_any_difference_is_named_and_nothing_raises(want, have, env, got, model_dir):
    """differences never raises on the host's words; where they are not the plan's (another word, another variable
    but cuda.env's, a -m not a normal path below its directory), at least one line says so; the same words and
    variables with the -m below its directory, none."""
    found = tuning.differences(want, have, model_dir, REMEDIES, env, got)
    assert all(isinstance(d, str) and d.isprintable() and len(d) < 2000 for d in found)
    strip = lambda argv: [a for a in tuning._without(argv, {"-m": 1, "--model": 1}) if a != "--no-repack"]
    same = strip(want)[:1] == strip(have)[:1] and tuning.settings(strip(want)) == tuning.settings(strip(have)) and \
        all(env.get(n) == got.get(n) for n in set(env) | (set(got) - tuning.HOST_ENV))
    if not same:
        assert found, (want, have, env, got)
    ok = [*tuning._without(want, {"-m": 1, "--model": 1}), "-m", model_dir.rstrip("/") + "/a.gguf"]
    assert tuning.differences(ok, list(ok), model_dir, REMEDIES, env, {"PATH": "/x", **env}) == []


def test_a_drop_in_that_sets_cuda_envs_variables_does_not_read():
    """cuda.env's variables (HOST_ENV) are left to the host by differences: the drop-in setting one over them
    (LD_LIBRARY_PATH=/home/eve/lib) is not a line rigup writes; cuda.env's own read."""
    from rigup.boundary.core import Unreadable

    host = tuning.ServingEnv().process(["C PATH=/usr/bin", "C LD_LIBRARY_PATH=/usr/lib", "E CUDA_VISIBLE_DEVICES=0", "G 1"])
    assert host == {"env": {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/lib", "CUDA_VISIBLE_DEVICES": "0"}, "gpus": 1,
                    "build": None}
    got = tuning.ServingEnv().process(["C PATH=/usr/bin", 'E "LD_LIBRARY_PATH=/home/eve/lib" A=1', "G 1"])
    assert isinstance(got["error"], Unreadable) and "Environment=" in got["error"].where
    assert got["error"].why.startswith("sets LD_LIBRARY_PATH, which rigup writes in /etc/rigup/cuda.env alone")
    # cuda.env's other variables are named by differences (T4, T27)
    other = tuning.ServingEnv().process(["C LD_PRELOAD=/home/eve/x.so", "G 1"])
    assert tuning.differences(["/b", "-c", "1"], ["/b", "-c", "1"], None, REMEDIES, {}, other["env"]) == \
        ["installed LD_PRELOAD=/home/eve/x.so, the plan's without LD_PRELOAD"]


def test_cuda_env_and_drop_in_lines_are_read_as_systemd_reads_them(tmp_path):
    """systemd takes an EnvironmentFile's blanks before a name and a unit's around its '=': ServingEnv's
    command prints those lines too (' LD_PRELOAD=/y.so' in cuda.env, 'Environment = ...' in the drop-in were
    not read, so not compared; the latter is named too, as no line rigup writes); a cuda.env line that is no
    NAME=VALUE does not read."""
    import subprocess

    (tmp_path / "cuda.env").write_text("# CUDA\nPATH=/usr/bin\n\n  LD_PRELOAD=/y.so\n")
    (tmp_path / "d.conf").write_text('[Service]\nEnvironment="A=1"\n  Environment = B=/x.so\n')
    fact = tuning.ServingEnv()
    command = fact.command("x").replace("/etc/rigup/cuda.env", str(tmp_path / "cuda.env")).replace(
        tuning.DROPIN.format("x"), str(tmp_path / "d.conf")).replace("systemctl show", "false")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()
    got = fact.process(out)
    assert {**got, "error": None} == {"env": {"PATH": "/usr/bin", "LD_PRELOAD": "/y.so", "A": "1", "B": "/x.so"},
                                      "gpus": 0, "build": None, "error": None}
    assert got["error"].why == "its drop-in has   Environment = B=/x.so: not the unit rigup writes"
    bad = fact.process(["C foo bar", "G 1"])["error"]
    assert bad.where == "/etc/rigup/cuda.env" and bad.why.startswith("not a line rigup writes")


def test_the_installed_model_is_one_file_given_once():
    """-m given twice, or with a word after it, is not the plan's one file, even where each is below its directory."""
    want = planned(ctx=8192, parallel=2)
    at = want.index(FILE)
    twice = [*want[:at + 1], "-m", f"{DIR}/other.gguf", *want[at + 1:]]
    assert tuning.differences(want, twice, DIR, REMEDIES) == \
        [f"installed -m {FILE}; -m {DIR}/other.gguf, the plan's a file of {DIR}"]
    extra = [*want[:at + 1], "/home/eve/x.gguf", *want[at + 1:]]
    assert tuning.differences(want, extra, DIR, REMEDIES) == \
        [f"installed -m {FILE} /home/eve/x.gguf, the plan's a file of {DIR}"]
    assert tuning.differences(want, [a for i, a in enumerate(want) if i not in (at - 1, at)], DIR, REMEDIES) == \
        [f"installed without -m, the plan's a file of {DIR}"]
