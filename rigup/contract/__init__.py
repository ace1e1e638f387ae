"""One contract per serving engine: every instance key, in one table per engine, and what is made
from it (the entry form, the command line, the flags extra_args may not give again, what the tuner
sweeps, the docs). Standard library only: tests/gpu loads them with a plain python3. No host runs
them: the tuner gets the swept flags' spellings in its spec (plays/tuning.py ``spec``).

- here: the keys every serving entry has (:data:`SERVING`) and each engine's map and key file
  (:data:`MAPS`); the instances themselves, normalised, are rigup/instances/'s (``every``: both
  engines', for the balancer, plays/bench.py and status.py)
- ``llama_server``: llama.cpp's llama-server (roles/llama_server): its rows, and its instances' key files
  (:func:`~rigup.contract.llama_server.key_file`); the instances themselves, normalised and
  tuned, are rigup/instances/'s
- ``vllm``: vLLM's ``vllm serve`` (roles/vllm): its rows
"""

from __future__ import annotations

from dataclasses import dataclass

REQUIRED = object()   # a key without a default (rigup.entries.Key's too)
OWNED, ALSO = "owned", "also"
VALUE, SWITCH, PAIR, OWN = "value", "switch", "pair", "own"   # OWN: the engine's command writes it itself


@dataclass(frozen=True)
class Flag:
    """An instance key that becomes a flag of the engine: its form, default, spellings (the first is
    written), doc, policy (OWNED: extra_args may not give it again; ALSO: it may, the last one wins),
    how it is written (VALUE: ``FLAG VALUE``, none when null; SWITCH: the flag when true; PAIR: the
    first spelling when true, the second when false), whether tune.py sweeps it, and since when the
    engine has it (for the reader)."""

    key: str
    form: str
    default: object
    spellings: tuple[str, ...]
    doc: str
    policy: str = OWNED
    write: str = VALUE
    sweep: bool = False
    since: str = "2023"


@dataclass(frozen=True)
class Row:
    """An instance key that is not a flag of its own: its form (rigup/config.py's form language),
    default (REQUIRED: none) and doc."""

    key: str
    form: str
    default: object = REQUIRED
    doc: str = ""


SERVING: tuple[Row, ...] = (
    Row("model", "str", doc="a key of models"),
    Row("port", "int 1..65535", doc="the port it listens on (--port)"),
    Row("host", "address", "127.0.0.1", "the address it binds (--host); beyond loopback it needs an API key"),
    Row("api_key", "bool", False, "check a random key made on the host (read by the health gate there)"),
    Row("extra_args", "list of str", [], "more arguments of the server, one per item; never a flag rigup sets "
                                         "from the other keys (--host, --port, the model, the API key, the name)"),
)

# each serving map -> the key file of its instance NAME on a host (.format(NAME))
MAPS = {"llama_server_instances": "/etc/rigup/llama-server/{}.key", "vllm_instances": "/etc/rigup/vllm/{}.key"}


def flag_args(rows, inst: dict) -> list:
    """The flags of ``rows`` for an instance (its values as they are, in the rows' order; rows
    written OWN are the command's own to write)."""
    out: list = []
    for f in rows:
        value = inst.get(f.key)
        if f.write == OWN:
            continue
        if f.write == PAIR:
            out.append(f.spellings[0] if value else f.spellings[1])
        elif f.write == SWITCH:
            out += [f.spellings[0]] if value else []
        elif value is not None and value != "":   # null: the engine's default, no flag
            out += [f.spellings[0], value]
    return out


def owned_by(rows, fixed: dict) -> dict:
    """Every spelling extra_args may not give -> its key: ``fixed`` (the flags the command writes
    from the instance itself) and those of ``rows`` of policy OWNED."""
    return {**fixed, **{s: f.key for f in rows if f.policy == OWNED for s in f.spellings}}


def doc_line(f: Flag) -> str:
    """A row's doc as the entry form gives it: the flag first, and whether extra_args may give it."""
    flags = "/".join(f.spellings) if f.write == PAIR else f.spellings[0]
    also = "; extra_args may give it again (the last one wins)" if f.policy == ALSO else ""
    return f"{flags}: {f.doc}{also}"
