"""Issue 61, round 7b U2/U3, U4, U8: what reaches the server that tune.py sweeps from is compared whole.

U2/U3: a line of the drop-in rigup does not write (EnvironmentFile=, UnsetEnvironment=, User=, ...), another
drop-in systemd reads, an EnvironmentFile but cuda.env, an UnsetEnvironment: each named (ServingEnv's error).
U4: cuda.env's PATH and LD_LIBRARY_PATH compared with the text roles/cuda_toolkit writes for the host.
U8: a lone ``%`` (a specifier: ``%h``) or ``$`` in the installed ExecStart, which systemd expands and
systemd_quote never writes: the ExecStart fact does not read it.
"""

import subprocess

from hypothesis import given, settings, strategies as st

from plays import tuning
from rigup.boundary.core import Unreadable
from rigup.boundary.formats import systemd_quote
from rigup.contract.llama_server import DROPIN
from rigup.templates import render
from rigup.units import systemd_split
from roles import cuda_toolkit
from tests.unit.hosts import data, host

WANT = ["/opt/rigup/llama.cpp/current/bin/llama-server", "-m", "/srv/models/g/x.gguf", "-c", "8192"]
OWN = DROPIN.format("g")


def serving(lines: list[str]) -> dict:
    fact = tuning.ServingEnv()
    fact.command("g")
    return fact.process(lines)


# ---------------------------------------------------------------- U8: specifiers and variables in ExecStart
def test_u8_a_lone_specifier_or_variable_in_exec_start_does_not_read():
    fact = tuning.ExecStart()
    fact.command("g")
    for word in ("/srv/models/g/..%h/x.gguf", "/srv/models/g/%i.gguf", "/srv/models/g/$HOME.gguf", "%", "a$"):
        got = fact.process([" ".join([*WANT[:2], word, *WANT[3:]])])
        assert isinstance(got, Unreadable) and "not a command line rigup writes" in got.why, (word, got)
    # as systemd_quote writes them: %% and $$ read back as one
    assert fact.process(["/x -m /srv/models/g/..%%h/x.gguf --a $$HOME"]) == ["/x", "-m", "/srv/models/g/..%h/x.gguf",
                                                                             "--a", "$HOME"]


@given(st.text(max_size=40).filter(lambda t: "\x00" not in t))
def test_u8_systemd_split_reads_back_what_systemd_quote_writes_and_refuses_a_lone_specifier(word):
    try:
        line = systemd_quote(word)
    except ValueError:   # a control character: refused when written
        return
    assert systemd_split(line) == [word]
    if word.count("%") + word.count("$") == 1:   # the line as systemd_quote would not write it: a lone one
        raw = line.replace("%%", "%").replace("$$", "$")
        try:
            systemd_split(raw)
        except ValueError:
            return
        raise AssertionError(f"{raw!r} read")


# ---------------------------------------------------------------- U2/U3: the drop-in and what systemd parsed
def dropin(**kw) -> str:
    """The drop-in as roles/llama_server writes it, every optional part there."""
    values = {"name": "g", "unit_sha": "0" * 64, "build": "b1-abc", "model_revision": "r", "preset": "/etc/p.ini",
              "env": ['"CUDA_VISIBLE_DEVICES=0"', "LLAMA_ARG_X=1"], "model_path": "/srv/models/g/x.gguf",
              "rpc_wait": ["/usr/bin/rpc-wait", "h:1"], "argv": WANT,
              "balancer": {"ready": ["/usr/bin/drain", "ready"], "drain": ["/usr/bin/drain", "drain"]}, **kw}
    return render("llama_server-dropin.conf.j2", **values)


SHOWN = ["S DropInPaths=" + OWN, "S EnvironmentFiles=/etc/rigup/cuda.env (ignore_errors=yes)", "S UnsetEnvironment="]


def test_u2_the_drop_in_rigup_writes_is_no_difference():
    assert tuning.WRITTEN == {"Environment", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop"}
    for text in (dropin(), dropin(preset=None, rpc_wait=None, balancer=None)):
        got = serving(["R " + line for line in text.splitlines()] + SHOWN + ["G 1"])
        assert "error" not in got, got


def test_u2_u3_each_line_file_and_drop_in_rigup_does_not_write_is_named():
    base = ["R " + line for line in dropin().splitlines()]
    cases = {"R EnvironmentFile=-/home/eve/env": "its drop-in has EnvironmentFile=-/home/eve/env",
             "R UnsetEnvironment=CUDA_VISIBLE_DEVICES": "its drop-in has UnsetEnvironment=CUDA_VISIBLE_DEVICES",
             "R PassEnvironment=LD_PRELOAD": "its drop-in has PassEnvironment=LD_PRELOAD",
             "R User=root": "its drop-in has User=root",
             "R ExecStart = /bin/sh": "its drop-in has ExecStart = /bin/sh",
             f"S DropInPaths={OWN} /etc/systemd/system/rigup-llama@g.service.d/zz.conf":
                 "systemd reads the drop-in /etc/systemd/system/rigup-llama@g.service.d/zz.conf",
             "S DropInPaths=/run/systemd/system/rigup-llama@.service.d/x.conf " + OWN:
                 "systemd reads the drop-in /run/systemd/system/rigup-llama@.service.d/x.conf",
             "S EnvironmentFiles=/home/eve/env (ignore_errors=no)": "systemd reads the EnvironmentFile /home/eve/env",
             "S UnsetEnvironment=CUDA_VISIBLE_DEVICES": "systemd unsets CUDA_VISIBLE_DEVICES"}
    for line, named in cases.items():
        got = serving([*base, *SHOWN, line, "G 1"])["error"]
        assert isinstance(got, Unreadable) and got.where == "rigup-llama@g.service" and named in got.why, (line, got)
    # all at once, each named, and with an Environment= line that does not split
    got = serving([*base, *cases, 'E "A=1', "G 1"])["error"]
    assert all(named in got.why for named in cases.values()) and "Environment=: not a line rigup writes" in got.why


def test_u2_the_command_prints_every_drop_in_line_and_what_systemd_parsed(tmp_path):
    """The fact's shell over a drop-in with an EnvironmentFile= line, systemctl show answering with another drop-in."""
    conf = tmp_path / "rigup.conf"
    conf.write_text(dropin() + "EnvironmentFile=-/home/eve/env\n")
    show = tmp_path / "systemctl"
    show.write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = 'show -p DropInPaths' ] || exit 1\n"
                    f"echo 'DropInPaths={OWN} /etc/x.conf'\necho 'EnvironmentFiles=/etc/rigup/cuda.env (ignore_errors=yes)'\n"
                    "echo 'UnsetEnvironment='\n")
    show.chmod(0o755)
    fact = tuning.ServingEnv()
    command = fact.command("g").replace(OWN, str(conf)).replace("/etc/rigup/cuda.env", str(tmp_path / "none"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout.splitlines()
    got = fact.process(out)["error"].why
    assert "its drop-in has EnvironmentFile=-/home/eve/env" in got and "systemd reads the drop-in /etc/x.conf" in got
    assert got.count(";") == 1   # those two only: the lines rigup writes and its own drop-in are none


LINE = st.text(st.characters(blacklist_categories=["Cs"]), max_size=60)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from("RSECGB"), LINE), max_size=12))
def test_serving_env_never_raises_and_names_every_line_rigup_does_not_write(rows):
    lines = [f"{k} {v}" for k, v in rows]
    got = serving(lines)
    assert set(got) <= {"env", "gpus", "build", "error"}
    named = [tuning._not_written(k, v, "g") for k, v in rows if k in "RS"]
    if any(named):
        assert isinstance(got.get("error"), Unreadable) and all(n in got["error"].why for ns in named for n in ns)
    for k, v in rows:   # a drop-in line is no difference only as rigup writes it
        if k == "R" and v.strip() and not v.strip().startswith(("#", ";")) and v.strip() != "[Service]":
            assert v.partition("=")[0] in tuning.WRITTEN or "error" in got


# ---------------------------------------------------------------- U4: cuda.env's values
def cuda_text(**kw) -> str | None:
    d = data(**kw)
    plan, _ = host("h100")
    return cuda_toolkit.unit_env(plan, d)


def test_u4_cuda_env_is_the_text_apply_writes():
    """env_paths is apply's former inline dict: the rendered file byte-identical for each source."""
    for source, home, lib in (("nvidia", "/usr/local/cuda-12.8", "/usr/local/cuda-12.8/lib64"),
                              ("distro", "/usr", "/usr/lib/x86_64-linux-gnu"), ("present", "/usr", "/usr/lib/x86_64-linux-gnu")):
        d = data(cuda_source=source, cuda_version="12.8")
        old = {"version": "12.8", "bin_dir": f"{home}/bin", "lib_dir": lib}
        assert cuda_toolkit.env_paths(d) == old
        assert cuda_text(cuda_source=source, cuda_version="12.8") == render("cuda_toolkit.env.j2", **old)
    assert cuda_text(llama_cpp_backend="cpu") is None
    assert tuning.env_file(cuda_text(cuda_source="nvidia", cuda_version="12.8")) == {
        "PATH": "/usr/local/cuda-12.8/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda-12.8/lib64"}


def test_u4_cuda_env_values_are_compared():
    host_env = tuning.env_file(cuda_text(cuda_source="nvidia", cuda_version="12.8"))
    plan = {"CUDA_VISIBLE_DEVICES": "0"}
    env = serving([*(f"C {k}={v}" for k, v in host_env.items()), 'E "CUDA_VISIBLE_DEVICES=0"', "G 1"])["env"]
    assert tuning.differences(WANT, WANT, "/srv/models/g", frozenset(), plan, env, host_env) == []
    eve = {**env, "PATH": "/home/eve/bin:/usr/bin", "LD_LIBRARY_PATH": "/home/eve/lib"}
    assert tuning.differences(WANT, WANT, "/srv/models/g", frozenset(), plan, eve, host_env) == [
        "installed LD_LIBRARY_PATH=/home/eve/lib, the plan's LD_LIBRARY_PATH=/usr/local/cuda-12.8/lib64",
        "installed PATH=/home/eve/bin:/usr/bin, the plan's PATH=" + host_env["PATH"]]
    gone = {"CUDA_VISIBLE_DEVICES": "0"}
    assert [d.split(",")[0] for d in tuning.differences(WANT, WANT, "/srv/models/g", frozenset(), plan, gone, host_env)] \
        == ["installed without LD_LIBRARY_PATH", "installed without PATH"]
    # no cuda.env written (a CPU build): its variables are the host's, as before
    assert tuning.differences(WANT, WANT, "/srv/models/g", frozenset(), plan, eve, None) == []


def test_u8_a_lone_specifier_in_an_environment_line_does_not_read():
    """systemd expands specifiers in Environment= too (not $): ServingEnv names the line."""
    got = serving(['E "CUDA_VISIBLE_DEVICES=%i"', "G 1"])
    assert isinstance(got["error"], Unreadable) and "not a line rigup writes" in got["error"].why
    assert serving(['E "A=50%%" B=$HOME', "G 1"]) == {"env": {"A": "50%", "B": "$HOME"}, "gpus": 1, "build": None}


def test_a_long_line_is_refused_before_it_is_split():
    """shlex's split is quadratic here (round 7b's note: 2 MB ran for minutes): past LINE_MAX, not read."""
    import time

    fact = tuning.ExecStart()
    fact.command("g")
    start = time.monotonic()
    got = fact.process(["/x " + "a\\ " * 1_000_000])
    assert isinstance(got, Unreadable) and "at most 65536" in got.why
    env = serving(["E A=" + "b\\ " * 1_000_000, "G 1"])["error"]
    assert isinstance(env, Unreadable) and "at most 65536" in env.why and time.monotonic() - start < 5
