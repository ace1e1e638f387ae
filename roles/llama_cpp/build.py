"""Operations that build llama.cpp on a host and switch which build serves."""

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError, operation
from pyinfra.operations import files

from rigup.progress import start_command
from rigup.state import read_once, reading
from roles.llama_cpp.facts import BUILD_UNIT, LlamaCppState


@reading(LlamaCppState, "dir")
@operation()
def built(dir: str, build_id: str, script: str):
    """Start the build of ``build_id`` with ``script`` unless its stamp exists: as the transient
    unit rigup-llama-build (it outlives the SSH session; a converge that finds it running waits
    for it first), or as a setsid process on hosts without systemd. ``waited`` (rigup.progress)
    then follows it to its end; a failure shows the build log's last lines."""
    state = read_once(LlamaCppState, dir=dir)
    if build_id in state["builds"]:
        host.noop(f"llama.cpp {build_id} is built")
        return
    q = shlex.quote
    path = f"{dir}/build-{build_id}.sh"
    yield from files.put._inner(src=StringIO(script), dest=path, mode="755")
    start = start_command(BUILD_UNIT, q(path), build_log(dir, build_id), state["systemd"],
                          unless=build_stamp(dir, build_id))
    yield f"mkdir -p {q(dir + '/builds')} && {{ {start}; }}"


def build_log(dir: str, build_id: str) -> str:
    """The log the build script writes."""
    return f"{dir}/builds/{build_id}.log"


def build_stamp(dir: str, build_id: str) -> str:
    """The stamp a finished build leaves."""
    return f"{dir}/builds/{build_id}/rigup-build.json"


@reading(LlamaCppState, "dir")
@operation()
def switched(dir: str, target: str):
    """Point ``dir/current`` at ``target`` (``builds/<id>``) unless it already does; the build it
    pointed at becomes ``previous``. ``target="previous"`` rolls back: current goes to the
    previous build, which stays recorded as previous (so a second run changes nothing)."""
    state = read_once(LlamaCppState, dir=dir)
    rollback = target == "previous"
    if rollback:
        target = state["previous"]
        if not target:
            raise OperationError(f"llama_cpp_rollback: there is no previous build in {dir}")
    if state["current"] == target:
        host.noop(f"current is {target}")
        return
    q = shlex.quote
    if state["current"] and not rollback:
        yield f"ln -sfn {q(state['current'])} {q(dir + '/previous')}"
    yield f"ln -sfn {q(target)} {q(dir + '/current.new')} && mv -T {q(dir + '/current.new')} {q(dir + '/current')}"
