"""The generated parts of the documentation are current (regenerate: make docs, or python -m
tests.docs): docs/refusals.md's table, docs/roles/<role>.md and docs/group_vars.schema.json; the
schema is a well-formed JSON Schema (draft 2020-12), every group_vars file passes it and
rigup/config.py, and it refuses what the forms refuse. jsonschema is not installed here, so
:func:`invalid` reads the keywords the generator writes, as the draft defines them. Every
relative link of README.md and docs/ leads to a file (and heading) that exists, and every path
of the checkout they name in backticks or code blocks exists."""

import json
import re

import pytest

from rigup.config import GROUP_VARS_DIR, load_yaml, problems
from rigup.models import models
from rigup.instances.llama_server import instances as llama_instances
from rigup.instances.vllm import instances as vllm_instances
from tests import docs
from tests.unit.test_hostile_inputs import CASES, filled

SCHEMA = json.loads(docs.SCHEMA.read_text())
README = docs.ROOT / "README.md"
PAGES = [README, *sorted((docs.ROOT / "docs").rglob("*.md"))]
GROUP_VARS = sorted(GROUP_VARS_DIR.glob("*.yml"))
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}
_KEYWORDS = {"$schema", "title", "description", "default", "type", "enum", "pattern", "minimum", "maximum",
             "items", "properties", "required", "additionalProperties", "patternProperties", "propertyNames"}


def test_the_refusal_page_is_current():
    assert docs.BEGIN in docs.REFUSALS.read_text(), "docs/refusals.md lacks the generated refusal table"
    assert docs.refusals_page() == docs.REFUSALS.read_text(), "docs/refusals.md is stale: run make docs"
    assert docs.BEGIN not in README.read_text(), "the refusal table lives in docs/refusals.md, not README"


def test_role_pages_and_schema_are_current():
    expected = docs.generated()
    stale = [str(p.relative_to(docs.ROOT)) for p, text in expected.items() if not p.exists() or p.read_text() != text]
    extra = sorted(str(p.relative_to(docs.ROOT)) for p in docs.ROLE_DOCS.glob("*.md") if p not in expected)
    print(f"{len(expected)} generated files; stale: {stale}; not generated: {extra}")
    assert not stale, f"stale: {stale}: run make docs"
    assert not extra, f"pages of no role: {extra}"


def test_every_variable_and_entry_key_is_on_its_role_page():
    for name, var in docs.declared().items():
        page = (docs.ROLE_DOCS / f"{var.file.split('/')[1]}.md").read_text()
        assert f"| `{name}` |" in page
    for name, keys in docs.ENTRY_FORMS.items():
        assert docs.declared()[name].form.kind == "map"
        for key in keys:
            assert f"| `{key}` |" in docs.role_page(docs.declared()[name].file.split("/")[1])


def _well_formed(schema, where="#"):
    """Each problem of ``schema`` as a JSON Schema 2020-12 of the keywords the generator uses."""
    if schema is True or schema is False:
        return []
    found = [f"{where}: unknown keyword {k}" for k in schema if k not in _KEYWORDS]
    types = schema.get("type", [])
    for t in [types] if isinstance(types, str) else types:
        found += [] if t in _TYPES else [f"{where}: type {t!r}"]
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        found.append(f"{where}: enum is not a non-empty array")
    if "pattern" in schema:
        re.compile(schema["pattern"])
    if "minimum" in schema and "maximum" in schema and schema["minimum"] > schema["maximum"]:
        found.append(f"{where}: minimum > maximum")
    if not set(schema.get("required", [])) <= set(schema.get("properties", {})):
        found.append(f"{where}: required names a key that is not a property")
    for keyword in ("properties", "patternProperties"):
        for key, sub in schema.get(keyword, {}).items():
            found += _well_formed(sub, f"{where}/{keyword}/{key}")
    for keyword in ("items", "additionalProperties", "propertyNames"):
        if keyword in schema:
            found += _well_formed(schema[keyword], f"{where}/{keyword}")
    return found


def invalid(value, schema, where=""):
    """The first place where ``value`` fails ``schema`` (a key path), or None."""
    if schema is True or schema == {}:
        return None
    if schema is False:
        return where or "(top)"
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        ok = any(isinstance(value, _TYPES[t]) and not (isinstance(value, bool) and t in ("integer", "number"))
                 for t in types)
        if not ok:
            return where or "(top)"
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return where or "(top)"
    # ECMA-262's $ (no m flag) is the end of the text; Python's also matches before a last newline
    ecma_end = re.sub(r"\$$", r"(?![\\s\\S])", schema.get("pattern", ""))
    if isinstance(value, str) and "pattern" in schema and not re.search(ecma_end, value):
        return where or "(top)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            return where or "(top)"
    if isinstance(value, list):
        return next((w for i, item in enumerate(value) if (w := invalid(item, schema.get("items", {}), f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{where}.{missing[0]}"
        for key, item in value.items():
            path = f"{where}.{key}".lstrip(".")
            if "propertyNames" in schema and invalid(key, schema["propertyNames"]):
                return path
            if key in schema.get("properties", {}):
                sub = schema["properties"][key]
            else:
                sub = next((s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)),
                           schema.get("additionalProperties", True))
            found = invalid(item, sub, path)
            if found:
                return found
    return None


def test_schema_is_a_well_formed_draft_2020_12_schema():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(SCHEMA["properties"]) == set(docs.declared())
    assert _well_formed(SCHEMA) == []
    print(f"{len(SCHEMA['properties'])} variables, {sum(len(k) for k in docs.ENTRY_FORMS.values())} entry keys")


@pytest.mark.parametrize("path", GROUP_VARS, ids=[p.name for p in GROUP_VARS])
def test_group_vars_pass_the_schema_and_the_validator(path):
    data = load_yaml(path)
    assert invalid(data, SCHEMA) is None
    assert problems(data) == []
    nested = models(data)[1] + llama_instances({**data})[1] + vllm_instances({**data})[1]
    assert nested == []
    assert f"$schema=../docs/{docs.SCHEMA.name}" in path.read_text().splitlines()[0]


@pytest.mark.parametrize("key, value", [
    ("base_extra_pakages", ["htop"]),                        # a typo
    ("apt_lock_timeout", "forever"), ("apt_lock_timeout", 3601), ("apt_lock_timeout", True),
    ("llama_cpp_backend", "opencl"),                         # not one of its choices
    ("rigup_user", "a b"), ("llama_server_health_prompt", "hi\nthere"),
    ("models", {"m": {"repo": "org/r"}}),                    # revision missing
    ("models", {"a/b": {"repo": "org/r", "revision": "0" * 40}}),
    ("llama_server_instances", {"x": {"model": "m", "port": 8081, "ctx": "big"}}),
    ("llama_server_instances", {"x": {"model": "m", "port": 8081, "flash_attn": True}}),  # YAML's `on`
    ("vllm_instances", {"x": {"model": "m", "port": 8000, "tp": 0}}),
    ("vllm_instances", {"x": {"model": "m", "port": 8000, "tpp": 2}}),
])
def test_the_schema_refuses_what_the_forms_refuse(key, value):
    assert invalid({key: value}, SCHEMA) is not None
    assert problems({key: value}) or models({key: value})[1] or llama_instances({key: value})[1] \
        or vllm_instances({key: value})[1]


def test_the_schema_takes_connector_keys_and_nulls():
    assert invalid({"ssh_user": "ubuntu", "_sudo": True, "model_fetch_hf_token_src": None,
                    "llama_server_instances": {"x": {"model": "m", "port": 8081, "flash_attn": "on"}}}, SCHEMA) is None


def test_hostile_inputs_the_schema_catches_as_you_type():
    caught = [c["key"] for c in CASES if invalid(filled(c), SCHEMA) is not None]
    print(f"the schema refuses {len(caught)} of {len(CASES)} hostile inputs; the rest need the host or other "
          "keys (rigup/config.py, preflight)")
    assert len(caught) >= 43  # 43 of 84 when written: those a form can say


# Paths the operator makes, not the checkout's: the copy of inventory/a100.py, its site file.
MADE_BY_YOU = {"inventory/mine.py", "group_vars/mine.yml"}
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _prose(page) -> str:
    return _FENCE.sub("", page.read_text())


def _named_paths(page) -> list[str]:
    """The checkout's paths a page names: tokens of its code spans and blocks whose first part is
    a top-level entry of the checkout; placeholders (``<role>``, ``NAME``, ``...``) left out."""
    text = page.read_text()
    code = "\n".join(_FENCE.findall(text)) + "\n" + "\n".join(re.findall(r"`([^`]+)`", _FENCE.sub("", text)))
    top = {p.name for p in docs.ROOT.iterdir()} - {".git"}
    found = []
    for token in code.split():
        token = re.sub(r"'s$", "", token.strip("\"'(),.;:").split("::")[0])
        if "/" in token and token.split("/")[0] in top and not re.search(r"[<>{}$]|\.\.\.|NAME|KEY", token):
            found.append(token)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(docs.ROOT)) for p in PAGES])
def test_every_link_and_path_of_the_docs_exists(page):
    links, missing = _LINK.findall(_prose(page)), []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue                                   # https://, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            missing.append(link)
        elif anchor and path.suffix == ".md" and anchor not in {_slug(h) for h in _HEADING.findall(_prose(path))}:
            missing.append(f"{link} (no such heading)")
    paths = _named_paths(page)
    missing += [p for p in paths if p not in MADE_BY_YOU and not list(docs.ROOT.glob(p.rstrip("/")))]
    print(f"{page.relative_to(docs.ROOT)}: {len(links)} links, {len(paths)} paths of the checkout, missing {missing}")
    assert not missing, f"{page.relative_to(docs.ROOT)}: {missing}"
