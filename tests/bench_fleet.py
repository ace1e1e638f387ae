"""`make bench-fleet`: a no-op converge of the whole stack and ``status.py`` on 1, 8 and 32 lab hosts.

Boots lab1 and converges it (the llama.cpp CPU build, Gemma 270M), then boots the other hosts with
their overlay's upper layer seeded from lab1's by hard links (packages, the build, the model: one
build and one download for the fleet; each host keeps its own identity files), converges them once
(the build and the fetch must find their work done), then times, for each size, in alternating
rounds: ``pyinfra -y inventory/lab.py deploy.py --limit ...`` (nothing may change) and
``pyinfra -y inventory/lab.py status.py --limit ...``. Prints and writes (Markdown + JSON, under
tests/bench/results/) the median wall seconds, their ratio to 1 host, the controller's CPU seconds
and the peak RSS of the pyinfra process, and the machine's load. Needs root; tears the lab down.

    .venv/bin/python -m tests.bench_fleet [--sizes 1,8,32] [--rounds 3] [--keep]
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import stat
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.converge import PYINFRA, ROOT, Run
from tests.lab import hub, lab, models, sources

RESULTS = ROOT / "tests" / "bench" / "results"
# Paths of the converged host's upper layer that stay its own: the machine id (systemd makes one
# at first boot), runtime and log state. What create_host and publish write (hostname, SSH keys,
# /etc/hosts...) replaces the seeded link by a file of the new host's own (lab.write renames).
NOT_SEEDED = ("etc/machine-id", "var/lib/dbus/machine-id", "var/log", "var/lib/systemd/random-seed",
              "run", "tmp", "var/tmp")
LINKED_BYTES = 1 << 20
# Operations a seeded host's first converge must find done (packages, the build, the download).
SEEDED_WORK = ("Install base packages", "Install build tools", "Build llama.cpp", "Fetch model")
GOALS = {8: 1.3, 32: 2.0}  # wall time of a no-op converge against 1 host (issue 16)
# The controller's CPU seconds per added host (issue 29): a no-op converge, status.py
SLOPE_GOALS = {"converge": 0.05, "status": 0.02}
PROJECTED = (100, 1000)


@dataclass
class Sample:
    """One timed pyinfra run: wall and controller CPU seconds, peak RSS (MiB), the lab hosts' CPU
    seconds meanwhile (they share the controller's cores), its output."""

    wall: float
    cpu: float
    rss_mib: float
    hosts_cpu: float
    run: Run


def hosts_cpu_s() -> float:
    """CPU seconds used so far by every lab host (their parent cgroup v2's cpu.stat)."""
    for group in lab.cgroups():
        stat = group / "cpu.stat"
        if stat.exists():
            return int(stat.read_text().split()[1]) / 1e6
    return 0.0


def timed(*args: str, env: dict | None = None, cwd: Path = ROOT, shards: int = 0) -> Sample:
    """Run ``pyinfra -y ARGS`` from the project root (or ``cwd``, another tree's), or with
    ``shards`` ``shards.py -j SHARDS ARGS``; its own rusage (and its waited children's: the
    shards' pyinfra processes) comes from wait4."""
    command = [str(Path(PYINFRA).with_name("python")), "shards.py", "-j", str(shards)] if shards else [PYINFRA, "-y"]
    with tempfile.TemporaryFile() as out:
        hosts_before, start = hosts_cpu_s(), time.monotonic()
        proc = subprocess.Popen([*command, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
        wall, hosts_cpu = time.monotonic() - start, hosts_cpu_s() - hosts_before
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        run = Run(proc.returncode, out.read().decode(errors="replace"), wall)
    assert run.returncode == 0, f"pyinfra {' '.join(args)} failed:\n{run.output[-6000:]}"
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, hosts_cpu, run)


def limit(names: list[str]) -> list[str]:
    """pyinfra's ``--limit`` arguments for host names."""
    return [arg for name in names for arg in ("--limit", name)]


def seed_from(source: str):
    """A create_host seed: host ``source``'s upper layer but NOT_SEEDED, its files of LINKED_BYTES
    or more hard-linked (the build, the model, packages' binaries: one copy in the page cache for
    the fleet), the smaller ones copied: pyinfra's put and rigup's edits write files in place, and
    a host's own settings written through a shared link would land on every host."""
    upper = lab.HOSTS / source / "upper"

    def seed(dest: Path) -> None:
        """Hard-link every top-level entry, drop the ones that stay the new host's own, unshare the small files."""
        lab.run("cp", "-al", *(str(p) for p in upper.iterdir()), str(dest))
        for rel in NOT_SEEDED:
            lab.run("rm", "-rf", str(dest / rel))
        for path in dest.rglob("*"):
            info = path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and info.st_size < LINKED_BYTES:
                tmp = path.with_name(f".{path.name}.seed")
                shutil.copy2(path, tmp)
                os.chown(tmp, info.st_uid, info.st_gid)
                os.replace(tmp, path)
    return seed


def names(n: int) -> list[str]:
    """lab1..labN."""
    return [f"lab{i}" for i in range(1, n + 1)]


def first_converges(biggest: int) -> dict:
    """Converge lab1, boot the other hosts seeded from it and converge them once; the figures."""
    lab.up(1, "a100")
    sources.llama_cpp_mirror()
    sources.serve()
    hub.serve()
    models.publish_gemma()
    one = timed("inventory/lab.py", "deploy.py", "--limit", "lab1")
    print(f"first converge of lab1: {one.wall:.0f} s", flush=True)
    if biggest == 1:
        return {"first_converge_lab1_s": round(one.wall, 1)}
    start = time.monotonic()
    lab.up(biggest - 1, "a100", first=2, seed=seed_from("lab1"))
    booted = time.monotonic() - start
    print(f"lab2..lab{biggest} up in {booted:.0f} s (those not running yet seeded from lab1 and booted)", flush=True)
    rest = timed("inventory/lab.py", "deploy.py", *limit(names(biggest)[1:]))
    changed = rest.run.changed_operations()
    print(f"first converge of lab2..lab{biggest}: {rest.wall:.0f} s; operations that changed: {changed}", flush=True)
    redone = [op for op in changed if any(w in op for w in SEEDED_WORK)]
    assert not redone, f"the seeded hosts did again what lab1 did: {redone}"
    return {"first_converge_lab1_s": round(one.wall, 1), "seed_and_boot_s": round(booted, 1),
            "first_converge_others_s": round(rest.wall, 1), "changed_by_first_converge_of_others": changed}


@contextlib.contextmanager
def tree_at(ref: str | None):
    """A checkout of commit ``ref`` (a git worktree sharing this tree's .venv), removed after; None
    without a ref."""
    if not ref:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="rigup-bench-")) / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path), ref], cwd=ROOT, check=True)
    try:
        (path / ".venv").symlink_to(ROOT / ".venv")
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def measure(sizes: list[int], rounds: int, against: str | None = None, shards: int = 0) -> dict:
    """Alternating rounds over the sizes: a no-op converge and status.py each (and a no-op
    converge by the tree at commit ``against``; both plays again through shards.py with
    ``shards`` processes); every sample."""
    with tree_at(against) as other:
        plays = {"converge": ("deploy.py", ROOT, 0),
                 **({f"converge at {against}": ("deploy.py", other, 0)} if other else {}),
                 "status": ("status.py", ROOT, 0),
                 **({f"converge, {shards} shards": ("deploy.py", ROOT, shards),
                     f"status, {shards} shards": ("status.py", ROOT, shards)} if shards else {})}
        samples = {size: {play: [] for play in plays} for size in sizes}
        for r in range(rounds):
            for size in sizes:
                for play, (file, cwd, n) in plays.items():
                    sample = timed("inventory/lab.py", file, *limit(names(size)), cwd=cwd, shards=n)
                    if file == "deploy.py" and not n:
                        assert sample.run.totals["changed"] == 0, (size, play, sample.run.changed_operations())
                    if file == "deploy.py" and n:   # shards.py: every host's line says unchanged
                        assert sample.run.output.count("] unchanged") == size, sample.run.output[-3000:]
                    samples[size][play].append(sample)
                print(f"round {r + 1}, {size:2} hosts: " + "; ".join(
                    f"{play} {s[-1].wall:.2f} s (controller {s[-1].cpu:.2f} CPU s, {s[-1].rss_mib:.0f} MiB; "
                    f"hosts {s[-1].hosts_cpu:.2f} CPU s)" for play, s in samples[size].items()), flush=True)
    return samples


def summary(samples: dict) -> dict:
    """Per size and play: every wall time, the medians, the ratio to the smallest size."""
    base = min(samples)
    out = {}
    for size, plays in samples.items():
        out[size] = {}
        for play, runs in plays.items():
            median = statistics.median(s.wall for s in runs)
            out[size][play] = {
                "wall_s": [round(s.wall, 2) for s in runs], "median_s": round(median, 2),
                "ratio": round(median / statistics.median(s.wall for s in samples[base][play]), 2),
                "cpu_s_median": round(statistics.median(s.cpu for s in runs), 2),
                "hosts_cpu_s_median": round(statistics.median(s.hosts_cpu for s in runs), 2),
                "peak_rss_mib": round(max(s.rss_mib for s in runs)),
            }
    return out


def idle_hosts_cpu(seconds: float = 10) -> float:
    """CPU seconds per second the lab hosts use while no play runs (their timers, idle servers)."""
    before = hosts_cpu_s()
    time.sleep(seconds)
    return round((hosts_cpu_s() - before) / seconds, 2)


def memory_mib() -> dict:
    """The machine's total and available memory (MiB), from /proc/meminfo."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {k: int(info[k].split()[0]) // 1024 for k in ("MemTotal", "MemAvailable")}


def markdown(result: dict) -> str:
    """The results as a Markdown page."""
    lines = [f"# A no-op converge and status.py on 1, 8 and 32 lab hosts ({result['date']})", "",
             f"`{result['command']}` at {result['commit']}: {result['what_ran']}", "",
             f"Machine: {result['cpus']} cores, load average {result['load_before']} before and "
             f"{result['load_after']} after; memory available with all hosts up: "
             f"{result['memory_mib']['MemAvailable']} of {result['memory_mib']['MemTotal']} MiB. The lab "
             f"hosts share these cores: with no play running they used {result['idle_hosts_cpu_s_per_s']} "
             "CPU s per second (their timers, idle servers); the hosts' CPU column includes that. "
             f"{result.get('bytecode', '')}.", "",
             "| hosts | play | wall, s (rounds) | median | x 1 host | controller CPU s | peak RSS, MiB "
             "| lab hosts' CPU s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size, plays in result["sizes"].items():
        for play, row in plays.items():
            lines.append(f"| {size} | {play} | {' '.join(f'{v:.2f}' for v in row['wall_s'])} | "
                         f"{row['median_s']:.2f} | {row['ratio']:.2f}x | {row['cpu_s_median']:.2f} | "
                         f"{row['peak_rss_mib']} | {row['hosts_cpu_s_median']:.2f} |")
    lines += ["", "Goals (no-op converge): " + ", ".join(
        f"{n} hosts <= {g}x: {result['sizes'][n]['converge']['ratio']:.2f}x "
        f"({'met' if result['sizes'][n]['converge']['ratio'] <= g else 'NOT met'})"
        for n, g in GOALS.items() if n in result["sizes"]), "",
        *([f"No-op converge of this tree against {result['against']['ref']} (median wall, same hosts, "
           "alternating): " + ", ".join(f"{n} hosts {r:.2f}x" for n, r in result["against"]["ratios"].items()), ""]
          if "against" in result else []),
        *slope_lines(result), *bounds_lines(result), "First converges: " + json.dumps(result["first"]), ""]
    return "\n".join(lines)


def slopes(result: dict) -> dict:
    """Per play: the controller's CPU seconds per added host (the least-squares slope of the median
    CPU seconds over the sizes), its intercept, and from them a projection for :data:`PROJECTED`
    hosts (a projection: the lab measures at most the largest size)."""
    sizes = sorted(result["sizes"])
    out = {}
    for play in result["sizes"][sizes[0]]:
        ys = [result["sizes"][n][play]["cpu_s_median"] for n in sizes]
        mean_x, mean_y = statistics.mean(sizes), statistics.mean(ys)
        var = sum((x - mean_x) ** 2 for x in sizes)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, ys)) / var if var else 0.0
        base = mean_y - slope * mean_x
        out[play] = {"cpu_s_per_host": round(slope, 4), "cpu_s_at_0": round(base, 2),
                     "projected_cpu_s": {n: round(base + slope * n, 1) for n in PROJECTED}}
    return out


def slope_lines(result: dict) -> list[str]:
    """:func:`slopes` and the issue's goals, as a paragraph."""
    sl, sizes = result["slopes"], result["sizes"]
    lines = ["The controller's CPU per added host (least-squares slope over "
             f"{', '.join(map(str, sorted(sizes)))} hosts) and, from it, a PROJECTION (not measured) for "
             f"{' and '.join(map(str, PROJECTED))} hosts: " + "; ".join(
                 f"{play} {v['cpu_s_per_host']:.3f} s/host ({', '.join(f'{n} hosts ~{c:.0f} s' for n, c in v['projected_cpu_s'].items())})"
                 for play, v in sl.items()), ""]
    goals = [f"{play} <= {g} s/host: {sl[play]['cpu_s_per_host']:.3f} ({'met' if sl[play]['cpu_s_per_host'] <= g else 'NOT met'})"
             for play, g in SLOPE_GOALS.items() if play in sl]
    big, small = max(sizes), min(sizes)
    if big != small:
        cpu, wall = sizes[big]["converge"]["cpu_s_median"], sizes[small]["converge"]["median_s"]
        goals.append(f"{big} hosts' controller CPU <= 2x {small} host's wall: {cpu:.2f} s vs 2 x {wall:.2f} s "
                     f"({'met' if cpu <= 2 * wall else 'NOT met'})")
    return lines + ["Goals (issue 29): " + "; ".join(goals), ""]


def bounds(result: dict) -> dict:
    """Per size, two floors under the no-op converge's wall, each as a ratio to 1 host's wall:
    ``shared_cores``, the controller's and the lab hosts' CPU seconds spread over the machine's
    cores (in the lab every host's work runs on those cores), and ``controller``, the controller's
    CPU seconds alone (pyinfra runs on one core; on a fleet whose hosts have CPUs of their own
    this floor is the one that remains)."""
    base = result["sizes"][min(result["sizes"])]["converge"]["median_s"]
    out = {}
    for size, plays in result["sizes"].items():
        row = plays["converge"]
        out[size] = {"shared_cores": round((row["cpu_s_median"] + row["hosts_cpu_s_median"]) / result["cpus"] / base, 2),
                     "controller": round(row["cpu_s_median"] / base, 2)}
    return out


def bounds_lines(result: dict) -> list[str]:
    """The floors of :func:`bounds`, as a paragraph."""
    return ["Floors under the no-op converge's wall, as ratios to 1 host's wall: (controller CPU + lab hosts' CPU) / "
            f"{result['cpus']} cores, then the controller's CPU alone (one core; what remains when the "
            "hosts have CPUs of their own): " + ", ".join(
                f"{n} hosts {b['shared_cores']:.2f}x / {b['controller']:.2f}x" for n, b in result["bounds"].items()), ""]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_fleet")
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="fleet", help="results file name after the date")
    parser.add_argument("--keep", action="store_true", help="leave the lab running (default: down)")
    parser.add_argument("--against", help="also time the no-op converge of this commit's tree, alternating")
    parser.add_argument("--shards", type=int, default=0, help="also time both plays through shards.py -j N")
    args = parser.parse_args(argv)
    try:
        args.size_list = sorted(int(s) for s in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: host counts separated by commas, e.g. 1,8,32")
    if args.rounds < 1 or min(args.size_list) < 1:
        parser.error("--rounds and every size must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        write(args, args.size_list)
    finally:
        if not args.keep:
            lab.down()


def as_a_users_shell() -> str:
    """Run the tools as a user's shell does: this machine's environment sets
    PYTHONDONTWRITEBYTECODE=1, which a user's does not, and which makes every run compile rigup's
    modules again (and Ansible's own). Returns what the results say of it."""
    was = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return ("Python's bytecode cached, as in a user's shell (PYTHONDONTWRITEBYTECODE, set on this machine, "
            "unset for the runs)" if was else "Python's bytecode cached (PYTHONDONTWRITEBYTECODE unset)")


def commit_id() -> str:
    """This tree's commit, ``+changes`` when it has uncommitted ones: what a result was measured at."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return commit + ("+changes" if dirty.strip() else "")


def save(result: dict, markdown_text: str, name: str, results: Path = RESULTS) -> Path:
    """``results/<date>-<name>.json`` and ``.md``; their common stem."""
    results.mkdir(parents=True, exist_ok=True)
    stem = results / f"{result['date']}-{name}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown_text)
    return stem


def write(args, sizes: list[int]) -> None:
    """Measure (the lab left up), then write and print the results."""
    bytecode = as_a_users_shell()
    load_before = [round(x, 2) for x in os.getloadavg()]
    first = first_converges(max(sizes))
    memory = memory_mib()
    idle = idle_hosts_cpu()
    samples = measure(sizes, args.rounds, args.against, args.shards)
    load_after = [round(x, 2) for x in os.getloadavg()]
    result = {
        "date": datetime.date.today().isoformat(), "commit": commit_id(),
        "command": f"python -m tests.bench_fleet --sizes {args.sizes} --rounds {args.rounds}"
                   + (f" --against {args.against}" if args.against else "") + (f" --shards {args.shards}" if args.shards else ""),
        "what_ran": "deploy.py with group_vars/lab.yml (every role of the play; llama.cpp built for "
                    "the CPU, Gemma 3 270M served by llama-server on every host), a100 lab hosts; "
                    f"{args.rounds} alternating rounds, every no-op converge changed nothing",
        "cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after,
        "memory_mib": memory, "idle_hosts_cpu_s_per_s": idle, "bytecode": bytecode, "first": first, "python": platform.python_version(),
        "sizes": summary(samples),
    }
    result["bounds"] = bounds(result)
    result["slopes"] = slopes(result)
    if args.against:
        result["against"] = {"ref": args.against, "ratios": {
            size: round(plays["converge"]["median_s"] / plays[f"converge at {args.against}"]["median_s"], 2)
            for size, plays in result["sizes"].items()}}
    text = markdown(result)
    stem = save(result, text, args.name)
    print(text)
    print(f"written: {stem}.md, {stem}.json", flush=True)


if __name__ == "__main__":
    main()
