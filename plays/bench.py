"""bench.py's pieces on the controller: what it measures on a host (each serving instance's
endpoint, with shipped/throughput.py run there, so that endpoints bound to loopback are reached
and API keys are read where they live) and the reports it writes at the end of the run.

The measuring itself is shipped/throughput.py (standard library, no pyinfra): sent to the host by
:class:`Throughput`, run there with the host's python3, one JSON line per instance back.
Reports (:func:`write_reports`), in ``bench_out/<date>/``: ``<host>.md`` and ``<host>.json`` per
host, and ``fleet.png``: total tok/s against concurrency, one line per host and instance, drawn by
the chart the play hands to :func:`record` (plays/charts.py's ``plot``, with matplotlib, which rigup/
never imports).

llama-bench (:class:`LlamaBench`) runs on the host too, one process per test, each after the other:
with ``--repack 0`` when the serving build's smoke inference met the CPU repack trap
(roles/llama_cpp/traps.yml, :data:`REPACK`; ``rigup-smoke.json``, read by :class:`Serving`). A
test that ends on a signal is named so (``llama-bench crashed (SIGSEGV) on pp512``) and the other
tests keep their rows; a prompt-processing test that crashed on one of the trap's signals while
weights were repacked runs once more, in the same command, with ``--repack 0``, and its row says
which trap it met and that the host's llama.cpp wants a proven build.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import signal
import time
from pathlib import Path

import click
from pyinfra.api import FactBase

from rigup import run as run_state, traps
from rigup.boundary import Unreadable, fields, owned, results
from rigup.boundary.numbers import number, whole
from rigup.config import LLAMA_TEST, ROLES_DIR
from rigup.contract import MAPS, llama_server
from rigup.contract.vllm import api_name
from rigup.files import program_text
from rigup.instances import every
from rigup.instances.llama_server import normalised
from rigup.gate import STOPS, endpoint, signal_name
from rigup.models import first_gguf, models
from rigup.names import marker_path
from rigup.nofollow import AS_OWNER, FUNCTIONS, read_file
from rigup.text import say, shown

THROUGHPUT = "shipped/throughput.py"   # a shared host module, sent by Throughput
SCRIPT_WORD = '"$t"'      # throughput.py's temporary copy on the host, in Throughput's command
# The trap whose remedy is --no-repack (llama-bench: --repack 0), from the llama_cpp role's catalogue.
REPACK = next(t for t in traps.load(ROLES_DIR / "llama_cpp" / "traps.yml") if t.remedy.value == "--no-repack")
NO_REPACK = ["--repack", "0"]
# A shell's exit status for each of REPACK's signals (128 + N): the ones a ppN test is retried on.
REPACK_CODES = tuple(sorted(128 + signal.Signals[name] for name in REPACK.condition["signals"]
                            if name in signal.Signals.__members__))
_ATTEMPT = re.compile(r"##llama-bench(-retry)? (\S+) (\S+)")


def targets(data: dict, units: list[str] = ()) -> list[dict]:
    """The host's serving instances as bench.py reaches them on the host: name, engine, url, key
    file (or None), model (vLLM checks the served name), via ("balancer" for an instance with
    replicas, whose host:port is HAProxy's), from both engines' instances (rigup.instances ``every``;
    the key file the contract's ``MAPS``). Each replica of the host's active ``units``
    (``rigup-llama@NAME-K.service``) is measured too, on its own, at 127.0.0.1:port+1+K
    (llama-server's ``replicas``: below its count, any for ``auto``)."""
    found = []
    for var, name, inst in every(data):
        engine = "llama-server" if var == "llama_server_instances" else "vllm"
        # vLLM checks the served name; a llama-server router (also) routes by model: its own is measured
        model = api_name(name, inst) if engine == "vllm" else (
            llama_server.api_model(name, inst) if inst["also"] else None)
        base = {"engine": engine, "key": MAPS[var].format(name) if inst["api_key"] else None, "model": model}
        replicas = inst["replicas"]
        ks = replica_numbers(name, units, REPLICAS_MAX if replicas == "auto" else replicas,
                             inst["port"]) if engine == "llama-server" else []
        found.append({"name": name, **base, "url": endpoint(inst["host"], inst["port"]), "via": "balancer" if ks else None})
        found += [{"name": f"{name}-{k}", **base, "url": f"http://127.0.0.1:{inst['port'] + 1 + k}",
                   "via": "replica"} for k in ks]
    return found


REPLICAS_MAX = 1024   # the contract's replicas form (count 1..1024), for an instance of replicas: auto


def replica_numbers(name: str, units: list[str], replicas: int = REPLICAS_MAX, port: int = 0) -> list[int]:
    """K of each active replica unit ``rigup-llama@NAME-K.service`` of instance ``name``, once each: K as
    the role names it (:func:`rigup.boundary.numbers.whole`: no leading zero), below the instance's
    ``replicas`` and its port ``port + 1 + K`` a port (round 5 E6: units gemma-1, gemma-01 and
    gemma-99999 measured replica 1 twice and asked port+100000 with the instance's key)."""
    ks = {whole(m.group(1), min(replicas - 1, 65535 - 1 - port)) for u in units
          if (m := re.fullmatch(rf"rigup-llama@{re.escape(name)}-([0-9]{{1,5}})\.service", u))}
    return sorted(ks - {None})


def sweep_command(target: dict, levels: list[int], max_tokens: int, rounds: int, script: str) -> str:
    """The shell command that measures ``target`` with throughput.py at ``script`` (a shell word,
    e.g. ``"$t"``); every other argument is quoted."""
    argv = ["sweep", target["url"], "--levels", ",".join(map(str, levels)), "--max-tokens", str(max_tokens),
            "--rounds", str(rounds)]
    argv += ["--key-file", target["key"]] if target["key"] else []
    argv += ["--model", target["model"]] if target["model"] else []
    # -I: the script is a mktemp file in /tmp, whose directory would come first on sys.path (any
    # user's json.py there imported by root); -S: no site directory's .pth (issue 61, round 7 R1)
    return f"/usr/bin/python3 -I -S {script} " + " ".join(shlex.quote(a) for a in argv)


class Throughput(FactBase):
    """``{instance: sweep}`` of the host's ``targets`` (shipped/throughput.py's JSON: levels, or error)."""

    def command(self, targets: list[dict], levels: list[int], max_tokens: int, rounds: int) -> str:
        runs = "; ".join(f"echo {shlex.quote('##rigup-bench ' + t['name'])}; "
                         f"{sweep_command(t, levels, max_tokens, rounds, SCRIPT_WORD)}" for t in targets)
        return (f"t=$(mktemp) && cat > \"$t\" <<'RIGUP_BENCH_EOF'\n{program_text(THROUGHPUT)}\nRIGUP_BENCH_EOF\n"
                f"{runs or 'true'}; rm -f \"$t\"")

    def process(self, output: list[str]) -> dict[str, dict]:
        """Each instance's line read by :func:`rigup.boundary.results.throughput`; one that does not
        read is that instance not measured, saying why (an exception here ended the run for every host)."""
        found, name = {}, None
        for line in output:
            if line.startswith("##rigup-bench "):
                name = line[len("##rigup-bench "):]
            elif name and line.startswith("{"):
                try:
                    found[name] = results.throughput(line, f"throughput.py's line for {name}")
                except Unreadable as e:
                    found[name] = {"error": f"its measurement does not read ({e.where}: {e.why})"}
        return found


class Serving(FactBase):
    """What bench.py reads on a host before it measures: {"units": the active ``rigup-llama@``
    units, "markers": {path: the model's completion marker (JSON) or None}, "llama_bench": whether
    ``binary`` (the serving build's llama-bench) is there, "smoke": what the serving build's smoke
    inference recorded at ``smoke`` (:func:`smoke_remedy`)}. A marker is read as its directory's owner
    (rigup.nofollow.read_file)."""

    def command(self, markers: list[str], binary: str, smoke: str) -> str:
        reads = "; ".join(f"echo {shlex.quote('##marker ' + m)}; {read_file(m.rsplit('/', 1)[0], m, 8 << 20)} "
                          "| tr -d '\\n'; echo" for m in markers)
        return (f"{FUNCTIONS}; systemctl list-units --state=active --plain --no-legend 'rigup-llama@*' 2>/dev/null "
                f"| sed 's/^/##unit /'; {reads or 'true'}; "
                f"printf '##smoke %s\\n' \"$(tr -d '\\n' < {shlex.quote(smoke)} 2>/dev/null)\"; "
                f"test -x {shlex.quote(binary)} && echo '##llama-bench'; true")

    def process(self, output: list[str]) -> dict:
        found, marker = {"units": [], "markers": {}, "llama_bench": False, "smoke": smoke_remedy(None)}, None
        for line in output:
            if line.startswith("##unit "):
                found["units"] += line.split()[1:2]   # a line with no unit after it: none
            elif line.startswith("##smoke"):
                found["smoke"] = smoke_remedy(line[len("##smoke"):])
            elif line.startswith("##marker "):
                marker = line[len("##marker "):]
                found["markers"][marker] = None
            elif line == "##llama-bench":
                found["llama_bench"] = True
            elif marker and line.strip():
                try:   # the rigup user's file: typed, or that model is not complete (not benched)
                    found["markers"][marker] = results.marker(line, marker)
                except Unreadable:
                    pass
        return found


def smoke_remedy(text: str | None) -> dict:
    """What a passed smoke inference of the serving build recorded (roles/llama_cpp/shipped/smoke.py's
    rigup-smoke.json, through its one reader rigup.boundary.results.smoke): ``{"traps": [id],
    "server_args": [flag]}``; no file, a half-written one, a failed smoke or a record that does not read
    (a trap id or flag of another shape among them) is none."""
    try:
        doc = results.smoke(text or "", "rigup-smoke.json")
    except Unreadable:
        doc = {"ok": False}
    return {key: doc.get(key, []) if doc["ok"] else [] for key in ("traps", "server_args")}


def repack_remedy(smoke: dict) -> bool:
    """Whether the serving build runs with :data:`REPACK`'s remedy: its smoke met the trap or
    recorded ``--no-repack``."""
    return REPACK.id in smoke.get("traps", []) or REPACK.remedy.value in smoke.get("server_args", [])


def model_markers(data: dict) -> dict[str, str]:
    """Each llama-server instance's model marker (rigup.names.marker_path of the model's dest)."""
    entries = models(data)[0]
    return {name: marker_path(entries[inst["model"]]["dest"])
            for name, inst in normalised(data).items() if inst.get("model") in entries}


def llama_runs(data: dict, seen: dict) -> list[dict]:
    """llama-bench's runs: per llama-server instance, {"name", "dest" (its model's directory),
    "model" (the GGUF it serves), "ngl"}
    (and "trap": :data:`REPACK`'s id when the serving build's smoke met it: it runs with
    ``--repack 0``) or {"name", "error"} when it cannot run (no llama-bench in the build, the model
    incomplete)."""
    remedy = {"trap": REPACK.id} if repack_remedy(seen.get("smoke") or {}) else {}
    serving = normalised(data)
    runs = []
    for name, marker in model_markers(data).items():
        files = (seen["markers"].get(marker) or {}).get("files") or []
        gguf = first_gguf(files)
        why = ("no llama-bench in the build `current` points to (llama_cpp_targets)" if not seen["llama_bench"] else
               f"no model GGUF at {marker}" if not gguf else None)
        ngl = serving[name]["ngl"]   # as it serves: its own, else the tuned, else 99
        runs.append({"name": name, "error": why} if why else
                    {"name": name, "dest": marker.rsplit('/', 1)[0], "model": f"{marker.rsplit('/', 1)[0]}/{gguf}",
                     "ngl": 99 if ngl is None else ngl, **remedy})
    return runs


def llama_results(runs: list[dict], benched: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """llama-bench's rows per instance: those measured (each row of a run with the build's remedy
    says so), and one saying why for a run that could not."""
    remedied = {r["name"] for r in runs if r.get("trap")}
    smoke = {"trap": REPACK.id, "repack": 0, "note": f"trap {REPACK.id}: {' '.join(NO_REPACK)}, met by the serving "
                                                    "build's smoke inference"}
    return {**{r["name"]: [{"test": "llama-bench", "error": r["error"]}] for r in runs if r.get("error")},
            **{name: [{**row, **smoke} if name in remedied else row for row in rows] for name, rows in benched.items()}}


def llama_bench_args(test: str) -> list[str] | None:
    """llama-bench's arguments for one test: ``pp512`` -> ``-p 512 -n 0``, ``tg128`` -> ``-p 0 -n 128``;
    None for a test not of the form (rigup.config ``llamatest``, which refuses it before the run):
    it is called inside a fact's command, where an exception ended bench.py for every host."""
    m = LLAMA_TEST.fullmatch(test) if isinstance(test, str) else None
    if not m:
        return None
    return ["-p", m.group(2), "-n", "0"] if m.group(1) == "pp" else ["-p", "0", "-n", m.group(2)]


def llama_bench_argv(binary: str, run: dict, test: str, reps: int, timeout: int, no_repack: bool) -> list[str]:
    """llama-bench of one test of ``run``, stopped after ``timeout`` s; ``no_repack``: with ``--repack 0``.
    It runs as the owner of the model's directory (rigup.nofollow ``rigup_as_owner``: the command
    defines it): the model file is opened with that user's rights, never root's."""
    return [AS_OWNER, run["dest"], "timeout", str(timeout), binary, "-m", run["model"], "-ngl", str(run["ngl"]), "-r", str(reps),
            "-o", "json", *(llama_bench_args(test) or []), *(NO_REPACK if no_repack else [])]


def _attempt(mark: str, argv: list[str], timeout: int) -> str:
    """Shell: ``mark``, llama-bench's JSON on one line, then ``##rc <exit status> <timeout>`` (status in ``$rc``)."""
    return (f"echo {shlex.quote(mark)}; out=$({shlex.join(argv)} 2>/dev/null); rc=$?; "
            "printf %s \"$out\" | tr -d '\\n'; echo; " + f"echo \"##rc $rc\" {shlex.quote(str(timeout))}")


def retries(test: str, no_repack: bool) -> bool:
    """Whether a crash of ``test`` on one of :data:`REPACK`'s signals is run again with ``--repack 0``:
    a prompt-processing test (ppN: the batched matmul the trap strikes) that repacked weights."""
    return test.startswith("pp") and not no_repack


class LlamaBench(FactBase):
    """``{instance: [row per test]}``: llama-bench's JSON per test (run one test at a time, each
    stopped after ``timeout`` s: a row then says it was skipped; one that ended on a signal says
    which). A run with ``"trap"`` (the build's remedy) runs with ``--repack 0``; in one without, a
    ppN test that crashed on a signal of :data:`REPACK` runs once more with ``--repack 0`` (a
    ``##llama-bench-retry`` attempt), which :func:`retried` turns into the test's one row."""

    def command(self, runs: list[dict], binary: str, tests: list[str], reps: int, timeout: int) -> str:
        steps = []
        for run in runs:
            for test in filter(llama_bench_args, tests):   # one not ppN/tgN is none (the form refused it)
                no_repack = bool(run.get("trap"))
                steps.append(_attempt(f"##llama-bench {run['name']} {test}",
                                      llama_bench_argv(binary, run, test, reps, timeout, no_repack), timeout))
                if retries(test, no_repack) and REPACK_CODES:
                    again = _attempt(f"##llama-bench-retry {run['name']} {test}",
                                     llama_bench_argv(binary, run, test, reps, timeout, True), timeout)
                    steps.append(f"case $rc in {'|'.join(map(str, REPACK_CODES))}) {again};; esac")
        return "; ".join([FUNCTIONS, *steps]) if steps else "true"

    def process(self, output: list[str]) -> dict[str, list[dict]]:
        found, attempts = {}, []
        for line in output:
            if m := _ATTEMPT.fullmatch(line):
                attempts.append((m.group(2), m.group(3), bool(m.group(1)), []))
            elif attempts:
                attempts[-1][3].append(line)
        for name, test, again, lines in attempts:
            rc = next((ln for ln in reversed(lines) if ln.startswith("##rc ")), "")
            row = llama_bench_row(test, " ".join(ln for ln in lines if not ln.startswith("##rc ")), rc)
            rows = found.setdefault(name, [])
            if again and rows and rows[-1]["test"] == test and rows[-1].get("signal"):
                rows[-1] = retried(rows[-1], row)
            else:
                rows.append(row)
        return found


def crash_signal(code: int | str | None) -> str | None:
    """The signal that ended llama-bench, from its exit status: 128 + N from a shell (139:
    ``SIGSEGV``) or -N (Python's subprocess); None for an exit (0, 1, timeout's 124 and 127).
    ASCII digits alone (rigup.boundary.numbers): int() read "١٣٩" as 139."""
    status = number(code, int, -255, 255)
    if status is None or (isinstance(code, str) and "." in code):
        return None
    sig = -status if status < 0 else status - 128 if 128 < status < 256 else 0
    return signal_name(sig) if sig else None


def crash_text(test: str, sig: str) -> str:
    """``llama-bench crashed (SIGSEGV) on pp512``; a stop signal (SIGKILL: the OOM killer) ``was killed``."""
    return f"llama-bench {'was killed' if sig in STOPS else 'crashed'} ({sig}) on {test}"


def llama_bench_row(test: str, text: str, rc: str) -> dict:
    """One row of the report from llama-bench's JSON (a list of one result) and its exit status."""
    code, limit = (rc.split() + ["", "", ""])[1:3]   # no '##rc' line (the output cut off): neither
    if code == "124":
        return {"test": test, "skipped": f"stopped after {limit} s (bench_llama_timeout_s)"}
    if sig := crash_signal(code):
        return {"test": test, "error": crash_text(test, sig), "signal": sig}
    try:   # typed: avg_ts true was 1 tok/s, 1e999 an infinite stddev, a '|' a cell of the report's table
        doc = results.llama_bench(text, f"llama-bench's {test}")
    except Unreadable:
        return {"test": test, "error": f"llama-bench failed (exit {shown(code, 12) or '?'})"}
    return {"test": test, **doc, "tps": round(doc["tps"], 2), "stddev": round(doc["stddev"], 2)}


def retried(first: dict, again: dict) -> dict:
    """A test's row after its crash (``first``) and its run with ``--repack 0`` (``again``): the
    second's figures, naming :data:`REPACK` as the trap it met, or both failures."""
    if "tps" not in again:
        why = again.get("error") or again.get("skipped")
        return {"test": first["test"], "error": f"{first['error']}; again with {' '.join(NO_REPACK)}: {why}",
                "signal": first["signal"]}
    return {**again, "trap": REPACK.id, "repack": 0, "crashed": first["error"],
            "note": f"trap {REPACK.id}: {' '.join(NO_REPACK)} after {first['error']} ({REPACK.ref}); the serving "
                    "build's smoke inference did not record it: rebuild and prove llama.cpp on this host "
                    "(deploy.py), so that its llama-server instances, which may crash the same way, get --no-repack"}


def llama_notes(rows: list[dict]) -> list[str]:
    """The notes of an instance's llama-bench rows (a trap met, its remedy), each once, in order."""
    return list(dict.fromkeys(row["note"] for row in rows if row.get("note")))


def cell(text: object, limit: int = 400) -> str:
    """Text a host wrote (an error, a test's name) as it goes into a report's Markdown: one line of
    printable text (:func:`rigup.text.shown`: escapes visible, cut to ``limit``), its backslashes and
    ``|`` escaped, so that it stays one cell of a table, or one line: an error holding newlines, a
    '## x' heading and a table row claiming 99999 tok/s became that heading and row in HOST.md
    (rerun 2 of issue 61, N3)."""
    return shown(text, limit).replace("\\", "\\\\").replace("|", "\\|")


def llama_markdown(rows: list[dict]) -> list[str]:
    """The llama-bench table of an instance (pp: prompt processing, tg: generation)."""
    lines = ["llama-bench (the serving build and model):", "",
             "| test | tok/s | ± | backend | threads | build |", "| --- | ---: | ---: | --- | ---: | --- |"]
    for row in rows:
        if "tps" in row:
            lines.append(f"| {cell(row['test'])} | {row['tps']:.1f} | {row['stddev']:.1f} | {row['backend']} | "
                         f"{row['threads']} | {row['build']} |")
        else:
            lines.append(f"| {cell(row['test'])} | {cell(row.get('skipped') or row.get('error'))} | | | | |")
    notes = llama_notes(rows)
    return lines + ([""] + [f"- {note}" for note in notes] if notes else []) + [""]


def markdown(host: str, result: dict) -> str:
    """``<host>.md``: per instance, the table of the seeds' benchmarks."""
    lines = [f"# {host}: throughput", "", f"{result['date']}, {result['max_tokens']} tokens a request, "
             f"{result['rounds']} requests per client and level.", ""]
    for name, inst in sorted(result["instances"].items()):
        via = {"balancer": ", through the balancer", "replica": ", one replica"}.get(inst.get("via"), "")
        lines += [f"## {name} ({inst['engine']}, {inst['url']}{via})", ""]
        if inst.get("llama_bench"):
            lines += llama_markdown(inst["llama_bench"])
        if inst.get("error"):
            lines += [f"Not measured: {cell(inst['error'])}", ""]
            continue
        lines += ["| concurrency | requests | failed | total tok/s | per-request tok/s |", "| ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {lv['concurrency']} | {lv['requests']} | {lv['failed']} | {lv['total_tps']:.1f} | "
                  f"{lv['per_request_tps']:.1f} |" for lv in inst["levels"]]
        lines.append("")
    return "\n".join(lines)


def write_reports(results: dict[str, dict], out: Path, plot=None) -> list[Path]:
    """Each host's Markdown and JSON, and the fleet's PNG drawn by ``plot`` (plays/charts.py's: left out,
    saying so, without matplotlib; None: none)."""
    written = []
    for host, result in sorted(results.items()):
        fields.host_file(host, f"bench: the inventory host {str(host)[:60]!r}")   # ../x.json: outside bench_out
        for suffix, text in ((".json", json.dumps(result, indent=1, sort_keys=True) + "\n"), (".md", markdown(host, result))):
            # bench_out may be any directory: only one no other user can write (rigup.boundary.owned)
            written.append(owned.write(out / f"{host}{suffix}", text, f"bench_out: {out}", mode=0o644))
    try:
        if plot:
            plot(results, out / "fleet.png")
            written.append(out / "fleet.png")
    except ImportError:
        click.echo("--> bench: no fleet.png: matplotlib is missing (pip install -r requirements-dev.txt)", err=True)
    return written


def record(host, data: dict, measured: dict, targets_: list[dict], seconds: float,
           llama: dict[str, list[dict]] | None = None, plot=None) -> None:
    """Keep ``host``'s results (the sweeps ``measured``, llama-bench's rows ``llama``) on its run
    (rigup/run.py) for the reports written at the run's end (``plot``: the play's chart of them,
    plays/charts.py's), and print its progress line. ``host``: pyinfra's."""
    run = run_state.host_run(host)
    if not run.bench:
        run.at_end(report, run)
        run.bench.update(out=Path(data["bench_out"]) / datetime.date.today().isoformat(), plot=plot)
    host, llama = host.name, llama or {}

    def reading(name: str) -> dict:   # Throughput's, read again: what any other caller hands in is typed too
        try:
            return results.throughput(measured[name], f"{host}: throughput.py's line for {name}") \
                if name in measured else {"error": "no answer"}
        except Unreadable as e:
            return {"error": f"its measurement does not read ({e.where}: {e.why})"}
    # what the host measured (levels or error alone) never stands over the target's own keys
    instances = {t["name"]: {**reading(t["name"]),
                             "engine": t["engine"], "url": t["url"], "via": t.get("via"),
                             **({"llama_bench": llama[t["name"]]} if t["name"] in llama else {})}
                 for t in targets_}
    run.results[host] = {"host": host, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "max_tokens": data["bench_max_tokens"],
                      "rounds": data["bench_rounds"], "instances": instances}
    best = {n: max((lv["total_tps"] for lv in i.get("levels", [])), default=0) for n, i in instances.items()}
    ran = "; ".join(f"{n} " + ", ".join(f"{r['test']} {r['tps']:.1f}" if "tps" in r else f"{r['test']} "
                                        f"{r.get('skipped') or r.get('error')}" for r in rows)
                    + "".join(f" [{note}]" for note in llama_notes(rows))
                    for n, rows in sorted(llama.items()))
    say(f"    [{host}] bench: {len(instances)} instance(s) in {seconds:.1f} s; best total tok/s: "
        + (", ".join(f"{n} {v:.1f}" for n, v in sorted(best.items())) or "none")
        + (f"; llama-bench tok/s: {ran}" if ran else ""))


def report(run) -> None:
    """The reports of the results kept on ``run`` (:func:`record`), each path said."""
    if run.results:
        try:
            for path in write_reports(run.results, run.bench["out"], run.bench["plot"]):
                say(f"--> bench: wrote {path}")
        except Unreadable as e:
            say(f"--> bench: no report written: {shown(e.where, 200)}: {shown(e.why, 400)}", fg="red")
