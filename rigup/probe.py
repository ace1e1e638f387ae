"""A converged role costs the controller no pyinfra operation: each role's operation calls are
recorded, checked against the host's state, and handed to pyinfra only from the first role that
would change something.

Why by hand: pyinfra spends most of a no-op converge's controller CPU in its operation calls, not
in what they check: each call walks the whole call stack with ``inspect.stack()`` (reading every
frame's source line) for its order, binds and types its arguments, keeps per-host data, and the
execution logs and times it again; about 3 ms per call and some 56 calls a host. pyinfra has no
option to skip an operation that will change nothing (its ``--dry`` runs the same bodies and
still registers every call), and patching it is not rigup's to do.

How (deploy.py, :func:`converge`), for one host:

1. **Record.** Each role's ``apply`` runs as it always did (its plan lines, its checks, its
   ``will_read``), but its operation calls (rigup's own, declared with :func:`operation`, and the
   pyinfra operations the roles use, through :data:`systemd`, :data:`python` and :data:`files`)
   are recorded with their arguments instead of registered, each returning a :class:`Planned`
   (``did_change()``, what an ``_if=`` reads). The step of deploy.py, the deploy context (name,
   data defaults) and the call's own line numbers are kept with it.
2. **Check.** In order, each recorded call's ``_if`` is evaluated and, when it holds, its body is
   run exactly as pyinfra runs it at execution: the commands it yields are what it would change.
   The first body's read (rigup.state.read_once) reads every fact the roles named, in one round
   trip. A role whose every call yields nothing is converged: the same bodies checked the same
   properties the operations would have, on the same state (nothing has executed on the host).
3. **Register.** From the first role with a change (a command, an ``_if`` that holds, a body that
   raised), every recorded call of that role and of every later role is handed to pyinfra, in
   the order it was made, in its own deploy context, each with its step, lines and loop position
   as its order (so that one call is one operation across hosts, as pyinfra's stack order makes
   it). Its ``Planned`` then answers with the operation's own ``did_change()``. Nothing is
   skipped after a change: a later role may read what an earlier one changes.

A host whose roles are all converged logs one line (``every role converged (...)``) and registers
no operation; rigup.summary says ``unchanged`` for it; otherwise the line names the roles found converged
and the first call that would change something, with its command (masked as pyinfra masks it). Outside :func:`converge` (the other
plays, a role called on its own) every wrapper is pyinfra's operation, called at once.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from types import SimpleNamespace

from pyinfra import host
from pyinfra.api import operation as _pyinfra_operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.util import PYINFRA_INSTALL_DIR
from pyinfra.operations import files as _files
from pyinfra.operations import python as _python
from pyinfra.operations import systemd as _systemd

from rigup import run as run_state, summary
from rigup.text import shown


class Planned:
    """What a recorded call returns while its role is recorded: ``did_change()`` is what the
    check found (the call would change something) until the call is registered, then its
    operation's own ``did_change()`` (an ``_if=`` of a later call reads it at execution)."""

    __slots__ = ("change", "real")

    def __init__(self) -> None:
        self.change: bool | None = None
        self.real = None

    def did_change(self) -> bool:
        return self.real.did_change() if self.real is not None else bool(self.change)


@dataclass
class Call:
    op: object                      # pyinfra's operation (decorated): what registration calls
    args: tuple
    kwargs: dict
    planned: Planned
    order: list[int]                # the call's line numbers below deploy.py, then its loop positions
    context: tuple                  # (in_deploy, deploy name, deploy kwargs, deploy data) when it was made




def _context() -> tuple:
    """The host's deploy context now: (in_deploy, deploy name, deploy kwargs, deploy data)."""
    return host.in_deploy, host.current_deploy_name, host.current_deploy_kwargs, host.current_deploy_data


def _order() -> list[int]:
    """The line numbers of the calling frames from deploy.py's inwards, leaving out pyinfra's and
    this module's (pyinfra's stack order without ``inspect.stack()``), then the host's loop positions."""
    deploy_file = host.state.current_deploy_filename
    lines, frame = [], sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(PYINFRA_INSTALL_DIR) and name != __file__:
            lines.append(frame.f_lineno)
        if name == deploy_file:
            break
        frame = frame.f_back
    return lines[::-1] + list(host.loop_position)


def recorded(op):
    """``op`` (a pyinfra operation) as the roles call it: recorded while :func:`converge` records
    this host's role, else called at once."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        recording = run_state.host_run(host).recording.get(host.name)
        if recording is None:
            return op(*args, **kwargs)
        planned = Planned()
        recording.append(Call(op, args, kwargs, planned, _order(), _context()))
        return planned

    call.rigup_recorded = True   # rigup.state.reading goes above it (it names reads at this call)
    return call


def operation(**options):
    """pyinfra's ``@operation()``, recorded by :func:`converge` (:func:`recorded`)."""

    def wrap(func):
        return recorded(_pyinfra_operation(**options)(func))

    return wrap


# The pyinfra operations the roles call, recorded like rigup's own.
systemd = SimpleNamespace(service=recorded(_systemd.service), daemon_reload=recorded(_systemd.daemon_reload))
python = SimpleNamespace(call=recorded(_python.call))
files = SimpleNamespace(put=recorded(_files.put))


class _Context:
    """A recorded call's deploy context (its role's name, data defaults, deploy arguments), set on
    the host while the call is checked or registered."""

    def __init__(self, context: tuple) -> None:
        self.context = context

    def __enter__(self):
        self.saved = _context()
        host.in_deploy, host.current_deploy_name, host.current_deploy_kwargs, host.current_deploy_data = self.context

    def __exit__(self, *exc):
        host.in_deploy, host.current_deploy_name, host.current_deploy_kwargs, host.current_deploy_data = self.saved
        return False


def _holds(conditions) -> bool:
    if conditions is None:
        return True
    return all(c() for c in conditions) if isinstance(conditions, (list, tuple)) else bool(conditions())


def changes(call: Call) -> str | None:
    """What ``call`` would change on the host now, or None: its ``_if`` holds and its body yields a
    command (``would run: <command>``), or raises (its registered operation then reports it)."""
    kwargs = {k: v for k, v in call.kwargs.items() if not k.startswith("_") and k != "name"}
    conditions = call.kwargs.get("_if")
    deploy_ifs = (call.context[2] or {}).get("_if")
    with _Context(call.context):
        try:
            if not (_holds(conditions) and _holds(deploy_ifs)):
                return None
            for command in call.op._inner(*call.args, **kwargs):
                text = command if isinstance(command, str) else command.get_masked_value() \
                    if hasattr(command, "get_masked_value") else type(command).__name__
                return f"would run: {str(text)[:80]}"
        except Exception as e:   # noqa: BLE001 (registered, the operation reports it as pyinfra would)
            return f"its check raised {type(e).__name__}: {str(e)[:200]}"
    return None


def _register(step_index: int, calls: list[Call]) -> None:
    saved = list(host.loop_position)
    try:
        for call in calls:
            host.loop_position[:] = [step_index, *call.order]
            with _Context(call.context):
                call.planned.real = call.op(*call.args, **call.kwargs)
    finally:
        host.loop_position[:] = saved


def _record(step, plan, cfg) -> list[Call]:
    """``step(plan, cfg)`` with its operation calls recorded. An operation that bypassed the recording
    (a pyinfra operation called directly) would run before every recorded one: refused, naming it."""
    recording = run_state.host_run(host).recording   # host -> the calls of the step being recorded
    recording[host.name] = []
    registered = len(host.op_hash_order)
    try:
        inner = getattr(step, "_inner", None)    # a role's @deploy function
        if inner is None:
            step(plan, cfg)
        else:
            # What pyinfra's @deploy wrapper does, less its global arguments: called with none, it
            # works out every argument's default (type hints, host data, config; ~1 ms a call),
            # which is what each operation works out again for itself when the deploy has none
            with host.deploy(name=inner.deploy_name, kwargs=None, data=getattr(inner, "deploy_data", None)):
                inner(plan, cfg)
        if len(host.op_hash_order) != registered:
            names = sorted({n for h in host.op_hash_order[registered:] for n in host.state.op_meta[h].names})
            raise PyinfraError(f"{getattr(step, '__module__', step)}: {', '.join(names)} bypassed rigup.probe: "
                               "declare rigup's operations with rigup.probe.operation and call pyinfra's "
                               "through rigup.probe (systemd, python, files)")
        return recording[host.name]
    finally:
        del recording[host.name]


def converge(steps: list, plan, cfg, names: list[str]) -> None:
    """Record every step (``steps[i](plan, cfg)``, called ``names[i]``), check them in order, and
    register the calls from the first step with a change on (module docstring)."""
    recorded_steps = []
    for step in steps:
        recorded_steps.append(_record(step, plan, cfg))
        if host in host.state.failed_hosts:   # a role refused the host: nothing of it runs
            return
    first, checked, why = len(recorded_steps), 0, None
    for i, calls in enumerate(recorded_steps):
        for call in calls:
            why = changes(call)
            call.planned.change = why is not None
            if why:
                first = i
                break
        if why:
            break
        checked += len(calls)
    if first == len(recorded_steps):
        roles = len({n.split(".")[0] for n in names})
        text = f"every role converged ({roles} roles, {len(names)} steps, {checked} operations checked, none to run)"
        host.log(shown(text, 4000))
        summary.converged_without_operations(host, text)
        return
    what = next(c for c in recorded_steps[first] if c.planned.change).kwargs.get("name") or "an operation"
    done = f"nothing to do in {', '.join(names[:first])} ({checked} operations checked); " if first else ""
    host.log(shown(f"{done}operations run from {names[first]} on ({what}: {why})", 4000))
    for i in range(first, len(recorded_steps)):
        _register(i, recorded_steps[i])
