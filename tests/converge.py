"""Run pyinfra the way a user does (the CLI, real SSH) and read its results table."""

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float

    @property
    def totals(self) -> dict[str, int]:
        """The "Grand total" row: operations run, and how many changed (Success), erred, did not."""
        row = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", self.output)
        assert row, f"no results table in pyinfra's output:\n{self.output[-3000:]}"
        num = [0 if v == "-" else int(v) for v in row.groups()]
        return dict(zip(("ops", "changed", "errors", "unchanged"), num))

    def changed_operations(self) -> list[str]:
        """Names of the operations whose Success column is not empty."""
        table = self.output.split("--> Results:", 1)[-1]
        rows = re.findall(r"^\s{4}(.+?)\s{2,}\d+\s+(\d+)\s+\S+\s+\S+\s*$", table, re.M)
        return [name for name, success in rows if name != "Grand total"]

    def changed_on(self, host: str) -> list[str]:
        """Names of the operations that changed ``host`` (pyinfra's "[HOST] Success" lines)."""
        ops = re.split(r"^--> Starting operation: ", self.output, flags=re.M)[1:]
        return [op.split("\n", 1)[0].strip() for op in ops if re.search(rf"^\s+\[{re.escape(host)}\] Success", op, re.M)]


def pyinfra(*args: str, timeout: int = 1800, env: dict | None = None, yes: bool = True) -> Run:
    """``pyinfra -y ARGS`` from the project root; returns code, output and wall time. With
    ``yes=False`` (for ``--dry``, which never prompts) pyinfra detects and lists the changes."""
    start = time.monotonic()
    result = subprocess.run([PYINFRA, *(["-y"] if yes else []), *args], cwd=ROOT,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            timeout=timeout, env={**os.environ, **(env or {})})
    return Run(result.returncode, result.stdout + result.stderr, time.monotonic() - start)


def converge(inventory: str = "inventory/lab.py", *args: str, **kw) -> Run:
    """``pyinfra -y INVENTORY deploy.py ARGS``; fails the test with the output when it fails."""
    run = pyinfra(inventory, "deploy.py", *args, **kw)
    assert run.returncode == 0, f"converge failed:\n{run.output[-6000:]}"
    return run
