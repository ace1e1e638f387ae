"""One writer per foreign format rigup writes text into (issue 61): a value that would become
structure in the other program's grammar (a second rule, line, section or setting) is refused with a
ValueError naming what it is, or quoted where the format has quoting. A value that needs neither is
written as it always was, so the files rendered from valid configuration keep their bytes.

- llama.cpp's preset INI (common/preset.cpp's grammar): no quoting; ``;`` or ``#`` anywhere in a
  value starts a comment, a line ends at CR or LF, blanks around a value are dropped: refused;
- nftables: names of our tables, the addresses of an allow-list, and comments (one line each);
- systemd units: an argument of ExecStart= (double-quoted with C escapes when it needs it, ``%`` and
  ``$`` doubled), a ``NAME=value`` word of Environment=, a line of an EnvironmentFile, a comment; a
  control character is refused (a newline ends the setting: the rest would be a new one);
- YAML (host_vars): PyYAML's safe dump, read back and compared;
- the Prometheus text exposition: a label value with ``\\``, ``"`` and newline escaped (the host
  programs that write it carry their own copy of :func:`prom_label`: they ship alone, with the
  standard library only; tests/unit/test_boundary_formats.py holds each copy to this one);
- HAProxy's configuration: a word (a name, an address) of the characters HAProxy reads as they are.

Standard library only (PyYAML is imported by :func:`yaml_text` alone, on the controller).
"""

from __future__ import annotations

import ipaddress
import json
import re

from rigup.boundary.core import Crossing
from rigup.boundary.fields import CONTROL, one_host
from rigup.boundary.numbers import json_whole

# llama.cpp's preset grammar: ident ::= [a-zA-Z_] [a-zA-Z0-9_.-]*; a value ends at ws? [;#] or a newline
INI_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
INI_BREAKS = re.compile(r"[;#\[\]]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NFT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
# the characters of an IPv4 or IPv6 address (ipaddress also takes an IPv6 zone, "%" and any text after it)
NFT_ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")
# a name HAProxy reads as one plain word: no blank, quote, backslash, '#' (a comment), '$' (a variable), braces
# (an ACL); no '@' or '/', which make a word an address of another kind (unix@/run/x.sock, fd@3, /run/x.sock)
HAPROXY_WORD = re.compile(r"[A-Za-z0-9_.:+\[\]-]+")
# the host of an address that is no IP address: a DNS host name (RFC 1123), labels of letters, digits and '-'
# (none at a label's ends), 1-63 each, at most 253 in all, its last label not all digits (a resolver reads
# "0", "127.1" or "10.1" as an IPv4 address in inet_aton's short forms: issue 61). So no '@' (HAProxy's unix@,
# abns@, fd@, sockpair@, ipv4@ ... prefixes name another kind of socket), no '/' (a unix socket's path) and
# no ':' (only an IPv6 address has one: "fd:3" or "a:b" is none, which HAProxy refuses only at its reload)
DNS_NAME = re.compile(r"(?=.{1,253}\Z)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                      r"(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _refused(what: str, why: str, value: object) -> ValueError:
    return ValueError(f"{what}: {why}: {str(value)[:80]!r}")


def one_line(value: object, what: str) -> str:
    """``value`` as text when it holds no control character (a newline, a carriage return, NUL, a
    tab ...), else a ValueError naming ``what``: the line of any format stays one line."""
    text = str(value)
    found = CONTROL.search(text)
    if found:
        raise _refused(what, f"holds a newline or another control character ({found.group()!r}): refused", text)
    return text


# llama.cpp's preset INI


def ini_line(key: str, value: object, what: str) -> str:
    """``key = value`` in a llama.cpp preset, read back as exactly ``key`` and ``value``: a key of the
    grammar's ident, a value without ``;`` or ``#`` (a comment to the line's end, even mid-word),
    brackets, a control character or blanks at its ends (the parser drops them); else a ValueError."""
    if not (isinstance(key, str) and INI_KEY.fullmatch(key)):
        raise _refused(what, "not a preset key (a letter or _, then letters, digits, _ . -)", key)
    text = one_line(value, what)
    if INI_BREAKS.search(text):
        raise _refused(what, "';', '#' or a bracket has meaning in llama.cpp's preset", text)
    if text != text.strip(" \t"):
        raise _refused(what, "blanks at either end are dropped by llama.cpp's preset", text)
    return f"{key} = {text}"


def ini_section(name: str, what: str) -> str:
    """``[name]``, a model's section of a llama.cpp preset: printable, no bracket, no comment character,
    no blank at its ends (a no-break space either), not ``*`` (the global section, written by its caller as
    it is: round 32 P32a); else a ValueError."""
    text = one_line(name, what)
    if not text or INI_BREAKS.search(text) or text != text.strip() or text == "*":
        raise _refused(what, "not a preset section name", text)
    return f"[{text}]"


def ini_comment(text: str, what: str) -> str:
    """``; text``: a comment line of a llama.cpp preset (one line, or a ValueError)."""
    return f"; {one_line(text, what)}"


# nftables


def nft_name(name: str, what: str) -> str:
    """A table's name as nft reads it (a letter, then letters, digits and _; at most 32), else a ValueError."""
    if not (isinstance(name, str) and NFT_NAME.fullmatch(name)):
        raise _refused(what, "not an nftables name (a letter, then letters, digits, _)", name)
    return str(name)


def nft_address(value: object, what: str) -> str:
    """One host's IP address as an element of an nftables set (``ip saddr { ... }``): IPv4 or IPv6
    of those characters alone, written as :mod:`ipaddress` writes it; a zone (``fe80::1%eth0``: nft
    takes none, and ipaddress keeps any text after ``%``, a newline and a rule too), a network, a
    host name, the unspecified address or an IPv6 form of an IPv4 address
    (:func:`rigup.boundary.fields.one_host`) is a ValueError naming ``what``."""
    text = str(value)
    try:
        address = ipaddress.ip_address(text) if NFT_ADDRESS.fullmatch(text) else None
    except ValueError:
        address = None
    if address is None or not one_host(address):
        raise _refused(what, "not the IP address of one host (no zone, network, name, wildcard or IPv6 form of "
                             "an IPv4 address: write ::ffff:a.b.c.d as a.b.c.d)", text)
    return str(address)


def nft_comment(text: str, what: str) -> str:
    """``# text``: a comment line of an nftables file (one line: a newline would begin a rule)."""
    return f"# {one_line(text, what)}"


# systemd


def _systemd_word(text: str, what: str) -> str:
    """``text`` (its specifiers already escaped) as one word of a unit setting: bare when systemd
    reads it so, else double-quoted with C escapes for the quote and the backslash; a control
    character is refused (a newline ends the setting)."""
    one_line(text, what)
    if text and not re.search(r"[\s\"'\\;]", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_quote(arg: object) -> str:
    """One argument as systemd's ExecStart= reads it (and as a POSIX shell would split it): ``%``
    and ``$`` doubled (specifiers and variables are expanded there); a control character refused."""
    return _systemd_word(str(arg).replace("%", "%%").replace("$", "$$"), "an argument of a unit's command")


def systemd_env(name: str, value: object) -> str:
    """One ``NAME=value`` word of an Environment= line: ``%`` doubled (specifiers are expanded
    there) and ``$`` as it is: systemd.exec, Environment=: "$ has no special meaning" (issue 47:
    ``$$`` written there reached the server as ``$$``). A name that is no variable's, or a control
    character, is refused."""
    if not (isinstance(name, str) and ENV_NAME.fullmatch(name)):
        raise _refused("Environment=", "not a variable name", name)
    return _systemd_word(f"{name}={value}".replace("%", "%%"), f"Environment= {name}")


def env_file_line(name: str, value: object) -> str:
    """``NAME="value"``, a line of an EnvironmentFile (systemd's syntax: double quotes, backslash
    escapes, no expansion); a name that is no variable's, or a control character, is refused."""
    if not (isinstance(name, str) and ENV_NAME.fullmatch(name)):
        raise _refused("EnvironmentFile", "not a variable name", name)
    text = one_line(value, f"EnvironmentFile {name}")
    return f'{name}="' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_comment(text: object, what: str) -> str:
    """``text`` for a comment of a unit file (a revision, a build, a sha): one line, or a ValueError."""
    return one_line(text, what)


# YAML


def yaml_text(doc: object, what: str) -> str:
    """``doc`` as PyYAML's safe dumper writes it (block style, keys in order), read back by the safe
    loader and compared: what does not come back as it went (a lone surrogate, a type YAML has no
    tag for) is a ValueError naming ``what``."""
    import yaml   # here: the host programs import this package with the standard library alone

    try:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
        back = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _refused(what, f"not writable as YAML ({e.__class__.__name__})", doc) from None
    if back != doc and _json(back) != _json(doc):   # NaN is never equal to itself; a tuple comes back a list
        raise _refused(what, "YAML does not read back what was written", doc)
    return text


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


# the Prometheus text exposition


def prom_label(value: object) -> str:
    """A label value in the text format: backslash, double quote and newline escaped (the format's
    three escapes; nothing else has meaning between the quotes)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# HAProxy


def haproxy_word(value: object, what: str) -> str:
    """A name (a backend, a server, a model of a router's set) as one plain word of haproxy.cfg
    (letters, digits, ``_ . : + - [ ]``): a blank, a quote, a backslash, ``#``, ``$`` or a brace has
    meaning there, and ``@`` or ``/`` make a word an address of another kind: a ValueError."""
    text = str(value)
    if not HAPROXY_WORD.fullmatch(text):
        raise _refused(what, "not one plain word of HAProxy's configuration", text)
    return text


def haproxy_address(host: object, port: object, what: str) -> str:
    """``host``:``port`` as haproxy.cfg's address of a bind or a server (``ipv6@[host]:port`` for an
    IPv6 address, the one prefix this writer adds itself): ``host`` an IP address or a DNS name
    (``unix@/run/docker.sock``, ``fd@3`` or a path would be another kind of socket), ``port`` an int
    1..65535; a ValueError otherwise. An IP address is Python's ipaddress's (four decimal octets
    without leading zeros, or IPv6; no zone), a name :data:`DNS_NAME`'s."""
    text = str(host)
    try:
        ip = ipaddress.ip_address(text) if "%" not in text else None
    except ValueError:
        ip = None
    if ip is None and not DNS_NAME.fullmatch(text):
        raise _refused(what, "not an IP address or a host name (no HAProxy address prefix, no path)", text)
    if not json_whole(port, 65535):
        raise _refused(what, "not a TCP port (an int 1..65535)", str(port))
    return f"ipv6@[{text}]:{port}" if ip is not None and ip.version == 6 else f"{text}:{port}"


CROSSINGS = (
    Crossing("a line of a router's llama.cpp preset (a model's path, a flag's value)", "rigup",
             "rigup/boundary/formats.py:ini_line", "roles/llama_server/command.py:preset_text"),
    Crossing("a section of a router's llama.cpp preset (a model's key)", "rigup",
             "rigup/boundary/formats.py:ini_section", "roles/llama_server/command.py:preset_text"),
    Crossing("a comment of a router's llama.cpp preset (the instance, a revision)", "rigup",
             "rigup/boundary/formats.py:ini_comment", "roles/llama_server/command.py:preset_text"),
    Crossing("an nftables table's name", "rigup", "rigup/boundary/formats.py:nft_name", "rigup/firewall.py:text"),
    Crossing("an address of an nftables allow-list (a monitoring host's ssh_hostname, metrics_allow, a head's "
             "inventory address)", "the operator", "rigup/boundary/formats.py:nft_address", "rigup/firewall.py:text"),
    Crossing("a comment of an nftables file (its owner, who it admits)", "rigup",
             "rigup/boundary/formats.py:nft_comment", "rigup/firewall.py:text"),
    Crossing("an argument of a unit's ExecStart= (a model's path, extra_args)", "rigup",
             "rigup/boundary/formats.py:systemd_quote",
             "roles/llama_server/command.py:dropin_text, roles/vllm/command.py:dropin_text, "
             "roles/vllm/cluster.py:unit_text, roles/rpc_worker/command.py:unit_text, rigup/firewall.py:dropin_text"),
    Crossing("a word of a unit's Environment= (CUDA_VISIBLE_DEVICES, a node's environment)", "rigup",
             "rigup/boundary/formats.py:systemd_env",
             "roles/llama_server/command.py:dropin_text, roles/vllm/cluster.py:unit_text, "
             "roles/rpc_worker/command.py:unit_text"),
    Crossing("a line of a vLLM instance's EnvironmentFile", "rigup", "rigup/boundary/formats.py:env_file_line",
             "roles/vllm/command.py:env_text"),
    Crossing("a comment of a unit file (a model's revision, a build)", "rigup",
             "rigup/boundary/formats.py:unit_comment",
             "roles/llama_server/command.py:dropin_text, roles/vllm/command.py:dropin_text, "
             "roles/rpc_worker/command.py:unit_text"),
    Crossing("host_vars written by tune.py (llama_server_tuned)", "rigup", "rigup/boundary/formats.py:yaml_text",
             "plays/tuning.py:write_host_vars"),
    Crossing("a label value of the Prometheus exposition (a model, a card's bus id, a unit); each host "
             "program carries its own copy, held equal to this one by tests", "rigup's host programs",
             "rigup/boundary/formats.py:prom_label",
             "roles/gpu_guard/shipped/guard.py:escaped, roles/metrics/shipped/relay.py:label, roles/model_fetch/shipped/fetcher.py:label, "
             "roles/burnin/shipped/acceptance.py:label, roles/watchdog/shipped/watchdog.py:label"),
    Crossing("a name or an address in haproxy.cfg (a backend, a server, a model of a router's set)", "rigup",
             "rigup/boundary/formats.py:haproxy_word", "roles/balancer/config.py:haproxy_cfg"),
    Crossing("an address in haproxy.cfg (a backend's bind, a server's inventory address and port)", "the operator",
             "rigup/boundary/formats.py:haproxy_address", "roles/balancer/config.py:haproxy_cfg"),
)

GENERIC = ("one_line",)   # the one-line check every writer above makes
