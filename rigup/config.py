"""rigup's configuration: role defaults, YAML group_vars, and their validation.

Precedence, lowest first (what an Ansible user expects; SITE is the operator's site directory,
:func:`all_group`):
    roles/*/defaults.yml < group_vars/all.yml < SITE/group_vars/all.yml
    < each group: its data in the inventory file < group_vars/<group>.yml < SITE/group_vars/<group>.yml
      (a host in several groups: the group defined later in the file wins, the file's own group last)
    < inventory host data < host_vars/<host>.yml < SITE/host_vars/<host>.yml (as Ansible's) < --data

pyinfra 3.10 lists a host's groups in the order the inventory file defines them (its module's
globals; pyinfra_cli/inventory.py make_inventory_from_files, which appends the file's own group,
and pyinfra/api/inventory.py Inventory.make_hosts_and_groups) and merges their data in that
order, "the last group's value will hold" (Inventory.get_groups_data); the host's data from each
group's entry merge in the same order.

Inventory files end in ``all = all_group(globals())``, which layers the YAML onto every group of
the file so that pyinfra's own layering applies and ``pyinfra INVENTORY debug-inventory`` shows
the result. Every variable is declared once, in its role's ``defaults.yml``, with a comment above it that ends in its form in brackets::

    # Port llama-server listens on. [int 1..65535]
    llama_port: 8080

Forms: ``bool``, ``int``, ``float``, ``str``, ``name`` (a unit, file or user name: 1-64 letters,
digits, ``_.-``, not ending in a systemd unit type such as ``.timer``), ``address`` (an IP address or host name), ``ip`` (the IP address of one host: no name,
network or wildcard), ``batch`` (a count >= 1 or a share, ``"25%"``), ``count`` (``auto`` or an int >= 1: rigup chooses, or you do), ``path`` (an absolute, normal directory on a host that is not a system
directory), ``file`` (an absolute path on the controller), ``list``, ``map``, ``any``;
``int A..B`` / ``float A..B`` / ``count A..B`` (either end may be left out: an int's upper end
is then :data:`CEILING`, the largest int32; NaN and infinities are never a number of a form);
``one of a|b|c``; ``list of T``; and a trailing ``or null``. No value holds
a control character (a newline, NUL ...): values end up in units, env files and command lines. :func:`check_host` validates a host's merged data against them and
raises :class:`ConfigError` naming the file, the key and the expected form.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import posixpath
import re
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pyinfra.api.exceptions import PyinfraError

from rigup import playfile, yamlfile
from rigup import run as run_state
from rigup.boundary import owned
from rigup.text import secret_name
from rigup.boundary.core import Unreadable, loads
from rigup.boundary.fields import ADDRESS, NAME, PATH_CHARS, control_at, host_ip, host_name   # noqa: F401  (NAME, ADDRESS, host_ip: the names config's callers import)
from rigup.boundary.numbers import number
from rigup.text import shown

ROOT = Path(__file__).resolve().parents[1]
ROLES_DIR = ROOT / "roles"
GROUP_VARS_DIR = ROOT / "group_vars"
# The environment variable naming the site directory (its group_vars/*.yml over the shipped ones).
SITE_ENV = "RIGUP_SITE"

# Host data that belongs to pyinfra and its connectors, not to rigup's roles.
CONNECTOR_PREFIXES = ("_", "ssh_", "vagrant_", "docker_", "podman_", "chroot_", "local_",
                      "fake_", "terraform_", "winrm_", "dockerssh_")


class ConfigError(PyinfraError):
    """A configuration value is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class Form:
    """The expected form of a variable, parsed from ``[...]`` in its comment."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    item: Form | None = None
    nullable: bool = False
    text: str = ""

    def problem_of(self, key: str, value: Any) -> str | None:
        """:meth:`problem` of ``key``'s ``value``, the value not quoted where the key names a secret (an api_key
        given the key itself, a *_token_src given the token: round 19 S19c, S19d)."""
        why = self.problem(value)
        a_path = self.kind in ("file", "path") and isinstance(value, str) and value.startswith("/")   # where, not what
        if why and not a_path and secret_name(str(key).rsplit(".", 1)[-1]):
            size = f" of {len(value)} characters" if isinstance(value, str) else ""
            return f"got a {type(value).__name__}{size}, not shown: the key names a secret"
        return why

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not have this form, or None when it does."""
        if value is None:
            return None if self.nullable else "null is not allowed"
        kind_ok = {
            "any": True,
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "name": isinstance(value, str),
            "address": isinstance(value, str),
            "ip": isinstance(value, str),
            "path": isinstance(value, str) and value.startswith("/"),
            "file": isinstance(value, str) and value.startswith("/"),
            "list": isinstance(value, list),
            "map": isinstance(value, dict),
            "batch": isinstance(value, str) and BATCH.fullmatch(value) is not None
            or isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "count": value == "auto" or isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "llamatest": isinstance(value, str),
        }[self.kind]
        if not kind_ok and isinstance(value, (list, dict)):
            # a container by its size, never its items (round 21 S20d: vllm_env given a list quoted the token in it)
            return f"got a {type(value).__name__} of {len(value)} item{'s' * (len(value) != 1)}"
        if not kind_ok:
            hint = ""
            if self.kind in ("str", "name", "path", "file") and isinstance(value, (int, float)):
                hint = ' (a number: quote it, e.g. --data \'key="12.8"\' on the command line)'
            elif self.kind == "count":
                hint = ": auto (rigup chooses) or an int >= 1"
            return f"got {value!r} ({type(value).__name__}){hint}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"got {value!r}: not a finite number"
        control = control_character(value) or bool_key(value)
        if control:
            return control
        if self.kind == "name" and not NAME.fullmatch(value):
            return (f"got {value!r}: a name is 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit, "
                    "and not ending in a systemd unit type (.service, .timer, .socket, ...)")
        if self.kind == "address" and not ADDRESS.fullmatch(value):
            return f"got {value!r}: an IP address or a host name"
        if self.kind == "llamatest" and not LLAMA_TEST.fullmatch(value):
            return f"got {value!r}: a llama-bench test is ppN (prompt processing of N tokens) or tgN (generating N), N 1..999999"
        if self.kind == "ip" and not host_ip(value):
            return f"got {value!r}: the IP address of one host (no host name, network, wildcard such as 0.0.0.0 or IPv6 zone)"
        if self.kind == "file":
            why = file_problem(value)
            if why:
                return f"got {value!r}: {why}"
        if self.kind == "path":
            why = path_problem(value)
            if why:
                return f"got {value!r}: {why}"
        if self.choices and value not in self.choices:
            return f"got {value!r}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            high = self.high if self.high is not None else CEILING if self.kind in ("int", "count", "batch") else None
            if self.low is not None and value < self.low or high is not None and value > high:
                return f"got {str(value)[:40]}, out of range" + (f" (at most {CEILING})" if self.high is None else "")
        if self.item is not None:
            for i, element in enumerate(value):
                why = self.item.problem(element)
                if why:
                    return f"item {i}: {why}"
        return None


# A git URL git reads as one, never an option or another transport (ext::): scheme://, or
# user@host:path; roles/vllm takes fewer (no http:// or git://).
GIT_URL = re.compile(r"(https?|git|ssh|file)://[A-Za-z0-9_.\[/][^\s'\"\\;`$]*"
                     r"|[A-Za-z0-9_][A-Za-z0-9_.-]*@[A-Za-z0-9][A-Za-z0-9_.-]*:[A-Za-z0-9_.~/][^\s'\"\\;`$]*")
# A llama-bench test (bench.py): ppN or tgN, N tokens (plays.bench.llama_bench_args reads it).
LLAMA_TEST = re.compile(r"(pp|tg)([1-9][0-9]{0,5})")
# A batch of hosts: a count (an int >= 1) or a share of them ("25%": 1% to 100%).
BATCH = re.compile(r"([1-9][0-9]?|100)%")
# Directories a rigup path must never be (chown -R, rm, installs there would break the host), and
# trees it must never be under.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media",
                         "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
                         "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/cache",
                         "/var/lib", "/var/log", "/var/tmp"})
SYSTEM_TREES = ("/bin/", "/boot/", "/dev/", "/etc/", "/lib/", "/lib64/", "/proc/", "/sbin/", "/sys/",
                "/usr/bin/", "/usr/lib/", "/usr/sbin/")
# Directories every user of a host may write (sticky, mode 1777 on Debian): a directory rigup makes
# as root under one may have been made first by another user (with a bin/ of theirs, or a link),
# whose files root then runs (round 10, H1).
SHARED_TREES = ("/tmp/", "/var/tmp/", "/dev/shm/", "/run/lock/", "/var/lock/")


def control_character(value: Any) -> str | None:
    """Why ``value`` cannot be written into a unit, env file or command line, or None."""
    found = control_at(value)
    if not found:
        return None
    where, char = found
    return (f"{where.lstrip('.') + ' ' if where else ''}holds the control character {char!r} (newlines, NUL "
            "and the like cannot go into a unit, an env file or a command line)")


def bool_key(value: Any, path: str = "") -> str | None:
    """Why ``value`` holds a map key YAML 1.1 read as a bool or null (a bare ``on``, ``no``, ``~``: a
    model called ``on`` is the key True, which no name check reads as text), or None."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(value, dict) and (key is None or isinstance(key, bool)):
            read = "null" if key is None else "a bool"
            return f"{path.lstrip('.') + ' ' if path else ''}holds the key {key!r}: YAML read it as {read}; quote it"
        found = bool_key(item, f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}")
        if found:
            return found
    return None


def path_problem(path: str) -> str | None:
    """Why ``path`` is no directory for rigup to own on a host, or None. Its characters are those
    unit files and shells take as they are (letters, digits, ``_.+@:-`` and ``/``)."""
    if not PATH_CHARS.fullmatch(path):
        return "a host path is letters, digits and _ . + @ : - between slashes (no spaces or shell characters)"
    if any(part == ".." for part in path.split("/")):
        return "it holds '..'"
    if posixpath.normpath(path) != path:
        return f"write it as {posixpath.normpath(path)!r}"
    if path in SYSTEM_DIRS or path.startswith(SYSTEM_TREES):
        return "a system directory (or one under /etc, /usr, /dev, /proc, /sys, /boot ...) cannot be rigup's"
    shared = next((tree for tree in SHARED_TREES if path.startswith(tree)), None)
    if shared:
        return (f"under {shared.rstrip('/')}, which every user of the host can write: another user could make "
                "the directory (or a link) first and root would use theirs; keep it under a directory of root's "
                "(/opt, /srv, /var/lib)")
    return None


def file_problem(path: str) -> str | None:
    """Why the controller file ``path`` (a [file] key: a source archive built as root, a key, a
    token) is not one rigup may use, or None: the rule of rigup.boundary.owned (OpenSSH's
    StrictModes), that no user but you or root could have written it or a directory on its path,
    checked by the descriptor of the file opened without following a link (round 10, AR1: another
    user's archive in a 1777 directory was built as root on every host). None for a file not there
    (one made on first use; a reader that needs it says so)."""
    if not os.path.lexists(path):
        return None
    try:
        os.close(owned.opened(path, path))
    except owned.NotOwned as e:
        return e.why
    return None


# The most an int form takes when it names no upper end (``int 1..``, ``count``): the largest int32,
# which is what llama.cpp, vLLM and systemd read such a value as; a form with a natural bound names
# it (a port 1..65535, replicas, ctx: rigup/contract). Without one, ``replicas: 10**30`` had
# preflight build that many groups.
CEILING = 2**31 - 1

_FORM_RE = re.compile(r"\[([^\[\]]+)\]\s*$")
_KINDS = ("bool", "int", "float", "str", "name", "address", "ip", "path", "file", "list", "map", "any", "batch",
          "count", "llamatest")


def parse_form(text: str) -> Form:
    """Parse a form such as ``int 1..65535 or null``; raise ValueError when it is not one."""
    spec = text.strip()
    nullable = spec.endswith(" or null")
    if nullable:
        spec = spec[: -len(" or null")].strip()
    if spec.startswith("one of "):
        choices = tuple(c.strip() for c in spec[len("one of "):].split("|"))
        return Form("str", choices=choices, nullable=nullable, text=text.strip())
    if spec.startswith("list of "):
        item = parse_form(spec[len("list of "):])
        return Form("list", item=item, nullable=nullable, text=text.strip())
    kind, _, bounds = spec.partition(" ")
    if kind not in _KINDS:
        raise ValueError(f"unknown form {text!r}")
    low = high = None
    if bounds:
        if kind not in ("int", "float", "count") or ".." not in bounds:
            raise ValueError(f"unknown form {text!r}")
        lo, hi = bounds.split("..")
        low = float(lo) if lo.strip() else None
        high = float(hi) if hi.strip() else None
    return Form(kind, low, high, nullable=nullable, text=text.strip())


@dataclass(frozen=True)
class Var:
    """One variable, as declared in a role's defaults.yml."""

    name: str
    default: Any
    form: Form
    doc: str
    file: str


def rel(path: Path) -> str:
    """A path as users see it in messages: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def load_yaml(path: Path, site: Path | str | None = None) -> dict:
    """A YAML mapping from ``path``; a ConfigError naming the file and line otherwise. A file of the
    site directory ``site`` is read only when no other user could have written it (:func:`site_text`)."""
    text = site_text(path) if site and Path(path).is_relative_to(site) else path.read_text()
    try:
        data = yamlfile.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{rel(path)}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    except ValueError as e:   # a constructor's own (a date 2026-13-45; int()'s 4300-digit limit): no mark of its own
        long = re.search(r"[0-9_]{%d,}" % sys.get_int_max_str_digits(), text)
        where = f":{text.count(chr(10), 0, long.start()) + 1}" if long else ""
        raise ConfigError(f"{rel(path)}{where}: a value YAML cannot read: {str(e)[:120]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{rel(path)}: expected a mapping of variable names to values, "
                          f"got {type(data).__name__}")
    return data


def site_text(path: Path) -> str:
    """A site directory's file (``RIGUP_SITE``): its text, read only when no other user could have
    written it or a directory on its path (rigup.boundary.owned); ConfigError otherwise."""
    try:
        return owned.read(path, f"the site directory ({SITE_ENV})")
    except owned.Unreadable as e:
        raise ConfigError(str(e)) from None


def _declarations(path: Path) -> dict[str, Var]:
    """The variables of one defaults.yml, each with its form and doc from the comment above."""
    values = load_yaml(path)
    found: dict[str, Var] = {}
    comment: list[str] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
            continue
        key = re.match(r"([A-Za-z_][A-Za-z0-9_]*):", line)
        if key and key.group(1) in values:
            name = key.group(1)
            doc = " ".join(comment)
            form = _FORM_RE.search(doc)
            if not form:
                raise ConfigError(f"{rel(path)}:{lineno}: {name}: the comment above it must end "
                                  "with its form in brackets, e.g. [int 1..65535]")
            try:
                parsed = parse_form(form.group(1))
            except ValueError as e:
                raise ConfigError(f"{rel(path)}:{lineno}: {name}: {e}") from None
            found[name] = Var(name, values[name], parsed, doc[: form.start()].strip(), rel(path))
        if not line.startswith((" ", "-")):
            comment = []
    return found


@lru_cache(maxsize=None)
def declared() -> dict[str, Var]:
    """Every variable of every role, by name."""
    out: dict[str, Var] = {}
    for path in sorted(ROLES_DIR.glob("*/defaults.yml")):
        for name, var in _declarations(path).items():
            if name in out:
                raise ConfigError(f"{var.file}: {name} is already declared in {out[name].file}")
            out[name] = var
    return out


def role_defaults(role: str) -> dict[str, Any]:
    """The defaults of one role (for ``@deploy(data_defaults=...)``)."""
    path = ROLES_DIR / role / "defaults.yml"
    return {name: var.default for name, var in _declarations(path).items()}


def group_files(name: str, site: Path | str | None = None) -> list[Path]:
    """The YAML files of group ``name`` that exist, lowest first: ``group_vars/<name>.yml``, then
    ``<site>/group_vars/<name>.yml``."""
    dirs = [GROUP_VARS_DIR, *([Path(site) / "group_vars"] if site else [])]
    return [path for path in (d / f"{name}.yml" for d in dirs) if path.exists() or path.is_symlink()]


def host_vars(name: str, site: Path | str | None = None) -> dict[str, Any]:
    """A host's own YAML, as Ansible's host_vars: ``host_vars/<name>.yml``, then
    ``<site>/host_vars/<name>.yml`` (tune.py writes its results there), merged, the site's winning."""
    dirs = [ROOT / "host_vars", *([Path(site) / "host_vars"] if site else [])]
    data: dict[str, Any] = {}
    for path in (d / f"{name}.yml" for d in dirs):
        if path.exists() or path.is_symlink():
            data.update(load_yaml(path, site))
    return data


def group_vars(name: str, site: Path | str | None = None) -> dict[str, Any]:
    """Group data for inventory files: :func:`group_files` merged, the site's winning; for ``all``,
    on top of every role's defaults."""
    data = {n: v.default for n, v in declared().items()} if name == "all" else {}
    for path in group_files(name, site):
        data.update(load_yaml(path, site))
    return data


def source_of(host, key: str) -> str:
    """Which file or layer gave ``host`` its value of ``key`` (for messages)."""
    inventory = host.inventory
    if key in (inventory.get_override_data() or {}):
        return "--data"
    if key in inventory.get_host_data(host.name):
        return f"inventory host data of {host.name}"
    site = host.data.get("_rigup_site")
    for group in reversed(host.groups):
        if key in inventory.get_group_data(group):
            return next((rel(path) for path in reversed(group_files(group, site)) if key in load_yaml(path)),
                        f"inventory group {group}")
    path = next((path for path in reversed(group_files("all", site)) if key in load_yaml(path)), None)
    if path:
        return rel(path)
    var = declared().get(key)
    return var.file if var else "inventory data"


def data_pairs(args: list[str]) -> list[tuple[str, str]]:
    """The ``--data key=value`` pairs among pyinfra's arguments, ``(key, its text)`` in command-line
    order, read by pyinfra's own command (its click parser): ``--data k=v`` and ``--data=k=v`` alike,
    a word that is another option's value or a command's (``exec -- ...``) not one. A reading by hand
    put every ``--data=`` pair after the ``--data`` ones, so rigup checked another survivor than
    pyinfra's (issue 61, rerun 2 N5). A command line click refuses gives none: pyinfra runs no play
    with it, and says why itself."""
    import click   # pyinfra's CLI, imported only when a command line is read
    from pyinfra_cli.cli import cli

    try:
        opts, _, _ = cli.make_parser(click.Context(cli)).parse_args(list(args))
    except click.UsageError:
        return []
    return [(k, v) for k, _, v in (p.partition("=") for p in opts.get("data") or ())]


def cli_value(text: str) -> Any:
    """A ``--data key=value`` value as pyinfra's CLI reads it: true/false (any case), an int,
    JSON, else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def data_texts(args: list[str]) -> dict[str, str]:
    """``{key: its text}`` of the ``--data`` pairs (:func:`data_pairs`), the last of a key given
    twice winning, as pyinfra keeps it."""
    return dict(data_pairs(args))


def data_number_problems(args: list[str]) -> list[tuple[str, str]]:
    """(key, message) for each ``--data`` value (every pair of :func:`data_pairs`, an overridden one
    too) that pyinfra reads as a number rigup's one number parser (rigup.boundary.numbers: ASCII
    decimal digits, no leading zero, at most 18 digits) does not, or as JSON rigup's JSON reader
    (rigup.boundary.core.loads) refuses. pyinfra_cli's parse_cli_arg tries ``int()`` first, which reads
    ``5_0_0`` and ``٥٠٠`` (another script's digits) as 500, where the YAML loader refuses the one and
    reads the other as text (issue 61); then ``json.loads``, which keeps the last of a key given twice
    where the YAML loader refuses it (rerun 2 N34). Only the command line's text shows either."""

    found = []
    for key, text in data_pairs(args):
        secret = secret_name(key)    # its value never quoted (round 20 S20d: a token of digits with a leading zero)
        try:
            read = cli_value(text)   # to say what pyinfra made of the text
        except RecursionError:       # json.loads past Python's stack: pyinfra ends in a traceback
            read = None
        if isinstance(read, bool) or (isinstance(read, str) and read == text):
            continue                 # true/false, or text pyinfra keeps as it is
        if type(read) is int:
            # a control character around the digits (form feed, vertical tab) is a blank to int() and to the
            # one number parser, and refused by the YAML loader (Hypothesis: '0\x0c')
            if number(text, int) != read or control_at(text) is not None:
                found.append((key, f"{key}={'(not shown: the key names a secret)' if secret else repr(text)}: pyinfra "
                                   f"reads it as {'a number' if secret else f'the number {read}'}, which rigup does not "
                                   f"take (ASCII digits 0-9 alone, no '_', no leading zero): write "
                                   f"{'it so' if secret else read}, or quote text (--data '{key}=\"...\"')"))
            continue
        try:
            loads(text, key)
        except Unreadable as e:
            found.append((key, f"{key}={'(not shown)' if secret else shown(text, 80)}: pyinfra reads it as JSON, "
                               "which rigup does not take "
                               f"({e.why.removeprefix('not JSON (').removesuffix(')')}): give each key once, "
                               "no NaN or Infinity"))
    return found


# how rigup spells a variable: lower-case words, a word with a digit short (gen2, p2p, sha256, gpu0)
_VARIABLE_SPELLING = re.compile(r"(?=.{1,64}$)(?:[a-z]{1,16}|(?=[a-z0-9]*[0-9])[a-z0-9]{1,6})(?:_(?:[a-z]{1,16}|[0-9a-z]{1,6}))*")


def shown_key(key: Any) -> str:
    """An unknown key as an error quotes it: quoted where spelled as a rigup variable is, else by its
    length (round 21 S20d: a token given as a key name, ``hf_AbCd...``, was quoted)."""
    if isinstance(key, str) and _VARIABLE_SPELLING.fullmatch(key):
        return repr(key)
    return f"of {len(str(key))} characters, spelled as no rigup variable is (not shown)"


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for every unknown key and every value not of its declared form."""
    found = []
    variables = declared()
    for key, value in data.items():
        if key.startswith(CONNECTOR_PREFIXES):
            continue
        var = variables.get(key)
        control = control_at(value)
        if var is not None and control:
            found.append((key, f"{key}{control[0]}: holds the control character {control[1]!r} (newlines, NUL and "
                               "the like cannot go into a unit, an env file or a command line)"))
            continue
        if var is None:
            close = difflib.get_close_matches(key, variables, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            found.append((key, f"unknown key {shown_key(key)}{hint}; rigup's variables are declared in "
                               "roles/*/defaults.yml"))
            continue
        why = var.form.problem_of(key, value)
        if why:
            found.append((key, f"{key}: expected {var.form.text}, {why}"))
    return found


class Config(Mapping):
    """One host's configuration for one run, read once: its merged data with the default of every
    variable it lacks (read-only: a Mapping without setters), and what the outside world says of
    it (:attr:`hub`: the hub's answers for its models, by rigup.models.hub_key). The roles take
    it as an argument (``apply(plan, cfg)``, their checks ``(plan, facts, cfg)``) and read every
    entry through it (rigup.models.models(cfg) pins a branch with the hub's answer), so nothing
    depends on which host or role happened to ask the hub first."""

    __slots__ = ("name", "_data", "_resolvers", "_hub", "_derived")

    def __init__(self, name: str, data: dict[str, Any], resolvers: tuple = ()):
        self.name, self._data, self._resolvers, self._hub, self._derived = name, data, resolvers, None, {}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Config({self.name!r}, {len(self._data)} variables)"

    @property
    def hub(self) -> Mapping[tuple, dict]:
        """What the hub said of this host's models: asked of each role's ``resolve`` the first time
        it is read (preflight's first look at the models), once per run per repo@revision whatever
        the hosts (roles/model_fetch/hub.py), then the same for the rest of the run."""
        if self._hub is None:
            answers: dict[tuple, dict] = {}
            for resolve in self._resolvers:
                answers.update(resolve(self))
            self._hub = MappingProxyType(answers)
        return self._hub


def once(data: Mapping, key, build):
    """``build()``, made once for a :class:`Config` (what a role reads of it: its normalised entries,
    rigup.models.models, a serving role's instances) and kept with it for the run, since a Config
    never changes; made each time for a plain dict (a unit test's data). Read it, never change it."""
    if not isinstance(data, Config):
        return build()
    if key not in data._derived:
        data._derived[key] = build()
    return data._derived[key]


def configure(host, roles=()) -> Config:
    """Validate ``host``'s merged data (raise ConfigError listing every problem with its file),
    give the host the default of every variable its data lacks (an inventory that does not use
    :func:`all_group`, ``@local`` or a user's own file, has no role defaults outside the roles'
    own ``@deploy``), and return its :class:`Config`. ``roles`` (the play's role modules): those
    with a ``resolve(cfg)`` ask the outside world (the hub) for what their entries leave out, the
    first time a host's configuration is read. Every play calls it first, so it also gives the
    play file a module entry (rigup/playfile.py)."""
    playfile.own_module_of(host)
    data = host.data.dict()
    found = problems(data) + data_number_problems(sys.argv[1:])   # pyinfra's CLI: its --data as typed
    if found:
        lines = [f"{source_of(host, key)}: {message}" for key, message in found]
        raise ConfigError(f"invalid configuration for host {host.name}:\n  " + "\n  ".join(lines))
    for name, var in declared().items():
        if name not in data:
            setattr(host.data, name, var.default)
    run = run_state.host_run(host)   # the roles' resolvers, each host's Config, the fleet's (rigup/run.py)
    resolvers = tuple(r.resolve for r in roles if r.resolve)
    if resolvers and not run.resolvers:
        run.resolvers = resolvers
    return config_of(host)


check_host = configure   # the plays that read no hub: validation and defaults alone


@contextmanager
def host_only(host):
    """A play's body for ``host``: a :class:`ConfigError` in it (the host's configuration, or a peer's
    setting it reads) fails ``host`` alone, each reason named on a line of its own and in the summary,
    and the run goes on for the other hosts (pyinfra ends the whole run at an exception from any
    host's play file; with no host left it ends it, as for every failed host)."""
    from rigup import summary
    from rigup.text import say

    try:
        yield
    except ConfigError as e:
        head, *reasons = [line.strip() for line in str(e).splitlines() if line.strip()] or ["invalid configuration"]
        for line in [head, *reasons]:
            say(f"    [{host.name}] {line}", fg="red")
        summary.fail(host, reasons or [head])


def config_of(host) -> Config:
    """``host``'s :class:`Config` for this run (a peer's too: made when first read, with its
    defaults, whether or not its own play ran yet)."""
    run = run_state.host_run(host)   # the roles' resolvers, each host's Config, the fleet's (rigup/run.py)
    cfg = run.configs.get(host.name)
    if cfg is None:
        defaults = {name: var.default for name, var in declared().items()}
        cfg = run.configs[host.name] = Config(host.name, {**defaults, **host.data.dict()}, run.resolvers)
    return cfg


def peer_value(data: Mapping, key: str) -> Any:
    """``data[key]`` of another host (a peer, read by this host's role on a run that may not configure
    it: ``--limit gw``) when of its form (:class:`Form`), else ConfigError naming the host and the key:
    a peer's ``rigup_maintenance: "false"`` was true on a gateway, its ``rpc_worker_port: "٥٠٠٥٢"``
    50052 on an RPC head (issue 61, round 10 G3); its own configure refuses it as well."""
    var = declared().get(key)
    value = data.get(key, var.default if var is not None else None)   # a Config holds every default
    why = var.form.problem_of(key, value) if var is not None else f"{key} is not declared"
    if why:
        host = getattr(data, "name", None)
        raise ConfigError(f"{f'host {host}: ' if host else ''}{key}: expected {var.form.text if var else '?'}, {why}: "
                          "fix it in that host's host_vars or group_vars")
    return value


def fleet_data(host) -> dict[str, Config]:
    """Every host of ``host``'s inventory: its :class:`Config` by name, made once per run and
    shared by every host's play. The roles that read other hosts' settings (peers, gateways, RPC
    groups, Prometheus's targets) take it from here: each making every host's dict was N dicts
    for each of N hosts, N squared a run (a million for 1,000 hosts)."""
    run = run_state.host_run(host)   # the roles' resolvers, each host's Config, the fleet's (rigup/run.py)
    if run.fleet is None:
        run.fleet = {h.name: config_of(h) for h in host.inventory}
    return run.fleet


def site_dir(inventory: Path, setting: str | None) -> Path | None:
    """The site directory: the inventory file's ``site=`` (relative to the file) or ``$RIGUP_SITE``
    (relative to the working directory); both only when they name the same directory."""
    named = {}
    if os.environ.get(SITE_ENV):
        named[f"{SITE_ENV}={os.environ[SITE_ENV]}"] = Path(os.environ[SITE_ENV]).expanduser().resolve()
    if setting is not None:
        named[f"{rel(inventory)}: site={setting!r}"] = (inventory.parent / Path(setting).expanduser()).resolve()
    if len(set(named.values())) > 1:
        raise ConfigError(" and ".join(named) + " name two site directories: keep one")
    for how, site in named.items():
        if not (site / "group_vars").is_dir():
            raise ConfigError(f"{how}: {site} has no directory group_vars/ (a site directory holds "
                              "group_vars/<group>.yml files)")
        try:    # used only when no other user could have written them (rigup.boundary.owned)
            for d in (site, site / "group_vars", site / "host_vars"):
                if d == site or os.path.lexists(d):
                    owned.directory(d, how)
        except owned.Unreadable as e:
            raise ConfigError(str(e)) from None
        stray = sorted((site / "group_vars").glob("*.yaml"))
        if stray:
            raise ConfigError(f"{stray[0]}: rigup reads <group>.yml files only: rename it {stray[0].stem}.yml")
        return site
    return None


def all_group(module: dict[str, Any], site: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """The ``all`` group of an inventory file, as its last line: ``all = all_group(globals())``.

    Every group of the file (a module-level list of hosts, or a ``(hosts, data)`` tuple, whose name
    does not start with ``_``: what pyinfra takes for a group) gets :func:`group_vars` over its data
    in the file. pyinfra puts every host of ``inventory/mine.py`` in the group ``mine`` too, after
    the file's own groups; unless the file defines ``mine``, it is added here, with
    ``group_vars/mine.yml``. ``all`` holds every host of every group, so no host listed in a group
    drops out of the inventory, with the role defaults and ``group_vars/all.yml`` as its data.
    ``site`` (or ``$RIGUP_SITE``) names the site directory, whose ``group_vars/*.yml`` load over
    the shipped ones (:func:`site_dir`).
    Loading an inventory this way also starts rigup's end-of-run summary (rigup.summary), which
    must hear the connection errors."""
    if not isinstance(module, dict) or "__file__" not in module:
        raise ConfigError(f"all_group takes the inventory file's globals(): all = all_group(globals()), "
                          f"not {type(module).__name__}")
    from rigup import summary
    summary.watch()
    inventory = Path(module["__file__"])
    site = site_dir(inventory, site)
    names: list[str] = []
    groups = []
    for key, value in list(module.items()):
        # what pyinfra_cli.inventory._is_inventory_group takes (importing pyinfra_cli would patch
        # the standard library with gevent)
        if key.startswith("_") or key == "all" or not isinstance(value, (list, tuple)):
            continue
        if isinstance(value, tuple) and not (len(value) == 2 and isinstance(value[0], list)
                                             and isinstance(value[1], dict)):
            raise ConfigError(f"{rel(inventory)}: {key}: a group is a list of hosts or a (hosts, data) tuple")
        hosts, data = value if isinstance(value, tuple) else (value, {})
        if not all(isinstance(entry, (str, tuple)) for entry in hosts):
            continue  # pyinfra ignores it too, with a warning
        groups.append(key)
        entries = []
        for entry in hosts:
            name, own = (entry[0], entry[1]) if isinstance(entry, tuple) else (entry, {})
            try:   # pyinfra prints it before each of the host's lines; host_vars/NAME.yml is read by it
                host_name(name, f"{rel(inventory)}: {key}: the host {str(name)[:60]!r}")
            except Unreadable as e:
                raise ConfigError(str(e)) from None
            extra = host_vars(str(name), site)
            entries.append((name, {**own, **extra}) if extra else entry)
            if name not in names:
                names.append(name)
        module[key] = (entries, {**data, **group_vars(key, site)})
    own = inventory.name.rsplit(".", 1)[0]    # pyinfra_cli.inventory.make_inventory_from_files
    if own not in groups:
        module[own] = (names, group_vars(own, site))
    return names, {**group_vars("all", site), **({"_rigup_site": str(site)} if site else {})}
