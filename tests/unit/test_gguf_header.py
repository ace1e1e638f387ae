"""A GGUF header rigup sizes VRAM from (shipped/gguf.py), as llama.cpp's loader would take it (issue 61,
second round): a key given twice is refused (llama.cpp refuses the file; the last one would size
VRAM for 1 layer of 80), and no divisor or width is 0 (``head_count`` 0 sized the KV cache at 0 GiB),
but for a model that says it has no attention."""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from shipped.gguf import GGUFRefused, kv_figures, metadata

LLAMA = [("general.architecture", "llama"), ("llama.block_count", 80), ("llama.attention.head_count", 32),
         ("llama.attention.head_count_kv", 8), ("llama.embedding_length", 4096)]


def header(pairs: list[tuple[str, object]]) -> bytes:
    """A GGUF v3 header of ``pairs`` in order (a key may come twice): strings, u32s and u32 arrays."""
    def value(v):
        if isinstance(v, str):
            return struct.pack("<IQ", 8, len(v.encode())) + v.encode()
        if isinstance(v, list):
            return struct.pack("<IIQ", 9, 4, len(v)) + b"".join(struct.pack("<I", i) for i in v)
        return struct.pack("<II", 4, v)
    body = b"".join(struct.pack("<Q", len(k.encode())) + k.encode() + value(v) for k, v in pairs)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + body


def test_a_key_given_twice_is_refused():
    with pytest.raises(GGUFRefused) as refused:
        metadata(header(LLAMA + [("llama.block_count", 1)]))
    print(f"\nblock_count 80, then 1: {refused.value}")
    assert "'llama.block_count' given twice" in str(refused.value)


@settings(max_examples=60, deadline=1000)
@given(st.permutations(LLAMA), st.integers(0, len(LLAMA) - 1), st.integers(0, 2**32 - 1), st.booleans())
def test_any_key_twice_anywhere_is_refused_wanted_or_not(pairs, which, again, wanted):
    """Wherever the second copy lies and whatever it holds, and whether the caller wants the key or not."""
    pairs = list(pairs)
    pairs.insert(len(pairs), (pairs[which][0], again if pairs[which][0] != "general.architecture" else "x"))
    with pytest.raises(GGUFRefused, match="given twice"):
        metadata(header(pairs), lambda k: wanted, partial=True)


@pytest.mark.parametrize("key, value", [("llama.attention.head_count", 0), ("llama.embedding_length", 0),
                                        ("llama.attention.key_length", 0), ("llama.attention.value_length", 0)])
def test_a_zero_divisor_or_width_is_refused_naming_it(key, value):
    pairs = [p for p in LLAMA if p[0] != key] + [(key, value)]
    if key == "llama.attention.head_count":
        pairs = [p for p in pairs if p[0] != "llama.attention.head_count_kv"]   # the red team's header
    with pytest.raises(GGUFRefused, match=key) as refused:
        kv_figures(metadata(header(pairs)))
    print(f"\n{key} {value}: {refused.value}")


def test_head_count_0_with_kv_heads_is_refused():
    pairs = [p for p in LLAMA if p[0] != "llama.attention.head_count"] + [("llama.attention.head_count", 0)]
    with pytest.raises(GGUFRefused, match="head_count 0 with llama.attention.head_count_kv 8"):
        kv_figures(metadata(header(pairs)))


def test_a_model_without_attention_that_says_so_has_no_kv_cache():
    """Mamba as llama.cpp's converter writes it: head_count 0 and head_count_kv 0."""
    mamba = [("general.architecture", "mamba"), ("mamba.block_count", 64), ("mamba.attention.head_count", 0),
             ("mamba.attention.head_count_kv", 0), ("mamba.embedding_length", 2560)]
    figures = kv_figures(metadata(header(mamba)))
    print(f"\nmamba: {figures}")
    assert figures["layers"] == 64 and figures["kv_gib_per_1k_tokens"] == 0.0


def test_a_hybrid_with_attention_in_some_layers_is_sized_by_those():
    hybrid = [p for p in LLAMA if p[0] not in ("llama.block_count", "llama.attention.head_count_kv")] + \
        [("llama.block_count", 4), ("llama.attention.head_count_kv", [8, 0, 8, 0])]
    assert kv_figures(metadata(header(hybrid)))["kv_gib_per_1k_tokens"] == round(16 * 256 * 2 * 1000 / 2**30, 4)


@pytest.mark.parametrize("heads, kv, said", [
    (64, [0, 0], "head_count_kv 0 in every layer under llama.attention.head_count 64"),   # round 3, item 1
    (64, 0, "head_count_kv 0 in every layer under llama.attention.head_count 64"),
    ([64, 64], [8, 0], "head_count_kv 0 in layer 1 under llama.attention.head_count 64"),
])
def test_attention_heads_over_no_kv_head_are_refused_naming_the_key(heads, kv, said):
    """Issue 61 round 3: head_count 64 with head_count_kv 0 in every layer sized the cache at 0.0 GiB."""
    pairs = [p for p in LLAMA if p[0] not in ("llama.block_count", "llama.attention.head_count",
                                              "llama.attention.head_count_kv")]
    pairs += [("llama.block_count", 2), ("llama.attention.head_count", heads), ("llama.attention.head_count_kv", kv)]
    with pytest.raises(GGUFRefused) as refused:
        kv_figures(metadata(header(pairs)))
    print(f"\nhead_count {heads}, head_count_kv {kv}: {refused.value}")
    assert said in str(refused.value)


@settings(max_examples=60, deadline=1000)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 64)), min_size=1, max_size=6))
def test_a_layer_without_kv_heads_has_no_attention_heads(layers):
    """Per-layer head_count and head_count_kv: sized only when every layer with attention heads has KV
    heads; then the figure is those layers' alone."""
    heads, kv = [h for h, _ in layers], [k for _, k in layers]
    pairs = [("general.architecture", "llama"), ("llama.block_count", len(layers)),
             ("llama.attention.head_count", heads), ("llama.attention.head_count_kv", kv),
             ("llama.embedding_length", 4096), ("llama.attention.key_length", 128)]
    bad = any(h and not k for h, k in layers) or (not any(heads) and any(kv))
    try:
        figures = kv_figures(metadata(header(pairs)))
    except GGUFRefused as e:
        assert bad, e
        return
    assert not bad and figures["kv_gib_per_1k_tokens"] == round(sum(kv) * 256 * 2 * 1000 / 2**30, 4)


# ---------------------------------------------------------------- the chat template (issue 63)

from shipped.gguf import CHAT_TEMPLATE, chat_template, header as read_header  # noqa: E402


def tokenizer(count: int, template: str | None) -> bytes:
    """A GGUF v3 header as llama.cpp's writers order it: the llama keys, then the tokenizer's arrays
    (``count`` token strings, their f32 scores, their i32 types), then the chat template if any."""
    def key(k: str) -> bytes:
        return struct.pack("<Q", len(k)) + k.encode()
    kvs = [key(k) + (struct.pack("<IQ", 8, len(v)) + v.encode() if isinstance(v, str) else struct.pack("<II", 4, v))
           for k, v in LLAMA]
    kvs.append(key("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
               + b"".join(struct.pack("<Q", len(t)) + t for t in (f"tok{i}".encode() for i in range(count))))
    kvs.append(key("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, count) + b"\0\0\0\0" * count)
    kvs.append(key("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, count) + b"\1\0\0\0" * count)
    if template is not None:
        kvs.append(key(CHAT_TEMPLATE) + struct.pack("<IQ", 8, len(template.encode())) + template.encode())
    kvs.append(key("general.quantization_version") + struct.pack("<II", 4, 2))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


NOT_TOKENIZER = lambda k: not k.startswith("tokenizer.")  # noqa: E731 - as roles/model_fetch/hub.py reads it


@pytest.mark.parametrize("template, said", [("{{ messages }}", True), (None, False), ("", False)])
def test_a_chat_template_is_found_or_known_absent_once_the_header_is_read_whole(template, said):
    """An empty template is none (round 1 of issue 61, C03: llama-server falls back to its own)."""
    buf = tokenizer(1000, template)
    got = read_header(buf, NOT_TOKENIZER)
    assert got.complete and chat_template(got) is said and CHAT_TEMPLATE not in got.meta
    assert kv_figures(got.meta)["layers"] == 80


def test_a_template_after_a_vocabulary_of_300k_tokens_is_found_without_building_it():
    """Gemma 3's 262k tokens with their scores and types come to about 6 MiB before the template: the
    arrays are stepped over, nothing of them built (tracemalloc: far below the bytes read)."""
    import tracemalloc

    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    buf = tokenizer(300_000, template)
    assert chat_template(read_header(buf, NOT_TOKENIZER)) is True and len(buf) > 7 << 20
    buf = tokenizer(60_000, template)   # tracemalloc slows each allocation 30 times: a smaller vocabulary
    tracemalloc.start()
    got = read_header(buf, NOT_TOKENIZER)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"\n{len(buf) / 2**20:.1f} MiB of header read, {peak / 1024:.0f} KiB allocated at the peak")
    assert chat_template(got) is True and peak < 64 << 10


@pytest.mark.parametrize("template", ["{{ messages }}", None])
def test_a_header_cut_before_its_end_says_not_known_never_absent(template):
    buf = tokenizer(5000, template)
    for cut in (3, 10, 4096, len(buf) // 2, len(buf) - 1):
        got = read_header(buf[:cut], NOT_TOKENIZER)
        assert not got.complete and got.needed > cut - 1 and chat_template(got) in ((None,) if template is None
                                                                                    or cut < len(buf) - 20 else (True, None))
    with pytest.raises(GGUFRefused, match="the header needs"):
        metadata(buf[:4096])


@pytest.mark.parametrize("absurd", [struct.pack("<IIQ", 9, 8, 2 ** 64 - 1), struct.pack("<IIQ", 9, 9, 2 ** 63),
                                    struct.pack("<IQ", 8, 2 ** 62), struct.pack("<IIQ", 9, 6, 2 ** 61)])
def test_a_hostile_count_or_length_ends_where_the_bytes_end(absurd):
    """2^64 token strings, 2^63 nested arrays, a 4 EiB template, 2^61 scores: refused or read as far as
    the bytes go (not complete: the template not known), at once, never a loop past them."""
    import time

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2 ** 64 - 1) + struct.pack("<Q", 21) + b"tokenizer.ggml.tokens" \
        + absurd + b"\0" * 100_000
    started = time.monotonic()
    try:
        got = read_header(body, NOT_TOKENIZER)
    except GGUFRefused as e:   # an array of arrays with items of no known type
        print(f"\nrefused: {e}")
        return
    assert not got.complete and chat_template(got) is None and time.monotonic() - started < 1


@settings(max_examples=60, deadline=2000)
@given(st.booleans(), st.integers(0, 3000), st.data())
def test_the_template_is_never_said_absent_from_bytes_that_end_before_the_header(has, count, data):
    """Any cut of any header: the template is found (it is there and was reached), not known (the bytes
    ended first), or absent only when the header was read to its end and it has none; a byte changed
    anywhere gives a Header or GGUFRefused, nothing else."""
    buf = tokenizer(count, "{{ x }}" if has else None)
    cut = data.draw(st.integers(0, len(buf)))
    said = chat_template(read_header(buf[:cut], NOT_TOKENIZER))
    assert said in ((True, None) if has else (None,)) if cut < len(buf) else said is has
    at, byte = data.draw(st.integers(0, len(buf) - 1)), data.draw(st.integers(0, 255))
    try:
        got = read_header(buf[:at] + bytes([byte]) + buf[at + 1:], NOT_TOKENIZER)
    except GGUFRefused:
        return
    assert chat_template(got) in (True, False, None)


@pytest.mark.parametrize("value", [struct.pack("<IB", 0, 0), struct.pack("<II", 4, 1), struct.pack("<IQ", 8, 0),
                                   struct.pack("<IIQ", 9, 8, 1) + struct.pack("<Q", 3) + b"x{}"])
def test_a_chat_template_that_is_no_text_or_empty_is_none(value):
    """Round 1 of issue 61, C02/C03: tokenizer.chat_template as a uint8 0 (or a uint32, an empty
    string, an array of strings) was a template by the key's presence alone: the plan's warning for
    a model without one was skipped."""
    key = lambda k: struct.pack("<Q", len(k)) + k.encode()   # noqa: E731
    buf = (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + key("general.architecture") + struct.pack("<IQ", 8, 5) + b"llama"
           + key(CHAT_TEMPLATE) + value)
    got = read_header(buf, NOT_TOKENIZER)
    assert got.complete and chat_template(got) is False
    cut = chat_template(read_header(buf[:-1], NOT_TOKENIZER))   # cut inside: a string's not known, another type none
    assert cut is (None if value[:4] == struct.pack("<I", 8) else False)


def _unsized_header(arch: bytes, keys: bytes, count: int) -> bytes:
    key = lambda k: struct.pack("<Q", len(k)) + k.encode()   # noqa: E731
    return b"GGUF" + struct.pack("<IQQ", 3, 0, count) + key("general.architecture") + struct.pack("<IQ", 8, len(arch)) + arch + keys


def test_a_header_rigup_cannot_size_is_named_why():
    """Round 1 of issue 61, C10/C05: an architecture LLAMA whose keys are llama.*, or a string of
    2^63 bytes before block_count, gave layers and KV None: the plan said "KV cache not counted"
    for a file llama.cpp will not load. unsized says why; roles/model_fetch/hub.py refuses it."""
    from shipped.gguf import unsized

    key = lambda k: struct.pack("<Q", len(k)) + k.encode()   # noqa: E731
    u32 = lambda k, v: key(k) + struct.pack("<II", 4, v)   # noqa: E731
    body = u32("llama.block_count", 32) + u32("llama.attention.head_count", 32) + u32("llama.embedding_length", 4096)
    wrong = _unsized_header(b"LLAMA", body, 4)
    got = read_header(wrong, NOT_TOKENIZER)
    assert "no LLAMA.block_count in the whole header" in unsized(got, kv_figures(got.meta), len(wrong), False)
    right = _unsized_header(b"llama", body, 4)
    got = read_header(right, NOT_TOKENIZER)
    assert unsized(got, kv_figures(got.meta), len(right), True) is None
    huge = _unsized_header(b"llama", key("x") + struct.pack("<IQ", 8, 2 ** 63) + b"\0" * 100, 3)
    got = read_header(huge, NOT_TOKENIZER)
    assert "past the file's" in unsized(got, kv_figures(got.meta), len(huge) + 1000, False)
    cut = read_header(right[:80], NOT_TOKENIZER)   # more bytes will tell: not yet
    assert unsized(cut, kv_figures(cut.meta), 1 << 30, False) is None
    assert "no llama.block_count in the bytes read" in unsized(cut, kv_figures(cut.meta), 1 << 30, True)


def test_a_header_of_0_layers_is_refused_naming_the_key():
    """rerun1 N64: ``block_count`` 0 gave layers 0 and KV None, and unsized() None: the model was
    sized with its "KV cache not counted" rather than refused, C10's class by another door. The hub's
    cache, kept before, reads 0 layers as no layer count too."""
    from rigup.boundary.core import Unreadable
    from rigup.boundary.hosttext import gguf_figures

    with pytest.raises(GGUFRefused, match=r"llama.block_count 0 is not a layer count \(1\.\."):
        kv_figures(metadata(header([("general.architecture", "llama"), ("llama.block_count", 0),
                                    ("llama.attention.head_count", 32), ("llama.embedding_length", 4096)])))
    assert kv_figures(metadata(header(LLAMA[:1] + [("llama.block_count", 1)] + LLAMA[2:])))["layers"] == 1
    with pytest.raises(Unreadable, match="0 layers"):
        gguf_figures({"architecture": "llama", "layers": 0, "kv_gib_per_1k_tokens": None, "context_length": None,
                      "read_bytes": 4096}, "m.gguf")
