"""Tiny randomly initialised causal LMs built in code (no downloads), for fast CPU tests.

`tiny_model(family)` returns an fp32 model in eval mode; families: "llama", "qwen2", "gemma".
`tiny_tokenizer()` is a matching character-level tokenizer; `hf_generate` is the plain
decoding reference and `ScriptedCache` a `LookaheadCache` stand-in with scripted drafts.
Other test files may import this module.
"""

from __future__ import annotations

import numpy as np
import torch
from lookahead import Draft

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


def hf_generate(model, ids, max_new_tokens, eos_token_id=None, **kw) -> list:
    """New token ids from plain `model.generate` (greedy unless kw says otherwise)."""
    inp = torch.tensor([ids])
    kw.setdefault("do_sample", False)
    with torch.inference_mode():
        out = model.generate(
            inp,
            attention_mask=torch.ones_like(inp),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=0,
            **kw,
        )
    return out[0, len(ids) :].tolist()


def repetitive_prompt(rng, vocab_size: int, lo: int = 8, hi: int = 40) -> list:
    """A prompt made of a short random pattern repeated (with one mutation), so n-grams recur."""
    pat = [rng.randrange(2, vocab_size) for _ in range(rng.randrange(2, 7))]
    ids = (pat * (hi // len(pat) + 1))[: rng.randrange(lo, hi)]
    if len(ids) > 4:
        ids[rng.randrange(len(ids))] = rng.randrange(2, vocab_size)
    return ids


def bounded(d: Draft, vocab: int | None = None, max_depth: int | None = None) -> Draft:
    """`d` as the core prunes a draft asked with `vocab` and `max_depth`
    (`LookaheadCache.draft`): without nodes whose ids are `vocab` or more or that lie deeper
    than `max_depth` below the root, nor their descendants; parents renumbered. A plain
    Python reference for the stand-in caches here and for the core's own test."""
    ids = d.tokens.view(np.uint32)
    keep, new_index, level = [0], {0: 0}, {0: 0}
    for i in range(1, d.num_nodes):
        p = int(d.parents[i])
        if ((vocab is None or ids[i] < vocab) and p in new_index
                and (max_depth is None or level[p] < max_depth)):  # fmt: skip
            new_index[i], level[i] = len(keep), level[p] + 1
            keep.append(i)
    parents = np.array([-1] + [new_index[int(d.parents[i])] for i in keep[1:]], np.int32)
    return Draft(d.tokens[keep], parents, d.scores[keep], len(keep), d.matched[keep])


class ScriptedCache:
    """A stand-in for `LookaheadCache` that drafts from a known continuation.

    `truth` is the full expected sequence (prompt + output). Each draft has, per level, a wrong
    sibling first and then the true token (so the accepted path skips nodes and the KV rows
    must move), `chain` levels deep. With `correct=False` only wrong tokens are drafted, so
    every draft is rejected at the root. Records every `extend` for checks.
    """

    def __init__(self, truth: list, vocab_size: int, chain: int = 6, correct: bool = True):
        self.truth = list(truth)
        self.vocab = vocab_size
        self.chain = chain
        self.correct = correct
        self.ctx: list = []
        self.extended: list = []
        self.finished = False

    def start_request(self, rid, ids, namespace="default"):
        self.ctx = list(ids)

    def extend(self, rid, toks):
        self.extended.append(list(toks))
        self.ctx.extend(int(t) for t in toks)

    def finish_request(self, rid, keep_prompt=None):
        self.finished = True

    def _wrong(self, t: int) -> int:
        return 2 + (t - 2 + 1) % (self.vocab - 2)

    def draft(self, rid, budget=16, multi_branch=True, *, vocab=None, max_depth=None):
        pos = len(self.ctx)
        assert self.ctx == self.truth[:pos], "the engine's context left the reference"
        tokens, parents, prev = [self.ctx[-1]], [-1], 0
        for t in self.truth[pos : pos + self.chain]:
            if len(tokens) + (2 if self.correct else 1) > budget + 1:
                break
            tokens.append(self._wrong(t))
            parents.append(prev)
            if self.correct:
                tokens.append(t)
                parents.append(prev)
            prev = len(tokens) - 1
        n = len(tokens)
        d = Draft(
            np.array(tokens, dtype=np.int32),
            np.array(parents, dtype=np.int32),
            np.zeros(n, dtype=np.float32),
            n,
        )
        return bounded(d, vocab, max_depth)
