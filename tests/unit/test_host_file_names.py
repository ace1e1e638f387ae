"""An inventory host's name where rigup builds a file name on the controller from it (the burn-in
copy ``burnin/HOST.json``, tune.py's ``host_vars/HOST.yml``, bench's ``HOST.json``): one validator,
rigup/boundary/fields.py ``host_file``, refuses every name that is a path, naming the host (round 3
of issue 61, C7: ``../../escaped`` made the burn-in copy a file outside the copies' directory)."""

import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from plays import bench
from rigup.boundary import fields
from rigup.boundary.core import Unreadable
from rigup.names import burnin_copy
from roles.burnin import judged

PIECES = st.sampled_from(["..", ".", "/", "\\", "\n", "\x00", "\u202e", "@", "@local", "a", "lab-1", "10.0.0.7",
                          "fd00::1", "gpu.example.org", "_", ":", "%"])
TEXT = st.lists(st.text(max_size=8) | PIECES, max_size=6).map("".join)


@settings(max_examples=80, deadline=1000)
@given(TEXT | st.none() | st.integers() | st.lists(st.text(max_size=3), max_size=2))
def test_a_host_file_name_is_one_name_in_its_directory_or_refused_naming_the_host(value):
    try:
        got = fields.host_file(value, f"the inventory host {value!r}")
    except Unreadable as e:
        assert e.where == f"the inventory host {value!r}"
        return
    joined = os.path.normpath(os.path.join("/cache/burnin", f"{got}.json"))
    assert got == value and os.path.dirname(joined) == "/cache/burnin" and not got.startswith(".")
    assert "/" not in got and not fields.CONTROL.search(got) and len(f"{got}.json".encode()) <= fields.NAME_MAX


@pytest.mark.parametrize("name", ["lab1", "gpu-1.example.org", "10.0.0.7", "fd00::1", "rig_07"])
def test_a_hosts_name_or_address_names_its_copy(name, tmp_path, monkeypatch):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path))
    assert burnin_copy(name) == tmp_path / "burnin" / f"{name}.json"


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", "..", "@local", "", "lab1\n"])
def test_a_host_named_as_a_path_has_no_burnin_copy(name, tmp_path, monkeypatch):
    """C7's reproduction: burnin_copy('../../../escaped') was $RIGUP_CACHE_DIR/../../escaped.json."""
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path / "c7" / "cache"))
    with pytest.raises(Unreadable) as e:
        burnin_copy(name)
    assert repr(name) in e.value.where


def test_such_a_host_is_refused_by_the_burnin_role_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path / "c7" / "cache"))
    state = {"records": {}, "untested": {}, "units": {}, "unreadable": None}
    got, problems = judged("../../../escaped", state, "/var/lib/rigup/burnin.json", {"burnin_clear": None})
    assert got == state and len(problems) == 1 and "'../../../escaped'" in problems[0]["where"], problems
    assert "DNS name or address" in problems[0]["fix"] and list(tmp_path.rglob("*")) == []


def test_bench_writes_no_report_outside_its_directory(tmp_path):
    out = tmp_path / "bench_out" / "2026-12-06"
    with pytest.raises(Unreadable) as e:
        bench.write_reports({"../../escaped": {"date": "x", "max_tokens": 1, "rounds": 1, "instances": {}}}, out)
    assert "'../../escaped'" in e.value.where and list(tmp_path.rglob("*")) == []


# (file, function) -> why a path built from its host name needs no host_file call of its own
PATH_BUILDERS_ALLOWED = {
    ("rigup/config.py", "group_files"): "a group's name: a Python identifier of the inventory file",
    ("rigup/config.py", "host_vars"): "only read (host_vars/NAME.yml of the repository and the site), never written; "
                                      "pyinfra's names such as @local read no file",
    ("plays/tuning.py", "_record"): "write_host_vars(host) checks the name first, before either file is written",
}


def test_every_file_name_built_from_a_host_name_is_checked_in_its_function():
    """The class of C7, held by the syntax tree: ``DIR / f"{host}..."`` (or name, hostname) in the
    controller's code sits in a function that calls fields.host_file, or is named above with why."""
    import ast

    root = Path(__file__).resolve().parents[2]
    files = [p for d in ("rigup", "roles", "plays", "shipped") for p in (root / d).rglob("*.py")] + list(root.glob("*.py"))
    unchecked = set()

    def hosty(value) -> bool:
        """A host's name: host, name, hostname or origin, or X.name (host.name, peer.name)."""
        return isinstance(value, ast.Name) and value.id in ("host", "name", "hostname", "origin") or \
            isinstance(value, ast.Attribute) and value.attr == "name"
    for path in files:
        text = path.read_text()
        if "# rigup: runs on hosts" in text[:400]:
            continue
        for fn in (n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            # any part of the name (round 6 BD16: f"{key}.part-{host.name}", the host's name second, an attribute)
            builds = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and isinstance(n.right, ast.JoinedStr)
                         and any(isinstance(v, ast.FormattedValue) and hosty(v.value) for v in n.right.values)
                         for n in ast.walk(fn))
            checks = any(isinstance(n, ast.Attribute) and n.attr == "host_file" for n in ast.walk(fn))
            if builds and not checks:
                unchecked.add((str(path.relative_to(root)), fn.name))
    assert unchecked <= set(PATH_BUILDERS_ALLOWED), sorted(unchecked - set(PATH_BUILDERS_ALLOWED))


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "@local"])
def test_a_host_named_as_a_path_keeps_no_llama_cpp_artifact(name, tmp_path):
    """Round 6 BD16: the hand-over's part file was ``CACHE/artifacts/KEY.part-../../x`` (host.name
    unchecked); now the build is not kept as an artifact, said, and nothing is run or fetched."""
    from roles.llama_cpp import handover

    class Host:
        def __init__(self):
            self.name, self.said = name, []

        def log_styled(self, text, **kwargs):
            self.said.append(text)

        def run_shell_command(self, *args, **kwargs):
            raise AssertionError("packed for a host named as a path")

        get_file = run_shell_command

    host = Host()
    assert handover._pack(None, host, "/opt/llama", "b1", "0123456789abcdef", str(tmp_path), {}) is True
    print(host.said)
    assert len(host.said) == 1 and "not kept as an artifact" in host.said[0] and "not a host's name" in host.said[0]
    assert list(tmp_path.rglob("*")) == []


@settings(max_examples=150, deadline=1000)
@given(TEXT | st.none() | st.integers())
def test_an_inventory_hosts_name_is_printable_one_word_or_refused_naming_it(value):
    """Round 5 G8 (fields.host_name): what pyinfra prints before each line of a host is a name, an
    address or a connector's (@local, @docker/IMAGE), no control or bidi character, no blank."""
    try:
        got = fields.host_name(value, f"the inventory host {value!r}")
    except Unreadable as e:
        assert e.where == f"the inventory host {value!r}"
        return
    assert got == value and not fields.CONTROL.search(got) and got.isprintable() and got.split() == [got]
    assert got.startswith("@") or got == fields.host_file(got, "x")


def test_an_inventory_with_a_host_named_by_escapes_or_a_path_is_refused_naming_the_file_and_host(tmp_path):
    """Round 5 G8: a host '../../etc' with an OSC sequence was read as any other by roll.py and shards.py."""
    from plays import inventory
    from rigup.config import ConfigError
    path = tmp_path / "inv.py"
    for name in ("../../etc\x1b]0;x\x07", "a\u202eb", "two words"):
        path.write_text(f"hosts = [({name!r}, {{'ssh_hostname': '10.0.0.1'}})]\nall = ['lab1', {name!r}]\n")
        with pytest.raises(ConfigError) as e:
            inventory.read(path)
        print(str(e.value))
        assert str(path) in str(e.value) and repr(name)[:20] in str(e.value)
    path.write_text("hosts = [('lab1', {}), '@local', '@docker/debian:12', '10.0.0.7']\n")
    assert [h.name for h in inventory.read(path)] == ["lab1", "@local", "@docker/debian:12", "10.0.0.7"]
