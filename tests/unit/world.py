"""Host programs tested in this process, made in the world their tests run in.

A host program is imported at collection; a unit test before its module may import pyinfra_cli
since (rigup.config's check_host reads --data with pyinfra's own parser), whose gevent patch makes
the threads of a module's loopback servers greenlets. A socket class the program made from the
unpatched socket (roles/balancer/shipped/drain.py's _Deadline, its copy in roles/llama_cpp/shipped/smoke.py) then
blocked in a real read while the server waited for the hub: those tests timed out in the full run
only. ``remade(module)``: an autouse fixture making ``module`` again from its source for its tests."""

import importlib

import pytest


def remade(module):
    """An autouse module-scoped fixture that reloads ``module`` (assign it to a name in the test module)."""
    @pytest.fixture(autouse=True, scope="module")
    def _remade():
        importlib.reload(module)
    return _remade
