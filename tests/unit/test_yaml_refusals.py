"""Issue 47: group_vars and every YAML file rigup reads (rigup/yamlfile.py) refuse a key given twice
and a nest of aliases, naming the file and the line, before anything changes."""

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from rigup.config import ConfigError, load_yaml
from rigup.yamlfile import safe_load

BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{x}: &{x} [{', '.join([f'*{p}'] * 10)}]\n" for p, x in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text, said", [
    ("llama_cpp_ref: b8779\nrigup_user: rigup\nllama_cpp_ref: b9000\n",
     "all.yml:3: not valid YAML: key 'llama_cpp_ref' given twice (lines 1 and 3)"),
    ("models:\n  m: {repo: a/b, revision: x, repo: c/d}\n", "all.yml:2: not valid YAML: key 'repo' given twice"),
    (BOMB, "all.yml:1: not valid YAML: its aliases expand to more than 100000 nodes"),
    ("watchdog_window: 1:30\n", "all.yml:1: not valid YAML: '1:30' is a YAML 1.1 base 60 number (90)"),
    ("x:\n  timeout: -1:30.5\n", "all.yml:2: not valid YAML: '-1:30.5' is a YAML 1.1 base 60 number (-90.5)"),
    ("gpu_power_limit_w: 0250\n", "all.yml:1: not valid YAML: '0250' is a YAML 1.1 octal number (168)"),
    ("x:\n  port: 8_0_8_1\n", "all.yml:2: not valid YAML: '8_0_8_1' is a YAML 1.1 '_'-separated number (8081)"),
    ("i: 1_000\n", "all.yml:1: not valid YAML: '1_000' is a YAML 1.1 '_'-separated number (1000)"),
    ("f: 1_0.5\n", "all.yml:1: not valid YAML: '1_0.5' is a YAML 1.1 '_'-separated number (10.5)"),
    # issue 61, second round: a configuration writes its integers in decimal; every other form is refused
    ("x:\n  port: 0b1111110010001\n", "all.yml:2: not valid YAML: '0b1111110010001' is a YAML 1.1 binary number (8081)"),
    ("port: 0x1F91\n", "all.yml:1: not valid YAML: '0x1F91' is a YAML 1.1 hex number (8081)"),
    ("port: -0x10\n", "all.yml:1: not valid YAML: '-0x10' is a YAML 1.1 hex number (-16)"),
    ("port: !!int abc\n", "all.yml:1: not valid YAML: not a number: invalid literal for int()"),
    ("n: " + "9" * 5000 + "\n", "all.yml:1: not valid YAML: not a number: Exceeds the limit (4300 digits)"),
])
def test_refused_naming_the_file_and_line(tmp_path, text, said):
    path = tmp_path / "all.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_yaml(path)
    print(f"\n{refused.value}")
    assert said in str(refused.value)


def test_a_merge_key_may_still_be_overridden_and_a_few_aliases_pass(tmp_path):
    path = tmp_path / "all.yml"
    path.write_text("base: &b {port: 8081, ctx: 4096}\ninst:\n  <<: *b\n  ctx: 8192\nlist: [*b, *b]\n")
    assert load_yaml(path)["inst"] == {"port": 8081, "ctx": 8192}


def test_plain_numbers_and_quoted_times_read_as_written(tmp_path):
    path = tmp_path / "all.yml"
    path.write_text("a: 0\nb: 10\nc: -3.5\nd: '1:30'\ne: '0x10'\nf: 0o10\ng: 1e3\nh: 0.25\ni: '1_000'\nj: +7\n")
    assert load_yaml(path) == {"a": 0, "b": 10, "c": -3.5, "d": "1:30", "e": "0x10", "f": "0o10", "g": "1e3", "h": 0.25,
                               "i": "1_000", "j": 7}


@settings(max_examples=60, deadline=1000)
@given(st.integers(-10**30, 10**30))
def test_an_int_reads_only_in_decimal(n):
    """Decimal reads as written; YAML 1.1's binary, hex and octal forms of the same int are refused."""
    assert safe_load(f"n: {n}") == {"n": n}
    sign = "-" if n < 0 else ""
    for other in (f"{sign}0b{abs(n):b}", f"{sign}0x{abs(n):x}", f"{sign}0{abs(n):o}"):
        with pytest.raises(yaml.YAMLError):
            safe_load(f"n: {other}")
