"""rigup/opstack.py gives pyinfra's operation order exactly as pyinfra's own stack walk does."""

import sys
from types import SimpleNamespace

from pyinfra.api import util

from rigup.opstack import install, operation_order

PYINFRA_ORDER = util.get_operation_order_from_stack


def nested(state, depth):
    """Both orders, taken ``depth`` calls below the test."""
    if depth:
        return nested(state, depth - 1)
    return operation_order(state), PYINFRA_ORDER(state)


def test_same_order_as_pyinfra():
    for deploy_file in (__file__, "/nowhere/deploy.py", None):
        state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=3)
        for depth in (0, 4):
            mine, theirs = nested(state, depth)
            print(deploy_file, depth, mine)
            assert mine == theirs


def test_installed_where_pyinfra_calls_it():
    install()
    assert sys.modules["pyinfra.api.operation"].get_operation_order_from_stack is operation_order
