"""bench.py's pieces on the controller: what it measures on a host (each serving instance's
endpoint, with rigup/throughput.py run there, so that endpoints bound to loopback are reached
and API keys are read where they live) and the reports it writes at the end of the run.

The measuring itself is rigup/throughput.py (standard library, no pyinfra): sent to the host by
:class:`Throughput`, run there with the host's python3, one JSON line per instance back.
Reports (:func:`write_reports`), in ``bench_out/<date>/``: ``<host>.md`` and ``<host>.json`` per
host, and ``fleet.png`` (matplotlib, requirements-dev.txt): total tok/s against concurrency, one
line per host and instance, in the order of :data:`COLORS`.
"""

from __future__ import annotations

import atexit
import datetime
import json
import shlex
import time
from pathlib import Path

import click
from pyinfra.api import FactBase

from rigup.gate import endpoint
from rigup.names import LLAMA_KEY, VLLM_KEY

THROUGHPUT = Path(__file__).with_name("throughput.py")
# The plot's line colours, in the order of its series (matplotlib's tab10): a test finds each line by it.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
PLOT_SIZE_IN, PLOT_DPI = (10, 6), 100
SCRIPT_WORD = '"$t"'      # throughput.py's temporary copy on the host, in Throughput's command


def targets(data: dict) -> list[dict]:
    """The host's serving instances as bench.py reaches them on the host: name, engine, url, key
    file (or None), model (vLLM checks the served name). Read from the raw entries, with the
    roles' defaults (host 127.0.0.1 for llama-server; vLLM binds every interface: loopback then)."""
    found = []
    for var, engine, key in (("llama_server_instances", "llama-server", LLAMA_KEY), ("vllm_instances", "vllm", VLLM_KEY)):
        for name, inst in sorted((data.get(var) or {}).items()):
            if isinstance(inst, dict) and isinstance(inst.get("port"), int):
                found.append({"name": name, "engine": engine,
                              "url": endpoint(inst.get("host") or "127.0.0.1", inst["port"]),
                              "key": key.format(name) if inst.get("api_key") else None,
                              "model": (inst.get("served_model_name") or name) if engine == "vllm" else None})
    return found


def sweep_command(target: dict, levels: list[int], max_tokens: int, rounds: int, script: str) -> str:
    """The shell command that measures ``target`` with throughput.py at ``script`` (a shell word,
    e.g. ``"$t"``); every other argument is quoted."""
    argv = ["sweep", target["url"], "--levels", ",".join(map(str, levels)), "--max-tokens", str(max_tokens),
            "--rounds", str(rounds)]
    argv += ["--key-file", target["key"]] if target["key"] else []
    argv += ["--model", target["model"]] if target["model"] else []
    return f"python3 {script} " + " ".join(shlex.quote(a) for a in argv)


class Throughput(FactBase):
    """``{instance: sweep}`` of the host's ``targets`` (rigup/throughput.py's JSON: levels, or error)."""

    def command(self, targets: list[dict], levels: list[int], max_tokens: int, rounds: int) -> str:
        runs = "; ".join(f"echo {shlex.quote('##rigup-bench ' + t['name'])}; "
                         f"{sweep_command(t, levels, max_tokens, rounds, SCRIPT_WORD)}" for t in targets)
        return (f"t=$(mktemp) && cat > \"$t\" <<'RIGUP_BENCH_EOF'\n{THROUGHPUT.read_text()}\nRIGUP_BENCH_EOF\n"
                f"{runs or 'true'}; rm -f \"$t\"")

    def process(self, output: list[str]) -> dict[str, dict]:
        found, name = {}, None
        for line in output:
            if line.startswith("##rigup-bench "):
                name = line[len("##rigup-bench "):]
            elif name and line.startswith("{"):
                found[name] = json.loads(line)
        return found


def markdown(host: str, result: dict) -> str:
    """``<host>.md``: per instance, the table of the seeds' benchmarks."""
    lines = [f"# {host}: throughput", "", f"{result['date']}, {result['max_tokens']} tokens a request, "
             f"{result['rounds']} requests per client and level.", ""]
    for name, inst in sorted(result["instances"].items()):
        lines += [f"## {name} ({inst['engine']}, {inst['url']})", ""]
        if inst.get("error"):
            lines += [f"Not measured: {inst['error']}", ""]
            continue
        lines += ["| concurrency | requests | failed | total tok/s | per-request tok/s |", "| ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {lv['concurrency']} | {lv['requests']} | {lv['failed']} | {lv['total_tps']:.1f} | "
                  f"{lv['per_request_tps']:.1f} |" for lv in inst["levels"]]
        lines.append("")
    return "\n".join(lines)


def series(results: dict[str, dict]) -> list[tuple[str, list[int], list[float]]]:
    """The plot's lines: (``host/instance``, concurrency levels, total tok/s), by host then instance."""
    return [(f"{host}/{name}", [lv["concurrency"] for lv in inst["levels"]], [lv["total_tps"] for lv in inst["levels"]])
            for host, result in sorted(results.items()) for name, inst in sorted(result["instances"].items())
            if inst.get("levels")]


def plot(results: dict[str, dict], path: Path) -> None:
    """``fleet.png``: total tok/s against concurrency, one line per host and instance."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=PLOT_SIZE_IN, dpi=PLOT_DPI)
    for (label, levels, tps), color in zip(series(results), COLORS * 10):
        ax.plot(levels, tps, marker="o", linewidth=2.5, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({n for _, levels, _ in series(results) for n in levels}))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("total tokens/s (generation)")
    ax.set_title("rigup bench: throughput per host and instance")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    pyplot.close(fig)


def write_reports(results: dict[str, dict], out: Path) -> list[Path]:
    """Each host's Markdown and JSON, and the fleet's PNG (left out, saying so, without matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for host, result in sorted(results.items()):
        for suffix, text in ((".json", json.dumps(result, indent=1, sort_keys=True) + "\n"), (".md", markdown(host, result))):
            (out / f"{host}{suffix}").write_text(text)
            written.append(out / f"{host}{suffix}")
    try:
        plot(results, out / "fleet.png")
        written.append(out / "fleet.png")
    except ImportError:
        click.echo("--> bench: no fleet.png: matplotlib is missing (pip install -r requirements-dev.txt)", err=True)
    return written


_results: dict[str, dict] = {}
_run: dict = {}


def record(host: str, data: dict, measured: dict, targets_: list[dict], seconds: float) -> None:
    """Keep ``host``'s results for the reports written at exit, and print its progress line."""
    if not _run:
        atexit.register(report)
        _run["out"] = Path(data["bench_out"]) / datetime.date.today().isoformat()
    instances = {t["name"]: {"engine": t["engine"], "url": t["url"], **measured.get(t["name"], {"error": "no answer"})}
                 for t in targets_}
    _results[host] = {"host": host, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "max_tokens": data["bench_max_tokens"],
                      "rounds": data["bench_rounds"], "instances": instances}
    best = {n: max((lv["total_tps"] for lv in i.get("levels", [])), default=0) for n, i in instances.items()}
    click.echo(f"    [{host}] bench: {len(instances)} instance(s) in {seconds:.1f} s; best total tok/s: "
               + (", ".join(f"{n} {v:.1f}" for n, v in sorted(best.items())) or "none"), err=True)


def report() -> None:
    if _results:
        for path in write_reports(_results, _run["out"]):
            click.echo(f"--> bench: wrote {path}", err=True)
