"""Inference only, by default (issue 63): llama-server's features beyond inference
(rigup/contract/llama_server.py ``HELD_OFF``) are refused in an instance's extra_args under every
spelling unless ``llama_server_allow`` names them, rigup writes ``--no-slots`` and
``LLAMA_ARG_CORS_ORIGINS`` (empty: no origin), and HAProxy answers 403 for their paths. The table
is held to llama.cpp's own common/arg.cpp where the lab's cached source is on this machine; the HAProxy
rules are read back by the real HAProxy (``haproxy -c``) and sent requests through it."""

import http.server
import os
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rigup.config import declared
from rigup.contract import llama_server as contract
from roles.balancer.config import HELD_PATHS, gateway_backends, haproxy_cfg, held
from roles.llama_server.command import argv, dropin_text
from rigup.instances.llama_server import instances
from roles.llama_server.checks import settings as run_settings
from tests.unit.hosts import data, glm_llama, host, refusals

# the llama.cpp the lab builds: the sdist tests/lab/sources.py caches (LLAMA_CPP_PYTHON), as fetched
SDIST = next(iter(sorted(Path(os.environ.get("RIGUP_LAB_CACHE", "/var/cache/rigup-lab")).glob("llama_cpp_python-*.tar.gz"))),
             None)


def arg_cpp() -> str:
    """The lab's llama.cpp common/arg.cpp, read from the cached sdist."""
    with tarfile.open(SDIST) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.endswith("/vendor/llama.cpp/common/arg.cpp"))
        return sdist.extractfile(member).read().decode()
WHERE = "llama_server_instances.glm.extra_args"
FEATURES = sorted(contract.HELD_OFF)
SPELLINGS = sorted(contract.held_off_flags())
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)   # control characters: refused as such


def held_off(extra_args: list, allow=()) -> list[str]:
    """The features whose refusal names ``extra_args``'s key path and the allow key."""
    d = data(**glm_llama(extra_args=extra_args), llama_server_allow=list(allow))
    return [re.search(r"llama-server's (\w+)", why)[1] for path, why in instances(d)[1]
            if path == WHERE and "llama_server_allow" in why]


def options() -> list[dict]:
    """Each option of llama.cpp's common/arg.cpp: its spellings, its negations and its variable."""
    found = []
    for block in arg_cpp().split("add_opt(common_arg(")[1:]:
        m = re.match(r'\s*\{([^}]*)\}(\s*,\s*\{([^}]*)\})?', block)
        if not m:
            continue
        env = re.search(r'\.set_env\("(\w+)"\)', block.split("add_opt(")[0])
        found.append({"args": re.findall(r'"([^"]+)"', m[1]), "neg": re.findall(r'"([^"]+)"', m[3] or ""),
                      "env": env[1] if env else None})
    return found


@pytest.mark.skipif(SDIST is None, reason="the lab's llama.cpp source (its cached sdist) is not on this machine")
def test_the_table_is_llama_cpps_own():
    """Every spelling of each feature's options, and each option's variable, as common/arg.cpp has
    them (an option with a spelling of ours has all its spellings here); --no-slots is there."""
    opts = options()
    for name, feature in contract.HELD_OFF.items():
        mine = [o for o in opts if set(o["args"]) & set(feature.flags)]
        assert {s for o in mine for s in o["args"]} == set(feature.flags), name
        assert {o["env"] for o in mine if o["env"]} == set(feature.env), name
    slots = next(o for o in opts if "--slots" in o["args"])
    assert "--no-slots" in slots["neg"] and slots["env"] == "LLAMA_ARG_ENDPOINT_SLOTS"
    assert next(o for o in opts if "--log-prompts-dir" in o["args"])["env"] is None   # none to refuse


def test_the_allow_key_names_exactly_the_features():
    assert declared()["llama_server_allow"].form.item.choices == tuple(contract.HELD_OFF)
    assert declared()["llama_server_allow"].default == [] and declared()["llama_server_cors_origins"].default == []


@pytest.mark.parametrize("flag", SPELLINGS)
def test_each_spelling_is_refused_unless_its_feature_is_allowed(flag):
    feature = contract.held_off_flags()[flag]
    long = flag.startswith("--")
    forms = [[flag], [flag, "x"], [f"{flag}=x"]] + ([["--" + flag[2:].replace("-", "_"), "x"]] if long else [])
    for args in forms:
        assert held_off(["--no-warmup", *args]) == [feature], args
        assert held_off(args, allow=[feature]) == [], args
        assert held_off(args, allow=[f for f in FEATURES if f != feature]) == [feature], args


def test_the_refusal_names_the_key_path_what_it_opens_and_the_allow_key():
    d = data(**glm_llama(extra_args=["--tools", "all"]))
    (path, why), = instances(d)[1]
    assert path == WHERE
    assert "exec_shell_command" in why and why.endswith("drop it, or add tools to llama_server_allow")


@pytest.mark.parametrize("args", [["--jinja", "--chat-template-file", "/etc/passwd"], ["--grammar-file=/etc/passwd"],
                                  ["-jf", "/etc/rigup/x.json"], ["--webui-config-file", "/etc/rigup/x.json"]])
def test_a_flag_that_serves_a_files_text_is_held_off_as_files(args):
    """rerun1 N53: llama-server's GET /props answers the chat template, so --chat-template-file served
    any file the service user reads to every client (--ui-config-file likewise as ui_settings;
    --grammar-file and --json-schema-file as every /completion answer's grammar)."""
    assert held_off(args) == ["files"]
    assert held_off(args, allow=["files"]) == []


def test_negations_and_other_flags_pass():
    assert held_off(["--no-slots", "--no-agent", "-no-ag", "--no-ui-mcp-proxy", "--no-cors-credentials",
                     "--cors-methods", "GET", "--toolsx", "--props-file", "-a-g"]) == []


def test_an_underscore_spelling_of_a_flag_rigup_owns_is_refused_too():
    """llama.cpp reads ``--api_key_file`` as ``--api-key-file`` (common/arg.cpp replaces ``_`` in a
    ``--`` argument): before, it passed preflight and replaced the instance's key file."""
    d = data(**glm_llama(extra_args=["--api_key_file", "/tmp/k"]))
    assert [p for p, why in instances(d)[1] if "--api-key-file" in why] == [WHERE]


@settings(max_examples=60, deadline=1000)
@given(flag=st.sampled_from(SPELLINGS), form=st.sampled_from(["bare", "eq", "sep", "underscores"]), value=TEXT,
       around=st.lists(TEXT, max_size=3), allow=st.lists(st.sampled_from(FEATURES), unique=True))
def test_any_spelling_among_any_arguments_is_refused_unless_allowed(flag, form, value, around, allow):
    if form == "underscores" and flag.startswith("--"):
        flag = "--" + flag[2:].replace("-", "_")
    args = {"bare": [flag], "eq": [f"{flag}={value}"], "sep": [flag, value], "underscores": [flag]}[form]
    feature = contract.held_off_flags()["--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag]
    found = held_off([*around, *args], allow)
    assert (feature in found) == (feature not in allow)


@settings(max_examples=60, deadline=1000)
@given(args=st.lists(st.one_of(st.text(max_size=30), st.integers(), st.none(),
                               st.sampled_from(["-ngl", "--n_gpu_layers", "-fa", "--flash_attn=off", "²", "-1"])),
                     max_size=5))
def test_arbitrary_extra_args_are_refused_or_read_never_a_traceback(args):
    """Through every role's preflight: ``-ngl ²`` ("²".isdigit(), int("²") a ValueError) crashed
    check_traps before it read the value through rigup.boundary.numbers."""
    plan, facts = host("a100")
    found, problems = instances(data(**glm_llama(extra_args=args)))
    assert found or problems
    refusals(plan, facts, data(**glm_llama(extra_args=args)))


def test_a_flag_given_again_with_underscores_is_read_as_llama_cpp_reads_it():
    inst = instances(data(**glm_llama(extra_args=["--n_gpu_layers", "0", "--flash_attn=off", "-ngl", "²"])))[0]["glm"]
    assert run_settings(inst)["flash_attn"] == ("off", "extra_args --flash-attn off")
    assert run_settings(inst)["ngl"] == ("²", "extra_args -ngl ²")   # not a number: text, as before, never a traceback


def test_rigup_writes_no_slots_unless_allowed():
    inst = instances(data(**glm_llama(ctx=4096, parallel=1)))[0]["glm"]
    line = argv("glm", inst, "/b/llama-server", "/m.gguf")
    assert line.count("--no-slots") == 1 and line.index("--no-slots") < line.index("--metrics") + 2
    assert "--no-slots" not in argv("glm", inst, "/b/llama-server", "/m.gguf", allow=["slots"])


def test_the_drop_in_writes_the_cors_origins_empty_by_default():
    inst = instances(data(**glm_llama(ctx=4096, parallel=1)))[0]["glm"]
    text = dropin_text("glm", inst, "/b/llama-server", "/m.gguf", "b", "u", "r", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert "Environment=CUDA_VISIBLE_DEVICES=0\nEnvironment=LLAMA_ARG_CORS_ORIGINS=\n" in text
    assert "--metrics --no-slots\n" in text
    one = dropin_text("glm", inst, "/b/llama-server", "/m.gguf", "b", "u", "r", origins=["https://ui.example:8443"],
                      allow=["slots"])
    assert "Environment=LLAMA_ARG_CORS_ORIGINS=https://ui.example:8443\n" in one and "--no-slots" not in one


@pytest.mark.parametrize("name", sorted(contract.held_off_env()))
def test_an_environment_turning_a_feature_on_is_never_written_unless_allowed(name):
    inst = instances(data(**glm_llama(ctx=4096, parallel=1)))[0]["glm"]
    feature = contract.held_off_env()[name]
    with pytest.raises(ValueError, match=f"^glm: its environment would turn on {name}, which llama_server_allow"):
        dropin_text("glm", inst, "/b/llama-server", "/m.gguf", "b", "u", "r", env={name: "1"})
    text = dropin_text("glm", inst, "/b/llama-server", "/m.gguf", "b", "u", "r", env={name: "1"}, allow=[feature])
    # the origins rigup writes win over another of its own (extra_args' --cors-origins, when allowed, over both)
    assert f"Environment={name}={'' if name == contract.CORS_ENV else '1'}\n" in text


@pytest.mark.parametrize("origins, ok", [
    ([], True), (["https://ui.example"], True), (["http://10.0.0.5:8080"], True), (["http://[fd00::1]:3000"], True),
    (["localhost"], True), (["*"], False), (["https://ui.example/"], False), (["https://ui.example:0"], False),
    (["https://ui.example:65536"], False), (["ftp://ui.example"], False), (["https://a b"], False), ([5], False),
    (["https://a.example", "https://b.example"], False), ("https://ui.example", False), (["null"], False)])
def test_cors_origins_are_one_origin_at_most(origins, ok):
    found = [p for p, _ in instances(data(llama_server_cors_origins=origins))[1] if p == "llama_server_cors_origins"]
    assert (not found) == ok, found


@settings(max_examples=60, deadline=1000)
@given(origins=st.one_of(st.lists(st.one_of(st.text(max_size=40), st.integers(), st.none()), max_size=3), st.text(),
                         st.integers()))
def test_any_cors_origins_are_refused_or_one_origin(origins):
    found = [p for p, _ in instances(data(llama_server_cors_origins=origins))[1] if p == "llama_server_cors_origins"]
    if not found:
        assert not origins or (len(origins) == 1 and re.fullmatch(r"(https?://[^/\s,*]+|localhost)", origins[0]))


def test_each_path_is_held_off_unless_a_feature_that_opens_it_is_allowed():
    assert held([]) == {"models": True, "paths": [(why, cond) for _, why, cond in HELD_PATHS]}
    assert held(FEATURES) == {"models": False, "paths": []}
    assert [why.split(":")[0] for why, _ in held(["mcp"])["paths"]] == ["/slots", "POST /props", "POST /lora-adapters"]
    assert [why.split(":")[0] for why, _ in held(["tools"])["paths"]] == ["/slots", "POST /props", "POST /lora-adapters",
                                                                          "/cors-proxy"]


def test_a_gateway_opens_a_path_only_where_every_host_behind_it_allows_it():
    inst = {"gemma": {"model": "g", "port": 8081}}
    hosts = {"gw": {"balancer_gateway": True},
             "lab1": {"llama_server_instances": inst, "llama_server_allow": ["slots", "props"]},
             "lab2": {"llama_server_instances": inst, "llama_server_allow": ["slots"]}}
    (gateway,) = gateway_backends("gw", hosts, "0.0.0.0")
    assert gateway["allow"] == ["slots"]
    text = haproxy_cfg([gateway], data())
    assert "/slots(/|$)" not in text and "!METH_GET { path,url_dec -m reg /props/?$ }" in text
    assert gateway_backends("gw", {**hosts, "lab2": {"llama_server_instances": inst}}, "0.0.0.0")[0]["allow"] == []


def test_a_hosts_own_frontend_follows_its_own_allow():
    backend = {"name": "llama-x", "bind": "127.0.0.1", "port": 8081, "servers": [["x", "127.0.0.1", 8082]]}
    shut = haproxy_cfg([backend], data())
    opened = haproxy_cfg([backend], data(llama_server_allow=FEATURES))
    assert shut.count("http-request deny deny_status 403") == 1 + len(HELD_PATHS)
    assert "deny_status 403" not in opened


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runnable(text: str) -> str:
    """The rendered haproxy.cfg with a global section an unprivileged test may run (no chroot,
    user, admin socket or state file of the host's): the rest as rendered."""
    return "global\n    log stdout format raw local0\n\n" + text[text.index("defaults\n"):]


class Answer(http.server.BaseHTTPRequestHandler):
    def _any(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = do_PUT = do_DELETE = _any

    def log_message(self, *args):
        pass


REQUESTS = [("GET", "/slots", 403), ("GET", "/slots?fields=prompt", 403), ("POST", "/slots/0?action=save", 403),
            ("GET", "/%73lots", 403), ("GET", "/x/slots", 403), ("POST", "/props", 403), ("PUT", "/props/", 403),
            ("POST", "/models", 403), ("DELETE", "/models?model=x", 403), ("POST", "/models/load", 403),
            ("POST", "/lora-adapters", 403), ("POST", "/%6cora-adapters/", 403), ("GET", "/lora-adapters", 200),
            ("GET", "/tools", 403), ("POST", "/tools", 403), ("GET", "/cors-proxy?url=http://10.0.0.1/", 403),
            ("GET", "/props", 200), ("GET", "/models", 200), ("GET", "/v1/models", 200), ("GET", "/health", 200),
            ("POST", "/v1/chat/completions", 200), ("GET", "/slotsmachine", 200), ("POST", "/v1/props-like", 200)]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed here")
def test_haproxy_reads_the_rules_and_answers_403_for_each_path_held_off():
    """The rendered config through ``haproxy -c``, then served by the real HAProxy in front of a
    server that answers 200 to anything: each path held off is 403 (encoded, under a prefix, with
    a query), inference and the reads pass; with every feature allowed, everything passes."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    seen = {}
    try:
        for allow in ([], FEATURES):
            port = free_port()
            b = {"name": "llama-x", "bind": "127.0.0.1", "port": port, "allow": allow,
                 "servers": [["x", "127.0.0.1", backend.server_address[1]]]}
            text = haproxy_cfg([b], data(balancer_stats_port=free_port(), balancer_check_interval_ms=100))
            seen[bool(allow)] = through_haproxy(text, port, REQUESTS)
    finally:
        backend.shutdown()
    assert seen[False] == REQUESTS
    assert seen[True] == [(m, p, 200) for m, p, _ in REQUESTS]


def through_haproxy(text: str, port: int, requests: list) -> list:
    """``text`` (a rendered haproxy.cfg) read by ``haproxy -c``, then served by the real HAProxy: each of
    ``requests`` (method, path, ...) sent to ``port``, as (method, path, status)."""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(text)
        f.flush()
        check = subprocess.run(["haproxy", "-c", "-f", f.name], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        f.seek(0)
        f.truncate()
        f.write(runnable(text))
        f.flush()
        proc = subprocess.Popen(["haproxy", "-db", "-f", f.name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            return [(m, p, status(m, f"http://127.0.0.1:{port}{p}")) for m, p, *_ in requests]
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def status(method: str, url: str) -> int:
    deadline = time.monotonic() + 10
    while True:
        try:
            request = urllib.request.Request(url, data=b"{}" if method != "GET" else None, method=method)
            with urllib.request.urlopen(request, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:   # HAProxy still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
