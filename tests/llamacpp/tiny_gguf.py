"""A tiny random llama-architecture GGUF file, written in the test, for the llama.cpp
engine's tests: without a tokenizer (ids in, ids out), or with a small SentencePiece one
(ASCII characters, byte fallback for the rest, ChatML control tokens and template)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# SentencePiece token types (llama.cpp's llama_token_type): normal, unknown, control, byte.
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
# The small tokenizer's vocabulary: <unk>, <s>, the ChatML markers, the 256 byte-fallback
# tokens, then "▁" (SentencePiece's space) and the printable ASCII characters.
TOKENS = (
    ["<unk>", "<s>", "<|im_start|>", "<|im_end|>"]
    + [f"<0x{b:02X}>" for b in range(256)]
    + ["▁"]
    + [chr(c) for c in range(33, 127)]
)
TYPES = [_UNKNOWN, _CONTROL, _CONTROL, _CONTROL] + [_BYTE] * 256 + [_NORMAL] * 95
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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
    tokenizer: bool = False,
    quant: str = "F32",
) -> Path:
    """Writes the model; F32 weights drawn from N(0, 0.02 * 5). `repeat_bias` adds to the
    output head the embedding matrix (tied-like), so a token tends to predict tokens that
    followed it in the context: outputs that repeat, which drafts can then copy.
    `tokenizer`: give it `TOKENS` (the vocabulary is then their count, `vocab` ignored).
    `quant`: "Q4_1" stores the blocks' matrices in Q4_1 (`hidden` and `ff` multiples of 32),
    as the default model's GGUF does: the kernels a quantized GGUF runs, AMX's where a build
    has them."""
    if quant not in ("F32", "Q4_1"):
        raise ValueError(f"quant must be F32 or Q4_1, got {quant!r}")
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
    if tokenizer:
        vocab = len(TOKENS)
        wr.add_tokenizer_model("llama")
        wr.add_token_list(TOKENS)
        wr.add_token_scores([-float(i) for i in range(vocab)])
        wr.add_token_types(TYPES)
        wr.add_unk_token_id(0)
        wr.add_bos_token_id(1)
        wr.add_eos_token_id(TOKENS.index("<|im_end|>"))
        wr.add_add_bos_token(False)
        wr.add_chat_template(CHAT_TEMPLATE)
    else:
        wr.add_tokenizer_model("none")
    wr.add_vocab_size(vocab)
    wr.add_file_type(
        gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType.MOSTLY_Q4_1
    )
    emb = w(vocab, hidden)
    wr.add_tensor("token_embd.weight", emb)
    wr.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    wr.add_tensor("output.weight", (w(vocab, hidden) + repeat_bias * emb).astype(np.float32))
    kv = hidden // heads * kv_heads

    def matrix(*shape):
        m = w(*shape)
        if quant == "F32":
            return {"tensor": m}
        q = gguf.GGMLQuantizationType.Q4_1
        return {"tensor": gguf.quants.quantize(m, q), "raw_dtype": q}

    for i in range(layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(f"blk.{i}.attn_q.weight", **matrix(hidden, hidden))
        wr.add_tensor(f"blk.{i}.attn_k.weight", **matrix(kv, hidden))
        wr.add_tensor(f"blk.{i}.attn_v.weight", **matrix(kv, hidden))
        wr.add_tensor(f"blk.{i}.attn_output.weight", **matrix(hidden, hidden))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        wr.add_tensor(f"blk.{i}.ffn_gate.weight", **matrix(ff, hidden))
        wr.add_tensor(f"blk.{i}.ffn_up.weight", **matrix(ff, hidden))
        wr.add_tensor(f"blk.{i}.ffn_down.weight", **matrix(hidden, ff))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
