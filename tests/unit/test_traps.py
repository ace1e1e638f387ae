"""rigup/traps.py: the loader of trap catalogues refuses a malformed one, naming the file and the entry."""

from pathlib import Path

import pytest
import yaml

from rigup import traps

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"id": "quantized-v-without-fa", "ref": "https://github.com/ggml-org/llama.cpp/issues/28524",
        "summary": "a quantized V cache without flash attention stops llama-server",
        "condition": {"flash_attn": ["off"]},
        "remedy": {"kind": "refuse", "value": None, "fix": "set flash_attn: on"}}


def write(tmp_path, entries) -> Path:
    path = tmp_path / "traps.yml"
    path.write_text(entries if isinstance(entries, str) else yaml.safe_dump(entries, sort_keys=False))
    return path


def test_a_good_catalogue_loads_in_order(tmp_path):
    second = dict(GOOD, id="cpu-repack-crash", ref="001_62f01b4e828dcb29.txt",
                  remedy={"kind": "server_flag", "value": "--no-repack", "fix": "rigup adds --no-repack"})
    third = dict(GOOD, id="fa-all-quants", remedy={"kind": "build_option", "value": "GGML_CUDA_FA_ALL_QUANTS=ON",
                                                   "fix": "add it to llama_cpp_cmake_options"})
    found = traps.load(write(tmp_path, [GOOD, second, third]))
    assert [t.id for t in found] == ["quantized-v-without-fa", "cpu-repack-crash", "fa-all-quants"]
    assert found[1].remedy == traps.Remedy("server_flag", "--no-repack", "rigup adds --no-repack")
    assert dict(found[0].condition) == {"flash_attn": ["off"]}
    with pytest.raises(TypeError):
        found[0].condition["x"] = 1   # read-only
    assert traps.load(write(tmp_path, {"traps": [GOOD]}))[0].id == GOOD["id"]


@pytest.mark.parametrize("change, text", [
    ({"id": "Bad_Id"}, "id: expected [a-z0-9][a-z0-9-]*, got 'Bad_Id'"),
    ({"id": "-x"}, "id: expected"),
    ({"ref": "http://github.com/x"}, "ref: expected an https:// URL or a report's file name"),
    ({"ref": "see #28524"}, "ref: expected"),
    ({"summary": "two\nlines"}, "summary: expected one line"),
    ({"summary": ""}, "summary: expected a non-empty string"),
    ({"condition": {}}, "condition: expected a non-empty map"),
    ({"condition": ["flash_attn"]}, "condition: expected a non-empty map"),
    ({"remedy": {"kind": "flag", "value": None, "fix": "x"}}, "remedy.kind: expected one of refuse|server_flag|build_option"),
    ({"remedy": {"kind": "refuse", "value": "--x", "fix": "x"}}, "remedy.value: expected null for kind refuse"),
    ({"remedy": {"kind": "server_flag", "value": None, "fix": "x"}}, "remedy.value: expected a server flag"),
    ({"remedy": {"kind": "build_option", "value": "-DGGML_X", "fix": "x"}}, "remedy.value: expected a CMake cache entry"),
    ({"remedy": {"kind": "refuse", "value": None}}, "remedy: missing key(s) fix"),
    ({"remedy": {"kind": "refuse", "value": None, "fix": "x", "why": "y"}}, "remedy: unknown key(s) why"),
    ({"severity": "high"}, "unknown key(s) severity"),
])
def test_a_malformed_entry_is_refused_naming_the_file_and_entry(tmp_path, change, text):
    path = write(tmp_path, [dict(GOOD, id="first"), {**GOOD, **change}])
    with pytest.raises(ValueError) as e:
        traps.load(path)
    assert str(e.value).startswith(f"{path}: entry 2"), str(e.value)
    assert text in str(e.value)


def test_a_missing_key_names_the_entry_by_position_and_id(tmp_path):
    entry = {k: v for k, v in GOOD.items() if k != "ref"}
    with pytest.raises(ValueError, match=r"traps.yml: entry 1 \(quantized-v-without-fa\): the entry: missing key\(s\) ref"):
        traps.load(write(tmp_path, [entry]))


def test_the_whole_file_must_be_a_list_of_entries(tmp_path):
    for text in ("", "traps: {}\n", "a: 1\n", "- just a string\n", "[unclosed\n"):
        with pytest.raises(ValueError, match="traps.yml: "):
            traps.load(write(tmp_path, text))
    with pytest.raises(ValueError, match="cannot be read"):
        traps.load(tmp_path / "absent.yml")


def test_ids_are_unique_within_a_file(tmp_path):
    with pytest.raises(ValueError, match=r"entry 2 \(quantized-v-without-fa\): id 'quantized-v-without-fa' is already"):
        traps.load(write(tmp_path, [GOOD, GOOD]))


def test_condition_keys_the_role_does_not_know_are_refused(tmp_path):
    path = write(tmp_path, [dict(GOOD, condition={"flash_atn": ["off"]})])
    with pytest.raises(ValueError, match=r"condition: unknown key\(s\) flash_atn; the role's keys are flash_attn"):
        traps.load(path, {"flash_attn"})
    assert traps.load(path)   # without the role's keys any key is taken


@pytest.mark.parametrize("catalogue", sorted(ROOT.glob("roles/*/traps.yml")), ids=lambda p: p.parent.name)
def test_every_role_catalogue_loads(catalogue):
    assert traps.load(catalogue)
