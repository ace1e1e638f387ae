"""Shared fixtures. The lab is booted once per test run, converged once, and always destroyed.

Lab tests take over the machine's lab: a lab left by `make demo` is removed first.
"""

import contextlib
import os

import pytest

from tests.converge import converge

LAB_HOSTS = 2
LAB_PROFILE = "a100"


@pytest.fixture(scope="session")
def lab(request):
    """The lab module, with LAB_HOSTS hosts of LAB_PROFILE running; torn down at the end."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (systemd-nspawn, network namespaces)")
    from tests.lab import lab as lab_module

    from tests.lab import hub, models, sources

    lab_module.down()
    try:
        lab_module.up(LAB_HOSTS, LAB_PROFILE)
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        request.session.rigup_lab = lab_module
        yield lab_module
    finally:
        lab_module.down()
    assert_nothing_left(lab_module)


@pytest.fixture(scope="module", autouse=True)
def extra_hosts_removed(request):
    """A host a module booted beyond lab1..lab<LAB_HOSTS> (a gateway, a bare neighbour) goes when the
    module ends, so the next module boots the profile it asks for in its place."""
    yield
    lab_module = getattr(request.session, "rigup_lab", None)
    base = {f"lab{i}" for i in range(1, LAB_HOSTS + 1)}
    for host in lab_module.hosts() if lab_module else []:
        if host["name"] not in base:
            print(f"\n{request.module.__name__} left {host['name']} running: removed")
            lab_module.remove(host["name"])


def assert_nothing_left(lab_module):
    """After `down`: no lab namespace, link, mount or process; the base root stays cached."""
    import subprocess

    assert not lab_module.STATE_FILE.exists() and lab_module.hosts() == []
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert lab_module.NETNS not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {lab_module.VETH}" not in links and lab_module.BRIDGE not in links
    assert lab_module.lab_mounts() == []
    # this lab's own processes (another lab's may name this one's paths in their argv)
    leftovers = [pid for program in ("systemd-nspawn", "tinyproxy", "apt-cacher-ng") for pid in lab_module.lab_pids(program)]
    assert leftovers == [] and lab_module.file_server_pids() == []
    assert lab_module.base_is_cached()


@pytest.fixture(scope="session")
def first_converge(lab):
    """deploy.py applied once to every lab host (the slow part, shared by every role's tests).
    The first host goes alone and compiles llama.cpp; the others receive its build
    (roles/llama_cpp/handover.py)."""
    first = converge("inventory/lab.py", "--limit", lab.hosts()[0]["name"])
    rest = converge()
    rest.seconds += first.seconds
    return rest


@pytest.fixture(scope="session")
def second_converge(first_converge):
    """deploy.py applied again: idempotence is judged on this run."""
    return converge()


def on_host(lab, name: str, command: str) -> str:
    """stdout of ``command`` run over SSH on lab host ``name``; fails the test if it fails."""
    result = lab.ssh(name, command)
    assert result.returncode == 0, f"{name}: {command!r} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


FLEET_HOSTS, FLEET_FIRST = 8, 11


@pytest.fixture(scope="module")
def fleet():
    """FLEET_HOSTS fresh a100 lab hosts lab11.., booted for one test module next to the session
    lab's hosts (or alone), and removed after it; the whole lab goes when nothing else runs."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (systemd-nspawn, network namespaces)")
    from tests.lab import lab as lab_module

    names = [f"lab{i}" for i in range(FLEET_FIRST, FLEET_FIRST + FLEET_HOSTS)]
    try:
        lab_module.up(FLEET_HOSTS, "a100", first=FLEET_FIRST)
        yield [h for h in lab_module.hosts() if h["name"] in names]
    finally:
        if {h["name"] for h in lab_module.hosts()} <= set(names):
            lab_module.down()
        else:
            for name in names:
                lab_module.remove(name)


def limit(hosts) -> list[str]:
    """pyinfra's ``--limit`` arguments for ``hosts`` (lab host dicts)."""
    return [arg for h in hosts for arg in ("--limit", h["name"])]


def pytest_terminal_summary(terminalreporter):
    """What each passed lab test printed (its figures: seconds, bytes, failed requests), at the end
    of the run's log, which CI keeps; at most 40 lines a test."""
    reports = [r for r in terminalreporter.stats.get("passed", [])
               if r.when == "call" and "lab" in r.keywords and r.capstdout.strip()]
    if reports:
        terminalreporter.section("figures the lab tests printed")
        for report in reports:
            lines = report.capstdout.strip().splitlines()
            terminalreporter.write_line(f"{report.nodeid} ({report.duration:.0f} s)")
            for line in lines[-40:]:
                terminalreporter.write_line(f"    {line}")
    module_time_table(terminalreporter)


# Where the minutes go: wall and CPU per test module, printed at the end of every run (issue 45).
# Two CPU figures: the whole machine's (/proc/stat, every core, busy jiffies: what a machine given
# to the run pays, the other lane included), and this lane's own: its lab's hosts (their cgroup v2
# parent, tests/lab/lab.py CGROUP: the hosts' processes are not the runner's children) and the
# runner with what it ran and waited for (pyinfra, ssh: os.times' children).
_MODULE_TIMES: dict[str, list[float]] = {}


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _lane_seconds() -> float:
    from tests.lab import lab

    hosts = 0.0
    for top in lab.cgroups():
        with contextlib.suppress(OSError, ValueError, IndexError):
            hosts += int(next(line for line in open(top / "cpu.stat") if line.startswith("usage_usec")).split()[1]) / 1e6
    t = os.times()
    return hosts + t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Adds each test's setup, call and teardown (module and session fixtures included, charged
    to the module whose test set them up or tore them down) to its module's wall and CPU."""
    import time

    wall, cpu, own = time.monotonic(), _machine_busy_seconds(), _lane_seconds()
    yield
    entry = _MODULE_TIMES.setdefault(item.nodeid.split("::", 1)[0], [0.0, 0.0, 0.0, 0])
    entry[0] += time.monotonic() - wall
    entry[1] += _machine_busy_seconds() - cpu
    entry[2] += max(0.0, _lane_seconds() - own)   # a lab torn down takes its cgroup's count with it
    entry[3] += 1


def module_time_table(terminalreporter):
    """The table, last in the log (so CI's tail shows it), with the total."""
    if not _MODULE_TIMES:
        return
    terminalreporter.section("time per test module, slowest first (wall; CPU of the whole machine; of this lane)")
    rows = sorted(_MODULE_TIMES.items(), key=lambda kv: -kv[1][0])
    for module, (wall, cpu, own, tests) in rows:
        terminalreporter.write_line(f"{wall:8.1f} s wall {cpu:8.1f} s CPU {own:8.1f} s lane {tests:5d} tests  {module}")
    wall, cpu, own = (sum(r[1][i] for r in rows) for i in range(3))
    terminalreporter.write_line(f"{wall:8.1f} s wall {cpu:8.1f} s CPU {own:8.1f} s lane "
                                f"{sum(r[1][3] for r in rows):5d} tests  total ({wall / 60:.1f} min)")
