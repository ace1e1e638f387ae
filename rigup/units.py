"""systemd units of the serving roles (llama_server, vllm): the words rigup/boundary/formats.py quotes
for unit files read back, and one round trip for the state of their instances (per instance the
sha256 of its files, its unit's state and its model's completion marker)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import re
import shlex

from rigup.boundary import results
from rigup.boundary.core import Unreadable
from rigup.nofollow import read_file

if TYPE_CHECKING:
    from rigup.models import ServingInstance

REPLICA_HOST = "127.0.0.1"   # replicas answer only the balancer on the same host


def replica_name(name: str, k: int) -> str:
    """The systemd instance name of replica ``k`` of ``name``."""
    return f"{name}-{k}"


def replica_port(inst: ServingInstance, k: int) -> int:
    """The loopback port of replica ``k``: the instance's port + 1 + k."""
    return int(inst["port"]) + 1 + k


def replica_inst(inst: ServingInstance, k: int) -> dict:
    """The instance as replica ``k`` runs it: on loopback, on its own port."""
    return {**inst, "host": REPLICA_HOST, "port": replica_port(inst, k)}


def visible_devices(group: list[dict]) -> str:
    """CUDA_VISIBLE_DEVICES for a group of plan cards: their UUIDs (stable across reboots and
    driver index changes), else their indexes."""
    return ",".join(str(c.get("uuid") or c["index"]) for c in group)


def main_first(group: list[dict]) -> list[dict]:
    """The group with its downtrained cards (plan card ``link``) last, else in its order: the
    first visible device is llama.cpp's main GPU (-mg 0), which every split moves data through."""
    return sorted(group, key=lambda c: bool((c.get("link") or {}).get("downtrained")))


def downtrained(group: list[dict]) -> list[dict]:
    return [c for c in group if (c.get("link") or {}).get("downtrained")]


NARROW = (4, 3)   # at or below x4 and Gen3: the reports' CMP 170HX (Gen2 x4), a riser, a mining board


def narrow(group: list[dict]) -> list[dict]:
    """The cards of ``group`` whose negotiated link (``x4 Gen2``) is at or below :data:`NARROW`."""
    out = []
    for c in group:
        m = re.fullmatch(r"x([0-9]+) Gen([0-9]+)", (c.get("link") or {}).get("link", ""))
        if m and int(m[1]) <= NARROW[0] and int(m[2]) <= NARROW[1]:
            out.append(c)
    return out


def had_replicas(template: str, name: str, units: list[str]) -> bool:
    """Whether ``units`` (preflight's ``serving_units``) hold replicas ``TEMPLATE@NAME-K``: a
    single server of ``name`` then takes its port back from rigup's balancer."""
    return any(re.fullmatch(re.escape(f"{template}@{name}-") + r"[0-9]+", u) for u in units)


def configured(template: str, backend_prefix: str, backends_dir: str) -> str:
    """Shell that prints ``units=`` (the instances of ``template`` rigup configured: their drop-in
    directories) and ``backends=`` (the balancer's backends files ``PREFIX-*.json`` in
    ``backends_dir``)."""
    return (keyed("units", f"cd /etc/systemd/system && ls -d {template}@*.service.d 2>/dev/null "
                  f"| sed 's/^{template}@//; s/[.]service[.]d$//' | paste -s -d ' ' -") + "; "
            + keyed("backends", f"cd {shlex.quote(backends_dir)} 2>/dev/null && ls {backend_prefix}-*.json 2>/dev/null "
                    "| sed 's/[.]json$//' | paste -s -d ' ' -"))


def keyed(key: str, command: str) -> str:
    """Shell that prints ``key=`` and ``command``'s output as one line: printf, never echo, for a
    fact's output (issue 61, round 13 UN1, FP1, ST5). pyinfra runs commands with ``sh -c``, dash
    on Debian and Ubuntu, whose echo turns a ``\\n`` in a file's text into a line of root's output
    (a forged ``key=`` or ``@@`` section); quoted, the text is neither split nor globbed."""
    return f"printf '%s\\n' {shlex.quote(key + '=')}\"$({command})\""


def unit_state(path: str, unit: str) -> list[str]:
    """Shell lines that print a unit's state as ``key=value`` lines: ``unit`` (its file's sha256,
    empty when absent), ``active`` and ``enabled`` (systemctl's words)."""
    return [keyed("unit", f"sha256sum {shlex.quote(path)} 2>/dev/null | cut -c1-64"),
            keyed("active", f"systemctl is-active {shlex.quote(unit)} 2>/dev/null"),
            keyed("enabled", f"systemctl is-enabled {shlex.quote(unit)} 2>/dev/null")]


def systemd_split(line: str) -> list[str]:
    """An ExecStart= line written by systemd_quote (rigup/boundary/formats.py) back into its
    arguments: the shell's split, then systemd's ``%%`` and ``$$`` read as ``%`` and ``$`` (issue
    47: tune.py's sweep ran an argument with a ``%`` or ``$`` doubled). ValueError for a lone ``%`` or
    ``$``, which systemd_quote never writes: systemd expands it (``%h``: the user's home, ``$X``: a
    variable), so the server runs other words than those read here (issue 61, round 7b U8)."""
    return [_UNESCAPED.sub(_unescaped, a) for a in shlex.split(line)]


_UNESCAPED = re.compile(r"%%|\$\$|[%$]")
_SPECIFIER = re.compile(r"%%|%")   # Environment=: "$ has no special meaning" (systemd_env)


def _unescaped(m: re.Match) -> str:
    if len(m[0]) == 1:
        raise ValueError(f"a lone {m[0]!r}: a specifier or variable systemd expands, which rigup does not write")
    return m[0][0]


def systemd_env_split(line: str) -> dict[str, str]:
    """An Environment= line written by systemd_env (rigup/boundary/formats.py) back into its
    variables; ValueError for a lone ``%``, a specifier systemd expands there too (``%h``), which
    systemd_env never writes."""
    return {name: _SPECIFIER.sub(_unescaped, value) for name, eq, value in
            (word.partition("=") for word in shlex.split(line)) if eq}


def instance_probe(name: str, unit: str, files: dict[str, str], marker: str, key: str | None = None,
                   also: dict[str, str] | None = None) -> str:
    """Shell that prints ``@@ name`` then ``key=value`` lines: ``<key>=<sha256>`` for each of
    ``files``, ``active``, ``enabled``, ``marker`` (the marker's JSON on one line), ``marker.M`` for
    each of ``also`` (model key M -> its marker: a router's other models), and ``key=<sha256>``
    of the API key file ``key`` when it is there and not empty (never its content). The marker, in a
    directory the rigup user writes, is read as that directory's owner, never through a link or
    from a FIFO (rigup.nofollow: the fact's command defines :data:`rigup.nofollow.FUNCTIONS`
    first)."""
    q = shlex.quote
    lines = [f"echo {q('@@ ' + name)}"]
    lines += [keyed(k, f"sha256sum {q(path)} 2>/dev/null | cut -c1-64") for k, path in files.items()]
    lines += [keyed("key", f"test -s {q(key)} && sha256sum {q(key)} | cut -c1-64")] if key else []
    lines += [keyed("active", f"systemctl is-active {unit} 2>/dev/null"),
              keyed("enabled", f"systemctl is-enabled {unit} 2>/dev/null"),
              keyed("marker", f"{read_file(marker.rsplit('/', 1)[0], marker, 8 << 20)} | tr -d '\\n'")]
    lines += [keyed("marker." + m, f"{read_file(path.rsplit('/', 1)[0], path, 8 << 20)} | tr -d '\\n'")
              for m, path in sorted((also or {}).items())]
    return "; ".join(lines)


def parse_instances(lines: list[str]) -> tuple[dict, dict]:
    """(``key=value`` lines before the first section, {name: {key: value}}); an empty value is
    None, and ``marker`` is the marker as rigup.boundary.results ``marker`` reads it (None when
    absent, half-written, nested too deep, not an object or of a field not of its form: whoever
    writes the model's directory writes the marker, a list of a million ``[`` must not end the run
    for every host, ``files`` null or of numbers ended the serving role's operation with a
    TypeError, and a file name holding an escape sequence reached the operator's terminal in its
    error: issue 61, round 9 L1, L2); ``marker.M`` lines go to ``markers`` ({M: the same, or None})."""
    head: dict = {}
    instances: dict = {}
    current = head
    for line in lines:
        if line.startswith("@@ "):
            current = instances.setdefault(line[3:].strip(), {})
            continue
        key, _, value = line.partition("=")
        if key == "marker" or key.startswith("marker."):
            try:
                found = results.marker(value, key) if value else None
            except Unreadable:
                found = None
            if key == "marker":
                current[key] = found
            else:
                current.setdefault("markers", {})[key[len("marker."):]] = found
        else:
            current[key] = value or None
    return head, instances


def service_commands(path: str, unit: str, text: str, state: dict, running: str):
    """Inside an operation: the unit file ``path`` of the plain service ``unit`` with ``text``,
    enabled and running; written and restarted when its sha256 differs from ``state["unit"]``,
    started when ``state``'s active/enabled say it is not (``running``: the no-op's words)."""
    from pyinfra import host

    from rigup.secrets import written

    if state.get("unit") != hashlib.sha256(text.encode()).hexdigest():
        yield written(path, text, "644")
        yield "systemctl daemon-reload"
        yield f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart {unit}"
    elif (state.get("active"), state.get("enabled")) != ("active", "enabled"):
        yield f"systemctl enable {unit} && systemctl start {unit}"
    else:
        host.noop(running)
