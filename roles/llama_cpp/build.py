"""Operations that build llama.cpp on a host and switch which build serves."""

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError, operation
from pyinfra.operations import files

from rigup.state import read_once
from roles.llama_cpp.facts import BUILD_UNIT, LlamaCppState


@operation()
def built(dir: str, build_id: str, script: str):
    """Build ``build_id`` with ``script`` unless its stamp exists. The build runs as the transient
    unit rigup-llama-build (it outlives the SSH session; a converge that finds it running waits
    for it), or directly on hosts without systemd. A failure shows the build log's last lines."""
    state = read_once(LlamaCppState, dir=dir)
    if build_id in state["builds"]:
        host.noop(f"llama.cpp {build_id} is built")
        return
    q = shlex.quote
    path = f"{dir}/build-{build_id}.sh"
    yield from files.put._inner(src=StringIO(script), dest=path, mode="755")
    log = q(f"{dir}/builds/{build_id}.log")
    on_failure = f"{{ echo {q(f'llama.cpp build {build_id} failed; last lines of its log:')}; tail -n 30 {log}; exit 1; }}"
    if state["systemd"]:
        yield (f"while systemctl is-active -q {BUILD_UNIT}; do sleep 5; done; "
               f"[ -e {q(f'{dir}/builds/{build_id}/rigup-build.json')} ] || "
               f"systemd-run --unit={BUILD_UNIT} --collect --wait --quiet "
               f"--property=Nice=10 {q(path)} || {on_failure}")
    else:
        yield f"{q(path)} || {on_failure}"


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
