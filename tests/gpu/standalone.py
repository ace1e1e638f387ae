"""rigup's pure modules on a GPU machine with python3 alone (no pyinfra: tests/gpu/ runs there).

Imported by the scripts of tests/gpu once the checkout is on ``sys.path``: where pyinfra is
missing it stands in the names the pure modules import when they load (rigup/gpu/facts.py defines
pyinfra facts next to its parsers; rigup/config.py names PyinfraError). Only the parsers and the
plans run there; nothing of pyinfra's is called. :func:`load` imports a role's pure module
without the role package's ``__init__``, which is its pyinfra deploy.
"""

import importlib
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

try:
    import pyinfra.api  # noqa: F401  (a controller has it; a bare GPU machine need not)
    STANDING_IN = False
except ImportError:
    STANDING_IN = True
    _api = types.ModuleType("pyinfra.api")
    _api.FactBase = type("FactBase", (), {})
    _api.exceptions = types.ModuleType("pyinfra.api.exceptions")
    _api.exceptions.PyinfraError = type("PyinfraError", (Exception,), {})
    sys.modules.update({"pyinfra": types.ModuleType("pyinfra"), "pyinfra.api": _api,
                        "pyinfra.api.exceptions": _api.exceptions})


def load(path: str):
    """The module at ``path`` (from the repository root: ``rigup/instances/llama_server.py``), imported
    by its package name. Without pyinfra, ``roles`` and ``roles.NAME`` stand in as bare packages of
    their folders (unless imported already), so that the module and its imports of its siblings
    (schema.py's ``rigup.instances.tuned``) load those files alone, never the role's deploy."""
    parts = Path(path).with_suffix("").parts
    if STANDING_IN and parts[0] == "roles":
        for depth in range(1, len(parts)):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(ROOT.joinpath(*parts[:depth]))]
                sys.modules[name] = package
    return importlib.import_module(".".join(parts))
