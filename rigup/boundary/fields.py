"""Names, ids and paths from outside through one validator (issue 61): a model's or instance's key
(it becomes a unit, a file and a directory name), a build's or record's id, a host address, and a
path a listing names (a hub's file list, an artifact's member) that must stay inside its directory.

Each pattern is strict by construction (letters, digits and a few separators; no shell, unit or
URL character), so what passes can be written into a unit, an argv or a file name as it is.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any

from rigup.boundary.core import Crossing, Unreadable

# systemd's unit types: a unit name ending in one is that type, whatever rigup adds before it
# (systemd-run --unit=rigup-fetch-m.timer makes a timer, rigup-llama@m.socket a socket: round 4 of
# issue 61, C40; drain.py's lease, cd885b3)
UNIT_TYPES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path", "timer", "slice",
              "scope")
# A name that becomes a unit, file or directory name (a model's key, an instance's name, a user):
# never one ending in a unit type's suffix
NAME = re.compile(r"(?!.*\.(?:%s)$)[A-Za-z0-9][A-Za-z0-9_.-]{0,63}" % "|".join(UNIT_TYPES))
# An address to bind or reach: IPv4, IPv6 or a DNS name, nothing a shell or URL would read more into.
ADDRESS = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|[0-9A-Fa-f:.]{2,45}")
# An id a record or a build carries (a build key, a card's UUID, a revision): no separator but - _ . :
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# A GPU's UUID as the driver prints it (GPU-46c2b1a0-7f3e-..., a MIG device's MIG-...): hex and dashes;
# it becomes an argv word (nvidia-smi -i) and a record's key
GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f]{1,32}(?:-[0-9A-Fa-f]{1,32}){0,7}")
# A pyinfra connector's host name (@local, @docker/IMAGE, @ssh/HOST): the connector, then its argument
CONNECTOR = re.compile(r"@[a-z][a-z0-9_]{0,31}(?:/[A-Za-z0-9_./+@:-]{1,200})?")
# A PCI address, domain:bus:device.function (nvidia-smi's 00000000:4E:00.0, sysfs's 0000:4e:00.0)
PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
# A path's characters that unit files and shells take as they are.
PATH_CHARS = re.compile(r"[A-Za-z0-9_./+@:-]+")
# C0, DEL and C1 (\x80-\x9f: \x9b is CSI, \x9d OSC to a terminal that reads 8-bit controls); the
# bidi controls (U+202A-202E embeddings and overrides, U+2066-2069 isolates, U+200E/200F marks,
# U+061C), which make 'systemctl cat' and the plan's diff show text reordered (Trojan Source), and
# the line and paragraph separators U+2028/2029, which editors and terminals break a line at
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u2028\u2029]")


def matched(pattern: re.Pattern, value: object, where: str, what: str) -> str:
    """``value`` when it is a string ``pattern`` matches whole, else :class:`Unreadable` naming
    ``where`` and ``what`` it should be."""
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    raise Unreadable(where, f"not {what}: {str(value)[:60]!r}")


def name(value: object, where: str) -> str:
    """A name (:data:`NAME`), or :class:`Unreadable`."""
    return matched(NAME, value, where, "a name (letters, digits, _ . -; at most 64; no unit suffix such as .timer)")


def ident(value: object, where: str) -> str:
    """An id (:data:`ID`), or :class:`Unreadable`."""
    return matched(ID, value, where, "an id (letters, digits, _ . : -; at most 128)")


def sha256(value: object, where: str) -> str:
    """A sha256 in 64 lowercase hex digits, or :class:`Unreadable`."""
    return matched(SHA256, value, where, "a sha256 (64 lowercase hex digits)")


# Linux's limits on a file name (NAME_MAX) and a path (PATH_MAX), in bytes: a longer listed name is
# one the host cannot create (ENAMETOOLONG), so the fetch would fail after the plan took it
NAME_MAX, PATH_MAX = 255, 4096


def gpu_uuid(value: object, where: str) -> str:
    """A GPU's UUID (:data:`GPU_UUID`), or :class:`Unreadable`."""
    return matched(GPU_UUID, value, where, "a GPU UUID (GPU- or MIG- and hex digits, dashes)")


def pci_bus_id(value: object, where: str) -> str:
    """A PCI address (:data:`PCI_BUS_ID`), or :class:`Unreadable`."""
    return matched(PCI_BUS_ID, value, where, "a PCI bus id (domain:bus:device.function in hex)")


def host_name(value: object, where: str) -> str:
    """An inventory host's name, which pyinfra prints before every line of the host (``[name]``) and
    rigup's controller files are named by: :func:`host_file`'s name or address, or a pyinfra connector's
    (:data:`CONNECTOR`: ``@local``, ``@docker/debian:12``); else :class:`Unreadable` naming ``where``
    (round 5 G8: a host ``../../etc`` with an OSC sequence was read as any other)."""
    if isinstance(value, str) and CONNECTOR.fullmatch(value):
        return value
    return host_file(value, where)


def host_file(value: object, where: str) -> str:
    """An inventory host's name where it names a file of the controller's own (the burn-in copy
    ``burnin/HOST.json``, tune.py's ``host_vars/HOST.yml``, bench's ``HOST.json``): a name
    (:data:`NAME`) or an address (:data:`ADDRESS`), never a path (``../../x``, ``a/b``, ``..``,
    ``@local``); or :class:`Unreadable` naming the host (``where``)."""
    if isinstance(value, str) and len(value) <= 200 and not value.startswith(".") and \
            (NAME.fullmatch(value) or ADDRESS.fullmatch(value)):
        return value
    raise Unreadable(where, f"not a host's name or address (letters, digits, . - _ :; at most 200), which names "
                            f"its file on the controller: {str(value)[:60]!r}")


def inside(value: object, where: str, limit: int = PATH_MAX) -> str:
    """A relative path from a listing, normalised, that stays inside its directory: no absolute
    path, no ``..`` part, no empty or ``.`` part, no control character, valid UTF-8 of at most
    ``limit`` bytes, each part at most :data:`NAME_MAX` bytes; or :class:`Unreadable`."""
    if not isinstance(value, str) or not value or CONTROL.search(value) or "\\" in value:
        raise Unreadable(where, f"not a relative path: {str(value)[:60]!r}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate (JSON's "\ud800"): no file name on the host
        raise Unreadable(where, f"not a relative path (not UTF-8): {value[:60]!r}") from None
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", ".", "..") for p in parts) or posixpath.normpath(value) != value:
        raise Unreadable(where, f"a path that leaves its directory or is not normal: {value[:60]!r}")
    longest = max(len(p.encode("utf-8")) for p in parts)
    if len(encoded) > limit or longest > NAME_MAX:
        raise Unreadable(where, f"a path the host cannot create ({len(encoded)} bytes, a part of {longest}; "
                                f"at most {limit}, a part at most {NAME_MAX}): {value[:60]!r}")
    return value


def one_host(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` names one host as itself: not a wildcard (0.0.0.0, ::), and no IPv6 form
    of an IPv4 address, mapped (``::ffff:0.0.0.0``, ``::ffff:127.0.0.1``) or compatible
    (``::127.0.0.1``, deprecated): every one is refused, not only the wildcard and loopback ones,
    since a socket bound to ``::ffff:0.0.0.0`` listens on every IPv4 address while
    ``is_unspecified`` says no, and an nft ``ip6 saddr`` set never sees an IPv4 peer in that form
    (the kernel files it under ``ip saddr``): the host is written as its IPv4 address instead."""
    if address.is_unspecified:
        return False
    if address.version == 6 and (address.ipv4_mapped or (int(address) >> 32 == 0 and int(address) > 1)):
        return False
    return True


def host_ip(value: str) -> bool:
    """Whether ``value`` is the IP address of one host, as an allow-list takes it (IPv4 or IPv6;
    not a host name, a network, a wildcard such as 0.0.0.0 or ::, an IPv6 form of an IPv4 address
    (:func:`one_host`) or an IPv6 zone: nft takes none)."""
    try:
        return "%" not in value and one_host(ipaddress.ip_address(value))
    except ValueError:
        return False


def control_at(value: Any, path: str = "") -> tuple[str, str] | None:
    """(where, character) of the first control character (a newline, a carriage return, NUL ...)
    in ``value``, a string or any string inside a list or map, keys too; ``where`` is the key
    path below ``value`` (".glm.extra_args[0]"), or None when there is none."""
    if isinstance(value, str):
        found = CONTROL.search(value)
        return (path, found.group()) if found else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        below = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}"
        found = (control_at(key, below) if isinstance(key, str) else None) or control_at(item, below)
        if found:
            return found
    return None


CROSSINGS = (
    Crossing("a name from configuration (a model's or instance's key, a user)", "the operator",
             "rigup/boundary/fields.py:name", "rigup/config.py:Form"),
    Crossing("a JSON value of a vLLM option in an instance's extra_args (--structured-outputs-config ...)",
             "the operator", "rigup/boundary/core.py:keys_as_read", "rigup/instances/vllm.py:json_keys"),
    Crossing("a JSON value in a serving instance's extra_args or env, read for credentials piece by piece "
             "(llama-server's --json-schema, vLLM's --hf-overrides)", "the operator", "rigup/boundary/core.py:loads",
             "rigup/models.py:_json_pieces"),
    Crossing("an inventory address or a configured IP that becomes a bind or an allow-list entry", "the operator",
             "rigup/boundary/fields.py:host_ip",
             "rigup/config.py:Form, rigup/rpc.py:ip_problem, roles/vllm/checks.py:check_host_ip, "
             "roles/metrics/checks.py:check_allow_lists"),
    Crossing("a card's UUID nvidia-smi prints", "the host", "rigup/boundary/fields.py:gpu_uuid",
             "rigup/gpu/facts.py:parse_gpus"),
    Crossing("a card's PCI bus id nvidia-smi prints, a PCI device's sysfs name (a card's, an NVSwitch's)", "the host",
             "rigup/boundary/fields.py:pci_bus_id",
             "rigup/gpu/facts.py:parse_gpus, rigup/gpu/facts.py:parse_pci, rigup/gpu/fabric.py:parse_nvswitches"),
    Crossing("a path a listing names (a hub's files, an artifact's members)", "the hub, a peer",
             "rigup/boundary/fields.py:inside", "roles/model_fetch/hub.py:checked_files"),
    Crossing("an inventory host's name, read with its file (roll.py, shards.py)", "the operator",
             "rigup/boundary/fields.py:host_name", "plays/inventory.py:read"),
    Crossing("an inventory host's name that names a file on the controller (the burn-in copy, tune.py's "
             "host_vars, bench's reports, the llama.cpp hand-over's part files)", "the operator",
             "rigup/boundary/fields.py:host_file",
             "rigup/names.py:burnin_copy, plays/tuning.py:write_host_vars, plays/bench.py:write_reports, "
             "roles/llama_cpp/handover.py:_pack, roles/llama_cpp/handover.py:_fetched"),
)

GENERIC = ("matched", "ident", "sha256", "control_at", "one_host")   # the patterns' checks, used by the readers
