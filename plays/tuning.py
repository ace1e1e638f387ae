"""tune.py's pieces on the controller: each llama-server instance's sweep spec (its sized context
and slots from the serving plan, the command line its drop-in runs once that is the plan's:
:func:`differences`), the job that runs plays/shipped/tune.py on the host, and the result written as the
host's data, ``host_vars/<host>.yml`` (``llama_server_tuned``, rigup/instances/tuned.py), for the
operator to commit; the next converge serves with it.

The job (a transient unit, so that it outlives the SSH session) stops the instance's unit, runs
plays/shipped/tune.py as the rigup user on a loopback port of its own, starts the unit again whatever the
sweep did, and marks its end; ``rigup.progress.waited`` prints its progress per host.

A router (``also``) is swept a model at a time, each loaded alone: the server its router would
start for that model (:func:`model_argv`: the router's command line without its router flags, its
preset's ``[*]`` and the model's section as flags, ``-m`` its file), one job each (``NAME:MODEL``,
the router's unit stopped meanwhile); each model's result goes into the router's entry under
``models`` (rigup/instances/tuned.py), laid over its ``per_model`` on the next converge.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
from pathlib import Path

from pyinfra.api import FactBase, OperationError

from rigup import yamlfile
from rigup.boundary import fields, owned, results
from rigup.boundary.core import Unreadable
from rigup.boundary.formats import yaml_text
from rigup.boundary.numbers import whole
from rigup.config import ROOT
from rigup.text import say, shown
from rigup.units import systemd_env_split, systemd_split
from rigup.contract import llama_server as contract
from rigup.contract.llama_server import DROPIN, PRESET

TUNER = "plays/shipped/tune.py"   # rigup_tune.py in the tuner's directory, and the modules it imports beside it
TUNER_BESIDE = ("shipped/throughput.py", "shipped/gguf.py")
HEADER = ("# Written by tune.py: the llama-server flags measured fastest on this host, per instance\n"
          "# (rigup/instances/tuned.py). Commit it; the next converge serves with them. Remove an\n"
          "# entry to go back to the instance's own keys.\n")


LINE_MAX = 65536   # a drop-in's line, at most (rigup writes a few hundred characters)


class ExecStart(FactBase):
    """The argv of ``ExecStart=`` in instance ``instance``'s drop-in (its last, non-empty one: what
    the host runs, compared with the plan's by :func:`differences` before a sweep starts from it), None
    without one, or :class:`Unreadable` (returned, never raised: an exception out of a fact ends the
    run for every host) for a line that does not split (a hand-edited unclosed quote)."""

    def command(self, instance: str) -> str:
        self.instance = instance
        return f"sed -n 's/^ExecStart=\\(..*\\)$/\\1/p' {shlex.quote(DROPIN.format(instance))} 2>/dev/null | tail -n 1"

    def process(self, output: list[str]) -> list[str] | Unreadable | None:
        line = "\n".join(output).strip()
        if len(line) > LINE_MAX:   # before shlex, whose split is quadratic here (round 7b: 2 MB ran for minutes)
            where = DROPIN.format(getattr(self, "instance", "NAME"))
            return Unreadable(f"{where}: ExecStart", f"{len(line)} characters (at most {LINE_MAX}): not a line rigup writes")
        try:
            return systemd_split(line) if line else None
        except ValueError as e:   # shlex: "No closing quotation", "No escaped character"
            where = DROPIN.format(getattr(self, "instance", "NAME"))
            return Unreadable(f"{where}: ExecStart", f"not a command line rigup writes ({e}): {shown(line, 120)}")


class ServingEnv(FactBase):
    """What instance ``instance``'s unit runs with, for the sweep's servers to run alike:
    {"env": the variables of /etc/rigup/cuda.env (roles/cuda_toolkit: PATH, LD_LIBRARY_PATH) and
    of its drop-in's ``Environment=`` lines (CUDA_VISIBLE_DEVICES: its GPUs, in its order), the
    drop-in's last; "gpus": how many GPUs the server sees (those, else nvidia-smi's count: ASCII
    digits, else 0); "build": the llama.cpp build the drop-in's comment names (roles/llama_server
    writes it), or None}; with "error" (:class:`Unreadable`, returned, not raised) when an
    ``Environment=`` line does not split, or sets a variable of cuda.env's (:data:`HOST_ENV`, which
    :func:`differences` leaves to the host: a drop-in's LD_LIBRARY_PATH would pass as the host's), or
    where the unit is not the one rigup writes (:func:`_not_written`: a drop-in line of a setting rigup
    does not write, such as EnvironmentFile= or UnsetEnvironment=; another drop-in or EnvironmentFile
    systemd reads, another unit file; each named: they reach the server, and were never compared).
    Round 8 (issue 61): the drop-in or cuda.env holding a CR or NUL (systemd ends a line at either, sed
    does not: U1), or a drop-in over FILE_MAX (its lines are read up to there: U2); the unit file not
    the one its drop-in names (``# unit SHA``, its sha256 as roles/llama_server writes it), or the
    variables systemd runs it with (``systemctl show``'s Environment) not the template's and the
    drop-in's (:func:`_environment`: U4). The manager's own environment (``systemctl set-environment``,
    system.conf's DefaultEnvironment=) is not read: the sweep runs as a transient unit of the same manager
    (rigup/progress.py's systemd-run, then runuser, which keeps it), so its servers get the variables the
    served unit gets (round 9 SE2, judged no difference; refusing them refused every sweep of a host whose
    DefaultEnvironment= sets a proxy or, as the lab's does, LLAMA_ARG_THREADS)."""

    def command(self, instance: str) -> str:
        self.instance = instance
        dropin, q = shlex.quote(DROPIN.format(instance)), shlex.quote
        # each file's bytes, and its bytes but CR and NUL (F: systemd ends a line at either, sed does not)
        sizes = "".join(f"echo \"F {label} $(cat {path} 2>/dev/null | wc -c) "
                        f"$(cat {path} 2>/dev/null | tr -d '\\r\\000' | wc -c)\"; "
                        for label, path in (("cuda.env", "/etc/rigup/cuda.env"), ("drop-in", dropin)))
        # every line systemd reads of each (an EnvironmentFile's blanks before a name; a unit's around its '=')
        return ("sed -n '/^[[:space:]]*[#;]/d; /^[[:space:]]*$/d; s/^/C /p' /etc/rigup/cuda.env 2>/dev/null; "
                f"sed -n 'h; s/^# unit \\([0-9a-f]*\\), .*$/V \\1/p; g; "
                f"s/^[[:space:]]*Environment[[:space:]]*=[[:space:]]*\\(.*\\)$/E \\1/p; s/^# unit .*, llama.cpp build \\([^ ,]*\\), .*$/B \\1/p' "
                f"{dropin} 2>/dev/null; " + sizes +
                # the unit file's sha256 (U: its drop-in names the one it was written with, V)
                f"[ -f {q(UNIT_FILE)} ] && echo \"U $(sha256sum < {q(UNIT_FILE)} | cut -c1-64)\"; "
                # every line of the drop-in (R: those but the ones rigup writes are named: all of it, for
                # one over FILE_MAX is named by its F line), and what systemd parsed of the unit (S: its
                # drop-ins, EnvironmentFiles, UnsetEnvironment, unit file and variables), bounded
                f"head -c {FILE_MAX} {dropin} 2>/dev/null | sed 's/^/R /'; "
                f"systemctl show -p DropInPaths -p EnvironmentFiles -p UnsetEnvironment -p FragmentPath -p Environment -- "
                f"{q(UNIT.format(instance))} 2>/dev/null | head -c {FILE_MAX} | sed 's/^/S /'; "
                "echo \"G $(nvidia-smi -L 2>/dev/null | grep -c '^GPU')\"")

    def process(self, output: list[str]) -> dict:
        env, gpus, build, error = {}, 0, None, None   # error: the last line that does not split
        other: list[str] = []   # what of the unit rigup does not write (R, S, F, U lines)
        instance = getattr(self, "instance", "NAME")
        own: dict[str, str] = {}   # the drop-in's Environment= (E), for systemd's to be compared with
        shown_env: list[str] = []   # systemctl show's Environment (one line)
        unit_sha = written_sha = None
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind in ("C", "E"):   # cuda.env's, the drop-in's
                where = f"{DROPIN.format(getattr(self, 'instance', 'NAME'))}: Environment=" if kind == "E" \
                    else "/etc/rigup/cuda.env"
                try:   # Environment="A=1" B=2, as roles write it; cuda.env's NAME=VALUE, one a line
                    if len(rest) > LINE_MAX:   # before shlex (quadratic)
                        raise ValueError(f"{len(rest)} characters, at most {LINE_MAX}")
                    pairs = systemd_env_split(rest) if kind == "E" else _assignment(rest)
                except ValueError as e:   # an unclosed quote: not a line rigup writes; the sweep is refused
                    error = Unreadable(where, f"not a line rigup writes ({e}): {shown(rest, 120)}")
                    continue
                if kind == "E" and set(pairs) & HOST_ENV:   # over cuda.env's, which differences leaves to the host
                    error = Unreadable(where, f"sets {', '.join(sorted(set(pairs) & HOST_ENV))}, which rigup writes "
                                              f"in /etc/rigup/cuda.env alone: {shown(rest, 120)}")
                env.update(pairs)
                own.update(pairs if kind == "E" else {})
            elif kind == "S" and rest.strip().partition("=")[0] == "Environment":
                shown_env.append(rest.strip().partition("=")[2])
            elif kind in ("R", "S"):
                other += _not_written(kind, rest, instance)
            elif kind == "F":
                other += _sizes(rest)
            elif kind in ("U", "V"):   # the unit file's sha256; the one its drop-in names (its first 12)
                unit_sha, written_sha = (rest.strip(), written_sha) if kind == "U" else (unit_sha, rest.strip())
            elif kind == "G":
                gpus = whole(rest, 1024) or 0   # ASCII digits: isdigit() took "²" (int() raised) and "٣"
            elif kind == "B" and fields.ID.fullmatch(rest.strip().rstrip("/").rsplit("/", 1)[-1]):
                build = rest.strip().rstrip("/").rsplit("/", 1)[-1]   # the current link's target: builds/<id>
        if unit_sha is not None and not (written_sha and len(written_sha) == 12 and unit_sha.startswith(written_sha)):
            other.append(f"its unit file {UNIT_FILE} (sha256 {shown(unit_sha[:12], 20)}) is not the one its drop-in was "
                         f"written with ({shown(written_sha or 'none named', 70)})")
        for text in shown_env:
            other += _environment(text, own, instance)
        if other:   # each named: a drop-in, file or line rigup does not write reaches the server
            unit = UNIT.format(instance)
            why = "; ".join([*other, *([f"{error.where}: {error.why}"] if error else [])])
            error = Unreadable(unit, f"{why}: not the unit rigup writes")
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        found = {"env": env, "gpus": len(visible) if "CUDA_VISIBLE_DEVICES" in env else gpus, "build": build}
        return {**found, "error": error} if error else found


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNIT = "rigup-llama@{}.service"
UNIT_FILE = "/etc/systemd/system/rigup-llama@.service"   # roles/llama_server's UNIT: systemd's FragmentPath
CUDA_ENV = "/etc/rigup/cuda.env"   # the unit's one EnvironmentFile (templates/llama_server-unit.service.j2)
FILE_MAX = 65536   # a drop-in's or cuda.env's bytes, at most (rigup writes about a thousand)
# the variables the template unit sets (its Environment= lines, no Jinja in them: %i is the instance)
UNIT_ENV = dict(word.split("=", 1) for m in re.finditer(r"^Environment=(.*)$", (
    ROOT / "templates" / "llama_server-unit.service.j2").read_text(), re.M) for word in shlex.split(m[1]))
# the settings of the drop-in's lines rigup writes (templates/llama_server-dropin.conf.j2 and its balancer hooks)
WRITTEN = frozenset(m.group(1) for t in ("llama_server-dropin.conf.j2", "balancer-hooks.conf.j2")
                    for m in re.finditer(r"(?:^|%})([A-Z][A-Za-z]+)=", (ROOT / "templates" / t).read_text(), re.M))


def _not_written(kind: str, rest: str, instance: str) -> list[str]:
    """What line ``rest`` of ServingEnv names that rigup does not write, each said (none: []). ``R``: a line
    of the drop-in (a comment, a blank, ``[Service]`` or a setting of :data:`WRITTEN` as rigup writes it,
    no blank before its ``=``); ``S``: a line of ``systemctl show`` (a drop-in but the one rigup writes,
    an EnvironmentFile but cuda.env, any UnsetEnvironment: issue 61, round 7b U2/U3)."""
    line = rest.strip()
    if kind == "R":
        name, eq, _ = rest.partition("=")
        if not line or line.startswith(("#", ";")) or line == "[Service]" or (eq and name in WRITTEN):
            return []
        return [f"its drop-in has {shown(rest, 120)}"]
    name, _, value = line.partition("=")
    if name == "Environment":   # compared whole, with the drop-in's: ServingEnv.process, _environment
        return []
    if name == "FragmentPath":   # the unit file systemd read (an instance's own, rigup-llama@NAME.service)
        return [] if value == UNIT_FILE else [f"systemd reads the unit file {shown(value or 'none', 120)}"]
    if name == "DropInPaths":
        return [f"systemd reads the drop-in {shown(p, 120)}" for p in value.split() if p != DROPIN.format(instance)]
    if name == "EnvironmentFiles":
        path = value.rsplit(" (ignore_errors=", 1)[0]
        return [] if not value or path == CUDA_ENV else [f"systemd reads the EnvironmentFile {shown(path, 120)}"]
    if name == "UnsetEnvironment":
        return [f"systemd unsets {shown(value, 120)}"] if value else []
    return [f"systemctl show said {shown(line, 120)}"] if line else []


def _sizes(rest: str) -> list[str]:
    """What an F line of ServingEnv (``LABEL BYTES KEPT``: a file's bytes, and those but CR and NUL) says
    of the drop-in or cuda.env rigup does not write: one over FILE_MAX (ServingEnv reads that much), one
    holding a CR or NUL (systemd ends a unit's or an EnvironmentFile's line there, where sed read one line:
    ``# note<CR>Environment=LD_PRELOAD=...`` set it, unseen: round 8 U1); none: []."""
    label, _, counts = rest.partition(" ")
    where = {"cuda.env": CUDA_ENV, "drop-in": "its drop-in"}.get(label)
    size, kept = (whole(n, 1 << 62) for n in (counts.split(" ") + [""])[:2])
    if where is None or size is None or kept is None or kept > size:
        return [f"its file sizes do not read: {shown(rest, 120)}"]
    if size > FILE_MAX:
        return [f"{where} is {size} bytes (at most {FILE_MAX})"]
    if kept < size:
        return [f"{where} holds {size - kept} CR or NUL byte(s), where systemd ends a line"]
    return []


_SHOWN_WORD = re.compile(r'"((?:[^"\\]|\\["\\`$])*)"|([^ "\\]+)')


def _shown_words(text: str) -> list[str]:
    """``systemctl show``'s list of words (bus-print-properties: each word as shell_maybe_quote writes it,
    bare or in double quotes with ``"\\`$`` escaped, one blank between); ValueError for another text (an
    escape of a control character: no word rigup writes)."""
    words, at = [], 0
    while at < len(text):
        m = _SHOWN_WORD.match(text, at)
        if not m or (m.end() < len(text) and text[m.end()] != " "):
            raise ValueError(f"not systemctl's quoting at character {at}")
        words.append(m[2] if m[1] is None else re.sub(r"\\(.)", r"\1", m[1]))
        at = m.end() + 1
    return words


def _environment(text: str, own: dict[str, str], instance: str) -> list[str]:
    """What of ``text``, the variables systemd runs unit ``instance`` with (``systemctl show -p
    Environment``: the unit file's and its drop-ins' Environment=, as systemd parsed them), is not what
    rigup writes: the template unit's (UNIT_ENV, ``%i`` the instance) with the drop-in's (``own``, as
    ServingEnv read its E lines) over them; each variable named (none: []). A hand-edited unit file, an
    instance's own, or a drop-in line sed read otherwise (round 8 U4) sets what was never compared."""
    try:
        words = _shown_words(text)
        if not all("=" in w for w in words):   # systemd keeps none without one (env_assignment_is_valid)
            raise ValueError("a word without '='")
    except ValueError as e:
        return [f"systemd's Environment does not read ({e}): {shown(text, 120)}"]
    have = dict(w.split("=", 1) for w in words)
    want = {**{k: v.replace("%i", instance) for k, v in UNIT_ENV.items()}, **own}
    out = []
    for name in sorted(set(have) | set(want)):
        if have.get(name) != want.get(name):
            now, then = (shown(f"{name}={e[name]}", 120) if name in e else f"no {shown(name, 60)}" for e in (have, want))
            out.append(f"systemd runs it with {now}, rigup writes {then}")
    return out


def env_file(text: str) -> dict[str, str]:
    """An EnvironmentFile's text (roles/cuda_toolkit's cuda.env as rendered) as ServingEnv reads the
    host's: {NAME: VALUE}, comments and blank lines left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            out.update(_assignment(line))
    return out


def _assignment(line: str) -> dict[str, str]:
    """An EnvironmentFile's line, ``NAME=VALUE`` (the blanks around each taken off, as systemd does), as
    {NAME: VALUE}; ValueError for another (roles/cuda_toolkit writes none)."""
    name, eq, value = line.strip().partition("=")
    if not eq or not ENV_NAME.fullmatch(name.strip()):
        raise ValueError("no NAME=VALUE")
    return {name.strip(): value.strip()}


class Preset(FactBase):
    """Router ``instance``'s preset (contract.PRESET, roles/llama_server writes it):
    {"sections": :func:`preset_sections`} (none but ``""`` where there is no file), or {"error":
    why it is unreadable}."""

    def command(self, instance: str) -> str:
        return f"cat {shlex.quote(PRESET.format(instance))} 2>/dev/null; true"

    @staticmethod
    def default() -> dict:
        return {"sections": {}}

    def process(self, output: list[str]) -> dict:
        try:
            return {"sections": preset_sections(output, "its preset")}
        except Unreadable as e:
            return {"error": f"{e.where}: {e.why}"}


PRESET_LINES = 4096   # a preset's lines, at most (rigup writes a handful per model)


def preset_sections(lines: list[str], where: str) -> dict[str, dict[str, str]]:
    """A llama.cpp preset's text (the lines rigup writes: ``; comment``, ``[section]``, ``key =
    value``) as {section: {key: value}}, ``""`` for the keys before any section; :class:`Unreadable`
    naming ``where`` and the line for any other line, a key given twice in a section, or too many lines."""
    if len(lines) > PRESET_LINES:
        raise Unreadable(where, f"{len(lines)} lines (at most {PRESET_LINES})")
    out: dict[str, dict[str, str]] = {"": {}}
    section = ""
    for n, raw in enumerate(lines, 1):
        line = raw.strip(" \t")
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]") and fields.ID.fullmatch(line[1:-1]) or line == "[*]":
            section = line[1:-1]
            if section in out:
                raise Unreadable(f"{where}: line {n}", f"section [{shown(section, 80)}] given twice")
            out[section] = {}
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(" \t"), value.strip(" \t")
        if not eq or not fields.ID.fullmatch(key) or not value or not value.isprintable() or key in out[section]:
            raise Unreadable(f"{where}: line {n}", f"not a preset line rigup writes: {shown(raw, 120)}")
        out[section][key] = value
    return out


# a router's own flags, none of a server of one model (with how many values each takes)
ROUTER_FLAGS = {"--models-preset": 1, "--models-max": 1, "--models-dir": 1, "--models-autoload": 0,
                "--no-models-autoload": 0}


def _without(argv: list[str], spellings: dict[str, int]) -> list[str]:
    """``argv`` without each of ``spellings`` (spelling -> how many values follow it; ``--x=v`` too)."""
    out, skip = [], 0
    for i, arg in enumerate(argv):
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if i and name in spellings:
            skip = 0 if "=" in arg else spellings[name]
            continue
        out.append(arg)
    return out


def model_argv(argv: list[str], sections: dict[str, dict[str, str]], model: str) -> tuple[list[str] | None, str]:
    """(the command line of a server of ``model`` alone, as router ``argv`` with its preset
    ``sections`` would start it: the router's flags, then the preset's ``[*]`` and the model's own,
    ``-m`` its file; or None, why not): a model without a section (not in the preset), a file that
    is no normal absolute path (a ``.`` or ``..`` part), or a preset key that is no flag of the contract's table."""
    own = sections.get(model)
    if own is None:
        return None, "not in the router's preset (converge deploy.py first)"
    values = {**sections.get("*", {}), **own}
    path = values.pop("model", "")
    values.pop("load-on-startup", None)
    try:   # absolute and normal: '/srv/../../etc/shadow' would be the sweep's -m (fields.inside below the root)
        fields.inside(path[1:] if path.startswith("/") else "", "preset")
    except Unreadable:
        return None, f"its file in the preset is not an absolute path without a . or .. part: {shown(path, 120)}"
    # the preset's key of a flag: its long spelling without the dashes (contract.preset_values)
    by_name = {next(s for s in f.spellings if s.startswith("--")).lstrip("-"): f for f in contract.FLAGS}
    unknown = sorted(k for k in values if k not in by_name)
    if unknown:
        return None, f"the preset sets {', '.join(shown(k, 40) for k in unknown)}: no flag rigup writes"
    rows = [(by_name[k], v) for k, v in values.items()]
    out = _without(argv, {**ROUTER_FLAGS, **{s: int(f.write not in (contract.PAIR, contract.SWITCH))
                                            for f, _ in rows for s in f.spellings}})
    for f, value in rows:
        if f.write == contract.PAIR:
            out.append(f.spellings[0] if value == "true" else f.spellings[1])
        elif f.write == contract.SWITCH:
            out += [f.spellings[0]] if value == "true" else []
        else:
            out += [f.spellings[0], value]
    return [out[0], "-m", path, *out[1:]], ""


NUMBER = re.compile(r"-[0-9.]")   # a value with a sign (-ngl -1, --cache-ram -1), not a flag
# each spelling of a row of the contract -> its first (a pair's --no-jinja is a setting of its own)
FIRST = {s: f.spellings[0] for f in contract.FLAGS if f.write != contract.PAIR for s in f.spellings}


def settings(argv: list[str]) -> dict[str, list[tuple[str, ...]]]:
    """``argv``'s flags (after its program), each by its first spelling in the contract's table
    (``--ctx-size`` as ``-c``, ``--x=v`` as ``--x v``; another flag as written) -> the values given
    after it, once per time it is given; the words before its first flag under ``""`` (rigup writes
    none: llama-server would read one, so :func:`differences` names it). What :func:`differences` compares."""
    out: dict[str, list[tuple[str, ...]]] = {}
    flag = ""
    for arg in argv[1:]:
        if arg.startswith("-") and not NUMBER.match(arg):
            name, eq, value = arg.partition("=")
            flag = FIRST.get(name, name)
            out.setdefault(flag, []).append((value,) if eq else ())
        else:
            out.setdefault(flag, [()])[-1] += (arg,)
    return out


def _given(flag: str, values: list[tuple[str, ...]] | None) -> str:
    if not flag:   # the words before any flag
        return "; ".join(shown(" ".join(v), 120) for v in values) + " before its flags" if values else "no word before its flags"
    return "; ".join(shown(" ".join((flag, *v)), 120) for v in values) if values else f"without {shown(flag, 120)}"


def _env_keys(template: Path) -> frozenset[str]:
    """The variables ``template`` (an EnvironmentFile rigup writes) sets: its ``NAME=`` lines."""
    return frozenset(m.group(1) for m in re.finditer(r"^([A-Z_][A-Z0-9_]*)=", template.read_text(), re.M))


# the variables of /etc/rigup/cuda.env, which roles/cuda_toolkit writes on the host (not the plan's
# server: its values are the host's toolkit): ServingEnv reads them with the drop-in's
HOST_ENV = _env_keys(ROOT / "templates" / "cuda_toolkit.env.j2")


def differences(planned: list[str], installed: list[str] | None, model_dir: str | None = None,
                host_flags=frozenset(), planned_env: dict | None = None, installed_env: dict | None = None,
                host_env: dict | None = None) -> list[str]:
    """What sets the server the serving plan wants apart from the one the host has installed, one
    line each ("installed -c 4096, the plan's -c 8192"); [] when they agree, and the sweep may start
    from the installed one. ``planned``: the plan's argv (roles/llama_server/command.py ``argv``
    of its sized instance, as a converge writes it); ``installed``: its drop-in's ExecStart
    (:class:`ExecStart`; None: no drop-in, the unit missing). Only what the plan owns is compared,
    not what a converge reads on the host: the model's file is under ``model_dir`` (the plan's
    directory of the model, as a normal path; which file, its first GGUF shard, is the completion
    marker's, so ``planned`` carries the installed one), and a flag of ``host_flags`` (the remedies a
    build's smoke added, e.g. --no-repack) that the installed command alone has, once and as the
    remedy gives it (no value), is no difference. A word before the first flag is named.
    ``planned_env``: the plan's environment of the server; each of its variables, and every other of
    ``installed_env`` (the drop-in's and cuda.env's) but those of :data:`HOST_ENV`, compared; those too
    with ``host_env`` (:func:`env_file` of the cuda.env roles/cuda_toolkit writes for the host: its
    ``unit_env``; None where it writes none), for a hand-edited PATH is the sweep's servers' too."""
    if installed is None:
        return ["no drop-in on the host (the unit is missing)"]
    out = [] if planned[:1] == installed[:1] else [f"installed {shown(installed[0], 120)}, the plan's {shown(planned[0], 120)}"]
    want, have = settings(planned), settings(installed)
    if model_dir is not None:
        got = have.pop("-m", None)   # given once, with one word: a file below the directory
        want.pop("-m", None)
        if not (got and len(got) == 1 and len(got[0]) == 1 and _below(got[0][0], model_dir)):
            out.append(f"installed {_given('-m', got)}, the plan's a file of {model_dir}")
    # a remedy (e.g. --no-repack) is the host's only as its smoke gives it: once, with its value (none)
    remedies = {k: v for r in host_flags for k, v in settings(["", *str(r).split()]).items() if k}
    for flag in [*want, *(f for f in have if f not in want)]:   # the plan's order, then the installed's own
        if have.get(flag) != want.get(flag) and not (flag not in want and have.get(flag) == remedies.get(flag)):
            now, then = have.get(flag), want.get(flag)
            out.append(f"installed {_given(flag, now)}, the plan's " +
                       (" ".join(shown(" ".join(v), 120) for v in then) if now and then else _given(flag, then)))
    # the whole environment: each variable the plan sets, and any other but cuda.env's (HOST_ENV), which the
    # sweep's servers would run with (LD_PRELOAD, LLAMA_ARG_*: a server that is not the plan's)
    env, got = {**(host_env or {}), **(planned_env or {})}, installed_env or {}
    for name in sorted(set(env) | (set(got) - (HOST_ENV if host_env is None else frozenset()))):
        if env.get(name) != got.get(name):
            now, then = (shown(f"{name}={e[name]}", 120) if name in e else f"without {shown(name, 60)}" for e in (got, env))
            out.append(f"installed {now}, the plan's {then}")
    return out


def _below(path: str, directory: str) -> bool:
    """Whether ``path`` is a file below ``directory``, each read as a normal path: no ``.``, ``..`` or empty
    part (``DIR/../../x`` starts with ``DIR/``, and is not in it), as :func:`model_argv` reads a preset's."""
    prefix = directory.rstrip("/") + "/"
    if not path.startswith(prefix):
        return False
    try:
        fields.inside(path[len(prefix):], "-m")
    except Unreadable:
        return False
    return True


def preset_differences(planned: dict[str, dict[str, str]], installed: dict[str, dict[str, str]],
                       model_dirs: dict[str, str]) -> list[str]:
    """What sets a router's preset the plan wants apart from the one the host has, by section and key
    (both as :func:`preset_sections` reads them: ``planned`` from roles/llama_server/command.py
    ``preset_text`` of the plan's router); [] when they agree. A model's file is the host's (its
    marker's first shard): it is compared as being under its directory of ``model_dirs``."""
    out = []
    for section in [*planned, *(s for s in installed if s not in planned)]:
        want, have = planned.get(section), installed.get(section)
        if want is None or have is None:
            out.append(f"its preset {'has' if want is None else 'lacks'} [{shown(section, 60)}], the plan's "
                       + ("not" if want is None else "has it"))
            continue
        for key in [*want, *(k for k in have if k not in want)]:
            if key == "model" and section in model_dirs:
                if not _below(have.get(key, ""), model_dirs[section]):   # a normal path: model_argv's rule
                    out.append(f"its preset's [{shown(section, 60)}] model {shown(have.get(key, 'none'), 120)}, "
                               f"the plan's a file of {model_dirs[section]}")
            elif want.get(key) != have.get(key):
                out.append(f"its preset's [{shown(section, 60)}] {shown(key, 60)} = {shown(have.get(key, 'none'), 120)}, "
                           f"the plan's {want.get(key, 'none')}")
    return out


def workdir(data: dict) -> str:
    """root's directory of the tuner (root:rigup 0750): its scripts, each sweep's spec, log and
    done marker. Only root writes here; the rigup user reads (issue 47: it was the rigup user's,
    and root's upload, ``: > log`` and ``touch`` followed the links that user placed)."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/tuner"


def outdir(data: dict) -> str:
    """The rigup user's directory inside :func:`workdir`: what the sweep (run as that user) writes,
    its result and its servers' logs. root reads the result as that user, never through a link."""
    return workdir(data) + "/out"


def old_workdir(data: dict) -> str:
    """The tuner's directory before issue 47, the rigup user's: removed (``rm -rf`` follows no link)."""
    return f"{str(data['rigup_state_dir']).rstrip('/')}/tune"


KINDS = {"l": "a symbolic link", "p": "a FIFO", "f": "a file", "d": "a directory", "s": "a socket",
         "b": "a block device", "c": "a character device"}


class Unsafe(FactBase):
    """What in the tuner's directory ``folder`` root would write through or into though it is not
    root's own: ``folder`` not a root-owned directory, an entry that is not a regular file owned
    by root (a link, a FIFO, another user's file), ``out`` not a directory of ``user``. Each as
    (type, owner, path), find's ``%y %u %p``; [] when ``folder`` does not exist yet."""

    def command(self, folder: str, user: str) -> str:
        q = shlex.quote
        out = f"{folder}/out"
        return (f"[ -e {q(folder)} ] || [ -L {q(folder)} ] || exit 0; "
                f"find -P {q(folder)} -maxdepth 0 \\( ! -type d -o ! -uid 0 \\) -printf '%y %u %p\\n'; "
                f"[ -d {q(folder)} ] && [ ! -L {q(folder)} ] || exit 0; "
                f"find -P {q(folder)} -mindepth 1 -maxdepth 1 ! -path {q(out)} \\( ! -type f -o ! -uid 0 \\) "
                "-printf '%y %u %p\\n'; "
                f"if [ -e {q(out)} ] || [ -L {q(out)} ]; then [ \"$(stat -c '%U %F' -- {q(out)})\" = "
                f"{q(user + ' directory')} ] || find -P {q(out)} -maxdepth 0 -printf '%y %u %p\\n'; fi; true")

    @staticmethod
    def default() -> list:
        return []   # no output: nothing there is another's

    def process(self, output: list[str]) -> list[tuple[str, str, str]]:
        return [tuple(line.split(" ", 2)) for line in output if line.count(" ") >= 2]


def spec(name: str, argv: list[str], data: dict, gpu: bool, key_file: str | None, served: dict | None = None, *,
         ctx: int, parallel: int) -> dict:
    """plays/shipped/tune.py's SPEC for instance ``name`` served by ``argv`` (its drop-in's ExecStart, found
    the plan's: :func:`differences`), with the swept flags' spellings from the contract (``flags``: no
    host holds the contract), with ``served`` (:class:`ServingEnv`: the unit's environment
    and GPU count). ``ctx`` and ``parallel``: the serving plan's (rigup.serving ``serving_plan``: the
    instance sized, a router's model with its own ``per_model``), whole numbers of at least 1 by the
    schema; never read back from the host's text (a drop-in's ``--parallel 0`` divided by zero)."""
    concurrency = int(data["llama_server_tune_concurrency"] or parallel)
    return {"argv": argv, "port": int(data["llama_server_tune_port"]), "concurrency": concurrency,
            "levels": list(data["llama_server_tune_levels"] or [concurrency]), "slot_tokens": max(1, ctx // parallel),
            "max_parallel": int(data["llama_server_tune_max_parallel"]), "gpu": gpu,
            "budget_s": int(data["llama_server_tune_budget_s"]), "max_tokens": int(data["llama_server_tune_max_tokens"]),
            "rounds": 1, "key_file": key_file, "logs": outdir(data), "env": (served or {}).get("env") or {},
            "gpus": max(1, int((served or {}).get("gpus") or 1)),
            "flags": {key: list(names) for key, names in contract.spellings(contract.SWEPT).items()}}


def job(name: str, data: dict, instance: str | None = None) -> tuple[str, str, str, str]:
    """(unit, shell command, log, done marker) of the sweep ``name``: an instance's, or a router
    ``instance``'s model's (``NAME:MODEL``, :func:`model_job`), whose unit it stops meanwhile."""
    q, d = shlex.quote, workdir(data)
    unit, result, done = f"rigup-tune-{name}", f"{outdir(data)}/{name}.json", f"{d}/{name}.done"
    server = f"rigup-llama@{instance or name}.service"
    command = (f"rm -f {q(done)}; systemctl stop {q(server)}; runuser -u {q(data['rigup_user'])} -- /usr/bin/python3 -s -E -S "
               f"{q(d + '/rigup_tune.py')} {q(f'{d}/{name}.spec.json')} {q(result)}; rc=$?; "
               f"systemctl start {q(server)}; [ $rc = 0 ] && touch {q(done)}; exit $rc")
    return unit, command, f"{d}/{name}.log", done


def model_job(instance: str, model: str) -> str:
    """The sweep of router ``instance``'s ``model``: its unit, files and result are named
    ``INSTANCE:MODEL`` (a ``:`` is in no instance's or model's name, and systemd takes it)."""
    return f"{instance}:{model}"


def entry(result: dict, build: str | None) -> dict | None:
    """The ``llama_server_tuned`` entry of a sweep's result as :func:`rigup.boundary.results.sweep`
    read it (its flags typed as the instance keys take them), or None: nothing served."""
    best, base = result.get("best"), result.get("baseline")
    if not best or not base:
        return None
    return {"flags": dict(best["flags"]), "tok_s": best["tps"], "baseline_tok_s": base["tps"], "concurrency": result["concurrency"],
            "levels": list(result.get("levels") or []), "date": datetime.date.today().isoformat(), "build": build}


def host_vars(host: str, site: str | None) -> tuple[Path, dict]:
    """(path, its document) of ``<site or the repository>/host_vars/<host>.yml``, the file a sweep's
    result is merged into ({} where there is none): :class:`Unreadable` naming the file and the key
    where the document is no map, or ``llama_server_tuned``, an entry of it or a router entry's
    ``models`` is none (round 10 T1: ``llama_server_tuned: [1]`` was a TypeError after the sweep, a
    file that is a list was replaced by the tuned entries alone). tune.py reads it before any sweep.
    ``host``, an inventory name, is a name or an address (:mod:`rigup.boundary.fields`) before a path
    is built from it: ``../group_vars/all`` would write every host's tuning."""
    fields.host_file(host, f"tune: the inventory host {str(host)[:60]!r}")
    path = Path(site or ROOT) / "host_vars" / f"{host}.yml"
    where = f"tune: {path}"   # read and written only where no other user can write (rigup.boundary.owned)
    doc = yamlfile.safe_load(owned.read(path, where)) if os.path.lexists(path) else None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise Unreadable(where, f"the file is a {type(doc).__name__}, not a map of key -> value; fix it by hand")
    tuned = doc.get("llama_server_tuned")
    if tuned is not None and not isinstance(tuned, dict):
        raise Unreadable(where, f"llama_server_tuned is a {type(tuned).__name__}, not a map of instance -> entry; "
                         "fix it by hand")
    for name, entry in (tuned or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("models", {}), dict):
            key = f"llama_server_tuned.{shown(name, 60)}{'.models' if isinstance(entry, dict) else ''}"
            raise Unreadable(where, f"{key} is no map; fix it by hand")
    return path, doc


def write_host_vars(host: str, entries: dict[str, dict], site: str | None) -> Path:
    """``<site or the repository>/host_vars/<host>.yml`` with ``entries`` merged into its
    ``llama_server_tuned`` (other keys of the file kept), read by :func:`host_vars`
    (:class:`Unreadable` where it does not read)."""
    path, doc = host_vars(host, site)
    kept = doc.get("llama_server_tuned") or {}
    merged = {**kept, **entries}
    for name, new in entries.items():   # a router's model: beside its other models, which stay
        prior = kept.get(name)
        if isinstance(new, dict) and "models" in new and prior:   # each a map (host_vars)
            models = prior.get("models") or {}
            merged[name] = {**prior, **new, "models": {**models, **new["models"]}}
    doc["llama_server_tuned"] = merged
    return owned.write(path, HEADER + yaml_text(doc, str(path)), f"tune: {path}", mode=0o644)


def markdown(host: str, name: str, result: dict) -> str:
    """The sweep's table: each point's flags, status, figure and tok/s at each level."""
    levels = result.get("levels") or []
    lines = [f"# tune.py: {host} {name}", "", f"Target {result['concurrency']} concurrent; each point at "
             f"{', '.join(map(str, levels))}; {len(result['points'])} points in {result['spent_s']} s; "
             f"{shown(result.get('stopped') or 'sweep complete', 400)}. Best: {result['best'] and result['best']['flags']} "
             f"({result.get('ratio')}x the instance as it was).", "",
             "| flags | status | figure | " + " | ".join(f"{n} concurrent" for n in levels) + " |",
             "| --- | --- | --- |" + " --- |" * len(levels)]
    for p in result["points"]:
        per = {lv["concurrency"]: lv["total_tps"] for lv in p.get("levels", [])}
        lines.append(f"| {json.dumps(p['flags']) if p['flags'] else 'as it was'} | {p['status']} | {p.get('tps', '')} | "
                     + " | ".join(str(per.get(n, "")) for n in levels) + " |")
    return "\n".join(lines) + "\n"


def record(host: str, name: str, result, data: dict, argv: list[str], build: str | None = None,
           where: str | None = None, model: str | None = None, plot=None, gpus: int | None = None) -> None:
    """Keep a sweep's result (the JSON text the host gave, or what it parsed to; None: none):
    read through :func:`rigup.boundary.results.sweep` first, so that a result out of bounds or
    missing a field writes nothing (:class:`OperationError` naming ``where``, the host and its
    file: that host fails alone); then ``host_vars/<host>.yml`` (under the site directory when
    there is one) gains its entry, ``tune_out/<date>/<host>-<name>.md`` its table (and ``.png``
    its plot, drawn by ``plot``: the play's chart, plays/charts.py's; None: none); a line says what it
    found. With ``model``: router ``name``'s model, its entry under the router's ``models`` and its
    files ``<host>-<name>-<model>``. ``gpus``: the GPUs the sweep's servers saw (its spec's), which
    bound its ``main_gpu`` and ``tensor_split``."""
    if model is not None:
        return _record(host, f"{name} {model}", f"{name}-{model}", result, data, build, where,
                       lambda found: {name: {"models": {model: found}}}, plot, gpus)
    return _record(host, name, name, result, data, build, where, lambda found: {name: found}, plot, gpus)


def _record(host: str, name: str, stem: str, result, data: dict, build: str | None, where: str | None,
            entries, plot=None, gpus: int | None = None) -> None:
    """:func:`record` of the sweep called ``name`` (its lines), its files ``<host>-<stem>``, its
    host_vars entry ``entries(found)``."""
    try:
        result = None if result is None else results.sweep(result, where or f"{host}:{name}.json", gpus)
    except Unreadable as e:
        say(f"    [{host}] tune {name}: refused the sweep's result {e.where}: {e.why}; nothing written", fg="red")
        raise OperationError(f"tune {name}: the sweep's result is unreadable ({e}); nothing written") from None
    if not result or not result.get("best"):
        why = (result or {}).get("stopped") or "no result on the host"
        say(f"    [{host}] tune {name}: nothing kept ({why})")
        return
    # everything derived before the first write: no half-kept result
    found, table = entry(result, build), markdown(host, name, result)
    points = {json.dumps(p["flags"]) if p["flags"] else "as it was": {"levels": p["levels"]}
              for p in result["points"] if p.get("levels")}
    out = Path(data.get("_rigup_site") or ROOT) / "tune_out" / datetime.date.today().isoformat()
    try:
        path = write_host_vars(host, entries(found), data.get("_rigup_site"))
        owned.write(out / f"{host}-{stem}.md", table, f"tune: {out}", mode=0o644)
    except Unreadable as e:   # a directory or host_vars file another user could write: nothing trusted there
        say(f"    [{host}] tune {name}: {shown(e.where, 200)}: {shown(e.why, 400)}; not kept", fg="red")
        raise OperationError(f"tune {name}: {e}") from None
    try:   # the play's chart (plays/charts.py): one line per point, tok/s against the levels
        if plot:
            plot({host: {"instances": points}}, out / f"{host}-{stem}.png", f"tune.py: {host} {name}, each point")
    except ImportError:
        say(f"    [{host}] tune {name}: no plot: matplotlib is missing (pip install -r requirements-dev.txt)")
    say(f"    [{host}] tune {name}: {found['flags'] or 'the instance as it was'}: {found['tok_s']} tok/s, "
        f"{result['ratio']}x as it was, in {result['spent_s']} s; wrote {path} (commit it) and "
        f"{out / f'{host}-{stem}.md'}")
