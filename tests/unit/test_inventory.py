"""Inventory files as pyinfra reads them (``pyinfra INVENTORY debug-inventory``, which connects to
nothing): every example inventory loads; a copy named mine.py gets its own group's YAML and the
README's monitoring and gateway lines work in it; a host in two groups gets the later group's
value (pyinfra's order); no host of a group is left out; a site directory's group_vars/ loads
over the shipped one and is checked like it. all_group's refusals, in this process."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rigup import config
from rigup.config import ROOT, ConfigError, all_group, load_yaml, problems
from tests.unit.forker import close_all, forked

PYINFRA = Path(sys.executable).with_name("pyinfra")
HOST = re.compile(r"^\[([\w.@/-]+)\] *\n--> Groups: ([^\n]*)\n--> Data:\n(\{.*?\n\})$", re.M | re.S)
ENTRY = {"ssh_hostname", "ssh_user", "ssh_key", "ssh_port", "_sudo"}
# How each example inventory is loaded here; vagrant.py needs `vagrant ssh-config`, stood in for
# by tests/unit/test_vagrant_inventory.py, which runs debug-inventory on it.
EXAMPLES = {"a100", "h100", "cmp170hx", "lab", "vagrant"}


@pytest.fixture(autouse=True)
def no_site(monkeypatch):
    """The operator's own RIGUP_SITE never reaches these tests."""
    monkeypatch.delenv(config.SITE_ENV, raising=False)


# pyinfra's CLI and plays.inventory each imported once per module (most of a run's CPU), their runs
# forked from it (tests/unit/forker.py); two such processes: plays.inventory's reader is never run
# where pyinfra_cli's import patched the standard library
@pytest.fixture(scope="module", autouse=True)
def forkers_end():
    yield
    close_all()


def pyinfra(inventory, *args: str) -> subprocess.CompletedProcess:
    return forked("from pyinfra_cli.main import main", "import sys; from pyinfra_cli.main import main; sys.exit(main())",
                  [str(PYINFRA), str(inventory), *args])


# plays.inventory.read (roll.py's and shards.py's reader), in a process of its own as pyinfra's is
OURS = """import json, sys
from plays import inventory
inv = inventory.read(sys.argv[1], inventory.overrides(sys.argv[2:]))
print(json.dumps({h.name: [list(h.groups), h.data.dict()] for h in inv}, default=str))
"""


def debug_inventory(inventory, *args: str) -> dict[str, tuple[list[str], dict]]:
    """{host: (its groups in pyinfra's order, its merged data)}, as debug-inventory prints them;
    checked to be what plays.inventory.read gives, with the same arguments."""
    done = pyinfra(inventory, "debug-inventory", *args)
    output = done.stdout + done.stderr   # pyinfra prints the inventory on stderr
    assert done.returncode == 0, output
    theirs = {name: (groups.split(", "), json.loads(data)) for name, groups, data in HOST.findall(output)}
    ours = forked("from plays import inventory", OURS, ["-c", str(inventory), *args])
    assert ours.returncode == 0, ours.stderr
    assert {n: (g, d) for n, (g, d) in json.loads(ours.stdout).items()} == theirs
    return theirs


def site(tmp_path, **files: dict) -> Path:
    """A site directory whose group_vars/<group>.yml hold ``files`` ({group: data})."""
    (tmp_path / "site" / "group_vars").mkdir(parents=True)
    for group, data in files.items():
        (tmp_path / "site" / "group_vars" / f"{group}.yml").write_text(json.dumps(data))
    return tmp_path / "site"


def inventory(tmp_path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(f"from rigup.config import all_group as _all_group\n{body}\nall = _all_group(globals())\n")
    return path


def test_every_example_inventory_is_tested_here():
    assert {p.stem for p in (ROOT / "inventory").glob("*.py")} == EXAMPLES


@pytest.mark.parametrize("group", ["a100", "h100", "cmp170hx"])
def test_an_example_inventory_loads_with_full_host_entries(group):
    hosts = debug_inventory(f"inventory/{group}.py")
    assert len(hosts) >= 2
    shipped = load_yaml(ROOT / "group_vars" / f"{group}.yml")
    for name, (groups, data) in hosts.items():
        assert groups == [group], name
        assert ENTRY <= set(data), name
        assert data["base_extra_packages"] == shipped["base_extra_packages"]
        assert problems(data) == [], name


def test_the_lab_inventory_loads_its_groups_in_its_order(tmp_path, monkeypatch):
    (tmp_path / "lab.json").write_text(json.dumps({
        "gateway": "10.9.0.1", "ssh_key": "/k", "known_hosts": "/kh",
        "hosts": [{"name": "lab1", "address": "10.9.0.2", "profile": "a100"},
                  {"name": "lab2", "address": "10.9.0.3", "profile": "none"}]}))
    monkeypatch.setenv("RIGUP_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("RIGUP_LAB_GATEWAYS", "lab2")
    monkeypatch.setenv("RIGUP_LAB_MAINTENANCE", "lab1")
    hosts = debug_inventory("inventory/lab.py")
    assert {n: g for n, (g, _) in hosts.items()} == {"lab1": ["a100", "lab", "maintenance"],
                                                     "lab2": ["none", "lab", "gateway"]}
    lab1, lab2 = hosts["lab1"][1], hosts["lab2"][1]
    assert lab1["base_extra_packages"] == []                    # group_vars/lab.yml over a100.yml
    assert lab1["rigup_maintenance"] is True and lab1["hf_endpoint"] == "http://10.9.0.1:8090"
    assert lab2["balancer_gateway"] is True and lab2["gpu_enabled"] is False
    assert problems(lab1) == [] and problems(lab2) == []


def test_a_copy_named_mine_gets_its_own_group_file_and_the_readme_lines_work(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    lines = re.findall(r"`((?:monitoring|gateway) = \[.*?\])`", readme.replace("\n  ", " "))
    assert {line.split()[0] for line in lines} == {"monitoring", "gateway"}, lines
    copy = (ROOT / "inventory" / "a100.py").read_text().replace("\nall = ", "\n" + "\n".join(lines) + "\nall = ")
    (tmp_path / "mine.py").write_text(copy)
    monkeypatch.setenv(config.SITE_ENV, str(site(tmp_path, mine={"apt_lock_timeout": 7,
                                                                 "base_extra_packages": ["jq"]})))
    hosts = debug_inventory(tmp_path / "mine.py")
    assert {n: g for n, (g, _) in hosts.items()} == {"a100-01": ["a100", "monitoring", "mine"],
                                                     "a100-02": ["a100", "mine"],
                                                     "gw-01": ["gateway", "mine"]}
    for name, (_, data) in hosts.items():
        # the file's own group, last, wins over group_vars/a100.yml's [htop, pciutils]
        assert (data["apt_lock_timeout"], data["base_extra_packages"]) == (7, ["jq"]), name
        assert data["prometheus_enabled"] is (name == "a100-01")
        assert data["balancer_gateway"] is (name == "gw-01")
        assert problems(data) == [], name


@pytest.mark.parametrize("order", [("a100", "monitoring"), ("monitoring", "a100")])
def test_a_host_in_two_groups_gets_the_later_groups_value(tmp_path, monkeypatch, order):
    """pyinfra lists a host's groups in the order the file defines them and merges them in that
    order, the last one holding (pyinfra/api/inventory.py, Inventory.get_groups_data)."""
    monkeypatch.setenv(config.SITE_ENV, str(site(tmp_path, a100={"apt_lock_timeout": 1},
                                                 monitoring={"apt_lock_timeout": 2})))
    members = {"a100": '[("h1", {"ssh_port": 2201}), "h2"]', "monitoring": '[("h1", {"ssh_port": 2202})]'}
    hosts = debug_inventory(inventory(tmp_path, "two", "\n".join(f"{g} = {members[g]}" for g in order)))
    groups, h1 = hosts["h1"]
    assert groups == [*order, "two"]
    assert h1["apt_lock_timeout"] == {"a100": 1, "monitoring": 2}[order[1]]
    assert h1["ssh_port"] == {"a100": 2201, "monitoring": 2202}[order[1]]   # host data: the same order
    assert hosts["h2"][1]["apt_lock_timeout"] == 1


def test_site_files_load_over_the_shipped_ones_under_host_data_and_data(tmp_path, monkeypatch):
    where = site(tmp_path, all={"base_extra_packages": ["jq"], "apt_lock_timeout": 20, "rigup_user": "site"},
                 a100={"base_extra_packages": ["tmux"]}, rack={"llama_cpp_ref": "b2"})
    monkeypatch.setenv(config.SITE_ENV, str(where))
    path = inventory(tmp_path, "fleet", 'a100 = [("h1", {"apt_lock_timeout": 30})]\n'
                                        'rack = (["h2"], {"apt_lock_timeout": 10, "llama_cpp_ref": "b1"})')
    hosts = debug_inventory(path, "--data", "rigup_user=cli")
    h1, h2 = hosts["h1"][1], hosts["h2"][1]
    assert h2["base_extra_packages"] == ["jq"]        # site all.yml over group_vars/all.yml's [htop]
    assert h2["apt_lock_timeout"] == 10               # the group's data in the file over all.yml
    assert h2["llama_cpp_ref"] == "b2"                # site rack.yml over the group's data in the file
    assert h1["base_extra_packages"] == ["tmux"]      # site a100.yml over group_vars/a100.yml
    assert h1["apt_lock_timeout"] == 30               # host data over the site
    assert h1["rigup_user"] == h2["rigup_user"] == "cli"   # --data over everything
    assert h1["_rigup_site"] == str(where)


def test_a_site_file_is_checked_like_the_shipped_ones(tmp_path, monkeypatch):
    where = site(tmp_path, a100={"base_extra_pakages": ["htop"]}, all={"apt_lock_timeout": "forever"})
    monkeypatch.setenv(config.SITE_ENV, str(where))
    done = pyinfra(inventory(tmp_path, "local", 'a100 = ["@local"]'), "-y", "--dry", "deploy.py")
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"{where}/group_vars/a100.yml: unknown key 'base_extra_pakages'" in out
    assert f"{where}/group_vars/all.yml: apt_lock_timeout: expected int 0..3600, got 'forever'" in out
    assert "Starting operation" not in out


# --- all_group, in this process -----------------------------------------------------------------

def module(tmp_path, name="mine", **groups) -> dict:
    return {"__file__": str(tmp_path / f"{name}.py"), "_private": ["x"], **groups}


def test_every_host_of_every_group_is_in_all(tmp_path):
    names, data = all_group(module(tmp_path, a100=["h1"], monitoring=[("mon", {})], gateway=(["gw", "h1"], {})))
    assert names == ["h1", "mon", "gw"] and data["rigup_user"] == "rigup"


def test_the_files_own_group_gets_its_shipped_yaml(tmp_path, monkeypatch):
    (tmp_path / "gv").mkdir()
    (tmp_path / "gv" / "mine.yml").write_text("apt_lock_timeout: 5\n")
    (tmp_path / "gv" / "a100.yml").write_text("apt_lock_timeout: 4\n")
    monkeypatch.setattr(config, "GROUP_VARS_DIR", tmp_path / "gv")
    groups = module(tmp_path, a100=[("h1", {})], gateway=(["h2"], {"apt_lock_timeout": 3}))
    all_group(groups)
    assert groups["a100"] == ([("h1", {})], {"apt_lock_timeout": 4})
    assert groups["gateway"] == (["h2"], {"apt_lock_timeout": 3})
    assert list(groups)[-1] == "mine" and groups["mine"] == (["h1", "h2"], {"apt_lock_timeout": 5})


def test_the_site_of_the_inventory_file_is_relative_to_it(tmp_path):
    where = site(tmp_path, mine={"apt_lock_timeout": 9})
    groups = module(tmp_path, a100=["h1"])
    assert all_group(groups, site="site")[1]["_rigup_site"] == str(where)
    assert groups["mine"][1] == {"apt_lock_timeout": 9}


def test_a_site_that_is_not_one_is_refused_naming_it(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"mine.py: site='empty': .*/empty has no directory group_vars/"):
        all_group(module(tmp_path, a100=["h1"]), site="empty")
    monkeypatch.setenv(config.SITE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"RIGUP_SITE=.*/nowhere: .*/nowhere has no directory group_vars/"):
        all_group(module(tmp_path, a100=["h1"]))
    monkeypatch.setenv(config.SITE_ENV, str(site(tmp_path)))
    with pytest.raises(ConfigError, match=r"RIGUP_SITE=.*/site and .*mine.py: site='empty' name two site directories"):
        all_group(module(tmp_path, a100=["h1"]), site="empty")
    assert all_group(module(tmp_path, a100=["h1"]), site="site")[1]["_rigup_site"] == str(tmp_path / "site")
    (tmp_path / "site/group_vars/mine.yaml").write_text("apt_lock_timeout: 1\n")
    with pytest.raises(ConfigError, match=r"site/group_vars/mine.yaml: rigup reads <group>.yml files only: "
                                          r"rename it mine.yml"):
        all_group(module(tmp_path, a100=["h1"]))


def test_all_group_takes_the_files_globals_and_groups_of_pyinfras_forms(tmp_path):
    with pytest.raises(ConfigError, match=r"all_group takes the inventory file's globals\(\)"):
        all_group((["h1"], {}))
    with pytest.raises(ConfigError, match=r"mine.py: rack: a group is a list of hosts or a \(hosts, data\) tuple"):
        all_group(module(tmp_path, rack=("h1", "h2")))


def test_data_values_are_read_as_pyinfras_cli_reads_them():
    """rigup.config.cli_value against pyinfra_cli's own parse (in a process of its own: importing
    pyinfra_cli patches the standard library with gevent)."""
    from rigup.config import cli_value
    from plays.inventory import overrides

    values = ["true", "False", "7", "-3", "1.5", '{"a": [1, "x"]}', "[1, 2]", "null", "abc", "", "0x10", "25%"]
    code = "import json, sys; from pyinfra_cli.util import parse_cli_arg; print(json.dumps([parse_cli_arg(v) for v in json.loads(sys.argv[1])]))"
    theirs = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(values)], capture_output=True,
                                       text=True, check=True).stdout)
    assert [cli_value(v) for v in values] == theirs
    assert overrides(["-y", "--data", "rigup_batch=2", "--data=rigup_max_fail=1", "--dry"]) == \
        {"rigup_batch": 2, "rigup_max_fail": 1}


def test_a_group_data_directory_or_a_file_that_is_no_inventory_is_refused_naming_it(tmp_path):
    from plays.inventory import read

    path = inventory(tmp_path, "two", 'a100 = ["h1"]')
    assert [h.name for h in read(path)] == ["h1"]
    (tmp_path / "group_data").mkdir()
    with pytest.raises(ConfigError, match=f"{tmp_path / 'group_data'}: a pyinfra group_data directory"):
        read(path)
    with pytest.raises(ConfigError, match="not an inventory file"):
        read(tmp_path / "nope.py")


@pytest.mark.parametrize("bad", ["../../etc", "a/b", "gpu\x1b]0;x\x07", ".hidden", "", "x" * 201])
def test_a_host_that_is_no_name_is_refused_naming_the_file_and_group(tmp_path, bad):
    """Round 5 G8 for every pyinfra run (deploy.py too, not only roll.py and shards.py): a host's
    name is printed before each of its lines and names host_vars/NAME.yml; a path or a terminal
    sequence is refused when the inventory loads, naming its file and group."""
    with pytest.raises(ConfigError) as e:
        all_group(module(tmp_path, a100=["h1", bad]))
    print(e.value)
    assert "a100: the host" in str(e.value) and "not a host's name or address" in str(e.value)
    assert "\x1b" not in str(e.value)


def test_connector_hosts_and_addresses_load(tmp_path):
    names, _ = all_group(module(tmp_path, a100=["@local", "10.0.0.2", "rig-1.lab", ("@docker/debian:12", {})]))
    assert names == ["@local", "10.0.0.2", "rig-1.lab", "@docker/debian:12"]
