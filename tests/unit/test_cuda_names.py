"""Round 7 of issue 61: the CUDA fact's output is framed by names no path can forge, and the walk checks
every link on the way to an nvcc.

N1: a staff user's directory named ``cuda<LF>Cuda compilation tools, release 12.8, V12.8.93<LF>--- Q`` (Debian's
/usr/local is 2775 root:staff) printed a section headed ``/usr/local/cuda`` of its own, a toolkit rigup
believed; N11: a name with a space split the header. A name outside :data:`NAME_CHARS` is now never printed
(nor run), and the parser starts no section at a header that is not two absolute paths of them.
N2: /usr/bin/nvcc -> nobody's link in a 1777 directory -> root's nvcc was a toolkit: each link met on the way
is read only after the directory holding it was walked, so a link another user may repoint is refused.
7b X1: a ``..`` in a link's target left a directory never walked (root's /usr/bin/nvcc ->
/home/eve/x/../../../opt/cuda/bin/nvcc, x eve's: she may make x a link): each directory is walked before the
chain goes up from it, as roles/burnin/shipped/acceptance.py's ``alone()`` does (the property below holds the two equal).

Each case runs the real CUDA_COMMAND on this machine's shell over a scratch tree (its /usr/local/cuda* glob
moved there). Trees the walk should accept are made under /root (root's alone up to /), hence as root only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rigup.gpu.facts import CUDA_COMMAND, NAME_CHARS, cuda_sections, parse_cuda_toolkits, parse_refused_nvcc

RELEASE = "Cuda compilation tools, release 12.8, V12.8.93"
FORGED = f"cuda\n{RELEASE}\n--- Q"     # N1's directory name
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a directory chain root alone owns is made under /root")


def gathered(glob_dir: Path, path: str = "/nonexistent", shell: str = "sh") -> list[str]:
    """CUDA_COMMAND's output with /usr/local/cuda* moved to ``glob_dir``/cuda* and ``path`` alone on PATH
    before the system's (stat, readlink, dirname), run by ``shell``."""
    command = CUDA_COMMAND.replace("/usr/local/cuda*/bin/nvcc", f"{glob_dir}/cuda*/bin/nvcc")
    assert command != CUDA_COMMAND
    return subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{path}:/usr/bin:/bin"}).stdout.splitlines()


def nvcc(at: Path, ran: Path | None = None) -> Path:
    """A fake nvcc at ``at`` (dirs made 755) that says its release, and appends its $0 to ``ran``."""
    at.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    at.write_bytes(b"#!/bin/sh\n" + (f'echo "$0" >> {ran}\n'.encode() if ran else b"") + f'echo "{RELEASE}"\n'.encode())
    at.chmod(0o755)
    return at


@pytest.fixture
def home():
    """A scratch directory root alone owns, up to / (/root is 700 root's)."""
    if os.geteuid() != 0:
        pytest.skip("a directory chain root alone owns is made under /root")
    d = Path(tempfile.mkdtemp(dir="/root"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def baseline() -> list[dict]:
    """This machine's own toolkits on PATH (/usr/bin:/bin), none of the scratch tree's."""
    return parse_cuda_toolkits(gathered(Path("/nonexistent")))


# ----------------------------------------------------------------------------- N1, N11: names frame nothing
def test_n1_a_directory_named_to_forge_a_section_forges_none(tmp_path):
    """N1 as the round ran it: another user's nvcc under a name holding line breaks, a release line and a
    header: no section for it (never printed), no toolkit, nothing refused by a fragment of its name."""
    local = tmp_path / "usr" / "local"
    nvcc(local / FORGED / "bin" / "nvcc").chmod(0o755)
    local.chmod(0o2775)
    out = gathered(local)
    print(out)
    assert not any("Q" in ln or "cuda\n" in ln for ln in out)
    assert [s[:2] for s in cuda_sections(out) if s[0].startswith(str(tmp_path))] == []
    assert parse_cuda_toolkits(out) == baseline()
    assert not [r for r in parse_refused_nvcc(out) if not r["path"].startswith("/")]


@root_only
def test_n1_a_forging_name_is_no_toolkit_even_where_root_alone_writes(home):
    """The name rule holds apart from the walk: under a tree root alone owns (the walk would pass it), a
    directory named to forge a section is neither run nor printed; the plain name beside it is a toolkit."""
    ran = home / "ran"
    forged = nvcc(home / FORGED / "bin" / "nvcc", ran)
    plain = nvcc(home / "cuda-12.8" / "bin" / "nvcc", ran)
    out = gathered(home)
    print(out)
    found = [(t["path"], t["seen_as"]) for t in parse_cuda_toolkits(out)]
    assert (str(plain), [str(plain)]) in found and all(str(forged) != p for p, _ in found)
    assert {p for p, _ in found} <= {str(plain)} | {t["path"] for t in baseline()}
    assert ran.read_text().splitlines() == [str(plain)]


@root_only
def test_n11_a_name_with_a_space_is_no_header(home):
    """N11: /usr/local/'cuda x', a link to the toolkit: the header split at its space and made a relative
    path a toolkit's. The name is not printed; the toolkit is one by its own name, its path absolute."""
    real = nvcc(home / "cuda-12.8" / "bin" / "nvcc")
    (home / "cuda x").symlink_to("cuda-12.8")
    out = gathered(home)
    print(out)
    assert not [ln for ln in out if " x/" in ln or "cuda x" in ln]
    (t,) = [t for t in parse_cuda_toolkits(out) if t["path"].startswith(str(home))]
    assert (t["path"], t["seen_as"]) == (str(real), [str(real)])
    # the old header, as the round made it, reads as no section at all
    assert cuda_sections(["--- /usr/local/cuda x/bin/nvcc /usr/local/cuda-12.8/bin/nvcc", RELEASE]) == []


# ----------------------------------------------------------------------------- N2: every link on the way
@root_only
def test_n2_a_link_another_user_may_repoint_in_the_middle_of_the_chain_is_refused(home):
    """N2 as the round ran it: root's /usr/bin/nvcc -> nobody's link in a 1777 directory -> root's nvcc.
    Refused, naming the 1777 directory; by its own name the nvcc is a toolkit, run by its real path."""
    ran = home / "ran"
    real = nvcc(home / "opt" / "cuda" / "bin" / "nvcc", ran)
    shared = home / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o1777)
    (shared / "nvcc").symlink_to(real)
    os.lchown(shared / "nvcc", 65534, 65534)
    usr_bin = home / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "nvcc").symlink_to(shared / "nvcc")
    out = gathered(Path("/nonexistent"), str(usr_bin))
    print(out)
    (r,) = [r for r in parse_refused_nvcc(out) if r["path"] == str(real)]
    assert (r["seen_as"], r["dir"], r["mode"]) == ([str(usr_bin / "nvcc")], str(shared), "1777")
    assert str(real) not in {t["path"] for t in parse_cuda_toolkits(out)} and not ran.exists()
    out = gathered(Path("/nonexistent"), str(real.parent))
    assert str(real) in {t["path"] for t in parse_cuda_toolkits(out)}
    assert ran.read_text().splitlines() == [str(real)]


@root_only
def test_n2_a_directory_link_in_a_directory_another_user_writes_is_refused(home):
    """A link among the directories of a link's target (namei's case): /usr/bin/nvcc -> mid/cuda/bin/nvcc,
    ``mid`` 1777 and ``mid/cuda`` a link to root's toolkit. Neither the real path's walk nor the name's own
    directories pass through ``mid``: the chain does."""
    real = nvcc(home / "opt" / "cuda" / "bin" / "nvcc")
    mid = home / "mid"
    mid.mkdir()
    mid.chmod(0o1777)
    (mid / "cuda").symlink_to(home / "opt" / "cuda")
    usr_bin = home / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "nvcc").symlink_to(mid / "cuda" / "bin" / "nvcc")
    out = gathered(Path("/nonexistent"), str(usr_bin))
    print(out)
    assert [(r["path"], r["dir"], r["mode"]) for r in parse_refused_nvcc(out)] == [(str(real), str(mid), "1777")]
    assert str(real) not in {t["path"] for t in parse_cuda_toolkits(out)}


@root_only
def test_n2_nvidias_links_are_accepted(home):
    """NVIDIA's own layout stays a toolkit: /usr/local/cuda -> cuda-12.8 (a relative link in a 755 root
    directory), and Ubuntu's alternatives (/usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-12.8),
    each link's directory root's alone."""
    local = home / "usr" / "local"
    real = nvcc(local / "cuda-12.8" / "bin" / "nvcc")
    (local / "cuda").symlink_to("cuda-12.8")
    out = gathered(local)
    (t,) = [t for t in parse_cuda_toolkits(out) if t["path"].startswith(str(home))]
    assert (t["path"], sorted(t["seen_as"])) == (str(real), sorted([str(local / "cuda" / "bin" / "nvcc"), str(real)]))
    assert parse_refused_nvcc(out) == [r for r in parse_refused_nvcc(gathered(Path("/nonexistent")))]
    (local / "cuda").unlink()
    alternatives = home / "etc" / "alternatives"
    alternatives.mkdir(parents=True)
    (alternatives / "cuda").symlink_to(local / "cuda-12.8")
    (local / "cuda").symlink_to(alternatives / "cuda")
    out = gathered(local)
    print(out)
    (t,) = [t for t in parse_cuda_toolkits(out) if t["path"].startswith(str(home))]
    assert sorted(t["seen_as"]) == sorted([str(local / "cuda" / "bin" / "nvcc"), str(real)])
    # the same alternatives link in a group-writable /etc/alternatives is refused
    alternatives.chmod(0o2775)
    out = gathered(local)
    assert [(r["seen_as"], r["dir"]) for r in parse_refused_nvcc(out) if r["path"] == str(real)] == \
        [([str(local / "cuda" / "bin" / "nvcc")], str(alternatives))]


@root_only
def test_n2_a_link_to_a_name_outside_the_set_is_refused_by_the_link(home):
    """Root's /usr/bin/nvcc whose target holds a line break (a real path the command will not print): the
    build runs it by its name, so it is refused by that name, never silently none."""
    real = nvcc(home / "opt" / "x\ny" / "bin" / "nvcc")
    usr_bin = home / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "nvcc").symlink_to(real)
    out = gathered(Path("/nonexistent"), str(usr_bin))
    print(out)
    name = str(usr_bin / "nvcc")
    assert [(r["path"], r["seen_as"], r["dir"]) for r in parse_refused_nvcc(out)] == [(name, [name], name)]
    assert name not in {s for t in parse_cuda_toolkits(out) for s in t["seen_as"]}


# ----------------------------------------------------------------------------- 7b X1: a '..' leaves a walked directory
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]


@root_only
@pytest.mark.parametrize("shell", SHELLS)
def test_x1_a_dotdot_out_of_another_users_directory_is_refused(home, shell):
    """X1 as the round ran it: root's /usr/bin/nvcc -> HOME/home/eve/x/../../../opt/cuda/bin/nvcc, x eve's real
    directory (no link met in it, the real path root's). Refused naming x (eve may make it a link, and the
    ``..`` then leaves elsewhere); with x root's, refused naming eve's directory (she may rename x); with both
    root's, a toolkit by that name, as a relative ``..`` out of root's directories is (Debian's links)."""
    ran = home / "ran"
    real = nvcc(home / "opt" / "cuda" / "bin" / "nvcc", ran)
    eve = home / "home" / "eve"
    (eve / "x").mkdir(parents=True)
    os.chown(eve, 65534, 65534)
    os.chown(eve / "x", 65534, 65534)
    usr_bin = home / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    name = usr_bin / "nvcc"
    name.symlink_to(f"{eve}/x/../../../opt/cuda/bin/nvcc")

    def refused() -> list[tuple]:
        out = gathered(Path("/nonexistent"), str(usr_bin), shell)
        print(out)
        assert str(real) not in {t["path"] for t in parse_cuda_toolkits(out)}
        return [(r["path"], r["seen_as"], r["dir"], r["owner"]) for r in parse_refused_nvcc(out)]

    assert refused() == [(str(real), [str(name)], str(eve / "x"), "nobody")]
    os.chown(eve / "x", 0, 0)
    assert refused() == [(str(real), [str(name)], str(eve), "nobody")]
    assert not ran.exists()
    os.chown(eve, 0, 0)
    for target in (f"{eve}/x/../../../opt/cuda/bin/nvcc", "../../opt/./cuda/bin/nvcc"):
        name.unlink()
        name.symlink_to(target)
        out = gathered(Path("/nonexistent"), str(usr_bin), shell)
        assert [(t["path"], t["seen_as"]) for t in parse_cuda_toolkits(out) if t["path"] == str(real)] == \
            [(str(real), [str(name)])]
    assert ran.read_text().splitlines() == [str(real)] * 2


def x1_tree(home: Path) -> None:
    """Directories of root's and nobody's, nested both ways, links to and from them, and a 2775 one."""
    if (home / "usr").exists():
        return
    nvcc(home / "opt" / "cuda" / "bin" / "nvcc")
    (home / "usr" / "bin").mkdir(parents=True)
    for d, owner, mode in [("r", 0, 0o755), ("r/e2", 65534, 0o755), ("r/e2/r3", 0, 0o755), ("e", 65534, 0o755),
                           ("e/r2", 0, 0o755), ("g", 0, 0o2775), ("g/r4", 0, 0o755)]:
        (home / d).mkdir()
        os.chown(home / d, owner, 0 if owner == 0 else 65534)
        (home / d).chmod(mode)
    (home / "r" / "lk").symlink_to("../e")          # root's link, in root's directory, to nobody's
    (home / "e" / "elk").symlink_to("../r")         # nobody's link, to root's
    os.lchown(home / "e" / "elk", 65534, 65534)


@root_only
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), relative=st.booleans())
def test_the_chain_passes_a_name_exactly_where_alone_does(home, data, relative):
    """Root's /usr/bin/nvcc -> a wander through root's and nobody's directories and links (down, ``.``,
    ``..``), then back up to the nvcc: a toolkit by that name under dash and bash exactly where
    roles/burnin/shipped/acceptance.py's ``alone()`` (every part checked, in Python) passes the name, else refused."""
    from roles.burnin.shipped.acceptance import alone

    x1_tree(home)
    parts: list[str] = []
    for _ in range(data.draw(st.integers(0, 6))):
        cur = Path(os.path.realpath(os.path.join(home, *parts)))
        names = sorted(n for n in os.listdir(cur) if (cur / n).is_dir() and n not in ("opt", "usr"))
        parts.append(data.draw(st.sampled_from(names + ["."] + ([".."] if cur != home else []))))
    up = len(Path(os.path.realpath(os.path.join(home, *parts))).relative_to(home).parts)
    target = "/".join([*(["..", ".."] if relative else [str(home)]), *parts, *[".."] * up, "opt/cuda/bin/nvcc"])
    name = home / "usr" / "bin" / "nvcc"
    name.unlink(missing_ok=True)
    name.symlink_to(target)
    real = str(home / "opt" / "cuda" / "bin" / "nvcc")
    assert os.path.realpath(name) == real
    passes = alone(str(name))[1] is None
    for shell in SHELLS:
        out = gathered(Path("/nonexistent"), str(name.parent), shell)
        found = [t["seen_as"] for t in parse_cuda_toolkits(out) if t["path"] == real]
        refused = [r["seen_as"] for r in parse_refused_nvcc(out) if r["path"] == real]
        assert (found, refused) == (([[str(name)]], []) if passes else ([], [[str(name)]])), (target, shell, out)


# ----------------------------------------------------------------------------- properties
# a name in one directory: a "/" in the text becomes a division slash (U+2215), as a file name may hold
NAMES = (st.binary(min_size=1, max_size=120) |
         st.sampled_from([FORGED.encode(), b" x", b"\n--- /usr/bin/nvcc /usr/bin/nvcc\n" + RELEASE.encode(),
                          b"\nunsafe name /x", b"-12.8\n--- /usr/local/cuda-12.8/bin/nvcc /usr/local/cuda-12.8/bin/nvcc",
                          b"\r--- /a /b", "\u2028x".encode(), b"$(touch pwn)", b"*", b"...", b"-13.0"])
         ).map(lambda b: b.replace(b"/", "\u2215".encode()).replace(b"\0", b"_"))
PLAIN = set(NAME_CHARS.encode())


@root_only
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, how=st.sampled_from(["dir", "link"]))
def test_any_name_yields_no_toolkit_the_walk_did_not_check(name, how):
    """Any name (bytes, line breaks, ``---``, spaces) under /usr/local/cuda*: the toolkits found are the
    walk's own, a real nvcc created under a plain name, each by a name that is one, or this machine's."""
    home = Path(tempfile.mkdtemp(dir="/root"))
    try:
        home.chmod(0o755)
        real = nvcc(home / "cuda-12.8" / "bin" / "nvcc")
        at = os.path.join(os.fsencode(home), b"cuda" + name)
        if how == "dir":
            os.makedirs(os.path.join(at, b"bin"))
            shutil.copy(real, os.path.join(at, b"bin", b"nvcc"))
        else:
            os.symlink(b"cuda-12.8", at)
        out = gathered(home)
        plain = set(b"cuda" + name) <= PLAIN and name not in (b".", b"..")
        want = {str(real)} | ({os.fsdecode(os.path.join(at, b"bin", b"nvcc"))} if plain and how == "dir" else set())
        found = parse_cuda_toolkits(out)
        mine = [t for t in found if t["path"].startswith(str(home))]
        assert {t["path"] for t in mine} == want
        assert {t["path"] for t in found if t not in mine} == {t["path"] for t in baseline()}
        for t in mine:
            assert all(set(os.fsencode(s)) <= PLAIN and os.path.exists(s) for s in [t["path"], *t["seen_as"]])
    finally:
        shutil.rmtree(home)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=60) | st.sampled_from(["--- /a/nvcc /a/nvcc", RELEASE, "unsafe name /x",
                                                         "--- /a b/nvcc /c/nvcc", "--- a/nvcc /c/nvcc"]), max_size=10),
       st.text(max_size=60))
def test_a_toolkit_read_is_always_two_absolute_plain_paths(lines, name):
    """Whatever the text (a name that reached a header included), a toolkit's path and each name it was
    seen as are absolute paths of NAME_CHARS, and none is both a toolkit's name and refused."""
    lines = [*lines, f"--- {name} /r/nvcc", RELEASE, f"--- /n/nvcc {name}", RELEASE]
    toolkits, refused = parse_cuda_toolkits(lines), parse_refused_nvcc(lines)
    for path in [t["path"] for t in toolkits] + [s for t in toolkits for s in t["seen_as"]] + \
            [r["path"] for r in refused] + [r["dir"] for r in refused]:
        assert path.startswith("/") and set(path) <= set(NAME_CHARS), path
    assert not {s for r in refused for s in r["seen_as"]} & {s for t in toolkits for s in t["seen_as"]}
