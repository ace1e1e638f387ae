"""API keys made on the host: a random key is written there by a root shell, never passing
through pyinfra, an argv, a unit or a log; the health gate reads it there."""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand


def new_key(path: str, group: str, prefix: str = "") -> StringCommand:
    """Shell that writes ``prefix`` + a random 256-bit hex key to ``path`` (root:``group`` 0640,
    no trailing newline), creating its directory root:``group`` 0750."""
    q = shlex.quote
    tmp, directory = q(path + ".new"), q(path.rsplit("/", 1)[0])
    make = f"import secrets; print({prefix!r} + secrets.token_hex(32), end='')"
    return StringCommand(
        f"install -d -m 0750 -g {q(group)} {directory} && umask 027 && python3 -c {q(make)} > {tmp} && "
        f"chown root:{q(group)} {tmp} && chmod 0640 {tmp} && mv {tmp} {q(path)}")


def bearer(path: str, prefix: str = "") -> str:
    """curl arguments (for bash) that send the key in ``path`` (after ``prefix``) as a bearer
    token, read on the host: the key is never in an argv."""
    read = f"sed -n {shlex.quote(f's/^{prefix}//p')} {shlex.quote(path)}" if prefix else f"cat {shlex.quote(path)}"
    return f"-H @<(printf 'Authorization: Bearer %s' \"$({read})\")"
