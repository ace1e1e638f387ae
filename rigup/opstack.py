"""pyinfra's operation order from a plain walk of the call stack (``install()``: deploy.py).

pyinfra (CLI mode) orders each operation call by the line numbers of the stack from the deploy
file down, for every host: ``get_operation_order_from_stack`` gets them with ``inspect.stack()``
and ``getframeinfo`` on every frame, which read each frame's source lines and search
``sys.modules`` for its module. With a deploy's ~720 modules loaded and the ~10 frames of an
operation call in pyinfra's greenlets, that is 0.7 ms of the controller's CPU per operation and
host (2.9 ms at 45 frames), about 0.04 s per host for the play's 55 operations; this walk takes
0.01 ms and gives the same line numbers (tests/unit/test_opstack.py). Measured with it
(tests/bench/results/2026-11-30-fleet-after-opstack.md): the controller's CPU for a no-op converge
of 8 lab hosts 3.0-3.2 s, 3.5-4.2 s without.
"""

import sys

import pyinfra
import pyinfra.api.operation
from pyinfra.api.util import PYINFRA_INSTALL_DIR


def operation_order(state) -> list[int]:
    """The line numbers pyinfra's get_operation_order_from_stack returns for the calling stack."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    start = 0
    if state.current_deploy_filename:  # from the outermost frame of the deploy file
        names = [f.f_code.co_filename for f in frames]
        # without one, pyinfra keeps its own frame alone, which it leaves out as pyinfra's
        start = names.index(state.current_deploy_filename) if state.current_deploy_filename in names else len(frames)
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    return line_numbers + [f.f_lineno for f in frames[start:] if not f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)]


def install() -> None:
    """Make pyinfra's operation decorator use operation_order (in the module: the attribute
    ``pyinfra.api.operation`` is the decorator of the same name)."""
    sys.modules["pyinfra.api.operation"].get_operation_order_from_stack = operation_order
