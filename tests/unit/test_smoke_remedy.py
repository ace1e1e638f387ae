"""roles/llama_server's read of the serving build's rigup-smoke.json (facts.py ``remedy_flags``):
through the boundary's one reader of that record (rigup.boundary.results.smoke), and only the flags
roles/llama_cpp's trap catalogue names as remedies, never one llama_server_allow holds off (round 3
of issue 61, SM3: a file the boundary refused, 'ok' twice, put --slots --props on every instance)."""

import json

from hypothesis import given, settings, strategies as st

from rigup import traps
from rigup.boundary import Unreadable, results
from rigup.config import ROLES_DIR
from rigup.contract.llama_server import FIXED, held_off_flags
from roles.llama_server.facts import REMEDIES, remedy_flags

FLAGS = st.sampled_from(["--no-repack", "--slots", "--props", "--tools", "-ag", "--host", "--api-key", "--no-slots",
                         "--metrics", "--slot-save-path", "--host 0.0.0.0", "no-repack", "--no-repack\n"])
DOCS = st.fixed_dictionaries({"ok": st.sampled_from([True, False, "true", 1, None])},
                             optional={"server_args": st.lists(FLAGS, max_size=4) | st.text(max_size=5),
                                       "traps": st.lists(st.sampled_from(["cpu-repack-crash", "x y"]), max_size=2)})


def test_the_sm3_file_the_boundary_refuses_adds_no_flag():
    text = '{"ok": false, "server_args": ["--slots", "--props"], "ok": true}'
    try:
        results.smoke(text, "w")
        raise AssertionError("the boundary read it")
    except Unreadable:
        pass
    assert remedy_flags(text) == []


def test_a_passed_smoke_naming_held_off_or_unknown_flags_adds_only_the_catalogues_remedy():
    text = json.dumps({"ok": True, "server_args": ["--slots", "--props", "--metrics", "--no-repack"]})
    assert remedy_flags(text) == ["--no-repack"]
    assert remedy_flags(json.dumps({"ok": False, "server_args": ["--no-repack"]})) == []
    assert remedy_flags(None) == remedy_flags("") == remedy_flags("{") == [] == remedy_flags(json.dumps({"ok": True}))


def test_every_remedy_of_the_catalogue_is_a_flag_the_instances_may_get():
    """A server_flag remedy that llama_server_allow held off (or rigup writes itself) would be
    dropped here without a word: the catalogue must not name one."""
    catalogue = {t.remedy.value for t in traps.load(ROLES_DIR / "llama_cpp" / "traps.yml") if t.remedy.kind == "server_flag"}
    assert catalogue and REMEDIES == catalogue and not catalogue & (set(held_off_flags()) | set(FIXED))


@settings(max_examples=80, deadline=1000)
@given(DOCS.map(json.dumps) | st.text(max_size=40) | DOCS.map(lambda d: json.dumps(d)[:-1] + ', "ok": true}'))
def test_remedy_flags_are_what_the_boundary_reads_and_the_catalogue_names(text):
    got = remedy_flags(text)
    try:
        doc = results.smoke(text, "rigup-smoke.json")
    except Unreadable:
        assert got == []
        return
    assert set(got) <= REMEDIES and set(got) <= set(doc.get("server_args") or [])
    assert got == [] or doc["ok"] is True
