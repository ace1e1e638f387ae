"""What the model downloads on a host are at, read in one round trip.

:class:`ModelFetchState` runs ``rigup-fetch probe`` (roles/model_fetch/shipped/fetcher.py, sent inline:
the host needs only python3) for every model at once. For each model it reads the completion
marker, the job's progress and whether a job holds the model's lock; for a model not complete it
also asks the hub for the file list (sizes, hashes) and reads the free disk where the model goes.
The hub token, when there is one, is read on the host from its root-only file, never sent.
"""

from __future__ import annotations

import base64
import json
import re
import shlex

from pyinfra.api import FactBase

from rigup.boundary import results
from rigup.boundary.core import Unreadable, loads
from rigup.boundary.hosttext import download_progress
from rigup.files import program_text
from rigup.names import MARKER, marker_path
from rigup.nofollow import AS_OWNER, FUNCTIONS, READ, read_file
from rigup.units import keyed, parse_instances

FETCHER = "roles/model_fetch/shipped/fetcher.py"   # installed as rigup-fetch and rigup-share, sent here inline
WORK = ".rigup-fetch"  # fetcher.py WORK: the job's files under a model's dest
UNIT_PREFIX = "rigup-fetch-"
SHARE_UNIT = "rigup-share"
SHARE_LOCK = "/run/rigup-share.lock"  # held by the share server on a host without systemd


def unit_name(model: str) -> str:
    """The transient unit (and tmux session) of ``model``'s download job."""
    return UNIT_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", model)


def probe_command(specs: list[dict]) -> str:
    """One shell command: the probe of every model in ``specs``, and the share server's state."""
    blob = base64.b64encode(json.dumps(specs, separators=(",", ":")).encode()).decode()
    return (
        "[ -d /run/systemd/system ] && echo '##rigup-systemd 1' || echo '##rigup-systemd 0'; "
        f"printf '%s\\n' \"##rigup-share $(systemctl is-active {SHARE_UNIT} 2>/dev/null || "
        f"{{ [ -e {SHARE_LOCK} ] && ! flock -n {SHARE_LOCK} true; }} 2>/dev/null && echo active)\"; "
        "[ -x /usr/bin/python3 ] || { echo '##rigup-nopython'; exit 0; }; "
        f"/usr/bin/python3 -s -E -S - probe {blob} <<'RIGUP_FETCH_EOF'\n{program_text(FETCHER)}\nRIGUP_FETCH_EOF"
    )


_NAMED = re.compile(r'\{"name": ?"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"')   # rigup-fetch's probe line's start


def parse_probe(lines: list[str]) -> dict:
    """``{"systemd": bool, "python": bool, "share_active": bool, "models": {name: state}}``."""
    out = {"systemd": False, "python": True, "share_active": False, "models": {}}
    for line in lines:
        if line.startswith("##rigup-systemd "):
            out["systemd"] = line.split()[1:2] == ["1"]   # a line with no word after it: not systemd
        elif line.startswith("##rigup-share"):
            out["share_active"] = line.split()[-1] == "active"
        elif line.startswith("##rigup-nopython"):
            out["python"] = False
        elif line.startswith("##rigup-model "):
            try:
                state = loads(line[len("##rigup-model "):], "the probe's model line")
            except Unreadable as e:   # NaN/Infinity (a progress.json's 1e999 printed back), a key twice, ...:
                # the model named as rigup-fetch prints it (its name first), its record unreadable
                named = _NAMED.match(line[len("##rigup-model "):])
                if named:
                    # (refused by the plan naming why: it planned as if nothing were there, round 34)
                    out["models"][named[1]] = {"name": named[1], "progress": None, "unreadable": str(e),
                                               "probe_error": str(e)}
                continue
            # the host's python3 prints it: a name that is not text (a list) is no model of the specs
            if isinstance(state, dict) and isinstance(state.get("name"), str):
                name = state["name"]
                try:   # a field the plan reads mistyped: that model refused, naming it (round 34 M34a)
                    state = results.model_probe(state, f"model {name}: the probe's line")
                except Unreadable as e:
                    state = {"name": name, "probe_error": str(e)}
                out["models"][name] = read_markers(read_progress(state, f"model {name}: progress.json"))
    return out


def read_markers(state: dict) -> dict:
    """``state`` with its ``marker`` and ``serving`` (the marker of the revision served) typed by the
    boundary's marker reader (rigup.boundary.results.marker) and its ``job`` an object or None; a
    marker that does not read leaves no marker and says why in ``marker_unreadable`` (the plan refuses
    that model, naming the file: rigup-fetch reads such a marker as none and prints none)."""
    out = dict(state)
    if not isinstance(out.get("job", {}), dict):
        out["job"] = None
    for key, dest in (("marker", out.get("where") or out.get("dest")), ("serving", out.get("dest"))):
        if out.get(key) is None:
            continue
        try:
            out[key] = results.marker(out[key], f"{dest}/{MARKER}")
        except Unreadable as e:
            out.update({key: None, "complete": False, "staged": False, "marker_unreadable": str(e)})
    return out


def read_progress(state: dict, where: str) -> dict:
    """``state`` with its ``progress`` typed (rigup.boundary.hosttext.download_progress); a record
    that does not read is dropped and ``unreadable`` says why (that model's line shows it)."""
    if state.get("progress") is None:
        return state
    try:
        return {**state, "progress": download_progress(state["progress"], where)}
    except Unreadable as e:
        return {**state, "progress": None, "unreadable": str(e)}


def progress_command(specs: list[dict]) -> str:
    """Shell (no python needed) that prints, per model of ``specs``, ``@@ name`` then its marker
    and its job's progress.json, each on one line, and ``running=1`` while a job holds its lock:
    what status.py shows of the downloads, cheaper than the probe. Each model's directory is read as
    its owner (rigup.nofollow: never through a link, never waiting on a FIFO; flock under a timeout)."""
    q = shlex.quote
    out = [FUNCTIONS]
    for spec in specs:
        dest = spec["dest"].rstrip("/")
        # a revision change in progress: its own directory (fetcher.py), while dest serves the old one
        pick = f"d={q(dest)}"
        if spec.get("stage"):
            wanted = q('"revision":"' + spec["revision"] + '"')
            pick += (f"; [ -d {q(spec['stage'])} ] && ! {read_file(dest, marker_path(dest))} | grep -qsF {wanted} "
                     f"&& d={q(spec['stage'])}")
        out += [f"echo {q('@@ ' + spec['name'])}", pick,
                keyed("marker", f"{READ} \"$d\" \"$d/{MARKER}\" 1048576 | tr -d '\\n'"),
                keyed("progress", f"{READ} \"$d\" \"$d/{WORK}/progress.json\" 65536 | tr -d '\\n'"),
                f"if [ -f \"$d/{WORK}/lock\" ] && [ ! -L \"$d/{WORK}/lock\" ] && ! {AS_OWNER} \"$d\" timeout -k 1 5 "
                f"flock -n -s \"$d/{WORK}/lock\" true 2>/dev/null; then echo running=1; fi"]
    return "; ".join(out) + "; true"


def parse_progress(lines: list[str], specs: list[dict]) -> dict[str, dict]:
    """``progress_command(specs)``'s output -> {name: {"complete", "running", "progress"}}, the keys
    roles/model_fetch/plan.py's progress lines read; complete: the marker names the pinned
    revision (status.py shows it; a converge also checks each file)."""
    _, found = parse_instances(lines)
    out = {}
    for spec in specs:
        state = found.get(spec["name"], {})
        marker = state.get("marker") or {}
        try:
            progress = loads(state.get("progress") or "null", "progress.json")
        except Unreadable:
            progress = "not JSON"
        try:   # typed as the probe's (read_markers): one the boundary does not read is not complete
            marker = results.marker(marker, f"{spec['dest']}/{MARKER}")
        except Unreadable:
            marker = {}
        out[spec["name"]] = read_progress(
            {"complete": marker.get("repo") == spec["repo"] and marker.get("revision") == spec["revision"],
             "running": bool(state.get("running")), "dest": spec["dest"], "progress": progress},
            f"{spec['dest']}/{WORK}/progress.json")
    return out


class ModelFetchState(FactBase):
    """Per model (``specs``: [{name, dest, repo, revision, include, endpoint, no_hub}]): marker,
    progress, running, damaged files, and for one not complete the hub's files, the bytes here
    and the free disk. Also whether the host runs systemd and the share server runs."""

    default = dict

    def command(self, specs: list[dict]) -> str:
        return probe_command(specs)

    def process(self, output: list[str]) -> dict:
        return parse_probe(output)
