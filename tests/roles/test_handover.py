"""roles/llama_cpp's builds handed from host to host (issue 51) on the lab: one lab host compiles
the session's build, and the other (the same profile) receives it, smokes it and serves with it,
without build tools; a build variant compiled on the compiling host is then refused by the other
when the controller's copy was tampered with, and when the compiling host offers another build
under its key, and a CPU lacking a flag the build uses compiles instead of receiving it (a reduced
/proc/cpuinfo: the lab's simulated CPU flags). Each refusal compiles on the receiving host, reusing
its work tree after the first. Which host compiled is read from the records (first_converge's lab1
alone first, but a module's converge of both in one run, as test_balancer's, lets whichever host
claims the build first compile it: handover._source). Figures printed: which host compiled, the
artifact's size and where each build came from."""

import json
import re

import pytest

from tests.conftest import on_host
from tests.converge import pyinfra

pytestmark = pytest.mark.lab
DIR = "/opt/rigup/llama.cpp"
# fewer targets than group_vars/lab.yml's: a build id of its own (the id covers the targets) with
# the default build's CMake options, so a host that compiled that build compiles this one in the
# same work tree, linking nothing anew (a CMake entry of its own cost a fresh configure and every
# object from the ccache: about 15 s of the compiling host's fixture and of the one-run test's compile)
VARIANT = 'llama_cpp_targets=["llama-server", "llama-gguf-split"]'


def records(lab) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((lab.STATE / "artifacts").glob("*.json"))]


def handed(lab) -> tuple[str, str, str]:
    """(the host that compiled, the host that received, the build's target) for the build the lab's
    two hosts serve: the compiling host is the one the controller's artifact record names (the
    tests assert the other holds rigup-received.json naming it)."""
    names = [h["name"] for h in lab.hosts()[:2]]
    target = on_host(lab, names[0], f"readlink {DIR}/current").strip()
    [doc] = [r for r in records(lab) if r["build_id"] == target.split("/")[1]]
    assert doc["host"] in names, (doc["host"], names)
    return doc["host"], next(n for n in names if n != doc["host"]), target


def converge(host, *data, check=True, hosts=()):
    run = pyinfra("inventory/lab.py", "deploy.py", *[a for h in (host, *hosts) for a in ("--limit", h)],
                  *[a for d in data for a in ("--data", d)])
    if check:
        assert run.returncode == 0, run.output[-4000:]
    return run


def test_a_host_of_the_same_key_receives_the_build_smokes_it_and_serves(lab, first_converge):
    """Whichever module converged the hosts first (first_converge, lab1 alone then both, or a
    module's own converge of both in one run), the host that did not compile received the build."""
    first, second, target = handed(lab)
    assert on_host(lab, second, f"readlink {DIR}/current").strip() == target
    build = target.split("/")[1]
    got = json.loads(on_host(lab, second, f"cat {DIR}/{target}/rigup-received.json"))
    [doc] = [r for r in records(lab) if r["build_id"] == build]
    print(f"\n{first} compiled, {second} received {build} from {got['from']}: {doc['size'] / 2**20:.1f} MiB, "
          f"sha256 {doc['sha256'][:12]}, commit {doc['commit'][:12]}, built in "
          f"{json.loads(on_host(lab, first, f'cat {DIR}/{target}/rigup-build.json'))['seconds']} s on {first}")
    assert got["from"] == first and got["sha256"] == doc["sha256"] and got["key"] == doc["key"]
    assert re.fullmatch(r"[0-9a-f]{40}", doc["commit"]) and doc["runtime"]["cpu_flags"] is not None
    assert not on_host(lab, first, f"ls {DIR}/{target}/rigup-received.json 2>/dev/null; true").strip()
    # no build tools where it was received (unless a module before this one compiled another
    # build on it); the smoke passed there, and it serves
    compiled = on_host(lab, second, f"for d in {DIR}/builds/*/; do [ -e $d/rigup-build.json ] && "
                                    "[ ! -e $d/rigup-received.json ] && echo $d; done; true").split()
    if not compiled:
        assert lab.ssh(second, "command -v cmake || command -v c++").returncode != 0
    assert json.loads(on_host(lab, second, f"cat {DIR}/{target}/rigup-smoke.json"))["ok"]
    answer = on_host(lab, second, "curl -s http://127.0.0.1:8081/v1/completions -H 'Content-Type: application/json' "
                                  "-d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 4}'")
    assert json.loads(answer)["usage"]["completion_tokens"] > 0


@pytest.fixture(scope="module")
def variant(lab, second_converge):
    """The variant compiled and proved on the host that compiled the default build (its work tree;
    its record in the controller's cache); the other host back on the default build after the
    module, its CPU flags its own again."""
    first, second, default = handed(lab)
    print(f"\n{first} compiled the default build, {second} received it")
    run = converge(first, VARIANT)
    build = on_host(lab, first, f"readlink {DIR}/current").strip().split("/")[1]
    assert "kept as artifact" in run.output, run.output[-3000:]
    [doc] = [r for r in records(lab) if r["build_id"] == build]
    yield {"build": build, "record": doc, "first": first, "second": second, "default": default}
    lab.ssh(second, "umount /proc/cpuinfo 2>/dev/null; true")
    converge(first, hosts=[second])     # both have the default build: one run switches each back


def _forgotten(lab, variant):
    """The receiving host serves the default build and has no copy of the variant: it needs it again."""
    second = variant["second"]
    if on_host(lab, second, f"readlink {DIR}/current").strip() != variant["default"]:
        converge(second)     # off the variant (at the module's first test it serves the default already)
    on_host(lab, second, f"rm -rf {DIR}/builds/{variant['build']} {DIR}/builds/{variant['build']}.refused")


def _compiled_instead(lab, run, variant, reason: str):
    second, build = variant["second"], variant["build"]
    assert run.returncode == 0, run.output[-4000:]
    assert on_host(lab, second, f"readlink {DIR}/current").strip() == f"builds/{build}"
    assert not on_host(lab, second, f"ls {DIR}/builds/{build}/rigup-received.json 2>/dev/null; true").strip()
    assert json.loads(on_host(lab, second, f"cat {DIR}/builds/{build}/rigup-smoke.json"))["ok"]
    assert reason in run.output, run.output[-4000:]


def test_a_cpu_without_a_flag_the_build_uses_compiles_instead_of_receiving(lab, variant):
    second = variant["second"]
    _forgotten(lab, variant)
    flags = variant["record"]["runtime"]["cpu_flags"]
    dropped = flags[-1]     # a flag the compiling host's CPU (the machine's) has and the build used
    on_host(lab, second, "umount /proc/cpuinfo 2>/dev/null; sed -E '/^flags/ s/ " + dropped + r"( |$)/ /' "
            "/proc/cpuinfo > /etc/rigup-lab/cpuinfo && mount --bind /etc/rigup-lab/cpuinfo /proc/cpuinfo")
    assert dropped not in on_host(lab, second, "grep -m1 ^flags /proc/cpuinfo").split()
    run = converge(second, VARIANT, check=False)
    line = next((ln for ln in run.output.splitlines() if f"llama.cpp {variant['build']}: compile" in ln), None)
    print(f"\nwithout {dropped}: {line and line.strip()}")
    _compiled_instead(lab, run, variant, f"{variant['first']}'s build cannot run here: it uses {dropped}, "
                                         "which this CPU lacks")
    on_host(lab, second, "umount /proc/cpuinfo")


def test_a_tampered_copy_on_the_controller_is_refused_and_compiled_instead(lab, variant):
    _forgotten(lab, variant)
    cached = lab.STATE / "artifacts" / f"{variant['record']['key']}.tar.gz"
    if not cached.exists():     # an earlier test's refusal removed it: the compiling host's copy is the same bytes
        cached.write_bytes(on_host_bytes(lab, variant["first"], f"{DIR}/artifacts/{variant['record']['key']}.tar.gz"))
    with open(cached, "ab") as f:
        f.write(b"\0tampered")
    run = converge(variant["second"], VARIANT, check=False)
    print(f"\ntampered copy: {next((ln.strip() for ln in run.output.splitlines() if 'refused the artifact' in ln), None)}")
    _compiled_instead(lab, run, variant, "the controller's copy is not the one it recorded")
    assert not cached.exists()


def test_a_peer_offering_another_build_under_the_key_is_refused_and_compiled_instead(lab, variant):
    _forgotten(lab, variant)
    first, key = variant["first"], variant["record"]["key"]
    (lab.STATE / "artifacts" / f"{key}.tar.gz").unlink(missing_ok=True)     # the controller's copy is gone
    other = next(r for r in records(lab) if r["key"] != key and r["host"] == first)   # it offers another build
    on_host(lab, first, f"cp {DIR}/artifacts/{key}.tar.gz /root/kept.tar.gz && "
                        f"cp {DIR}/artifacts/{other['key']}.tar.gz {DIR}/artifacts/{key}.tar.gz")
    try:
        run = converge(variant["second"], VARIANT, check=False)
    finally:
        on_host(lab, first, f"mv /root/kept.tar.gz {DIR}/artifacts/{key}.tar.gz")
    print(f"\npeer's offer: {next((ln.strip() for ln in run.output.splitlines() if 'refused the artifact' in ln), None)}")
    _compiled_instead(lab, run, variant, f"{first} offered a build whose sha256 is {other['sha256'][:12]}, "
                                         f"not the recorded {variant['record']['sha256'][:12]}")


def on_host_bytes(lab, name: str, path: str) -> bytes:
    import subprocess
    return subprocess.run(lab.ssh_argv(name) + ["--", f"cat {path}"], capture_output=True, check=True).stdout


def test_the_compiling_hosts_own_copy_is_received_when_the_controllers_is_gone(lab, variant):
    """The compiling host is outside the converge's --limit: the controller connects to it for the
    copy alone."""
    _forgotten(lab, variant)
    second, key = variant["second"], variant["record"]["key"]
    (lab.STATE / "artifacts" / f"{key}.tar.gz").unlink(missing_ok=True)
    run = converge(second, VARIANT)
    print(f"\nfrom the peer: {next((ln.strip() for ln in run.output.splitlines() if 'received from' in ln), None)}")
    assert f"llama.cpp {variant['build']}: received from {variant['first']}" in run.output
    assert f"llama.cpp {variant['build']}: from {variant['first']} (" in run.output      # the plan's line
    got = json.loads(on_host(lab, second, f"cat {DIR}/builds/{variant['build']}/rigup-received.json"))
    assert got["sha256"] == variant["record"]["sha256"]
    assert (lab.STATE / "artifacts" / f"{key}.tar.gz").exists()     # the controller keeps its copy again


def test_in_one_run_the_compiling_host_packs_before_the_other_receives(lab, variant):
    """Both hosts in one converge, a build neither has: one compiles it (the first the play
    reaches), and the other, with fewer operations before its turn, receives it only once the
    first packed it (handover.handed_over)."""
    hosts = [variant["first"], variant["second"]]
    other = 'llama_cpp_targets=["llama-server"]'     # another build id, in the same work tree as VARIANT
    run = pyinfra("inventory/lab.py", "deploy.py", "--limit", hosts[0], "--limit", hosts[1], "--data", other)
    assert run.returncode == 0, run.output[-4000:]
    build = on_host(lab, hosts[0], f"readlink {DIR}/current").strip().split("/")[1]
    lines = [ln for ln in run.output.splitlines() if f"llama.cpp {build}:" in ln]
    kept = [i for i, ln in enumerate(lines) if "kept as artifact" in ln]
    got = [i for i, ln in enumerate(lines) if "received from" in ln]
    assert len(kept) == 1 and len(got) == 1 and kept[0] < got[0], "\n".join(lines)
    packer = next(h for h in hosts if f"[{h}]" in lines[kept[0]])
    receiver = next(h for h in hosts if h != packer)
    print(f"\none run of both: {lines[kept[0]].strip()}, then {lines[got[0]].strip()}")
    assert f"[{receiver}] llama.cpp {build}: received from {packer}" in lines[got[0]]
    assert on_host(lab, receiver, f"readlink {DIR}/current").strip() == f"builds/{build}"
    # both back on the module's build: the variant fixture's teardown converges each
