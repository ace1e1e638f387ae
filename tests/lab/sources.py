"""Sources the lab serves to its hosts over the lab network, made from registry packages.

- A git mirror of llama.cpp, made from the tree that the llama-cpp-python sdist on PyPI vendors
  (vendor/llama.cpp), with the tags the tests build: ``lab-base`` (the vendored tree as is),
  ``lab-bump`` (one source file touched: a ref bump that ccache and make mostly reuse) and
  ``lab-broken`` (a syntax error: a ref that does not compile), and two made from ``lab-base`` by
  a few lines of patch to ``src/llama-context.cpp`` and ``src/llama-model.cpp`` (:data:`CRASHES`): ``lab-crash``, whose
  llama-server passes ``--version`` and loads (its warm-up decodes 2 tokens) but raises SIGSEGV on
  the first decode of more than 2 tokens, the first real prompt; and ``lab-repack-crash``, the same
  only while weights are repacked (``use_extra_bufts``, what ``--no-repack`` turns off): llama.cpp's
  AMX/repack crash (upstream #20824) made to happen on any CPU; and ``lab-slow-decode``
  (:data:`SLOW`), which answers as lab-base does, each generated token taking 5x its time: a regression on purpose.
- A static file server (Python's http.server, git's dumb HTTP protocol) on the lab gateway,
  serving STATE/srv, so hosts clone ``http://GATEWAY:8000/llama.cpp.git`` with no proxy.

    python -m tests.lab sources      # make the mirror (cached) and start the server
"""

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.lab import lab

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
SRV = lab.STATE / "srv"
SRV_PORT = 8000
SRV_PID = lab.STATE / "srv.pid"
CACHE = Path(os.environ.get("RIGUP_LAB_CACHE", "/var/cache/rigup-lab"))
MIRROR = SRV / "llama.cpp.git"
TAGS = ("lab-base", "lab-bump", "lab-broken", "lab-crash", "lab-repack-crash", "lab-slow-decode")
BUMP_FILE = "tools/server/server.cpp"
CRASH_FILE = "src/llama-context.cpp"
DECODE = "int llama_context::decode(const llama_batch_ext & batch_inp) {\n"
# lab-repack-crash learns whether weights are repacked where the model loads (llama_model's params
# are not public): a global set next to the call that picks the CPU's buffer types
MODEL_FILE = "src/llama-model.cpp"
BUFTS = "    pimpl->cpu_buft_list = make_cpu_buft_list(devices, params.use_extra_bufts, params.no_host);\n"
CRASHES = {   # tag: the condition under which its first real decode raises SIGSEGV
    "lab-crash": "batch_inp.tokens.size() > 2",
    "lab-repack-crash": "rigup_lab_repack && batch_inp.tokens.size() > 2",
}

# lab-slow-decode: a build that answers as lab-base does, only slower: each decode call of one
# token (a generated token's, with one slot) sleeps, before it returns, 4x the time since the last
# decode ended (the token's whole cycle: the server's sampling and loop, then its decode) and 20 ms
# more, so each generated token takes 5x its time whatever the CPU's load; prompt batches and the
# warm-up are as fast as lab-base's. (A fixed sleep did not do: a lab CPU shared with the other
# lane and a client decoded lab-base at 5 tok/s at times, so 300 ms more per token measured 0.97x.
# Nor did 3x the decode's own time: the sampling outside it is not multiplied, and llama-server's
# rate, best of two under that load, measured 0.33x to 0.40x, at the test's 0.4 limit once in CI.
# The 20 ms are for a GPU, whose decode returns before its kernels are done.)
SLOW = ("    struct rigup_slow {  // rigup lab: lab-slow-decode\n"
        "        bool one_token;\n"
        "        ~rigup_slow() {\n"
        "            static std::chrono::steady_clock::time_point last;  // where the previous decode ended\n"
        "            if (one_token && last.time_since_epoch().count() != 0) {\n"
        "                std::this_thread::sleep_for(4 * (std::chrono::steady_clock::now() - last)\n"
        "                                            + std::chrono::milliseconds(20));\n"
        "            }\n"
        "            last = std::chrono::steady_clock::now();\n"
        "        }\n"
        "    } rigup_slow_guard{batch_inp.tokens.size() == 1};\n")


def slowed(text: str) -> str:
    """:data:`CRASH_FILE`'s text as lab-slow-decode has it (tests/gpu/check.py's ``slower`` makes
    the same tag from lab-base's archive on a machine without the mirror)."""
    assert DECODE in text, f"{CRASH_FILE}: llama_context::decode not found"
    return "#include <chrono>\n#include <thread>\n" + text.replace(DECODE, DECODE + SLOW, 1)


def url(path: str = "") -> str:
    """The URL lab hosts use for ``path`` under the served folder."""
    return f"http://{lab.GATEWAY}:{SRV_PORT}/{path}"


def sdist() -> Path:
    """The llama-cpp-python sdist, downloaded once from PyPI into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        lab.run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                "-d", CACHE, LLAMA_CPP_PYTHON)
        found = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "rigup lab", "GIT_AUTHOR_EMAIL": "lab@rigup.invalid",
           "GIT_COMMITTER_NAME": "rigup lab", "GIT_COMMITTER_EMAIL": "lab@rigup.invalid",
           "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z"}
    return lab.run("git", "-C", repo, *args, env=env).stdout.strip()


def llama_cpp_mirror() -> Path:
    """The bare git mirror with the lab tags (:data:`TAGS`); made once, kept across labs."""
    if MIRROR.exists() and SLOW in lab.run("git", "-C", MIRROR, "show", f"{TAGS[-1]}:{CRASH_FILE}",
                                           check=False).stdout:
        return MIRROR           # (an older mirror lacks the newer tags, or has another lab-slow-decode)
    with tempfile.TemporaryDirectory(dir=lab.STATE) as tmp:
        work = Path(tmp) / "llama.cpp"
        with tarfile.open(sdist()) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            keep = [m for m in members if m.name and m.name.split("/")[0] != ".git"]
            tar.extractall(work, members=keep, filter="data")
        lab.run("git", "init", "-q", "-b", "main", work)
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", f"llama.cpp as vendored by {LLAMA_CPP_PYTHON}")
        _git(work, "tag", TAGS[0])
        source = work / BUMP_FILE
        source.write_text(source.read_text() + "\n// rigup lab: a ref bump\n")
        _git(work, "commit", "-qam", "ref bump")
        _git(work, "tag", TAGS[1])
        source.write_text(source.read_text() + "\nthis does not compile;\n")
        _git(work, "commit", "-qam", "broken ref")
        _git(work, "tag", TAGS[2])
        crash = work / CRASH_FILE
        for tag, condition in CRASHES.items():
            _git(work, "checkout", "-q", "--detach", TAGS[0])
            text = crash.read_text()
            assert DECODE in text, f"{CRASH_FILE}: llama_context::decode not found"
            crash.write_text("#include <csignal>\nextern bool rigup_lab_repack;\n" + text.replace(
                DECODE, DECODE + f"    if ({condition}) {{ std::raise(SIGSEGV); }}  // rigup lab: {tag}\n", 1))
            model = work / MODEL_FILE
            text = model.read_text()
            assert BUFTS in text, f"{MODEL_FILE}: make_cpu_buft_list's call not found"
            model.write_text("bool rigup_lab_repack = false;\n" + text.replace(
                BUFTS, BUFTS + "    rigup_lab_repack = params.use_extra_bufts;  // rigup lab\n", 1))
            _git(work, "commit", "-qam", f"{tag}: SIGSEGV on the first real decode")
            _git(work, "tag", tag)
        _git(work, "checkout", "-q", "--detach", TAGS[0])
        text = crash.read_text()
        crash.write_text(slowed(text))
        _git(work, "commit", "-qam", "lab-slow-decode: every generated token takes 5x its time")
        _git(work, "tag", "lab-slow-decode")
        staging = Path(tmp) / "llama.cpp.git"
        lab.run("git", "clone", "-q", "--bare", work, staging)
        _git(staging, "update-server-info")
        SRV.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(MIRROR, ignore_errors=True)      # an older mirror, without the newer tags
        staging.rename(MIRROR)
    return MIRROR


def pid_alive(pid_file: Path) -> bool:
    """True while the process whose pid ``pid_file`` holds runs (the lab's servers)."""
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def stop_pid(pid_file: Path) -> None:
    """Stop the process whose pid ``pid_file`` holds, if it runs, and remove the file."""
    if pid_alive(pid_file):
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    pid_file.unlink(missing_ok=True)


def serve() -> str:
    """Start the file server on the gateway (the lab bridge must be up); return its base URL."""
    SRV.mkdir(parents=True, exist_ok=True)
    if not pid_alive(SRV_PID):
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", str(lab.GATEWAY), "--directory", SRV,
             str(SRV_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL, start_new_session=True)
        SRV_PID.write_text(str(proc.pid))
    return url()


def stop() -> None:
    """Stop the file server, if it runs."""
    stop_pid(SRV_PID)


if __name__ == "__main__":
    print(llama_cpp_mirror())
    print(serve())
