"""Secrets on a host: API keys made there by a root shell (never passing through pyinfra, an
argv, a unit or a log; the health gate reads them there), and files from the controller sent on
stdin (never through a temporary file)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand
from rigup.probe import operation

from rigup.boundary import owned
from rigup.config import ConfigError
from rigup.files import FileStates
from rigup.state import read_once, reading


def controller_token(path: Path, where: str = "the token file") -> str:
    """A token kept in ``path`` on the controller, made (0600, its directory 0700) on first use:
    the same for every host and every run. Read only when no other user could have written it or
    may read it, and only a key of printable ASCII (rigup.boundary.owned): ConfigError naming
    ``where`` (its variable) otherwise, before it is written anywhere. Nothing is made before its
    path is checked (rigup.boundary.owned.create: what is missing made only below a checked
    directory, the key O_EXCL|O_NOFOLLOW): no key is made through another user's link or in their
    directory; a sticky one (/tmp) may hold it, as it may hold any file read."""
    try:
        if not os.path.lexists(path):   # made there first by another host's greenlet: read as it is
            owned.create(path, secrets.token_hex(32), f"{where}: {path}")
        return owned.key(owned.read(path, where, secret=True), f"{where}: {path}")
    except owned.Unreadable as e:
        raise ConfigError(str(e)) from None


def fleet_api_key(data: dict) -> str | None:
    """The fleet's API key (``fleet_api_key``: true; roles/balancer/defaults.yml), read on the
    controller from ``fleet_api_key_src`` (null: ~/.config/rigup/api-key, made on first use); None
    when each host makes its own keys."""
    if not data.get("fleet_api_key"):
        return None
    return controller_token(Path(data.get("fleet_api_key_src") or Path.home() / ".config" / "rigup" / "api-key"),
                            "fleet_api_key_src")


def new_key(path: str, group: str, prefix: str = "") -> StringCommand:
    """Shell that writes ``prefix`` + a random 256-bit hex key to ``path`` (root:``group`` 0640,
    no trailing newline), creating its directory root:``group`` 0750."""
    q = shlex.quote
    tmp, directory = q(path + ".new"), q(path.rsplit("/", 1)[0])
    make = f"import secrets; print({prefix!r} + secrets.token_hex(32), end='')"
    return StringCommand(
        f"install -d -m 0750 -g {q(group)} {directory} && umask 027 && /usr/bin/python3 -s -E -S -c {q(make)} > {tmp} && "
        f"chown root:{q(group)} {tmp} && chmod 0640 {tmp} && mv {tmp} {q(path)}")


def bearer(path: str, prefix: str = "") -> str:
    """curl arguments (for bash) that send the key in ``path`` (after ``prefix``) as a bearer
    token, read on the host: the key is never in an argv."""
    read = f"sed -n {shlex.quote(f's/^{prefix}//p')} {shlex.quote(path)}" if prefix else f"cat {shlex.quote(path)}"
    return f"-H @<(printf 'Authorization: Bearer %s' \"$({read})\")"


@reading(FileStates, "paths")
@operation()
def secret_file(dest: str, content: str, paths: list[str], group: str = "root", mode: str | None = None):
    """``dest`` holds ``content`` (root:``group``; 0600, 0640 with a group, or ``mode``), sent on
    the command's stdin: never through a temporary file (pyinfra's upload with sudo goes through a
    world-readable one), an argv, ``--diff`` or a log. ``paths``: the role's paths, read together
    (rigup.files.FileStates)."""
    mode = mode or ("600" if group == "root" else "640")
    state = read_once(FileStates, paths=paths)[dest]
    if (state and state["kind"] == "f" and state["sha256"] == hashlib.sha256(content.encode()).hexdigest()
            and (state["user"], state["group"], state["mode"]) == ("root", group, mode)):
        host.noop(f"{dest} is as it should be")
        return
    yield written(dest, content, mode, group)


def written(dest: str, content: str, mode: str = "600", group: str = "root") -> StringCommand:
    """A command that writes ``content``, sent on its stdin, to ``dest`` (root:``group``, ``mode``)."""
    q = shlex.quote
    tmp = q(dest + ".new")
    # pyinfra ends stdin with a newline when the content has none: take exactly the content's bytes
    take = "cat" if content.endswith("\n") else f"head -c {len(content.encode())}"
    return StringCommand(f"umask 077 && {take} > {tmp} && chown root:{q(group)} {tmp} && chmod {q(mode)} {tmp} && "
                         f"mv {tmp} {q(dest)}", _stdin=content)
