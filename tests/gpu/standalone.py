"""rigup's pure modules on a GPU machine with python3 alone (no pyinfra: tests/gpu/ runs there).

Imported by the scripts of tests/gpu once the checkout is on ``sys.path``: where pyinfra is
missing it stands in the names the pure modules import when they load (rigup/gpu/facts.py defines
pyinfra facts next to its parsers; rigup/config.py names PyinfraError). Only the parsers and the
plans run there; nothing of pyinfra's is called.
"""

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

try:
    import pyinfra.api  # noqa: F401  (a controller has it; a bare GPU machine need not)
except ImportError:
    _api = types.ModuleType("pyinfra.api")
    _api.FactBase = type("FactBase", (), {})
    _api.exceptions = types.ModuleType("pyinfra.api.exceptions")
    _api.exceptions.PyinfraError = type("PyinfraError", (Exception,), {})
    sys.modules.update({"pyinfra": types.ModuleType("pyinfra"), "pyinfra.api": _api,
                        "pyinfra.api.exceptions": _api.exceptions})
