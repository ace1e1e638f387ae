"""rigup.boundary.owned with real files in a temporary directory (the tests run as root, and hand
files to uid 65534, nobody, with os.chown): a file or directory named by configuration is used only
when no other user could have written it or a directory on its path; the key and netrc readers take
arbitrary text to a value or a clear refusal; and status.py's read of a router's key reaches the
real curl as one header line, never as curl's config."""

from __future__ import annotations

import json
import netrc as python_netrc
import os
import stat
import struct
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rigup.boundary import owned
from rigup.boundary.core import Unreadable
from rigup.config import ConfigError

NOBODY = 65534
SECRET = "tok-0123456789abcdef"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def made(path: Path, text: str = "x\n", mode: int = 0o600, uid: int = 0, gid: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def refused(call, *words: str) -> str:
    with pytest.raises(Unreadable) as e:
        call()
    text = str(e.value)
    print(text)
    assert all(w in text for w in words), (words, text)
    return text


# -- the rule: owner, mode, private group, every directory on the path -------------------------------------

def test_a_file_of_yours_or_roots_that_no_one_else_can_write_is_read(tmp_path):
    assert owned.read(made(tmp_path / "k", "abc\n"), "k") == "abc\n"
    assert owned.read(made(tmp_path / "g", "g\n", 0o660, gid=0), "k") == "g\n"   # root's private group


@pytest.mark.parametrize("mode, uid, gid, words", [
    (0o602, 0, 0, ["writable by others", "mode -rw-----w-", "chmod go-w"]),
    (0o620, 0, NOBODY, ["writable by the group nogroup", "not root's private group", "chmod g-w"]),
    (0o600, NOBODY, 0, ["owned by nobody (uid 65534)", "not by you (root) or root", "chown root"]),
])
def test_a_file_another_user_could_write_is_refused_naming_owner_mode_and_fix(tmp_path, mode, uid, gid, words):
    path = made(tmp_path / "key", mode=mode, uid=uid, gid=gid)
    refused(lambda: owned.read(path, "fleet_api_key_src"), "fleet_api_key_src:", str(path), *words)


def test_a_secret_others_may_read_a_link_a_fifo_or_a_missing_file_is_refused(tmp_path):
    refused(lambda: owned.read(made(tmp_path / "r", mode=0o640), "k", secret=True),
            "must be a regular file of yours that no one else may read", "chmod 600")
    (tmp_path / "link").symlink_to(made(tmp_path / "t"))
    refused(lambda: owned.read(tmp_path / "link", "k"), "is a symbolic link")
    os.mkfifo(tmp_path / "fifo", 0o600)                 # opened non-blocking: refused, not waited on
    refused(lambda: owned.read(tmp_path / "fifo", "k"), "no regular file (prw-------)")
    refused(lambda: owned.read(tmp_path / "none", "k"), "cannot be read on the controller")
    refused(lambda: owned.read(made(tmp_path / "big", "x" * 40), "k", limit=20), "more than 20 bytes")


@pytest.mark.parametrize("mode, uid, words", [
    (0o777, 0, ["the directory", "writable by others", "chmod go-w"]),
    (0o770, NOBODY, ["owned by nobody", "chown root"]),
    (0o775, 0, []),                        # group root: root's private group
])
def test_every_directory_on_the_path_is_checked(tmp_path, mode, uid, words):
    d = tmp_path / "a" / "b"
    path = made(d / "key")
    os.chown(d.parent, uid, 0)
    d.parent.chmod(mode)
    if words:
        refused(lambda: owned.read(path, "k"), f"the directory {d.parent} on its path", *words)
    else:
        assert owned.read(path, "k") == "x\n"


def test_a_sticky_directory_on_the_path_passes_but_a_named_one_does_not(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                   # as /tmp: no one else may rename or remove what is not theirs
    assert owned.read(made(shared / "key"), "k") == "x\n"
    refused(lambda: owned.directory(shared, "llama_cpp_artifacts"), "must be a directory that only you or root "
            "can write", "writable by others (mode drwxrwxrwt)", "chmod go-w")


def test_a_parent_reached_through_a_link_is_checked_where_it_leads(tmp_path):
    theirs = tmp_path / "theirs"
    made(theirs / "key")
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "mine").symlink_to(theirs)
    refused(lambda: owned.read(tmp_path / "mine" / "key", "k"), f"the directory {theirs}", "owned by nobody")
    (tmp_path / "dirlink").symlink_to(tmp_path / "mine")
    refused(lambda: owned.directory(tmp_path / "dirlink", "k"), "is a symbolic link")


def test_a_link_on_the_path_is_followed_only_when_yours_or_roots(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                   # as /tmp: anyone may place a link there
    made(tmp_path / "mine" / "key", "mine\n")
    (shared / "ours").symlink_to("../mine")
    assert owned.read(shared / "ours" / "key", "k") == "mine\n"
    (shared / "planted").symlink_to(tmp_path / "mine")
    os.chown(shared / "planted", NOBODY, NOBODY, follow_symlinks=False)
    refused(lambda: owned.read(shared / "planted" / "key", "k"), f"the link {shared / 'planted'} on its path is "
            "owned by nobody (uid 65534), not by you or root")
    (tmp_path / "loop").symlink_to("loop")
    refused(lambda: owned.read(tmp_path / "loop" / "key", "k"), "more than 40 links")


def test_a_private_group_is_one_named_as_its_owner_with_no_other_member():
    assert owned._private_group(0, 0) and not owned._private_group(NOBODY, 0) and not owned._private_group(0, NOBODY)


@settings(max_examples=60, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.integers(0, 0o7777), uid=st.sampled_from([0, NOBODY]), gid=st.sampled_from([0, NOBODY]))
def test_any_mode_and_owner_is_read_exactly_when_the_rule_says(tmp_path, mode, uid, gid):
    path = made(tmp_path / "f", mode=mode & 0o777 | 0o400, uid=uid, gid=gid)
    path.chmod(mode | 0o400)
    ok = uid == 0 and not mode & 0o002 and (not mode & 0o020 or gid == 0)
    try:
        owned.read(path, "k")
        assert ok
    except owned.NotOwned as e:
        assert not ok and str(path) in str(e)


# -- the key: printable ASCII, bounded, never echoed -----------------------------------------------

@settings(max_examples=60, deadline=1000)
@given(st.text(max_size=600))
def test_any_text_is_a_key_or_refused_without_echoing_it(text):
    try:
        key = owned.key(text, "fleet_api_key_src")
    except Unreadable as e:
        size = len(text.strip())      # the message is the same for every text of its length: none echoed
        assert str(e) == str(Unreadable("fleet_api_key_src", f"not a key ({size} characters): a key is 16 to 512 "
                                        "printable ASCII characters without quotes, backslash, comma or whitespace, "
                                        "not beginning with '#' (rigup makes 64 hex digits)"))
        return
    assert 16 <= len(key) <= 512 and key.isascii() and key.isprintable()
    assert not set(key) & set(" \t\n\"'\\,") and not key.startswith("#")


# round 6 FM13: ',' (HAProxy's req.hdr() splits the header there: the gateway refused the right key);
# a '#' first (llama-server's --api-key-file reads that line as a comment: no key at all)
@pytest.mark.parametrize("text", ["k" * 15, "k" * 513, "k" * 20 + "\noutput = /etc/x", 'k' * 20 + '"',
                                  "k" * 20 + "\\", "ключ" * 5, "abcdefgh,ijklmnop0123", "#" + "k" * 20])
def test_a_key_a_curl_config_a_header_or_an_env_file_would_read_more_into_is_refused(text):
    with pytest.raises(Unreadable):
        owned.key(text, "k")


# -- the netrc: parsed, cut, refused, never another exception ----------------------------------------

@settings(max_examples=60, deadline=1000)
@given(st.text(max_size=300) | st.lists(st.sampled_from(["machine", "default", "login", "password", "account",
                                                         "macdef", "a.example", "b.example", "#", '"q"', SECRET,
                                                         "\n", "\t", "\\"]), max_size=20).map(" ".join))
def test_any_text_is_a_netrc_or_refused_naming_the_file(text):
    try:
        out = owned.netrc(text, "vllm_netrc_src: /n", {"a.example"})
    except Unreadable as e:
        assert str(e).startswith("vllm_netrc_src: /n: ") and SECRET not in str(e)
        return
    assert out.endswith("\n") and all(line.startswith("machine a.example") for line in out.splitlines())


@settings(max_examples=60, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["a.example", "B.example", "c.example"]),
                          st.from_regex(owned._TOKEN, fullmatch=True), st.from_regex(owned._TOKEN, fullmatch=True)),
                min_size=1, max_size=4, unique_by=lambda e: e[0].lower()))
def test_what_is_sent_is_what_pythons_netrc_reads_cut_to_the_machines(tmp_path, entries):
    text = "# mine\n" + "".join(f"machine {m}\n  login {u} password {p}\n" for m, u, p in entries)
    wanted = {"a.example", "b.example"}
    try:
        out = owned.netrc(text, "n", wanted)
    except Unreadable as e:
        assert "names no machine rigup fetches from" in str(e) and not {m.lower() for m, _, _ in entries} & wanted
        return
    (tmp_path / "n").write_text(out)
    read = python_netrc.netrc(str(tmp_path / "n")).hosts
    assert read == {m: (u, "", p) for m, u, p in entries if m.lower() in wanted}


def test_a_default_entry_or_a_macdef_is_refused_naming_the_file():
    refused(lambda: owned.netrc(f"machine a.example login u password {SECRET}\ndefault login u password {SECRET}\n",
                                "vllm_netrc_src: /home/op/netrc", {"a.example"}),
            "vllm_netrc_src: /home/op/netrc: a 'default' entry (line 2) would send its login to any machine")
    refused(lambda: owned.netrc("machine a.example login u\nmacdef init\n", "n", {"a.example"}), "line 2", "macdef")


def test_a_machine_given_twice_is_refused_whatever_its_case():
    """Round 2 of issue 61, item 26: github.com twice (the second GITHUB.COM) kept both: curl sends the first's
    password, Python's netrc the last's."""
    text = f"machine github.com login a password {SECRET}\nmachine GITHUB.COM login b password other-password-1\n"
    out = refused(lambda: owned.netrc(text, "vllm_netrc_src: /n", {"github.com"}),
                  "vllm_netrc_src: /n", "line 2", "the machine GITHUB.COM given twice")
    assert SECRET not in out


# -- the call sites ---------------------------------------------------------------------------------

def test_the_fleet_key_is_made_as_before_and_refused_when_another_user_could_write_it(tmp_path):
    from rigup.secrets import fleet_api_key
    src = tmp_path / "cfg" / "api-key"
    key = fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    assert len(key) == 64 and stat.S_IMODE(src.stat().st_mode) == 0o600 and stat.S_IMODE(src.parent.stat().st_mode) == 0o700
    os.chown(src, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="fleet_api_key_src: .* owned by nobody"):
        fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    made(src, "k" * 20 + '\noutput = "/tmp/x"\n')
    with pytest.raises(ConfigError, match="not a key") as e:
        fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    assert "output" not in str(e.value)


@pytest.mark.parametrize("planted", ["the key's directory", "a directory above it"])
def test_no_key_is_made_through_another_users_link_or_in_their_directory(tmp_path, planted):
    """Round 3 of issue 61, K11: a link of nobody's at ~/.config/rigup, to nobody's directory: the
    key file was made there (0600, a fresh key) before its path was checked and refused."""
    from rigup.secrets import fleet_api_key
    theirs, config = tmp_path / "theirs", tmp_path / "config"
    theirs.mkdir()
    config.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    link = config / "rigup"
    os.symlink(theirs, link)
    os.lchown(link, NOBODY, NOBODY)
    src = link / "api-key" if planted == "the key's directory" else link / "deeper" / "api-key"
    with pytest.raises(ConfigError) as e:
        fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    assert str(e.value).startswith(f"fleet_api_key_src: {src}: ") and str(link) in str(e.value), e.value
    assert os.listdir(theirs) == []
    link.unlink()
    os.chown(theirs, 0, 0)
    theirs.chmod(0o777)                                   # a directory others can write, named as it is
    with pytest.raises(ConfigError, match="writable by others"):
        fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(theirs / "api-key")})
    assert os.listdir(theirs) == []


def test_a_key_is_made_and_read_in_a_sticky_directory_and_one_planted_there_is_refused(tmp_path):
    """A sticky directory others can write (/tmp, where the lab keeps its fleet key) may hold the
    key, as it may hold any file read: no one else can rename or remove it there (the fix of K11 had
    refused it, and every keyed lab converge with it); one another user planted first is refused by
    its owner, never written through."""
    from rigup.secrets import fleet_api_key
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    src = sticky / "fleet-api-key"
    key = fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)})
    assert len(key) == 64 and stat.S_IMODE(src.stat().st_mode) == 0o600
    assert fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(src)}) == key
    planted = sticky / "planted-key"
    planted.write_text("k" * 32)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="owned by"):
        fleet_api_key({"fleet_api_key": True, "fleet_api_key_src": str(planted)})
    assert planted.read_text() == "k" * 32


def test_a_vllm_netrc_is_cut_to_the_machines_the_install_fetches_from(tmp_path):
    from roles.vllm import command
    src = made(tmp_path / "netrc", f"machine git.example login d password {SECRET}\n"
                                   f"machine bank.example login me password {SECRET}\n"
                                   f"machine idx.example login ci password {SECRET}\n")
    data = {"vllm_netrc_src": str(src), "vllm_git_url": "git@git.example:org/vllm.git",
            "vllm_pip_args": ["--extra-index-url=https://idx.example/simple"], "vllm_install_env": {}}
    assert command.fetched_from(data) >= {"git.example", "idx.example", "pypi.org"}
    assert command.netrc_text(data) == (f"machine git.example login d password {SECRET}\n"
                                        f"machine idx.example login ci password {SECRET}\n")
    with pytest.raises(ConfigError, match="names no machine rigup fetches from"):
        command.netrc_text({**data, "vllm_git_url": "https://github.com/x/y.git", "vllm_pip_args": []})


def test_the_artifact_cache_and_the_site_directory_are_refused_when_another_user_could_write_them(tmp_path, monkeypatch):
    from rigup import config
    from roles.llama_cpp import artifact
    assert stat.S_IMODE(artifact.cache_dir(str(tmp_path / "cache")).stat().st_mode) == 0o700
    (tmp_path / "cache").chmod(0o777)
    with pytest.raises(ConfigError, match="llama_cpp_artifacts: .*writable by others"):
        artifact.cache_dir(str(tmp_path / "cache"))

    site = tmp_path / "site"
    made(site / "group_vars" / "all.yml", "llama_port: 8081\n")
    made(site / "host_vars" / "h1.yml", "llama_port: 8082\n", mode=0o644, uid=NOBODY)
    monkeypatch.setenv(config.SITE_ENV, str(site))
    inventory = tmp_path / "inv.py"
    assert config.site_dir(inventory, None) == site and config.group_vars("all", site)["llama_port"] == 8081
    with pytest.raises(ConfigError, match=r"the site directory \(RIGUP_SITE\): .*h1.yml must be .* owned by nobody"):
        config.host_vars("h1", site)
    site.chmod(0o757)
    with pytest.raises(ConfigError, match="RIGUP_SITE=.*writable by others"):
        config.site_dir(inventory, None)


# -- the one writer of what rigup keeps on the controller (issue 61, the red team's 5 and 18) ---------------

def test_a_kept_file_is_written_only_into_a_directory_no_other_user_can_write(tmp_path):
    d, victim = tmp_path / "cache", made(tmp_path / "victim", "operator's file\n")
    path = owned.write(d / "hub" / "x.json", "[1]", "the hub's answers")     # made 0700, the file 0600
    assert owned.read(path, "w") == "[1]" and stat.S_IMODE((d / "hub").stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (d / "hub" / "y.json").symlink_to(victim)           # a link at the name is replaced, never followed
    owned.write(d / "hub" / "y.json", "[2]", "w", mode=0o644)
    assert victim.read_text() == "operator's file\n" and not (d / "hub" / "y.json").is_symlink()
    assert stat.S_IMODE((d / "hub" / "y.json").stat().st_mode) == 0o644
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o777)
    for name in ("h.json", f".h.json.{os.getpid()}.tmp", "x.json.tmp1"):   # what another user plants there
        (theirs / name).symlink_to(victim)
    print(refused(lambda: owned.write(theirs / "h.json", "GPU-a", "controller:copy"),
                  "controller:copy", "owned by nobody", "chown root", "another user could swap what it holds"))
    theirs.chmod(0o755)
    os.chown(theirs, 0, 0)
    theirs.chmod(0o777)
    refused(lambda: owned.write(theirs / "h.json", "GPU-a", "w"), "writable by others (mode drwxrwxrwx)")
    assert victim.read_text() == "operator's file\n" and sorted(os.listdir(theirs)) == sorted(
        ["h.json", f".h.json.{os.getpid()}.tmp", "x.json.tmp1"])


def test_nothing_is_made_under_another_users_link_or_directory(tmp_path):
    """Round 2 of issue 61, item 32: write under another user's link refused, but only after mkdir(parents=True)
    had made new/sub in the link's target, as root. The existing part is checked first; the rest made by descriptor."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "link").symlink_to(target)
    os.chown(tmp_path / "mine" / "link", NOBODY, NOBODY, follow_symlinks=False)
    print(refused(lambda: owned.write(tmp_path / "mine" / "link" / "new" / "sub" / "f", "x", "w"),
                  "the link", "owned by nobody"))
    assert os.listdir(target) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    refused(lambda: owned.write(theirs / "new" / "sub" / "f", "x", "w"), "owned by nobody")
    assert os.listdir(theirs) == []
    refused(lambda: owned.write(tmp_path / "no" / ".." / "f", "x", "w"), "'..' below a directory that does not exist")
    path = owned.write(tmp_path / "mine" / "a" / "b" / "f", "x", "w")   # missing ones made 0700, one at a time
    assert path.read_text() == "x" and stat.S_IMODE((tmp_path / "mine" / "a" / "b").stat().st_mode) == 0o700


@settings(max_examples=40, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300))
def test_any_text_written_reads_back_the_same(tmp_path, text):
    path = owned.write(tmp_path / "kept" / "x.json", text, "w")
    assert owned.read(path, "w") == text and [p.name for p in path.parent.iterdir()] == ["x.json"]


# -- status.py's read of a keyed router, against the real curl ---------------------------------------

class _Router(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.headers.get_all("Authorization"))
        body = json.dumps({"data": [{"id": "m1"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("key, header", [
    ("k" * 20, "Bearer " + "k" * 20),
    ("k" * 20 + '\noutput = "OUT"\n', "Bearer " + "k" * 20),
    ('k"\\ k\nheader = "X-Evil: 1"', 'Bearer k"\\k'),
])
def test_a_routers_key_reaches_curl_as_one_header_never_as_its_config(tmp_path, key, header):
    from plays import fleet
    server = HTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        kf = tmp_path / "key"
        kf.write_text(key.replace("OUT", str(tmp_path / "written")))
        unit = tmp_path / "rigup-llama@r.service.d"
        unit.mkdir()
        (unit / "rigup.conf").write_text(f"ExecStart=/x --port {port} --host 127.0.0.1 --models-preset /p "
                                         f"--api-key-file {kf}\n")
        script = fleet.SERVING.replace("/etc/systemd/system/", f"{tmp_path}/")
        _Router.seen = []
        # the unit active, this process its MainPID: the listener is its own (the key goes only there: C1)
        stand_in = tmp_path.parent / f"{tmp_path.name}-bin"
        stand_in.mkdir()
        (stand_in / "systemctl").write_text(f"#!/bin/sh\ncase $1 in is-active) echo active;; show) echo {os.getpid()};; esac\n")
        (stand_in / "systemctl").chmod(0o755)
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, cwd=tmp_path,
                             env={**os.environ, "PATH": f"{stand_in}:{os.environ['PATH']}"}).stdout
    finally:
        server.shutdown()
        server.server_close()
    print(out, _Router.seen)
    assert "models=id:m1" in out and _Router.seen == [None, [header]]     # /health, then /models
    assert not (tmp_path / "written").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["key", unit.name]



def _serving(tmp_path, active: str, main_pid: int) -> list:
    """SERVING's run by sh with a unit ``active`` whose MainPID is ``main_pid`` (a ``systemctl`` stand-in),
    its router's port held by this process; the Authorization headers the listener was sent."""
    from plays import fleet
    server = HTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        (tmp_path / "key").write_text("SECRET-KEY-123\n")
        unit = tmp_path / "rigup-llama@r.service.d"
        unit.mkdir()
        (unit / "rigup.conf").write_text(f"ExecStart=/x --models-preset /p --port {port} --api-key-file {tmp_path}/key\n")
        stand_in = tmp_path / "bin"
        stand_in.mkdir()
        (stand_in / "systemctl").write_text(f"#!/bin/sh\ncase $1 in is-active) echo {active};; show) echo {main_pid};; esac\n")
        (stand_in / "systemctl").chmod(0o755)
        _Router.seen = []
        subprocess.run(["sh", "-c", fleet.SERVING.replace("/etc/systemd/system/", f"{tmp_path}/")], capture_output=True,
                       text=True, timeout=30, env={**os.environ, "PATH": f"{stand_in}:{os.environ['PATH']}"})
        return _Router.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(os.geteuid() != 0, reason="ss names other processes' pids to root only (status reads as root)")
@pytest.mark.parametrize("active, main_pid, sent", [
    ("inactive", "self", False),      # round 5 C1: the unit down, another user's listener on its port
    ("active", 1, False),             # the unit up, its port held by a process neither its main one nor its child
    ("failed", "self", False),
    ("active", "self", True),         # the unit's own listener: the key is sent
    ("active", "parent", True),       # a child of the unit's main process listens
])
def test_a_routers_key_goes_only_to_the_units_own_listener(tmp_path, active, main_pid, sent):
    """Round 5 C1: status sent the router's key to whatever listened on its port, the unit inactive."""
    pid = {"self": os.getpid(), "parent": os.getppid()}.get(main_pid, main_pid)
    seen = _serving(tmp_path, active, pid)
    print(f"unit {active}, MainPID {main_pid}: /health then /models were sent {seen}")
    assert seen == [None, ["Bearer SECRET-KEY-123"] if sent else None]

# -- POSIX ACLs (issue 61 round 3, items 5, 6, 13): the mode's group bits are only the mask -------------------

ACL = "system.posix_acl_access"
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 1, 2, 4, 8, 16, 32
ANY = 0xFFFFFFFF


def acl(path: Path, *entries: tuple[int, int, int], version: int = 2) -> Path:
    """``path`` with the access ACL ``entries`` (tag, perm, id), written as setfacl would (the kernel's
    format; no acl package needed)."""
    os.setxattr(path, ACL, struct.pack("<I", version) + b"".join(struct.pack("<HHI", *e) for e in sorted(entries)))
    return path


def base(owner: int = 6, group: int = 4, other: int = 0, mask: int | None = 6) -> list[tuple[int, int, int]]:
    return [(USER_OBJ, owner, ANY), (GROUP_OBJ, group, ANY), (OTHER, other, ANY)] + \
        ([(MASK, mask, ANY)] if mask is not None else [])


def test_a_file_with_an_acl_letting_another_user_write_is_refused(tmp_path):
    """Round 3: `setfacl -m u:nobody:rw all.yml` (mode shows 0660) was read."""
    path = acl(made(tmp_path / "all.yml", "a: 1\n"), *base(), (USER, 6, NOBODY))
    print(f"\nmode {stat.filemode(path.stat().st_mode)}:")
    refused(lambda: owned.read(path, "k"), "ACL letting the user nobody", "user:nobody:rw-", "setfacl -b")
    gpath = acl(made(tmp_path / "g.yml", "a: 1\n"), *base(), (GROUP, 6, NOBODY))
    refused(lambda: owned.read(gpath, "k"), "ACL letting the group", "setfacl -b")


def test_a_directory_with_an_acl_letting_another_user_write_is_refused_on_the_path_named_and_written(tmp_path):
    """Round 3: group_vars/ with u:nobody:rwx (nobody can swap all.yml), and owned.write into such a
    directory."""
    group_vars = tmp_path / "group_vars"
    made(group_vars / "all.yml", "a: 1\n")
    acl(group_vars, *base(7, 5, 5, 7), (USER, 7, NOBODY))
    refused(lambda: owned.read(group_vars / "all.yml", "k"), f"the directory {group_vars} on its path",
            "user:nobody:rwx", f"setfacl -b {group_vars}")
    refused(lambda: owned.directory(group_vars, "k"), "ACL letting the user nobody")
    refused(lambda: owned.write(group_vars / "new", "t", "k"), "ACL letting the user nobody")
    assert not (group_vars / "new").exists()


def test_an_acl_whose_write_is_masked_or_for_the_owner_passes_and_an_odd_one_is_refused(tmp_path):
    masked = acl(made(tmp_path / "m", "m\n"), *base(mask=4), (USER, 6, NOBODY))
    print(f"\nmasked user:nobody:rw under mask r--: {owned.read(masked, 'k')!r}")
    assert owned.read(masked, "k") == "m\n"
    assert owned.read(acl(made(tmp_path / "r", "r\n"), *base(), (USER, 4, NOBODY)), "k") == "r\n"
    # an ACL rigup cannot read: checked on the parsed form (the kernel refuses to store another version)
    with pytest.raises(ValueError):
        owned._acl_entries(struct.pack("<I", 3))


@settings(max_examples=40, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(users=st.dictionaries(st.sampled_from([1, 2, NOBODY]), st.integers(0, 7), max_size=3),
       groups=st.dictionaries(st.sampled_from([0, 1, NOBODY]), st.integers(0, 7), max_size=3),
       group_obj=st.integers(0, 7), other=st.integers(0, 5), mask=st.integers(0, 7))
def test_any_acl_is_refused_exactly_when_an_entry_lets_another_write(tmp_path, users, groups, group_obj, other, mask):
    """Root's file (root's group 0 is its private group): refused iff a user entry, or a group entry
    of a group other than 0, has write under the mask, or others may write."""
    path = made(tmp_path / "h", "h\n")
    acl(path, *base(6, group_obj, other & ~2, mask), *[(USER, p, u) for u, p in users.items()],
        *[(GROUP, p, g) for g, p in groups.items()])
    bad = any(p & mask & 2 for p in users.values()) or any(p & mask & 2 for g, p in groups.items() if g)
    try:
        owned.read(path, "k")
    except Unreadable as e:
        assert bad and "setfacl -b" in str(e), str(e)
        return
    assert not bad
