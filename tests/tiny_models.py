"""Tiny randomly initialised causal LMs built in code (no downloads), for fast CPU tests.

`tiny_model(family)` returns an fp32 model in eval mode; families: "llama", "qwen2", "gemma".
Other test files may import this module.
"""

from __future__ import annotations

import torch

FAMILIES = ("llama", "qwen2", "gemma")
EOS_ID = 1


def tiny_config(family: str, vocab_size: int = 128, num_layers: int = 2, **overrides):
    """A tiny config of `family` (a few layers, GQA, hidden 64)."""
    from transformers import GemmaConfig, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=EOS_ID,
        pad_token_id=0,
    )
    if family == "llama":
        cfg = LlamaConfig(**common)
    elif family == "qwen2":
        cfg = Qwen2Config(**common, use_sliding_window=False)
    elif family == "gemma":
        cfg = GemmaConfig(**common, head_dim=16)
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def tiny_model(
    family: str = "llama",
    seed: int = 0,
    attn_implementation: str = "sdpa",
    init_std: float = 0.2,
    **config_overrides,
):
    """A tiny random fp32 causal LM of `family`.

    A large `init_std` makes the logits peaked, so greedy outputs fall into loops that the
    trie can draft (a default-initialised tiny model is almost uniform).
    """
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(family, **config_overrides)
    cfg.initializer_range = init_std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation=attn_implementation
    )
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = 0
    model.eval()
    return model


def tiny_tokenizer(vocab_size: int = 128):
    """A character-level fast tokenizer matching `tiny_config`'s ids (0 = <s>, 1 = </s>).

    Ids 2.. map to the characters chr(32) (space), chr(33), ...; decoding joins characters, so text
    and stop strings are easy to reason about.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": EOS_ID}
    for i in range(2, vocab_size):
        vocab[chr(30 + i)] = i
    core = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<s>"
    )
