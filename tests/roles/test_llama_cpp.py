"""roles/llama_cpp on the lab: a CPU build from the lab's mirror, then a ref bump, a ref that
does not compile, a rollback, and a build that outlives its SSH session.

Builds are timed and printed (pytest -s shows them); they are checked by what changed, not by
how long they took.
"""

import re
import signal
import subprocess
import time

import pytest

from tests.conftest import on_host
from tests.converge import PYINFRA, ROOT, pyinfra
from tests.lab import sources

pytestmark = pytest.mark.lab
DIR = "/opt/rigup/llama.cpp"


@pytest.fixture(scope="module")
def host(lab, second_converge):
    """The first lab host; converged back to the default build once, when the module is done (the
    tests leave other builds current: a bump, a rollback, other options, an archive's; none needs the
    default build first: test_back_to_the_default_ref_builds_nothing converges to it itself)."""
    name = lab.hosts()[0]["name"]
    yield name
    converge_one(name)


def current(lab, host):
    return on_host(lab, host, f"readlink {DIR}/current").strip()


def previous(lab, host):
    return on_host(lab, host, f"readlink {DIR}/previous").strip()


def converge_one(host, *data, check=True):
    args = [a for d in data for a in ("--data", d)]
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host, *args)
    if check:
        assert run.returncode == 0, run.output[-4000:]
    return run


def test_first_build_serves_from_current(lab, first_converge):
    for h in lab.hosts():
        target = current(lab, h["name"])
        assert re.fullmatch(r"builds/lab-base-[0-9a-f]{10}", target)
        version = on_host(lab, h["name"], f"{DIR}/current/bin/llama-server --version 2>&1")
        assert version.startswith("version: ")
        bins = on_host(lab, h["name"], f"ls {DIR}/current/bin").split()
        assert {"llama-server", "llama-bench", "llama-gguf-split", "ggml-rpc-server"} <= set(bins)
        # static: the binary moves with its directory (no libllama/libggml to find)
        assert "libllama" not in on_host(lab, h["name"], f"ldd {DIR}/current/bin/llama-server")
    print(f"\nfirst converge (cold build on {len(lab.hosts())} hosts): {first_converge.seconds:.0f} s")


def test_unchanged_rerun_builds_nothing(second_converge):
    built = [op for op in second_converge.changed_operations() if "Build llama.cpp" in op]
    assert built == []


def test_ref_bump_rebuilds_and_switches(lab, host):
    before = current(lab, host)
    run = converge_one(host, "llama_cpp_ref=lab-bump")
    assert any("Build llama.cpp" in op for op in run.changed_operations())
    assert current(lab, host).startswith("builds/lab-bump-")
    assert previous(lab, host) == before
    print(f"\nref bump converge (incremental build, ccache): {run.seconds:.1f} s")


def test_a_ref_that_does_not_compile_keeps_the_old_build(lab, host):
    before = current(lab, host)
    run = converge_one(host, "llama_cpp_ref=lab-broken", check=False)
    assert run.returncode != 0
    assert "llama.cpp build lab-broken-" in run.output and "failed; last lines" in run.output
    assert "this does not compile" in run.output  # the compiler's own error line
    assert current(lab, host) == before
    on_host(lab, host, f"{DIR}/current/bin/llama-server --version")


@pytest.fixture
def bumped(lab, host):
    """lab-bump built and ``current``, the build before it ``previous``: what
    test_ref_bump_rebuilds_and_switches leaves; made here when this test runs without it."""
    if not current(lab, host).startswith("builds/lab-bump-"):
        converge_one(host, "llama_cpp_ref=lab-bump")
    return previous(lab, host)


def test_rollback_switches_back_and_is_idempotent(lab, host, bumped):
    target = bumped
    run = converge_one(host, "llama_cpp_ref=lab-bump", "llama_cpp_rollback=true")
    assert current(lab, host) == target
    again = converge_one(host, "llama_cpp_ref=lab-bump", "llama_cpp_rollback=true")
    assert again.totals["changed"] == 0, again.changed_operations()
    assert run.totals["changed"] >= 1


def test_back_to_the_default_ref_builds_nothing(lab, host):
    run = converge_one(host)
    assert [op for op in run.changed_operations() if "Build llama.cpp" in op] == []
    assert current(lab, host).startswith("builds/lab-base-")


def test_a_build_outlives_its_ssh_session(lab, host):
    """Kill pyinfra (and so its SSH session) mid-build: the build unit goes on; the next converge
    waits for it and finds the build done."""
    options = 'llama_cpp_cmake_options=["LLAMA_BUILD_TOOLS=ON"]'  # a new build id: a full build
    proc = subprocess.Popen([PYINFRA, "-y", "inventory/lab.py", "deploy.py", "--limit", host,
                             "--data", options], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if lab.ssh(host, "systemctl is-active -q rigup-llama-build").returncode == 0:
            break
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the build unit never started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(2)
    assert lab.ssh(host, "systemctl is-active -q rigup-llama-build").returncode == 0
    run = converge_one(host, options)
    assert lab.ssh(host, "systemctl is-active -q rigup-llama-build").returncode != 0
    stamps = on_host(lab, host, f"ls {DIR}/builds/*/rigup-build.json | wc -l")
    assert int(stamps) >= 3  # lab-base, lab-bump, and this one
    assert current(lab, host) != ""
    assert run.returncode == 0


def test_an_offline_archive_builds_without_git(lab, host, tmp_path):
    """llama_cpp_archive: a .tar.gz on the controller is uploaded and built; no git involved."""
    archive = tmp_path / "llama.cpp.tar.gz"
    subprocess.run(f"git -C {sources.llama_cpp_mirror()} archive --prefix=llama.cpp/ lab-base"
                   f" | gzip -1 > {archive}", shell=True, check=True)
    run = converge_one(host, f"llama_cpp_archive={archive}")
    assert any("Build llama.cpp" in op for op in run.changed_operations())
    stamp = on_host(lab, host, f"cat {DIR}/current/rigup-build.json")
    assert '"commit": "archive"' in stamp
    on_host(lab, host, f"{DIR}/current/bin/llama-server --version")
    print(f"\narchive build (ccache warm): {run.seconds:.0f} s")


def test_dry_run_shows_the_cuda_archs_of_each_host(lab):
    """An a100 host builds for 80 and an h100 host for 90: what `--dry` says the role would run."""
    extra = f"lab{len(lab.hosts()) + 1}"
    lab.up(1, "h100", first=len(lab.hosts()) + 1)
    try:
        run = pyinfra("inventory/lab.py", "deploy.py", "--dry", "--limit", "lab1", "--limit", extra,   # lab2: lab1's kind
                      "--data", "llama_cpp_backend=cuda", "--data", "cuda_source=distro", yes=False)
    finally:
        lab.remove(extra)
    assert run.returncode == 0, run.output[-3000:]
    for host, arch in (("lab1", "80"), (extra, "90")):
        line = re.search(rf"\[{host}\] llama.cpp lab-base-\w+: cmake (.*)", run.output).group(1)
        assert f"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES={arch} " in line and "native" not in line
