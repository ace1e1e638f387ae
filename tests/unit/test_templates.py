"""rigup.templates: a line-based file (unit, drop-in) never gains a line from a value."""

import pytest

from roles.llama_server.command import dropin_text
from rigup.instances.llama_server import instances

INSTANCE = {"models": {"m": {"repo": "o/r", "revision": "a" * 40}},
            "llama_server_instances": {"glm": {"model": "m", "port": 8081, "ctx": 8192, "parallel": 1}}}


def test_a_revision_with_a_newline_never_reaches_a_drop_in():
    (inst,) = instances(INSTANCE)[0].values()
    ok = dropin_text("glm", inst, "/b/llama-server", "/srv/m/a.gguf", "builds/x", "u1", "a" * 40)
    assert "ExecStart=/b/llama-server" in ok
    with pytest.raises(ValueError, match="newline"):
        dropin_text("glm", inst, "/b/llama-server", "/srv/m/a.gguf", "builds/x", "u1",
                    "a" * 40 + "\nExecStartPre=+/bin/sh -c id")
