"""Issue 61, round 8 U1, U2, U4: what tune.py's ServingEnv reads of the installed unit, on this machine's shell
over scratch files (a ``systemctl`` first on PATH printing what ``systemctl show`` prints).

U1: systemd ends a unit file's line at CR or NUL, and an EnvironmentFile's comment at CR; sed reads one line, so
``# note<CR>Environment=LD_PRELOAD=...`` reached the server unseen. A drop-in or cuda.env holding either is named.
U2: the drop-in's lines were read up to 64 KiB: a line after that was never named. One over FILE_MAX is named.
U4: the unit file itself was not read. Its sha256 is compared with the one its drop-in names (``# unit SHA``,
as roles/llama_server writes it), systemd's FragmentPath with the template's path, and the variables systemd
runs it with (``systemctl show -p Environment``) with the template's and the drop-in's.
"""

import hashlib
import re
import subprocess

from hypothesis import given, settings, strategies as st

from plays import tuning
from rigup.boundary.core import Unreadable
from rigup.templates import render
from tests.unit.test_tune_round7b import OWN, WANT, cuda_text, dropin

UNIT_TEXT = render("llama_server-unit.service.j2", user="rigup", guard_file="/etc/rigup/gpu-guard.tripped",
                   start_timeout=600, fabric=False)
SHA = hashlib.sha256(UNIT_TEXT.encode()).hexdigest()[:12]
HOST_ENV = tuning.env_file(cuda_text(cuda_source="nvidia", cuda_version="12.8"))
CUDA = "".join(f"{k}={v}\n" for k, v in HOST_ENV.items())
# what systemd runs instance g with: the template's variables (%i resolved), then the drop-in's (dropin()'s env)
SYSTEMD_ENV = ("HOME=/var/lib/rigup/llama-server/g XDG_CACHE_HOME=/var/cache/rigup/llama-server/g "
               "LLAMA_CACHE=/var/cache/rigup/llama-server/g HF_HOME=/var/cache/rigup/llama-server/g/hf "
               "CUDA_VISIBLE_DEVICES=0 LLAMA_ARG_X=1")


def shown(**kw) -> str:
    """``systemctl show``'s five properties of rigup's own unit, ``kw`` over them."""
    props = {"DropInPaths": OWN, "EnvironmentFiles": "/etc/rigup/cuda.env (ignore_errors=yes)", "UnsetEnvironment": "",
             "FragmentPath": tuning.UNIT_FILE, "Environment": SYSTEMD_ENV, **kw}
    return "".join(f"{k}={v}\n" for k, v in props.items())


def served(tmp_path, conf: str | None = None, env: str = CUDA, unit: str = UNIT_TEXT, show: str | None = None) -> dict:
    """ServingEnv's command on this machine's shell over scratch files, and what it reads of them."""
    (tmp_path / "rigup.conf").write_bytes((dropin(unit_sha=SHA) if conf is None else conf).encode())
    (tmp_path / "cuda.env").write_bytes(env.encode())
    (tmp_path / "unit").write_bytes(unit.encode())
    (tmp_path / "show").write_text(shown() if show is None else show)
    (tmp_path / "systemctl").write_text('#!/bin/sh\n[ "$1" = show ] || exit 1\ncat "$(dirname "$0")/show"\n')
    (tmp_path / "systemctl").chmod(0o755)
    fact = tuning.ServingEnv()
    command = fact.command("g")
    for real, scratch in ((OWN, "rigup.conf"), ("/etc/rigup/cuda.env", "cuda.env"), (tuning.UNIT_FILE, "unit")):
        assert real in command
        command = command.replace(real, str(tmp_path / scratch))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout.splitlines()
    return fact.process(out)


def named(got: dict) -> str:
    assert isinstance(got.get("error"), Unreadable) and got["error"].where == "rigup-llama@g.service", got
    return got["error"].why


def test_the_unit_rigup_writes_is_no_difference(tmp_path):
    got = served(tmp_path)
    assert "error" not in got, got
    assert got["env"] == {**HOST_ENV, "CUDA_VISIBLE_DEVICES": "0", "LLAMA_ARG_X": "1"}
    assert tuning.differences(WANT, WANT, "/srv/models/g", frozenset(), {"CUDA_VISIBLE_DEVICES": "0", "LLAMA_ARG_X": "1"},
                              got["env"], HOST_ENV) == []


def test_the_template_unit_is_rigup_s_and_its_variables_are_the_rendered_ones():
    from roles import llama_server
    assert tuning.UNIT_FILE == llama_server.UNIT
    for fabric in (False, True):
        text = render("llama_server-unit.service.j2", user="u", guard_file="/g", start_timeout=900, fabric=fabric)
        lines = re.findall(r"^Environment=(.*)$", text, re.M)
        assert dict(w.split("=", 1) for line in lines for w in line.split()) == tuning.UNIT_ENV
    assert set(tuning.UNIT_ENV) == {"HOME", "XDG_CACHE_HOME", "LLAMA_CACHE", "HF_HOME"}


# ---------------------------------------------------------------- U1: CR and NUL
def test_u1_a_cr_or_nul_in_the_drop_in_or_cuda_env_is_named(tmp_path):
    base = dropin(unit_sha=SHA)
    for conf, env, where in (
            (base.replace("[Service]\n", "[Service]\n# note\rEnvironment=LD_PRELOAD=/home/eve/x.so\n"), CUDA, "its drop-in"),
            (base.replace("[Service]\n", "[Service]\n# note\0Environment=LD_PRELOAD=/home/eve/x.so\n"), CUDA, "its drop-in"),
            (base, CUDA + "# cuda\rLD_PRELOAD=/home/eve/x.so\n", "/etc/rigup/cuda.env"),
            (base, CUDA + "# cuda\0\0LD_PRELOAD=/home/eve/x.so\n", "/etc/rigup/cuda.env")):
        why = named(served(tmp_path, conf, env))
        assert f"{where} holds " in why and "CR or NUL byte(s), where systemd ends a line" in why, why
    assert "holds 2 CR or NUL" in why


def test_u1_systemd_s_reading_of_the_drop_in_is_compared_with_sed_s(tmp_path):
    """What systemd set from a line sed read otherwise reaches its Environment, which is compared."""
    why = named(served(tmp_path, show=shown(Environment=SYSTEMD_ENV + " LD_PRELOAD=/home/eve/x.so")))
    assert why == "systemd runs it with LD_PRELOAD=/home/eve/x.so, rigup writes no LD_PRELOAD: not the unit rigup writes"


# ---------------------------------------------------------------- U2: the drop-in's bound
def test_u2_a_drop_in_over_the_bound_is_named_and_one_within_is_read_whole(tmp_path):
    late = "BindReadOnlyPaths=/home/eve/evil.gguf:/srv/models/g/x.gguf\n"
    why = named(served(tmp_path, dropin(unit_sha=SHA) + "#" + "x" * 70000 + "\n" + late))
    assert f"its drop-in is {len(dropin(unit_sha=SHA)) + 70002 + len(late)} bytes (at most 65536)" in why
    pad = tuning.FILE_MAX - len(dropin(unit_sha=SHA)) - len(late) - 2
    why = named(served(tmp_path, dropin(unit_sha=SHA) + "#" + "x" * pad + "\n" + late))
    assert "at most" not in why and "its drop-in has BindReadOnlyPaths=/home/eve/evil.gguf" in why


# ---------------------------------------------------------------- U4: the unit file
def test_u4_a_hand_edited_unit_file_is_named(tmp_path):
    edited = UNIT_TEXT.replace("[Service]\n", "[Service]\nEnvironment=LD_PRELOAD=/home/eve/x.so\n")
    why = named(served(tmp_path, unit=edited))
    assert why.startswith(f"its unit file {tuning.UNIT_FILE} (sha256 {hashlib.sha256(edited.encode()).hexdigest()[:12]}) "
                          f"is not the one its drop-in was written with ({SHA})")
    # a drop-in that names no unit (written by hand): its unit file is not known to be rigup's
    assert "(none named)" in named(served(tmp_path, dropin(unit_sha=SHA).replace(f"# unit {SHA}, ", "# ")))


def test_u4_another_unit_file_or_other_variables_systemd_runs_it_with_are_named(tmp_path):
    cases = {"FragmentPath=/etc/systemd/system/rigup-llama@g.service":
             "systemd reads the unit file /etc/systemd/system/rigup-llama@g.service",
             "FragmentPath=": "systemd reads the unit file none",
             "Environment=" + SYSTEMD_ENV.replace("/var/lib/rigup/llama-server/g", "/home/eve"):
             "systemd runs it with HOME=/home/eve, rigup writes HOME=/var/lib/rigup/llama-server/g",
             "Environment=" + SYSTEMD_ENV.replace(" LLAMA_ARG_X=1", ""): "systemd runs it with no LLAMA_ARG_X, rigup writes LLAMA_ARG_X=1",
             "Environment=" + SYSTEMD_ENV + ' "LD_PRELOAD=/home/eve/a b.so"':
             "systemd runs it with LD_PRELOAD=/home/eve/a b.so, rigup writes no LD_PRELOAD",
             "Environment=" + SYSTEMD_ENV + ' "X=\\n"': "systemd's Environment does not read"}
    for line, said in cases.items():
        key, _, value = line.partition("=")
        why = named(served(tmp_path, show=shown(**{key: value})))
        assert said in why, (line, why)
    # a router's child keeps no model cache: the drop-in's LLAMA_CACHE over the template's is rigup's own
    conf = dropin(unit_sha=SHA, env=['"CUDA_VISIBLE_DEVICES=0"', "LLAMA_ARG_X=1", "LLAMA_CACHE=/nonexistent"])
    env = SYSTEMD_ENV.replace("LLAMA_CACHE=/var/cache/rigup/llama-server/g", "LLAMA_CACHE=/nonexistent")
    assert "error" not in served(tmp_path, conf, show=shown(Environment=env))


# ---------------------------------------------------------------- the readers, over any text
NEED_QUOTES = set(" \t\n\r\"\\`$*?['()<>|&;!")


def maybe_quoted(word: str) -> str:
    """A word as systemd's shell_maybe_quote(word, 0) prints it (no control character: those it escapes)."""
    if not word or not NEED_QUOTES & set(word):
        return word
    return '"' + re.sub(r'(["\\`$])', r"\\\1", word) + '"'


WORD = st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1, max_size=30)


@settings(max_examples=300)
@given(st.lists(WORD, max_size=8))
def test_systemctl_s_words_read_back_as_printed(words):
    assert tuning._shown_words(" ".join(maybe_quoted(w) for w in words)) == words


@settings(max_examples=300)
@given(st.text(max_size=80))
def test_any_environment_text_is_read_or_named_never_raised(text):
    try:
        tuning._shown_words(text)
    except ValueError:
        pass
    out = tuning._environment(text, {}, "g")
    assert isinstance(out, list) and all(isinstance(x, str) for x in out)


LINE = st.text(st.characters(blacklist_categories=["Cs"]), max_size=60)
F_LINE = st.tuples(st.sampled_from(["cuda.env", "drop-in", "x"]), st.integers(0, 1 << 20), st.integers(0, 1 << 20)).map(
    lambda t: f"F {t[0]} {t[1]} {t[2]}")


@settings(max_examples=300)
@given(st.lists(st.one_of(st.tuples(st.sampled_from("RSECGBFUV"), LINE).map(" ".join), F_LINE,
                          st.sampled_from([f"U {SHA}{'0' * 52}", f"V {SHA}", "S Environment=" + SYSTEMD_ENV,
                                           "S FragmentPath=" + tuning.UNIT_FILE])), max_size=12))
def test_serving_env_never_raises_and_names_each_file_rigup_does_not_write(lines):
    """Any output of the fact reads; a file over FILE_MAX, or holding a CR or NUL, is named."""
    got = tuning.ServingEnv().process(lines)
    assert set(got) <= {"env", "gpus", "build", "error"}
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "F" and tuning._sizes(rest):
            assert all(n in got["error"].why for n in tuning._sizes(rest)), (line, got)
        if kind == "S" and rest.strip().partition("=")[0] == "Environment":
            own = {}   # the drop-in's variables as the fact read them (its E lines that split)
            for e in lines:
                if e.startswith("E "):
                    try:
                        own.update(tuning.systemd_env_split(e[2:]) if len(e) < 1000 else {})
                    except ValueError:
                        pass
            assert all(n in got["error"].why for n in tuning._environment(rest.strip()[12:], own, "NAME"))
        if kind == "F" and re.fullmatch(r"(cuda\.env|drop-in) [0-9]+ [0-9]+", rest):
            size, kept = map(int, rest.split()[1:])
            assert bool(tuning._sizes(rest)) == (size > tuning.FILE_MAX or kept != size)
