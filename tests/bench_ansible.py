"""`make bench-ansible`: a converge with nothing to do, rigup vs Ansible with Mitogen, same work.

Boots its own lab (4 a100 hosts), converges deploy.py on them (the first converge builds
llama.cpp: minutes on a 2-core machine), then times, on 1 host (lab1) and on all 4, the wall
time of a converge that has nothing to do:

- rigup: ``pyinfra -y inventory/lab.py deploy.py``;
- Ansible with Mitogen (strategy ``mitogen_linear``) and plain Ansible (``linear``, SSH with
  pipelining and ControlPersist, a fresh control socket per run) running the playbook of
  tests/bench/ansible/playbook.py, which does the same checks of the same state; each with
  ``gather_facts`` off (rigup gathers nothing it does not use) and on (Ansible's default).

Rounds alternate the tools; each figure is the median of REPS rounds. Every timed run must
change nothing (rigup: 0 changed operations; Ansible: changed=0, failed=0 in the recap), or the
bench stops. ansible-core and mitogen (ANSIBLE_PINS) are installed from PyPI into their own
virtualenv, VENV, outside the repository. The lab is torn down at the end, whatever happens.

    RIGUP_LAB_ID=6 .venv/bin/python -m tests.bench_ansible     # BENCH_REPS=5 by default

Needs root (the lab).
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.ansible import playbook
from tests.conftest import assert_nothing_left
from tests.converge import ROOT, converge
from tests.lab import hub, lab, models, sources

# Mitogen's docs (docs/ansible_detailed.rst) list Ansible up to 12 (ansible-core 2.19) on Python
# 3.11; ansible-core 2.20 and later need Python >= 3.12, which this machine does not have.
ANSIBLE_PINS = ["ansible-core==2.19.14", "mitogen==0.3.54"]
VENV = Path("/var/lib/rigup-bench/ansible-venv")
WORK = Path(f"/var/lib/rigup-bench/work{lab.LAB_ID}")
REPS = int(os.environ.get("BENCH_REPS", "5"))
HOSTS = 4
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)


def ansible_venv() -> Path:
    """VENV with ANSIBLE_PINS (made once; made again when the pins change)."""
    stamp = VENV / "rigup-pins.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(ANSIBLE_PINS):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([VENV / "bin/pip", "install", "-q", *ANSIBLE_PINS], check=True)
        stamp.write_text("\n".join(ANSIBLE_PINS))
    return VENV


def variants(venv: Path) -> dict[str, dict]:
    """Environment of each Ansible variant (its ansible.cfg is empty: everything is set here)."""
    (WORK / "ansible.cfg").write_text("[defaults]\n")
    strategy = next(venv.glob("lib/python3*/site-packages/ansible_mitogen/plugins/strategy"))
    common = {"ANSIBLE_CONFIG": str(WORK / "ansible.cfg"), "ANSIBLE_HOME": str(WORK / "ansible-home"),
              "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False"}
    mitogen = {**common, "ANSIBLE_STRATEGY_PLUGINS": str(strategy), "ANSIBLE_STRATEGY": "mitogen_linear"}
    plain = {**common, "ANSIBLE_STRATEGY": "linear", "ANSIBLE_PIPELINING": "True"}
    off, on = {"ANSIBLE_GATHERING": "explicit"}, {"ANSIBLE_GATHERING": "implicit"}
    return {"Ansible + Mitogen, gather_facts off": {**mitogen, **off},
            "Ansible + Mitogen, gather_facts on": {**mitogen, **on},
            "Ansible plain (pipelining), gather_facts off": {**plain, **off},
            "Ansible plain (pipelining), gather_facts on": {**plain, **on}}


def ansible(venv: Path, env: dict, limit: str) -> tuple[float, dict]:
    """One ``ansible-playbook`` run: wall seconds and the recap ({host: {ok, changed, ...}}),
    with a fresh SSH control socket directory (closed after) so no run reuses another's."""
    with tempfile.TemporaryDirectory(dir=WORK) as sockets:
        start = time.monotonic()
        run = subprocess.run([venv / "bin/ansible-playbook", "-i", WORK / "inventory.yml", WORK / "site.yml",
                              "--limit", limit], cwd=WORK, capture_output=True, text=True,
                             env={**os.environ, **env, "ANSIBLE_SSH_CONTROL_PATH_DIR": sockets})
        seconds = time.monotonic() - start
        for socket in Path(sockets).iterdir():
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={socket}", "x"], capture_output=True)
    recap = {h: dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, n)))
             for h, *n in RECAP.findall(run.stdout)}
    bad = {h: r for h, r in recap.items() if r["changed"] or r["failed"] or r["unreachable"]}
    assert run.returncode == 0 and recap and not bad, f"ansible-playbook changed or failed:\n{run.stdout[-6000:]}"
    return seconds, recap


def rigup(limit: str) -> tuple[float, int]:
    """One no-op converge: wall seconds and the operations per host."""
    run = converge("inventory/lab.py", *(["--limit", limit] if limit != "all" else []))
    assert run.totals["changed"] == 0, f"rigup changed {run.changed_operations()}:\n{run.output[-4000:]}"
    return run.seconds, run.totals["ops"] // (1 if limit != "all" else HOSTS)


def prepare() -> dict:
    """The playbook from rigup's data and the converged hosts' files; what it holds, for the table."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "files").mkdir(parents=True)
    ctx_state.set(State())
    inventory = make_inventory(str(ROOT / "inventory/lab.py"))
    data = [{k: v for k, v in inventory.get_host(h["name"]).data.dict().items() if not k.startswith("ssh_")}
            for h in lab.hosts()]
    assert all(d == data[0] for d in data[1:]), "the bench expects every lab host to have the same data"
    paths = list(playbook.managed_files(data[0]))
    metas = [playbook.fetch_files(lab.ssh, h["name"], paths, WORK / "files" / h["name"]) for h in lab.hosts()]
    assert all(m == metas[0] for m in metas[1:])
    build = lab.ssh("lab1", f"readlink {data[0]['llama_cpp_dir']}/current").stdout.strip().removeprefix("builds/")
    playbook.write(WORK, json.loads(lab.STATE_FILE.read_text()), data[0], build, metas[0])
    for h in lab.hosts():  # Ansible's apt module needs python3-apt on the host (it would install it itself)
        out = lab.ssh(h["name"], "DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-apt")
        assert out.returncode == 0, out.stdout + out.stderr
    traced = converge("inventory/lab.py", "--limit", "lab1", "-vvv").output  # every command rigup runs
    return {"files": len(paths), "build": build, "commands": len(re.findall(r"^\[lab1\] >>> ", traced, re.M))}


def main() -> None:
    rows: dict[tuple[str, int], list[float]] = {}
    counts: dict[str, str] = {}
    lab.down()
    try:
        lab.up(HOSTS, "a100")
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        first = converge("inventory/lab.py", "--limit", "lab1")
        rest = converge()
        print(f"first converge: lab1 {first.seconds:.0f} s, then all {HOSTS} {rest.seconds:.0f} s", flush=True)
        venv = ansible_venv()
        made = prepare()
        tools = variants(venv)
        version = subprocess.run([venv / "bin/ansible", "--version"], capture_output=True, text=True).stdout
        for limit, n in (("lab1", 1), ("all", HOSTS)):
            _, ops = rigup(limit)  # a warm-up round, untimed: caches, and the no-change check
            counts["rigup (pyinfra)"] = f"{ops} operations"
            for name, env in tools.items():
                _, recap = ansible(venv, env, limit)
                r = recap["lab1"]
                counts[name] = f"{r['ok'] + r['skipped']} tasks ({r['skipped']} skipped)"
            for _ in range(REPS):
                rows.setdefault(("rigup (pyinfra)", n), []).append(rigup(limit)[0])
                for name, env in tools.items():
                    rows.setdefault((name, n), []).append(ansible(venv, env, limit)[0])
    finally:
        lab.down()
    assert_nothing_left(lab)
    print(f"\n{version.splitlines()[0]}, {ANSIBLE_PINS[1]}, pyinfra {pyinfra_version()}; "
          f"median of {REPS} rounds, alternating; 0 changed in every run")
    print(f"files compared: {made['files']}; llama.cpp build {made['build']}; rigup ran "
          f"{made['commands']} shell commands on lab1 in its no-op converge\n")
    width = max(len(name) for name, _ in rows)
    print(f"| {'tool':<{width}} | per host | 1 host, s | {HOSTS} hosts, s | / rigup (1) | / rigup ({HOSTS}) |")
    print(f"|{'-' * (width + 2)}|---|---:|---:|---:|---:|")
    base = {n: statistics.median(rows[("rigup (pyinfra)", n)]) for n in (1, HOSTS)}
    for name in counts:
        med = {n: statistics.median(rows[(name, n)]) for n in (1, HOSTS)}
        print(f"| {name:<{width}} | {counts[name]} | {med[1]:.2f} | {med[HOSTS]:.2f} | "
              f"{med[1] / base[1]:.2f}x | {med[HOSTS] / base[HOSTS]:.2f}x |")
    print("\nevery run, seconds:")
    for (name, n), values in rows.items():
        print(f"  {name}, {n} host(s): " + " ".join(f"{v:.2f}" for v in values))


def pyinfra_version() -> str:
    from importlib.metadata import version

    return version("pyinfra")


if __name__ == "__main__":
    main()
