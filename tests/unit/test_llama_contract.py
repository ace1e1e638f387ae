"""llama-server's contract (rigup/contract/llama_server.py): every row reaches the entry form, the
command line, the refusals of extra_args by its policy, the tuner and the docs, from the row alone.
A new valued flag is a row there and a case in NEW_FLAGS here, then ``make docs``."""

import pytest

from rigup.config import parse_form
from rigup.contract import llama_server as contract
from rigup.contract import vllm
from rigup.entries import REQUIRED
from roles.llama_cpp.shipped import smoke
from roles.llama_server.command import argv
from rigup.instances.llama_server import LLAMA_INSTANCE, instances
from rigup.instances.tuned import FLAG_KEYS
from rigup.instances.vllm import OWNED_FLAGS, VLLM_INSTANCE
from rigup.instances.vllm import instances as vllm_instances
from tests.docs import ROLE_DOCS
from tests.unit.hosts import REV, data

ROWS = {f.key: f for f in contract.FLAGS}
# a value of each row other than its default (what the command line then carries)
SET = {"ctx": 8192, "parallel": 2, "ngl": 12, "flash_attn": "on", "split_mode": "row", "jinja": False, "batch": 4096,
       "ubatch": 1024, "cache_type_k": "q8_0", "cache_type_v": "q8_0", "cache_ram": 0, "n_cpu_moe": 3, "main_gpu": 1,
       "tensor_split": "1,1", "metrics": False, "cache_reuse": 256,
       "reasoning_budget": 1024, "sleep_idle_s": 300}
# the flags added by a row and a test alone (issue 46): key -> (value, what the command line gets)
NEW_FLAGS = {"cache_reuse": (256, ["--cache-reuse", "256"]), "reasoning_budget": (0, ["--reasoning-budget", "0"]),
             "sleep_idle_s": (300, ["--sleep-idle-seconds", "300"])}


def entry(**inst) -> dict:
    return {"models": {"m": {"repo": "org/model-GGUF", "revision": REV, "size_gib": 10.0}},
            "llama_server_instances": {"x": {"model": "m", "port": 8081, "ctx": 8192, "parallel": 1, **inst}}}


def command(**inst) -> list[str]:
    found, problems = instances(data(**entry(**inst)))
    assert problems == []
    return argv("x", found["x"], "/b/llama-server", "/m.gguf")


def test_every_row_is_well_formed_and_every_spelling_names_one_key():
    spellings = [s for f in contract.FLAGS for s in f.spellings] + list(contract.FIXED)
    assert len(spellings) == len(set(spellings)), "a spelling in two rows"
    for f in contract.FLAGS:
        assert f.policy in (contract.OWNED, contract.ALSO) and f.write in (contract.VALUE, contract.SWITCH, contract.PAIR)
        assert parse_form(f.form).problem(f.default) is None, (f.key, f.default)
        assert LLAMA_INSTANCE[f.key].doc.startswith(f.spellings[0]) and LLAMA_INSTANCE[f.key].default is not REQUIRED
    assert set(SET) == set(ROWS), "give each row a value in SET"


@pytest.mark.parametrize("key", sorted(ROWS))
def test_a_rows_value_reaches_the_command_line_once_by_its_first_spelling(key):
    f, args = ROWS[key], command(**{key: SET[key]})
    if f.write == contract.PAIR:
        assert f.spellings[1] in args and f.spellings[0] not in args
    elif f.write == contract.SWITCH:
        assert f.spellings[0] not in args and f.spellings[0] in command(**{key: True})
    else:
        assert args[args.index(f.spellings[0]) + 1] == str(SET[key])
        assert sum(a in f.spellings for a in args) == 1
    if f.default is None:   # null: llama.cpp's own default, no flag at all
        assert not set(f.spellings) & set(command())


@pytest.mark.parametrize("key, spelling", [(f.key, s) for f in contract.FLAGS for s in f.spellings])
def test_extra_args_may_give_a_flag_again_only_by_its_policy(key, spelling):
    """owned: refused, naming the key to set instead (both spellings, ``--flag=value`` too); also:
    passes, and preflight's checks read the last one."""
    for args in ([spelling, "1"], [f"{spelling}=1"]):
        _, problems = instances(data(**entry(extra_args=args)))
        if ROWS[key].policy == contract.OWNED:
            assert [(p[0], f"set {key}" in p[1]) for p in problems] == [("llama_server_instances.x.extra_args", True)]
        else:
            assert problems == []


def test_the_tuner_the_tuned_keys_and_the_smoke_read_the_same_rows():
    import json
    from plays import tuning
    from plays.shipped import tune
    swept = {f.key for f in contract.FLAGS if f.sweep}
    # the tuner gets the spellings in its spec (no host holds the contract), through JSON, and reads them
    spec = json.loads(json.dumps(tuning.spec("x", ["/b/llama-server"], data(), True, None, ctx=8192, parallel=2)))
    table = tune.spec_flags(spec)
    assert set(FLAG_KEYS) == swept and set(table) == swept | {"port", "host"}
    assert all(table[k] == ROWS[k].spellings for k in swept)
    # every key the sweep sets (each stage, on several GPUs with part of the model in host RAM) is one of them
    base = {"ngl": "12", "n_cpu_moe": "8"}
    keys = {k for s in tune.stages({**spec, "gpus": 2, "layers": 32}, base) for d in s for c in d for k in c}
    assert keys <= swept and keys, keys - swept
    # the smoke (a host program, standalone) sets these itself: the instance's are dropped
    own = {s for k in ("ctx", "parallel", "metrics") for s in ROWS[k].spellings} | set(contract.FIXED) - set(contract.DOWNLOADS)
    assert own <= set(smoke._OWN), own - set(smoke._OWN)


@pytest.mark.parametrize("key", sorted(NEW_FLAGS))
def test_a_flag_added_as_a_row_is_served_refused_in_extra_args_and_documented(key):
    value, expected = NEW_FLAGS[key]
    args = command(**{key: value})
    assert args[args.index(expected[0]):args.index(expected[0]) + len(expected)] == expected
    assert not set(ROWS[key].spellings) & set(command())
    _, problems = instances(data(**entry(extra_args=expected)))
    assert problems and f"set {key}" in problems[0][1]
    page = (ROLE_DOCS / "llama_server.md").read_text()
    assert f"`{key}`" in page and expected[0] in page


def test_no_code_outside_the_role_and_the_contract_reads_the_instances_raw():
    """Every other reader (the metrics, the watchdog, bench.py, rpc.py, the balancer, roll.py,
    status.py, tune.py) reads llama-server's instances through rigup/instances (``normalised``) or
    rigup/contract (``served``): with the defaults and the tuned flags, never the raw entries."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    raw = re.compile(r"""\b(?:data|d)\s*(?:\.get\(|\[)\s*["']llama_server_instances["']""")
    files = [p for p in [*root.glob("*.py"), *(p for d in ("rigup", "roles", "plays", "shipped") for p in root.glob(f"{d}/**/*.py"))]
             if not any(p.is_relative_to(root / d) for d in ("roles/llama_server", "rigup/contract", "rigup/instances"))]
    found = [f"{p.relative_to(root)}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
             if raw.search(line)]
    assert len(files) > 50 and found == [], found


@pytest.mark.parametrize("key, spelling", [(f.key, s) for f in vllm.FLAGS for s in f.spellings])
def test_vllms_contract_rows_are_its_entry_form_and_refused_in_extra_args(key, spelling):
    """vLLM's rows (rigup/contract/vllm.py) make its entry form and its owned flags alike."""
    assert OWNED_FLAGS == vllm.owned() and OWNED_FLAGS[spelling] == key
    assert VLLM_INSTANCE[key].doc.startswith(spelling if spelling == vllm.BY_KEY[key].spellings[0] else
                                             vllm.BY_KEY[key].spellings[0])
    d = data(models={"m": {"repo": "org/model", "revision": REV, "size_gib": 10.0}},
             vllm_instances={"x": {"model": "m", "port": 8000, "extra_args": [spelling, "1"]}})
    _, problems = vllm_instances(d)
    assert any(p[0] == "vllm_instances.x.extra_args" and f"set {key}" in p[1] for p in problems), problems


def test_files_and_the_debug_log_are_held_off():
    """Round 1 of issue 61, A12-A14: --path and --media-path serve the host's files, -v/-lv put
    every client's answer (and a build's request bodies) into the journal; each passed extra_args."""
    from rigup.instances.llama_server import held_off_problems

    for args, feature in ((["--path", "/"], "files"), (["--media-path", "/"], "files"), (["--verbose"], "verbose_log"),
                          (["-v"], "verbose_log"), (["-lv", "5"], "verbose_log"), (["--log_verbosity=5"], "verbose_log"),
                          (["--log-verbose"], "verbose_log")):
        (path, why), = held_off_problems(args, [], "llama_server_instances.x")
        assert path == "llama_server_instances.x.extra_args" and f"add {feature} to llama_server_allow" in why, args
        assert held_off_problems(args, [feature], "llama_server_instances.x") == []
    env = contract.held_off_env()
    assert env["LLAMA_ARG_LOG_VERBOSITY"] == "verbose_log" and env["LLAMA_ARG_STATIC_PATH"] == "files"


def test_an_origins_host_is_labels_joined_by_single_dots():
    """Round 1 of issue 61, A31: 'http://a..-.example' (no host name) was taken as an origin."""
    from rigup.instances.llama_server import cors_problems

    for bad in ("http://a..-.example", "http://-a.example", "http://a-.example", "http://x.", "http://.x",
                "http://" + "a" * 64 + ".example", "https://" + ".".join(["a" * 60] * 5)):
        assert cors_problems({"llama_server_cors_origins": [bad]}), bad
    for good in ("http://a.example", "https://chat.example.org:8443", "http://[::1]:80", "localhost", "http://a-b.c1"):
        assert cors_problems({"llama_server_cors_origins": [good]}) == [], good


@pytest.mark.parametrize("spelling", contract.DOWNLOADS)
def test_extra_args_take_no_model_from_elsewhere(spelling):
    """Issue 61, round 6 LS1: -dr/--docker-repo (llama-server loads a Docker Hub model instead of the
    -m rigup set, sized and pinned) passed; each flag of the class is refused, naming model."""
    underscored = [["--" + spelling[2:].replace("-", "_"), "x"]] if spelling.startswith("--") else []
    for args in ([spelling, "ai/gemma3"], [f"{spelling}=ai/gemma3"], *underscored):
        _, problems = instances(data(**entry(extra_args=args)))
        print(args, problems)
        # (--hf-token=VALUE is a secret's too since round 18 S18b: refused besides, as carrying credentials; and
        # --hf-token VALUE since round 25 V25a, as the value of a flag named for a secret)
        assert [(p[0], "set model" in p[1]) for p in problems if "carries credentials" not in p[1]
                and "a flag named for a secret" not in p[1]] == [
            ("llama_server_instances.x.extra_args", True)]
