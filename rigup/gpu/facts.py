"""Read-only facts about a GPU host, one shell command (one round trip) each.

Each fact returns an empty value (its ``default``) when its tool is missing, and never fails
the host: ``nvidia-smi`` exits non-zero without a driver (9) or with a card off the bus (15),
so its commands end in ``|| true`` and the parsers skip the error lines.

Parsing lives in the module-level ``parse_*`` functions, which the unit tests call on captured
text (tests/fixtures/). :class:`HardwareFacts` runs every command below in one round trip, for
preflight, and reuses the same parsers.

From the CLI, in the repo root: ``pyinfra @local fact rigup.gpu.facts.NvidiaGpus``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, TypedDict

from pyinfra.api import FactBase

from rigup.gpu.catalogue import parse_cc  # "12.0" -> (12, 0): two ints, 12.0 > 9.0
from rigup.gpu.fabric import MANAGER_COMMAND, NVSWITCH_CLASS, parse_manager, parse_nvswitches
from rigup.boundary import fields
from rigup.boundary.core import Unreadable
from rigup.boundary.numbers import number, whole
from rigup.text import shown

# ----------------------------------------------------------------------------- nvidia-smi
# (nvidia-smi field, key in the fact's dict, converter). The order is the CSV's column order.
GPU_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("index", "index", "int"),
    ("uuid", "uuid", "str"),
    ("pci.bus_id", "bus_id", "str"),
    ("pci.device_id", "pci_device_id", "pci"),
    ("name", "name", "str"),
    ("compute_cap", "compute_capability", "cc"),
    ("memory.total", "memory_total_mib", "int"),
    ("memory.used", "memory_used_mib", "int"),
    ("power.limit", "power_limit_w", "float"),
    ("power.min_limit", "power_min_w", "float"),
    ("power.max_limit", "power_max_w", "float"),
    ("power.default_limit", "power_default_w", "float"),
    ("power.draw", "power_draw_w", "float"),
    ("temperature.gpu", "temperature_c", "int"),
    ("persistence_mode", "persistence", "bool"),
    ("pcie.link.gen.current", "pcie_gen", "int"),
    ("pcie.link.width.current", "pcie_width", "int"),
    ("driver_version", "driver_version", "str"),
    ("pcie.link.gen.max", "pcie_gen_max", "int"),
    ("pcie.link.width.max", "pcie_width_max", "int"),
)
# Asked for as well, where the driver knows them (rigup/gpu/fabric.py: Hopper and later report the
# NVSwitch fabric's registration; Ampere and a single passed-through card N/A): a driver without
# them fails the query ("is not a valid field", exit status 2), and the cards are read again
# without. Only then: a card off the bus fails the query too (exit status 15), with every other
# card's line already printed, which a second read would print again (every card twice).
FABRIC_FIELDS: tuple[tuple[str, str, str], ...] = (("fabric.state", "fabric_state", "word"),
                                                   ("fabric.status", "fabric_status", "word"))
# What a card can print for each figure (issue 61: -81559 MiB, a 1e17 C temperature and PCIe Gen-3 were
# read as they came): beyond these it is no reading of a card, None as an [N/A]. Generous for the cards to
# come (memory up to 16 TiB, 5 kW, PCIe Gen 1-7 of x1-x32), tight enough that nothing sizes on a lie.
BOUNDS: dict[str, tuple[float, float]] = {
    "index": (0, 1023), "memory_total_mib": (0, 1 << 24), "memory_used_mib": (0, 1 << 24),
    **{f"power_{k}_w": (0, 5000) for k in ("limit", "min", "max", "default", "draw")},
    "temperature_c": (0, 200), "pcie_gen": (1, 7), "pcie_gen_max": (1, 7), "pcie_width": (1, 32), "pcie_width_max": (1, 32),
}
GPU_QUERY = ",".join(field for field, _, _ in GPU_FIELDS)
_WITH_FABRIC = ",".join(field for field, _, _ in GPU_FIELDS + FABRIC_FIELDS)
GPU_COMMAND = (f"rigup_gpus=$(nvidia-smi --query-gpu={_WITH_FABRIC} --format=csv,noheader,nounits 2>&1); "
               f"if [ $? = 2 ]; then nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1; "
               "else printf '%s\n' \"$rigup_gpus\"; fi; true")
_WORD = re.compile(r"[A-Za-z][A-Za-z _/-]{0,31}")

_LOST = re.compile(rf"Unable to determine the device handle for GPU\s*({fields.PCI_BUS_ID.pattern})\b")


def parse_pci_id(text: str | None) -> str | None:
    """``"0x233510DE"`` (device then vendor) -> ``"10de:2335"`` (vendor:device, lowercase)."""
    m = re.fullmatch(r"\s*(?:0x)?([0-9A-Fa-f]{4})([0-9A-Fa-f]{4})\s*", text or "")
    return f"{m.group(2)}:{m.group(1)}".lower() if m else None


def normalise_bus_id(text: str) -> str:
    """PCI bus id with the 8-digit domain nvidia-smi's CSV uses: ``0000:47:00.0`` -> ``00000000:47:00.0``."""
    domain, _, rest = text.strip().upper().partition(":")
    return f"{domain.zfill(8)}:{rest}" if rest else domain


def _value(kind: str, text: str, bounds: tuple[float, float] | None = None) -> Any:
    # ASCII's blanks alone, as numbers.number (str.strip() took U+0085 off "350\x85": 350; round 9 X1)
    text = text.strip(" \t\r\n\f\v")
    if not text or text.startswith("[") or text in ("N/A", "Unknown Error", "Not Supported"):
        return None  # [N/A], [Unknown Error], [Not Supported], [Insufficient Permissions]...
    if kind in ("int", "float"):   # ASCII, finite, within the field's BOUNDS (a lying host's inf, -81559: None)
        return number(text, int if kind == "int" else float, *(bounds or (None, None)))
    if kind == "bool":
        return {"enabled": True, "disabled": False}.get(text.lower())
    if kind == "cc":
        return parse_cc(text)
    if kind == "pci":
        return parse_pci_id(text)
    if kind == "word":   # a state nvidia-smi names (Completed, In Progress, Success): a host's text, bounded
        return text if _WORD.fullmatch(text) else "unreadable"
    return text


def parse_gpus(lines: list[str]) -> list[dict]:
    """Lines of ``nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`` -> one dict per card.

    A card that fell off the bus ("Unable to determine the device handle for GPU0000:47:00.0:
    Unknown Error") becomes ``{"lost": True, "bus_id": "00000000:47:00.0"}``; other cards carry
    ``"lost": False``. Error texts (no driver, bad field) and blank lines are skipped, and so is the
    row of a card whose index is no number, or whose UUID or PCI bus id (each an argv word and a
    key later: ``nvidia-smi -i``, a burn-in record) is not one (rigup.boundary.fields ``gpu_uuid``,
    ``pci_bus_id``; ``[N/A]`` is None): a lying host's ``/../``, quote or escape sequence is no card
    of ours (plays/fleet.py counts such a line as not understood). A figure outside its
    :data:`BOUNDS` is None. A row naming a card again (its index, UUID or bus id in an earlier row)
    is skipped too: nvidia-smi prints each card once, and one card listed three times is not three
    cards to size and pin.
    """
    gpus: list[dict] = []
    taken: set[tuple[str, Any]] = set()
    for line in lines:
        lost = _LOST.search(line)
        if lost:
            bus = normalise_bus_id(lost.group(1))
            if ("bus_id", bus[-12:]) not in taken:
                taken.add(("bus_id", bus[-12:]))
                gpus.append({"lost": True, "bus_id": bus})
            continue
        cells = line.split(",")
        columns = GPU_FIELDS + FABRIC_FIELDS if len(cells) == len(GPU_FIELDS) + len(FABRIC_FIELDS) else GPU_FIELDS
        if len(cells) != len(columns) or whole(cells[0]) is None:
            continue
        gpu: dict[str, Any] = {key: _value(kind, cell, BOUNDS.get(key)) for (_, key, kind), cell in zip(columns, cells)}
        try:
            for key, check in (("uuid", fields.gpu_uuid), ("bus_id", fields.pci_bus_id)):
                if gpu[key] is not None:
                    check(gpu[key], f"nvidia-smi's {key}")
        except Unreadable:
            continue
        keys = {("index", gpu["index"]), ("uuid", str(gpu["uuid"]).upper()),
                ("bus_id", str(gpu["bus_id"]).upper()[-12:])} - {("uuid", "NONE"), ("bus_id", "NONE")}   # [N/A]: no key
        if gpu["index"] is None or keys & taken:
            continue
        taken |= keys
        gpu["lost"] = False
        gpus.append(gpu)
    return gpus


class NvidiaGpus(FactBase):
    """One dict per GPU, [] when nvidia-smi is missing or the driver is not loaded::

        [{"index": 0, "uuid": "GPU-46c2...", "bus_id": "00000000:00:06.0",
          "pci_device_id": "10de:2335", "name": "NVIDIA H200", "compute_capability": (9, 0),
          "memory_total_mib": 143771, "memory_used_mib": 0, "power_limit_w": 700.0,
          "power_min_w": 200.0, "power_max_w": 700.0, "power_default_w": 700.0,
          "power_draw_w": 124.0, "temperature_c": 35, "persistence": True, "pcie_gen": 5,
          "pcie_width": 16, "driver_version": "580.159.04", "pcie_gen_max": 5, "pcie_width_max": 16,
          "lost": False},
         {"lost": True, "bus_id": "00000000:47:00.0"}]       # a card fallen off the bus

    Fields nvidia-smi reports as [N/A] (or [Not Supported], ...) are None.
    """

    default = list

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return GPU_COMMAND

    def process(self, output: list[str]) -> list[dict]:
        return parse_gpus(output)


def present_gpus(gpus: list[dict]) -> list[dict]:
    """The cards of an :class:`NvidiaGpus` value that answered (not lost)."""
    return [g for g in gpus if not g.get("lost")]


# ----------------------------------------------------------------------------- helpers
def sections(lines: list[str], prefix: str) -> dict[str, list[str]]:
    """Split ``lines`` at marker lines ``<prefix><name>``; what precedes the first marker is dropped."""
    out: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(prefix):
            current = line[len(prefix):].strip()
            out.setdefault(current, [])
        elif current is not None:
            out[current].append(line)
    return out


# ----------------------------------------------------------------------------- driver
DRIVER_PROC_COMMAND = "echo '--- proc'; cat /proc/driver/nvidia/version 2>/dev/null"
DRIVER_COMMAND = (
    DRIVER_PROC_COMMAND + "; echo '--- smi'; if command -v nvidia-smi >/dev/null 2>&1; then "
    "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1; fi; true"
)
_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (Open )?.*?Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")


def parse_driver(lines: list[str]) -> dict:
    """``DRIVER_COMMAND``'s output -> ``{"version", "kernel_module", "loaded"}``.

    ``kernel_module`` is "open" (NVIDIA UNIX Open Kernel Module), "proprietary" (NVIDIA UNIX
    x86_64 Kernel Module) or None (no /proc/driver/nvidia/version). ``loaded`` is True when the
    kernel module answers: /proc/driver/nvidia/version exists, or nvidia-smi printed a version.
    """
    sec = sections(lines, "--- ")
    version = module = None
    for line in sec.get("proc", []):
        m = _PROC_VERSION.search(line)
        if m:
            version, module = m.group(2), "open" if m.group(1) else "proprietary"
            break
    smi = next((ln.strip() for ln in sec.get("smi", []) if re.fullmatch(r"\s*[0-9]+(\.[0-9]+)+\s*", ln)), None)
    return {"version": version or smi, "kernel_module": module, "loaded": bool(version or smi)}


def _no_driver() -> dict:
    return {"version": None, "kernel_module": None, "loaded": False}


class NvidiaDriver(FactBase):
    """The NVIDIA kernel driver::

        {"version": "580.159.04", "kernel_module": "open" | "proprietary" | None, "loaded": True}

    ``{"version": None, "kernel_module": None, "loaded": False}`` without a loaded driver.
    """

    default = staticmethod(_no_driver)

    def command(self) -> str:
        return DRIVER_COMMAND

    def process(self, output: list[str]) -> dict:
        return parse_driver(output)


# ----------------------------------------------------------------------------- CUDA toolkits
# Each nvcc is run (--version) and later compiles as root only where root owns it and every directory the
# kernel reads on the way to it, none writable by group or others (round 5 A8: an nvcc at /tmp/x/nvcc found
# on PATH became the build's CMAKE_CUDA_COMPILER); else its header is followed by ``unsafe UID MODE
# OWNER:GROUP DIR`` (the first such: Debian's /usr/local is 2775 root:staff) and it is not run.
#
# The name is resolved one component at a time (``rigup_chain``, as namei does): each link met is read only
# after the directory holding it was walked up to / (``rigup_walk``), for a link in a directory another user
# writes is theirs to point elsewhere, at any hop (N22's stricter rule; round 7 N2: /usr/bin/nvcc -> nobody's
# /shared/nvcc -> root's nvcc). A ``..`` goes up only from a directory walked too, as acceptance.py's
# ``alone()`` checks every part (round 7b X1: root's /usr/bin/nvcc -> /home/eve/x/../../../opt/cuda/bin/nvcc
# passed, its real path root's, until eve made x a link). The build runs cuda_source nvidia's and distro's
# nvcc by that name. Then the real path the chain reached, ``$r`` (it must be readlink -f's too), is walked
# from the file itself up: the program run is ``$r``, never the name again (a link flipped between the
# check and the run, round re5 N22). ``stat -L``: a link's own mode is always 777 and no one changes it; who
# may replace it is its directory's question. Links beyond 40 hops, or a target outside the names below:
# ``unsafe name LINK``.
#
# Names are this strict set (round 7 N1, N11: a directory named ``cuda<LF>Cuda compilation tools, release
# 12.8<LF>--- Q`` forged a section of its own; a space split the header): a name outside it is never printed
# and never run, so no line of the output is a name's to make. ``$n`` outside it is no nvcc (it is not the
# build's fixed name, which is in the set); a real path outside it is refused by the link that leads there.
NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._+-"
_NAME = re.compile(r"/[A-Za-z0-9/._+-]{0,4095}")
_BAD = f"*[!{NAME_CHARS}]*"     # a sh case pattern: a byte outside the set (a newline, a space, UTF-8)
# Only the uid and the mode are split (digits); an owner's or group's name is another's text (sssd's "john
# smith", an LDAP name of 70 characters: round 8 N1, a line _UNSAFE did not read, the refusal silent), so each
# is read alone, quoted, every byte outside OWNER_CHARS a ?, and cut to OWNER_MAX.
OWNER_CHARS, OWNER_MAX = "A-Za-z0-9._@+ -", 256
_WALK = (f'rigup_name() {{ w=$(stat -L -c "$1" "$2" 2>/dev/null); printf %s "${{w:-?}}" | tr -c {shlex.quote(OWNER_CHARS)} "?" '
         f'| cut -c1-{OWNER_MAX}; }}; '
         'rigup_walk() { p=$1; while :; do set -- $(stat -L -c "%u %a" "$p" 2>/dev/null); '
         'if [ "${1:-x}" != 0 ] || [ $((0${2:-777} & 022)) -ne 0 ]; then '
         'u="${1:-?} ${2:-?} $(rigup_name %U "$p"):$(rigup_name %G "$p") $p"; return 1; fi; '
         '[ "$p" = / ] && return 0; p=$(dirname "$p"); done; }; ')
_CHAIN = ('rigup_chain() { d=/; s=$1; h=0; while [ -n "$s" ]; do x=${s%%/*}; '
          'case "$s" in */*) s=${s#*/};; *) s=;; esac; '
          'case "$x" in ""|.) continue;; ..) rigup_walk "$d" || return 1; d=$(dirname "$d"); continue;; esac; q=${d%/}/$x; '
          'if [ -L "$q" ]; then rigup_walk "$d" || return 1; h=$((h+1)); t=$(readlink -n "$q"; echo .); t=${t%.}; '
          f'case "$t" in ""|{_BAD}) u="name $q"; return 1;; esac; [ $h -le 40 ] || {{ u="name $q"; return 1; }}; '
          'case "$t" in /*) d=/;; esac; s=$t/$s; else d=$q; fi; done; }; ')
CUDA_COMMAND = (
    _WALK + _CHAIN
    # PATH's nvcc is one word, quoted (round 8 X4: a PATH entry "/opt/a b" split it, and root ran /opt/a),
    # and only a name ending in /nvcc is one
    + 'c=$(command -v nvcc 2>/dev/null); for n in /usr/local/cuda*/bin/nvcc "$c"; do '
    f'case "$n" in /*/nvcc|/nvcc) ;; *) continue;; esac; case "$n" in {_BAD}) continue;; esac; '
    '[ -x "$n" ] || continue; r=$(readlink -f "$n"); [ -n "$r" ] || continue; '
    f'case "$r" in {_BAD}) r=$n;; esac; echo "--- $n $r"; u=; '
    'if rigup_chain "$n"; then if [ "$d" != "$r" ]; then u="name $n"; else rigup_walk "$r"; fi; fi; '
    'if [ -n "$u" ]; then echo "unsafe $u"; else "$r" --version 2>/dev/null; fi; '
    "done; true"
)
# a section's header: the name and the real path, each absolute and of NAME_CHARS (a space splits them)
_HEADER = re.compile(rf"--- ({_NAME.pattern}) ({_NAME.pattern})")
# what the walk printed of the first directory root does not own alone (or, in the older form, its path
# alone), or ``name LINK``: a link the chain did not follow
_OWNER = f"[?{OWNER_CHARS}]{{1,{OWNER_MAX}}}"   # as the walk prints a name: no ':' and no '/', so the path is the last word
_UNSAFE = re.compile(rf"unsafe (?:name ({_NAME.pattern})|(?:([0-9]{{1,10}}|\?) ([0-7]{{1,4}}|\?) "
                     rf"({_OWNER}):({_OWNER}) )?({_NAME.pattern}))")
# ASCII, bounded: a CUDA release is two digits at most before its point (12.8, 13.0; "9999.9999" met every min_cuda)
_NVCC_RELEASE = re.compile(r"release ([1-9][0-9]?\.[0-9]{1,2}), V([0-9]{1,6}(?:\.[0-9]{1,6}){0,4})")


def cuda_sections(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """:data:`CUDA_COMMAND`'s output -> ``[(name, real path, lines)]``, in order. A header that is not two
    absolute paths of :data:`NAME_CHARS` (the command prints none such: text of another kind, round 7 N1)
    starts no section, and the lines under it belong to none."""
    out: list[tuple[str, str, list[str]]] = []
    body = None
    for line in lines:
        if line.startswith("--- "):
            m = _HEADER.fullmatch(line.rstrip("\r"))
            body = [] if m else None
            if m:
                out.append((m.group(1), m.group(2), body))
        elif body is not None:
            body.append(line)
    return out


def parse_cuda_toolkits(lines: list[str]) -> list[dict]:
    """``CUDA_COMMAND``'s output -> ``[{"version": "12.8", "full_version": "12.8.93",
    "path": "/usr/local/cuda-12.8/bin/nvcc", "seen_as": [...]}]``, one per real nvcc (deduped by
    realpath, ``path`` is the realpath: the path the walk read), sorted by version. One of a path root does
    not own alone (``unsafe``: :data:`CUDA_COMMAND`), or under a header that is not the command's
    (:func:`cuda_sections`), is none."""
    found: dict[str, dict] = {}
    sections = cuda_sections(lines)
    # a name refused anywhere is none (the command found it twice, by the glob and on PATH, and it changed)
    refused = {seen for seen, _, body in sections if any(ln.startswith("unsafe") for ln in body)}
    for seen, real, body in sections:
        if seen in refused:
            continue
        m = next((m for m in map(_NVCC_RELEASE.search, body) if m), None)
        if not m:
            continue
        entry = found.setdefault(real, {"version": m.group(1), "full_version": m.group(2),
                                        "path": real, "seen_as": []})
        if seen not in entry["seen_as"]:
            entry["seen_as"].append(seen)
    return sorted(found.values(), key=lambda t: (tuple(map(int, t["version"].split("."))), t["path"]))


def _refusal(seen: str, real: str, line: str) -> dict | None:
    """One ``unsafe`` line of :data:`CUDA_COMMAND` under the header ``seen real`` -> the refused nvcc: its
    real ``path``, the ``dir`` root does not own alone (or the link not followed), its ``mode``, ``owner``
    and ``group`` (None where the walk could not tell), ``why`` (in words) and ``fix`` (commands for the
    operator); an ``unsafe`` line that does not read refuses its real path all the same; None for another line."""
    if not line.startswith("unsafe"):   # what parse_cuda_toolkits reads as refusing the section
        return None
    m = _UNSAFE.fullmatch(line.rstrip())
    if not m:   # never silently none (round 8 N1): the nvcc was not run, and its refusal says so
        return {"path": real, "seen_as": [seen], "dir": real, "mode": None, "owner": None, "group": None,
                "why": f"{real} was not run: a directory on its way is not root's alone (the walk's line does not "
                       f"read: {shown(line, 120)})",
                "fix": f"make every directory from {shlex.quote(real)} up to / root's alone (chown root, chmod go-w)"}
    link = m.group(1)
    if link:
        return {"path": real, "seen_as": [seen], "dir": link, "mode": None, "owner": None, "group": None,
                "why": f"{link} is a link rigup does not follow (its target holds a character other than "
                       "A-Z a-z 0-9 / . _ + -, or more than 40 links lead there)",
                "fix": f"point {shlex.quote(link)} at the toolkit's plain path"}
    uid, mode, owner, group, where = (None if g in (None, "?") else g for g in m.groups()[1:])
    # the octal digits of group and others (no int(): the regex took 1-4 of 0-7); 2, 3, 6, 7 have w
    group_w, other_w = ((mode or "0").zfill(4)[i] in "2367" for i in (2, 3))
    why, fix = [], []
    if uid is not None and uid != "0":
        why.append(f"owned by {owner or 'uid ' + uid}")
        fix.append(f"chown root {shlex.quote(where)}")
    if group_w:
        why.append(f"writable by group {group or '?'}")
        fix.append(f"chmod g-w {shlex.quote(where)}")
    if other_w:
        why.append("writable by others")
        fix.append(f"chmod o-w {shlex.quote(where)}")
    state = f"{mode} {owner or '?'}:{group or '?'}" if mode else "not readable (stat failed)"
    return {"path": real, "seen_as": [seen], "dir": where, "mode": mode, "owner": owner,
            "group": group, "why": f"{where} is {state}" + (f", {' and '.join(why)}" if why else ""),
            "fix": "; ".join(fix) or f"make {shlex.quote(where)} root's alone (chown root, chmod go-w)"}


def parse_refused_nvcc(lines: list[str]) -> list[dict]:
    """The nvccs :data:`CUDA_COMMAND` found and did not run (``unsafe``: a directory on the way to the real
    path or in the name's links that root does not own alone, or a link not followed), one per real path
    and directory: ``[{"path", "seen_as", "dir", "mode", "owner", "group", "why", "fix"}]``
    (:func:`_refusal`), so that a refused nvcc is said, not silently none. A real path may be refused by
    one name and a toolkit by another."""
    found: dict[tuple[str, str], dict] = {}
    for seen, real, body in cuda_sections(lines):
        got = next((r for r in (_refusal(seen, real, ln) for ln in body) if r), None)
        if not got:
            continue
        entry = found.setdefault((got["path"], got["dir"]), got)
        if seen not in entry["seen_as"]:
            entry["seen_as"].append(seen)
    return sorted(found.values(), key=lambda r: (r["path"], r["dir"]))


class CudaToolkits(FactBase):
    """Installed CUDA toolkits (each /usr/local/cuda*/bin/nvcc and the nvcc on PATH)::

        [{"version": "12.8", "full_version": "12.8.93", "path": "/usr/local/cuda-12.8/bin/nvcc",
          "seen_as": ["/usr/local/cuda/bin/nvcc", "/usr/local/cuda-12.8/bin/nvcc"]}]
    """

    default = list

    def command(self) -> str:
        return CUDA_COMMAND

    def process(self, output: list[str]) -> list[dict]:
        return parse_cuda_toolkits(output)


class RefusedNvcc(CudaToolkits):
    """The nvccs :class:`CudaToolkits` found and did not run (:func:`parse_refused_nvcc`): roles/cuda_toolkit
    reads it only after it installed a compiler, before llama.cpp compiles with it."""

    def process(self, output: list[str]) -> list[dict]:
        return parse_refused_nvcc(output)


# ----------------------------------------------------------------------------- disk
def free_disk_command(path: str) -> str:
    return (f"p={shlex.quote(path)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            "df -B1 --output=avail \"$p\" 2>/dev/null | tail -n 1; true")


def parse_free_disk(lines: list[str]) -> int | None:
    """The last number in ``df -B1 --output=avail``'s output (bytes), or None."""
    return next((whole(ln) for ln in reversed(lines) if whole(ln) is not None), None)


class FreeDisk(FactBase):
    """Free bytes (for an unprivileged user, like ``df``) on the filesystem that holds ``path``,
    or its nearest existing parent: ``68702195712``. None when df cannot tell."""

    def command(self, path: str = "/") -> str:
        return free_disk_command(path)

    def process(self, output: list[str]) -> int | None:
        return parse_free_disk(output)


# ----------------------------------------------------------------------------- ports
# ss names the process (and, -e, the socket's owner: uid:N, none for root); without ss (many rental
# containers) the kernel's own tables say which ports listen (state 0A), without names; with neither,
# nothing can be told ("none"). After ss's sockets, the account of each uid it printed (``--- users``,
# ``name:uid`` from getent, else /etc/passwd), so that a listener is named with the account it runs as.
PORTS_COMMAND = ("if command -v ss >/dev/null 2>&1; then echo ss; s=$(ss -Hltnpe 2>/dev/null); printf '%s\\n' \"$s\"; "
                 "echo '--- users'; for u in $(printf '%s\\n' \"$s\" | grep -o 'uid:[0-9]*' | sort -u | cut -d: -f2); do "
                 "getent passwd \"$u\" 2>/dev/null | cut -d: -f1,3 | grep . || "
                 "awk -F: -v u=\"$u\" '$3 == u {print $1 \":\" $3; exit}' /etc/passwd; done; "
                 "elif [ -r /proc/net/tcp ]; then echo proc; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; "
                 "else echo none; fi")
_SS_PROCESS = re.compile(r'users:\(\("([^"]+)"')
_SS_UID = re.compile(r"uid:([0-9]{1,10})")   # a column of its own; a process name may hold one too
_SS_INODE = re.compile(r"ino:[0-9]{1,20}")   # ss -e's column after the process (and the uid): the line's end is there
_COLUMNS = re.compile(r"[ \t\n]+")          # ss's separators (str.split() cuts at U+0085 and U+2028 too)


def parse_listening_ports(lines: list[str]) -> dict[int, str | None] | None:
    """``PORTS_COMMAND``'s output -> ``{22: "sshd", 8080: "llama-server (user rigup)"}``; a name is None
    when it cannot be seen (ss run without root, or /proc/net/tcp, which names no process); None when
    no source answered (nothing can be told about any port). A socket of any account but root's has its
    name with that account, ``"llama-server (user rigup)"`` (``(uid 33)`` where the uid has no name):
    preflight takes it for a unit's only where the account is the unit's own (roles/preflight/checks.py
    port_refusals; round 5 A25 and re5 N1: any user's process named llama-server passed as the
    instance's own, a system account's by its name alone). A port several processes listen on (on other
    addresses) has their names joined, ``"llama-server and python3 (user alice)"``: each is seen, not the
    first socket's alone (re5 N4)."""
    source, lines = (lines[0].strip(" \t\r\n\f\v"), lines[1:]) \
        if lines and lines[0].strip(" \t\r\n\f\v") in ("ss", "proc", "none") else ("ss", lines)
    if source == "none":
        return None
    accounts: dict[str, str] = {}
    if "--- users" in lines:   # the last: a process name may hold a line break, ss prints it as it is
        at = len(lines) - 1 - lines[::-1].index("--- users")
        for entry in lines[at + 1:]:
            name, _, uid = entry.strip(" \t\r\n\f\v").rpartition(":")
            if name and whole(uid) is not None:
                accounts[uid] = name
        lines = lines[:at]
    if source == "ss":   # a line not of a socket (LISTEN first) is the one before's, cut by a name's line break
        sockets: list[str] = []
        for line in lines:
            if sockets and _COLUMNS.split(line.strip(" \t\n"))[0] != "LISTEN":
                sockets[-1] += "\n" + line
            else:
                sockets.append(line)
        lines = sockets
    found: dict[int, list[str | None]] = {}
    for line in lines:
        cols = [c for c in _COLUMNS.split(line) if c]
        if source == "proc":
            hexport = cols[1].rpartition(":")[2] if len(cols) > 3 else ""
            if cols[3:4] == ["0A"] and re.fullmatch(r"[0-9A-Fa-f]{1,4}", hexport):   # 0A: TCP_LISTEN
                found.setdefault(int(hexport, 16), [])
            continue
        if len(cols) < 4 or cols[0] != "LISTEN":
            continue
        at = whole(cols[3].rpartition(":")[2], 65535)
        if at is None:
            continue
        proc = _SS_PROCESS.search(line)
        uids = [m.group(1) for m in map(_SS_UID.fullmatch, cols) if m]
        # a name only with ss's inode column after it: a socket line without one was cut short (a process
        # named 'llama-server"' and a line break left its uid on the next line: read as root's; round 9 PT1)
        name = proc.group(1) if proc and any(map(_SS_INODE.fullmatch, _COLUMNS.split(line[proc.end():]))) else None
        # ss prints no uid for root's socket; a second uid column is a process name's (never root's then)
        uid = uids[0] if len(uids) == 1 else "?" if uids else "0"
        if name is not None and uid != "0":
            name = f"{name} (user {accounts[uid]})" if uid in accounts else f"{name} (uid {uid})"
        if name not in found.setdefault(at, []):
            found[at].append(name)
    return {port: _listeners(names) for port, names in found.items()}


def _listeners(names: list[str | None]) -> str | None:
    """The name of a port's listeners: one, or all joined (a process that cannot be named among named
    ones is said so: it may be anyone's); None when none can be named (ss without root, /proc)."""
    if all(n is None for n in names):
        return None
    return " and ".join(n if n is not None else "a process not named" for n in names)


class ListeningPorts(FactBase):
    """TCP ports something listens on, with the process name: ``{22: "sshd", 8080: None}``
    (from ss, else /proc/net/tcp); None when neither can be read."""

    default = dict

    def command(self) -> str:
        return PORTS_COMMAND

    def process(self, output: list[str]) -> dict[int, str | None]:
        return parse_listening_ports(output)


# ----------------------------------------------------------------------------- Secure Boot
SECURE_BOOT_COMMAND = (
    "if command -v mokutil >/dev/null 2>&1; then echo '--- mokutil'; mokutil --sb-state 2>&1; fi; "
    "for f in /sys/firmware/efi/efivars/SecureBoot-*; do [ -e \"$f\" ] || continue; "
    "echo '--- efivar'; od -An -t u1 \"$f\"; done; true"
)


def parse_secure_boot(lines: list[str]) -> bool | None:
    """True/False when mokutil or the EFI variable says so, None when unknown (no EFI, no tool)."""
    sec = sections(lines, "--- ")
    for line in sec.get("mokutil", []):
        low = line.lower()
        if "secureboot enabled" in low:
            return True
        if "secureboot disabled" in low:
            return False
    values = " ".join(sec.get("efivar", [])).split()
    if len(values) >= 5 and values[-1] in ("0", "1"):  # 4 attribute bytes, then the value
        return values[-1] == "1"
    return None


class SecureBoot(FactBase):
    """Whether UEFI Secure Boot is on (unsigned kernel modules will not load): True, False, or
    None when unknown (BIOS boot, a container, no mokutil and no efivars)."""

    def command(self) -> str:
        return SECURE_BOOT_COMMAND

    def process(self, output: list[str]) -> bool | None:
        return parse_secure_boot(output)


# ----------------------------------------------------------------------------- kernel, init
KERNEL_COMMAND = ('r=$(uname -r); echo "$r"; '
                  'if [ -e "/lib/modules/$r/build" ]; then echo headers=yes; else echo headers=no; fi')


def parse_kernel(lines: list[str]) -> dict:
    """``{"release": "6.8.0-45-generic", "headers": True}`` (headers: /lib/modules/<release>/build exists)."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    if not lines:
        return {"release": None, "headers": False}
    return {"release": lines[0] if not lines[0].startswith("headers=") else None,
            "headers": "headers=yes" in lines}


class KernelInfo(FactBase):
    """The running kernel and whether its headers (needed to build DKMS modules) are installed::

        {"release": "6.8.0-45-generic", "headers": True}
    """

    default = staticmethod(lambda: {"release": None, "headers": False})

    def command(self) -> str:
        return KERNEL_COMMAND

    def process(self, output: list[str]) -> dict:
        return parse_kernel(output)


SYSTEMD_COMMAND = "if [ -d /run/systemd/system ]; then echo yes; else echo no; fi"
# The serving instances rigup installed (their drop-ins), so that one dropped from the
# configuration is stopped and removed: "rigup-llama@glm", "rigup-vllm@q"; and "rigup-ray" (a Ray
# node of roles/vllm).
SERVING_COMMAND = ("ls /etc/systemd/system 2>/dev/null | sed -n 's/^\\(rigup-[a-z]*@.*\\)\\.service\\.d$/\\1/p'; "
                   "if [ -f /etc/systemd/system/rigup-ray.service ]; then echo rigup-ray; fi")


def parse_systemd(lines: list[str]) -> bool:
    return any(ln.strip() == "yes" for ln in lines)


class Systemd(FactBase):
    """True when systemd is PID 1 (``/run/systemd/system`` exists), so units can be installed."""

    default = bool

    def command(self) -> str:
        return SYSTEMD_COMMAND

    def process(self, output: list[str]) -> bool:
        return parse_systemd(output)


# ----------------------------------------------------------------------------- CPU
# The first processor's /proc/cpuinfo lines of these keys (x86: vendor_id, model name, flags;
# aarch64: Features, CPU implementer, CPU part), the logical CPUs, one "<package> <core>" line per
# physical core (from /sys, else /proc/cpuinfo's physical id / core id), and the NUMA nodes.
CPUINFO = "/proc/cpuinfo"
CPU_SYS = "/sys/devices/system/cpu"
NODE_SYS = "/sys/devices/system/node"
CPUINFO_KEYS = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part")
CPU_COMMAND = (
    f"echo '--- cpuinfo'; for k in {' '.join(map(shlex.quote, CPUINFO_KEYS))}; do "
    f"grep -m1 \"^$k[[:space:]]*:\" {shlex.quote(CPUINFO)} 2>/dev/null; done; "
    f"echo '--- logical'; n=$(grep -c '^processor[[:space:]]*:' {shlex.quote(CPUINFO)} 2>/dev/null); "
    "[ \"${n:-0}\" -gt 0 ] 2>/dev/null || n=$(nproc 2>/dev/null); echo \"$n\"; "
    f"echo '--- topology'; t=$(for d in {shlex.quote(CPU_SYS)}/cpu[0-9]*/topology; do [ -r \"$d/core_id\" ] && "
    "echo \"$(cat \"$d/physical_package_id\" 2>/dev/null || echo 0) $(cat \"$d/core_id\")\"; done | sort -u); "
    "if [ -n \"$t\" ]; then echo \"$t\"; else awk -F': *' '/^physical id/ {p = $2} /^core id/ {print p, $2}' "
    f"{shlex.quote(CPUINFO)} 2>/dev/null | sort -u; fi; "
    f"echo '--- numa'; n=0; for d in {shlex.quote(NODE_SYS)}/node[0-9]*; do [ -d \"$d\" ] && n=$((n + 1)); done; "
    "echo \"$n\"; echo '--- memory'; grep -m1 '^MemTotal:' /proc/meminfo 2>/dev/null; true"
)
# The flags that matter to llama.cpp / vLLM CPU kernels, as the kernel spells them (aarch64's
# asimddp is kept as dotprod); every other flag is dropped.
CPU_FLAGS = frozenset((
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
    "avx512vbmi", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8",
    "amx_bf16", "amx_fp16", "asimd", "asimdhp", "dotprod", "i8mm", "bf16", "sve", "sve2", "sme",
))
_CPU_FLAG_NAMES = {"asimddp": "dotprod"}
_CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon", "CentaurHauls": "Centaur"}
# aarch64 has no vendor_id / model name: "CPU implementer" and "CPU part" (as lscpu names them).
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon", 0x4E: "NVIDIA",
                     0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere"}
_ARM_PARTS = {(0x41, 0xD08): "Cortex-A72", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
              (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4F): "Neoverse-V2",
              (0x41, 0xD84): "Neoverse-V3", (0x41, 0xD8E): "Neoverse-N3", (0x46, 0x001): "A64FX",
              (0x48, 0xD01): "Kunpeng-920", (0xC0, 0xAC3): "Ampere-1", (0xC0, 0xAC4): "Ampere-1a"}


def _hex(text: str | None) -> int | None:
    """``"0x41"`` -> 65; None when not 0x and 1-4 ASCII hex digits (int(text, 16) takes ``0x4_1``,
    blanks and other scripts' digits)."""
    m = re.fullmatch(r"0[xX]([0-9A-Fa-f]{1,4})", (text or "").strip())
    return int(m.group(1), 16) if m else None


# The most CPUs and NUMA nodes a count of the kernel's may say (Linux's NR_CPUS is 8192 at most, NODES_SHIFT
# 10), and the most RAM (1 PiB): a larger one is no host's (round 5 A14: 10^18 threads, 1e18 bytes were planned)
CPUS_MAX, MEM_KIB_MAX = 1 << 16, 1 << 40


def _count(lines: list[str]) -> int | None:
    """The first line that is a whole number of at most :data:`CPUS_MAX`, or None."""
    return next((n for n in (whole(ln, CPUS_MAX) for ln in lines) if n is not None), None)


def parse_cpu(lines: list[str]) -> dict:
    """``CPU_COMMAND``'s output -> ``{"vendor", "model", "logical", "cores", "sockets",
    "numa_nodes", "flags", "amx", "mem_bytes"}`` (``mem_bytes``: the host's RAM, MemTotal).

    ``vendor`` is short ("Intel", "AMD"; on aarch64 the implementer: "ARM", "Ampere"...), ``model``
    the model name (aarch64: the part, "Neoverse-V1"), ``cores`` the distinct (package, core)
    pairs, ``numa_nodes`` 1 when /sys has no node (a kernel without NUMA); each None when unknown.
    ``flags`` is the sorted :data:`CPU_FLAGS` the CPU has, ``amx`` whether it has AMX tiles with
    INT8 or BF16. Garbled text gives these empty values, never an error.
    """
    sec = sections(lines, "--- ")
    info: dict[str, str] = {}
    for line in sec.get("cpuinfo", []):
        key, sep, value = line.partition(":")
        if sep and key.strip() and value.strip():
            info.setdefault(key.strip(), " ".join(value.split()))
    raw = (info.get("flags") or info.get("Features") or "").split()
    flags = sorted({_CPU_FLAG_NAMES.get(f, f) for f in raw} & CPU_FLAGS)
    implementer, part = _hex(info.get("CPU implementer")), _hex(info.get("CPU part"))
    vendor = info.get("vendor_id")
    vendor = _CPU_VENDORS.get(vendor, vendor) if vendor else _ARM_IMPLEMENTERS.get(implementer)
    pairs = set()
    for line in sec.get("topology", []):
        cells = _COLUMNS.split(line.strip(" \t"))   # "PACKAGE CORE" (str.split() cuts at U+0085 too)
        ids = [number(c, int, -1, 1 << 20) for c in cells]   # sysfs ids (-1: none), ASCII, bounded (5000 digits ended preflight)
        if len(ids) == 2 and None not in ids:
            pairs.add((ids[0], ids[1]))
    numa = _count(sec.get("numa", []))
    return {
        "vendor": vendor,
        "model": info.get("model name") or _ARM_PARTS.get((implementer, part)),
        "logical": _count(sec.get("logical", [])) or None,
        "cores": len(pairs) or None,
        "sockets": len({p for p, _ in pairs}) or None,
        "numa_nodes": None if numa is None else max(numa, 1),
        "flags": flags,
        "amx": "amx_tile" in flags and bool({"amx_int8", "amx_bf16"} & set(flags)),
        "mem_bytes": _mem_bytes(sec.get("memory", [])),
    }


def _mem_bytes(lines: list[str]) -> int | None:
    """``MemTotal:  263846212 kB`` -> bytes, or None."""
    m = re.fullmatch(r"MemTotal:\s*([0-9]{1,15}) kB", lines[0].strip()) if lines else None
    kib = whole(m.group(1), MEM_KIB_MAX) if m else None
    return None if kib is None else kib * 1024


class CpuInfo(FactBase):
    """The host's CPU (see :func:`parse_cpu`)::

        {"vendor": "Intel", "model": "Intel(R) Xeon(R) Platinum 8480+", "logical": 224, "cores": 112,
         "sockets": 2, "numa_nodes": 2, "flags": ["amx_bf16", "amx_int8", ..., "fma"], "amx": True}
    """

    @staticmethod
    def default() -> dict:
        return parse_cpu([])

    def command(self) -> str:
        return CPU_COMMAND

    def process(self, output: list[str]) -> dict:
        return parse_cpu(output)


# ----------------------------------------------------------------------------- PCI
# NVIDIA display and 3D controllers on the PCI bus, read from sysfs (no pciutils on a bare host):
# what a host has before any driver answers (roles/nvidia_driver plans from it)
PCI_COMMAND = ('for v in $(grep -lx 0x10de /sys/bus/pci/devices/*/vendor 2>/dev/null); do d=${v%/vendor}; '
               'read -r dev < "$d/device"; read -r cls < "$d/class"; echo "${d##*/} $dev $cls"; done; true')


def parse_pci(lines: list[str]) -> list[dict]:
    """``PCI_COMMAND``'s output -> ``[{"bus_id": "0000:07:00.0", "pci_device_id": "10de:20b2"}]``,
    the NVIDIA GPUs (class 0x0300 VGA or 0x0302 3D controller; not their audio functions), in bus order.
    A line whose bus id is not one (:func:`rigup.boundary.fields.pci_bus_id`, as nvidia-smi's are read) or
    whose device id is not 0x and 4 hex digits is skipped (round 5 A4: an escape sequence in a bus id
    reached roles/nvidia_driver's error text, printed as it was)."""
    found = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3 or not re.fullmatch(r"0x[0-9A-Fa-f]{4}", parts[1]) or parts[2][:6] not in ("0x0300", "0x0302"):
            continue
        try:
            bus = fields.pci_bus_id(parts[0], "a PCI device's sysfs name")
        except Unreadable:
            continue
        found.append({"bus_id": bus, "pci_device_id": f"10de:{parts[1][2:].lower()}"})
    return sorted(found, key=lambda d: d["bus_id"])


# ----------------------------------------------------------------------------- all at once
MARK = "##rigup:"


def hardware_command(paths: list[str] | tuple[str, ...] = ("/",)) -> str:
    parts = [
        f"echo '{MARK}gpus'; if command -v nvidia-smi >/dev/null 2>&1; then {GPU_COMMAND}; fi",
        # the driver's version from /proc; nvidia-smi's is the gpus query's own column (a second
        # nvidia-smi run costs a real host 50-300 ms: parse_hardware reads it from the gpus)
        f"echo '{MARK}driver'; {{ {DRIVER_PROC_COMMAND}; true; }}",
        f"echo '{MARK}cuda'; {{ {CUDA_COMMAND}; }}",
        f"echo '{MARK}ports'; {PORTS_COMMAND}",
        f"echo '{MARK}secure_boot'; {{ {SECURE_BOOT_COMMAND}; }}",
        f"echo '{MARK}kernel'; {KERNEL_COMMAND}",
        f"echo '{MARK}systemd'; {SYSTEMD_COMMAND}",
        f"echo '{MARK}serving'; {SERVING_COMMAND}",
        f"echo '{MARK}cpu'; ( {CPU_COMMAND} )",
        # the PCI read once: the fabric manager is read only where it found an NVSwitch (class 0x0680)
        f"echo '{MARK}pci'; pci=$({PCI_COMMAND}); printf '%s\\n' \"$pci\"",
        f"echo '{MARK}fabric'; case \"$pci\" in *' {NVSWITCH_CLASS}'*) {MANAGER_COMMAND};; esac",
    ]
    for path in paths:
        parts.append(f"echo {shlex.quote(MARK + 'disk ' + path)}; ( {free_disk_command(path)} )")
    return "; ".join(parts) + "; true"


def parse_hardware(lines: list[str]) -> dict:
    """``hardware_command(paths)``'s output -> the value of :class:`HardwareFacts`."""
    sec = sections(lines, MARK)
    gpus = parse_gpus(sec.get("gpus", []))
    smi = next((g["driver_version"] for g in gpus if g.get("driver_version")), None)
    return {
        "gpus": gpus,
        "driver": parse_driver(sec.get("driver", []) + (["--- smi", str(smi)] if smi else [])),
        "cuda_toolkits": parse_cuda_toolkits(sec.get("cuda", [])),
        "cuda_refused": parse_refused_nvcc(sec.get("cuda", [])),
        "listening_ports": parse_listening_ports(sec.get("ports", [])),
        "secure_boot": parse_secure_boot(sec.get("secure_boot", [])),
        "kernel": parse_kernel(sec.get("kernel", [])),
        "systemd": parse_systemd(sec.get("systemd", [])),
        "serving_units": sorted(line.strip() for line in sec.get("serving", []) if line.strip()),
        "cpu": parse_cpu(sec.get("cpu", [])),
        "pci": parse_pci(sec.get("pci", [])),
        "nvswitches": parse_nvswitches(sec.get("pci", [])),
        "fabric_manager": parse_manager(sec.get("fabric", [])),
        "free_disk": {k[5:]: parse_free_disk(v) for k, v in sec.items() if k.startswith("disk ")},
    }


class Facts(TypedDict, total=False):
    """What preflight read of a host (:class:`HardwareFacts`, one round trip) and what it adds:
    ``model_bytes`` (roles/preflight PathBytes) and ``reads`` (the roles' ``plan_reads``: fact class
    name -> value). The checks take it as ``facts``."""

    gpus: list[dict]
    driver: dict
    cuda_toolkits: list[dict]
    cuda_refused: list[dict]
    listening_ports: dict[int, str | None]
    secure_boot: bool | None
    kernel: dict
    systemd: bool
    serving_units: list[str]
    cpu: dict
    pci: list[dict]
    nvswitches: list[str]
    fabric_manager: dict
    free_disk: dict[str, int | None]
    model_bytes: dict
    reads: dict[str, Any]


class HardwareFacts(FactBase):
    """Every fact above in one round trip, for preflight::

        {"gpus": [...NvidiaGpus...], "driver": {...NvidiaDriver...},
         "cuda_toolkits": [...CudaToolkits...], "cuda_refused": [...parse_refused_nvcc...],
         "listening_ports": {22: "sshd"},
         "secure_boot": None, "kernel": {"release": ..., "headers": ...}, "systemd": True,
         "cpu": {...CpuInfo...}, "pci": [{"bus_id", "pci_device_id"}], "free_disk": {"/": 68702195712}}

    ``host.get_fact(HardwareFacts, paths=["/", "/var/lib/rigup"])`` sizes ``free_disk``.
    """

    @staticmethod
    def default() -> dict:
        return parse_hardware([])

    def command(self, paths: list[str] | tuple[str, ...] = ("/",)) -> str:
        return hardware_command(paths)

    def process(self, output: list[str]) -> dict:
        return parse_hardware(output)
