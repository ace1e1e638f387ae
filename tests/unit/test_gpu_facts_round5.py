"""Host facts of round 5 (issue 61): a listener's name counts as a unit's only where no login user
chose it (A25), and the CPU's counts are bounded (A14)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from rigup.gpu.facts import CPUS_MAX, MEM_KIB_MAX, parse_cpu, parse_listening_ports
from rigup.refusal import Port
from roles.preflight.checks import port_refusals

CLAIM = Port(8080, "llama_server_instances.gemma", ("llama-server",))


def ss(uid: str = "") -> list[str]:
    """ss -Hltnpe's line of a process named llama-server on 8080 (``uid``: ss's ``uid:N``, none for root)."""
    return ["ss", f'LISTEN 0 5 127.0.0.1:8080 0.0.0.0:* users:(("llama-server",pid=4242,fd=3)) {uid} ino:81 sk:1 '
                  'cgroup:/user.slice <->']


def test_a_login_users_process_named_as_the_unit_is_refused_its_port():
    """A25: a process any user named llama-server (prctl, exec -a) passed preflight as the instance's own."""
    for uid, refused in (("uid:1000", True), ("uid:65534", True), ("uid:999", True), ("", False)):   # 999: re5 N1
        ports = parse_listening_ports(ss(uid))
        found = port_refusals([CLAIM], {"listening_ports": ports})
        print(f"{uid or 'root'}: {ports} -> {[r.line('h') for r in found]}")
        assert bool(found) == refused and (not found or "(uid " in found[0].why)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["llama-server", "haproxy", "vllm", "x"]), uid=st.integers(0, 2**32 - 1))
def test_any_listener_of_a_login_user_is_never_a_units_own(name, uid):
    line = f'LISTEN 0 5 0.0.0.0:8080 0.0.0.0:* users:(("{name}",pid=1,fd=3))' + (f" uid:{uid}" if uid else "") + " ino:81 sk:1"
    got = parse_listening_ports(["ss", line])[8080]
    assert (got == name) == (uid == 0)   # any account's but root's is named with it (re5 N1)


def test_cpu_counts_past_any_host_are_unknown():
    """A14: 10^18 threads and NUMA nodes and a MemTotal of ~1e18 bytes were planned."""
    c = parse_cpu(["--- numa", "999999999999999999", "--- logical", "999999999999999999",
                   "--- memory", "MemTotal: 999999999999999 kB"])
    print("read:", c["logical"], c["numa_nodes"], c["mem_bytes"])
    assert c["logical"] is None and c["numa_nodes"] is None and c["mem_bytes"] is None
    c = parse_cpu(["--- numa", "8", "--- logical", "512", "--- memory", "MemTotal: 2113929216 kB"])
    assert (c["logical"], c["numa_nodes"], c["mem_bytes"]) == (512, 8, 2113929216 * 1024)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**18), kib=st.integers(0, 10**15))
def test_any_cpu_count_reads_within_bounds(n, kib):
    c = parse_cpu(["--- numa", str(n), "--- logical", str(n), "--- memory", f"MemTotal: {kib} kB"])
    assert c["logical"] in (None, n) and (c["logical"] or 0) <= CPUS_MAX
    assert c["mem_bytes"] in (None, kib * 1024) and (c["mem_bytes"] or 0) <= MEM_KIB_MAX * 1024


def test_an_nvcc_root_does_not_own_alone_is_neither_run_nor_a_toolkit(tmp_path):
    """A8: an nvcc at /tmp/x/nvcc on PATH became the build's CMAKE_CUDA_COMPILER (and was run as root
    for its version); a release 9999.9999 met every min_cuda."""
    import os
    import subprocess
    from rigup.gpu.facts import CUDA_COMMAND, parse_cuda_toolkits
    ran = tmp_path / "ran"
    nvcc = tmp_path / "x" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f'#!/bin/sh\ntouch {ran}\necho "Cuda compilation tools, release 12.8, V12.8.93"\n')
    nvcc.chmod(0o755)
    for mode in (0o1777, 0o775, 0o757):
        nvcc.parent.chmod(mode)
        out = subprocess.run(["sh", "-c", CUDA_COMMAND], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PATH": f"{nvcc.parent}:/usr/bin:/bin"}).stdout.splitlines()
        found = parse_cuda_toolkits(out)
        print(f"{nvcc} in a {oct(mode)} directory: {[ln for ln in out if ln.startswith('unsafe')]}, toolkits {found}")
        assert str(nvcc) not in {t["path"] for t in found} and not ran.exists()
    assert parse_cuda_toolkits(["--- /usr/bin/nvcc /usr/bin/nvcc", "Cuda compilation tools, release 9999.9999, V9999.1"]) == []
    assert parse_cuda_toolkits(["--- /usr/bin/nvcc /usr/bin/nvcc", "unsafe /usr",
                                "Cuda compilation tools, release 12.8, V12.8.93"]) == []
    assert parse_cuda_toolkits(["--- /usr/bin/nvcc /usr/bin/nvcc", "Cuda compilation tools, release 12.8, V12.8.93"])
