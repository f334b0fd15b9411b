"""A tiny random llama-architecture GGUF file, written in the test (no tokenizer: ids in,
ids out), for the llama.cpp engine's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_llama(
    path: Path,
    vocab: int = 97,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ff: int = 128,
    ctx: int = 512,
    seed: int = 0,
    repeat_bias: float = 0.0,
) -> Path:
    """Writes the model; F32 weights drawn from N(0, 0.02 * 5). `repeat_bias` adds to the
    output head the embedding matrix (tied-like), so a token tends to predict tokens that
    followed it in the context: outputs that repeat, which drafts can then copy."""
    import gguf

    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_context_length(ctx)
    wr.add_embedding_length(hidden)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(ff)
    wr.add_head_count(heads)
    wr.add_head_count_kv(kv_heads)
    wr.add_rope_dimension_count(hidden // heads)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_vocab_size(vocab)
    wr.add_tokenizer_model("none")
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    emb = w(vocab, hidden)
    wr.add_tensor("token_embd.weight", emb)
    wr.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    wr.add_tensor("output.weight", (w(vocab, hidden) + repeat_bias * emb).astype(np.float32))
    kv = hidden // heads * kv_heads
    for i in range(layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(f"blk.{i}.attn_q.weight", w(hidden, hidden))
        wr.add_tensor(f"blk.{i}.attn_k.weight", w(kv, hidden))
        wr.add_tensor(f"blk.{i}.attn_v.weight", w(kv, hidden))
        wr.add_tensor(f"blk.{i}.attn_output.weight", w(hidden, hidden))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(f"blk.{i}.ffn_gate.weight", w(ff, hidden))
        wr.add_tensor(f"blk.{i}.ffn_up.weight", w(ff, hidden))
        wr.add_tensor(f"blk.{i}.ffn_down.weight", w(hidden, ff))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
