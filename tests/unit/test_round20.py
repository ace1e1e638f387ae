"""Issue 61, round 20 (an independent hostile round against 7ce19a7): what it found in the readers of secrets.

- S20a (a regression of round 19's narrower names): a quoted value (PASSWORD="S", api_key='S') and a token's
  name outside the pairs (GITHUB_TOKEN, NPM_TOKEN, SLACK_BOT_TOKEN, hub_token): hidden and refused again; the
  model's own tokens (bos_token, add_bos_token, max_token) stay shown.
- R20a: redacted's readers took time growing with the square of a run without a blank (40k of '?' 5 s, 200k
  minutes): a run of over 2048 characters is shown as its length, read by none of them, and refused as a value.
- S20b: VLLM_GHTOKEN, UCX_GITTOKEN (TOKEN glued: a secret again, TIKTOKEN aside), VLLM_CREDS, UCX_TLS_PRIVKEY,
  NCCL_PSK.
- S19d (left by round 19): a secret's file key given the secret itself was quoted by the file reader
  (rigup/boundary/owned.py opened): refused without it."""

import time

import json

import pytest

from rigup.boundary.owned import NotOwned, read
from rigup.instances.vllm import secret_variable
from rigup.text import carries_credentials, redacted

S = "S3cr3tXX"


@pytest.mark.parametrize("value, shown", [
    (f'PASSWORD="{S}"', 'PASSWORD="***"'), (f"api_key='{S}'", "api_key='***'"), (f'password = "{S}"', 'password = "***"'),
    (f'--api-key="{S}"', '--api-key="***"'), (f'HF_TOKEN="hf_{S}"', 'HF_TOKEN="***"'), (f"GITHUB_TOKEN={S}", "GITHUB_TOKEN=***"),
    (f"NPM_TOKEN={S}", "NPM_TOKEN=***"), (f"SLACK_BOT_TOKEN={S}", "SLACK_BOT_TOKEN=***"), (f"hub_token={S}", "hub_token=***"),
    (f'"github_token": "{S}"', '"github_token": "***"'), (f"--github-token {S}", "--github-token ***")])
def test_s20a_a_quoted_value_and_a_tokens_name_are_hidden_and_refused(value, shown):
    assert redacted(value) == shown and carries_credentials(value)


@pytest.mark.parametrize("value", ["add_bos_token=bool:false", '{"bos_token": "<s>"}', "max_token=5", 'x="a b"',
                                   "EOS token = 2", '{"eos_token": "</s>", "pad_token": "<pad>"}'])
def test_s20a_the_models_own_tokens_stay_shown(value):
    assert redacted(value) == value and not carries_credentials(value)


@pytest.mark.parametrize("text", ["?" * 200000, "//a:" * 50000, "\n" + "/" * 200000, "a=" * 100000,
                                  "https:/" + "\\" * 200000, "a_" * 100000 + "@"])
def test_r20a_a_long_run_without_a_blank_is_shown_as_its_length_and_refused(text):
    start = time.perf_counter()
    out = redacted(text)
    took = time.perf_counter() - start
    print(f"{text[:6]!r}... {len(text)} characters: {took:.2f} s -> {out[:60]!r}")
    assert "characters without a blank, not shown" in out and len(out) < 100
    assert carries_credentials(text)


def test_r20a_a_run_of_2048_is_read_as_before():
    url = "https://u:" + S + "@h/" + "x" * 2000
    assert redacted(url) == "https://u:***@h/" + "x" * 2000


@pytest.mark.parametrize("name", ["VLLM_GHTOKEN", "UCX_GITTOKEN", "VLLM_CREDS", "UCX_TLS_PRIVKEY", "NCCL_PSK"])
def test_s20b_these_variables_are_secrets(name):
    assert secret_variable(name)


@pytest.mark.parametrize("name", ["TIKTOKEN_ENCODINGS_BASE", "VLLM_X_TIKTOKEN", "UCX_IB_PKEY", "VLLM_MAX_TOKENS"])
def test_s20b_these_are_not(name):
    assert not secret_variable(name)


@pytest.mark.parametrize("value", ["hf_" + S, S, "sk-live-" + S])
def test_s19d_a_secret_given_for_its_file_is_refused_unquoted(value):
    with pytest.raises(NotOwned) as e:
        read(value, "model_fetch_hf_token_src", secret=True)
    print(e.value)
    assert S not in str(e.value) and "model_fetch_hf_token_src" in str(e.value)


@pytest.mark.parametrize("line", ["fleet_api_key: expected bool, got a str of 11 characters",
                                  "vllm_instances.a.api_key: expected bool", "api_key: remove it from extra_args"])
def test_rigups_own_sentences_about_a_secrets_key_stay_whole(line):
    """Round 20 saw "fleet_api_key: *** bool": KEY: then a word in lower case is rigup's sentence."""
    assert redacted(line) == line


# -- T20a, T20b: the tuner's spec: its numbers, and its flags table ------------------------------------------------

@pytest.mark.parametrize("key, value", [("slot_tokens", 1e400), ("slot_tokens", "٤٠٩٦"), ("concurrency", " 5"),
                                        ("budget_s", float("nan")), ("budget_s", True), ("port", 70000),
                                        ("levels", [1, "2"])])
def test_t20a_a_spec_number_that_is_none_is_refused_naming_it(key, value):
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC, table
    measure, seen = table({})
    with pytest.raises(ValueError, match=f"the spec's {key}"):
        tune.tune({**SPEC, key: value}, measure_point=measure, logs=None)
    assert seen == []


@pytest.mark.parametrize("flags", [{"ctx": ["--port"]}, {"parallel": ["-m"]}, {"batch": ["-c"]},
                                   {"ubatch": ["--api-key"]}])
def test_t20b_a_spelling_of_another_key_or_of_what_is_served_is_refused(flags):
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC
    with pytest.raises(ValueError, match="is not a list of the spellings the tuner sweeps it by"):
        tune.spec_flags({**SPEC, "flags": {**SPEC["flags"], **flags}})


def test_t20a_the_tuner_says_one_line_for_a_spec_it_refuses(tmp_path, capsys):
    import json
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC
    (tmp_path / "spec.json").write_text(json.dumps({**SPEC, "budget_s": "soon"}))
    assert tune.main([str(tmp_path / "spec.json"), str(tmp_path / "out.json")]) == 2
    assert json.loads(capsys.readouterr().err) == {"refused": "the spec's budget_s: 'soon' is not a number from 0 to 10000000"}


# -- S20d: a --data value of a secret's key that pyinfra reads as a number or JSON --------------------------------

@pytest.mark.parametrize("text", ["0123456789", '{"a": "' + S + '", "a": 1}'])
def test_s20d_a_data_value_of_a_secrets_key_is_refused_unquoted(text):
    from rigup.config import data_number_problems
    found = data_number_problems(["--data", f"model_fetch_hf_token_src={text}"])
    print(found)
    assert [k for k, _ in found] == ["model_fetch_hf_token_src"] and text not in str(found) and S not in str(found)


# -- round 21 (against 996033c): what its fixes of round 20 left or broke -------------------------------------------

@pytest.mark.parametrize("spec", [{"flags": {"ctx": [["-c"]]}}, {"argv": None}, {"budget_s": None, "drop": "budget_s"},
                                  "a list", "not json"])
def test_t21a_the_tuner_says_one_line_for_any_spec_it_cannot_read(spec, tmp_path, capsys):
    import json
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC
    if spec == "not json":
        text = "{not json"
    elif spec == "a list":
        text = json.dumps([SPEC])
    else:
        whole = {**SPEC, **{k: v for k, v in spec.items() if k != "drop"}}
        whole.pop(spec.get("drop"), None)
        text = json.dumps(whole)
    (tmp_path / "spec.json").write_text(text)
    assert tune.main([str(tmp_path / "spec.json"), str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.count("\n") == 1 and "Traceback" not in err and set(json.loads(err)) == {"refused"}


@pytest.mark.parametrize("unit", ["?" * 2048 + "\u00a0", "//\n", "?" * 2000 + "\n"])
def test_r21a_no_blank_that_the_readers_do_not_take_for_one_lets_a_long_run_through(unit):
    """A ratio in one run (round 21's were quadratic: 16x)."""
    from tests.unit.test_round19 import redaction_ratio
    assert redaction_ratio(unit, 20000) < 10


@pytest.mark.parametrize("value, shown", [("password: letmein", "password: ***"), ("api_key: letmein", "api_key: ***"),
                                          ('PASSWORD="letmeinx9', 'PASSWORD="***'),
                                          ('password="a\\"S3cr3t" x=1', 'password="***" x=1'),
                                          ("DOCKER_IMAGE_TOKEN=abc", "DOCKER_IMAGE_TOKEN=***"),
                                          ("CI_STOP_TOKEN=abc", "CI_STOP_TOKEN=***"), ('"audio_token": "X"', '"audio_token": "***"')])
def test_s21_secrets_round_21_saw_shown_are_hidden(value, shown):
    assert redacted(value) == shown


# -- T21b (round 21): the sweep's spellings an allow-list; whole numbers where the server takes one; argv and env typed

@pytest.mark.parametrize("change", [{"flags": {"ctx": ["--hf-token"]}}, {"flags": {"ctx": ["-hft"]}},
                                    {"flags": {"batch": ["--log-file"]}}, {"flags": {"ubatch": ["--slot-save-path"]}},
                                    {"flags": {"ngl": ["-md"]}}, {"flags": {"parallel": ["--models-dir"]}},
                                    {"flags": {"port": ["--PORT"]}}, {"flags": {"hf_token": ["--hf-token"]}},
                                    {"port": 8080.5}, {"rounds": 2.5}, {"concurrency": 4.0}, {"port": 10 ** 400},
                                    {"argv": "llama-server -m x"}, {"argv": ["llama-server", 5]}, {"argv": []},
                                    {"env": {"X": 5}}, {"env": ["X"]}])
def test_t21b_a_spec_naming_another_flag_or_a_number_of_another_kind_is_refused_before_anything_runs(change):
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC, table
    measure, seen = table({})
    spec = {**SPEC, **change, "flags": {**SPEC["flags"], **change.get("flags", {})}}
    with pytest.raises(ValueError, match="the spec's") as refused:
        tune.tune(spec, measure_point=measure, logs=None)
    print(change, "->", refused.value)
    assert seen == []


def test_t21b_the_contracts_spec_is_taken_whole_and_a_fraction_where_the_tuner_takes_one():
    from plays.shipped import tune
    from tests.unit.test_tune import SPEC
    tune.spec_numbers({**SPEC, "gain": 1.05, "budget_s": 0.5, "ready_timeout_s": 2.5})
    assert tune.spec_flags(SPEC) == {k: tuple(v) for k, v in SPEC["flags"].items()}


# -- S20d leftovers (round 21): a token given as a key's name, a list given for a map ----------------------------

@pytest.mark.parametrize("data", [{"hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123": 1}, {"hf_abcdefghijklmnopqrstu0123": 1},
                                  {"vllm_env": ["HF_TOKEN", S]}, {"llama_server_tune_levels": {"a": S}}])
def test_s20d_an_unknown_key_or_a_container_is_reported_without_its_text(data):
    from rigup.config import problems
    found = [message for _, message in problems(data)]   # (the key: configure names its file, not the key)
    print(found)
    assert found and S not in str(found) and "hf_AbCd" not in str(found) and "u0123" not in str(found)


def test_s20d_a_misspelt_variable_is_still_quoted_with_its_likely_name():
    from rigup.config import problems
    assert problems({"llama_server_instancse": {}}) == [("llama_server_instancse", "unknown key 'llama_server_instancse' "
                                                         "(did you mean 'llama_server_instances'?); rigup's variables are "
                                                         "declared in roles/*/defaults.yml")]


# -- F21 (round 21, a false refusal): a minified JSON value over the long-run bound is read piece by piece -----------

SCHEMA = json.dumps({"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(200)}},
                    separators=(",", ":"))


@pytest.mark.parametrize("schema, refused", [(SCHEMA, False), (SCHEMA[:-2] + '},"p":{"password":"' + S + '"}}', True),
                                             (SCHEMA[:-2] + '},"u":"https://u:' + S + '@h/"}}', True),
                                             (SCHEMA[:-2] + '},"x":"' + "x" * 3000 + '"}}', True),
                                             (SCHEMA[:-1], True), ("[" * 5000 + "]" * 5000, True)])
def test_f21_a_minified_json_schema_is_served_and_a_secret_or_a_long_run_inside_it_refused(schema, refused):
    from rigup.instances.llama_server import instances
    from tests.unit.hosts import data, glm_llama
    found, problems = instances(data(**glm_llama(extra_args=["--json-schema", schema])))
    print(len(schema), problems)
    assert bool(problems) == refused and S not in str(problems)
    assert refused or found["glm"]["extra_args"][-1] == schema
