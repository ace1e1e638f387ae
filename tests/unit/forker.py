"""Python code run as a process of its own would be (its argv, environment, stdin /dev/null, its
output captured), forked from a process that imported what it needs once: for the unit tests whose
runs are mostly imports (pyinfra_cli's, plays.inventory's: some 0.7 s of CPU each). The forking
process never runs one itself, so each child starts from the imports alone, as a fresh one would."""

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

from rigup.config import ROOT

FORKER = """
import json, os, sys, traceback
exec(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fd, path in ((0, os.devnull), (1, job["out"]), (2, job["err"])):
                os.dup2(os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = job["argv"]
            os.environ.clear()
            os.environ.update(job["env"])
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""
_forkers: dict[str, subprocess.Popen] = {}


def forked(imports: str, code: str, argv: list[str], env: dict | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` run with ``argv`` (``sys.argv``) and ``env`` (this process's without one) in a child
    of the process that ran ``imports`` (started at its first use, in ROOT), as ``subprocess.run(
    [sys.executable, "-c", code, *argv[1:]], cwd=ROOT, capture_output=True, text=True)`` would."""
    if imports not in _forkers:
        _forkers[imports] = subprocess.Popen([sys.executable, "-c", FORKER, imports], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert _forkers[imports].stdout.readline() == "ready\n", f"the imports failed: {imports}"
    forker = _forkers[imports]
    with tempfile.TemporaryDirectory() as where:
        out, err = Path(where) / "out", Path(where) / "err"
        forker.stdin.write(json.dumps({"code": code, "argv": argv, "env": dict(os.environ if env is None else env),
                                       "out": str(out), "err": str(err)}) + "\n")
        forker.stdin.flush()
        assert select.select([forker.stdout], [], [], timeout)[0], f"{argv} did not end within {timeout} s"
        returncode = json.loads(forker.stdout.readline())
        return subprocess.CompletedProcess(argv, returncode, out.read_text(), err.read_text())


def close_all() -> None:
    """The forking processes ended (a test module's last test done)."""
    for proc in _forkers.values():
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:   # still waiting on a run that outlived its test's timeout
            proc.kill()
            proc.wait()
    _forkers.clear()
