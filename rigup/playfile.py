"""The play file pyinfra runs (deploy.py, status.py ...) given a module entry, for ``inspect``.

pyinfra orders each operation call by the line numbers of its call stack: ``inspect.stack()`` on
every operation call, for every host (``pyinfra.api.util.get_operation_order_from_stack``). For
each frame, ``inspect`` looks for the module that owns the frame's file. A file that no module
owns, as a play file that pyinfra runs with ``exec``, costs a scan of every loaded module (~900
with rigup's roles) on each look: three per operation and host. On 8 lab hosts that was half of
the controller's CPU in a no-op converge (1.5 of 3.0 s), and it grows with the fleet. A module
entry whose ``__file__`` is the play file makes each look a dictionary lookup. The entry holds
nothing else and nothing imports it.
"""

import os
import sys
import types


def own_module(filename: str | None) -> None:
    """Give the play file ``filename`` a module entry, once per process."""
    if not filename:
        return
    name = "rigup_play_file:" + os.path.abspath(filename)
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module


def own_module_of(host) -> None:
    """Give the play file that pyinfra runs for ``host`` (its state's ``current_deploy_filename``) a
    module entry; nothing for a host outside a pyinfra run."""
    own_module(getattr(getattr(host, "state", None), "current_deploy_filename", None))
