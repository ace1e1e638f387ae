"""What is built on a host, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.boundary import fields, results
from rigup.boundary.core import Unreadable

BUILD_UNIT = "rigup-llama-build.service"


def build_link(target: str) -> str | None:
    """A ``current``/``previous`` link's target as rigup writes it (roles/llama_cpp/build.py
    ``switched``): ``builds/<id>``, the id as rigup.boundary.fields ``ID``; else None (no build
    rigup knows). readlink prints the link's text as it is, and it reached the operator's terminal
    in a no-op's line (issue 61, round 9 LC1)."""
    ident = target.removeprefix("builds/")
    return target if target.startswith("builds/") and fields.ID.fullmatch(ident) else None


def parse_state(lines: list[str]) -> dict:
    """``{current, previous, switching, builds: {id: stamp}, unreadable: {id: why}, smokes: {id: smoke result},
    building: bool, systemd: bool, os, glibc, machine}`` (``current``, ``previous``: ``builds/<id>`` or
    None, :func:`build_link`; a stamp: as rigup.boundary.results
    ``stamp`` read it, its id its directory's name; ``unreadable``: the builds whose stamp did not
    read, unknown here, so built again or received; a smoke result: roles/llama_cpp/shipped/smoke.py's
    JSON as rigup.boundary.results ``smoke`` read it, a build whose result does not read having
    none (smoked again); ``switching``: the build a switch cut short was switching to (its mark,
    roles/llama_cpp/build.py ``switched``) or None; ``os``: "debian 12", ``glibc``: "2.36", ``machine``: "x86_64", each None when unknown)."""
    state = {"current": None, "previous": None, "switching": None, "builds": {}, "unreadable": {}, "smokes": {}, "building": False,
             "systemd": False, "os": None, "glibc": None, "machine": None}
    for line in lines:
        key, _, value = line.partition("=")
        if key in ("current", "previous"):
            state[key] = build_link(value)
        elif key == "build":
            ident, _, text = value.partition(" ")
            try:
                state["builds"][ident] = results.stamp(text, f"builds/{ident}/rigup-build.json", build=ident)
            except Unreadable as e:   # no build: a stamp of another build, of a wrong type, half-written
                state["unreadable"][ident] = e.why
        elif key == "smoke":
            ident, _, text = value.partition(" ")
            try:
                state["smokes"][ident] = results.smoke(text, f"builds/{ident}/rigup-smoke.json")
            except Unreadable:   # half-written, or of a wrong type: the build's smoke is unknown (run again)
                state["smokes"].pop(ident, None)
        elif key == "building":
            state["building"] = value == "active"
        elif key == "systemd":
            state["systemd"] = value == "1"
        elif key == "switching":   # roles/llama_cpp/build.py switched's mark: a switch cut short
            # (builds/<id> as switched writes it; other text is a mark of no build rigup names: round 35)
            state["switching"] = build_link(value.strip()) or ("a build its mark does not name" if value.strip() else None)
        elif key in ("os", "glibc", "machine"):
            state[key] = " ".join(value.split())[:64] or None
    return state


class LlamaCppState(FactBase):
    """The builds under ``dir`` (their stamps and smoke results), the ``current`` and ``previous``
    links, whether a build unit runs now, whether the host runs systemd, and what a build's
    binaries need of it (OS release, glibc, machine: roles/llama_cpp/artifact.py)."""

    @staticmethod
    def default() -> dict:
        """What pyinfra returns for an empty answer (its stdout empty, or its command failed; rigup's
        Batch the same): the parsed empty state, every key there (``{}`` ended the whole run with a
        KeyError in its readers: issue 61, round 12 HO1)."""
        return parse_state([])

    def command(self, dir: str) -> str:
        return (
            f"d={shlex.quote(dir)}; printf '%s\\n' \"current=$(readlink \"$d/current\" 2>/dev/null)\" "
            '"previous=$(readlink "$d/previous" 2>/dev/null)" '
            '"switching=$(head -c 300 "$d/switching" 2>/dev/null | head -n 1)"; '
            # a received build that failed its smoke is kept aside as builds/<id>.refused: not a build
            'for f in "$d"/builds/*/rigup-build.json; do case "$f" in *.refused/*) continue;; esac; '
            '[ -f "$f" ] && [ ! -L "$f" ] && '
            'printf "build=%s %s\\n" "$(basename "$(dirname "$f")")" "$(tr -d \'\\n\' < "$f")"; done; '
            'for f in "$d"/builds/*/rigup-smoke.json; do case "$f" in *.refused/*) continue;; esac; '
            '[ -f "$f" ] && [ ! -L "$f" ] && '
            'printf "smoke=%s %s\\n" "$(basename "$(dirname "$f")")" "$(tr -d \'\\n\' < "$f")"; done; '
            f"printf '%s\\n' \"building=$(systemctl is-active {BUILD_UNIT} 2>/dev/null)\"; "
            "[ -d /run/systemd/system ] && echo systemd=1 || echo systemd=0; "
            "printf '%s\\n' \"os=$(. /etc/os-release 2>/dev/null; printf '%s %s' \"$ID\" \"$VERSION_ID\")\" "
            "\"glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2)\" \"machine=$(uname -m)\""
        )

    def process(self, output: list[str]) -> dict:
        return parse_state(output)
