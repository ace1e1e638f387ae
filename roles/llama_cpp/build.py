"""Operations that build llama.cpp on a host and switch which build serves."""

import json
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand
from rigup.probe import operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.operations import files

from rigup import summary
from rigup.boundary import results
from rigup.boundary.core import Unreadable
from rigup.files import program_text
from rigup.progress import start_command
from rigup.state import read_once, reading
from rigup.text import say, shown, shown_lines
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
    # a stamp that did not read (facts.py: unreadable) vouches for nothing: built again
    forget = f"rm -f {q(build_stamp(dir, build_id))} && " if build_id in state.get("unreadable", {}) else ""
    yield f"{forget}mkdir -p {q(dir + '/builds')} && {{ {start}; }}"


def build_log(dir: str, build_id: str) -> str:
    """The log the build script writes."""
    return f"{dir}/builds/{build_id}.log"


def build_stamp(dir: str, build_id: str) -> str:
    """The stamp a finished build leaves."""
    return f"{dir}/builds/{build_id}/rigup-build.json"


SMOKE = "roles/llama_cpp/shipped/smoke.py"   # sent with a smoke only: rigup-smoke.py in the build directory
SMOKE_MODEL = Path(__file__).with_name("smoke.gguf")


def smoke_paths(dir: str, build_id: str) -> dict:
    """Where a build's smoke keeps its files on the host: the script and the tiny model (shared by
    every build), the build's log and result."""
    out = f"{dir}/builds/{build_id}"
    return {"script": f"{dir}/rigup-smoke.py", "tiny": f"{dir}/smoke.gguf", "log": f"{out}/smoke.log",
            "out": f"{out}/rigup-smoke.json", "bin": f"{out}/bin"}


def smoked(state, host, build_id: str, spec: dict, current: str | None, timeout: int) -> bool:
    """Run the smoke inference of ``build_id`` on the host (roles/llama_cpp/shipped/smoke.py): True when it
    answered (naming a trap that a remedy worked around); else log the log's last lines, then the
    reason (the signal, the model, current kept: the run's summary quotes the last lines), and
    False, which fails the host. A build received from another host (roles/llama_cpp/handover.py)
    that fails is moved aside, so that the next converge compiles. Run as a ``FunctionCommand``."""
    if _smoked(state, host, build_id, spec, current, timeout):
        return True
    out = spec["bin"].rsplit("/", 1)[0]
    q = shlex.quote
    # no switch: its mark goes (a switch cut short is one whose converge ended before its verdict)
    host.run_shell_command(StringCommand(f"rm -f {q(switching(spec['script'].rsplit('/', 1)[0]))}; "
                                         f"[ -e {q(out + '/rigup-received.json')} ] && "
                                         f"rm -rf {q(out + '.refused')} && mv -T {q(out)} {q(out + '.refused')}; true"),
                           print_output=False, print_input=False)
    return False


def _smoked(state, host, build_id: str, spec: dict, current: str | None, timeout: int) -> bool:
    kept = f"current stays {current or 'unset'}, the build is kept in {spec['bin'].rsplit('/', 1)[0]}"
    # the operation's own connector arguments (_sudo, _su_user...): a function command gets none
    connect = {k: v for k, v in (host.current_op_global_arguments or {}).items() if k in CONNECTOR_ARGUMENT_KEYS}
    # /usr/bin/python3 (never PATH's) -s -E -S: no site directory (a .pth there runs at start, as root), no PYTHON* variable;
    # the script is root's rigup-smoke.py in the llama.cpp directory (standard library only)
    command = StringCommand("timeout", "-k", "10", str(timeout), "/usr/bin/python3", "-s", "-E", "-S",
                            QuoteString(spec["script"]), QuoteString(json.dumps(spec)))
    try:
        ok, output = host.run_shell_command(command, print_output=False, print_input=False,
                                            **{**connect, "_timeout": timeout + 30})
    except Exception as e:       # noqa: BLE001 - the connection's own timeout or failure: a result
        return _failed(host, spec, build_id, [], f"no result within {timeout} s ({type(e).__name__})", kept)
    lines = list(output.stdout_lines)

    def failed(tail: list[str], reason: str) -> bool:
        return _failed(host, spec, build_id, tail, reason, kept)

    try:   # the host's output through its one reader: not JSON, nested too deep or a field mistyped is no result
        doc = results.smoke(lines[-1], "the smoke's result")
    except (IndexError, Unreadable) as e:
        why = f": {e}" if isinstance(e, Unreadable) else ""
        return failed((lines + list(output.stderr_lines))[-15:], f"it gave no result{why}")
    for run in doc.get("runs", []):
        model = "the tiny smoke model" if run.get("model") == spec["tiny"] else run.get("model")
        if not run.get("ok"):
            return failed(run.get("tail") or [], f"{run.get('reason')} ({run.get('name')}'s flags, {model})")
        say(f"    [{host.name}] llama.cpp build {build_id} answered ({run.get('tokens')} tokens, "
            f"{run.get('seconds')} s) with {run.get('name')}'s flags on {model}")
        if run.get("remedy"):
            trap = next((t for t in spec.get("remedies", []) if t["id"] == run["remedy"]), {})
            flags = " ".join(trap.get("args", []))
            text = (f"trap {run['remedy']} ({trap.get('ref')}): {run.get('first')}; with {flags} it answered, "
                    f"so the llama-server instances here run with {flags}")
            host.log_styled(shown(text, 4000), fg="yellow", log_func=logger.warning)
            summary.note(host, f"trap {run['remedy']}: {flags}")
    compared = doc.get("compare") or {}
    if compared.get("ratio") is not None:
        figures = (f"{compared['ratio']:.2f}x the current build's decode ({_rates(compared['new_tps'])} against "
                   f"{_rates(compared['current_tps'])} tok/s, {compared.get('rounds')} interleaved pairs)")
        if not compared.get("ok"):
            return _failed(host, spec, build_id, [], f"{figures}, beyond llama_cpp_slower_tolerance "
                           f"{compared.get('tolerance')}", kept, what="is slower than the current build:")
        say(f"    [{host.name}] llama.cpp build {build_id}: {figures}")
        summary.note(host, f"llama.cpp {build_id}: {compared['ratio']:.2f}x current's decode")
    elif compared.get("skipped") or compared.get("reason"):
        if not compared.get("ok"):
            return failed([], compared.get("reason", "its speed was not measured"))
        say(f"    [{host.name}] llama.cpp build {build_id}: not compared ({compared.get('skipped') or compared['reason']})")
    return bool(doc.get("ok")) or failed([], "it did not pass")


def _rates(values) -> str:
    return "/".join(f"{v:g}" for v in values or [])


def _failed(host, spec: dict, build_id: str, tail: list[str], reason: str, kept: str,
            what: str = "failed its smoke inference:") -> bool:
    """Log the smoke log's last lines, then the reason (the run's summary quotes the last lines); False."""
    if tail:
        host.log_styled(shown(f"last lines of {spec['log']}:") + "\n" + shown_lines("\n".join(map(str, tail))), fg="red",
                        log_func=logger.error)
    host.log_styled(shown(f"llama.cpp build {build_id} {what} {reason}; {kept}", 4000),
                    fg="red", log_func=logger.error)
    return False


@reading(LlamaCppState, "dir")
@operation()
def switched(dir: str, target: str, smoke: dict | None = None, smoke_timeout: int = 600):
    """Point ``dir/current`` at ``target`` (``builds/<id>``) unless it already does; the build it
    pointed at becomes ``previous``. With ``smoke`` (the spec of roles/llama_cpp/shipped/smoke.py, less
    the paths), the new build must first answer a smoke inference, unless it already did with the
    same spec: a build that crashes, hangs or answers nothing is not switched to (the host fails;
    current, and so every instance, stays as it was). ``target="previous"`` rolls back: current
    goes to the previous build, which stays recorded as previous (so a second run changes nothing)."""
    state = read_once(LlamaCppState, dir=dir)
    rollback = target == "previous"
    if rollback:
        target = state["previous"]
        if not target:
            raise OperationError(f"llama_cpp_rollback: there is no previous build in {dir}")
    q = shlex.quote
    mark = switching(dir)
    if state["current"] == target:
        met = state["smokes"].get(target.split("/", 1)[-1]) or {}
        if met.get("ok") and met.get("traps"):
            summary.note(host, f"trap {', '.join(met['traps'])}: {' '.join(met.get('server_args') or [])}")
        if state.get("switching"):   # a switch cut short, said in the plan (plan_lines): its mark goes
            yield f"rm -f {q(mark)}"
            return
        host.noop(shown(f"current is {target}"))
        return
    # the switch under way, until current points at its build: a converge cut short (its controller
    # killed) leaves it for the next one to name (issue 65)
    yield f"printf '%s\\n' {q(target)} > {q(mark)}"
    if smoke is not None:
        build_id = target.split("/", 1)[1]
        done = state["smokes"].get(build_id) or {}
        if not (done.get("ok") and done.get("key") == smoke["key"]):
            spec = {**smoke, **smoke_paths(dir, build_id)}
            serving = (state["current"] or "").removeprefix("builds/")
            if spec.get("compare") and serving in state["builds"]:   # measured against the build serving now
                spec["compare"] = {**spec["compare"], "bin": f"{dir}/builds/{serving}/bin"}
            else:
                spec.pop("compare", None)
            yield from files.put._inner(src=StringIO(program_text(SMOKE)), dest=spec["script"], mode="644")
            yield from files.put._inner(src=str(SMOKE_MODEL), dest=spec["tiny"], mode="644")
            yield FunctionCommand(smoked, (build_id, spec, state["current"], smoke_timeout), {})
    if state["current"] and not rollback:
        yield f"ln -sfn {q(state['current'])} {q(dir + '/previous')}"
    yield (f"ln -sfn {q(target)} {q(dir + '/current.new')} && mv -T {q(dir + '/current.new')} {q(dir + '/current')} "
           f"&& rm -f {q(mark)}")


def switching(dir: str) -> str:
    """The mark of a switch under way: the build it switches to (LlamaCppState reads it)."""
    return f"{dir}/switching"
