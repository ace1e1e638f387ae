#!/usr/bin/python3 -sES
# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-burnin: accept a card before it serves, and keep what it found per card, by UUID.

Installed by roles/burnin as RIGUP_PREFIX/bin/rigup-burnin; on the GPU machine run as
``python3 roles/burnin/shipped/acceptance.py run --level standard --json OUT`` (tests/gpu/burnin.sh).

    rigup-burnin run --level quick|standard|long [--cards UUID,...] [--results FILE] [--json FILE]
                     [--soak-s S] [--patterns N] [--vram-fraction F] [--pcie-min-ratio R]
                     [--throttle-max F] [--timeout-s S] [--xid-match FIELD=VALUE] [--metrics FILE]
                     [--power-min-ratio R] [--slow-flag-ratio R] [--slow-quarantine-ratio R]
                     [--load auto|cublas|ptx|integer] [--samples FILE]
    rigup-burnin status [--results FILE]
    rigup-burnin clear UUID[,UUID]|all [--results FILE] [--by WHO]

``run`` tests the named cards (every card when none is named) that nothing uses at that moment
(no compute process on it, no active serving unit whose CUDA_VISIBLE_DEVICES has it; a unit
without it has every card): a card in use is left alone and reported ``busy``. Each card is
tested in a worker process of its own, all cards at once; a worker that does not finish within
its time bound is killed with SIGKILL and the card is quarantined as hung (never reset: a reset
is the operator's call). Per card:

0. before and after: the uncorrected volatile ECC count, remapped rows pending and failed,
   retired pages pending (``nvidia-smi --query-gpu``) and the driver's recovery action
   (``nvidia-smi -q``): a rise, a pending remap or an action other than None fails the card (ECC
   can correct, and so hide, what a pattern test would have found);
1. VRAM: ``vram_fraction`` of the free memory in plain device allocations (cuMemAlloc, never
   managed memory), filled and read back ``patterns`` times with address-dependent values (each
   pattern and its inverse over every chunk, salted per chunk so that two chunks aliasing each
   other differ), mismatched 32-bit words counted on the card;
2. PCIe: host-to-device and device-to-host bandwidth with pinned buffers (each direction's fastest
   of PCIE_ROUNDS rounds), the worker bound to the card's NUMA node, against what the card's maximum link (``pcie.link.gen.max`` x
   ``pcie.link.width.max``) allows: below ``pcie_min_ratio`` fails (a riser at x1, a slot gone bad);
3. compute: an integer workload (an LCG and xorshift per thread) whose outputs are compared with a
   reference computed here for a sample of threads, before the soak and again after it against
   the first: a wrong answer fails, as a crash does;
4. soak, for ``soak_s`` seconds at the cap in force (rigup-burnin never sets caps or clocks): GEMM
   on random operands through the host's cuBLAS (FP16 into FP32 on tensor cores, FP32 before
   compute capability 7.0; without cuBLAS a PTX tensor-core load from memory, or the integer
   workload) with a concurrent HBM stream, the seeded results digested and every repeat compared
   with its first; temperature, SM clock, power, the enforced cap and the throttle reasons sampled
   every SAMPLE_S: a thermal, hardware-slowdown or power-brake reason in more than
   ``throttle_max`` of the samples fails, so does (under cuBLAS) a mean draw below
   ``power_min_ratio`` of the cap, a repeat that differs, an Xid of the card in the kernel log and
   a card that falls off the bus; then each card against its siblings on the host (same product,
   driver, cuBLAS): a digest not the majority's fails, a throughput below
   ``slow_quarantine_ratio`` of their median fails, below ``slow_flag_ratio`` is flagged;
5. the memory the card reports is what the controller expects (``--expect-mib``: a CMP card's
   unlocked size), and the VRAM pass covered it.

Levels, after DCGM's: ``quick`` (seconds: one pattern, a 10 s soak; after a driver, unlock or cap
change), ``standard`` (minutes: four patterns, a 2 min soak; a card's first sight), ``long`` (eight
patterns, a 15 min soak; when the operator asks). Where ``dcgmi`` is installed and the card is a
datacenter card (not a CMP or consumer card), ``dcgmi diag -r 1|2|3`` runs first and its verdict
joins the card's.

The CUDA part is the CUDA driver API through ctypes (libcuda.so.1, which every driver installs),
its kernels PTX text the driver compiles for the card: no CUDA toolkit, no Python package and no
compiler on the host (a host that receives a llama.cpp build has none), and the same code on
every card the driver supports. No library does this: DCGM's diag is the field's tool but runs
only on datacenter cards and is not packaged for every distribution; cuda-python, CuPy and
PyTorch are packages the host would need first, built per CUDA version.

Results: ``--results`` (default /var/lib/rigup/burnin.json, written atomically, root's), per card
UUID: ``{"index", "bus_id", "name", "level", "at", "seconds", "passed", "failed": [why...],
"key": {"driver", "memory_mib", "power_limit_w"}, "figures": {...}}`` and, schema 2, ``"schema": 2,
"gemm": {"load", "dtype", "cublas", "tflops", "tflops_per_w", "digest", ...}, "power": {"mean_w",
"cap_w", "ratio", "samples", "judged", ...}, "flagged": [why...]``; ``clear`` marks cards
accepted by the operator (``cleared``); the metrics (``--metrics``, when its directory exists):
rigup_gpu_burnin_passed, rigup_gpu_quarantined, rigup_gpu_burnin_seconds, per card.
Exit status of ``run``: 0 every tested card passed, 3 a card failed (named on stderr), 2 bad use.
"""

from __future__ import annotations

# Only modules that map no library come before the LD_LIBRARY_PATH check (each of these is built into
# the interpreter): ctypes (libffi), hashlib (libcrypto), shutil (libbz2, liblzma), multiprocessing and the
# others map theirs through the loader's search, LD_LIBRARY_PATH first, as it was when this process
# started (round 8 L1: another user's libffi.so.8 ran as root at ``import ctypes``). The check and its
# start again come first (:func:`loader_path_checked`); tests/unit/test_burnin_round8.py holds this.
import itertools
import os
import re
import stat
import sys


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def alone(path: str, directory: bool = False) -> tuple[str, str | None]:
    """(the real path, None) when ``path`` (a file, or with ``directory`` a directory) and every
    directory from it up to / are root's or this
    user's and no group or other user can write them, each link followed the same way (the
    directory it lies in checked; its target walked from there); else (``path``, why not).
    rigup-burnin runs as root: a library loaded from where another user writes (Debian's
    /usr/local is 2775 root:staff) runs their code as root, as an nvcc would (roles/cuda_toolkit)."""
    me = os.geteuid()

    def why_not(here: str, st: os.stat_result) -> str | None:
        if st.st_uid not in (0, me):
            return f"{here} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022:
            return f"{here} is {stat.S_IMODE(st.st_mode):o}: writable by its group or others"
        return None

    done, todo, hops = "/", [c for c in path.split("/") if c], 0
    try:
        why = why_not("/", os.stat("/"))
        while todo and why is None:
            part = todo.pop(0)
            if part in (".", ".."):
                done = os.path.dirname(done) if part == ".." else done   # done is a real path: its parent walked
                continue
            here = os.path.join(done, part)
            st = os.lstat(here)
            if stat.S_ISLNK(st.st_mode):   # its directory (done) is walked: its target is walked from there
                hops += 1
                if hops > 40:
                    return path, f"{here}: more than 40 links"
                target = os.readlink(here)
                done = "/" if target.startswith("/") else done
                todo[:0] = [c for c in target.split("/") if c]
                continue
            why = why_not(here, st) or (f"{here} is not a directory" if todo and not stat.S_ISDIR(st.st_mode) else None)
            done = here
        if why is None and not (stat.S_ISDIR if directory else stat.S_ISREG)(os.lstat(done).st_mode):
            why = f"{done} is not a {'directory' if directory else 'file'}"
    except OSError as e:
        why = f"{path}: {e.strerror or e}"
    return (done, None) if why is None else (path, why)


SEARCHED_MAX = 100000   # entries under one searched directory walked at most; past it the directory is left out


def searched(directory: str, seen: dict[str, int] | None = None) -> tuple[str, str | None]:
    """(the real path, None) when :func:`alone` passes ``directory``, every file in it and, the same
    way, every directory under it and their files (a link's target walked as alone() walks it); else
    (``directory``, why not). The loader maps the files it finds in a directory it searches, not the
    directory: root's directory holding a link to another user's file, or a 0666 file, ran that user's
    code as root (round 8 L2), as a directory another user writes would; and it searches the
    directory's subdirectories first (glibc-hwcaps/x86-64-v3/, x86-64-v2/ and the legacy tls/,
    haswell/, avx512_1/, x86_64/, nested, by the glibc and the CPU: ``ld.so --help`` lists them):
    another user's glibc-hwcaps/x86-64-v2/ in root's directory ran their library as root (round 9
    LH1). So every directory under it is walked, whatever its name: one refused refuses the
    directory. ``seen``: the directories walked already, by real path (a link back up is walked once),
    and under "" the count of entries walked."""
    seen = {"": 0} if seen is None else seen
    real, why = alone(directory, directory=True)
    if why is None and real in seen:
        return real, None
    seen[real] = 1
    try:
        for name in sorted(os.listdir(real)) if why is None else ():
            path = os.path.join(real, name)
            seen[""] += 1
            if seen[""] > SEARCHED_MAX:
                return directory, f"more than {SEARCHED_MAX} entries under it (not walked to the end)"
            if os.path.isdir(path):   # a directory, or a link to one: the loader may search it
                why = searched(path, seen)[1]
            else:
                why = alone(path)[1]
            if why is not None:
                return directory, f"its {name}: {why}"
    except OSError as e:
        why = f"{real}: {e.strerror or e}"
    return (real, None) if why is None else (directory, why)


def library_path(value: str) -> tuple[list[str], list[str]]:
    """LD_LIBRARY_PATH's directories, split as the loader splits it (at ``:`` and ``;``): ([the real path
    of each :func:`searched` passes], [why each other one is left out]). An empty or relative entry (the
    loader's current directory) and one holding ``$`` (a token the loader expands: $ORIGIN, $LIB,
    $PLATFORM, so not the path checked) are left out too."""
    kept, out = [], []
    for d in re.split("[:;]", value):
        if not d.startswith("/"):
            real, why = d, "not an absolute path (the loader's current directory)"
        elif "$" in d:
            real, why = d, "a $ the loader expands"
        else:
            real, why = searched(d)
        if why is not None:
            out.append(f"{d!r} left out: {why}")
        elif real not in kept:
            kept.append(real)
    return kept, out


def loader_path_checked() -> None:
    """Start this program again with LD_LIBRARY_PATH of only :func:`library_path`'s directories where it
    holds any other, each one left out named on stderr: the loader reads it at start alone (round 7b L1).
    Called first, before any library is loaded; the program started again finds nothing to leave out."""
    value = os.environ.get("LD_LIBRARY_PATH")
    kept, out = library_path(value) if value else ([], [])   # an empty value is no search (glibc)
    if not out:
        return
    for why in out:
        print(shown(f"rigup-burnin: LD_LIBRARY_PATH's {why} (root loads no library another user can replace)", 600),
              file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if kept:
        env["LD_LIBRARY_PATH"] = ":".join(kept)
    argv = getattr(sys, "orig_argv", None) or [sys.executable, "-sES", *sys.argv]   # 3.10+: the flags too
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)


if __name__ == "__main__":
    loader_path_checked()

import argparse  # noqa: E402 - after the check above, on purpose
import ctypes  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

RESULTS = "/var/lib/rigup/burnin.json"
TESTING = "/run/rigup/burnin-testing.json"   # the bus ids under test now: the GPU guard leaves them alone
METRICS = "/var/lib/prometheus/node-exporter/rigup_burnin.prom"
LEVELS = {"quick": {"patterns": 1, "soak_s": 10, "dcgm": 1},
          "standard": {"patterns": 4, "soak_s": 120, "dcgm": 2},
          "long": {"patterns": 8, "soak_s": 900, "dcgm": 3}}
PATTERNS = (0x00000000, 0xFFFFFFFF, 0xAAAAAAAA, 0x55555555, 0xCCCCCCCC, 0x33333333, 0xF0F0F0F0, 0x0F0F0F0F)
# GB/s per lane and direction after line coding (PCI-SIG: 2.5, 5, 8, 16, 32, 64 GT/s)
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# clocks_event_reasons bits that say the card cannot hold its clocks (nvml.h); the power cap (0x4)
# and idle (0x1) are what a card at its configured cap does, never a fault
THROTTLE = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
            0x80: "hardware power brake"}
DATACENTER = re.compile(r"\b(A100|A30|A40|A10|H100|H200|H800|H20|B200|B100|GB200|L40S?|L4|V100|T4)\b")
CHUNK = 1 << 30            # bytes per device allocation of the VRAM pass
PCIE_BYTES = 256 << 20     # bytes per timed copy
PCIE_COPIES = 4
# rounds per direction, the fastest kept: a link can never measure faster than it is, while one CPU
# stall of the worker (another process on the host, a page fault) can make one round slow; a lab CI
# run under load measured a healthy x16 link at 0.23 of itself from a single round
PCIE_ROUNDS = 3
COMPUTE_ITERS = 8192       # LCG steps per thread and launch
COMPUTE_SAMPLE = 64        # threads whose output is computed here too
SAMPLE_S = 0.5
POWER_RAMP_S = 5.0         # the soak's first seconds, left out of its mean draw (clocks and draw ramping up)
SMI_TIMEOUT_S = 20
KILL = getattr(signal, "SIGKILL", 9)
UNITS = ("rigup-llama@*", "rigup-vllm@*", "rigup-rpc*")   # the serving units (roles/burnin/facts.py reads the same)


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


xid_lines = beside("rigup_xid.py", "shipped/xid.py", "roles/burnin/shipped/acceptance.py")   # the Xid line parser
if xid_lines is None:
    print("rigup-burnin: rigup_xid.py is not beside it (roles/burnin installs the two): not run", file=sys.stderr)
    raise SystemExit(2)

# rand: word i of a buffer = (fmix32(i + seed * 0x9E3779B9) & mask) | bits: random operands for the
# soak's GEMMs, made on the card (the host would copy GiBs): the mask and bits keep each value a
# finite number of one sign-free range (f16 pairs, bf16 pairs or f32 in +-[0.5, 1)), so that the
# sums stay far from overflow and every mantissa bit toggles: random data draws the watts that
# zeros and constants do not (field-2026-12c: an H100's FP16 GEMM 414 W on zeros, 698.6 W on random)
RAND_PTX = r"""
.visible .entry rand(.param .u64 p_ptr, .param .u64 p_n, .param .u32 p_seed, .param .u32 p_mask, .param .u32 p_bits)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_ptr];
    ld.param.u64 %rd2, [p_n];
    ld.param.u32 %r1, [p_seed];
    ld.param.u32 %r10, [p_mask];
    ld.param.u32 %r11, [p_bits];
@GRID_STRIDE@
RAND_LOOP:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra RAND_DONE;
    cvt.u32.u64 %r6, %rd3;
    mul.lo.u32 %r7, %r1, 0x9E3779B9;
    add.u32 %r7, %r7, %r6;
    shr.u32 %r8, %r7, 16;
    xor.b32 %r7, %r7, %r8;
    mul.lo.u32 %r7, %r7, 0x85EBCA6B;
    shr.u32 %r8, %r7, 13;
    xor.b32 %r7, %r7, %r8;
    mul.lo.u32 %r7, %r7, 0xC2B2AE35;
    shr.u32 %r8, %r7, 16;
    xor.b32 %r7, %r7, %r8;
    and.b32 %r7, %r7, %r10;
    or.b32 %r7, %r7, %r11;
    shl.b64 %rd6, %rd3, 2;
    add.u64 %rd7, %rd1, %rd6;
    st.global.u32 [%rd7], %r7;
    add.u64 %rd3, %rd3, %rd5;
    bra RAND_LOOP;
RAND_DONE:
    ret;
}
"""
# (mask, bits) of :data:`RAND_PTX` per operand type: sign and mantissa random, the exponent that of 0.5
OPERANDS = {"fp16": (0x83FF83FF, 0x38003800), "bf16": (0x807F807F, 0x3F003F00), "fp32": (0x807FFFFF, 0x3F000000)}

# The soak's load where the host has no cuBLAS (a build host's CUDA runtime not installed, a CPU
# backend host), on compute capability 8.0 and later: per thread four chains of m16n8k16 f16
# products accumulated in f32, each iteration's A and B fragments loaded from a buffer of random
# values (:data:`RAND_PTX`, a new seed per launch), wrapped at MEM_WORDS (it stays in L1 and L2);
# the sums stored, 4 floats a thread, and compared between launches of the same seed.
MEM_WORDS = 1 << 16
MEM_STEP = 8 * 4099          # words between a thread's iterations (a multiple of 8: 32-byte aligned loads)
MMA_CHAINS = 4
MMA_PTX = (r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry mma_mem(.param .u64 p_src, .param .u64 p_out, .param .u32 p_iters, .param .u32 p_mask)
{
    .reg .pred %p<2>;
    .reg .b32 %r<20>;
    .reg .f32 %f<20>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [p_src];
    ld.param.u64 %rd2, [p_out];
    ld.param.u32 %r1, [p_iters];
    ld.param.u32 %r2, [p_mask];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.u32 %r7, %r4, %r5, %r6;
    shl.b32 %r8, %r7, 3;
""" + "".join(f"    mov.f32 %f{k}, 0f00000000;\n" for k in range(1, 17)) + r"""    mov.u32 %r3, 0;
MMA_LOOP:
    setp.ge.u32 %p1, %r3, %r1;
    @%p1 bra MMA_STORE;
    and.b32 %r9, %r8, %r2;
    mul.wide.u32 %rd3, %r9, 4;
    add.u64 %rd4, %rd1, %rd3;
    ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd4];
    ld.global.v2.u32 {%r14, %r15}, [%rd4+16];
""" + "".join(f"    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%f{c}, %f{c + 1}, %f{c + 2}, %f{c + 3}}}, "
              f"{{{a}}}, {{{b}}}, {{%f{c}, %f{c + 1}, %f{c + 2}, %f{c + 3}}};\n"
              for c, a, b in ((1, "%r10, %r11, %r12, %r13", "%r14, %r15"), (5, "%r11, %r12, %r13, %r10", "%r15, %r14"),
                              (9, "%r12, %r13, %r10, %r11", "%r14, %r15"), (13, "%r13, %r10, %r11, %r12", "%r15, %r14"))) + r"""    add.u32 %r8, %r8, @STEP@;
    add.u32 %r3, %r3, 1;
    bra MMA_LOOP;
MMA_STORE:
""" + "".join(f"    add.f32 %f{k}, %f{k}, %f{k + 4};\n    add.f32 %f{k + 8}, %f{k + 8}, %f{k + 12};\n"
              f"    add.f32 %f{k}, %f{k}, %f{k + 8};\n" for k in range(1, 5)) + r"""    mul.wide.u32 %rd3, %r7, 16;
    add.u64 %rd4, %rd2, %rd3;
    st.global.v4.f32 [%rd4], {%f1, %f2, %f3, %f4};
    ret;
}
""").replace("@STEP@", str(MEM_STEP))


# The kernels, as PTX for the driver to compile (the oldest target every supported card runs):
# fill: word i of a chunk = (i * 0x9E3779B1) ^ seed; check: counts the words that differ (one
# atomic per thread); burn: per thread x = i, ITERS times x = x * 1664525 + 1013904223, x ^= x >> 13
# fill's and check's common part: %rd3 = this thread's first word, %rd5 = the grid's stride (words)
GRID_STRIDE = """    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd3, %r2, %r3;
    cvt.u64.u32 %rd4, %r4;
    add.u64 %rd3, %rd3, %rd4;
    mul.wide.u32 %rd5, %r5, %r3;"""
# word %rd3's value (%r7) and address (%rd7)
WORD = """    cvt.u32.u64 %r6, %rd3;
    mul.lo.u32 %r7, %r6, 2654435761;
    xor.b32 %r7, %r7, %r1;
    shl.b64 %rd6, %rd3, 2;
    add.u64 %rd7, %rd1, %rd6;"""
PTX = (r"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry fill(.param .u64 p_ptr, .param .u64 p_n, .param .u32 p_seed)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_ptr];
    ld.param.u64 %rd2, [p_n];
    ld.param.u32 %r1, [p_seed];
@GRID_STRIDE@
FILL_LOOP:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra FILL_DONE;
@WORD@
    st.global.u32 [%rd7], %r7;
    add.u64 %rd3, %rd3, %rd5;
    bra FILL_LOOP;
FILL_DONE:
    ret;
}

.visible .entry check(.param .u64 p_ptr, .param .u64 p_n, .param .u32 p_seed, .param .u64 p_count)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [p_ptr];
    ld.param.u64 %rd2, [p_n];
    ld.param.u32 %r1, [p_seed];
    ld.param.u64 %rd8, [p_count];
    cvta.to.global.u64 %rd8, %rd8;
@GRID_STRIDE@
    mov.u32 %r9, 0;
CHECK_LOOP:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra CHECK_DONE;
@WORD@
    ld.global.u32 %r8, [%rd7];
    setp.ne.u32 %p2, %r8, %r7;
    selp.u32 %r10, 1, 0, %p2;
    add.u32 %r9, %r9, %r10;
    add.u64 %rd3, %rd3, %rd5;
    bra CHECK_LOOP;
CHECK_DONE:
    setp.eq.u32 %p3, %r9, 0;
    @%p3 bra CHECK_RET;
    atom.global.add.u32 %r11, [%rd8], %r9;
CHECK_RET:
    ret;
}

.visible .entry burn(.param .u64 p_out, .param .u32 p_n, .param .u32 p_iters)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_out];
    ld.param.u32 %r1, [p_n];
    ld.param.u32 %r2, [p_iters];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra BURN_DONE;
    mov.u32 %r7, %r6;
    mov.u32 %r8, 0;
BURN_LOOP:
    setp.ge.u32 %p2, %r8, %r2;
    @%p2 bra BURN_STORE;
    mad.lo.u32 %r7, %r7, 1664525, 1013904223;
    shr.u32 %r9, %r7, 13;
    xor.b32 %r7, %r7, %r9;
    add.u32 %r8, %r8, 1;
    bra BURN_LOOP;
BURN_STORE:
    mul.wide.u32 %rd2, %r6, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r7;
BURN_DONE:
    ret;
}
""" + RAND_PTX).replace("@GRID_STRIDE@", GRID_STRIDE).replace("@WORD@", WORD)


def rand_word(i: int, seed: int, operand: str = "fp16") -> int:
    """What ``rand`` writes to word ``i`` of a buffer of ``operand`` values."""
    x = (i + seed * 0x9E3779B9) & 0xFFFFFFFF
    for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, 1)):
        x = ((x ^ (x >> shift)) * mul) & 0xFFFFFFFF
    mask, bits = OPERANDS[operand]
    return (x & mask) | bits


def burn_reference(i: int, iters: int) -> int:
    """What ``burn`` computes for thread ``i``."""
    x = i & 0xFFFFFFFF
    for _ in range(iters):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
        x ^= x >> 13
    return x


def fill_value(i: int, seed: int) -> int:
    """What ``fill`` writes to word ``i`` of a chunk."""
    return ((i * 2654435761) & 0xFFFFFFFF) ^ seed


def chunk_seed(pattern: int, chunk: int) -> int:
    """A pattern's seed for one chunk: the same salt for a pattern and its inverse."""
    return pattern ^ ((chunk * 0x01000193) & 0xFFFFFFFF)


def pcie_allowed_gbps(gen, width) -> float | None:
    """What a link of PCIe ``gen`` x ``width`` carries per direction, GB/s; None when unknown."""
    try:
        return LANE_GBPS[int(gen)] * int(width)
    except (KeyError, TypeError, ValueError):
        return None


def throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE.items() if mask & bit]


def judge(card: dict, fig: dict, opts: dict) -> list[str]:
    """Why a card fails, from its figures (pure): [] when it passes."""
    why = []
    if fig.get("hung"):
        why.append(f"hung: no answer within {fig['hung']} s (killed; the card was not reset)")
    if fig.get("lost"):
        why.append("fell off the bus under load" + (f" ({fig['lost']})" if isinstance(fig["lost"], str) else ""))
    if fig.get("error") and not (fig.get("lost") and fig.get("cuda_lost")):
        why.append(fig["error"])
    vram = fig.get("vram") or {}
    if vram.get("mismatches"):
        why.append(f"VRAM: {vram['mismatches']} mismatched words ({vram.get('mib', '?')} MiB, "
                   f"{vram.get('patterns', '?')} pattern(s) and their inverses)")
    expect = card.get("expect_mib")
    if expect and vram.get("total_mib") is not None and vram["total_mib"] < 0.95 * expect:
        why.append(f"VRAM: the card has {vram['total_mib']} MiB, {expect} MiB expected (the unlock did not take)")
    pcie = fig.get("pcie") or {}
    if pcie.get("ratio") is not None and pcie["ratio"] < opts["pcie_min_ratio"]:
        why.append(f"PCIe: {pcie['gbps']:.1f} GB/s, {pcie['ratio']:.2f} of the {pcie['allowed_gbps']:.1f} GB/s "
                   f"its x{pcie['width_max']} Gen{pcie['gen_max']} link allows (link now x{pcie.get('width', '?')} "
                   f"Gen{pcie.get('gen', '?')}; at least {opts['pcie_min_ratio']:.2f} wanted)")
    compute = fig.get("compute") or {}
    if compute.get("wrong"):
        why.append(f"compute: {compute['wrong']} wrong answers of {compute.get('checked', '?')} checked")
    soak = fig.get("soak") or {}
    if soak.get("throttled_ratio", 0) > opts["throttle_max"]:
        why.append(f"soak: {', '.join(soak.get('reasons') or ['throttled'])} in {soak['throttled_ratio']:.0%} of "
                   f"{soak.get('samples')} samples (max {soak.get('temp_max_c')} C, SM clock down to "
                   f"{soak.get('sm_clock_min_mhz')} MHz)")
    for x in soak.get("xids") or []:
        why.append(f"Xid {x} during the test")
    power = fig.get("power") or {}
    if power.get("judged") and power["ratio"] < opts["power_min_ratio"]:
        why.append(f"soak: mean draw {power['mean_w']:.0f} W, {power['ratio']:.2f} of the {power['cap_w']:.0f} W cap "
                   f"in force over {power['samples']} samples under GEMM load (at least {opts['power_min_ratio']:.2f} "
                   f"wanted): the card, its power delivery or its cooling does not hold full load")
    gemm = fig.get("gemm") or {}
    if gemm.get("differ"):
        why.append(f"GEMM: {gemm['differ']} of {gemm.get('repeats')} repeats of the same seeded {gemm.get('dtype')} "
                   f"GEMMs gave another result ({gemm.get('odd')}): the card computes wrong under load")
    if gemm.get("error"):
        why.append(gemm["error"])
    health = fig.get("health") or {}
    for what in health.get("worse") or []:
        why.append(f"health: {what}")
    dcgm = fig.get("dcgm") or {}
    if dcgm.get("failed"):
        why.append(f"dcgmi diag -r {dcgm.get('level')}: {', '.join(dcgm['failed'])}")
    return why


def power_of(rows: list[dict], window, cap) -> dict:
    """The soak's draw from the samples taken in its ``window`` ([start, end], epoch s) less its first
    POWER_RAMP_S (pure): {"mean_w", "cap_w" (the enforced limit sampled, else ``cap``), "ratio",
    "samples", "capped_ratio" (samples at the software power cap: the expected reason)}; {} without
    a window or a number."""
    if not (isinstance(window, (list, tuple)) and len(window) == 2 and all(isinstance(t, (int, float)) for t in window)):
        return {}
    lo, hi = window[0] + min(POWER_RAMP_S, (window[1] - window[0]) * 0.2), window[1]
    inside = [r for r in rows if isinstance(r.get("t"), (int, float)) and lo <= r["t"] <= hi]
    draws = [r["power.draw"] for r in inside if isinstance(r.get("power.draw"), (int, float)) and not isinstance(r["power.draw"], bool)]
    caps = sorted(r["enforced.power.limit"] for r in inside if isinstance(r.get("enforced.power.limit"), (int, float))
                  and not isinstance(r["enforced.power.limit"], bool) and r["enforced.power.limit"] > 0)
    cap_w = caps[len(caps) // 2] if caps else cap if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    if not draws:
        return {"samples": 0, "cap_w": cap_w}
    mean = sum(draws) / len(draws)
    capped = sum(1 for r in inside if isinstance(r.get("events"), int) and r["events"] & 0x4)
    return {"mean_w": round(mean, 1), "cap_w": cap_w, "ratio": round(mean / cap_w, 3) if cap_w else None,
            "samples": len(draws), "capped_ratio": round(capped / len(inside), 3) if inside else None}


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def sibling_key(rec: dict) -> tuple:
    """What makes two cards' GEMM digests and throughput comparable: the product (name, SM count),
    the driver, cuBLAS's version, the operand type and the load."""
    gemm = rec.get("gemm") or {}
    return (rec.get("name"), gemm.get("sms"), (rec.get("key") or {}).get("driver"), gemm.get("cublas"),
            gemm.get("dtype"), gemm.get("load"))


def siblings(records: dict[str, dict], opts: dict) -> None:
    """Judge each card of this run against its siblings of one :func:`sibling_key` (pure on the
    records, which it amends): a digest other than the one most cards computed fails the card, naming
    both (no majority: every card of the tie fails); a throughput below ``slow_quarantine_ratio`` of
    the others' median fails it, below ``slow_flag_ratio`` flags it: TFLOPS against the siblings at
    the same cap, TFLOPS per watt where none is at the same cap."""
    groups: dict[tuple, list[str]] = {}
    for u, rec in records.items():
        if (rec.get("gemm") or {}).get("digest"):
            groups.setdefault(sibling_key(rec), []).append(u)
    for members in groups.values():
        if len(members) < 2:
            continue
        counts: dict[str, int] = {}
        for u in members:
            counts[records[u]["gemm"]["digest"]] = counts.get(records[u]["gemm"]["digest"], 0) + 1
        top = max(counts.values())
        winners = [d for d, n in counts.items() if n == top]
        for u in members:
            rec, mine = records[u], records[u]["gemm"]["digest"]
            if len(winners) == 1 and mine == winners[0]:
                continue
            if len(winners) == 1:
                why = (f"GEMM: digest {mine[:16]} differs from {winners[0][:16]}, what {top} of its {len(members) - 1} "
                       f"siblings (same product, driver and cuBLAS) computed from the same seeded operands: wrong results")
            else:
                why = (f"GEMM: digest {mine[:16]} differs from its siblings' ({', '.join(sorted(d[:16] for d in counts if d != mine))}) "
                       f"with no majority among {len(members)} cards")
            rec["failed"].append(why)
            rec["passed"] = False
        for u in members:
            slow(records[u], [records[v] for v in members if v != u], opts)


def slow(rec: dict, others: list[dict], opts: dict) -> None:
    gemm = rec["gemm"]
    cap = (rec.get("power") or {}).get("cap_w")
    same = [o["gemm"]["tflops"] for o in others if (o.get("power") or {}).get("cap_w") == cap and o["gemm"].get("tflops")]
    if same and gemm.get("tflops"):
        ratio, what = gemm["tflops"] / median(same), f"{gemm['tflops']} TFLOPS"
    else:
        per_w = [o["gemm"]["tflops_per_w"] for o in others if o["gemm"].get("tflops_per_w")]
        if not per_w or not gemm.get("tflops_per_w"):
            return
        ratio, what = gemm["tflops_per_w"] / median(per_w), f"{gemm['tflops_per_w']} TFLOPS per watt"
    gemm["sibling_ratio"] = round(ratio, 3)
    text = f"GEMM: {what}, {ratio:.2f} of its siblings' median"
    if ratio < opts["slow_quarantine_ratio"]:
        rec["failed"].append(f"{text} (at least {opts['slow_quarantine_ratio']:.2f} wanted): a slow card")
        rec["passed"] = False
    elif ratio < opts["slow_flag_ratio"]:
        rec.setdefault("flagged", []).append(f"{text} (below {opts['slow_flag_ratio']:.2f}: watch it)")


# ---------------------------------------------------------------- nvidia-smi
def run_bounded(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, stdout and stderr) of ``argv``, killed with its process group past ``timeout``."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
    except OSError as e:
        return 127, str(e)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, KILL)
        except OSError:
            pass
        return None, ""


# rigup.boundary.numbers's rule by hand (this program ships alone; tests/unit/test_burnin_round9.py holds
# _num to numbers.number): ASCII digits, an optional sign and point, no leading zero, no exponent, at most 18
# digits before the point and 12 after (so finite); blanks taken off are ASCII's alone (str.strip() takes U+0085)
NUMBER = re.compile(r"[+-]?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,12})?")
HEX_WORD = re.compile(r"0x[0-9A-Fa-f]{1,16}")   # nvidia-smi's pci.device_id and event masks
BLANK = " \t\r\n\f\v"
TEXT_FIELDS = ("uuid", "pci.bus_id", "name", "driver_version")   # nvidia-smi's cells that are names, not numbers


def _num(text: str) -> int | float | None:
    """A number nvidia-smi (or sysfs) printed: the boundary's rule (int() and float() took "٣" as 3,
    "1_0" as 10, "0350" as 350 and "1.0e999" as inf: a card's memory.total inf, its time bound inf and
    burnin.json's Infinity, round 9 H3), or a hex word of at most 16 digits; else None."""
    text = text.strip(BLANK)
    if NUMBER.fullmatch(text):
        value = float(text) if "." in text else int(text)
        return value if abs(value) < 1e18 else None
    return int(text, 16) if HEX_WORD.fullmatch(text) else None


def _cell(field: str, text: str):
    """nvidia-smi's cell of ``field``: a name's text (None for its words for no value: [N/A]), else :func:`_num`."""
    if field not in TEXT_FIELDS:
        return _num(text)
    text = text.strip(BLANK)
    return None if text.startswith("[") or text in ("N/A", "") else text


def query(fields: list[str], ids: str | None = None) -> list[dict] | None:
    """``nvidia-smi --query-gpu`` of ``fields`` per card (values numbers where they are), or None
    when it fails or does not answer."""
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if ids:
        argv[1:1] = ["-i", ids]
    rc, out = run_bounded(argv, SMI_TIMEOUT_S)
    if rc != 0:
        return None
    rows = []
    for line in out.split("\n"):   # str.splitlines() cuts at U+0085 and U+2028 too: a cell's tail a line
        cols = line.split(",")
        if len(cols) == len(fields):
            rows.append({f: _cell(f, c) for f, c in zip(fields, cols)})
    return rows


CARD_FIELDS = ["index", "uuid", "pci.bus_id", "name", "driver_version", "memory.total", "power.limit",
               "pcie.link.gen.max", "pcie.link.width.max", "pcie.link.gen.current", "pcie.link.width.current",
               "pci.device_id"]
# Cards whose product cuts FP16 tensor and FMA throughput (mining cards, by PCI id): a GEMM does not
# load them to their cap, and no measured load that does is recorded yet (the reports' figures are
# decode draws: peaks of 158-235 W per card at a 100 W cap, decode flat above 180 W; docs/burnin.md).
# The soak runs as elsewhere (its digests and speed judged against the card's siblings); its watts
# are recorded, not judged, so that a fleet of them is not quarantined by a rule its load cannot meet.
NO_TENSOR = {0x20C210DE: "CMP 170HX"}   # nvidia-smi's pci.device_id (device << 16 | vendor), read as a number
HEALTH_FIELDS = ["ecc.errors.uncorrected.volatile.total", "remapped_rows.pending", "remapped_rows.failure",
                 "retired_pages.pending"]
SAMPLE_FIELDS = ["uuid", "temperature.gpu", "clocks.current.sm", "power.draw", "utilization.gpu", "enforced.power.limit"]
EVENT_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")   # newer drivers, older


def cards() -> list[dict]:
    rows = query(CARD_FIELDS)
    if rows is None:
        raise SystemExit("rigup-burnin: nvidia-smi does not answer: no card can be tested")
    return rows


def health(uuid: str) -> dict:
    """The card's error counters and recovery action; a counter the card lacks is None."""
    rows = query(HEALTH_FIELDS, uuid) or [{f: None for f in HEALTH_FIELDS}]
    out = dict(rows[0])
    rc, text = run_bounded(["nvidia-smi", "-q", "-i", uuid], SMI_TIMEOUT_S)
    m = re.search(r"^\s*GPU Recovery Action\s*:\s*(.+?)\s*$", text or "", re.M) if rc == 0 else None
    out["recovery_action"] = m.group(1) if m else None
    return out


def health_worse(before: dict, after: dict) -> list[str]:
    """What got worse between two :func:`health` reads, or is bad now (pure)."""
    worse = []
    a, b = before.get(HEALTH_FIELDS[0]), after.get(HEALTH_FIELDS[0])
    if isinstance(a, int) and isinstance(b, int) and b > a:
        worse.append(f"{b - a} new uncorrected ECC errors")
    for field, text in (("remapped_rows.pending", "a row remap is pending (a reset applies it)"),
                        ("remapped_rows.failure", "a row remap failed"),
                        ("retired_pages.pending", "a page retirement is pending")):
        if str(after.get(field)).lower() in ("yes", "1"):
            worse.append(text)
    action = after.get("recovery_action")
    if action and action.lower() not in ("none", "n/a"):
        worse.append(f"the driver asks for recovery: {action}")
    return worse


def samples_of(buses: dict[str, str], instant: bool = False) -> dict[str, dict]:
    """One sample per card of ``buses`` ({uuid: bus id}): temperature, SM clock, power,
    utilisation, throttle mask; a card nvidia-smi says it cannot reach is ``{"lost": its line}``.
    ``instant``: the draw is ``power.draw.instant`` where the driver has it (the pulse: the
    1 s average of ``power.draw`` on Hopper and later hides a 4 Hz step), its name in ``draw``."""
    uuids = list(buses)
    rc, out, draw = None, "", "power.draw"
    tries = [(d, e) for d in (("power.draw.instant", "power.draw") if instant else ("power.draw",)) for e in EVENT_FIELDS]
    for draw, events in tries:
        fields = [draw if f == "power.draw" else f for f in SAMPLE_FIELDS]
        argv = ["nvidia-smi", "-i", ",".join(uuids), f"--query-gpu={','.join(fields)},{events}",
                "--format=csv,noheader,nounits"]
        rc, out = run_bounded(argv, SMI_TIMEOUT_S)
        if rc == 2 and "field" in out.lower():
            continue   # this driver names the throttle reasons the other way, or has no instant draw
        break
    found = {}
    for line in (out or "").split("\n"):
        cols = line.split(",")
        if len(cols) == len(SAMPLE_FIELDS) + 1:
            row = {f: _cell(f, c) for f, c in zip(SAMPLE_FIELDS + ["events"], cols)}
            found[row["uuid"]] = {**row, "draw": draw} if instant else row
        m = re.search(r"GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s*:\s*Unknown Error", line)
        if m:
            for uuid, bus in buses.items():
                if bus.lower()[-12:] == m.group(1).lower()[-12:]:
                    found[uuid] = {"lost": line.strip()[:160]}
    return found


def busy_cards(all_uuids: list[str]) -> dict[str, str]:
    """Cards something uses now: {uuid: what}: a compute process, or an active serving unit whose
    CUDA_VISIBLE_DEVICES has it (a unit without it has every card)."""
    busy = {}
    rc, out = run_bounded(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"], SMI_TIMEOUT_S)
    if rc == 0:
        for line in out.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) == 2 and cols[0] in all_uuids:
                busy[cols[0]] = f"process {cols[1]}"
    if not shutil.which("systemctl"):
        return busy
    rc, out = run_bounded(["systemctl", "list-units", "--state=active", "--plain", "--no-legend", *UNITS], 20)
    units = [line.split()[0] for line in (out or "").splitlines() if line.strip()] if rc == 0 else []
    if not units:
        return busy
    rc, out = run_bounded(["systemctl", "show", "-p", "Id,Environment", *units], 20)   # every unit in one call
    for unit, named in unit_devices(out if rc == 0 else "").items():
        for uuid in all_uuids:
            if named is None or uuid in named or any(not d.startswith("GPU-") for d in named):
                busy.setdefault(uuid, unit)
    return busy


def unit_devices(shown: str) -> dict[str, list[str] | None]:
    """``systemctl show -p Id,Environment U...`` -> {unit: its CUDA_VISIBLE_DEVICES entries, or None
    (every card)}. roles/burnin/facts.py reads the same output in preflight's round trip."""
    out, unit, devices = {}, None, None
    for line in shown.splitlines() + [""]:
        key, _, value = line.partition("=")
        if not line.strip() or key == "Id":   # a unit's block ends at a blank line, or at the next Id
            if unit:
                out[unit] = devices
            unit, devices = (value.strip() or None) if key == "Id" else None, None
        elif key == "Environment":
            m = re.search(r"(?:^|\s)CUDA_VISIBLE_DEVICES=(\S*)", value)
            devices = [d for d in m.group(1).split(",") if d] if m else None
    return out


def pci_name(bus_id: str) -> str:
    """nvidia-smi's ``00000000:07:00.0`` as sysfs and CUDA name it: ``0000:07:00.0``."""
    return bus_id.lower()[-12:]


def numa_cpus(bus_id: str) -> set[int] | None:
    """The CPUs of the card's NUMA node (sysfs), or None when the node is not known."""
    try:
        with open(f"/sys/bus/pci/devices/{pci_name(bus_id)}/numa_node") as f:
            node = _num(f.read(64))
        if type(node) is not int or node < 0:
            return None
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            spec = f.read(1 << 16).strip(BLANK)
    except (OSError, ValueError):
        return None
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        lo, hi = _num(lo), _num(hi or lo)
        if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi < 1 << 20:
            return None   # not the kernel's list of CPU ranges
        cpus.update(range(lo, hi + 1))
    return cpus or None


# ---------------------------------------------------------------- the CUDA driver API (ctypes)
class CudaError(Exception):
    def __init__(self, code: int, what: str, name: str = ""):
        super().__init__(f"CUDA error {code}{' ' + name if name else ''} in {what}")
        self.code = code


class BlasError(CudaError):
    """cuBLAS refused a call (its status): the host's cuBLAS, not the card."""


LOST_CODES = {101, 999, 700, 719, 46, 3, 4}   # invalid device, unknown, illegal address, launch failed, busy, not initialised, deinitialised


class Device:
    """One card through libcuda: a context, device memory, pinned host memory and the PTX kernels."""

    def __init__(self, bus_id: str):
        path, why = libcuda()
        if path is None:
            raise OSError(why)
        for first in runtime(path, runtime_names(path))[0]:   # its JIT's, by their checked paths (RUNTIME)
            ctypes.CDLL(first, mode=ctypes.RTLD_GLOBAL)
        self.lib = lib = ctypes.CDLL(path)
        u64, sz, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
        for name, args in (("cuMemAlloc_v2", [ctypes.POINTER(u64), sz]), ("cuMemFree_v2", [u64]),
                           ("cuMemsetD32_v2", [u64, ctypes.c_uint, sz]),
                           ("cuMemcpyHtoD_v2", [u64, vp, sz]), ("cuMemcpyDtoH_v2", [vp, u64, sz]),
                           ("cuMemGetInfo_v2", [ctypes.POINTER(sz), ctypes.POINTER(sz)]),
                           ("cuMemHostAlloc", [ctypes.POINTER(vp), sz, ctypes.c_uint]), ("cuMemFreeHost", [vp]),
                           ("cuMemcpyDtoDAsync_v2", [u64, u64, sz, vp]), ("cuStreamCreate", [ctypes.POINTER(vp), ctypes.c_uint]),
                           ("cuStreamSynchronize", [vp]), ("cuEventCreate", [ctypes.POINTER(vp), ctypes.c_uint]),
                           ("cuEventRecord", [vp, vp]), ("cuEventQuery", [vp]), ("cuStreamQuery", [vp]),
                           ("cuEventElapsedTime", [ctypes.POINTER(ctypes.c_float), vp, vp]),
                           ("cuLaunchKernel", [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                               ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp, vp, vp])):
            getattr(lib, name).argtypes = args
        self.call("cuInit", 0)
        dev = ctypes.c_int()
        self.call("cuDeviceGetByPCIBusId", ctypes.byref(dev), pci_name(bus_id).encode())
        self.dev = dev.value
        self.ctx = ctypes.c_void_p()    # the device's primary context: the same call since CUDA 7
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.call("cuCtxSetCurrent", self.ctx)
        sms = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(sms), 16, self.dev)   # MULTIPROCESSOR_COUNT
        self.sms = max(1, sms.value)
        self.module = ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(self.module), ctypes.c_char_p(PTX.encode() + b"\0"))
        self.kernels = {}
        for name in ("fill", "check", "burn", "rand"):
            fn = ctypes.c_void_p()
            self.call("cuModuleGetFunction", ctypes.byref(fn), self.module, name.encode())
            self.kernels[name] = fn
        major = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(major), 75, self.dev)   # COMPUTE_CAPABILITY_MAJOR
        self.major = major.value
        self.tensor = None   # why the soak has no tensor-core load of its own, or None once mma_mem is loaded
        if major.value < 8:
            self.tensor = f"compute capability {major.value}.x: no mma.sync m16n8k16"
        else:
            module, fn = ctypes.c_void_p(), ctypes.c_void_p()
            try:
                self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(MMA_PTX.encode() + b"\0"))
                self.call("cuModuleGetFunction", ctypes.byref(fn), module, b"mma_mem")
                self.kernels["mma_mem"] = fn
            except CudaError as e:   # the integer soak still runs; the result says why not this one
                self.tensor = f"mma_mem not loaded: {e}"

    def call(self, name: str, *args):
        rc = getattr(self.lib, name)(*args)
        if rc:
            text = ctypes.c_char_p()
            try:
                self.lib.cuGetErrorName(rc, ctypes.byref(text))
            except AttributeError:
                pass
            raise CudaError(rc, name, (text.value or b"").decode(errors="replace"))

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc(self, size: int) -> int | None:
        ptr = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(ptr), size)
        if rc == 2:    # CUDA_ERROR_OUT_OF_MEMORY: the caller takes less
            return None
        if rc:
            self.call("cuMemAlloc_v2", ctypes.byref(ptr), size)   # raises, naming it
        return ptr.value

    def launch(self, name: str, grid: int, block: int, *params, stream=None):
        holders = [p if isinstance(p, (ctypes.c_uint64, ctypes.c_uint32)) else ctypes.c_uint64(p) for p in params]
        arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in holders])
        self.call("cuLaunchKernel", self.kernels[name], grid, 1, 1, block, 1, 1, 0, stream, arr, None)

    def rand(self, ptr: int, words: int, seed: int, operand: str, stream) -> None:
        """``words`` random ``operand`` values at ``ptr`` (:data:`RAND_PTX`), queued on ``stream``."""
        mask, bits = OPERANDS[operand]
        self.launch("rand", self.sms * 8, 256, ptr, words, ctypes.c_uint32(seed), ctypes.c_uint32(mask),
                    ctypes.c_uint32(bits), stream=stream)

    def stream(self) -> ctypes.c_void_p:
        """A stream that does not wait for the legacy default one (nor it for this): the soak's load,
        its HBM copies and the digest's copy back run at once."""
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), 1)   # CU_STREAM_NON_BLOCKING
        return s

    def sync_stream(self, stream) -> None:
        self.call("cuStreamSynchronize", stream)

    def event(self) -> ctypes.c_void_p:
        e = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(e), 0)   # timed
        return e

    def elapsed_s(self, start, end) -> float:
        ms = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value / 1000

    def sync(self):
        self.call("cuCtxSynchronize")


def vram_pass(dev: Device, fraction: float, patterns: int) -> dict:
    free, total = dev.mem_info()
    want = int(free * fraction) // 4 * 4
    chunks, got, size = [], 0, CHUNK
    while got < want and size >= (64 << 20):
        size = min(size, want - got)
        ptr = dev.alloc(size)
        if ptr is None:    # fragmented near the end: smaller chunks
            size //= 2
            continue
        chunks.append((ptr, size))
        got += size
    counter = dev.alloc(4)
    dev.call("cuMemsetD32_v2", counter, 0, 1)
    grid, block = dev.sms * 8, 256
    for p in range(patterns):
        base = PATTERNS[(2 * p) % len(PATTERNS)] if p < len(PATTERNS) // 2 else random.getrandbits(32)
        for pattern in (base, base ^ 0xFFFFFFFF):     # a pattern and its inverse: every bit both ways
            for k, (ptr, size) in enumerate(chunks):
                dev.launch("fill", grid, block, ptr, size // 4, ctypes.c_uint32(chunk_seed(pattern, k)))
            dev.sync()
            for k, (ptr, size) in enumerate(chunks):
                dev.launch("check", grid, block, ptr, size // 4, ctypes.c_uint32(chunk_seed(pattern, k)), counter)
            dev.sync()
    bad = ctypes.c_uint32()
    dev.call("cuMemcpyDtoH_v2", ctypes.byref(bad), counter, 4)
    for ptr, _ in chunks:
        dev.lib.cuMemFree_v2(ptr)
    dev.lib.cuMemFree_v2(counter)
    return {"mib": got >> 20, "free_mib": free >> 20, "total_mib": total >> 20, "patterns": patterns,
            "mismatches": bad.value}


def pcie_pass(dev: Device, gen_max, width_max, gen, width) -> dict:
    host = ctypes.c_void_p()
    dev.call("cuMemHostAlloc", ctypes.byref(host), PCIE_BYTES, 0)
    ptr = dev.alloc(PCIE_BYTES)
    if ptr is None:
        dev.lib.cuMemFreeHost(host)
        return {"error": "PCIe: no device memory for the copy"}
    ctypes.memset(host, 0x5A, PCIE_BYTES)
    times = {}
    for way in ("h2d", "d2h"):
        copy = (lambda: dev.call("cuMemcpyHtoD_v2", ptr, host, PCIE_BYTES)) if way == "h2d" else \
            (lambda: dev.call("cuMemcpyDtoH_v2", host, ptr, PCIE_BYTES))
        copy()    # warm-up
        dev.sync()
        for _ in range(PCIE_ROUNDS):
            t0 = time.perf_counter()
            for _ in range(PCIE_COPIES):
                copy()
            dev.sync()
            times[way] = min(times.get(way, float("inf")), time.perf_counter() - t0)
    dev.lib.cuMemFree_v2(ptr)
    dev.lib.cuMemFreeHost(host)
    gbps = {w: PCIE_BYTES * PCIE_COPIES / t / 1e9 for w, t in times.items()}
    allowed = pcie_allowed_gbps(gen_max, width_max)
    slow = min(gbps.values())
    return {"h2d_gbps": round(gbps["h2d"], 2), "d2h_gbps": round(gbps["d2h"], 2), "gbps": round(slow, 2),
            "allowed_gbps": allowed, "ratio": round(slow / allowed, 3) if allowed else None,
            "gen_max": gen_max, "width_max": width_max, "gen": gen, "width": width}


def burn_once(dev: Device, out: int, n: int, iters: int) -> bytes:
    block = 256
    dev.launch("burn", (n + block - 1) // block, block, out, ctypes.c_uint32(n), ctypes.c_uint32(iters))
    buf = ctypes.create_string_buffer(n * 4)
    dev.call("cuMemcpyDtoH_v2", buf, out, n * 4)
    return buf.raw


def compute_check(dev: Device, out: int, n: int, first: bytes | None = None) -> dict:
    """The integer workload once: a sample of its threads against the reference computed here, the
    whole against ``first`` (an earlier launch's) when given."""
    got = burn_once(dev, out, n, COMPUTE_ITERS)
    words = memoryview(got).cast("I")
    sample = random.sample(range(n), min(COMPUTE_SAMPLE, n))
    wrong = sum(1 for i in sample if words[i] != burn_reference(i, COMPUTE_ITERS))
    checked = len(sample)
    if first is not None:
        checked += n
        if got != first:
            wrong += sum(1 for a, b in zip(words, memoryview(first).cast("I")) if a != b)
    return {"threads": n, "iters": COMPUTE_ITERS, "checked": checked, "wrong": wrong, "raw": got}


def compute_and_soak(dev: Device, opts: dict) -> tuple[dict, dict, dict]:
    """The integer check before and after the soak (a card that answers wrong once hot), and the
    soak: (compute, soak, gemm) figures."""
    n = dev.sms * 2048
    out = dev.alloc(n * 4)
    if out is None:
        return {"error": "compute: no device memory"}, {}, {}
    compute = compute_check(dev, out, n)
    load, why = pick_load(dev, opts.get("load") or "auto")
    gemm = soak_load(dev, load, opts["soak_s"])
    load.free()
    if why:
        gemm["why"] = why
    again = compute_check(dev, out, n, compute.pop("raw"))
    again.pop("raw")
    dev.lib.cuMemFree_v2(out)
    compute["wrong"] += again["wrong"]
    compute["checked"] += again["checked"]
    soak = {"launches": gemm.get("launches"), "seconds": gemm.get("seconds"), "load": gemm.get("load")}
    return compute, soak, gemm


# ---------------------------------------------------------------- the soak's load
# cuBLAS of the host (cuda_toolkit installs it on GPU hosts; Debian 12's libcublas11; the
# nvidia-cublas wheel's copy), by soname, newest first, where the toolkits and wheels put it: found
# and loaded with ctypes as libcuda is (no package on the host); LD_LIBRARY_PATH's directories
# first, as the loader would. Never by bare soname: the loader's search (its cache of ld.so.conf's
# directories, /usr/local/lib among them) may answer with a file no one checked.
#
# The loader also searches for every library a loaded one needs (cuBLAS: libcublasLt, libstdc++, librt...):
# LD_LIBRARY_PATH as it was when the process started (a change to os.environ later moves no dlopen), then
# ld.so.cache. Root's checked cuBLAS needing a library another user put in an LD_LIBRARY_PATH directory
# the check skipped ran their code as root (round 7b L1, L2), so rigup-burnin starts again with only the
# directories :func:`searched` passes (:func:`loader_path_checked`), before it loads anything: each one and
# every file in it (round 8 L2: root's link there to another user's file); cuBLAS's own directory likewise
# (a RUNPATH of $ORIGIN has the loader search it). What is left is ld.so.cache, the loader's for every
# program on the host: root's ldconfig lists the files it found in ld.so.conf's directories, where Debian's
# first is /usr/local/lib (2775 root:staff: a staff user's file there is listed at the next ldconfig). A
# library listed there is no more trusted than its directory: before rigup-burnin loads a library, the
# loader itself says where each library it needs resolves (:func:`needs_alone`: its trace, as ldd's, which
# maps and runs nothing), and every one of them must pass :func:`alone` too, or the library is not loaded.
CUBLAS = ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11")
CUBLAS_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/*/lib", "/usr/local/cuda-*/lib64",
               "/usr/local/cuda-*/targets/*/lib", "/usr/lib/*-linux-gnu", "/usr/local/lib",
               "/usr/local/lib/python3*/dist-packages/nvidia/cu*/lib", "/usr/lib/python3/dist-packages/nvidia/cu*/lib",
               "/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib")
# where the driver installs libcuda.so.1 (Debian's libcuda1, Ubuntu's and NVIDIA's libnvidia-compute, the .run
# installer), after LD_LIBRARY_PATH's checked directories: by its path, never the loader's search by soname
LIBCUDA = "libcuda.so.1"
DRIVER_DIRS = (f"/usr/lib/{getattr(sys.implementation, '_multiarch', '') or '*-linux-gnu'}",
               f"/usr/lib/{getattr(sys.implementation, '_multiarch', '') or '*-linux-gnu'}/nvidia/current",
               "/usr/lib64", "/usr/lib")
# the dynamic loader, which says where a library's needs resolve (its trace, as ldd's)
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib/*-linux-gnu/ld-linux*.so.[0-9]",
           "/usr/lib/*-linux-gnu/ld-linux*.so.[0-9]")
# What libcuda and cuBLAS dlopen BY NAME while they run, which no trace of their DT_NEEDED shows (round 10/11 BU1):
# the loader searches for each (RUNPATH, LD_LIBRARY_PATH, ld.so.cache with Debian's /usr/local/lib first, its
# default directories), and another user's file it finds runs its code as root. libcuda: the PTX JIT (every kernel
# here is PTX) and its compilers (libnvidia-container's list of what libcuda uses), the debugger's and confidential
# computing's libraries; {v} the driver's version (:func:`runtime_names`). cuBLASLt may compile kernels through NVRTC
# ({v}: its soname's major), and libnvrtc in turn its builtins, libnvrtc-builtins.so.MAJOR.MINOR (round 13 BU2:
# :func:`nvrtc_builtins`). cuBLAS's static CUDA runtime dlopens libcuda.so.1, loaded by path before it (Device).
# A name none of the loader's places holds is no refusal: libcuda does without it or fails its own way.
RUNTIME = ("libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.{v}", "libnvidia-nvvm.so.4",
           "libnvidia-nvvm.so.{v}", "libnvidia-nvvm70.so.4", "libnvidia-gpucomp.so.{v}",
           "libnvidia-fatbinaryloader.so.{v}", "libnvidia-tileiras.so.{v}", "libcudadebugger.so.1",
           "libcudadebugger.so.{v}", "libnvidia-pkcs11.so.{v}", "libnvidia-pkcs11-openssl3.so.{v}")
CUBLAS_RUNTIME = ("libnvrtc.so.{v}", "libnvJitLink.so.{v}")
# the JIT's libraries, which every run's PTX needs: those beside libcuda's real path (the driver installs them
# together) are loaded by that path first, so libcuda's dlopen by soname finds them loaded and searches nothing;
# NVRTC's builtins likewise beside libnvrtc's real path (the toolkit and the wheel install them together)
PINNED = ("libnvidia-ptxjitcompiler.", "libnvidia-nvvm", "libnvidia-gpucomp.", "libnvidia-fatbinaryloader.",
          "libnvrtc-builtins.")
NVRTC = re.compile(r"libnvrtc\.so\.([0-9]{1,4})(?:\.([0-9]{1,4})(?:\.[0-9]{1,6})*)?")   # libnvrtc.so.12(.4.127)
NVRTC_BUILTINS = re.compile(r"libnvrtc-builtins\.so\.[0-9]{1,4}\.[0-9]{1,4}")
DRIVER_VERSION = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}")
GEMM_N = 8192            # m = n = k: each GEMM 2 * 8192**3 flops (the field's and gpu-burn's size)
GEMM_SEEDS = 3           # the seeded operand pairs the soak cycles through: each result digested, compared
BATCH_S = 1.0            # GPU time a batch takes (the one before digested meanwhile)
HBM_BYTES = 512 << 20    # each copy of the concurrent HBM stream
HBM_ROUND = 16           # copies queued at a time (about 6 ms of an H100's HBM)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUBLAS_COMPUTE_32F = 0, 2, 14, 68   # library_types.h, cublas_api.h


def cublas_candidates() -> tuple[list[tuple[str, str]], list[str]]:
    """([(a library's real path, its libcublasLt's beside it)] of CUBLAS's files in LD_LIBRARY_PATH's
    directories and CUBLAS_DIRS that :func:`alone` passes, in a directory :func:`searched` passes, with
    the libcublasLt of its soname beside it (llama.cpp's CUDA build links both: a cuBLAS without it is
    not the one that serves) passing too, newest soname first; [why each other one is skipped])."""
    import glob
    found, skipped, dirs = [], [], {}
    first = [glob.escape(d) for d in re.split("[:;]", os.environ.get("LD_LIBRARY_PATH", ""))
             if d.startswith("/") and "$" not in d]
    for name in CUBLAS:
        ordered = [p for d in first for p in glob.glob(os.path.join(d, name))]
        for path in ordered + sorted({p for d in CUBLAS_DIRS for p in glob.glob(os.path.join(d, name))} - set(ordered)):
            real, why = alone(path)
            if why is None:   # its directory, where a RUNPATH of $ORIGIN has the loader find cuBLAS's needs
                here = os.path.dirname(real)
                why = dirs[here] if here in dirs else dirs.setdefault(here, searched(here)[1])
            lt = os.path.join(os.path.dirname(real), name.replace("libcublas.", "libcublasLt."))
            if why is None:
                lt, why = alone(lt) if os.path.lexists(lt) else \
                    (lt, f"its {os.path.basename(lt)} is not beside it (llama.cpp's CUDA build links both)")
            if why is not None:
                skipped.append(f"rigup-burnin: cuBLAS {path} skipped: {why} (root loads no library another user can replace)")
            elif (real, lt) not in found:
                found.append((real, lt))
    return found, skipped


def loader() -> str | None:
    """The dynamic loader's real path (the first of LOADERS that :func:`alone` passes), or None."""
    import glob
    for pattern in LOADERS:
        for path in sorted(glob.glob(pattern)):
            real, why = alone(path)
            if why is None:
                return real
    return None


def traced(path: str, preload: tuple[str, ...] = ()) -> tuple[list[tuple[str, str]], str | None]:
    """([(each library the loader maps for ``path`` and ``preload``, where it finds it: a path or "not
    found")], None), or ([], why not): the loader's trace (LD_TRACE_LOADED_OBJECTS, ldd's: it maps the
    libraries and runs none of their code; LD_WARN: each need not found is a line too). ``preload``: as
    :func:`needs_alone`'s."""
    ld = loader()
    if ld is None:
        return [], f"no dynamic loader where only root writes ({', '.join(LOADERS)}): what {path} needs is not known"
    env = {**os.environ, "LD_TRACE_LOADED_OBJECTS": "1", "LD_WARN": "yes"}
    if preload:   # names from RUNTIME and a checked version (no blank, no colon); the process's own kept first
        env["LD_PRELOAD"] = " ".join([*env.get("LD_PRELOAD", "").split(), *preload])
    try:
        r = subprocess.run([ld, path], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, errors="replace",
                           stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return [], f"{ld} {path}: {e}"
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0 or not lines:
        return [], f"{ld} {path}: {(r.stderr or r.stdout).strip()[:200] or f'exit {r.returncode}'}"
    found = []
    for line in lines:
        name, arrow, where = line.partition(" => ")
        found.append((name, (where if arrow else name).rsplit(" (0x", 1)[0].strip()))
    return found, None


def needs_alone(path: str, preload: tuple[str, ...] = ()) -> str | None:
    """None when every library ``path`` needs, as the loader resolves it for this process (RUNPATH,
    LD_LIBRARY_PATH, ld.so.cache, its default directories), passes :func:`alone`; else why not, naming
    the first that does not (or one not found). The loader's trace (:func:`traced`) maps the libraries and
    runs none of their code: an ld.so.cache that lists /usr/local/lib (2775 root:staff on Debian) first, or any
    other directory another user writes, makes no library there one root loads. ``preload``: paths and names
    the loader maps first (LD_PRELOAD), a name found where ``path``'s own dlopen would find it (its RUNPATH
    too), or not at all (no line: the loader says so on stderr and goes on); a name an object mapped before
    it has as its soname is that object, searched for nowhere, as in the process that loads them."""
    found, why = traced(path, preload)
    for name, where in found:
        if where == "not found":
            return f"{path} needs {name}, which the loader does not find"
        if "/" in where:
            refused = alone(where)[1] if where.startswith("/") else "not an absolute path"
            if refused is not None:
                return f"{path} {'loads' if name in preload else 'needs'} {name}, which the loader finds at {where}: {refused}"
    return why


@functools.lru_cache(maxsize=None)
def runtime_names(path: str) -> tuple[str, ...]:
    """RUNTIME's names for libcuda at ``path`` (its real path): {v} the driver's version, from its own file
    name (libcuda.so.580.95.05, as every driver package installs it), else from nvidia-smi; the names with
    {v} are left out where neither says it."""
    v = os.path.basename(path).removeprefix("libcuda.so.")
    if not DRIVER_VERSION.fullmatch(v):
        rows = query(["driver_version"]) or [{}]
        v = str(rows[0].get("driver_version") or "")
    return tuple(n.format(v=v) for n in RUNTIME if "{v}" not in n or DRIVER_VERSION.fullmatch(v))


@functools.lru_cache(maxsize=None)
def runtime(path: str, names: tuple[str, ...], beside: str = "") -> tuple[tuple[str, ...], str | None]:
    """((the files to load by path before ``path``), None) or ((), why not): each of ``names`` that
    ``path`` dlopens while it runs found where the loader would find it for that dlopen, after PINNED's
    files beside ``path`` (its real path's directory; ``beside``: another, libnvrtc's for its builtins) are
    loaded, each of which and every one found must pass :func:`alone`, their needs too (:func:`needs_alone`,
    one trace). A PINNED file beside it is loaded first (RTLD_GLOBAL) so that the dlopen by its soname finds
    it loaded and searches nothing; one another user planted where the search looks (an ld.so.conf
    directory, LD_LIBRARY_PATH) refuses ``path`` where the search would reach it, naming the file. Before
    the workers fork."""
    pinned = []
    for name in names:
        here = os.path.join(beside or os.path.dirname(path), name)
        if name.startswith(PINNED) and os.path.lexists(here):
            real, why = alone(here)
            why = why or ("a blank or a colon in its path (LD_PRELOAD, the trace's, splits there)"
                          if re.search(r"[\s:]", real) else None)
            if why is not None:
                return (), f"{path} loads {name} ({f'beside {beside}' if beside else 'beside it'}): {why}"
            pinned += [real] if real not in pinned else []
    why = needs_alone(path, (*pinned, *names))
    return (tuple(pinned), None) if why is None else ((), why)


@functools.lru_cache(maxsize=None)
def nvrtc_builtins(lt: str, names: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """((the names of NVRTC's builtins), the directory of libnvrtc's real path), or ((), "") where ``lt``'s
    dlopen of ``names`` finds no libnvrtc: libnvrtc dlopens libnvrtc-builtins.so.MAJOR.MINOR by soname while
    it compiles (round 13 BU2), MAJOR.MINOR from the real file name of the libnvrtc the loader finds
    (libnvrtc.so.12.4.127 -> libnvrtc-builtins.so.12.4, as the toolkit installs it), else those of its
    major beside it (a wheel's file is libnvrtc.so.12 itself): :func:`runtime` loads one beside libnvrtc
    by its path first, and refuses one another user put where the search looks."""
    import glob
    where = next((w for n, w in traced(lt, names)[0] if NVRTC.fullmatch(n) and w.startswith("/")), "")
    real = os.path.realpath(where) if where else ""
    version = NVRTC.fullmatch(os.path.basename(real))
    if version is None:
        return (), ""
    here = os.path.dirname(real)
    if version[2] is not None:
        return (f"libnvrtc-builtins.so.{version[1]}.{version[2]}",), here
    found = glob.glob(os.path.join(glob.escape(here), f"libnvrtc-builtins.so.{version[1]}.*"))
    return tuple(sorted(n for n in map(os.path.basename, found) if NVRTC_BUILTINS.fullmatch(n))), here


def mapped_refused() -> list[str]:
    """Each file this process maps executable (/proc/self/maps) that :func:`alone` refuses, with why: the
    backstop after a run, naming code that none of the checks before loading named (a library dlopened
    by a name RUNTIME does not list). Every executable file mapping, whatever its name (round 13 BU3: one
    named evil.bin or libx.so.1a was not judged); a file deleted since it was mapped (an upgrade during
    the run, or a library that removed itself once loaded) is judged by the mapped inode itself
    (/proc/self/map_files, root's): root's own and written by no one else, or refused."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = [(cols[0], cols[5].rstrip("\n")) for cols in (line.split(None, 5) for line in f)
                    if len(cols) == 6 and "x" in cols[1] and cols[5].startswith("/")]
    except OSError as e:
        return [f"/proc/self/maps: {e.strerror or e}"]
    out, seen = [], set()
    for span, path in maps:
        if path in seen:
            continue
        seen.add(path)
        if path.endswith(" (deleted)"):
            try:
                st = os.stat(f"/proc/self/map_files/{span}")
            except OSError as e:
                out.append(f"{path}: its mapped file cannot be read ({e.strerror or e})")
                continue
            why = None if st.st_uid == 0 and not st.st_mode & 0o022 else \
                f"a deleted file of uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}"
        else:
            why = alone(path)[1]
        if why is not None:
            out.append(f"{path}: {why}")
    return sorted(out)


def backstop(fig: dict) -> None:
    """A worker's last look: a library mapped that :func:`alone` refuses is the card's error, named."""
    refused = mapped_refused()
    if refused:
        fig["error"] = "; ".join([*filter(None, [fig.get("error")]),
                                  f"mapped where another user writes (root ran its code): {'; '.join(refused[:8])}"])


@functools.lru_cache(maxsize=None)
def cublas_libraries() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """:func:`cublas_candidates`'s libraries (each with NVRTC's builtins to load by path first) whose every
    need passes :func:`needs_alone` too, and what they dlopen (:func:`runtime`, NVRTC's builtins:
    :func:`nvrtc_builtins`), each one skipped named on stderr once: called before the workers fork (they
    inherit the answer), not once per card."""
    found, skipped = cublas_candidates()
    kept = []
    for path, lt in found:
        major = re.match(r"libcublas\.so\.([0-9]{1,3})\b", os.path.basename(path))
        names = tuple(n.format(v=major.group(1)) for n in CUBLAS_RUNTIME) if major else ()
        why = needs_alone(lt) or needs_alone(path) or runtime(lt, names)[1]   # cuBLASLt's dlopen: its RUNPATH
        builtins, here = nvrtc_builtins(lt, names) if why is None else ((), "")
        first, why = runtime(lt, (*names, *builtins), here) if builtins else ((), why)
        if why is None:
            kept.append((path, lt, first))
        else:
            skipped.append(f"rigup-burnin: cuBLAS {path} skipped: {why} (root loads no library another user can replace)")
    for why in skipped:
        print(shown(why, 600), file=sys.stderr, flush=True)
    return tuple(kept)


@functools.lru_cache(maxsize=None)
def libcuda() -> tuple[str | None, str]:
    """(the real path of the driver's libcuda.so.1, "") or (None, why not): the first LIBCUDA in
    LD_LIBRARY_PATH's directories (checked at start: :func:`loader_path_checked`), then DRIVER_DIRS,
    that :func:`alone` passes and whose needs :func:`needs_alone` passes, and what it dlopens while it
    runs :func:`runtime` too; loaded by that path, never by its soname through the loader's search
    (ld.so.cache's /usr/local/lib first on Debian). Before the workers fork."""
    import glob
    tried = []
    dirs = [glob.escape(d) for d in re.split("[:;]", os.environ.get("LD_LIBRARY_PATH", "")) if d.startswith("/")
            and "$" not in d] + list(DRIVER_DIRS)
    for path in [p for d in dirs for p in sorted(glob.glob(os.path.join(d, LIBCUDA)))]:
        real, why = alone(path)
        why = why or needs_alone(real) or runtime(real, runtime_names(real))[1]
        if why is None:
            return real, ""
        tried.append(why)
    return None, (f"not loaded: {'; '.join(tried[:3])} (root loads no library another user can replace)" if tried
                  else f"not found in {', '.join(DRIVER_DIRS)} (the driver installs it)")


def find_cublas() -> tuple[ctypes.CDLL | None, str]:
    """(the library, its real path) or (None, why not): the first of :func:`cublas_libraries` that
    loads, NVRTC's builtins (by their checked paths) and its libcublasLt beside it loaded first (global)."""
    tried = []
    for path, lt, first in cublas_libraries():
        try:
            for pinned in first:
                ctypes.CDLL(pinned, mode=ctypes.RTLD_GLOBAL)
            ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(path)
            lib.cublasCreate_v2   # noqa: B018 - a library without it is not cuBLAS
            return lib, path
        except (OSError, AttributeError) as e:
            tried.append(f"{path}: {e}"[:160])
    return None, "no cuBLAS: " + ("; ".join(tried[:3]) or f"{'/'.join(CUBLAS)} not found where only root writes")


class Gemm:
    """The soak's load through cuBLAS: C = A B on random GEMM_N square operands, FP16 (compute
    capability 7.0 and later: tensor cores) into FP32 with FP32 accumulation (cublasGemmEx), else
    FP32 (cublasSgemm); two C buffers, one digested while the other is computed."""

    def __init__(self, dev: Device, lib: ctypes.CDLL, path: str):
        self.dev, self.lib, self.n = dev, lib, GEMM_N
        vp, i, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
        fp = ctypes.POINTER(ctypes.c_float)
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cublasDestroy_v2.argtypes = [vp]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasGetProperty.argtypes = [i, ctypes.POINTER(i)]
        lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, u64, i, i, u64, i, i, vp, u64, i, i, i, i]
        lib.cublasSgemm_v2.argtypes = [vp, i, i, i, i, i, fp, u64, i, u64, i, fp, u64, i]
        version = []
        for prop in (0, 1, 2):   # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int()
            self.status("cublasGetProperty", lib.cublasGetProperty(prop, ctypes.byref(v)))
            version.append(str(v.value))
        self.version, self.path = ".".join(version), path
        self.dtype = "fp16" if dev.major >= 7 else "fp32"
        self.handle = vp()
        self.status("cublasCreate_v2", lib.cublasCreate_v2(ctypes.byref(self.handle)))
        self.stream = dev.stream()
        self.status("cublasSetStream_v2", lib.cublasSetStream_v2(self.handle, self.stream))
        size = 2 if self.dtype == "fp16" else 4
        self.ab = [dev.alloc(self.n * self.n * size) for _ in range(2)]
        self.out = [dev.alloc(self.n * self.n * 4) for _ in range(2)]
        if None in self.ab + self.out:
            self.free()
            raise CudaError(2, "cuMemAlloc_v2 (the GEMM's operands)", "CUDA_ERROR_OUT_OF_MEMORY")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.flops, self.out_bytes = 2 * self.n ** 3, self.n * self.n * 4

    def status(self, what: str, rc: int) -> None:
        if rc:
            raise BlasError(rc, what, "CUBLAS_STATUS")

    def trial(self) -> None:
        """One GEMM: a cuBLAS that does not run on this card (cuBLAS 13 dropped compute capability
        below 7.5) says so here, and the soak takes the next load; the card is not failed for it."""
        try:
            self.fill(0)
            self.queue(0, 1)
        except BlasError:
            self.free()
            raise

    def fill(self, seed: int) -> None:
        words = self.n * self.n // (2 if self.dtype == "fp16" else 1)
        for k, ptr in enumerate(self.ab):
            self.dev.rand(ptr, words, 2 * seed + k, self.dtype, self.stream)

    def queue(self, c: int, count: int) -> None:
        a, b, n = self.ab[0], self.ab[1], self.n
        for _ in range(count):
            if self.dtype == "fp16":
                rc = self.lib.cublasGemmEx(self.handle, 0, 0, n, n, n, ctypes.byref(self.alpha), a, CUDA_R_16F, n,
                                           b, CUDA_R_16F, n, ctypes.byref(self.beta), self.out[c], CUDA_R_32F, n,
                                           CUBLAS_COMPUTE_32F, -1)   # CUBLAS_GEMM_DEFAULT: tensor cores where they are
            else:
                rc = self.lib.cublasSgemm_v2(self.handle, 0, 0, n, n, n, ctypes.byref(self.alpha), a, n, b, n,
                                             ctypes.byref(self.beta), self.out[c], n)
            self.status("cublasGemmEx" if self.dtype == "fp16" else "cublasSgemm_v2", rc)

    def free(self) -> None:
        for ptr in self.ab + self.out:
            if ptr:
                self.dev.lib.cuMemFree_v2(ptr)
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = None


class MemMma:
    """The soak's load without cuBLAS (:data:`MMA_PTX`): f16 tensor-core products of operands loaded
    from a buffer of random values, refilled per seed; GEMM-like figures (flops counted as mma.sync's)."""

    def __init__(self, dev: Device):
        self.dev, self.dtype, self.version, self.path = dev, "fp16", None, None
        self.grid, self.block = dev.sms * 4, 128
        self.stream = dev.stream()
        self.src = dev.alloc(MEM_WORDS * 4)
        self.out = [dev.alloc(self.grid * self.block * 16) for _ in range(2)]
        self.iters, self.out_bytes = 4096, self.grid * self.block * 16
        self.flops = 2 * 16 * 8 * 16 * MMA_CHAINS * self.iters * self.grid * self.block // 32
        if None in [self.src] + self.out:
            self.free()
            raise CudaError(2, "cuMemAlloc_v2 (mma_mem's buffers)", "CUDA_ERROR_OUT_OF_MEMORY")

    def fill(self, seed: int) -> None:
        self.dev.rand(self.src, MEM_WORDS, seed, "fp16", self.stream)

    def queue(self, c: int, count: int) -> None:
        for _ in range(count):   # every launch the same seeded sums: the last one's digested
            self.dev.launch("mma_mem", self.grid, self.block, self.src, self.out[c], ctypes.c_uint32(self.iters),
                            ctypes.c_uint32(MEM_WORDS - 1), stream=self.stream)

    def free(self) -> None:
        for ptr in [self.src] + self.out:
            if ptr:
                self.dev.lib.cuMemFree_v2(ptr)


def pick_load(dev: Device, wanted: str):
    """The soak's load: cuBLAS where the host has it, else :class:`MemMma` (compute capability 8.0
    and later), else None (the integer workload): (load, why not a better one or None)."""
    why = None
    if wanted in ("auto", "cublas"):
        lib, where = find_cublas()
        if lib is not None:
            try:
                gemm = Gemm(dev, lib, where)
                gemm.trial()
                return gemm, None
            except (BlasError, AttributeError) as e:   # AttributeError: an entry point it lacks
                why = f"cuBLAS {where}: {e}"
        else:
            why = where
    if wanted != "integer" and "mma_mem" in dev.kernels:
        return MemMma(dev), why
    return None, why or dev.tensor or "the integer workload asked for"


def soak_load(dev: Device, load, soak_s: float) -> dict:
    """The load for ``soak_s`` seconds, with a concurrent HBM stream (device-to-device copies on a
    stream of their own): batches of about BATCH_S, each seed's result digested (sha256 of the bytes
    copied back) while the next batch runs, and every repeat of a seed compared with its first.
    {"load", "dtype", "gemms", "tflops", "digest" (of the seeds' digests), "repeats", "differ",
    "window": [start, end] (epoch s, for the power samples), ...}."""
    if load is None:
        return integer_soak(dev, soak_s)
    hbm = [dev.alloc(HBM_BYTES) for _ in range(2)]
    copies = dev.stream()
    host = ctypes.c_void_p()
    size = load.out_bytes
    dev.call("cuMemHostAlloc", ctypes.byref(host), size, 0)
    view = (ctypes.c_char * size).from_address(host.value)
    first: dict[int, str] = {}
    repeats = differ = 0
    odd = None

    looks = []

    def look(c: int, seed: int) -> None:
        nonlocal repeats, differ, odd
        t = time.perf_counter()
        dev.call("cuMemcpyDtoH_v2", host, load.out[c], size)
        digest = hashlib.sha256(view).hexdigest()
        looks.append(time.perf_counter() - t)
        if seed not in first:
            first[seed] = digest
            return
        repeats += 1
        if digest != first[seed]:
            differ += 1
            odd = odd or f"seed {seed}: {first[seed][:16]} then {digest[:16]}"

    # calibration: one batch of one, timed, sets the batch's size (and the HBM copies per batch)
    load.fill(0)
    load.queue(0, 1)
    dev.sync_stream(load.stream)
    t = time.perf_counter()
    load.queue(0, 2)
    dev.sync_stream(load.stream)
    per = max((time.perf_counter() - t) / 2, 1e-4)
    count = max(1, min(int(BATCH_S / per), 10000))
    ncopy = HBM_ROUND if None not in hbm else 0
    # throughput from the card's own clock (events around each batch's launches): the host's
    # scheduling (several cards' workers, the sampler) stays out of it
    marks = [(dev.event(), dev.event()) for _ in range(2)]
    busy, launches, copied = 0.0, 0, [0]

    def feed() -> None:
        """Another short round of HBM copies once the last is done: never a backlog that blocks
        the host (a queue of thousands did: the GEMM stream waited, 613 W of 700 on an H100). The
        copies run in what the GEMM leaves: 2064 of 512 MiB in a 121 s soak on an H100."""
        if ncopy and dev.lib.cuStreamQuery(copies) == 0:
            for k in range(ncopy):
                dev.call("cuMemcpyDtoDAsync_v2", hbm[(k + 1) % 2], hbm[k % 2], HBM_BYTES, copies)
            copied[0] += ncopy

    def queue(r: int) -> None:
        c = r % 2
        load.fill(r % GEMM_SEEDS)
        dev.call("cuEventRecord", marks[c][0], load.stream)
        load.queue(c, count)
        dev.call("cuEventRecord", marks[c][1], load.stream)
        feed()

    def done(r: int) -> None:
        nonlocal busy, launches
        while True:   # polled, feeding the HBM stream meanwhile
            rc = dev.lib.cuEventQuery(marks[r % 2][1])
            if rc != 600:   # CUDA_ERROR_NOT_READY
                break
            feed()
            time.sleep(0.002)
        if rc:
            dev.call("cuEventQuery", marks[r % 2][1])   # raises, naming it
        busy += dev.elapsed_s(*marks[r % 2])
        launches += count
        look(r % 2, r % GEMM_SEEDS)

    # batch r is queued behind batch r - 1 before the host waits for r - 1 and digests its result:
    # the card never waits for the host (a batch waiting on the host drew 594 W of 700 on an H100)
    start, t0, r = time.time(), time.perf_counter(), 1
    queue(0)
    while True:
        queue(r)
        done(r - 1)
        r += 1
        if time.perf_counter() - t0 >= soak_s and r - 1 >= GEMM_SEEDS:   # every seed's result digested once at least
            break
    done(r - 1)
    dev.sync_stream(copies)
    took = time.perf_counter() - t0
    end = time.time()
    dev.call("cuMemFreeHost", host)
    for ptr in hbm:
        if ptr:
            dev.lib.cuMemFree_v2(ptr)
    digest = hashlib.sha256("".join(first[s] for s in sorted(first)).encode()).hexdigest()
    return {"load": "cublas" if isinstance(load, Gemm) else "ptx", "dtype": load.dtype, "cublas": load.version,
            "cublas_path": load.path, "sms": dev.sms, "launches": launches, "per_batch": count,
            "hbm_copies": copied[0], "seconds": round(took, 1), "gpu_seconds": round(busy, 2),
            "digest_s": round(max(looks), 3),
            "tflops": round(launches * load.flops / busy / 1e12, 1) if busy > 0 else None,
            "digest": digest, "seeds": len(first), "repeats": repeats, "differ": differ, "odd": odd,
            "window": [start, end]}


def integer_soak(dev: Device, soak_s: float) -> dict:
    """The soak on a card with neither cuBLAS nor mma.sync (compute capability below 8.0 and no
    cuBLAS): the integer workload, every launch compared with the first."""
    n = dev.sms * 2048
    out = dev.alloc(n * 4)
    if out is None:
        return {"error": "soak: no device memory"}
    first = burn_once(dev, out, n, COMPUTE_ITERS)
    start, t0, launches, differ = time.time(), time.monotonic(), 0, 0
    while time.monotonic() - t0 < soak_s:
        launches += 1
        differ += burn_once(dev, out, n, COMPUTE_ITERS) != first
    dev.lib.cuMemFree_v2(out)
    return {"load": "integer", "dtype": "u32", "cublas": None, "sms": dev.sms, "launches": launches,
            "seconds": round(time.monotonic() - t0, 1), "tflops": None, "repeats": launches, "differ": differ,
            "digest": hashlib.sha256(first).hexdigest(), "odd": None, "window": [start, time.time()]}


def worker(card: dict, opts: dict, conn) -> None:
    """One card's CUDA part, in a process of its own (the parent kills it past its bound)."""
    fig: dict = {}
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)   # every card by its bus id, whatever the caller's environment hid
    try:
        cpus = numa_cpus(card["pci.bus_id"])
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass
        fig["numa_cpus"] = len(cpus) if cpus else None
        dev = Device(card["pci.bus_id"])
        t = time.monotonic()
        fig["vram"] = vram_pass(dev, opts["vram_fraction"], opts["patterns"])
        fig["vram"]["seconds"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        fig["pcie"] = pcie_pass(dev, card.get("pcie.link.gen.max"), card.get("pcie.link.width.max"),
                                card.get("pcie.link.gen.current"), card.get("pcie.link.width.current"))
        fig["pcie"]["seconds"] = round(time.monotonic() - t, 2)
        fig["compute"], fig["soak"], fig["gemm"] = compute_and_soak(dev, opts)
    except CudaError as e:
        fig["error"] = str(e)
        if e.code in LOST_CODES:
            fig["cuda_lost"] = e.code
    except OSError as e:
        fig["error"] = f"libcuda.so.1: {e}"
    except Exception as e:   # noqa: BLE001 - any failure of the test is the card's result, named
        fig["error"] = f"the test failed: {type(e).__name__}: {e}"
    backstop(fig)
    conn.send(fig)
    conn.close()


def dcgm(card: dict, level: int) -> dict | None:
    """``dcgmi diag -r LEVEL -i INDEX -j`` on a datacenter card where dcgmi is installed: {"level",
    "failed": [test names]}, or None."""
    if not shutil.which("dcgmi") or not DATACENTER.search(str(card.get("name") or "")):
        return None
    rc, out = run_bounded(["dcgmi", "diag", "-r", str(level), "-i", str(card["index"]), "-j"], 3600)
    failed = []

    def walk(node, name=None):
        if isinstance(node, dict):
            here = node.get("name") or node.get("test_name") or name
            if str(node.get("status", "")).lower() == "fail":
                failed.append(str(here or "a test"))
            for v in node.values():
                walk(v, here)
        elif isinstance(node, list):
            for v in node:
                walk(v, name)
    try:
        walk(json.loads(out[out.find("{"):]))
    except ValueError:
        pass
    if rc != 0 and not failed:
        failed.append(f"exit status {rc}" if rc is not None else "no answer within 3600 s")
    return {"level": level, "failed": sorted(set(failed))}


# ---------------------------------------------------------------- the run
def time_bound(opts: dict, mib: int) -> float:
    """How long one card's worker may take: generous for the slowest card rigup serves, so that only
    a hang reaches it: 60 s to start, each pattern and its inverse a fill and a check of the card's
    memory at 25 GiB/s (a fraction of a CMP card's) plus 3 s, the PCIe and compute passes 60 s, the
    soak half again."""
    sweeps = opts["patterns"] * 2 * (3 + 2 * mib / 1024 / 25)
    return opts.get("timeout_s") or (60 + sweeps + 60 + opts["soak_s"] * 1.5)


def xid_since(since: float, match: str | None, buses: dict[str, str]) -> dict[str, list[int]]:
    """The Xid codes the kernel logged for each card (by uuid) since ``since``: the journal's lines
    of ``match`` (shipped/xid.py JOURNAL_MATCH; default the kernel's), read by the guard's parser."""
    if not shutil.which("journalctl"):
        return {}
    rc, out = run_bounded(["journalctl", "-o", "cat", "--no-pager", f"--since=@{int(since)}",
                           match or "_TRANSPORT=kernel"], 20)
    cards = {xid_lines.card_key(b): uuid for uuid, b in buses.items()}
    found: dict[str, list[int]] = {}
    for event in xid_lines.events((out or "").splitlines(), {}):
        if event.get("kind") != "SXid" and event["card"] in cards:
            found.setdefault(cards[event["card"]], []).append(event["code"])
    return found


def run(opts: dict, only: list[str] | None) -> dict[str, dict]:
    testing = opts.get("testing") or TESTING
    known = cards()
    by_uuid = {c["uuid"]: c for c in known}
    wanted = only or list(by_uuid)
    missing = [u for u in wanted if u not in by_uuid]
    busy = busy_cards(list(by_uuid))
    results: dict[str, dict] = {}
    for u in missing:
        results[u] = {"passed": False, "failed": ["not on the bus: nvidia-smi does not list it"], "level": opts["level"],
                      "at": time.time(), "seconds": 0, "figures": {}}
    todo = [by_uuid[u] for u in wanted if u in by_uuid and u not in busy]
    skipped = {u: busy[u] for u in wanted if u in busy}
    started = time.time()
    health0 = {c["uuid"]: health(c["uuid"]) for c in todo}
    figs: dict[str, dict] = {c["uuid"]: {} for c in todo}
    for c in todo:
        c["expect_mib"] = (opts.get("expect_mib") or {}).get(c["uuid"])
        d = dcgm(c, LEVELS[opts["level"]]["dcgm"])
        if d:
            figs[c["uuid"]]["dcgm"] = d
    save(testing, [c["pci.bus_id"] for c in todo])
    try:
        return finish(opts, todo, figs, health0, started, by_uuid, results, skipped)
    finally:
        try:
            os.remove(testing)
        except OSError:
            pass


def reaped(procs: dict, figs: dict) -> list[str]:
    """One look at each card's worker (``procs``: uuid -> (process, pipe, deadline)): its result into
    ``figs`` when it sent one, an error when it ended without; those past their deadline killed
    with SIGKILL (never a GPU reset) and returned. Each one done leaves ``procs``."""
    hung = []
    for u, (p, conn, deadline) in list(procs.items()):
        if conn.poll():
            try:
                figs[u].update(conn.recv())
            except EOFError:
                figs[u]["error"] = "the worker ended without a result"
            p.join(5)
        elif not p.is_alive():
            figs[u]["error"] = f"the worker ended without a result (exit {p.exitcode})"
        elif time.monotonic() > deadline:
            os.kill(p.pid, KILL)
            hung.append(u)
        else:
            continue
        del procs[u]
    return hung


def finish(opts, todo, figs, health0, started, by_uuid, results, skipped) -> dict[str, dict]:
    if (opts.get("load") or "auto") in ("auto", "cublas"):
        cublas_libraries(), libcuda()   # before the workers fork: each library skipped is named once, not per card
    ctx = multiprocessing.get_context("fork")
    procs = {}
    for c in todo:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=worker, args=(c, opts, child), daemon=True)
        p.start()
        child.close()
        procs[c["uuid"]] = (p, parent, time.monotonic() + time_bound(opts, c.get("memory.total") or 0))
    samples: dict[str, list[dict]] = {c["uuid"]: [] for c in todo}
    while procs:
        now_rows = samples_of({u: by_uuid[u]["pci.bus_id"] for u in procs})
        for u, row in now_rows.items():
            if u in samples:
                samples[u].append({**row, "t": round(time.time(), 2)})
        for u in reaped(procs, figs):   # never a GPU reset: quarantined, the operator decides
            figs[u]["hung"] = round(time_bound(opts, by_uuid[u].get("memory.total") or 0))
        if procs:
            time.sleep(SAMPLE_S)
    xids = xid_since(started, opts.get("xid_match"), {c["uuid"]: c["pci.bus_id"] for c in todo})
    for c in todo:
        u = c["uuid"]
        fig = figs[u]
        rows = samples[u]
        lost = [r["lost"] for r in rows if "lost" in r and r["lost"]]
        if lost or fig.get("cuda_lost"):
            fig["lost"] = lost[-1] if lost else f"CUDA error {fig['cuda_lost']}"
        judged = [r for r in rows if "lost" not in r]
        bad = [r for r in judged if isinstance(r.get("events"), int) and throttle_reasons(r["events"])]
        soak = fig.setdefault("soak", {})
        soak.update({"samples": len(judged), "throttled_ratio": round(len(bad) / len(judged), 3) if judged else 0,
                     "reasons": sorted({n for r in bad for n in throttle_reasons(r["events"])}),
                     "temp_max_c": max((r["temperature.gpu"] for r in judged if isinstance(r.get("temperature.gpu"), (int, float))), default=None),
                     "sm_clock_min_mhz": min((r["clocks.current.sm"] for r in judged if isinstance(r.get("clocks.current.sm"), (int, float))), default=None),
                     "power_max_w": max((r["power.draw"] for r in judged if isinstance(r.get("power.draw"), (int, float))), default=None),
                     "xids": sorted(set(xids.get(u, [])))})
        if not fig.get("lost") and not fig.get("hung"):
            after = health(u)
            fig["health"] = {"before": health0[u], "after": after, "worse": health_worse(health0[u], after)}
        gemm = fig.pop("gemm", None) or {}
        power = fig["power"] = power_of(rows, gemm.pop("window", None), c.get("power.limit"))
        # watts are judged under cuBLAS's load only: the PTX and integer loads do not reach the cap
        product = NO_TENSOR.get(c.get("pci.device_id"))
        power["judged"] = gemm.get("load") == "cublas" and power.get("ratio") is not None and power["samples"] >= 3 \
            and not product
        if product:
            power["why"] = f"{product}: no FP16 tensor throughput, the GEMM does not reach its cap (watts recorded)"
        if power.get("mean_w") and gemm.get("tflops"):
            gemm["tflops_per_w"] = round(gemm["tflops"] / power["mean_w"], 4)
        fig["gemm"] = gemm
        why = judge(c, fig, opts)
        fig.pop("gemm")
        results[u] = {"index": c["index"], "bus_id": c["pci.bus_id"], "name": c["name"], "level": opts["level"],
                      "at": round(time.time()), "seconds": round(time.time() - started, 1), "passed": not why,
                      "failed": why, "figures": fig,
                      "key": {"driver": c["driver_version"], "memory_mib": c["memory.total"],
                              "power_limit_w": c["power.limit"]},
                      "schema": 2, "gemm": gemm, "power": fig.pop("power"), "flagged": []}
    siblings({u: r for u, r in results.items() if "gemm" in r}, opts)
    if opts.get("samples"):
        write_json(opts["samples"], samples, indent=None)
    for u, what in skipped.items():
        results[u] = {"busy": what}
    return results


# ---------------------------------------------------------------- the pulse (the host's power delivery)
PULSE = "/var/lib/rigup/burnin-pulse.json"
PULSE_SCHEMA = 1
PULSE_SAMPLE_S = 0.2
PULSE_START_S = 60.0     # a worker's set-up (its context, cuBLAS's handle, the operands) before the first pulse
BRAKE = 0x80             # clocks_event_reasons: hardware power brake (nvml.h): the board's supply said it sags


def pulse_worker(card: dict, opts: dict, start, barrier, conn) -> None:
    """One card's part of the pulse: the soak's load (cuBLAS, else the PTX or integer one) switched on
    for the first half of each period and off for the second, every card on the same wall-clock
    periods (``start``: set once every worker is ready, by the barrier's action), for ``seconds``."""
    fig: dict = {}
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        dev = Device(card["pci.bus_id"])
        load, why = pick_load(dev, opts.get("load") or "auto")
        if load is None:   # the integer workload: one launch, synchronised, per count
            n = dev.sms * 2048
            out = dev.alloc(n * 4)
            if out is None:
                raise CudaError(2, "cuMemAlloc_v2 (the pulse's integer load)", "CUDA_ERROR_OUT_OF_MEMORY")

            def fire(count: int) -> None:
                for _ in range(count):
                    burn_once(dev, out, n, COMPUTE_ITERS)
            name, wait = "integer", dev.sync
        else:
            load.fill(0)
            name = "cublas" if isinstance(load, Gemm) else "ptx"
            fire, wait = (lambda count: load.queue(0, count)), (lambda: dev.sync_stream(load.stream))
        period = 1.0 / opts["hz"]
        fire(1)
        wait()
        t = time.perf_counter()
        fire(2)
        wait()
        count = max(1, int(period / 2 / max((time.perf_counter() - t) / 2, 1e-4)))
        barrier.wait(PULSE_START_S)
        t0, pulses, on = start.value, 0, 0.0
        while pulses * period < opts["seconds"]:
            delay = t0 + pulses * period - time.time()
            if delay > 0:
                time.sleep(delay)
            t = time.perf_counter()
            fire(count)
            wait()
            on += time.perf_counter() - t
            pulses += 1
        fig.update({"load": name, "why": why, "pulses": pulses, "per_pulse": count,
                    "on_s": round(on / pulses, 4) if pulses else None, "period_s": round(period, 4)})
    except CudaError as e:
        fig["error"] = str(e)
        if e.code in LOST_CODES:
            fig["cuda_lost"] = e.code
    except Exception as e:   # noqa: BLE001 - a barrier broken by another card, a load that failed: named
        fig["error"] = f"{type(e).__name__}: {e}"
    backstop(fig)
    if "error" in fig:
        barrier.abort()   # the other cards stop waiting for this one
    conn.send(fig)
    conn.close()


def pulse(opts: dict) -> dict:
    """Every card of the host that is not quarantined, at once, its load switched on and off
    ``hz`` times a second for ``seconds``: the step a power supply, its cables and the risers must
    hold when a whole rig goes from idle to full load (a batch arriving). A card that falls off
    the bus (nvidia-smi loses it, CUDA says so, an Xid 79), a hardware power brake in any sample,
    or an Xid of a card fails the host's power delivery, with the figures (the cards' summed draw at
    its peak, their caps, ``psu_watts``); the cards that fell off are failed in the records too.
    Returns the pulse record (:data:`PULSE`; ``{"busy": ...}`` when a card is in use: nothing ran)."""
    known = cards()
    records = load(opts["results"])
    todo = [c for c in known if not quarantined(records.get(c["uuid"]))]
    busy = busy_cards([c["uuid"] for c in todo])
    if busy:
        return {"busy": ", ".join(f"GPU {u} by {w}" for u, w in sorted(busy.items()))}
    buses = {c["uuid"]: c["pci.bus_id"] for c in todo}
    if (opts.get("load") or "auto") in ("auto", "cublas"):
        cublas_libraries(), libcuda()   # before the workers fork: each library skipped is named once, not per card
    ctx = multiprocessing.get_context("fork")
    start = ctx.Value("d", 0.0)
    barrier = ctx.Barrier(len(todo), action=lambda: setattr(start, "value", time.time() + 0.5))
    procs, figs, rows = {}, {c["uuid"]: {} for c in todo}, []
    started = time.time()
    save(opts.get("testing") or TESTING, list(buses.values()))   # the GPU guard sets them aside, and sums their draw
    try:
        for c in todo:
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=pulse_worker, args=(c, opts, start, barrier, child), daemon=True)
            p.start()
            child.close()
            procs[c["uuid"]] = (p, parent, time.monotonic() + PULSE_START_S + opts["seconds"] + 60)
        while procs:
            rows.append({"t": round(time.time(), 2), "cards": samples_of({u: buses[u] for u in buses}, instant=True)})
            for u in reaped(procs, figs):   # never a reset: the card hung in the pulse
                figs[u]["hung"] = True
            if procs:
                time.sleep(PULSE_SAMPLE_S)
        rec = pulse_verdict(opts, todo, figs, rows, xid_since(started, opts.get("xid_match"), buses), started)
        if opts.get("samples"):
            write_json(opts["samples"], rows, indent=None)
        for u in rec["figures"]["lost"]:   # quarantined before the guard stops setting them aside
            old = records.get(u) if isinstance(records.get(u), dict) else {}
            card = rec["figures"]["cards"].get(u) or {}
            records[u] = {"index": card.get("index"), "bus_id": card.get("bus_id"), **old, "passed": False,
                          "at": rec["at"], "schema": 2,
                          "failed": [*(old.get("failed") or []), f"fell off the bus in the pulse test of the host's "
                                     f"power delivery: {rec['failed'][0]}"]}
        if rec["figures"]["lost"]:
            save(opts["results"], records)
        return rec
    finally:
        try:
            os.remove(opts.get("testing") or TESTING)
        except OSError:
            pass


def pulse_verdict(opts: dict, todo: list[dict], figs: dict, rows: list[dict], xids: dict, started: float) -> dict:
    """The pulse record of a run (pure: the cards, each worker's figures, the samples, the Xids)."""
    sums = [sum(r["power.draw"] for r in row["cards"].values() if isinstance(r.get("power.draw"), (int, float)))
            for row in rows]
    caps = sum(c.get("power.limit") or 0 for c in todo)
    faults, lost = [], []
    for c in todo:
        u, fig = c["uuid"], figs[c["uuid"]]
        name = f"GPU {c['index']} ({c['pci.bus_id']})"
        gone = next((row["cards"][u]["lost"] for row in rows if (row["cards"].get(u) or {}).get("lost")), None)
        if gone or fig.get("cuda_lost") or 79 in xids.get(u, []):
            lost.append(u)
            faults.append(f"{name} fell off the bus" + (" (Xid 79)" if 79 in xids.get(u, []) else ""))
        elif fig.get("hung"):
            faults.append(f"{name} hung (killed; never reset)")
        braked = sum(1 for row in rows if isinstance((row["cards"].get(u) or {}).get("events"), int)
                     and row["cards"][u]["events"] & BRAKE)
        if braked:
            faults.append(f"{name} in a hardware power brake in {braked} of {len(rows)} samples")
        other = sorted(set(xids.get(u, [])) - {79})
        if other:
            faults.append(f"{name} Xid {', '.join(map(str, other))}")
    errors = {c["uuid"]: figs[c["uuid"]]["error"] for c in todo
              if figs[c["uuid"]].get("error") and c["uuid"] not in lost}
    psu = opts.get("psu_watts")
    drawn = sorted({r.get("draw") for row in rows for r in row["cards"].values() if r.get("draw")})
    figures = {"hz": opts["hz"], "seconds": opts["seconds"], "samples": len(rows), "draw": ", ".join(drawn) or None,
               "peak_w": round(max(sums), 1) if sums else None, "caps_w": round(caps, 1), "psu_watts": psu,
               "lost": lost, "xids": {u: sorted(set(x)) for u, x in xids.items() if x},
               "cards": {c["uuid"]: {"index": c["index"], "bus_id": c["pci.bus_id"],
                                     **{k: v for k, v in figs[c["uuid"]].items() if k != "error"}} for c in todo}}
    failed = []
    if faults:
        failed.append(f"pulse: the host's power delivery did not hold {len(todo)} card(s) switched on and off "
                      f"{opts['hz']:g} times a second for {opts['seconds']:g} s: {'; '.join(faults)}; the cards drew "
                      f"up to {figures['peak_w'] or 0:g} W together (their caps sum to {caps:g} W; "
                      + (f"gpu_psu_watts {psu:g} W" if psu else "gpu_psu_watts not set")
                      + "): check the supply, its cables and the risers, or lower gpu_psu_watts")
    failed += [f"pulse: GPU {u}: {shown(e, 300)} (the pulse did not run on it)" for u, e in sorted(errors.items())]
    return {"schema": PULSE_SCHEMA, "at": round(time.time()), "seconds": round(time.time() - started, 1),
            "passed": not failed, "failed": failed, "faults": bool(faults),
            "key": {"driver": todo[0]["driver_version"] if todo else None, "cards": sorted(c["uuid"] for c in todo),
                    "caps_w": round(caps, 1), "psu_watts": psu},
            "figures": figures}


# ---------------------------------------------------------------- records
class Unreadable(Exception):
    """The records file exists and does not read: nothing is written over it (its quarantines stay)."""


# The records' rules that rigup/boundary/burnin.py (the controller's reader) holds too: a unit test
# holds these copies equal (this program ships alone, with the standard library only)
RECORDS_SCHEMA = 2               # the records' format this program writes and reads
MAX_CARDS = 1024
MAX_DEPTH = 16
TEXT_MAX = 4096                  # a failure's text
AT_MAX = 4102444800              # 2100-01-01: a record's time, seconds since the epoch
CARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")   # rigup/boundary/fields.py's ID
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u2028\u2029]")


def record_fault(rec: dict) -> str | None:
    """Why one card's record does not read (``field: what``), or None: each field this program, the
    GPU guard and status read typed as the controller's reader types it (rigup/boundary/burnin.py
    _record): ``passed`` true or false, ``failed`` a list of texts, ``level`` one of :data:`LEVELS`,
    ``at``/``seconds`` finite numbers in range, ``index`` a card index, ``bus_id`` an id, ``key``,
    ``figures`` and ``cleared`` mappings (``cleared.at`` a time, ``cleared.by`` text); every other
    number finite (1e400 is no number: rerun3's NB4), every text bounded, nested at most
    :data:`MAX_DEPTH`. A record that does not read fails its file closed (rerun3's NB7: ``cleared:
    "no"`` read as a clearing; rerun1's N46: ``failed: [1, 2]`` ended status in a traceback)."""
    def num(v, lo, hi, whole=False):
        return ((type(v) is int) if whole else (isinstance(v, (int, float)) and not isinstance(v, bool))) \
            and (whole or math.isfinite(v)) and abs(v) < 1e18 and lo <= v <= hi

    def text(v, limit=256, control=False):
        return isinstance(v, str) and len(v) <= limit and (control or not CONTROL.search(v))

    def walk(v, field, depth=0):
        if depth > MAX_DEPTH:
            return f"{field}: nested deeper than {MAX_DEPTH}"
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, item in items:
            fault = walk(item, f"{field}.{k}" if isinstance(v, dict) else f"{field}[{k}]", depth + 1)
            if fault:
                return fault
        if isinstance(v, str) and not text(v, TEXT_MAX, control=True):
            return f"{field}: text longer than {TEXT_MAX} characters"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not num(v, -1e18, 1e18):
            return f"{field}: not a finite number of our size: {str(v)[:40]!r}"
        return None

    if rec.get("schema") is not None and not num(rec["schema"], 1, RECORDS_SCHEMA, whole=True):
        return f"schema: not a format this rigup-burnin reads (1..{RECORDS_SCHEMA}): {str(rec['schema'])[:40]!r}"
    if not isinstance(rec.get("passed"), bool):
        return f"passed: neither true nor false: {str(rec.get('passed'))[:60]!r}"
    failed = rec.get("failed") if rec.get("failed") is not None else []
    if not isinstance(failed, list) or len(failed) > 256 or not all(text(f, TEXT_MAX, control=True) for f in failed):
        return "failed: not a list of at most 256 texts"
    checks = (("level", lambda v: isinstance(v, str) and v in LEVELS, f"one of {', '.join(LEVELS)}"),
              ("at", lambda v: num(v, 0, AT_MAX), "a time"), ("seconds", lambda v: num(v, 0, 1e8), "seconds"),
              ("index", lambda v: num(v, 0, 1023, whole=True), "a card index 0..1023"),
              ("bus_id", lambda v: isinstance(v, str) and CARD_ID.fullmatch(v), "an id"),
              ("name", text, "text of at most 256 characters"), ("key", lambda v: isinstance(v, dict), "a mapping"),
              ("figures", lambda v: isinstance(v, dict), "a mapping"),
              ("cleared", lambda v: isinstance(v, dict) and (v.get("at") is None or num(v["at"], 0, AT_MAX))
               and (v.get("by") is None or text(v["by"])), "a mapping of at (a time) and by (text)"))
    for name, good, what in checks:
        if rec.get(name) is not None and not good(rec[name]):
            return f"{name}: not {what}: {str(rec[name])[:60]!r}"
    return walk(rec, "")


def load(path: str) -> dict:
    """The records at ``path``: {} when there are none yet (no file, or an empty one); a file that
    does not read (not JSON, NaN or 1e400, a key twice, not a mapping of card ids to records, a
    record whose fields do not read: :func:`record_fault`) is :class:`Unreadable`, never {}:
    starting over from {} would erase every quarantine on the host at the next save (round 3's H1),
    and a record read past its faults could let a quarantined card serve. The controller's reader
    is rigup/boundary/burnin.py, with the same rules."""
    try:   # never through a link, never waiting on a FIFO (round 6 BA17), a regular file only
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        with open(fd, encoding="utf-8") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a regular file")
            text = f.read((1 << 22) + 1)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise Unreadable(f"{path} does not read ({type(e).__name__}: {e})") from None
    if not text.strip():
        return {}

    def once(pairs):
        seen = dict(pairs)
        if len(seen) < len(pairs):
            raise ValueError("a key twice")
        return seen

    def no_constant(name):
        raise ValueError(f"{name} is no JSON number")

    def finite(digits):
        value = float(digits)
        if not math.isfinite(value):
            raise ValueError(f"{digits[:40]} is no finite number")
        return value

    try:
        if len(text) > 1 << 22:
            raise ValueError("larger than 4 MiB")
        doc = json.loads(text, object_pairs_hook=once, parse_constant=no_constant, parse_float=finite)
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"{path} does not read (not JSON: {shown(e, 200)})") from None
    if not isinstance(doc, dict) or len(doc) > MAX_CARDS \
            or not all(isinstance(k, str) and isinstance(v, dict) for k, v in doc.items()):
        raise Unreadable(f"{path} does not read (not a mapping of at most {MAX_CARDS} card ids to records)")
    for uuid, rec in doc.items():
        fault = "not a card id" if not CARD_ID.fullmatch(uuid) else record_fault(rec)
        if fault:
            raise Unreadable(f"{path} does not read ({shown(uuid, 64)}: {fault})")
    return doc


def save(path: str, records: dict) -> None:
    """Write the records atomically (:func:`replace`: a planted link is never followed)."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    replace(path, json.dumps(records, indent=1, sort_keys=True) + "\n")


def write_json(path: str, value, indent: int | None = 1) -> None:
    """``--json`` and ``--samples``: written as the records are (:func:`replace`), wherever named."""
    replace(path, json.dumps(value, indent=indent, sort_keys=True))


def replace(path: str, text: str, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write ``path`` atomically: a new temp file beside it (a random dot-name, O_EXCL|O_NOFOLLOW: a
    link or file another user planted in the directory is never opened), chmod'ed to ``mode`` (None:
    the umask's), then renamed over ``path`` (a rename replaces a link there, never follows it); the
    temp file never outlives a failure. Each host program carries this copy (it ships alone)."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise



HISTORY = 8   # the runs before the last a card's record keeps (a re-acceptance keeps its first sight's)


def history(old) -> list[dict]:
    """The earlier runs a new record keeps: the one it replaces (its time, level, verdict, first
    failures) and that one's own history, newest first, at most :data:`HISTORY`."""
    if not isinstance(old, dict) or "passed" not in old:
        return []
    failed = old.get("failed") if isinstance(old.get("failed"), list) else []
    was = {"at": old.get("at"), "level": old.get("level"), "passed": old.get("passed"),
           "failed": [str(f)[:300] for f in failed[:4]]}
    before = old.get("history") if isinstance(old.get("history"), list) else []
    return [was, *[h for h in before if isinstance(h, dict)]][:HISTORY]


def quarantined(rec: dict | None) -> bool:
    """A record that failed and that the operator did not clear: its card is left out of serving
    (roles/burnin/quarantine.py; the GPU guard carries a copy, held equal by a test). A record whose
    ``passed`` is not true or false, or whose ``cleared`` is not a mapping, does not read
    (:func:`load` refuses it) and counts as quarantined here too: fail closed."""
    if not rec:
        return False
    cleared, passed = rec.get("cleared"), rec.get("passed")
    if (cleared is not None and not isinstance(cleared, dict)) or not isinstance(passed, bool):
        return True
    # a clearing is rigup-burnin clear's {"at", "by"}, not older than the run it clears: {} or {"note"}
    # cleared nothing to the controller (round 6 BA6, BA7), nor one older than a new failure (re-round 6 NB5)
    at, cleared_at = ((v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)   # a time is a number
                      for v in (rec.get("at"), (cleared or {}).get("at")))
    return passed is False and (cleared_at is None or (at is not None and cleared_at < at))


def label(value) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the copy of
    rigup/boundary/formats.py's prom_label this program carries: it ships alone; a unit test holds the two equal)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_metrics(path: str | None, records: dict) -> None:
    if not path or not os.path.isdir(os.path.dirname(path)):
        return
    lines = ["# HELP rigup_gpu_burnin_passed Whether the card passed its last acceptance run (rigup-burnin)",
             "# TYPE rigup_gpu_burnin_passed gauge",
             "# HELP rigup_gpu_quarantined Whether the card is left out of serving until it passes or is cleared",
             "# TYPE rigup_gpu_quarantined gauge",
             "# HELP rigup_gpu_burnin_seconds How long the card's last acceptance run took",
             "# TYPE rigup_gpu_burnin_seconds gauge"]
    for uuid, rec in sorted(records.items()):
        if not isinstance(rec, dict) or "passed" not in rec:
            continue
        labels = f'uuid="{label(uuid)}",bus_id="{label(rec.get("bus_id", ""))}",level="{label(rec.get("level", ""))}"'
        seconds = rec.get("seconds", 0)   # a number of its own run; anything else would not be one sample
        seconds = seconds if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0
        lines += [f"rigup_gpu_burnin_passed{{{labels}}} {int(bool(rec.get('passed')))}",
                  f"rigup_gpu_quarantined{{{labels}}} {int(quarantined(rec))}",
                  f"rigup_gpu_burnin_seconds{{{labels}}} {seconds}"]
    replace(path, "\n".join(lines) + "\n")   # a directory the node exporter's package made: never a planted link


def line(uuid: str, rec: dict) -> str:
    """A card's record in one line. Figures this program keeps untyped (issue 62's ``gemm``,
    ``power``, a section of ``figures``) are read as mappings or left out (rerun1's N47: a list
    there ended status in a traceback)."""
    if "busy" in rec:
        return f"GPU {uuid}: not tested, in use by {rec['busy']}"
    head = f"GPU {rec.get('index', '?')} ({rec.get('bus_id', '?')}, {uuid}) {rec.get('level')}:"
    if rec.get("passed"):
        def part(d, name):
            got = d.get(name) if isinstance(d, dict) else None
            return got if isinstance(got, dict) else {}
        fig = part(rec, "figures")
        vram, pcie, soak = part(fig, "vram"), part(fig, "pcie"), part(fig, "soak")
        gemm, power = part(rec, "gemm"), part(rec, "power")
        flagged = rec.get("flagged") if isinstance(rec.get("flagged"), list) else []
        return (f"{head} passed in {rec.get('seconds')} s (VRAM {vram.get('mib')} MiB x {vram.get('patterns')}, "
                f"PCIe {pcie.get('gbps')} GB/s = {pcie.get('ratio')} of its link, soak {soak.get('seconds')} s, "
                f"max {soak.get('temp_max_c')} C, {gemm.get('load')} {gemm.get('dtype')} {gemm.get('tflops')} TFLOPS, "
                f"mean {power.get('mean_w')} W = {power.get('ratio')} of the cap)"
                + "".join(f"; flagged: {f}" for f in flagged))
    return f"{head} FAILED: " + "; ".join(str(f) for f in rec.get("failed") or ["?"]) + (" (cleared by the operator)" if rec.get("cleared") else "")


def pulse_main(a) -> int:
    """``rigup-burnin pulse``: the pulse record written (atomically, root's), the cards that fell off
    the bus failed in the records; exit 0 held, 3 not held (named on stderr), 2 a card in use."""
    if not (0 < a.seconds <= 3600 and 0.5 <= a.hz <= 50):
        print("rigup-burnin pulse: --seconds 0..3600 and --hz 0.5..50", file=sys.stderr)
        return 2
    rec = pulse({"seconds": a.seconds, "hz": a.hz, "psu_watts": a.psu_watts, "load": a.load, "results": a.results,
                 "xid_match": a.xid_match, "testing": a.testing, "samples": a.samples})
    if "busy" in rec:
        print(shown(f"rigup-burnin pulse: not run, every card must be idle: {rec['busy']}", 4000), file=sys.stderr)
        return 2
    save(a.pulse_results, rec)
    write_metrics(a.metrics, load(a.results))
    if a.json:
        write_json(a.json, rec)
    fig = rec["figures"]
    text = (f"pulse: held: {len(rec['key']['cards'])} card(s), {fig['hz']:g} Hz for {fig['seconds']:g} s, up to "
            f"{fig['peak_w']} W together (caps {fig['caps_w']:g} W)" if rec["passed"] else "; ".join(rec["failed"]))
    print(shown(text, 4000), file=sys.stdout if rec["passed"] else sys.stderr, flush=True)
    return 0 if rec["passed"] else 3


def main(argv=None) -> int:
    """The command line; a records file that does not read ends the command before it writes
    anything, naming the file (exit 2): its quarantines stay on the host."""
    try:
        return command(argv)
    except Unreadable as e:
        print(shown(f"rigup-burnin: {e}: left as it is; nothing written (fix it, or move it aside: "
                    "roles/burnin then judges the host's cards by the controller's copy)", 4000), file=sys.stderr)
        return 2


def expected_mib(text: str) -> dict[str, int] | None:
    """``--expect-mib UUID=MIB,...`` read, or None when any part is not a card and ASCII digits."""
    out = {}
    for part in (p for p in text.split(",") if p):
        uuid, eq, mib = part.partition("=")
        if not (uuid and eq and re.fullmatch(r"0|[1-9][0-9]{0,8}", mib)):   # the boundary's whole number
            return None
        out[uuid] = int(mib)
    return out


def command(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rigup-burnin")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--level", choices=sorted(LEVELS), default="standard")
    r.add_argument("--cards", default="")
    r.add_argument("--results", default=RESULTS)
    r.add_argument("--metrics", default=METRICS)
    r.add_argument("--json", default=None, help="also write this run's results here")
    r.add_argument("--soak-s", type=float, default=None)
    r.add_argument("--patterns", type=int, default=None)
    r.add_argument("--vram-fraction", type=float, default=0.9)
    r.add_argument("--pcie-min-ratio", type=float, default=0.25)
    r.add_argument("--throttle-max", type=float, default=0.25)
    r.add_argument("--power-min-ratio", type=float, default=0.9, help="the soak's least mean draw, of the cap in force")
    r.add_argument("--slow-flag-ratio", type=float, default=0.9, help="GEMM throughput of the siblings' median flagged below")
    r.add_argument("--slow-quarantine-ratio", type=float, default=0.8, help="and failed below")
    r.add_argument("--load", choices=("auto", "cublas", "ptx", "integer"), default="auto",
                   help="the soak's load: cuBLAS where the host has it (auto), or the fallbacks (measuring them)")
    r.add_argument("--samples", default=None, help="write the power samples here (JSON, per card)")
    r.add_argument("--timeout-s", type=float, default=None)
    r.add_argument("--xid-match", default=None)
    r.add_argument("--expect-mib", default="", help="UUID=MIB,... the memory each card should report")
    r.add_argument("--testing", default=TESTING, help="where the bus ids under test are kept meanwhile")
    s = sub.add_parser("status")
    s.add_argument("--results", default=RESULTS)
    p = sub.add_parser("pulse", help="the host's power delivery: every card's load switched on and off at once")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--hz", type=float, default=4.0)
    p.add_argument("--psu-watts", type=float, default=None, help="gpu_psu_watts, named in the verdict")
    p.add_argument("--load", choices=("auto", "cublas", "ptx", "integer"), default="auto")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--pulse-results", default=PULSE)
    p.add_argument("--metrics", default=METRICS)
    p.add_argument("--json", default=None)
    p.add_argument("--xid-match", default=None)
    p.add_argument("--testing", default=TESTING)
    p.add_argument("--samples", default=None, help="write every sample of the cards' draws here (JSON)")
    c = sub.add_parser("clear")
    c.add_argument("cards")
    c.add_argument("--results", default=RESULTS)
    c.add_argument("--metrics", default=METRICS)
    c.add_argument("--by", default="the operator")
    a = ap.parse_args(argv)
    if a.cmd == "status":
        for uuid, rec in sorted(load(a.results).items()):
            print(shown(line(uuid, rec), 4000))
        return 0
    if a.cmd == "clear":
        if len(a.by) > 256 or CONTROL.search(a.by):   # what record_fault takes: else every later load refused (round 6 BA1)
            ap.error(f"--by: at most 256 characters, no control character: {shown(a.by, 200)}")
        records = load(a.results)
        names = list(records) if a.cards == "all" else [u for u in a.cards.split(",") if u]
        for u in names:
            if u in records and quarantined(records[u]):
                records[u]["cleared"] = {"at": round(time.time()), "by": a.by}
        save(a.results, records)
        write_metrics(a.metrics, records)
        return 0
    if a.cmd == "pulse":
        return pulse_main(a)
    expect = expected_mib(a.expect_mib)
    if expect is None:
        ap.error(f"--expect-mib: not UUID=MIB,... with MIB in ASCII digits: {shown(a.expect_mib, 200)}")
    load(a.results)   # a records file that does not read: refused now, before an hour of testing
    level = LEVELS[a.level]
    opts = {"level": a.level, "patterns": a.patterns or level["patterns"],
            "soak_s": level["soak_s"] if a.soak_s is None else a.soak_s, "vram_fraction": a.vram_fraction,
            "pcie_min_ratio": a.pcie_min_ratio, "throttle_max": a.throttle_max, "timeout_s": a.timeout_s,
            "power_min_ratio": a.power_min_ratio, "slow_flag_ratio": a.slow_flag_ratio,
            "slow_quarantine_ratio": a.slow_quarantine_ratio, "load": a.load, "samples": a.samples,
            "xid_match": a.xid_match, "testing": a.testing,
            "expect_mib": expect}
    found = run(opts, [u for u in a.cards.split(",") if u] or None)
    records = load(a.results)
    for u, rec in found.items():
        if "busy" not in rec:
            records[u] = {**rec, "history": history(records.get(u))}
    save(a.results, records)
    write_metrics(a.metrics, records)
    if a.json:
        write_json(a.json, found)
    failed = False
    for u, rec in sorted(found.items()):
        text = line(u, rec)
        print(shown(text, 4000), file=sys.stderr if rec.get("passed") is False else sys.stdout, flush=True)
        failed |= rec.get("passed") is False
    return 3 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # not sys.exit: a worker killed while stuck in the driver must not hold the exit
