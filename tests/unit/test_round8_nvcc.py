"""Issue 61, round 8 X4 and N1: rigup/gpu/facts.py CUDA_COMMAND on this machine's shell.

X4: ``$(command -v nvcc)`` was unquoted: a PATH entry ``/opt/a b`` holding an nvcc split it, and root
walked and ran ``/opt/a`` (a file not named nvcc) with --version, read as a toolkit. It is one word now,
and only a name ending in /nvcc is one.
N1: the walk split ``stat``'s ``OWNER:GROUP`` (sssd's "john smith") and _UNSAFE took at most 64
characters of each: the nvcc was not run, and no refusal named it. Each name is read alone now, every
byte outside OWNER_CHARS a ?, and any ``unsafe`` line that still does not read refuses its section.
"""

import atexit
import shutil
import subprocess
import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from rigup.gpu.facts import (_WALK, CUDA_COMMAND, OWNER_CHARS, OWNER_MAX, cuda_sections, parse_cuda_toolkits,
                             parse_refused_nvcc)

NVCC = '#!/bin/sh\necho "$0" >> {ran}\necho "Cuda compilation tools, release 12.8, V12.8.93"\n'


def shim(where: Path, uid_mode: str | None = None) -> Path:
    """A ``stat`` first on PATH: ``%U`` and ``%G`` print $OWNER and $GROUP (a host's names), ``%u %a`` prints
    ``uid_mode`` (None: the real one); anything else is the real stat's."""
    d = where / "shim"
    d.mkdir()
    mode = f'echo {uid_mode!r}' if uid_mode else 'exec /usr/bin/stat "$@"'
    (d / "stat").write_text('#!/bin/sh\ncase "$3" in\n%U) printf "%s\\n" "$OWNER";;\n%G) printf "%s\\n" "$GROUP";;\n'
                            f'"%u %a") {mode};;\n*) exec /usr/bin/stat "$@";;\nesac\n')
    (d / "stat").chmod(0o755)
    return d


def gathered(path: str, **env) -> list[str]:
    """CUDA_COMMAND with ``path`` as PATH, its glob of /usr/local left out (none of this machine's)."""
    command = CUDA_COMMAND.replace("/usr/local/cuda*/bin/nvcc", "/nonexistent/cuda*/bin/nvcc")
    assert command != CUDA_COMMAND
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "OWNER": "root", "GROUP": "root", **env}).stdout.splitlines()


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- X4
def test_x4_a_path_entry_with_a_blank_is_one_word_and_its_first_half_never_runs(tmp_path):
    ran = tmp_path / "ran"
    executable(tmp_path / "opt" / "a b" / "nvcc", NVCC.format(ran=ran))
    executable(tmp_path / "opt" / "a", NVCC.format(ran=ran))   # root's, walked as root's (the shim): never run
    bins = shim(tmp_path, "0 755")   # every directory shown as root's 755, as round 8 did for /tmp
    out = gathered(f"{bins}:{tmp_path}/opt/a b:/usr/bin:/bin")
    assert not ran.exists() and not cuda_sections(out) and parse_cuda_toolkits(out) == [], out
    # the same shell finds a PATH nvcc in a directory without a blank, runs it by its real path, and reads it
    good = executable(tmp_path / "opt" / "ok" / "nvcc", NVCC.format(ran=ran))
    out = gathered(f"{bins}:{good.parent}:/usr/bin:/bin")
    assert [(t["path"], t["seen_as"]) for t in parse_cuda_toolkits(out)] == [(str(good), [str(good)])]
    assert ran.read_text().splitlines() == [str(good)]


def test_x4_only_a_name_ending_in_nvcc_is_one():
    """The loop's first test: a name from PATH that is not absolute or not .../nvcc is skipped."""
    for name, taken in (("/opt/a", False), ("/opt/nvcc-wrapper", False), ("nvcc", False), ("./nvcc", False),
                        ("/opt/cuda/bin/nvcc", True), ("/nvcc", True)):
        got = subprocess.run(["sh", "-c", 'c=$1; for n in "$c"; do case "$n" in /*/nvcc|/nvcc) ;; *) continue;; esac; '
                              'echo "$n"; done', "sh", name], capture_output=True, text=True).stdout
        assert (got == name + "\n") is taken, name
    assert 'for n in /usr/local/cuda*/bin/nvcc "$c"; do case "$n" in /*/nvcc|/nvcc) ;;' in CUDA_COMMAND


# ---------------------------------------------------------------- N1
def as_walked(name: str) -> str:
    """A name as the walk prints it: its trailing newlines gone ($(...)), ? where empty, each byte outside
    OWNER_CHARS a ?, at most OWNER_MAX bytes."""
    raw = name.rstrip("\n").encode() or b"?"
    keep = {c for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+ -"}
    assert OWNER_CHARS == "A-Za-z0-9._@+ -"
    return bytes(c if c in keep else ord("?") for c in raw)[:OWNER_MAX].decode()


def test_n1_an_owner_with_a_blank_or_over_64_characters_is_refused_naming_the_directory(tmp_path):
    ran = tmp_path / "ran"
    nvcc = executable(tmp_path / "cuda" / "bin" / "nvcc", NVCC.format(ran=ran))
    nvcc.parent.chmod(0o2775)
    bins = shim(tmp_path)
    for owner, group in (("john smith", "domain users"), ("x" * 70, "g" * 300),
                         ("eve\nunsafe name /etc", "staff:x /usr\n--- /a/nvcc /a/nvcc")):
        out = gathered(f"{bins}:{nvcc.parent}:/usr/bin:/bin", OWNER=owner, GROUP=group)
        (r,) = parse_refused_nvcc(out)
        assert (r["path"], r["dir"], r["mode"]) == (str(nvcc), str(nvcc.parent), "2775"), (owner, out)
        assert (r["owner"], r["group"]) == (as_walked(owner), as_walked(group))
        assert r["why"].startswith(f"{nvcc.parent} is 2775 ") and "writable by group" in r["why"]
        assert parse_cuda_toolkits(out) == [] and not ran.exists()
        assert len(cuda_sections(out)) == 1   # no section forged by a name's newline
    assert (r["owner"], r["group"]) == ("eve?unsafe name ?etc", "staff?x ?usr?--- ?a?nvcc ?a?nvcc")


@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=300),
       st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=80))
def test_n1_any_owner_and_group_give_a_refusal_line_that_reads(owner, group):
    """The walk's line over a 2775 directory whose owner and group names are any text (the host's, through
    sssd or LDAP): one line, read by _UNSAFE with the directory, the mode and each name as walked."""
    bins = _shim_once()
    out = subprocess.run(["sh", "-c", _WALK + 'rigup_walk "$1"; echo "unsafe $u"', "sh", "/usr/local"],
                         capture_output=True, text=True, timeout=20,
                         env={"PATH": f"{bins}:/usr/bin:/bin", "OWNER": owner, "GROUP": group}).stdout.splitlines()
    assert len(out) == 1, out
    (r,) = parse_refused_nvcc(["--- /usr/local/cuda/bin/nvcc /usr/local/cuda/bin/nvcc", *out])
    walked = [None if n == "?" else n for n in (as_walked(owner), as_walked(group))]
    assert (r["dir"], r["mode"], r["owner"], r["group"]) == ("/usr/local", "2775", *walked), out


_SHIM: list[Path] = []


def _shim_once() -> Path:
    """A stat that shows every directory as uid 1001, 2775, and the names of $OWNER and $GROUP."""
    if not _SHIM:
        where = Path(tempfile.mkdtemp(prefix="rigup-r8-"))
        atexit.register(shutil.rmtree, where, True)
        _SHIM.append(shim(where, "1001 2775"))
    return _SHIM[0]


LINES = st.lists(st.sampled_from(["--- /a/nvcc /a/nvcc", "--- /b/nvcc /c/nvcc", "unsafe ", "unsafe 0 2775 root:staff /x",
                                  "unsafe 1001 2775 john /usr/local", "unsafe 1 755 a b:c d /y", "unsafe name /l",
                                  "Cuda compilation tools, release 12.8, V12.8.93"]) | st.text(max_size=40), max_size=10)


@settings(max_examples=300)
@given(LINES)
def test_n1_every_section_with_an_unsafe_line_is_refused_and_never_a_toolkit(lines):
    """The reader's rule (never silently none): a section holding a line that starts ``unsafe`` is a refusal
    of its name, whether or not the line reads; no such section is a toolkit."""
    refused = parse_refused_nvcc(lines)
    unsafe = {seen for seen, _, body in cuda_sections(lines) if any(ln.startswith("unsafe") for ln in body)}
    assert {s for r in refused for s in r["seen_as"]} == unsafe
    assert all(r["dir"].startswith("/") and r["why"].startswith(r["dir"]) for r in refused)
    assert not unsafe & {s for t in parse_cuda_toolkits(lines) for s in t["seen_as"]}
