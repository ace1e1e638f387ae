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
bench stops; before any run, the converged hosts' files must have the owner, group and mode the
playbook sets. ansible-core and mitogen (ANSIBLE_PINS) are installed from PyPI into their own
virtualenv, VENV, outside the repository. The lab is torn down at the end, whatever happens.
Prints and writes tests/bench/results/<date>-ansible-mitogen.{md,json}: the medians, each tool's
ratio to rigup, the goal (GOAL x against GOAL_TOOL, issue 29), and the controller's and the lab
hosts' CPU seconds of each run (where the time goes).

    RIGUP_LAB_ID=6 .venv/bin/python -m tests.bench_ansible     # BENCH_REPS=5 by default
    BENCH_GOAL_ONLY=1 ...                                        # rigup and the goal's tool only

Needs root (the lab).
"""

import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.ansible import playbook
from tests.conftest import assert_nothing_left
from tests.bench_fleet import as_a_users_shell, commit_id, hosts_cpu_s, idle_hosts_cpu, save
from tests.converge import ROOT, converge
from tests.lab import hub, lab, models, sources

# Mitogen's docs (docs/ansible_detailed.rst) list Ansible up to 12 (ansible-core 2.19) on Python
# 3.11; ansible-core 2.20 and later need Python >= 3.12, which this machine does not have.
ANSIBLE_PINS = ["ansible-core==2.19.14", "mitogen==0.3.54"]
VENV = Path("/var/lib/rigup-bench/ansible-venv")
WORK = Path(f"/var/lib/rigup-bench/work{lab.LAB_ID}")
REPS = int(os.environ.get("BENCH_REPS", "5"))
# BENCH_GOAL_ONLY=1: only the goal's tool (Ansible + Mitogen, gather_facts off) against rigup (the
# plain-Ansible variants take minutes a run)
GOAL_ONLY = os.environ.get("BENCH_GOAL_ONLY") == "1"
HOSTS = 4
RIGUP, GOAL_TOOL, GOAL = "rigup (pyinfra)", "Ansible + Mitogen, gather_facts off", 5.0   # issue 29: >= 5x
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
    every = {"Ansible + Mitogen, gather_facts off": {**mitogen, **off},
             "Ansible + Mitogen, gather_facts on": {**mitogen, **on},
             "Ansible plain (pipelining), gather_facts off": {**plain, **off},
             "Ansible plain (pipelining), gather_facts on": {**plain, **on}}
    return {GOAL_TOOL: every[GOAL_TOOL]} if GOAL_ONLY else every


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children so far (each timed run is one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP: ``{host: {ok, changed, unreachable, failed, skipped}}``."""
    return {h: dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, n)))
            for h, *n in RECAP.findall(stdout)}


def ansible(venv: Path, env: dict, limit: str) -> tuple[dict, dict]:
    """One ``ansible-playbook`` run: its sample (wall and controller CPU seconds, the lab hosts'
    CPU seconds) and the recap, with a fresh SSH control socket directory (closed after) so no run
    reuses another's."""
    with tempfile.TemporaryDirectory(dir=WORK) as sockets:
        cpu, hosts, start = children_cpu(), hosts_cpu_s(), time.monotonic()
        run = subprocess.run([venv / "bin/ansible-playbook", "-i", WORK / "inventory.yml", WORK / "site.yml",
                              "--limit", limit], cwd=WORK, capture_output=True, text=True,
                             env={**os.environ, **env, "ANSIBLE_SSH_CONTROL_PATH_DIR": sockets})
        sample = {"wall": time.monotonic() - start, "cpu": children_cpu() - cpu, "hosts_cpu": hosts_cpu_s() - hosts}
        for socket in Path(sockets).iterdir():
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={socket}", "x"], capture_output=True)
    found = recap(run.stdout)
    bad = {h: r for h, r in found.items() if r["changed"] or r["failed"] or r["unreachable"]}
    assert run.returncode == 0 and found and not bad, f"ansible-playbook changed or failed:\n{run.stdout[-6000:]}"
    return sample, found


def rigup(limit: str) -> tuple[dict, int]:
    """One no-op converge: its sample (as :func:`ansible`'s) and the operations checked per host
    (rigup/probe.py: a converged role registers none, so pyinfra's table counts 0)."""
    cpu, hosts = children_cpu(), hosts_cpu_s()
    run = converge("inventory/lab.py", *(["--limit", limit] if limit != "all" else []))
    assert run.totals["changed"] == 0, f"rigup changed {run.changed_operations()}:\n{run.output[-4000:]}"
    sample = {"wall": run.seconds, "cpu": children_cpu() - cpu, "hosts_cpu": hosts_cpu_s() - hosts}
    checked = [int(n) for n in re.findall(r"\] every role converged \(\d+ roles, \d+ steps, (\d+) operations checked", run.output)]
    return sample, max(checked) if checked else run.totals["ops"] // (1 if limit != "all" else HOSTS)


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
    paths = [*playbook.managed_files(data[0]), *playbook.directories(data[0])]
    for h in lab.hosts():
        meta = playbook.fetch_files(lab.ssh, h["name"], paths, WORK / "files" / h["name"])
        playbook.check_files(h["name"], data[0], meta)
    build = lab.ssh("lab1", f"readlink {data[0]['llama_cpp_dir']}/current").stdout.strip().removeprefix("builds/")
    playbook.write(WORK, json.loads(lab.STATE_FILE.read_text()), data[0], build)
    for h in lab.hosts():  # Ansible's apt module needs python3-apt on the host (it would install it itself)
        out = lab.ssh(h["name"], "DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-apt")
        assert out.returncode == 0, out.stdout + out.stderr
    traced = converge("inventory/lab.py", "--limit", "lab1", "-vvv").output  # every command rigup runs
    return {"files": len(playbook.managed_files(data[0])), "build": build,
            "commands": len(re.findall(r"^\[lab1\] >>> ", traced, re.M))}


def summary(samples: dict[str, dict[int, list[dict]]]) -> dict[str, dict[int, dict]]:
    """Per tool and fleet size: every wall time, the medians of wall, controller CPU and lab hosts'
    CPU seconds, and the wall's ratio to rigup's (RIGUP: the first tool)."""
    out = {}
    for tool, sizes in samples.items():
        out[tool] = {}
        for n, runs in sizes.items():
            med = {k: round(statistics.median(r[k] for r in runs), 2) for k in ("wall", "cpu", "hosts_cpu")}
            base = statistics.median(r["wall"] for r in samples[RIGUP][n])
            out[tool][n] = {"wall_s": [round(r["wall"], 2) for r in runs], "median_s": med["wall"],
                            "cpu_s_median": med["cpu"], "hosts_cpu_s_median": med["hosts_cpu"],
                            "x_rigup": round(statistics.median(r["wall"] for r in runs) / base, 2)}
    return out


def markdown(result: dict) -> str:
    """The results as a Markdown page."""
    sizes = sorted({n for tool in result["tools"].values() for n in tool["sizes"]})
    goal = result["tools"][GOAL_TOOL]["sizes"]
    head = "| tool | per host | " + " | ".join(f"{n} host{'s' * (n > 1)}, s" for n in sizes) + " | " + \
        " | ".join(f"/ rigup ({n})" for n in sizes) + " | controller CPU s (" + ", ".join(map(str, sizes)) + ") |"
    lines = [f"# A no-op converge: rigup vs Ansible with Mitogen, same work ({result['date']})", "",
             f"`{result['command']}` at {result['commit']} (tests/bench_ansible.py): {result['versions']}; "
             f"median of {result['reps']} rounds, alternating; 0 changed in every run. The playbook "
             f"(tests/bench/ansible/playbook.py) copies {result['files']} files; llama.cpp build {result['build']}; "
             f"rigup ran {result['commands']} shell commands on lab1 in its no-op converge. Machine: "
             f"{result['cpus']} cores shared with the lab hosts (and with other work), load average "
             f"{result['load_before']} before and {result['load_after']} after; {result.get('bytecode', '')}.", "",
             f"Goal: rigup's no-op converge at least {GOAL:g}x faster than {GOAL_TOOL}: " + ", ".join(
                 f"{n} host{'s' * (n > 1)} {goal[n]['x_rigup']:.2f}x "
                 f"({'met' if goal[n]['x_rigup'] >= GOAL else 'NOT met'})"
                 for n in sizes) + ".", "", head, "|---|---|" + "---:|" * (2 * len(sizes) + 1)]
    for tool, row in result["tools"].items():
        lines.append(f"| {tool} | {row['per_host']} | "
                     + " | ".join(f"{row['sizes'][n]['median_s']:.2f}" for n in sizes)
                     + " | " + " | ".join(f"{row['sizes'][n]['x_rigup']:.2f}x" for n in sizes) + " | "
                     + ", ".join(f"{row['sizes'][n]['cpu_s_median']:.2f}" for n in sizes) + " |")
    lines += ["", "Controller CPU: the run's own process and its children (ansible-playbook's forks and SSH; "
              "an SSH master that ControlPersist leaves running is not counted). The lab hosts' CPU seconds "
              f"per run (medians; with their own idle use, {result['idle_hosts_cpu_s_per_s']} CPU s per second "
              "with no play running: timers, idle servers): " + "; ".join(
                  f"{tool} " + ", ".join(f"{row['sizes'][n]['hosts_cpu_s_median']:.2f}" for n in sizes)
                  for tool, row in result["tools"].items()) + ".", "",
              "Every run, seconds, in the order they ran:", "", "```"]
    lines += [f"{tool}, {n} host(s): " + " ".join(f"{v:.2f}" for v in row["sizes"][n]["wall_s"])
              for n in sizes for tool, row in result["tools"].items()]
    return "\n".join(lines + ["```", "", "First converges: " + json.dumps(result["first"]), ""])


def main() -> None:
    samples: dict[str, dict[int, list[dict]]] = {}
    counts: dict[str, str] = {}
    bytecode = as_a_users_shell()
    load_before = [round(x, 2) for x in os.getloadavg()]
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
        idle = idle_hosts_cpu()
        tools = variants(venv)
        version = subprocess.run([venv / "bin/ansible", "--version"], capture_output=True, text=True).stdout
        for limit, n in (("lab1", 1), ("all", HOSTS)):
            _, ops = rigup(limit)  # a warm-up round, untimed: caches, and the no-change check
            counts[RIGUP] = f"{ops} operations checked"
            for name, env in tools.items():
                _, found = ansible(venv, env, limit)
                r = found["lab1"]
                counts[name] = f"{r['ok'] + r['skipped']} tasks ({r['skipped']} skipped)"
            for i in range(REPS):
                samples.setdefault(RIGUP, {}).setdefault(n, []).append(rigup(limit)[0])
                for name, env in tools.items():
                    samples.setdefault(name, {}).setdefault(n, []).append(ansible(venv, env, limit)[0])
                print(f"round {i + 1}, {n} host(s): " + "; ".join(
                    f"{name} {s[n][-1]['wall']:.2f} s" for name, s in samples.items()), flush=True)
    finally:
        lab.down()
    assert_nothing_left(lab)
    stats = summary(samples)
    result = {"date": datetime.date.today().isoformat(), "commit": commit_id(),
              "command": f"BENCH_REPS={REPS}{' BENCH_GOAL_ONLY=1' if GOAL_ONLY else ''} make bench-ansible", "reps": REPS, "cpus": os.cpu_count(),
              "versions": f"{version.splitlines()[0]}, {ANSIBLE_PINS[1]}, pyinfra {pyinfra_version()}, "
                          f"Python {platform.python_version()}",
              "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
              "first": {"lab1_s": round(first.seconds, 1), f"all_{HOSTS}_s": round(rest.seconds, 1)}, **made,
              "idle_hosts_cpu_s_per_s": idle, "bytecode": bytecode,
              "tools": {tool: {"per_host": counts[tool], "sizes": stats[tool]} for tool in samples}}
    stem = save(result, markdown(result), "ansible-mitogen")
    print("\n" + markdown(result) + f"\nwritten: {stem}.md, {stem}.json")


def pyinfra_version() -> str:
    from importlib.metadata import version

    return version("pyinfra")


if __name__ == "__main__":
    main()
