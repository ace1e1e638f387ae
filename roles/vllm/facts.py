"""What a host runs for vllm, read in one round trip."""

import shlex

from pyinfra.api import FactBase

from rigup.names import BALANCER_DIR
from rigup.nofollow import FUNCTIONS
from rigup.units import configured, instance_probe, keyed, parse_instances
from roles.vllm.command import DROPIN, ENV_FILE, KEY_FILE, STAMP


class VllmState(FactBase):
    """The install stamp of the pin's virtualenv, the units rigup configured (``units``: their
    drop-in directories), the balancer's backends files of vLLM instances (``backends``), and per
    unit the sha256 of its drop-in, environment file and key, its unit's state and its model's
    completion marker::

        {"stamp": "{...}" or None, "units": ["glm-0", "glm-1"], "backends": ["vllm-glm"],
         "instances": {"glm": {"dropin": "ab12...", "env": "cd34...", "active": "active",
                               "enabled": "enabled", "key": "1" or None, "marker": {...},
                               "draft": "ef56..." or None}}}
    """

    default = dict

    def command(self, pin_dir: str, instances: dict) -> str:
        """``instances``: unit -> [marker, the instance whose key it uses (NAME, or NAME-K), its
        drafter's marker or None] (the drafter's marker is read as ``draft``: its sha256)."""
        stamp = keyed("stamp", f"cat {shlex.quote(pin_dir + '/' + STAMP)} 2>/dev/null | tr -d '\\n'")
        return "; ".join([FUNCTIONS, stamp, configured("rigup-vllm", "vllm", BALANCER_DIR)] + [
            instance_probe(unit, f"rigup-vllm@{unit}.service",
                           {"dropin": DROPIN.format(unit), "env": ENV_FILE.format(unit),
                            **({"draft": draft} if draft else {})}, marker, key=KEY_FILE.format(name))
            for unit, (marker, name, draft) in sorted(instances.items())])

    def process(self, output: list[str]) -> dict:
        return parse_state(output)


def parse_state(lines: list[str]) -> dict:
    head, instances = parse_instances(lines)
    return {"stamp": head.get("stamp"), "units": (head.get("units") or "").split(),
            "backends": (head.get("backends") or "").split(), "instances": instances}


class VllmCommit(FactBase):
    """The commits of git repository ``url`` whose id starts with ``prefix`` (a short
    vllm_git_commit, 7-39 hex), read on the host: its branches and tags are cloned, commits only
    (``--filter=tree:0``, where the server allows it), into a temporary directory that is removed
    again; nothing on the host changes::

        {"git": True, "fetched": True, "commits": ["79a7108d9c..."], "error": None}

    ``git`` False: the host has no git yet (roles/base installs it). ``fetched`` False: the clone
    failed, ``error`` its last line."""

    @staticmethod
    def default() -> dict:
        return {"git": False, "fetched": False, "commits": [], "error": None}

    def command(self, url: str, prefix: str) -> str:
        q = shlex.quote
        # vllm_netrc_src, once roles/vllm placed it: git's libcurl reads its HOME's .netrc
        return ("h=/etc/rigup/vllm-auth; if [ -r \"$h/.netrc\" ]; then export HOME=\"$h\"; fi; "
                "if ! command -v git >/dev/null 2>&1; then echo git=no; else echo git=yes; d=$(mktemp -d); "
                "if GIT_TERMINAL_PROMPT=0 GIT_SSH_COMMAND='ssh -o BatchMode=yes' timeout 600 git clone -q --bare "
                f"--filter=tree:0 -- {q(url)} \"$d/repo\" 2>\"$d/err\"; then echo fetched=yes; "
                f"git -C \"$d/repo\" rev-parse --disambiguate={q(prefix)} 2>/dev/null "
                "| git -C \"$d/repo\" cat-file --batch-check='%(objecttype) %(objectname)' "
                "| sed -n 's/^commit /commit=/p'; "
                "else echo fetched=no; printf '%s\\n' \"error=$(grep -m 1 -e '^fatal:' -e '^error:' \"$d/err\" || tail -n 1 \"$d/err\")\"; fi; "
                "rm -rf \"$d\"; fi")

    def process(self, output: list[str]) -> dict:
        return parse_commits(output)


def parse_commits(lines: list[str]) -> dict:
    found = VllmCommit.default()
    for line in lines:
        key, _, value = line.strip().partition("=")
        if key in ("git", "fetched"):
            found[key] = value == "yes"
        elif key == "commit" and value:
            found["commits"].append(value)
        elif key == "error":
            found["error"] = value or None
    found["commits"] = sorted(set(found["commits"]))
    return found
