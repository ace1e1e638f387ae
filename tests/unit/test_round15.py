"""Issue 61, round 15 (/tmp/redteam/round15.md). Secrets rigup.text.redacted left whole, so that nothing
refused them before pip's argv, a unit's ExecStart or an env file: S15a, a password of digits then '/', '?'
or '#' (u:1234/TOKEN@h) read as a port; S15d, a scheme with one slash or three (https:/u:T@h); S15f,
?%74oken=, ?pass=, ?pw=, ?code=; S15h, a tab inside a URL (Python's urlsplit, so pip, drops it) or a no-break
space in a password; V48, a URL with credentials as a value of a serving instance (vLLM's extra_args and env;
llama-server's extra_args too, under a flag rigup does not own); V47, OTEL_EXPORTER_OTLP_HEADERS (an
Authorization) in env or vllm_env. V42: a held-off key inside a glued
-O{"backend": "mod.f"}, which argparse reads as -O VALUE."""

import pytest

from rigup.instances.llama_server import instances as llama_instances
from rigup.text import carries_credentials, redacted
from roles.vllm.checks import credentialed
from tests.unit.hosts import data, host, refusals
from tests.unit.test_round12_vllm import MODEL, WHERE, problems

S = "S3cr3t"


def hidden_and_refused(url: str) -> str:
    out = redacted(url)
    assert S not in out, out
    assert credentialed(data(vllm_pip_args=[url])) == ["vllm_pip_args[0]"]
    return out


# -- S15a: a LOGIN (a bare word) takes a password whatever it starts with; a HOST (a '.', localhost) a port --

@pytest.mark.parametrize("url, shown", [
    (f"https://u:1234/{S}@pypi.corp/simple", "https://u:***@pypi.corp/simple"),
    (f"https://u:9?{S}@h/simple", "https://u:***@h/simple"), (f"https://u:77#{S}@h/x", "https://u:***@h/x"),
    (f"--index-url=https://u:0/{S}@h/simple", "--index-url=https://u:***@h/simple"),
    (f"git+https://u:8/{S}@h/o/r.git@v1", "git+https://u:***@v1"),
    (f"https://oauth2:1/{S}@gitlab.corp/o/r", "https://oauth2:***@gitlab.corp/o/r"),
    ("https://user:123456@h/simple", "https://user:***@h/simple")])   # a PIN: all digits, nothing after
def test_s15a_digits_after_a_logins_colon_are_a_password(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", [
    "git+https://gitlab.corp:8443/o/r@v1", "https://localhost:8443/o/r@v1", "https://LocalHost:1/x@y",
    "https://10.0.0.1:8443/x@y", "https://[::1]:8/x@y", "https://pypi.corp:443?x@y", "https://h.corp:8080#a@b"])
def test_s15a_digits_after_a_hosts_colon_are_its_port(plain):
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


# -- S15d: any number of slashes after the scheme, where a word or a glued option starts --------------

@pytest.mark.parametrize("url, shown", [
    (f"https:///u:{S}@h/s", "https:///u:***@h/s"), (f"https:/u:{S}@h/s", "https:/u:***@h/s"),
    (f"https:////u:{S}@h", "https:////u:***@h"), (f"-ihttps:/u:{S}@h", "-ihttps:/u:***@h"),
    (f"--index-url=https:///u:{S}@h", "--index-url=https:///u:***@h"), (f"https:///{S}@h/s", "https:///***@h/s"),
    (f"key:https:/u:{S}@h", "key:https:/u:***@h")])
def test_s15d_a_scheme_with_one_slash_or_three_still_has_a_userinfo(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", [
    "https://h.corp:/x@y", "https://my-host.corp:/x@y", "file:///repo@v1", "git+file:///srv/r@v1",
    "https://h.corp/a/b-c:/d@e", "ssh:///git@h"])
def test_s15d_inside_a_url_or_in_a_file_url_nothing_is_a_login(plain):
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


# -- S15f: a parameter's name as the server reads it (percent-decoded); pass, pw and OAuth's code --------

@pytest.mark.parametrize("url, shown", [
    (f"https://h/s?pass={S}", "https://h/s?pass=***"), (f"https://h/s?pw={S}&a=1", "https://h/s?pw=***&a=1"),
    (f"https://h/s?%74oken={S}", "https://h/s?%74oken=***"),
    (f"https://h/s?x=1&%70%61%73%73={S}", "https://h/s?x=1&%70%61%73%73=***"),
    (f"https://h/cb?code={S}&state=x", "https://h/cb?code=***&state=x"),
    (f"https://h/?db_pass={S}", "https://h/?db_pass=***"),
    (f"https://h/?user-pw={S}", "https://h/?user-pw=***"), (f"https://h/?API%5FKEY={S}", "https://h/?API%5FKEY=***")])
def test_s15f_a_secret_parameter_by_its_decoded_name(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", [
    "https://h/s?encode=utf8&country_code=de&bypass=1&zipcode=1", "https://h/s?passive=1&codec=h264",
    "rigup-llama@gemma.service: Main process exited, code=dumped, status=11/SEGV", "https://h/s?%63ode2=x"])
def test_s15f_names_that_only_hold_those_words_are_no_secret(plain):
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


# -- S15h: a tab, CR or LF inside a URL (a URL parser drops them); a no-break space in a password ---------

@pytest.mark.parametrize("url, shown", [
    (f"https://u:ab\t{S}@h/s", "https://u:***@h/s"), (f"https://u:ab\r\n{S}@h/s", "https://u:***@h/s"),
    (f"https://{S}\t@h/s", "https://***@h/s"), (f"https://h/s?to\tken={S}", "https://h/s?token=***"),
    (f"--index-url=https://u:a\n{S}@h", "--index-url=https://u:***@h"),
    (f"https://u:ab\u00a0{S}@h/s", "https://u:***@h/s"), (f"https://h/?token=ab\u2028{S}", "https://h/?token=***")])
def test_s15h_a_url_is_read_as_its_parser_reads_it(url, shown):
    assert hidden_and_refused(url) == shown


@pytest.mark.parametrize("plain", ["a\tb", "https://h/x\tmore@text", "line one\nhttps://h.corp/x@y"])
def test_s15h_text_whose_url_hides_nothing_is_kept_as_it_is_but_refused_in_a_programs_argument(plain):
    """redacted() keeps each tab and line break where dropping them would hide nothing; a key handed to a
    program refuses them whatever they stand in."""
    assert redacted(plain) == plain and carries_credentials(plain)
    assert credentialed(data(vllm_pip_args=[plain])) == ["vllm_pip_args[0]"]


# -- V48: every value of a serving instance, and of vllm_env, by the same rule ----------------------------

@pytest.mark.parametrize("args, at", [
    (["--otlp-traces-endpoint", f"http://u:{S}@collector:4317"], 1),
    ([f"--otlp-traces-endpoint=http://collector:4317/?token={S}"], 0),
    (["--enforce-eager", "--otlp-traces-endpoint", f"grpc://{S}@collector"], 2)])
def test_v48_a_vllm_extra_args_value_with_credentials_is_refused_naming_the_instance_and_item(args, at):
    found = problems(extra_args=args)
    assert [p for p, _ in found] == [f"{WHERE}.extra_args[{at}]"], found
    assert "carries credentials" in found[0][1] and S not in found[0][1]
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(models={"m": MODEL}, vllm_instances={
        "a": {"model": "m", "port": 8000, "extra_args": args}}))]
    assert any(f"{WHERE}.extra_args[{at}]: carries credentials" in line for line in lines) and S not in str(lines)


def test_v48_env_and_vllm_env_values_with_credentials_are_refused():
    found = problems(env={"MY_KNOB_URL2": f"https://u:{S}@h"}, host_env={"OTHER_KNOB": f"https://h/?token={S}",
                                                                     "KNOB_TAB": "a\tb"})
    assert {p for p, why in found if "carries credentials" in why} == {
        f"{WHERE}.env.MY_KNOB_URL2", "vllm_env.OTHER_KNOB", "vllm_env.KNOB_TAB"}, found


def test_v48_llama_server_extra_args_by_the_same_rule():
    d = {"models": {"m": {**MODEL, "include": ["*.gguf"]}},
         "llama_server_instances": {"a": {"model": "m", "port": 8081,
                                          "extra_args": ["--api-prefix", f"http://u:{S}@h"]}}}
    assert [p for p, why in llama_instances(d)[1] if "carries credentials" in why] == [
        "llama_server_instances.a.extra_args[1]"]


@pytest.mark.parametrize("key, value", [("vllm_install_env", {"UV_INDEX_URL": f"https://u:{S}@pypi.corp/simple"}),
                                        ("vllm_ray_args", ["--x", f"https://h/?token={S}"])])
def test_v48_the_installs_environment_and_rays_args_by_the_same_rule(key, value):
    assert [k for k in credentialed(data(**{key: value})) if k.startswith(key)]


@pytest.mark.parametrize("args", [["--otlp-traces-endpoint", "http://collector.corp:4317"],
                                  ["--otlp-traces-endpoint", "grpc://collector:4317"], ["--max-model-len", "8192"]])
def test_v48_a_url_without_credentials_passes(args):
    assert problems(extra_args=args) == []


# -- V42: a one-letter option glued to its value (argparse reads -OVALUE as -O VALUE) ------------------

@pytest.mark.parametrize("args, key", [
    (['-O{"backend": "evil_mod.f"}'], "-O.backend"), (['-O{"backend":"evil_mod.f"}'], "-O.backend"),
    (['-O{"cache_dir": "/tmp/shared/c"}'], "-O.cache_dir"),
    (['-O{"inductor_passes": {"p": "evil.f"}}'], "-O.inductor_passes"),
    (['-O{"mode": 3, "debug_dump_path": "/tmp/d"}'], "-O.debug_dump_path")])
def test_v42_a_glued_compilation_config_is_read_as_its_json(args, key):
    found = problems(extra_args=args)
    assert len(found) == 1 and f"gives {key}, vLLM's plugins" in found[0][1], found
    assert problems(extra_args=args, allow=["plugins"]) == []


@pytest.mark.parametrize("args", [["-O0"], ["-O1"], ["-O2"], ["-O3"], ["-O=3"], ['-O{"level": 3}'], ["-Odecode"],
                                  ["-qfp8"], ["-q", "awq"], ["-O.level=3"]])
def test_v42_optimization_levels_and_other_glued_values_pass(args):
    assert problems(extra_args=args) == []


# -- V47: request headers (an Authorization) in env or vllm_env are a secret ---------------------------------

@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                                  "otel_exporter_otlp_traces_headers", "MY_PROXY_HEADER"])
@pytest.mark.parametrize("where", ["env", "vllm_env"])
def test_v47_headers_in_env_or_vllm_env_are_refused_as_a_secret(name, where):
    entry = {"model": "m", "port": 8000, **({"env": {name: "Authorization=Bearer S3cr3t"}} if where == "env" else {})}
    plan, facts = host("a100")
    lines = [r.line("h") for r in refusals(plan, facts, data(
        models={"m": MODEL}, vllm_instances={"a": entry},
        **({"vllm_env": {name: "Authorization=Bearer S3cr3t"}} if where == "vllm_env" else {})))]
    # the name is a secret's (check_open_without_key) and, since round 18 S18b, so is the value (an Authorization
    # written out: rigup.models.credential_problems, which refuses first where it stands in an instance's env)
    assert any(f"vllm_instances.a: {name} in env" in line and "passes through every run's output" in line or
               f"vllm_instances.a.env.{name}: carries credentials" in line for line in lines), lines
    assert S not in str(lines)


def test_v47_the_exporters_other_variables_still_tune():
    assert problems(env={"OTEL_SERVICE_NAME": "vllm-a", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}) == []
