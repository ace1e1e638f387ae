"""Configuration: the merge order users expect, and a clear error for every bad value."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api import Inventory

from rigup import config, yamlfile
from rigup.config import ConfigError, check_host, parse_form

ROOT = Path(__file__).resolve().parents[2]


def host_with(all_data=None, group_data=None, host_data=None, override=None, groups=("a100",)):
    """A pyinfra host whose data layers are the given dicts (no connection is made)."""
    inventory = Inventory(
        (["h1"], dict(all_data or {})),
        override_data=dict(override or {}),
        **{g: ([("h1", dict(host_data or {}))], dict(group_data or {})) for g in groups},
    )
    return inventory.get_host("h1")


# --- forms -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, good, bad", [
    ("int 1..65535", [1, 8080], [0, 70000, "8080", True, 1.5, None]),
    ("float 0..1", [0, 0.9, 1], [1.1, "0.9"]),
    ("int 100.. or null", [100, None, 9999], [99, "x"]),
    ("bool", [True, False], [1, "yes", None]),
    ("one of nvidia|distro|present", ["nvidia", "present"], ["apt", 1]),
    ("list of str", [[], ["a", "b"]], ["a", [1], None]),
    ("path", ["/opt/x"], ["opt/x", 3]),
    ("map or null", [{}, None], [[]]),
    ("int 1..", [1, 2**31 - 1], [2**31, 10**30]),   # no upper end given: at most the largest int32
    ("count", ["auto", 1, 2**31 - 1], [0, 2**31, 10**30, "10", True]),
    ("count 1..1024", ["auto", 1024], [1025, 10**30]),
    ("batch", ["25%", 3], [2**31, "0%"]),
])
def test_forms_accept_and_refuse(text, good, bad):
    form = parse_form(text)
    for value in good:
        assert form.problem(value) is None, (text, value)
    for value in bad:
        assert form.problem(value), (text, value)


def test_unknown_form_is_refused():
    with pytest.raises(ValueError):
        parse_form("integer")


def test_every_declared_default_has_its_own_form():
    variables = config.declared()
    assert variables, "no role declares any variable"
    for var in variables.values():
        assert var.form.problem(var.default) is None, f"{var.file}: {var.name}"
        assert var.doc, f"{var.file}: {var.name} has no comment"


def test_a_variable_without_a_form_names_file_and_line(tmp_path, monkeypatch):
    role = tmp_path / "roles" / "demo"
    role.mkdir(parents=True)
    (role / "defaults.yml").write_text("# a port\ndemo_port: 1\n")
    monkeypatch.setattr(config, "ROLES_DIR", tmp_path / "roles")
    monkeypatch.setattr(config, "ROOT", tmp_path)
    config.declared.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"roles/demo/defaults.yml:2: demo_port"):
            config.declared()
    finally:
        config.declared.cache_clear()


def test_broken_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "x.yml"
    bad.write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(ConfigError, match=r"x.yml:\d+: not valid YAML"):
        config.load_yaml(bad)


def test_a_5000_digit_int_is_refused_naming_the_file_and_line(tmp_path):
    """Round 2 of issue 61, item 21: Python's own ValueError ("Exceeds the limit") escaped load_yaml unnamed."""
    bad = tmp_path / "all.yml"
    bad.write_text("a: 1\nb: 2\nport: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"all.yml:3: ") as e:
        config.load_yaml(bad)
    print(f"a 5000-digit int on line 3 -> refused: {str(e.value)[:160]}")
    bad.write_text("a: 2026-13-45\n")   # the timestamp constructor's ValueError, no mark of its own
    with pytest.raises(ConfigError, match=r"all.yml: a value YAML cannot read: month must be in 1..12"):
        config.load_yaml(bad)


def test_a_list_at_top_level_is_refused(tmp_path):
    bad = tmp_path / "x.yml"
    bad.write_text("- a\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        config.load_yaml(bad)


# --- precedence --------------------------------------------------------------------------------

def test_precedence_defaults_all_group_host_data():
    defaults = config.group_vars("all")
    assert defaults["rigup_user"] == "rigup"  # from roles/base/defaults.yml
    h = host_with(all_data={**defaults, "apt_lock_timeout": 1})
    assert h.data.apt_lock_timeout == 1 and h.data.rigup_user == "rigup"
    h = host_with(all_data={"apt_lock_timeout": 1}, group_data={"apt_lock_timeout": 2})
    assert h.data.apt_lock_timeout == 2
    h = host_with(all_data={"apt_lock_timeout": 1}, group_data={"apt_lock_timeout": 2},
                  host_data={"apt_lock_timeout": 3})
    assert h.data.apt_lock_timeout == 3
    h = host_with(group_data={"apt_lock_timeout": 2}, host_data={"apt_lock_timeout": 3},
                  override={"apt_lock_timeout": 4})
    assert h.data.apt_lock_timeout == 4


def test_group_vars_all_sits_on_top_of_role_defaults():
    merged = config.group_vars("all")
    own = config.load_yaml(ROOT / "group_vars" / "all.yml")
    for key, value in own.items():
        assert merged[key] == value
    assert set(config.declared()) <= set(merged)


def test_every_group_vars_file_is_valid():
    for path in sorted((ROOT / "group_vars").glob("*.yml")):
        assert config.problems(config.load_yaml(path)) == [], path


# --- check_host: messages name the file, the key and the form ----------------------------------

def test_a_good_host_passes():
    check_host(host_with(all_data=config.group_vars("all"), host_data={"ssh_user": "ubuntu",
                                                                       "_sudo": True}))


def test_a_host_of_an_inventory_without_the_all_group_gets_every_default():
    """``pyinfra @local preflight.py`` or a user's own inventory: no role defaults in its data."""
    h = host_with(host_data={"gpu_power_watts": 180}, groups=("mine",))
    check_host(h)
    assert h.data.cuda_version == "12.8" and h.data.gpu_power_clocks == {} and h.data.gpu_power_watts == 180


def test_typo_in_group_vars_names_file_key_and_suggestion():
    h = host_with(group_data={"apt_lock_timout": 5})
    with pytest.raises(ConfigError) as e:
        check_host(h)
    msg = str(e.value)
    assert "host h1" in msg
    assert "group_vars/a100.yml" in msg or "inventory group a100" in msg
    assert "'apt_lock_timout'" in msg and "did you mean 'apt_lock_timeout'" in msg


def test_wrong_type_in_host_data_names_host_and_form():
    h = host_with(host_data={"base_persistent_journal": "yes"})
    with pytest.raises(ConfigError, match=r"inventory host data of h1: base_persistent_journal: "
                                          r"expected bool, got 'yes' \(str\)"):
        check_host(h)


def test_out_of_range_from_cli_data_says_so():
    h = host_with(override={"apt_lock_timeout": 99999})
    with pytest.raises(ConfigError, match=r"--data: apt_lock_timeout: expected int 0..3600, "
                                          r"got 99999, out of range"):
        check_host(h)


def test_relative_path_is_refused():
    h = host_with(host_data={"rigup_prefix": "opt/rigup"})
    with pytest.raises(ConfigError, match="rigup_prefix: expected path"):
        check_host(h)


def test_every_problem_is_listed_at_once():
    h = host_with(host_data={"rigup_prefix": 1, "nope": 2})
    with pytest.raises(ConfigError) as e:
        check_host(h)
    assert "rigup_prefix" in str(e.value) and "'nope'" in str(e.value)


# --- through the pyinfra CLI: the run stops before any operation -------------------------------

@pytest.fixture
def project(tmp_path):
    """A copy of the project whose group_vars a test may break."""
    for part in ("rigup", "roles", "shipped", "group_vars", "templates", "deploy.py", "config.py"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "a100.py").write_text(
        "from rigup.config import all_group as _a\na100 = ['@local']\nall = _a(globals())\n")
    return tmp_path


def run_pyinfra(project, *args):
    return subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "--dry", "inventory/a100.py",
         "deploy.py", *args],
        cwd=project, capture_output=True, text=True, timeout=120)


def test_cli_typo_in_group_vars_stops_the_run(project):
    (project / "group_vars" / "a100.yml").write_text("base_extra_pakages: [htop]\n")
    result = run_pyinfra(project)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "group_vars/a100.yml: unknown key 'base_extra_pakages'" in out
    assert "did you mean 'base_extra_packages'" in out
    assert "Starting operation" not in out


def test_cli_bad_data_names_data(project):
    result = run_pyinfra(project, "--data", "apt_lock_timeout=forever")
    assert result.returncode != 0
    assert "--data: apt_lock_timeout: expected int 0..3600, got 'forever'" in (
        result.stdout + result.stderr)


def test_cli_debug_inventory_shows_the_merge(project):
    (project / "group_vars" / "a100.yml").write_text("apt_lock_timeout: 42\n")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "inventory/a100.py", "debug-inventory"],
        cwd=project, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert '"apt_lock_timeout": 42' in out
    assert '"rigup_user": "rigup"' in out


def test_fleet_data_is_every_hosts_data_with_defaults_made_once_a_run():
    from pyinfra.api import Config, State

    inventory = Inventory((["h1", ("h2", {"prometheus_port": 9000})], {}))
    state = State(inventory, Config())
    h1, h2 = inventory.get_host("h1"), inventory.get_host("h2")
    fleet = config.fleet_data(h1)
    assert fleet is config.fleet_data(h2)            # one for the run, whichever host asks
    assert list(fleet) == ["h1", "h2"]
    assert fleet["h2"]["prometheus_port"] == 9000         # the host's own value over the default
    assert fleet["h1"]["prometheus_port"] == config.declared()["prometheus_port"].default
    assert config.fleet_data(State(inventory, Config()).inventory.get_host("h1")) is not fleet
    del state


# --- Config: one read-only configuration per host and run, the hub asked when first read ---------

BRANCH = {"repo": "org/x", "revision": "main", "size_gib": 1.0, "family": "glm-5.3-flash"}
COMMIT = "c" * 40


class Resolver:
    """A role's ``resolve`` (roles/model_fetch/hub.py's form): {hub_key: facts} for a host's
    models, counting what it was asked."""
    resolve_calls: list

    def __init__(self):
        self.resolve_calls = []

    def resolve(self, cfg):
        from rigup.models import hub_endpoint, hub_key

        self.resolve_calls.append(cfg.name)
        return {hub_key(hub_endpoint(cfg), {"include": [], **m}): {"commit": COMMIT}
                for m in (cfg.get("models") or {}).values() if m["revision"] == "main"}


def test_config_is_read_only_one_per_host_and_pins_from_the_hub_whichever_reads_first():
    from pyinfra.api import Config as PyinfraConfig, State

    from rigup.models import models

    inventory = Inventory((["h1", ("h2", {"models": {"x": BRANCH}, "models_allow_unpinned": True})], {}))
    state = State(inventory, PyinfraConfig())
    h1, h2 = inventory.get_host("h1"), inventory.get_host("h2")
    role = Resolver()
    cfg1 = config.configure(h1, [role])
    assert role.resolve_calls == []                       # nothing asked until a model is read
    peer = config.fleet_data(h1)["h2"]                    # h2's configuration, before h2's own play
    assert peer is config.config_of(h2) and cfg1 is config.config_of(h1)
    assert models(peer)[0]["x"]["revision"] == COMMIT and models(peer)[0]["x"]["pinned_from"] == "main"
    assert config.configure(h2, [role]) is peer           # h2's play: the same Config, asked once
    assert models(peer)[0]["x"]["revision"] == COMMIT and role.resolve_calls == ["h2"]
    with pytest.raises(TypeError):
        peer["models"] = {}                               # read-only: a Mapping without setters
    assert models(peer) is models(peer)                   # made once for the run (rigup.config.once)
    assert not hasattr(__import__("rigup.models").models, "_HUB")   # no registry filled by printing
    del state


def test_plan_lines_ask_nothing_and_fill_nothing():
    """model_fetch's plan lines read what the configuration asked: printing them twice asks the hub
    nothing more and changes no entry."""
    from roles import model_fetch
    from tests.unit.hosts import data

    role = Resolver()
    cfg = config.Config("h", data(models={"x": BRANCH}, models_allow_unpinned=True), (role.resolve,))
    first = model_fetch.plan_lines({}, cfg)
    assert first == model_fetch.plan_lines({}, cfg) and role.resolve_calls == ["h"]
    assert f"models.x.revision: main is {COMMIT}; pin it (models_allow_unpinned: fetching that commit)" in first


@pytest.mark.parametrize("text, said", [
    ("models: {on: {repo: a/b, revision: x}}", "models: expected map, holds the key True: YAML read it as a bool"),
    ("llama_server_instances: {x: {model: m, env: {~: 1}}}",
     "llama_server_instances: expected map, x.env holds the key None: YAML read it as null"),
])
def test_a_map_key_yaml_read_as_a_bool_or_null_is_refused_naming_the_key(text, said):
    """``models: {on: ...}``: YAML 1.1 reads the key as True, which passed the name check as "True"
    and crashed the fetch unit's name (red team, issue 61)."""
    from rigup import yamlfile
    found = config.problems(yamlfile.safe_load(text))
    print(f"\n{found}")
    assert any(said in why for _, why in found)


@pytest.mark.parametrize("name", [True, None, 1, 1.5, "on"])
def test_an_entrys_own_key_is_a_name_only_as_text(name):
    from rigup.entries import Key, normalise
    entry, found = normalise({"a": 1}, {"a": Key("int 0..")}, f"models.{name}", name=name)
    print(f"\n{name!r}: {found}")
    assert (found == [] and entry == {"a": 1}) if name == "on" else \
        (entry == {} and found[0][0] == f"models.{name}" and "is not a name" in found[0][1])


@pytest.mark.parametrize("key, value", [("replicas", 10**30), ("replicas", 1025), ("ctx", 2**24 + 1), ("ngl", 10**30),
                                        ("batch", 2**31)])
def test_an_instance_number_beyond_its_bound_is_refused_naming_the_key(key, value):
    """``replicas: 10**30`` had preflight build that many groups (a hang): every int form has an upper
    end, the form's own or the largest int32 (red team, issue 61)."""
    from rigup.models import instances
    from rigup.instances.llama_server import LLAMA_INSTANCE
    data = {"models": {"m": {"repo": "a/b", "revision": "0" * 40}},
            "llama_server_instances": {"x": {"model": "m", "port": 8081, key: value}}}
    _, found = instances(data, "llama_server_instances", LLAMA_INSTANCE)
    print(f"\n{found}")
    assert [where for where, _ in found] == [f"llama_server_instances.x.{key}"] and "out of range" in found[0][1]


# --- --data on pyinfra's command line: numbers as the YAML loader takes them (issue 61) ----------

@pytest.mark.parametrize("text", ["5_0_0", "\u0665\u0660\u0660", "0500", "9" * 19, "+5_0"])
def test_a_data_number_pyinfra_reads_with_int_but_rigup_does_not_is_refused_naming_it(text, monkeypatch):
    """round 2 G11: pyinfra's CLI reads --data gpu_psu_watts=5_0_0 (and Arabic-Indic ٥٠٠) as 500 with
    int(), where the YAML loader refuses 5_0_0: the host's configuration is refused, naming --data."""
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inv.py", "deploy.py", "--data", f"gpu_psu_watts={text}"])
    h = host_with(override={"gpu_psu_watts": int(text)})
    with pytest.raises(ConfigError, match=r"--data: gpu_psu_watts='.*': pyinfra reads it as the number \d+, which "
                                          r"rigup does not take") as e:
        check_host(h)
    print(e.value)


@pytest.mark.parametrize("args", [["--data", "gpu_psu_watts=500"], ["--data=gpu_psu_watts=+500"],
                                  ["--data", "rigup_user=abc"], ["exec", "--", "x", "--data", "gpu_psu_watts=5_0_0"]])
def test_a_plain_data_number_or_text_or_a_commands_word_passes(args):
    assert config.data_number_problems(["inv.py", *args]) == []


def test_data_texts_are_the_words_as_typed():
    assert config.data_texts(["-y", "--data", "a=5_0_0", "--data=b=x=y"]) == {"a": "5_0_0", "b": "x=y"}
    # pyinfra's click refuses a --data with no value: pyinfra runs no play, rigup has no pair to check
    assert config.data_texts(["-y", "--data", "a=5_0_0", "--data"]) == {}
    # a word that is another option's value, or a command's, is no --data pair
    assert config.data_pairs(["--limit", "--data", "inv.py", "exec", "--", "--data", "x=1"]) == []


@pytest.mark.parametrize("args", [["--data=gpu_psu_watts=500", "inv.py", "deploy.py", "--data", "gpu_psu_watts=4_0_0"],
                                  ["--data", "gpu_psu_watts=4_0_0", "inv.py", "deploy.py", "--data=gpu_psu_watts=500"]])
def test_a_data_number_is_checked_whatever_its_spelling_and_place(args):
    """Rerun 2 of issue 61, N5: --data=gpu_psu_watts=500 ... --data gpu_psu_watts=4_0_0: rigup read
    every --data=k=v after the --data k=v ones, so it checked 500 where pyinfra kept 400 (4_0_0)."""
    found = config.data_number_problems(args)
    assert [key for key, _ in found] == ["gpu_psu_watts"] and "'4_0_0'" in found[0][1]


def test_a_data_json_value_with_a_key_twice_is_refused_naming_data_and_the_key(monkeypatch):
    """Rerun 2 of issue 61, N34: pyinfra reads a --data value by json.loads, which keeps the last
    of a key given twice (here the one binding 0.0.0.0), where the YAML loader refuses it."""
    text = '{"x": {"model": "a"}, "x": {"model": "b", "host": "0.0.0.0"}}'
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inv.py", "deploy.py", "--data", f"llama_server_instances={text}"])
    h = host_with(override={"gpu_psu_watts": 500, "llama_server_instances": {"x": {"model": "b", "host": "0.0.0.0"}}})
    with pytest.raises(ConfigError, match=r"--data: llama_server_instances=\{.*pyinfra reads it as JSON, which rigup "
                                          r"does not take \(the key 'x' twice\)") as e:
        check_host(h)
    print(e.value)
    for bad in ("NaN", "[-Infinity]", "[" * 50000):
        assert [key for key, _ in config.data_number_problems(["--data", f"k={bad}"])] == ["k"]
    for good in ('{"x": 1, "y": 1}', '"NaN"', "text", "true", "[1, 2]"):
        assert config.data_number_problems(["--data", f"k={good}"]) == []


WORDS = st.sampled_from(["-y", "--dry", "-v", "inv.py", "deploy.py", "--limit=lab1", "--fail-percent=5"])
PAIRS = st.tuples(st.sampled_from(["a", "b", "gpu_psu_watts"]), st.sampled_from(["500", "4_0_0", "x", "1=2", '{"k": 1}']))


@settings(max_examples=300, deadline=2000)
@given(st.lists(st.tuples(st.booleans(), PAIRS, st.lists(WORDS, max_size=2)), max_size=6))
def test_data_pairs_are_pyinfras_in_its_order(items):
    """Property: whatever the spelling (--data k=v or --data=k=v) and the words between, rigup reads
    the pairs pyinfra's CLI reads, in its order, the survivor of a key given twice its survivor, and
    refuses a number if any of its pairs is one (an overridden one too)."""
    from pyinfra_cli.cli import _set_override_data
    from plays.inventory import overrides
    args, pairs = [], []
    for joined, (key, value), words in items:
        args += ([f"--data={key}={value}"] if joined else ["--data", f"{key}={value}"]) + words
        pairs.append((key, value))
    assert config.data_pairs(args) == pairs
    assert overrides(args) == _set_override_data([f"{k}={v}" for k, v in pairs], None, None, None, None, None)
    assert bool(config.data_number_problems(args)) == any(v == "4_0_0" for _, v in pairs)


@settings(max_examples=300, deadline=1000)
@given(text=st.one_of(st.text(st.sampled_from(list("0123456789_+- \u0665\u00b2xX.")), min_size=1, max_size=8),
                      st.text(max_size=6)))
def test_a_data_number_rigup_takes_is_the_one_the_yaml_loader_reads(text):
    """Property: a --data value pyinfra reads as an int passes only when the YAML loader reads the same
    text as that same int (5_0_0, ٥٠٠, 0500, 0x10: refused, as the loader refuses or reads them otherwise)."""
    try:
        read = int(text)
    except ValueError:
        return
    if config.data_number_problems(["--data", f"k={text}"]) == []:
        assert yamlfile.safe_load(f"k: {text}")["k"] == read
