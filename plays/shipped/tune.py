#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""The fastest llama-server flags for one instance on the host it runs on, measured: a bounded
sweep, one setting at a time, each point a real llama-server answering real completions at the
instance's target concurrency. Python 3 standard library only (and shipped/throughput.py and shipped/gguf.py,
installed next to it as ``rigup_throughput.py`` and ``rigup_gguf.py``): tune.py (the play) sends them
to a host and runs this as a background job; tests/gpu/check.py runs it with a plain python3 on a GPU
machine.

    python3 tune.py SPEC.json RESULT.json      # RESULT is rewritten after every point

SPEC: ``argv`` (the server's command line as its unit runs it), ``flags`` (llama-server's spellings
of each flag the sweep sets, the first written, by key: rigup/contract/llama_server.py ``spellings``
of its swept rows, written by plays/tuning.py ``spec``), ``port`` (the tuner's own
loopback port, replacing the instance's), ``concurrency`` (the instance's target), ``slot_tokens``
(the context each slot keeps: the instance's ctx / parallel), ``max_parallel``, ``gpu`` (layers on
GPUs: flash attention, batch sizes and KV cache types are swept), ``budget_s``; optional
``levels`` (the concurrencies each point is measured at, default the target alone; a point's
figure is the geometric mean of its tok/s over them, so that a lower level can hold it back),
``max_tokens`` (128), ``rounds`` (2), ``key_file``, ``env``, ``ready_timeout_s`` (600), ``gain``
(1.03), ``layers`` (the model's layer count: the offload stage's steps), ``gpus`` (1).

The sweep (:func:`stages`): the instance as it is (the baseline); then, on GPUs with part of the
model in host RAM, more of it on the GPUs (``-ngl`` up or ``--n-cpu-moe`` down, in eighths of its
``layers``, until a point does not fit); then ``--parallel`` from the
highest level, doubled while it gains, else halved while it gains (ctx = parallel x slot_tokens,
so every slot keeps its context); then ``--cache-ram 0`` (llama-server's host-RAM prompt cache
off: with it on, each new task on a used slot first copies that slot's KV state to RAM, in the
server's loop, which cost 29% at 32 concurrent on an H200); then, on several GPUs (``gpus``), the
other split mode, each card with a quarter fewer layers (``-ts``) and each other card as the main
GPU with row split (``-mg``); then, on GPUs, ``-fa on`` and
``off``, the batch pairs (``-b``/``-ub``), a q8_0 KV cache. A point replaces the best so far only when it is ``gain`` times faster (what two runs of
one server differ by); a point that does not start (out of memory), crashes, falls back to the
CPU or answers nothing is recorded as such and skipped. When the budget is spent the best so far
stands. RESULT: every point (flags, tok/s, per-request tok/s, seconds to ready, VRAM used), the
baseline, the best and its ratio to the baseline, and its format (``schema``): the controller reads
it through rigup/boundary/results.py's ``sweep`` before it becomes the host's data.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

def beside(name: str, tree: str, me: str):
    """The module of the host program ``name`` that its role installs next to this one, read by that
    file's path; else, where this program is ``me`` of a source tree (the controller, unit tests,
    tests/gpu), the tree's file ``tree`` as its package module (imported as the rest of the tree is);
    else None (the caller names the file and ends). The file beside it is run only when it is a
    regular file, not a link, owned by root or by whoever runs this, that neither its group nor others
    may write: never code another user could have written, nor a module of that name from wherever
    sys.path finds one (round 8 R1: a rigup_xid.py in the prefix's parent ran as root). Raises
    ImportError, naming the file and why, for one that is there but not so. One function, copied
    into each host program that imports another (tests/unit/test_host_programs.py)."""
    import importlib
    import os
    import stat
    import sys
    import types
    mine = os.path.abspath(__file__)
    path, module_name = os.path.join(os.path.dirname(mine), name), name.removesuffix(".py")
    top = mine[:-len(me) - 1] if mine.endswith(os.sep + me) else None
    if top is not None and not os.path.lexists(path):   # the source tree: its package's module
        if not os.path.isfile(os.path.join(top, tree)):
            return None
        if top not in sys.path:
            sys.path.insert(0, top)
        module = importlib.import_module(tree.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        if os.path.abspath(getattr(module, "__file__", None) or "") != os.path.join(top, tree):
            raise ImportError(f"{module.__name__} is {getattr(module, '__file__', None)}, not {os.path.join(top, tree)}")
        return module
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:   # ELOOP: a link
        raise ImportError(f"{path} is not run: {'a link' if os.path.islink(path) else e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise ImportError(f"{path} is not run: {stat.filemode(st.st_mode)}, uid {st.st_uid} (only a regular "
                              f"file of root's or this user's, that no group or other user may write)")
        source = f.read()
    if module_name not in sys.modules:
        module = sys.modules[module_name] = types.ModuleType(module_name)
        module.__file__ = path
        try:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            del sys.modules[module_name]
            raise
    module = sys.modules[module_name]
    if os.path.abspath(getattr(module, "__file__", None) or "") != path:
        raise ImportError(f"{module_name} is {getattr(module, '__file__', None)}, not {path}")
    return module


# on a host: rigup_throughput.py and rigup_gguf.py next to this file (tune.py, the play, sends them), each
# read by its path; in the source tree (unit tests, tests/gpu/check.py) rigup's modules
gguf = beside("rigup_gguf.py", "shipped/gguf.py", "plays/shipped/tune.py")
throughput = beside("rigup_throughput.py", "shipped/throughput.py", "plays/shipped/tune.py")
if gguf is None or throughput is None:
    print("rigup_tune.py: rigup_gguf.py or rigup_throughput.py is not beside it (tune.py sends the three): not run",
          file=sys.stderr)
    raise SystemExit(2)

BATCHES = ((2048, 512), (4096, 1024), (1024, 256))   # llama.cpp's default pair first
GAIN = 1.03
# what llama-server's log says when a point cannot serve as asked
NO_FIT = ("out of memory", "failed to allocate", "cudaMalloc failed", "unable to allocate")
NO_GPU = "no usable GPU found"
HEAD_BYTES = 8 << 20   # a GGUF header's metadata, its vocabulary skipped (shipped.gguf partial)


def with_flags(argv: list[str], flags: dict, table: dict) -> list[str]:
    """``argv`` with each of ``flags`` (``table``'s keys, the spec's ``flags``: a value, or None to drop
    it) set once, every other spelling of it removed; ``--flag=value`` forms too."""
    out, spellings = [], {s: key for key, names in table.items() for s in names if key in flags}
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if i and name in spellings:
            skip = "=" not in arg
            continue
        out.append(arg)
    for key, value in flags.items():
        if value is not None:
            out += [table[key][0], str(value)]
    return out


# The spellings the sweep may write, by key: an allow-list (round 21 T21b: a deny-list let `--hf-token`, `--log-file`,
# `--slot-save-path` or `--PORT` be named as a swept flag). rigup/contract/llama_server.py's swept rows are the home of
# these; no host holds the contract, so the spec carries them and this program takes only spellings of this table
# (tests/unit/test_tune.py holds the two equal).
SPELLINGS = {"ctx": ("-c", "--ctx-size"), "parallel": ("--parallel", "-np"), "ngl": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
             "flash_attn": ("-fa", "--flash-attn"), "split_mode": ("-sm", "--split-mode"), "batch": ("-b", "--batch-size"),
             "ubatch": ("-ub", "--ubatch-size"), "cache_type_k": ("-ctk", "--cache-type-k"),
             "cache_type_v": ("-ctv", "--cache-type-v"), "cache_ram": ("-cram", "--cache-ram"),
             "n_cpu_moe": ("--n-cpu-moe", "-ncmoe"), "main_gpu": ("-mg", "--main-gpu"),
             "tensor_split": ("-ts", "--tensor-split"), "port": ("--port",), "host": ("--host",)}
# the spec's numbers: JSON numbers (no text, bool, NaN or infinity), within these bounds (round 20 T20a: 1e400 an
# OverflowError, "٤٠٩٦" read as 4096, a budget of NaN or true); whole numbers but for these two (round 21 T21b: a port
# of 8080.5 was written to the command line)
NUMBERS = {"layers": (0, 10**6), "gpus": (1, 1024), "slot_tokens": (1, 10**8), "max_parallel": (1, 4096),
           "port": (1, 65535), "ready_timeout_s": (1, 86400), "max_tokens": (1, 10**6), "rounds": (1, 1000),
           "gain": (0, 100), "budget_s": (0, 10**7), "concurrency": (1, 4096)}
FRACTIONS = frozenset({"gain", "budget_s", "ready_timeout_s"})


def spec_numbers(spec: dict) -> None:
    """ValueError, naming the key, for a number of the spec that is not one (:data:`NUMBERS`, ``levels``),
    or for an ``argv`` that is not a list of text, an ``env`` not a map of text to text."""
    levels = spec.get("levels") if isinstance(spec.get("levels"), list) else []
    for key, (low, high) in [*NUMBERS.items(), ("levels", NUMBERS["concurrency"])]:   # (levels: concurrencies)
        for v in levels if key == "levels" else [spec[key]] if key in spec and spec[key] is not None else []:
            # (no isfinite: a NaN is within no bounds, and 10**400, a JSON whole number, is no float)
            if isinstance(v, bool) or not isinstance(v, int if key not in FRACTIONS else (int, float)) \
                    or not low <= v <= high:
                kind = "number" if key in FRACTIONS else "whole number"
                raise ValueError(f"the spec's {key}: {str(v)[:40]!r} is not a {kind} from {low} to {high}")
    if spec.get("levels") is not None and not isinstance(spec["levels"], list):   # (round 23 T23a: "12" read as 1, 2)
        raise ValueError("the spec's levels are not a list of whole numbers")
    argv, env = spec.get("argv"), spec.get("env") or {}
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("the spec's argv is not a list of words")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("the spec's env is not a map of names to text")


def spec_flags(spec: dict) -> dict[str, tuple[str, ...]]:
    """The spec's ``flags``: key -> its spellings, ``port`` and ``host`` among them, each a spelling
    :data:`SPELLINGS` has for that key. ValueError, naming what is wrong, for any other (a spec an
    older tune.py wrote has none: its sweep is not run)."""
    table = spec.get("flags")
    if not isinstance(table, dict) or not {"port", "host"} <= set(table):
        raise ValueError("the spec's flags are not a table with port and host (tune.py writes them: tune again)")
    for key, names in table.items():
        allowed = SPELLINGS.get(key, ()) if isinstance(key, str) else ()
        if not (isinstance(names, list) and names and all(isinstance(n, str) and n in allowed for n in names)):
            raise ValueError(f"the spec's flags: {str(key)[:40]!r} is not a list of the spellings the tuner sweeps "
                             f"it by ({', '.join(allowed) or 'none: not a swept flag'})")
    return {key: tuple(names) for key, names in table.items()}


def flags_of(argv: list[str], table: dict) -> dict:
    """The values ``argv`` gives of ``table``'s flags (the last one wins), as strings, by key."""
    found, names = {}, {s: key for key, spellings in table.items() for s in spellings}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names and (eq or i + 1 < len(argv)):
            found[names[name]] = value if eq else argv[i + 1]
    return found


def parallel_directions(concurrency: int, max_parallel: int) -> list[list[int]]:
    """The slot counts to try: the concurrency (at most max_parallel) and doubling from it, then
    halving from it (tried only when nothing of the first gained)."""
    start = max(1, min(concurrency, max_parallel))
    up = [start * 2 ** k for k in range(1, 8) if start * 2 ** k <= max_parallel]
    down = [start // 2 ** k for k in range(1, 8) if start // 2 ** k >= 1]
    return [[start, *up], down]


def model_layers(argv: list[str]) -> int | None:
    """The layer count in the GGUF header of the model ``argv`` serves (``-m``), or None."""
    names = [i for i, a in enumerate(argv[:-1]) if a in ("-m", "--model")]
    if not names:
        return None
    try:
        with open(argv[names[-1] + 1], "rb") as f:
            head = f.read(HEAD_BYTES)
        return gguf.kv_figures(gguf.metadata(head, lambda k: not k.startswith("tokenizer."), partial=True))["layers"]
    except (OSError, ValueError, gguf.GGUFRefused):
        return None


def _count(value: str | None) -> int | None:
    """A flag's whole number on the instance's command line (-ngl, --n-cpu-moe), by the boundary's
    rule (throughput.figure: one optional sign, ASCII digits), else None: isdigit() took "²" and
    "٣", and stripping every '-' let '--5' reach int()."""
    count = throughput.figure(value, -(2 ** 31), 2 ** 31 - 1) if isinstance(value, str) else None
    return count if type(count) is int else None


def offload_stage(spec: dict, base: dict) -> list[list[dict]]:
    """More of the model on the GPUs, in steps of an eighth of its ``layers``: ``-ngl`` up from a
    partial offload to all (99), or ``--n-cpu-moe`` down to 0 (a MoE model's experts in host RAM);
    each direction ends at its first point that does not fit or gain."""
    layers, ngl, moe = int(spec.get("layers") or 0), _count(base.get("ngl")), _count(base.get("n_cpu_moe"))
    step = max(1, -(-layers // 8))
    out = []
    if layers and ngl is not None and 0 < ngl < layers:
        out.append([{"ngl": n} for n in range(ngl + step, layers, step)] + [{"ngl": 99}])
    if moe:
        out.append([{"n_cpu_moe": n} for n in range(moe - step, 0, -step)] + [{"n_cpu_moe": 0}])
    return out


def split_stages(spec: dict, base: dict) -> list[list[list[dict]]]:
    """On several GPUs (``gpus``): the other split mode (``-sm row`` or ``layer``), then each card
    in turn given a quarter fewer layers (``-ts``: a main or a slower card with less), then with row
    split each other card as the main GPU (``-mg``: intermediate results and the KV cache)."""
    gpus = int(spec.get("gpus") or 1)
    if gpus < 2:
        return []
    other = "layer" if base.get("split_mode") == "row" else "row"
    shares = [[{"tensor_split": ",".join("3" if i == k else "4" for i in range(gpus))}] for k in range(min(gpus, 8))]
    return [[[{"split_mode": other}]], shares,
            [[{"split_mode": "row", "main_gpu": k}] for k in range(1, min(gpus, 8))]]


def stages(spec: dict, base: dict) -> list[list[list[dict]]]:
    """The sweep: stages of directions of flag changes over the best point so far. A direction
    ends at its first point that does not gain; a stage's next direction runs only when none
    before it gained. The first stage is the baseline (no change). ``base``: the argv's own
    flags (:func:`flags_of`)."""
    slot = int(spec["slot_tokens"])
    offload = offload_stage(spec, base) if spec.get("gpu") else []
    out = [[[{}]]] + ([offload] if offload else [])
    out.append([[{"parallel": p, "ctx": p * slot} for p in d]
                for d in parallel_directions(max(spec_levels(spec)), int(spec["max_parallel"])) if d])
    if base.get("cache_ram") != "0":   # the host-RAM prompt cache off: no slot state copied before a task
        out.append([[{"cache_ram": 0}]])
    if spec.get("gpu"):
        out += split_stages(spec, base)
        out.append([[{"flash_attn": v}] for v in ("on", "off") if base.get("flash_attn") != v])
        out.append([[{"batch": b, "ubatch": u}] for b, u in BATCHES
                    if (str(b), str(u)) != (base.get("batch", "2048"), base.get("ubatch", "512"))])
        out.append([[{"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}]])
    return out


def spec_levels(spec: dict) -> list[int]:
    """The concurrency levels each point is measured at: ``levels``, else the ``concurrency``."""
    return sorted({int(n) for n in spec.get("levels") or [spec["concurrency"]]})


def score(levels: list[dict]) -> float:
    """A point's figure of merit: the geometric mean of its total tok/s over the levels (each
    level counts alike, whatever its scale)."""
    values = [max(lv["total_tps"], 1e-9) for lv in levels]
    product = 1.0
    for v in values:
        product *= v
    return round(product ** (1 / len(values)), 2) if values else 0.0


def _vram_mib() -> int | None:
    """VRAM used on every GPU of the machine (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # one line a card; ASCII digits (isdigit() takes "²"), figure() strips ASCII's blanks alone (split() took U+0085)
    values = [throughput.figure(v, 0, 1 << 40) for v in out.split("\n")]
    values = [v for v in values if type(v) is int]
    return sum(values) if values else None


def _healthy(port: int, proc: subprocess.Popen, timeout: float) -> str | None:
    """None once /health answers 200; else why not (the process ended, or the timeout). Asked through
    shipped/throughput.py's opener, as every completion of the sweep: a redirect is no 200, and each
    answer is whole within 5 s and the time left, its status line and headers too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with status {proc.returncode} before answering"
        try:
            with throughput._OPENER.open(f"http://127.0.0.1:{port}/health",
                                         timeout=max(min(5, deadline - time.monotonic()), 0.001)) as answer:
                if answer.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(0.5)
    return f"no /health 200 in {timeout:.0f} s"


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)   # the server was started in a session of its own
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def measure(spec: dict, argv: list[str], log: Path) -> dict:
    """One point: start ``argv``, wait for /health, warm up, measure at the concurrency, stop.
    ``status``: ok, no-fit, crash, cpu-fallback, failed-requests or timeout."""
    port, env = int(spec["port"]), {**os.environ, **(spec.get("env") or {})}
    try:   # (a key file gone, a server not installed: a point that did not start, with why; round 22 T22a)
        key = throughput.read_key(spec.get("key_file"))
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except (OSError, ValueError) as e:
        return {"status": "crash", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    started, point = time.monotonic(), {}
    try:
        why = _healthy(port, proc, float(spec.get("ready_timeout_s", 600)))
        point["ready_s"] = round(time.monotonic() - started, 1)
        text = log.read_text(errors="replace")
        if why:
            lower = text.lower()
            status = "no-fit" if any(s.lower() in lower for s in NO_FIT) else "crash" if proc.poll() is not None \
                else "timeout"
            return {**point, "status": status, "error": f"{why}: {text.strip().splitlines()[-1][:300] if text.strip() else ''}"}
        if spec.get("gpu") and NO_GPU in text:
            return {**point, "status": "cpu-fallback", "error": NO_GPU}
        point["vram_mib"] = _vram_mib()
        url = f"http://127.0.0.1:{port}"
        throughput.completion(url, key, 8, 300)
        runs = [throughput.level(url, n, key, int(spec.get("max_tokens", 128)), int(spec.get("rounds", 2)),
                                 timeout=600) for n in spec_levels(spec)]
        failed = sum(r["failed"] for r in runs)
        return {**point, "status": "failed-requests" if failed else "ok", "tps": score(runs), "failed": failed,
                "levels": [{k: r[k] for k in ("concurrency", "requests", "failed", "total_tps", "per_request_tps")}
                           for r in runs], "errors": sorted({e for r in runs for e in r["errors"]})[:3]}
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:   # HTTPException: an answer cut off
        return {**point, "status": "crash" if proc.poll() is not None else "failed-requests",
                "error": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        _stop(proc)


def tune(spec: dict, write=None, logs: Path | None = None, measure_point=measure) -> dict:
    """Run the sweep of ``spec`` (module docstring); ``write(result)`` after every point.
    ``measure_point(spec, argv, log)`` measures one point (:func:`measure`)."""
    spec_numbers(spec)
    table = spec_flags(spec)
    argv = with_flags(list(spec["argv"]), {"port": spec["port"], "host": "127.0.0.1"}, table)
    base = flags_of(argv, table)
    logs = logs or Path(spec.get("logs") or "/tmp")
    gain, budget = float(spec.get("gain", GAIN)), float(spec["budget_s"])
    started = time.monotonic()
    # "schema": the result's format, which the controller's reader knows (rigup/boundary/results.py SCHEMA)
    result = {"schema": 1, "concurrency": spec["concurrency"], "levels": spec_levels(spec), "budget_s": budget, "points": [],
              "baseline": None, "best": None, "ratio": None, "spent_s": 0.0, "stopped": None}
    best_flags: dict = {}
    measured: set = set()   # the flags of each command line measured (a change may spell the baseline's own)

    def run(stage: int, change: dict) -> bool | None:
        """Measure the best flags with ``change``: whether it became the best (None: a command
        line already measured, not measured again)."""
        flags = {**best_flags, **change}
        point = {"stage": stage, "flags": flags, "argv": with_flags(argv, flags, table)}
        key = frozenset(flags_of(point["argv"], table).items())
        if key in measured:
            return None
        measured.add(key)
        point.update(measure_point(spec, point["argv"], logs / f"tune-{len(result['points'])}.log"))
        point["at_s"] = round(time.monotonic() - started, 1)
        result["points"].append(point)
        result["spent_s"] = point["at_s"]
        won = point["status"] == "ok" and (result["best"] is None or point["tps"] >= gain * result["best"]["tps"])
        if won:
            result["best"] = point
        if write:
            write(result)
        return won

    if spec.get("gpu") and not spec.get("layers"):
        spec = {**spec, "layers": model_layers(argv)}
    result["layers"] = spec.get("layers")
    plan, n = stages(spec, base), 0
    # every key a stage sets must have its spellings in the spec's table (a spec written by hand or by another
    # rigup: a KeyError mid-sweep, after the baseline served, was round 18 T18a)
    missing = sorted({key for directions in plan for direction in directions for change in direction
                      for key in change} - set(table))
    if missing:
        raise ValueError(f"the spec's flags have no spellings for {', '.join(map(str, missing))} (tune.py writes "
                         "them: tune again)")
    while n < len(plan):
        directions, gained = plan[n], False
        for direction in directions:
            if gained:
                break
            for change in direction:
                if result["baseline"] and time.monotonic() - started > budget:
                    result["stopped"] = f"the budget ({budget:.0f} s) was spent at stage {n}"
                    break
                won = run(n, change)
                if won is None:
                    continue
                if not won:
                    break
                gained = n > 0
                if n == 0:
                    result["baseline"] = result["best"]
                else:
                    best_flags = dict(result["best"]["flags"])
            if result["stopped"] or (n == 0 and not result["baseline"]):
                break
        if n == 0 and not result["baseline"]:
            result["stopped"] = f"the instance as it is does not serve here: {result['points'][-1].get('error')}"
        if result["stopped"]:
            break
        n += 1
    if result["baseline"] and result["baseline"]["tps"]:
        result["ratio"] = round(result["best"]["tps"] / result["baseline"]["tps"], 3)
    result["spent_s"] = round(time.monotonic() - started, 1)
    if write:
        write(result)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[1])

    def write(result: dict) -> None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, out)

    try:
        spec = json.loads(Path(argv[0]).read_text())
        result = tune(spec, write, logs=out.parent)
    # a spec rigup did not write (not JSON, a key missing, a value of another type; spec_numbers, spec_flags): one
    # line, not a traceback (round 21 T21a)
    # (OSError: the spec's file unreadable; RecursionError: JSON nested deeper than Python reads, round 22 T22a)
    except (ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError) as e:
        why = f"the spec has no {e}" if isinstance(e, KeyError) else f"the spec: {type(e).__name__}: {e}" \
            if not isinstance(e, ValueError) else str(e)
        print(json.dumps({"refused": why[:500]}), file=sys.stderr)   # (data: json.dumps escapes what the spec held)
        return 2
    best = result["best"]
    print(json.dumps({"ratio": result["ratio"], "best": best and best["flags"], "tps": best and best["tps"],
                      "points": len(result["points"]), "stopped": result["stopped"]}))
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
