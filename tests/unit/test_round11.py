"""Issue 61, round 11 (an independent hostile round against HEAD, 2026-12-07): each case it found not
refused, refused now, named by its id in the round's report."""
import pytest

from tests.unit.hosts import data, host

MODEL = {"repo": "org/model-GGUF", "revision": "0" * 40}


@pytest.mark.parametrize("bad", [{"dest": "/srv/models/a;b"}, {"repo": "../x"}, {"revision": "main;x"}])
def test_p2_a_router_whose_set_names_a_wrong_model_entry_is_refused_not_a_crash(bad):
    """P2: a router (also: [n]) whose model n is itself wrong was kept, and the set's VRAM plan read
    n's entry: KeyError in preflight, which pyinfra turns into the end of the run for every host."""
    from rigup.instances.llama_server import instances
    from rigup.serving import serving_plan
    from roles import in_order

    d = data(models={"m": MODEL, "n": {**MODEL, **bad}},
             llama_server_instances={"x": {"model": "m", "port": 8081, "also": ["n"]}})
    found, problems = instances(d)
    print(bad, "->", problems)
    assert found == {} and ("llama_server_instances.x.also",
                            "names n, whose entry of models is wrong (models.n: see its own problem)") in problems
    plan, _ = host("a100")
    assert serving_plan([r.engine for r in in_order() if r.engine], d, plan)["llama-server"] is None


@pytest.mark.parametrize("args", [["--control-vector", "/tmp/x.gguf"], ["--control-vector-scaled", "/tmp/x.gguf", "0.8"],
                                  ["--control_vector=/tmp/x.gguf"], ["--control-vector-layer-range", "1", "9"]])
def test_c4_a_control_vector_is_held_off_until_allowed(args):
    """C4: llama-server's --control-vector read a file of any host path into every client's answers."""
    from rigup.instances.llama_server import instances

    entry = {"model": "m", "port": 8081, "extra_args": args}
    refused = instances(data(models={"m": MODEL}, llama_server_instances={"x": entry}))[1]
    allowed = instances(data(models={"m": MODEL}, llama_server_instances={"x": entry},
                             llama_server_allow=["control_vectors"]))[1]
    print(args, "->", refused)
    assert [p for p, _ in refused] == ["llama_server_instances.x.extra_args"] and "control_vectors" in refused[0][1]
    assert allowed == []


def _pass(**over) -> dict:
    rec = {"schema": 2, "passed": True, "level": "quick", "at": 1.7e9, "failed": [],
           "key": {"driver": "550.54", "memory_mib": 81920},
           "figures": {"vram": {"mib": 60000, "patterns": 1, "mismatches": 0}, "compute": {"checked": 1000, "wrong": 0}},
           "gemm": {"load": "cublas", "repeats": 5, "differ": 0, "tflops": 300.0}, "power": {"mean_w": 390.0, "ratio": 0.97}}
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            rec.setdefault(section, {})[name] = value
        else:
            rec["figures"][section] = value
    return rec


@pytest.mark.parametrize("over, why", [
    ({"gemm__differ": 3}, "GEMM repeats that differ"), ({"gemm__error": "GEMM: digest differs"}, "a GEMM error"),
    ({"soak": {"samples": 40, "xids": [79]}}, "an Xid during the soak"), ({"health": {"worse": ["row remaps"]}}, "a worse health reading"),
    ({"dcgm": {"failed": ["memory"]}}, "a failed DCGM diag"), ({"vram": {"mib": 0}}, "without its figures"),
    ({"gemm__differ": "3"}, "GEMM repeats that differ"), ({"gemm__tflops": float("nan")}, "unreadable")])
def test_b1_a_pass_whose_own_schema_2_figures_name_a_fault_is_not_believed(over, why):
    """B1: a record marked passed whose gemm said 3 of 5 repeats differed (or a 0-MiB VRAM test) was
    believed: rigup-burnin's judge fails those, so the pass was written by hand."""
    import json

    from rigup.boundary import burnin
    from rigup.boundary.core import Unreadable

    good = burnin.records(json.dumps({"GPU-1": _pass()}), "h:burnin.json")
    assert "GPU-1" in good.cards and not good.untested
    try:
        got = burnin.records(json.dumps({"GPU-1": _pass(**over)}, allow_nan=True), "h:burnin.json")
    except Unreadable as e:
        print(over, "-> unreadable:", e)
        assert why == "unreadable"
        return
    print(over, "->", got.untested)
    assert "GPU-1" not in got.cards and why in got.untested["GPU-1"]


@pytest.mark.parametrize("name", ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                                  "HF_MODULES_CACHE", "XDG_CACHE_HOME", "LD_PRELOAD", "PYTHONPATH"])
def test_v4_a_vllm_variable_that_loads_code_from_a_path_is_refused(name):
    """V4: a vLLM instance's env NCCL_NET_PLUGIN=/tmp/evil.so (dlopened by every worker) or
    TRITON_CACHE_DIR=/tmp/shared (compiled kernels loaded from another user's directory) passed."""
    from rigup.instances.vllm import instances

    entry = {"model": "m", "port": 8000, "env": {name: "/tmp/shared/x.so"}}
    found = instances(data(models={"m": MODEL}, vllm_instances={"v": entry}))[1]
    ok = instances(data(models={"m": MODEL}, vllm_instances={"v": {**entry, "env": {"NCCL_DEBUG": "WARN"}}}))[1]
    print(name, "->", found)
    assert [p for p, _ in found] == [f"vllm_instances.v.env.{name}"] and ok == []
    assert "loads code" in found[0][1] or "one rigup sets" in found[0][1]   # a cache rigup sets itself (round 13 V28)


# ---- round 12 (the same file: each case named by its id in /tmp/redteam/round12.md)

@pytest.mark.parametrize("url", ["https://u:TOKEN@github.com/ggml-org/llama.cpp", "https://TOKEN@github.com/x/y.git",
                                 "HTTPS://u:p@h/x"])
def test_sec2_sec3_a_url_with_credentials_is_refused_for_llama_cpp_and_never_printed_or_run(url, capsys):
    """SEC2: llama_cpp_source https://u:TOKEN@... stood in the controller's git ls-remote and the host's
    git clone; SEC3: refusals quoted URLs whole, token included. Every line for the operator goes through
    rigup.text.say, which redacts a URL's credentials (rigup.text.redacted)."""
    from rigup.text import redacted, say
    from roles.llama_cpp import artifact
    from roles.llama_cpp.checks import check_source

    found = check_source({}, {}, data(llama_cpp_source=url, llama_cpp_ref="b8779"))
    for r in found:
        say(f"    {r.line('h')}", fg="red")
    say(f"hf_endpoint: expected an https:// URL, got {url!r}")   # a refusal quoting the URL (SEC3's)
    said = capsys.readouterr().err
    print(said)
    assert "credentials" in [r.check for r in found] and "TOKEN" not in said and ":p@" not in said and "***@" in said
    assert artifact.resolved(url, "b8779") == (None, "llama_cpp_source carries credentials in its URL: not asked")
    for plain in ("ssh://git@github.com/x/y", "git@github.com:x/y", "https://github.com/x/y", "file:///srv/a@b"):
        assert redacted(plain) == plain


@pytest.mark.parametrize("args, refused", [(["--reasoning-parser", "deepseek_r1"], False), (["--reasoning_parser=x"], False),
                                           (["--reasoning-parser-plugin", "/x.py"], True), (["--reasoning-parser-p", "/x.py"], True),
                                           (["--tool-call-parser", "hermes"], False)])
def test_a_vllm_flag_given_whole_is_no_abbreviation_of_a_longer_held_one(args, refused):
    """vLLM's argparse takes a flag given whole as it is: --reasoning-parser (a reasoning model's common
    flag) was refused as an abbreviation of the held-off --reasoning-parser-plugin."""
    from rigup.instances.vllm import instances

    found = instances(data(models={"m": MODEL}, vllm_instances={"v": {"model": "m", "port": 8000, "extra_args": args}}))[1]
    print(args, "->", found)
    assert bool(found) == refused


# ---- round 13 (/tmp/redteam/round13.md)

@pytest.mark.parametrize("url, secret", [
    ("https://me@corp:TOKEN@hub/x", "TOKEN"), ("git+https://TOKEN@github.com/x", "TOKEN"), ("ftp://TOKEN@h/x", "TOKEN"),
    ("s3://TOKEN@bucket/x", "TOKEN"), ("git:TOKEN@host:path", "TOKEN"), ("//u:TOKEN@host/x", "TOKEN"),
    ("https://h/x?access_token=TOKEN&a=1", "TOKEN"), ("https://h/x?X-Amz-Signature=TOKEN", "TOKEN"),
    # round 14 SEC9, SEC10, SEC12: glued to a flag or a key; after # or ;
    ("-ihttps://u:TOKEN@host/simple", "TOKEN"), ("url:https://u:TOKEN@h/x", "TOKEN"),
    ("https://h/x#access_token=TOKEN", "TOKEN"), ("https://h/x;token=TOKEN", "TOKEN")])
def test_sec5_to_sec8_every_url_form_of_a_secret_is_redacted_and_refused(url, secret, capsys):
    """SEC5-SEC8: a login holding '@', a bare login of another scheme than http(s), the scp form with a
    password, a scheme-less //user:pass@, a secret query parameter: printed whole by say(), and the pip
    argument git+https://TOKEN@ reached pip's argv."""
    from rigup.text import say
    from roles.llama_cpp.checks import check_source
    from roles.vllm.checks import credentialed

    say(f"refused: got {url!r}")
    said = capsys.readouterr().err
    print(said.strip())
    assert secret not in said and "***" in said
    assert credentialed(data(vllm_pip_args=[url])) == ["vllm_pip_args[0]"]
    assert "credentials" in [r.check for r in check_source({}, {}, data(llama_cpp_source=url, llama_cpp_ref="b8779"))]


@pytest.mark.parametrize("plain", ["ssh://git@github.com/x/y", "git@github.com:x/y", "https://github.com/x/y",
                                   "git+https://github.com/org/repo@v1.2#egg=x",
                                   "file:///srv/a@b", "user@host", "https://h/x?a=b@c", "--extra-index-url=https://h/simple"])
def test_a_url_without_a_secret_comes_back_as_it_is(plain):
    from rigup.text import redacted
    from roles.vllm.checks import credentialed

    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


def test_sv1_a_preset_the_hubs_file_name_cannot_hold_fails_that_host_not_the_run():
    """SV1: a hub GGUF named 'm#1.gguf' (or ';', '[') passes the listing and the marker; preset_text refuses
    its path (ValueError), and inside the server's operation pyinfra ended the run for every host at anything
    but a PyinfraError: the operation turns it into an OperationError (that host failed, named). Held on the
    syntax tree: every call of preset_text in the role's operations is inside such a try."""
    import ast
    from pathlib import Path

    from roles.llama_server.command import preset_text

    with pytest.raises(ValueError, match="cannot hold"):
        preset_text("r", {"model": "a", "also": ["b"], "per_model": {}}, {"a": "/srv/a/a.gguf", "b": "/srv/b/m#1.gguf"}, {})
    tree = ast.parse((Path(__file__).resolve().parents[2] / "roles/llama_server/__init__.py").read_text())
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
               and any(ast.unparse(h.type) == "ValueError" and "OperationError" in ast.unparse(h) for h in t.handlers)
               for stmt in t.body for n in ast.walk(stmt)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "preset_text"]
    assert calls and all(id(c) in guarded for c in calls)


@pytest.mark.parametrize("key", ["rigup_maintenance", "balancer_gateway", "burnin_pulse"])
def test_ro1_a_roll_reads_its_hosts_flags_typed(key):
    """RO1: roll.py read rigup_maintenance, balancer_gateway and burnin_pulse by truthiness: "false" was true,
    and the host silently left out of the roll while its plays refuse the value."""
    from plays import roll

    serving = {"llama_server_instances": {"g": {"model": "g", "port": 8081}}}
    hosts = {"lab1": {**serving}, "lab2": {**serving, key: "false"}}
    with pytest.raises(ValueError, match=f"host lab2: {key}: expected bool"):
        roll.serving_hosts(hosts) if key != "burnin_pulse" else roll.flag("lab2", hosts["lab2"], key)
    assert roll.serving_hosts({"lab1": serving, "lab2": {**serving, key: False}}) == ["lab1", "lab2"]
    assert roll.flag("lab1", {}, key) is False


def test_ro3_a_roll_reads_rigup_batch_from_every_host():
    """Round 14 RO3: roll.py read rigup_batch from the first host only: another host's bad value was ignored."""
    from plays import roll

    with pytest.raises(ValueError, match="rigup_batch: the hosts of one roll set it apart .*lab2: '2m'"):
        roll.batch_of({"lab1": {"rigup_batch": 2}, "lab2": {"rigup_batch": "2m"}}, ["lab1", "lab2"])
    assert roll.batch_of({"lab1": {"rigup_batch": "50%"}, "lab2": {"rigup_batch": "50%"}}, ["lab1", "lab2"]) == "50%"
    assert roll.batch_of({"lab1": {}}, ["lab1"]) == 1 and roll.batch_of({}, []) == 1
