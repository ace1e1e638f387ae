# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""A GGUF file's header, read from its first bytes: the metadata preflight needs for a model
whose family rigup/gpu/models.yml does not know (its layer count and its KV cache per token).
Pure, standard library only: tested on bytes (tests/unit/test_model_fetch_hub.py,
tests/unit/test_gguf_header.py); roles/model_fetch/hub.py fetches the bytes with an HTTP Range
request on the controller (and whether the model has a chat template, :func:`chat_template`: its key
comes after the tokenizer's arrays, which are skipped, never built), and plays/shipped/tune.py (on a host,
as rigup_gguf.py) reads the layer count of the model it serves.

The layout (llama.cpp ``ggml/src/gguf.cpp``, version 2 and 3): ``GGUF``, version u32, tensor
count u64, key/value count u64, then each key (u64 length, UTF-8) with its value type (u32) and
value; strings are a u64 length and bytes, arrays a type u32, a count u64 and the items.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

__all__ = ["GGUFRefused", "Incomplete", "Header", "header", "metadata", "kv_figures", "chat_template", "unsized",
           "split_problem"]

# value type -> struct format of a scalar (8: string, 9: array are read apart)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
GIB = 1 << 30
F16_BYTES = 2   # llama.cpp's default KV cache type
MAX_KEPT_ITEMS = 1 << 16   # an array kept longer than this is skipped, not built
MAX_DEPTH = 2              # arrays of arrays at most (llama.cpp writes none)
MAX_LAYERS = 1 << 16
MAX_CONTEXT = 1 << 24      # tokens a model was trained for, at most (the largest today: 10M)
MAX_WIDTH = 1 << 20        # heads, head and embedding lengths, at most (the largest today: 16k wide)
CHAT_TEMPLATE = "tokenizer.chat_template"   # llama-server's --jinja template, after the tokenizer's arrays


class GGUFRefused(Exception):
    """The bytes are not a GGUF header rigup reads (the only exception :func:`metadata` and
    :func:`kv_figures` raise: a hub's bytes are data, never a crash)."""


class Incomplete(GGUFRefused):
    """The bytes end before the keys wanted: fetch more of the file."""

    def __init__(self, needed: int, have: int = 0):
        super().__init__(f"the header needs {needed} bytes here, {have} were read")
        self.needed = needed


MAX_KEY = 65535   # the GGUF spec's bound on a key's length


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise Incomplete(self.pos + size, len(self.buf))
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, limit: int | None = None) -> str:
        n = self.take("<Q")
        if limit is not None and n > limit:
            raise GGUFRefused(f"a key of {n} bytes at byte {self.pos - 8} (GGUF keys have at most {limit})")
        if self.pos + n > len(self.buf):
            raise Incomplete(self.pos + n, len(self.buf))
        self.pos += n
        return self.buf[self.pos - n:self.pos].decode("utf-8", "replace")

    def skip_string(self) -> None:
        """Past a string, without decoding or copying it."""
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise Incomplete(self.pos + n, len(self.buf))
        self.pos += n

    def value(self, kind: int, keep: bool, depth: int = 0):
        """A value of type ``kind``, or None past it when not ``keep`` (a tokenizer's 262k strings
        are stepped over, never decoded nor listed); an array's items only when ``keep`` and at
        most MAX_KEPT_ITEMS. Counts are checked against the bytes left before any item is read,
        so an absurd count ends as Incomplete, never a loop past the bytes or a huge list."""
        if kind == _STRING:
            if not keep:
                return self.skip_string()
            return self.string()
        if kind == _ARRAY:
            if depth >= MAX_DEPTH:
                raise GGUFRefused(f"arrays nested deeper than {MAX_DEPTH}")
            item, count = self.take("<I"), self.take("<Q")
            if item != _STRING and item != _ARRAY and item not in _SCALAR:
                raise GGUFRefused(f"unknown GGUF array item type {item}")
            least = struct.calcsize(_SCALAR[item]) if item in _SCALAR else 8 if item == _STRING else 12
            if self.pos + least * count > len(self.buf):
                raise Incomplete(self.pos + least * count, len(self.buf))
            keep = keep and count <= MAX_KEPT_ITEMS
            if keep:
                return [self.value(item, keep, depth + 1) for _ in range(count)]
            if item in (_STRING, _ARRAY):   # each item its own length: stepped over one by one
                for _ in range(count):
                    self.value(item, False, depth + 1)
            else:
                self.pos += least * count
            return None
        if kind not in _SCALAR:
            raise GGUFRefused(f"unknown GGUF value type {kind}")
        return self.take(_SCALAR[kind])


class Header(NamedTuple):
    """What :func:`header` read: ``meta`` (the wanted keys' values), ``keys`` (every key read, wanted
    or not, -> its value's GGUF type and, for a string, its length in bytes, else None: how a key is
    found present, and of what, without keeping its value), ``complete`` (every key/value of
    the header was within the bytes: a key not in ``keys`` is not in the file) and ``needed`` (when
    not complete, the bytes the next item needs: fetch at least that many)."""

    meta: dict
    keys: dict
    complete: bool
    needed: int


def header(buf: bytes, wanted=lambda key: True) -> Header:
    """The GGUF header in ``buf`` read as far as its bytes go (:class:`Header`); GGUFRefused when
    ``buf`` is not a GGUF file rigup reads (a key given twice included). Bounded by ``buf``: each
    key/value read takes at least 12 of its bytes and nothing unwanted is built, so a header that
    claims 2^64 keys or items ends where the bytes end, as not ``complete``."""
    r = _Reader(buf)
    if buf[:4] != b"GGUF":
        if len(buf) < 4:
            return Header({}, {}, False, 4)
        raise GGUFRefused("not a GGUF file (no GGUF magic)")
    r.pos = 4
    out: dict = {}
    seen: dict = {}
    try:
        version = r.take("<I")
        if version not in (2, 3):
            raise GGUFRefused(f"GGUF version {version} (rigup reads 2 and 3)")
        r.take("<Q")
        for _ in range(r.take("<Q")):
            key = r.string(MAX_KEY)
            # llama.cpp's gguf.cpp refuses a file with a key given twice; the last one kept here
            # would size VRAM for a model llama.cpp will not load (block_count 80, then 1)
            if key in seen:
                raise GGUFRefused(f"key {key[:80]!r} given twice (llama.cpp refuses the file)")
            keep, kind = wanted(key), r.take("<I")
            seen[key] = (kind, None)
            start = r.pos
            value = r.value(kind, keep)
            if keep:
                out[key] = value
            seen[key] = (kind, r.pos - start - 8 if kind == _STRING else None)
    except Incomplete as e:
        return Header(out, seen, False, e.needed)
    return Header(out, seen, True, r.pos)


def metadata(buf: bytes, wanted=lambda key: True, partial: bool = False) -> dict:
    """The key/values of the GGUF header in ``buf`` for which ``wanted(key)`` holds; GGUFRefused
    when ``buf`` is not a GGUF file rigup reads (a key given twice included); :class:`Incomplete` when it ends before the last key, or
    with ``partial`` the keys read until then (llama.cpp's writers put the architecture's keys
    before the tokenizer's long arrays, so the first MiB holds them)."""
    got = header(buf, wanted)
    if not got.complete and not partial:
        raise Incomplete(got.needed, len(buf))
    return got.meta


def chat_template(got: Header) -> bool | None:
    """Whether the model has a chat template (``tokenizer.chat_template`` given as a string that is
    not empty): True, False (the whole header was read without one, or with one of another type or
    empty: llama-server answers chat through its fallback template, and a base model answers
    nonsense), or None (the bytes ended first: not known). The key's presence alone is no template
    (round 1 of issue 61, C02: a uint8 0 or "" counted as one)."""
    kind, length = got.keys.get(CHAT_TEMPLATE, (None, None))
    if kind is not None and (kind != _STRING or length is not None):   # read to its end
        return kind == _STRING and length > 0
    return False if got.complete else None


def unsized(got: Header, figures: dict, size: int, last: bool) -> str | None:
    """Why the model of a GGUF file of ``size`` bytes cannot be sized from its header read so far
    (``got``, its :func:`kv_figures` ``figures``), or None: the header needs bytes past the file's
    end (a string length of 2^63); or, when the whole header was read or ``last`` (no more bytes
    will be), no layer count: no ``general.architecture``, or none of its ``ARCH.block_count``
    (an architecture ``LLAMA`` whose keys are ``llama.``), which llama.cpp's loader requires. Its
    caller refuses the model, naming the file (round 1 of issue 61, C05 and C10: the plan said
    "KV cache not counted" for a file llama.cpp will not load)."""
    if not got.complete and got.needed > size:
        return f"the header needs {got.needed} bytes, past the file's {size}"
    if figures.get("layers") is None and (got.complete or last):
        arch = figures.get("architecture")
        missing = "no general.architecture" if arch is None else f"no {str(arch)[:80]}.block_count"
        read = "in the whole header" if got.complete else "in the bytes read (the header goes on past them)"
        return f"{missing} {read}: rigup cannot size the model (llama.cpp's loader needs its layer count)"
    return None


def _whole(key: str, value, hi: int) -> int:
    """A header's count or length: an int of the header's integer types, 0..``hi`` (never a bool,
    a float or text: ``True`` is 1 and ``-4`` heads would size a cache below nothing), else
    GGUFRefused naming the key (by hand: this file runs on hosts, without the boundary package)."""
    if type(value) is not int or not 0 <= value <= hi:
        raise GGUFRefused(f"{key} {str(value)[:40]} is not a whole number (0..{hi})")
    return value


def _per_layer(key: str, value, layers: int) -> list[int]:
    """A per-layer figure (an int, or an array of one per layer as hybrid models have: of exactly
    ``layers`` items, as llama.cpp's loader requires)."""
    if isinstance(value, list):
        if len(value) != layers:
            raise GGUFRefused(f"{key} has {len(value)} items for {layers} layers")
        return [_whole(key, v, MAX_WIDTH) for v in value]
    return [_whole(key, value, MAX_WIDTH)] * layers


def kv_figures(meta: dict) -> dict:
    """:func:`figures`, with GGUFRefused for any value of the wrong type or size."""
    try:
        return figures(meta)
    except GGUFRefused:
        raise
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
        raise GGUFRefused(f"a header value rigup cannot use: {type(e).__name__}: {str(e)[:200]}") from None


def figures(meta: dict) -> dict:
    """{"architecture", "layers", "kv_gib_per_1k_tokens", "context_length"} from a header's ``meta``
    (``context_length``: the tokens it was trained for, or None): the f16 K and V
    of every layer's KV heads (``head_count_kv`` x ``key_length`` + ``value_length``, by default
    ``embedding_length / head_count``) per token, an estimate (an MLA model caches less);
    ``kv_gib_per_1k_tokens`` is None when the header lacks the figures.

    The divisors and lengths are at least 1 where given (``head_count`` 0 would size the cache at
    0 GiB for a model llama.cpp cannot load), but for a model without attention, which says so:
    ``head_count`` 0 with ``head_count_kv`` given as 0 in every layer (llama.cpp's converter
    writes a recurrent model, Mamba, so), whose cache does not grow with the context (0 GiB). A
    ``head_count_kv`` of 0 is taken only in a layer without attention: where ``head_count`` is 0 in
    that layer too, or, with one ``head_count`` for all layers, in a hybrid's recurrent layers when
    some other layer has KV heads; attention heads over no KV head at all are refused."""
    arch = meta.get("general.architecture")
    if arch is not None and not isinstance(arch, str):
        raise GGUFRefused(f"general.architecture is {type(arch).__name__}, not a string")
    get = (lambda k: meta.get(f"{arch}.{k}")) if arch else (lambda k: None)
    layers, trained = get("block_count"), get("context_length")
    # 0 layers is no model to size (its KV "not counted"): refused as a missing count is (unsized, C10)
    if layers is not None and (type(layers) is not int or not 1 <= layers <= MAX_LAYERS):
        raise GGUFRefused(f"{arch}.block_count {str(layers)[:40]} is not a layer count (1..{MAX_LAYERS})")
    if trained is not None and (type(trained) is not int or not 0 < trained <= MAX_CONTEXT):
        raise GGUFRefused(f"{arch}.context_length {str(trained)[:40]} is not a context length (1..{MAX_CONTEXT})")
    out = {"architecture": arch, "layers": layers, "kv_gib_per_1k_tokens": None, "context_length": trained}
    heads, width = get("attention.head_count"), get("embedding_length")
    if layers is None or heads is None:
        return out
    kv_key = "attention.head_count_kv" if get("attention.head_count_kv") is not None else "attention.head_count"
    heads_kv = _per_layer(f"{arch}.{kv_key}", get(kv_key), layers)
    heads_per = _per_layer(f"{arch}.attention.head_count", heads, layers)
    first_heads = max(heads_per)
    # attention heads with no KV head: llama.cpp cannot load it, and it would size the cache at 0 GiB.
    # A hybrid (Jamba, LFM2) gives one head_count for its attention layers and head_count_kv 0 in the
    # recurrent ones, so a scalar head_count is held to some layer with KV heads, an array layer by layer
    empty = next((i for i, (h, kv) in enumerate(zip(heads_per, heads_kv)) if h and not kv), None)
    if first_heads and (not any(heads_kv) or (isinstance(heads, list) and empty is not None)):
        where = "every layer" if not any(heads_kv) else f"layer {empty}"
        raise GGUFRefused(f"{arch}.attention.head_count_kv 0 in {where} under {arch}.attention.head_count "
                          f"{heads_per[empty]}: attention heads with no KV head (only a layer without attention, "
                          "head_count 0, has head_count_kv 0)")
    if not first_heads:
        if kv_key.endswith("_kv") and not any(heads_kv):
            out["kv_gib_per_1k_tokens"] = 0.0   # no attention, as the header says: no KV cache
            return out
        said = f"{arch}.{kv_key} {max(heads_kv)}" if kv_key.endswith("_kv") else f"no {arch}.attention.head_count_kv"
        raise GGUFRefused(f"{arch}.attention.head_count 0 with {said}: no head to divide the width by "
                          "(a model without attention gives head_count_kv 0)")
    width = _at_least_1(f"{arch}.embedding_length", width)
    k_len = _at_least_1(f"{arch}.attention.key_length", get("attention.key_length"))
    if k_len is None and width:   # llama.cpp's n_embd_head_k: n_embd / n_head, in whole numbers
        k_len = width // first_heads
        if not k_len:   # a head 0 wide: the KV cache would be "not counted" (C10's class)
            raise GGUFRefused(f"{arch}.attention.head_count {first_heads} over {arch}.embedding_length {width} "
                              f"with no {arch}.attention.key_length: heads 0 wide (llama.cpp divides the width "
                              "by the heads)")
    v_len = _at_least_1(f"{arch}.attention.value_length", get("attention.value_length")) or k_len
    if not k_len:
        return out
    per_token = sum(heads_kv) * (k_len + v_len) * F16_BYTES
    out["kv_gib_per_1k_tokens"] = round(per_token * 1000 / GIB, 4)
    return out


# llama.cpp's split files (llama_split_path: PREFIX-%05d-of-%05d.gguf, fetcher.py SHARD_RE)
SPLIT_NAME = re.compile(r"-([0-9]{5})-of-([0-9]{5})\.gguf$")


def split_problem(meta: dict, path: str) -> str | None:
    """Why the GGUF file ``path``, whose header holds ``meta``, disagrees with its name on how many
    files the model is: its ``split.count`` (gguf-split writes it in every shard; llama.cpp's loader
    opens that many files, named as the first is) other than the name's ``-of-N`` (1 for a name of
    no shard); None when they agree or the header gives none. GGUFRefused when it is no u16. Of a set
    (count over 1) the file is the first: its ``split.no`` 0, which llama.cpp's loader requires
    ("illegal split file idx", round re4 N27)."""
    count = meta.get("split.count")
    if count is None:
        return None
    count = _whole("split.count", count, 0xFFFF)
    named = SPLIT_NAME.search(path)
    listed = int(named.group(2)) if named else 1
    if max(count, 1) != listed:
        return (f"split.count {count} in its header, but its name says {listed} file(s): llama.cpp opens "
                f"{max(count, 1)}, rigup fetches and sizes {listed}")
    number = meta.get("split.no")
    if count > 1 and (number is None or _whole("split.no", number, 0xFFFF) != 0):
        return (f"split.no {'none' if number is None else number} in its header, but the first file of a set "
                f"is 0: llama.cpp loads a set from its first file only")
    return None


def _at_least_1(key: str, value) -> int | None:
    """A width or length of the header (1..:data:`MAX_WIDTH`), or None when the header has none."""
    if value is None:
        return None
    if not _whole(key, value, MAX_WIDTH):
        raise GGUFRefused(f"{key} 0 is not a width (1..{MAX_WIDTH})")
    return value
