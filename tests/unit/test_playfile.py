"""rigup/playfile.py: a play file run with exec is found by inspect as a module's file."""

import inspect
import sys

from rigup import playfile


def frame_module(path):
    """The module inspect finds for a frame of code compiled from ``path`` and run with exec."""
    found = {}
    code = compile("found['module'] = getmodule(currentframe(), path)", str(path), "exec")
    exec(code, {"found": found, "getmodule": inspect.getmodule, "currentframe": inspect.currentframe,
                "path": str(path)})
    return found["module"]


def test_a_play_file_gets_a_module_entry_once(tmp_path):
    play = tmp_path / "deploy.py"
    play.write_text("")
    assert frame_module(play) is None  # no module owns it: inspect scanned every module for nothing
    playfile.own_module(str(play))
    module = frame_module(play)
    assert module is not None and module.__file__ == str(play)
    playfile.own_module(str(play))
    assert [n for n in sys.modules if n.startswith("rigup_play_file:") and n.endswith(str(play))] == [module.__name__]
    del sys.modules[module.__name__]


def test_no_play_file_is_nothing():
    before = set(sys.modules)
    playfile.own_module(None)
    assert set(sys.modules) == before
