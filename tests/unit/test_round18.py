"""Issue 61, round 18 (an independent hostile round against 200b2f1): its four, each refused now.

- S18a: secret variable names no list had (X_PRIVATEKEY, DBPASSWORDV2, X_ACCESSTOKENS, WEBHOOK_HMAC, DB_PW,
  X_AUTHZ...): the words live once, in rigup.text (SECRET_WORDS, SECRET_ENDS, secret_name), read by vLLM's
  secret_variable for the tuning families; any other name, which nothing of vLLM reads, is judged by the wider
  rule of a query parameter's (a secret's word inside another), so the spellings no list ends are refused too.
- S18b: secrets that are no URL, inside a value: NAME=VALUE, "NAME": "VALUE", --NAME VALUE, an Authorization
  header, a Bearer or Basic token: hidden by redacted and refused by carries_credentials.
- S18c: query names of sessions, SAML and PKCE (PHPSESSID, jsessionid, SAMLResponse, code_verifier).
- T18a: a sweep spec's flags table without a key the stages set: a ValueError naming it, before anything runs."""

import pytest

from rigup.instances.vllm import secret_variable
from rigup.text import carries_credentials, redacted
from tests.unit.hosts import data, host, refusals
from tests.unit.test_round12_vllm import MODEL
from tests.unit.test_round15 import S, hidden_and_refused

NAMES = ["X_SECRETKEY", "X_PRIVATEKEY", "X_SIGNINGKEY", "APP_MASTERKEY", "X_ENCRYPTIONKEY", "secretKey", "DBPASSWORDV2",
         "X_APIKEYV2", "X_ACCESSTOKENS", "X_REFRESHTOKENS", "WEBHOOK_HMAC", "X_SIG", "X_SIGNATURE", "X_OTP",
         "X_SESSIONID", "DB_PW", "X_PASSCODE", "X_AUTHZ", "VLLM_X_PRIVATEKEY", "VLLM_DB_PW", "VLLM_AUTHZ",
         "VLLM_SIGNING_KEY2", "NCCL_X_PASSWORDS", "MONKEY_PATCH", "OLDPWD_X"]


@pytest.mark.parametrize("name", NAMES)
def test_s18a_a_secret_name_of_any_spelling_is_refused_in_env(name):
    assert secret_variable(name)
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(models={"m": MODEL}, vllm_instances={
        "a": {"model": "m", "port": 8000, "env": {name: "v"}}}))]
    assert any(f"vllm_instances.a: {name} in env" in line for line in lines), lines


@pytest.mark.parametrize("name", ["VLLM_MAX_TOKENS", "VLLM_KEYBOARD_X", "NCCL_IB_PKEY", "VLLM_ATTENTION_BACKEND",
                                  "CUDA_MODULE_LOADING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_SOCKET_NTHREADS"])
def test_s18a_the_tuning_families_words_are_read_as_words(name):
    assert not secret_variable(name)


@pytest.mark.parametrize("value, shown", [
    (f"Password={S};Server=db", "Password=***;Server=db"), (f"host=db password={S}", "host=db password=***"),
    (f"Authorization: Bearer {S}", "Authorization: Bearer ***"), ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    (f"Bearer {S}", "Bearer ***"), ("Basic dXNlcjpwYXNz", "Basic ***"), (f"--api-key {S}", "--api-key ***"),
    (f'{{"password": "{S}"}}', '{"password": "***"}'), (f'{{"x": 1, "api_key": "{S}"}}', '{"x": 1, "api_key": "***"}'),
    (f"--hf-token={S}", "--hf-token=***"), (f"--ssl-keyfile-password {S}", "--ssl-keyfile-password ***"),
    (f"DB_PW={S}", "DB_PW=***"), (f"x_privateKey={S}", "x_privateKey=***")])
def test_s18b_a_secret_inside_a_value_is_hidden_and_refused(value, shown):
    assert redacted(value) == shown and S not in redacted(value)
    assert carries_credentials(value)


@pytest.mark.parametrize("value", ["--tokenizer=/models/x", "--max-num-batched-tokens 8192", "--cors-credentials=x",
                                   "--ssl-key-file /etc/x.pem", "--auth-mode x", "basic configuration here",
                                   "a bearer of news", '{"model": "m", "tokenizer": "t"}', "monkey=1", "-O3",
                                   "--index-url=https://pypi.corp/simple", "max_tokens=512"])
def test_s18b_what_names_no_secret_stays_shown(value):
    assert redacted(value) == value and not carries_credentials(value)


@pytest.mark.parametrize("name", ["PHPSESSID", "sessid", "jsessionid", "SAMLResponse", "saml_response",
                                  "code_verifier"])
def test_s18c_session_saml_and_pkce_query_names_are_hidden_and_refused(name):
    assert hidden_and_refused(f"https://pypi.corp/simple?{name}={S}") == f"https://pypi.corp/simple?{name}=***"


def test_s18c_jsessionid_as_a_path_parameter_is_hidden():
    assert redacted(f"https://h/app;jsessionid={S}") == "https://h/app;jsessionid=***"
