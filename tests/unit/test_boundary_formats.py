"""The writers of foreign formats (rigup/boundary/formats.py, issue 61 class 4): arbitrary text (control
characters, quotes, ``;``, ``#``, newlines) is refused with an error naming what it is, or written so
that the format's own reader gets exactly the value back, never a second rule, line or section.

Read back by the real program where this machine has it (nft in a private network namespace,
``systemd-analyze verify``, ``haproxy -c``, PyYAML); llama.cpp's preset and the Prometheus
exposition by a strict parser here, written from their grammars (common/preset.cpp; the text
format's label escapes). The host programs' own copies of prom_label are held equal to it.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from rigup import firewall
from rigup.boundary import formats
from rigup.boundary.fields import CONTROL, NAME, one_host
from rigup.units import systemd_env_split, systemd_split
from roles.balancer.config import haproxy_cfg
from roles.burnin.shipped import acceptance
from roles.gpu_guard.shipped import guard
from roles.llama_server.command import preset_text
from rigup.instances.llama_server import instances
from roles.metrics.shipped import relay
from roles.model_fetch.shipped import fetcher
from roles.watchdog.shipped import watchdog
from tests.unit.hosts import REV, data

# what has meaning in one format or another, mixed with any text
HOSTILE = st.text(st.sampled_from(list(";#\"'\\\n\r\t\x00\x1b\x7f []{}$%=ab\u2028\x85é")), max_size=12)
TEXT = st.one_of(st.text(max_size=30), HOSTILE)
# the same without control characters: what a writer takes, for the tests that run a program on it
WRITABLE = st.text(st.sampled_from(list(";#\"'\\ []{}$%=ab\u2028é")) | st.characters(blacklist_categories=("Cs", "Cc")),
                   max_size=12)
FAST = settings(max_examples=60, deadline=1000)
SLOW = settings(max_examples=6, deadline=None)   # each example runs a program


def refused_naming(error: ValueError, what: str) -> bool:
    return str(error).startswith(f"{what}: ")


# llama.cpp's preset INI

def ini_parse(text: str) -> dict[str, dict[str, str]]:
    """common/preset.cpp's grammar, by hand (llama.cpp is no library here): line ::= header / kv /
    comment / blank; a value runs to blanks before ``;``, ``#`` or the line's end; no quoting."""
    parsed: dict[str, dict[str, str]] = {}
    section = "default"
    for line in re.split(r"\r\n|\n|\r", text):
        header = re.fullmatch(r"\[[ \t]*+([^\]]+)\][ \t]*(?:[;#].*)?", line)
        kv = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_.-]*+)[ \t]*=[ \t]*+(.*)", line)
        if header:
            section = header[1]
            parsed[section] = {}
        elif kv:
            rest = kv[2]
            end = next(i for i in range(len(rest) + 1) if re.match(r"[ \t]*(?:[;#]|$)", rest[i:]))
            parsed.setdefault(section, {})[kv[1]] = rest[:end]
        elif not re.fullmatch(r"[ \t]*(?:[;#].*)?", line):
            raise ValueError(f"not llama.cpp's preset grammar: {line!r}")
    return parsed


@FAST
@given(key=st.one_of(st.from_regex(formats.INI_KEY, fullmatch=True), TEXT), value=TEXT)
def test_a_preset_line_reads_back_as_written_or_is_refused(key, value):
    try:
        line = formats.ini_line(key, value, "x: tensor_split")
    except ValueError as e:
        assert refused_naming(e, "x: tensor_split")
        return
    assert ini_parse(f"[m]\n{line}\n") == {"m": {key: value}}


@FAST
@given(name=TEXT | st.sampled_from(["*", "m\u00a0", "\u2003m"]), comment=TEXT)
def test_a_preset_section_and_comment_are_one_line_or_refused(name, comment):
    try:
        head = formats.ini_section(name, "x: a model's key")
    except ValueError as e:
        assert refused_naming(e, "x: a model's key")
    else:
        assert ini_parse(f"{head}\nctx-size = 1\n") == {name: {"ctx-size": "1"}} and name != "*" \
            and name == name.strip()
    try:
        line = formats.ini_comment(comment, "x")
    except ValueError as e:
        assert refused_naming(e, "x") and CONTROL.search(comment)
    else:
        assert ini_parse(f"{line}\nctx-size = 1\n") == {"default": {"ctx-size": "1"}}


def router(**per_model) -> dict:
    models = {k: {"repo": f"org/{k}-GGUF", "revision": REV, "size_gib": 10.0} for k in ("a", "b")}
    found, problems = instances(data(models=models, llama_server_instances={"x": {
        "model": "a", "port": 8081, "ctx": 4096, "parallel": 1, "also": ["b"], "per_model": per_model}}))
    assert problems == []
    return found["x"]


def test_a_routers_flag_that_llama_cpp_would_cut_is_refused_naming_it():
    inst = router(b={"tensor_split": "1,1"})
    text = preset_text("x", inst, {"a": "/srv/a.gguf", "b": "/srv/b.gguf"})
    assert ini_parse(text)["b"] == {"model": "/srv/b.gguf", "tensor-split": "1,1"}
    assert ini_parse(text)["*"] == {}   # the instance's own value is null: llama.cpp's default
    for hostile in ("1,1;0", "1,1 # 0", "1\n[evil]", " 1,1"):
        inst["per_model"]["b"]["tensor_split"] = hostile
        with pytest.raises(ValueError, match="^x: b's tensor-split: "):
            preset_text("x", inst, {"a": "/srv/a.gguf", "b": "/srv/b.gguf"})


# nftables

def ruleset(text: str) -> str | None:
    """``text`` loaded by nft in a network namespace of its own, and listed back (None: nft or
    unshare cannot run here)."""
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(text)
        f.flush()
        run = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -f {shlex.quote(f.name)} && nft list ruleset"],
                             capture_output=True, text=True, timeout=20)
    assert run.returncode == 0, run.stderr
    return run.stdout


NFT = shutil.which("nft") and shutil.which("unshare") and \
    subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not NFT, reason="nft, or a network namespace of its own, is not available here")
@SLOW
@given(who=WRITABLE)
def test_an_allow_lists_comment_never_becomes_a_rule(who):
    plain = firewall.text("rigup_rpc", [50052], ["10.0.0.1", "fd00::1"], "roles/rpc_worker", "the heads")
    text = firewall.text("rigup_rpc", [50052], ["10.0.0.1", "fd00::1"], "roles/rpc_worker", who)
    assert len(text.splitlines()) == len(plain.splitlines()) and ruleset(text) == ruleset(plain)


@FAST
@given(name=TEXT)
def test_an_nftables_name_and_comment_are_one_or_refused(name):
    try:
        assert formats.nft_name(name, "an nftables table") == name
    except ValueError as e:
        assert refused_naming(e, "an nftables table")
        return
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name)
    with pytest.raises(ValueError, match="^inet rigup_rpc: "):
        firewall.text("rigup_rpc", [50052], ["10.0.0.1"], "roles/rpc_worker", f"the heads{name}\n")


PORTS = st.one_of(st.integers(-2, 70000), st.booleans(), st.floats(), st.text(max_size=6),
                  st.tuples(st.integers(-2, 70000), st.integers(-2, 70000)), st.tuples(st.booleans(), st.integers(1, 9)))


@FAST
@given(ports=st.lists(PORTS, max_size=4))
def test_an_nftables_set_of_ports_holds_tcp_ports_or_is_refused(ports):
    """Round 2 of issue 61, item 19: the writer checks its own ports ([True, 70000, (9000, 8000)] was written)."""
    try:
        text = firewall.port_set(ports)
    except ValueError as e:
        assert str(e).startswith("an nftables set of ports: ")
        return
    for p in ports:
        lo, hi = p if isinstance(p, tuple) else (p, p)
        assert all(type(n) is int and 1 <= n <= 65535 for n in (lo, hi)) and lo <= hi, (ports, text)
    assert text == ", ".join(f"{p[0]}-{p[1]}" if isinstance(p, tuple) else str(p) for p in ports)


def test_the_red_teams_ports_are_refused():
    for bad in ([True], [70000], [(9000, 8000)], [0], ["80"]):
        with pytest.raises(ValueError, match="no TCP port|no range") as e:
            firewall.port_set(bad)
        print(f"port_set({bad!r}) -> refused: {e.value}")
    assert firewall.port_set([6379, (10002, 10101)]) == "6379, 10002-10101"


# systemd

@FAST
@given(args=st.lists(TEXT, max_size=6), name=st.one_of(st.from_regex(formats.ENV_NAME, fullmatch=True), TEXT),
       value=TEXT)
def test_a_units_words_read_back_as_written_or_are_refused(args, name, value):
    try:
        line = " ".join(formats.systemd_quote(a) for a in args)
    except ValueError as e:
        assert str(e).startswith("an argument of a unit's command: ") and any(CONTROL.search(a) for a in args)
    else:
        assert not CONTROL.search(line) and systemd_split(line) == args
    try:
        word = formats.systemd_env(name, value)
    except ValueError as e:
        assert str(e).startswith("Environment") and (CONTROL.search(value) or not formats.ENV_NAME.fullmatch(name))
    else:
        assert not CONTROL.search(word) and systemd_env_split(word) == {name: value}
    try:
        env_line = formats.env_file_line(name, value)
    except ValueError:
        assert CONTROL.search(value) or not formats.ENV_NAME.fullmatch(name)
    else:   # systemd's EnvironmentFile takes the shell's double quotes: backslash escapes, no expansion
        key, _, quoted = env_line.partition("=")
        assert key == name and shlex.split(quoted) == [value]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
@SLOW
@given(args=st.lists(WRITABLE, min_size=1, max_size=6), value=WRITABLE)
def test_systemd_reads_a_unit_of_any_words_without_a_complaint(args, value):
    words = [formats.systemd_quote(a) for a in args]
    env = formats.systemd_env("RIGUP_X", value)
    with tempfile.TemporaryDirectory() as d:
        unit = Path(d) / "rigup-formats.service"
        unit.write_text(f"[Service]\nType=oneshot\nEnvironment={env}\nExecStart=/bin/echo {' '.join(words)}\n")
        run = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                             timeout=30)
    assert run.returncode == 0 and str(unit) not in run.stderr, run.stderr


def test_a_revision_or_build_with_a_newline_never_reaches_a_unit_comment():
    assert formats.unit_comment("a" * 40, "m: its model's revision") == "a" * 40
    with pytest.raises(ValueError, match="^m: its model's revision: "):
        formats.unit_comment("a\nExecStartPre=+/bin/sh", "m: its model's revision")


# YAML (host_vars)

JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                       max_leaves=8)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@FAST
@given(doc=JSONISH)
def test_host_vars_read_back_as_written_or_are_refused(doc):
    doc = {"llama_server_tuned": {"glm": {"flags": doc}}}
    try:
        text = formats.yaml_text(doc, "host_vars/rig-07.yml")
    except ValueError as e:
        assert refused_naming(e, "host_vars/rig-07.yml")
        return
    assert text == yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)   # the bytes tune.py wrote before
    assert same(yaml.safe_load(text), doc)


# the Prometheus text exposition

SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)(?: -?[0-9]+)?")   # a timestamp in ms may follow


def exposition(text: str) -> list[tuple[str, dict[str, str], str]]:
    """The samples of a text exposition, strictly: HELP and TYPE lines, samples ``name{l="v",...} value``
    with only ``\\\\``, ``\\"`` and ``\\n`` escaped in a value; anything else is a ValueError."""
    lines = text.split("\n")
    if lines.pop() != "":
        raise ValueError("no newline at the end")
    samples = []
    for line in lines:
        if re.fullmatch(r"# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*", line):
            continue
        m = SAMPLE.fullmatch(line)
        if not m:
            raise ValueError(f"not a sample: {line!r}")
        labels, body = {}, (m[2] or "{}")[1:-1]
        while body:
            lm = re.match(r'([a-zA-Z_][a-zA-Z0-9_]*)="', body)
            if not lm:
                raise ValueError(f"not a label: {body!r}")
            i, value = lm.end(), []
            while body[i] != '"':
                if body[i] == "\\":
                    value.append({"\\": "\\", '"': '"', "n": "\n"}[body[i + 1]])   # KeyError: an escape it has not
                    i += 2
                else:
                    value.append(body[i])
                    i += 1
            if lm[1] in labels:
                raise ValueError(f"the label {lm[1]} twice: {line!r}")   # Prometheus fails the whole scrape
            labels[lm[1]] = "".join(value)
            body = body[i + 1:].removeprefix(",")
        samples.append((m[1], labels, m[3]))
    return samples


COPIES = {"roles/gpu_guard/shipped/guard.py:escaped": guard.escaped, "roles/metrics/shipped/relay.py:label": relay.label,
          "roles/model_fetch/shipped/fetcher.py:label": fetcher.label, "roles/burnin/shipped/acceptance.py:label": acceptance.label,
          "roles/watchdog/shipped/watchdog.py:label": watchdog.label}


@FAST
@given(value=TEXT)
def test_each_host_programs_label_escape_is_the_boundarys_and_reads_back(value):
    assert {name: f(value) for name, f in COPIES.items()} == {name: formats.prom_label(value) for name in COPIES}
    assert exposition(f'm{{a="{formats.prom_label(value)}",b="x"}} 1\n') == [("m", {"a": value, "b": "x"}, "1")]


def test_the_copies_are_the_boundarys_rows_users():
    (row,) = [c for c in formats.CROSSINGS if c.reader.endswith(":prom_label")]
    assert set(row.users.split(", ")) == set(COPIES)


BUS = '0000:01:00.0"} 1\nrigup_gpu_guard_tripped 1\n# x'   # a quote and a newline in a bus id


def test_a_bus_id_with_a_quote_and_a_newline_stays_one_label_in_every_exposition(tmp_path):
    xid = exposition("\n".join(guard.xid_metrics({"cards": {BUS: {"counts": {"memory": 2}, "suspect": {"since": 1}}},
                                                  "seen": {BUS: {"index": 'x"\n'}}}, [])) + "\n")
    assert [(n, s["bus"], s["gpu"]) for n, s, _ in xid] == [("rigup_gpu_xid_events", BUS, 'x"\n'),
                                                             ("rigup_gpu_suspect", BUS, 'x"\n')]
    links = {BUS: {"link": {"gen": 3, "gen_max": '4"\n'}}, "b": {"link": {"gen": "3\nrigup_gpu_guard_tripped 1"}}}
    slow = [x for x in exposition("\n".join(guard.xid_metrics({"cards": links}, [])) + "\n") if "pcie" in x[0]]
    assert slow == [("rigup_gpu_pcie_gen_under_load", {"bus": BUS, "gpu": "", "max": '4"\n'}, "3")]
    path = tmp_path / "burnin.prom"
    acceptance.write_metrics(str(path), {"GPU-1": {"passed": False, "bus_id": BUS, "level": "x\\", "seconds": "1\nevil 2"}})
    burnin = exposition(path.read_text())
    assert [n for n, _, _ in burnin] == ["rigup_gpu_burnin_passed", "rigup_gpu_quarantined", "rigup_gpu_burnin_seconds"]
    assert all(s == {"uuid": "GPU-1", "bus_id": BUS, "level": "x\\"} for _, s, _ in burnin) and burnin[2][2] == "0"
    model = 'm"} 1\nrigup_router_model_loaded 1'
    assert exposition("\n".join(relay.labelled("llamacpp:requests 3\n", model, set())) + "\n") == [
        ("llamacpp:requests", {"model": model}, "3")]
    config = {"maintenance": False, "interval_s": 60, "max_reboots": 1, "reboot": False}
    dog = exposition(watchdog.metrics_text({model: {}}, {model: 5.0}, config, 0.0, {"count": 0}))
    assert ("rigup_watchdog_floor_tokens_per_second", {"llama_instance": model}, "5.0") in dog


SERVER_LABELS = st.dictionaries(st.sampled_from(["model", "slot", "a", "__x"]), TEXT, max_size=3)


@FAST
@given(lines=st.lists(st.one_of(TEXT.map(lambda t: "llamacpp:" + t),
                                st.tuples(st.sampled_from(["llamacpp:requests", "llamacpp:x_total", "up"]), SERVER_LABELS,
                                          st.sampled_from(["1", "2.5", "-1e3", "NaN", "+Inf", "1 1700000000", "x"])).map(
                                    lambda s: s[0] + ("{" + ",".join(f'{k}="{formats.prom_label(v)}"' for k, v in s[1].items())
                                                      + "}" if s[1] else "") + " " + s[2])), max_size=6),
       model=TEXT)
def test_the_relays_labelled_samples_are_one_exposition_with_its_model_alone(lines, model):
    """roles/metrics/shipped/relay.py labelled, held to the exposition's own reading (a newline alone ends a line; one
    label of a name per sample): whatever a server's /metrics holds, the relay's text parses, and each
    sample's model is the relay's (round 2 of issue 61, items 27 and 28)."""
    out = relay.labelled("\n".join(lines) + "\n", model, set())
    for name, labels, _ in exposition("".join(f"{line}\n" for line in out)):
        assert name.startswith("llamacpp:") and labels["model"] == model, (lines, out)
    plain = relay.checked("\n".join(lines) + "\n")   # a plain instance's, relayed as it was
    assert all(name.startswith("llamacpp:") for name, _, _ in exposition("".join(f"{line}\n" for line in plain)))


# HAProxy

@FAST
@given(value=st.one_of(TEXT, st.sampled_from(["unix@/run/docker.sock", "abns@x", "fd@3", "sockpair@4", "ipv4@10.0.0.1",
                                              "ipv6@::1", "/run/x.sock", "10.0.0.1", "fd00::12", "gpu1.example.org"])),
       port=st.one_of(st.integers(-1, 70000), st.booleans(), st.text(max_size=5)))
def test_an_haproxy_name_is_plain_and_an_address_a_host_and_port_or_refused(value, port):
    """A name or an address with '@' or '/' is another kind of socket to HAProxy (round 2 of issue 61, item 31:
    haproxy_word took unix@/run/docker.sock as a server's address)."""
    for writer, args in ((formats.haproxy_word, (value,)), (formats.haproxy_address, (value, port))):
        try:
            word = writer(*args, "haproxy.cfg: a backend")
        except ValueError as e:
            assert refused_naming(e, "haproxy.cfg: a backend")
            continue
        assert not re.search(r"[\s#\"'\\${}/]", word) and "@" not in word.removeprefix("ipv6@"), (args, word)
        if writer is formats.haproxy_word:
            assert word == value
        else:
            assert word in (f"{value}:{port}", f"ipv6@[{value}]:{port}") and 1 <= port <= 65535 and type(port) is int


def gateway(server: str, address: str = "10.0.0.11", model: str = "tiny") -> list[dict]:
    servers = [[server, address, 8081, False], ["lab2", "fd00::12", 8081, True]]
    return [{"name": "gateway-gemma", "bind": "0.0.0.0", "port": 8081, "key": False, "servers": servers},
            {"name": f"gateway-gemma.{model}", "bind": "0.0.0.0", "port": 8081, "key": False,
             "route": {"of": "gateway-gemma", "model": model}, "servers": [s + [False] for s in servers]}]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
@SLOW
@given(server=st.from_regex(NAME, fullmatch=True), model=st.from_regex(NAME, fullmatch=True))
def test_haproxy_reads_a_config_of_any_names(server, model):
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(haproxy_cfg(gateway(server, model=model), data()))
        f.flush()
        run = subprocess.run(["haproxy", "-c", "-f", f.name], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("server, address, model, what", [
    ("lab1 backup", "10.0.0.11", "tiny", "haproxy.cfg: a server of gateway-gemma"),
    ("lab1", "10.0.0.11#", "tiny", "haproxy.cfg: gateway-gemma's lab1"),
    ("lab1", "10.0.0.11", 'tiny } || { always_true', "haproxy.cfg: a model of gateway-gemma"),
    ("lab1", "unix@/run/docker.sock", "tiny", "haproxy.cfg: gateway-gemma's lab1"),
    ("lab1", "fd@3", "tiny", "haproxy.cfg: gateway-gemma's lab1"),
    ("lab1", "/run/docker.sock", "tiny", "haproxy.cfg: gateway-gemma's lab1")])
def test_a_word_haproxy_would_read_as_more_is_refused_naming_it(server, address, model, what):
    with pytest.raises(ValueError, match=f"^{re.escape(what)}: ") as e:
        haproxy_cfg(gateway(server, address, model), data())
    print(f"server {server!r} at {address!r}, model {model!r} -> refused: {e.value}")


def test_a_valid_config_renders_as_before():
    """haproxy_cfg with the address check: byte-identical for valid input (IPv4, IPv6 through bind_text's ipv6@)."""
    text = haproxy_cfg(gateway("lab1"), data())
    assert "server lab1 10.0.0.11:8081" in text and "server lab2 ipv6@[fd00::12]:8081" in text


def test_every_writer_is_a_row_of_the_boundarys_table():
    rows = {c.reader.split(":")[1] for c in formats.CROSSINGS}
    public = {n for n in dir(formats) if callable(getattr(formats, n)) and not n.startswith("_")
              and getattr(getattr(formats, n), "__module__", "") == formats.__name__}
    assert public - rows == set(formats.GENERIC), json.dumps(sorted(public - rows))


@pytest.mark.parametrize("arg", ["--alias=a\x9b2J", "x\x9d0;title\x9c", "\x85", "a\x80b"])
def test_a_c1_control_never_reaches_a_units_command(arg):
    """C1 controls (\\x80-\\x9f: \\x9b is CSI, \\x9d OSC to a terminal that reads 8-bit controls) are
    refused as C0 ones are: systemctl cat would show them raw (red team, issue 61)."""
    with pytest.raises(ValueError) as refused:
        formats.systemd_quote(arg)
    print(f"\n{arg!r}: {refused.value}")
    assert "control character" in str(refused.value)


ADDRESSES = st.one_of(TEXT, st.ip_addresses().map(str), st.ip_addresses(v=6).map(lambda a: f"{a}%{'eth0'}"),
                      st.sampled_from(["fe80::1%x } accept\n\t\ttcp dport 22 accept #", "10.0.0.0/8", "0.0.0.0", "::",
                                       "10.0.0.01", "FD00::1", " 10.0.0.1", "10.0.0.1\n", "host.example",
                                       "::ffff:0.0.0.0", "::ffff:127.0.0.1", "::127.0.0.1", "::1"]))


@FAST
@given(value=ADDRESSES)
def test_an_allow_lists_address_is_one_hosts_ip_or_refused(value):
    """issue 61 (red team item 13): ipaddress keeps an IPv6 zone verbatim ('fe80::1%x } accept<NL>tcp
    dport 22 accept #'), so the allow-list got a rule of its own; now only the characters of an IP
    address, parsed back to the same address, and never a zone, a network or the wildcard."""
    try:
        written = formats.nft_address(value, "inet rigup_rpc: an allowed address")
    except ValueError as e:
        assert refused_naming(e, "inet rigup_rpc: an allowed address")
        return
    assert re.fullmatch(r"[0-9a-f:.]+", written) and ipaddress.ip_address(written) == ipaddress.ip_address(value)
    assert one_host(ipaddress.ip_address(written))


@pytest.mark.parametrize("value", ["::ffff:0.0.0.0", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::0.0.0.2",
                                   "::127.0.0.1", "0::0"])
def test_an_ipv6_form_of_an_ipv4_address_never_reaches_the_allow_list(value):
    """issue 61 round 3, item 4: '::ffff:0.0.0.0' passed (is_unspecified is False for it)."""
    with pytest.raises(ValueError, match="^inet rigup_rpc: an allowed address: not the IP address of one host") as e:
        formats.nft_address(value, "inet rigup_rpc: an allowed address")
    print(f"\n{value}: refused: {e.value}")


def test_a_zoned_address_never_reaches_the_allow_list():
    zoned = "fe80::1%x } accept\n\t\ttcp dport 22 accept #"
    with pytest.raises(ValueError, match="^inet rigup_rpc: an allowed address: not the IP address of one host") as e:
        firewall.text("rigup_rpc", [50052], ["10.0.0.1", zoned], "roles/rpc_worker", "the heads")
    print(f"refused: {e.value}")


@pytest.mark.skipif(not NFT, reason="nft, or a network namespace of its own, is not available here")
@SLOW
@given(sources=st.lists(st.ip_addresses().filter(one_host).map(str), min_size=1, max_size=4))
def test_an_allow_lists_addresses_load_in_nft(sources):
    listed = ruleset(firewall.text("rigup_rpc", [50052], sources, "roles/rpc_worker", "the heads"))
    assert all(str(ipaddress.ip_address(s)) in listed for s in sources if ipaddress.ip_address(s).version == 4)


@pytest.mark.parametrize("host", ["fd:3", "-x.", "0", "127.1", "a:b", "10.1", "1.2.3.4.5", "10.0.0.010", "x-", "a..b",
                                  "host.", "fe80::1%eth0", "gpu_1", "x" * 64, "a." * 127 + "b"])
def test_an_haproxy_host_is_an_ip_address_or_a_dns_name(host):
    """round 3 X5, round 2 E6/E8: haproxy_address took 'fd:3' (written ipv6@[fd:3]), '-x.', and inet_aton's
    short forms '0' and '127.1' (a server at 0.0.0.0 or 127.0.0.1 to the resolver): HAProxy refused some
    only at its reload, after the file was written; none is an IP address or a DNS host name."""
    with pytest.raises(ValueError, match="^haproxy.cfg: h1: not an IP address or a host name"):
        formats.haproxy_address(host, 8081, "haproxy.cfg: h1")


@pytest.mark.parametrize("host, written", [("10.0.0.1", "10.0.0.1:8081"), ("fd00::12", "ipv6@[fd00::12]:8081"),
                                           ("::", "ipv6@[::]:8081"), ("gpu1.example.org", "gpu1.example.org:8081"),
                                           ("lab-1", "lab-1:8081"), ("3com.example", "3com.example:8081"),
                                           ("a" * 63 + ".b", "a" * 63 + ".b:8081")])
def test_an_ip_address_or_a_dns_name_is_written(host, written):
    assert formats.haproxy_address(host, 8081, "haproxy.cfg: h1") == written


@FAST
@given(host=st.one_of(TEXT, st.from_regex(r"[0-9a-fA-F:.%-]{1,12}", fullmatch=True),
                      st.from_regex(r"[a-z0-9.-]{1,12}", fullmatch=True)))
def test_an_haproxy_address_is_a_parsed_ip_or_a_name_whose_last_label_is_no_number(host):
    """Property: what haproxy_address writes names an IP address as Python's ipaddress reads it, or a
    DNS name of letters, digits and '-' labels whose last label is not all digits."""
    try:
        word = formats.haproxy_address(host, 80, "haproxy.cfg: h1")
    except ValueError:
        return
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    labels = host.split(".")
    assert word == f"{host}:80" and all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?", p) for p in labels)
    assert not labels[-1].isdigit()
