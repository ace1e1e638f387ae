"""Issue 61, round 16 (/tmp/redteam/round16.md). V50: vLLM's short option -cc (--compilation-config's)
and a prefix of a short one (-c, -s) were no spelling rigup read; V49: a JSON option's key as vLLM's
json.loads reads it (a key given twice beside a ``\\u``-escaped held key), where rigup searched the raw text.
S16a-S16d: secrets rigup.text left whole: a dotted login whose password starts with digits and '/'
(john.doe:1234/TOKEN@pypi.corp), blanks inside a userinfo (urlsplit keeps them), backslashes after the
scheme, query names beyond the name class or the word list (?auth[token]=, ?jwt=). V52: secret variable
names with the word glued (PGPASSWORD, APITOKEN) or not on the list (MYSQL_PWD, X_JWT)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from rigup.boundary.core import Unreadable, keys_as_read
from rigup.contract import vllm as contract
from rigup.instances.vllm import TUNING, secret_variable, tunes
from rigup.text import redacted
from roles.vllm.checks import credentialed
from tests.unit.hosts import data, host, refusals
from tests.unit.test_round12_vllm import MODEL, WHERE, problems
from tests.unit.test_round15 import S, hidden_and_refused


def plugins(args) -> list[str]:
    """The refusals of ``args`` (an instance's extra_args), each checked to name vLLM's plugins and to
    pass once vllm_allow names plugins."""
    found = [why for path, why in problems(extra_args=args) if path == f"{WHERE}.extra_args"]
    assert found and all("plugins" in why for why in found), (args, found)
    # (a run of over 2048 characters without a blank, "[" * 100000, is refused besides: round 20 R20a)
    assert [p for p in problems(extra_args=args, allow=["plugins"]) if "without a blank" not in p[1]] == [], args
    return found


# -- V50: every short option of a judged option, and a prefix of one, is that option -----------------

@pytest.mark.parametrize("args, key", [
    (["-cc", '{"backend": "evil_mod.f"}'], "-cc.backend"), (["-cc.backend=evil_mod.f"], "-cc.backend"),
    (['-cc={"cache_dir": "/tmp/x"}'], "-cc.cache_dir"), (["-cc.inductor_passes.p=evil.f"], "-cc.inductor_passes"),
    (["-cc.debug_dump_path", "/tmp/d"], "-cc.debug_dump_path"),
    (["-c", '{"backend": "evil_mod.f"}'], "-cc.backend"), (["-c.cache_dir=/tmp/x"], "-cc.cache_dir")])
def test_v50_compilation_configs_short_option_and_its_prefix_hold_its_keys(args, key):
    assert any(f"gives {key}, vLLM's plugins" in why for why in plugins(args))


@pytest.mark.parametrize("args, flag", [(["-s", '{"model": "/tmp/x"}'], "-sc"), (["-s.model=/tmp/x"], "-sc"),
                                        (["-t", "2"], "-tp"), (["-p=2"], "-pp")])
def test_v50_a_prefix_of_an_owned_short_option_is_that_option(args, flag):
    assert any(f"gives {flag}, which rigup sets" in why for _, why in problems(extra_args=args)), args


def test_v50_the_contract_spells_each_judged_option_with_its_short_ones():
    keys = contract.held_off(kind="keys")
    for short, long in contract.SHORT.items():
        assert short in contract.spellings(long)
        held = {k.split(".", 1)[1] for k in keys if k.startswith(f"{long}.")}
        assert held == {k.split(".", 1)[1] for k in keys if k.startswith(f"{short}.")}, short
        if long in contract.owned():
            assert short in contract.owned(), short


@pytest.mark.parametrize("args", [["-cc", '{"mode": 3}'], ["-cc.mode=3"], ["-ac", '{"backend": "FLASH_ATTN"}'],
                                  ["-O3"], ["-Odecode"], ["-O", "3"], ["-q", "fp8"], ["-cc", '{"pass_config": {}}']])
def test_v50_other_keys_and_options_still_pass(args):
    assert problems(extra_args=args) == []


def test_v50_through_every_check_of_the_roles():
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(models={"m": MODEL}, vllm_instances={
        "a": {"model": "m", "port": 8000, "extra_args": ["-cc", '{"backend": "evil_mod.f"}']}}))]
    assert any("gives -cc.backend, vLLM's plugins" in line for line in lines), lines


# -- V49: a JSON value's keys as vLLM's json.loads reads them, at every depth; text it refuses, refused -----

@pytest.mark.parametrize("args, key", [
    (['-O{"mode": 3, "mode": 3, "back\\u0065nd": "evil_mod.f"}'], "-O.backend"),
    (["--compilation-config", '{"mode": 3, "mode": 3, "c\\u0061che_dir": "/tmp/x"}'], "--compilation-config.cache_dir"),
    (["-O", '{"mode": 3, "mode": 3, "inductor\\u005fpasses": {"p": "evil.f"}}'], "-O.inductor_passes"),
    (["--compilation_config", '{"backend": "inductor", "back\\u0065nd": "evil.f"}'], "--compilation-config.backend"),
    (["--structured-outputs-config", '{"backend": "auto", "backend": "auto", "reasoning\\u005fparser_plugin": "/p.py"}'],
     "--structured-outputs-config.reasoning_parser_plugin"),
    (["-cc", '{"backend": NaN, "backend": "evil.f", "x": 1e400}'], "-cc.backend")])
def test_v49_a_key_given_twice_or_escaped_is_read_as_json_loads_reads_it(args, key):
    assert any(f"gives {key}, vLLM's plugins" in why for why in plugins(args))


@pytest.mark.parametrize("args, key", [
    (["--model-loader-extra-config", '{"tensorizer_config": {"tensorizer_uri": "/x"}}'],
     "--model-loader-extra-config.tensorizer_uri"),
    (["--model-loader-extra-config.tensorizer_config.tensorizer_dir=/x"], "--model-loader-extra-config.tensorizer_dir"),
    (["--model-loader-extra-config.tensorizer_config", '{"lora_dir": "/x"}'], "--model-loader-extra-config.lora_dir")])
def test_v49_every_depth_and_every_part_of_a_dotted_key_is_judged(args, key):
    found = [why for _, why in problems(extra_args=args)]
    assert any(f"gives {key}, vLLM's files" in why for why in found), found
    assert problems(extra_args=args, allow=["files"]) == []


@pytest.mark.parametrize("args", [
    ["--structured-outputs-config", "not json"], ["--structured-outputs-config", "[" * 5000],
    ["-cc", "{'backend': 'evil.f'}"], ['-O{"back" "end": "evil.f"}'], ["--compilation-config", '{"backend": "x",}']])
def test_v49_a_value_json_loads_does_not_read_is_refused_whole(args):
    """Never a search of the raw text: an older vLLM read -O with ast.literal_eval (single quotes, adjacent
    strings), and what rigup cannot read as vLLM does it cannot judge."""
    found = plugins(args)
    assert any("no JSON as vLLM reads it" in why for why in found), found


def test_v49_keys_as_read_collects_every_key_as_json_loads_reads_it():
    assert sorted(keys_as_read('{"a": 1, "a": {"b\\u0065": [{"c": NaN}]}}', "x")) == ["a", "a", "be", "c"]
    assert keys_as_read("3", "x") == [] and keys_as_read('["backend"]', "x") == []
    for text in ("not json", "[" * 100000, "{'a': 1}"):
        with pytest.raises(Unreadable):
            keys_as_read(text, "x")


def _keys(value) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    return [k for v in value for k in _keys(v)] if isinstance(value, list) else []


_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                       max_leaves=12)


@settings(max_examples=80, deadline=1000)
@given(_values, st.booleans())
def test_v49_keys_as_read_gives_every_key_at_every_depth(value, ascii_only):
    assert sorted(keys_as_read(json.dumps(value, ensure_ascii=ascii_only), "x")) == sorted(_keys(value))


@settings(max_examples=80, deadline=1000)
@given(st.text(max_size=40))
def test_v49_keys_as_read_any_text_gives_keys_or_unreadable(text):
    try:
        assert all(isinstance(k, str) for k in keys_as_read(text, "x"))
    except Unreadable as e:
        assert e.where == "x"


# -- S16a-S16d: rigup.text ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, shown", [
    (f"https://john.doe:1234/{S}@pypi.corp/simple", "https://john.doe:***@pypi.corp/simple"),
    (f"--index-url=https://first.last:0/{S}@pypi.corp/simple", "--index-url=https://first.last:***@pypi.corp/simple"),
    (f"https://john.doe:/{S}@pypi.corp", "https://john.doe:***@pypi.corp"),
    (f"https://a.b:12?{S}@10.0.0.1:8443/s", "https://a.b:***@10.0.0.1:8443/s"),
    (f"https://a.b:12#{S}@localhost/s", "https://a.b:***@localhost/s"),
    (f"https://a.b:12/{S}@[::1]/s", "https://a.b:***@[::1]/s"), (f"https://a.b:1/{S}@bücher.de", "https://a.b:***@bücher.de")])
def test_s16a_a_dotted_login_before_an_at_and_a_host_is_a_userinfo(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", [
    "git+https://gitlab.corp:8443/o/r@v1", "git+https://gitlab.corp:8443/o/r@v1.2.3#egg=x",
    "https://h.corp:443/x@h", "https://LOCALHOST:1234/x@h", "https://[::1]:8080/x@h", "https://10.0.0.1:8443/x@y",
    "git+https://gitlab.corp:8443/o/r@release/v1.2", "https://h.corp:8443/o/r@2.0"])
def test_s16a_a_ref_after_a_hosts_port_stays(plain):
    """The rule's other side: after '@' a word with no '.', or one whose last dotted part starts with a
    digit (v1.2.3), is a ref; the price is a ref such as v2.x, read as a host (rigup/text.py)."""
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


@pytest.mark.parametrize("url, shown", [
    (f"--index-url=https://u:correct horse {S}@pypi.corp/simple", "--index-url=https://u:***@pypi.corp/simple"),
    (f"https://u:ab\x0b{S}@h/s", "https://u:***@h/s"), (f"https://u:ab\x0c{S}@h/s", "https://u:***@h/s"),
    (f"https://john.doe:a {S}@pypi.corp", "https://john.doe:***@pypi.corp"), (f"https://x {S}@h/s", "https://***@h/s"),
    (f"refused: https://u:p w{S}@h/s and more", "refused: https://u:***@h/s and more")])
def test_s16b_a_blank_inside_a_userinfo_does_not_end_it(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", [
    "https://10.0.0.1:8000 is down; mail admin@corp.com", "https://h.corp/x y@z", "ssh://git user@h/r",
    "see https://h.corp/a b and c@d", "a // b c@d"])
def test_s16b_blanks_outside_an_authority_or_after_a_port_are_prose(plain):
    assert redacted(plain) == plain


@pytest.mark.parametrize("url, shown", [
    (f"https:\\\\u:{S}@h/s", "https:\\\\u:***@h/s"), (f"https:\\/u:{S}@h/s", "https:\\/u:***@h/s"),
    (f"http:/\\u:{S}@h", "http:/\\u:***@h"), (f"--index-url=https:\\\\{S}@h", "--index-url=https:\\\\***@h")])
def test_s16c_backslashes_after_the_scheme_are_its_slashes(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("name", ["jwt", "bearer", "session", "session_id", "auth[token]", "x:token", "my.jwt", "x:pw",
                                  "X-Session", "sessionid"])
def test_s16d_a_secret_parameter_by_any_name_up_to_its_equals(name):
    assert hidden_and_refused(f"https://h/s?a=1&{name}={S}") == f"https://h/s?a=1&{name}=***"


@pytest.mark.parametrize("name", ["encode", "country_code", "bypass", "zipcode", "passive", "codec", "sessions_max",
                                  "obsessive", "jwtx", "a[b]", "x:y"])
def test_s16d_names_that_only_hold_those_words_still_show(name):
    plain = f"https://h/s?{name}=1"
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


def test_s16_through_every_check_of_the_roles():
    plan, facts = host("a100")
    for url in (f"--index-url=https://u:correct horse {S}@pypi.corp/simple",
                f"--index-url=https://john.doe:1234/{S}@pypi.corp/simple"):
        lines = [r.line("h") for r in refusals(plan, facts, data(vllm_pip_args=[url]))]
        assert any("vllm_pip_args[0] carries credentials" in line for line in lines) and S not in str(lines), lines


# -- V52: secret variable names in env and vllm_env ----------------------------------------------------------

SECRETS = ["MYSQL_PWD", "PGPASSWORD", "DB_CREDENTIAL", "APITOKEN", "X_ACCESSTOKEN", "SESSION_COOKIE", "X_JWT",
           "AWS_SECRETACCESSKEY", "MY_APIKEY", "pgpassword", "MY_COOKIES"]


@pytest.mark.parametrize("name", SECRETS)
@pytest.mark.parametrize("where", ["env", "vllm_env"])
def test_v52_a_secret_word_glued_or_new_is_refused_as_a_secret(name, where):
    assert secret_variable(name)
    entry = {"model": "m", "port": 8000, **({"env": {name: S}} if where == "env" else {})}
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(models={"m": MODEL}, vllm_instances={"a": entry},
                                                             **({"vllm_env": {name: S}} if where == "vllm_env" else {})))]
    assert any(f"vllm_instances.a: {name} in env" in line for line in lines) and S not in str(lines), lines


@pytest.mark.parametrize("name", ["VLLM_MAX_TOKENS", "DSV4_LOGITS_ROW_CHUNK", "VLLM_KEYBOARD_X", "NCCL_IB_PKEY",
                                  *sorted(TUNING)])   # MONKEY_PATCH, OLDPWD_X: refused since round 18 (test_round18)
def test_v52_tuning_names_are_no_secret(name):
    assert not secret_variable(name)


def test_v52_pwd_alone_is_the_working_directory_refused_as_the_platforms():
    assert not secret_variable("PWD") and not tunes("PWD")
    assert [why for _, why in problems(env={"PWD": "/tmp"})] and not [
        why for _, why in problems(env={"PWD": "/tmp"}) if "secret" in why]


# -- FX16: an NVSwitch line whose bus is no bus id --------------------------------------------------------------

def test_fx16_an_nvswitch_line_without_a_bus_id_is_skipped_and_the_guard_plans():
    from rigup.gpu.fabric import fabric_plan, parse_nvswitches
    from roles.gpu_guard import guard_config

    lines = ["0000:01:00.0 0x10de 0x030200", "\x1b[31mNOTABUS 0x10de 0x068000", "0000:0a:00.0 0x10de 0x068000",
             "0000:0b:00 0x10de 0x068000", "../../x 0x10de 0x068000", "0000:0c:00.0 0x10de 0x068000 extra"]
    assert parse_nvswitches(lines) == ["0000:0a:00.0"]
    plan, _ = host("a100")
    plan = {**plan, "fabric": fabric_plan(parse_nvswitches(lines), [], None)}
    assert guard_config(data(gpu_guard_xid_enabled=True), plan)["fabric"]["switches"] == ["0000:0a:00"]
