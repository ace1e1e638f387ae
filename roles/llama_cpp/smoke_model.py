"""The tiny GGUF that a new llama.cpp build answers with before it serves (roles/llama_cpp/shipped/smoke.py),
when the served model is not on the host yet (or is too large to load twice).

A llama-architecture model with random weights (a fixed seed, so the file is the same on every
machine), written with gguf-py, the field's own GGUF writer (``pip install gguf``; in
requirements-dev.txt, not needed at run time: the file is committed next to this module).
Its matrices are Q4_0, the type llama.cpp's CPU backend repacks (AVX2, AVX-512 and AMX buffer types)
and the CUDA backend runs with its own kernels, so a smoke inference goes through the same batched
matmul paths as a quantized model; 256-wide, 2 layers, a byte-fallback SentencePiece vocabulary:
any prompt tokenizes. About 0.9 MB.

    .venv/bin/python -m roles.llama_cpp.smoke_model     # rewrite roles/llama_cpp/smoke.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

from rigup.text import shown

PATH = Path(__file__).with_name("smoke.gguf")
EMBD, LAYERS, HEADS, FF, CTX = 256, 2, 4, 512, 4096
WORDS = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁is", "▁in", "▁it", "▁that", "▁on", "▁hi", "▁ok"]


def vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: unk, bos, eos, the 256 byte tokens, a few words, then padding to a
    multiple of 64 rows (the output matrix repacks in blocks of 8 rows)."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["▁"] + WORDS
    tokens += [f"▁w{i}" for i in range(-len(tokens) % 64)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * (len(tokens) - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(1, len(tokens) - 258)]
    return tokens, scores, [int(t) for t in types]


def write(path: Path = PATH) -> Path:
    """Write the model to ``path`` and return it."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
    from gguf.quants import quantize

    rng = np.random.default_rng(20261201)
    tokens, scores, types = vocab()
    w = GGUFWriter(str(path), "llama")
    w.add_name("rigup smoke model (random weights)")
    w.add_context_length(CTX)
    w.add_embedding_length(EMBD)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(EMBD // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        w.add_tensor(name, quantize(data, GGMLQuantizationType.Q4_0), raw_dtype=GGMLQuantizationType.Q4_0)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(EMBD, dtype=np.float32))

    matrix("token_embd.weight", len(tokens), EMBD)
    norm("output_norm.weight")
    matrix("output.weight", len(tokens), EMBD)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for part in ("q", "k", "v", "output"):
            matrix(f"blk.{i}.attn_{part}.weight", EMBD, EMBD)
        matrix(f"blk.{i}.ffn_gate.weight", FF, EMBD)
        matrix(f"blk.{i}.ffn_up.weight", FF, EMBD)
        matrix(f"blk.{i}.ffn_down.weight", EMBD, FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    print(shown(write(Path(sys.argv[1]) if len(sys.argv) > 1 else PATH), 4000))
