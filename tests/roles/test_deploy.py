"""The whole play on the lab: a converge that has nothing to do changes nothing, quickly; an
inventory written as the README says, and the README's commands on it."""

import os
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.lab


def test_second_converge_changes_nothing(second_converge):
    totals = second_converge.totals
    assert totals["changed"] == 0, second_converge.changed_operations()
    assert totals["errors"] == 0
    print(f"\nsecond converge of the whole play: {second_converge.seconds:.1f} s")


def test_hosts_without_nvswitch_get_nothing_of_the_fabric(lab, second_converge):
    """issue 48: the a100 lab hosts (no NVSwitch on their PCI bus) have no fabric manager package or
    unit, their serving unit is not ordered after one, and their plan has no fabric line."""
    from tests.conftest import on_host

    name = lab.hosts()[0]["name"]
    found = on_host(lab, name, "dpkg -l 'nvidia-fabricmanager*' 2>/dev/null | grep -c '^ii'; "
                               "systemctl cat nvidia-fabricmanager.service >/dev/null 2>&1 && echo unit || echo no-unit; "
                               "grep -c fabricmanager /etc/systemd/system/rigup-llama@.service; true").split()
    print(f"{name}: fabric manager packages {found[0]}, {found[1]}, serving unit lines naming it {found[2]}")
    assert found == ["0", "no-unit", "0"]
    assert "fabric:" not in second_converge.output


# A host of the lab's inventory at an address where nothing answers: to the controller, what a host
# whose link is cut is (no answer to ARP, nor to SSH), without booting one to cut it.
UNREACHABLE = """
_gone = ({name!r}, {{**_base["lab"][0][0][1], "ssh_hostname": {address!r}}})
a100 = (a100[0] + [_gone], a100[1])
lab = (lab[0] + [_gone], lab[1])
all = (all[0] + [_gone[0]], all[1])
"""


def test_a_fleet_run_says_what_happened_to_each_host(lab, second_converge, tmp_path):
    """4 hosts: two converged ones, one that does not answer (its link cut: an address of the
    lab's network where no host answers) and one whose llama.cpp build fails (a ref that does not
    exist; booted from a copy of lab2's disk, so that its run reaches the build without converging
    a bare host first). The two go on; the last lines name the other two with their reasons;
    pyinfra exits non-zero."""
    import json

    from tests.bench_fleet import seed_from
    from tests.converge import ROOT, pyinfra
    from tests.roles.test_model_fetch import INVENTORY   # the lab's inventory with per-host data
    good = [h["name"] for h in lab.hosts()[:2]]
    first = max(int(h["name"].removeprefix("lab")) for h in lab.hosts()) + 1
    broken, cut = f"lab{first}", f"lab{first + 1}"
    lab.up(1, "a100", first=first, seed=seed_from(good[1]))
    try:
        inventory = tmp_path / "fleet.py"
        inventory.write_text(INVENTORY.format(lab_inventory=str(ROOT / "inventory/lab.py"),
                                              extra=json.dumps({broken: {"llama_cpp_ref": "no-such-ref"}}))
                             + UNREACHABLE.format(name=cut, address=lab.address(cut)))
        run = pyinfra(str(inventory), "deploy.py", *(a for h in [*good, cut, broken] for a in ("--limit", h)),
                      timeout=1500)
        summary = run.output.split("--> rigup: what happened to each host", 1)[-1]
        print(f"\nfleet run in {run.seconds:.0f} s, exit {run.returncode}:{summary}")
        assert run.returncode != 0
        for name in good:
            assert f"[{name}] unchanged" in summary, (summary, run.changed_on(name))
        assert re.search(rf"\[{cut}\] unreachable: .*(timed out|No route|Unable to connect|refused)", summary), summary
        assert re.search(rf"\[{broken}\] failed at .*llama.cpp.*no-such-ref", summary, re.S), summary
    finally:
        lab.remove(broken)


def test_the_converge_lock_is_a_lease(lab, second_converge):
    """Another controller holds the host's converge lock (its own SSH channel, as rigup/lock.py
    takes it, from a network namespace of its own on the lab bridge, renewing every second with a
    10 s lease): a converge is refused, naming it, and changes nothing. Its link is cut (``ip link
    set ... down``): the next converge takes the lock within the lease, naming the stale holder. A
    holder killed with -9: the next converge proceeds at once."""
    import subprocess
    import threading
    import time

    from rigup.lock import holder_command
    from tests.converge import converge, pyinfra
    host = lab.hosts()[0]["name"]
    netns, veth, address = f"{lab.NETNS}ctl", f"{lab.VETH}ctl", str(lab.SUBNET[250])
    for cmd in (["netns", "add", netns], ["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns],
                ["link", "set", veth, "master", lab.BRIDGE, "up"],
                ["-n", netns, "addr", "add", f"{address}/{lab.SUBNET.prefixlen}", "dev", "eth0"],
                ["-n", netns, "link", "set", "eth0", "up"], ["-n", netns, "link", "set", "lo", "up"]):
        lab.run("ip", *cmd)

    def holder(owner, netns=None, lease=10):
        argv = (["ip", "netns", "exec", netns] if netns else []) + lab.ssh_argv(host) + [
            "--", holder_command(owner, lease=lease)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("locked")
        return proc

    def renewing(proc):
        def loop():
            while proc.poll() is None:
                try:
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                except OSError:
                    return
                time.sleep(1)
        threading.Thread(target=loop, daemon=True).start()

    refused = "another controller converges this host"
    partitioned = holder("ops@partitioned-controller (pid 4242)", netns)
    try:
        renewing(partitioned)
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
        assert run.returncode != 0
        assert (f"[{host}] refused: {refused}: ops@partitioned-controller (pid 4242) holds its lock") in run.output, \
            run.output[-3000:]
        assert "Starting operation" not in run.output
        print(f"\na live holder (renewing): refused in {run.seconds:.1f} s")

        lab.run("ip", "link", "set", veth, "down")      # its renewals stop arriving; its TCP stays open
        cut = time.monotonic()
        run = pyinfra("inventory/lab.py", "deploy.py", "--limit", host)
        waited = time.monotonic() - cut
        assert run.returncode == 0, run.output[-3000:]
        took = re.search(rf"\[{host}\] took the converge lock from ops@partitioned-controller \(pid 4242\), "
                         r"whose lease lapsed \(no renewal for 10 s since [^)]+\)", run.output)
        assert took, run.output[-3000:]
        assert waited < 10 + 30, waited      # the lease, and a converge with nothing to do
        print(f"a holder cut off: the next converge took the lock and ended {waited:.1f} s after the cut: "
              f"{took.group(0)}")
    finally:
        partitioned.kill()
        lab.run("ip", "netns", "del", netns, check=False)
        lab.run("ip", "link", "del", veth, check=False)

    killed = holder("ops@killed-controller (pid 4343)")
    killed.kill()                                       # kill -9 of the controller's side of the channel
    killed.wait(timeout=10)
    again = converge("inventory/lab.py", "--limit", host)
    assert again.totals["changed"] == 0
    assert "took the converge lock" not in again.output
    print(f"a holder killed with -9: the next converge proceeded at once ({again.seconds:.1f} s, nothing to do)")



@pytest.fixture(scope="module")
def mine(lab, second_converge, tmp_path_factory):
    """inventory/a100.py copied as mine.py, its example hosts replaced by the first lab host's full
    entry; the recipe in a site directory (SITE/group_vars/mine.yml: the lab's settings, and one
    value of its own: gemma's ctx 2048; a small bench.py); SITE/mine.py is the same file naming its site (site=".").
    Yields (mine.py, SITE, host); the host is converged by the lab's inventory again after."""
    import yaml

    from rigup import config
    from tests.converge import ROOT, pyinfra
    from tests.lab import hub

    tmp = tmp_path_factory.mktemp("own-hosts")
    h = lab.hosts()[0]
    entry = {"ssh_hostname": h["address"], "ssh_user": "root", "ssh_key": str(lab.KEY), "ssh_port": 22,
             "_sudo": False, "ssh_known_hosts_file": str(lab.KNOWN_HOSTS), "ssh_strict_host_key_checking": "yes"}
    text = (ROOT / "inventory/a100.py").read_text()
    start = text.index("a100 = [")
    end = text.index("]\n", start) + 2
    text = text[:start] + f"a100 = [({h['name']!r}, {entry!r})]\n" + text[end:]
    recipe = config.load_yaml(config.GROUP_VARS_DIR / "lab.yml")
    recipe["llama_server_instances"]["gemma"]["ctx"] = 2048        # the site's own value
    recipe.update(llama_cpp_source=f"http://{lab.GATEWAY}:8000/llama.cpp.git", hf_endpoint=hub.url(),
                  hf_endpoint_insecure=True,                       # what inventory/lab.py's group adds
                  llama_cpp_artifacts=str(lab.STATE / "artifacts"))
    # bench.py measures even with --dry (facts): one level, one round, no llama-bench
    recipe.update(bench_levels=[1], bench_rounds=1, bench_max_tokens=4, bench_llama_tests=[],
                  bench_out=str(tmp / "bench"))
    site = tmp / "site"
    (site / "group_vars").mkdir(parents=True)
    (site / "group_vars" / "mine.yml").write_text(yaml.safe_dump(recipe))
    (tmp / "mine.py").write_text(text)
    (site / "mine.py").write_text(text.replace("_all_group(globals())", '_all_group(globals(), site=".")'))
    yield tmp / "mine.py", site, h["name"]
    restored = pyinfra("inventory/lab.py", "deploy.py", "--limit", h["name"], timeout=900)
    assert restored.returncode == 0, restored.output[-3000:]


DROPIN = "/etc/systemd/system/rigup-llama@gemma.service.d/rigup.conf"


def test_an_inventory_written_as_the_readme_says_converges_with_its_site_file(lab, mine):
    """The copy of inventory/a100.py with RIGUP_SITE naming the site: the converge changes the
    host to the site file's value, and only that."""
    from rigup import config
    from tests.converge import pyinfra

    inventory, site, name = mine
    run = pyinfra(str(inventory), "deploy.py", env={config.SITE_ENV: str(site)}, timeout=900)
    assert run.returncode == 0, run.output[-5000:]
    shown = lab.ssh(name, f"grep -o -- ' -c [0-9]*' {DROPIN}").stdout.strip()
    print(f"\nmine.py + SITE/group_vars/mine.yml: {run.seconds:.1f} s, changed {run.changed_operations()}; "
          f"the drop-in says {shown!r}")
    assert shown == "-c 2048"
    assert run.changed_operations() and all("llama" in op.lower() for op in run.changed_operations()), \
        run.changed_operations()


def readme_commands() -> list[str]:
    """Every pyinfra and roll.py command the README gives for the operator's own inventory."""
    from tests.converge import ROOT

    text = (ROOT / "README.md").read_text()
    found = re.findall(r"`((?:\.venv/bin/)?(?:pyinfra|python roll\.py) [^`]*?(?:mine\.py|a100\.py|INVENTORY)[^`]*)`", text)
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", text, re.S))
    found += [line.split("#")[0].strip() for line in blocks.splitlines()
              if re.match(r"(\.venv/bin/)?(pyinfra|python roll\.py) .*(mine\.py|a100\.py)", line.strip())]
    return list(dict.fromkeys(found))


def test_every_command_the_readme_gives_for_your_own_hosts_runs(lab, mine):
    """Each README command on the operator's inventory, run as written against the copy (the
    inventory's path put in; --dry added where it would change the host or the gateways); one
    whose placeholder (``--data ...``) or group (``--limit gateway``) the copy has not is named."""
    from rigup import config
    from tests.converge import PYINFRA, ROOT, Run

    inventory, site, name = mine
    commands = readme_commands()
    assert len(commands) >= 8, commands
    ran, skipped = [], []
    for command in commands:
        if "..." in command or "--limit gateway" in command or "--limit cmp170hx" in command:
            skipped.append(command)
            continue
        argv = command.replace(".venv/bin/", "").split()
        path = str(site / "mine.py") if "~/rigup-site/mine.py" in command else str(inventory)
        argv = [a if not re.fullmatch(r"(inventory/(mine|a100)\.py|INVENTORY|~/rigup-site/mine\.py)", a) else path
                for a in argv]
        argv = [str(PYINFRA) if a == "pyinfra" else str(ROOT / ".venv/bin/python") if a == "python" else a
                for a in argv]
        if any(p in argv for p in ("deploy.py", "bench.py", "roll.py")) and "--dry" not in argv:
            argv.append("--dry")
        if "-y" not in argv and argv[0] == str(PYINFRA):
            argv.insert(1, "-y")
        env = dict(os.environ)
        if path == str(inventory):
            env[config.SITE_ENV] = str(site)
        start = time.monotonic()
        done = subprocess.run([a.replace("rig-07", name) for a in argv], cwd=ROOT, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=600, env=env)
        run = Run(done.returncode, done.stdout + done.stderr, time.monotonic() - start)
        assert run.returncode == 0, (command, run.output[-4000:])
        ran.append((command, run.seconds))
    print("\nREADME commands run against a copy of inventory/a100.py:")
    for command, seconds in ran:
        print(f"  {seconds:5.1f} s  {command}")
    for command in skipped:
        print(f"  skipped (a placeholder or a group the copy has not): {command}")
    assert len(ran) >= 6
