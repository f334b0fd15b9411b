"""The target's own predictions, recycled into the draft tree (torch is imported on use).

Every verify forward computes the target's distribution after each node of the tree, and the
prefill after each prompt token; the engine keeps only the argmax along the accepted path.
These helpers take the top-k of those distributions (no extra forward) for the cache's
recycled-prediction table (`LookaheadCache(recycle_k=...)`, `rust/src/recycle.rs`), after
Token Recycling (Luo et al. 2024), which keeps each token's top-k successors from earlier
verify steps and drafts from them. Drafts then offer them beside the tries' continuations
where the tries only match a short n-gram.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# Top predictions kept per key when the engine builds its own cache with `recycle=True`
# (simulator, B = 16, 120 Spec-Bench traces: k = 4 / 8 / 16 give 2.917 / 2.920 / 2.920 tokens
# per step; BENCHMARKS.md, "Recycled predictions").
RECYCLE_K = 8
# The CLI's `--recycle` values as the engine's `recycle` option.
RECYCLE_MODES = {"off": False, "on": True, "path": "path"}
# Prompt tokens (the last ones) whose rows the prefill computes: the output head over every
# row of a long prompt costs what the rows bring back (simulator, B = 16, 120 traces: no /
# the last 512 / all prompt rows give 2.852 / 2.920 / 2.933 tokens per step).
RECYCLE_PROMPT_ROWS = 512


def top_rows(scores: torch.Tensor, k: int, probs: torch.Tensor | None = None):
    """The top-`k` tokens of each row of `scores` (logits, [n, V]) with their probabilities
    (softmax of the row, or the rows of `probs` where given), as (uint32, float32) numpy
    arrays [n, k]."""
    import torch

    k = min(k, scores.shape[-1])
    if probs is not None:
        top = torch.topk(probs, k, dim=-1)
        values = top.values
    else:
        scores = scores.float()
        top = torch.topk(scores, k, dim=-1)
        values = (top.values - torch.logsumexp(scores, dim=-1, keepdim=True)).exp()
    ids = top.indices.cpu().numpy().astype(np.uint32)
    # A row of inf / NaN logits gives NaN: kept as 0 (dropped), never an error mid-generation.
    p = torch.nan_to_num(values, nan=0.0).clamp_(0.0, 1.0).cpu().numpy().astype(np.float32)
    return ids, p


def first_prompt_row(n: int) -> int:
    """Of a prefill over `n` tokens, the first whose row is kept (the last
    `RECYCLE_PROMPT_ROWS`)."""
    return max(0, n - RECYCLE_PROMPT_ROWS)


def prefill_with_rows(model, kv, prompt_ids: list, k: int, keep_kw: dict):
    """Prefills `prompt_ids` into `kv` in one forward (the one the engine runs without
    recycling) and returns `(first, ids, probs)`: the top-`k` rows (`top_rows`) after each of
    `prompt_ids[first:]`, the last `RECYCLE_PROMPT_ROWS` tokens.

    `keep_kw` is `kv.last_logits_only(model)`: where the model takes `logits_to_keep` the
    forward computes those rows' logits alone; a model without it computes every position's,
    as its prefill does anyway, and the rows are taken from the last ones."""
    import torch

    dev = next(model.parameters()).device
    first = first_prompt_row(len(prompt_ids))
    x = torch.tensor([prompt_ids], dtype=torch.long, device=dev)
    kw = {"logits_to_keep": len(prompt_ids) - first} if keep_kw else {}
    logits = model(input_ids=x, past_key_values=kv, use_cache=True, **kw).logits[0]
    return (first, *top_rows(logits[-(len(prompt_ids) - first) :], k))


def hand_over(
    cache, rid: str, verdict, tokens: np.ndarray, parents: np.ndarray, k: int, tree: bool
):
    """Give `cache` the top-`k` rows of a verified step: with `tree`, the rejected nodes'
    rows now (each keyed by its parent's token); the accepted path's rows are returned, for
    the `extend` that adds the emitted tokens."""
    path, n = verdict.path, len(tokens)
    if tree and n > len(path):
        top = top_rows(verdict.scores, k, verdict.probs)
        # The rejected nodes' rows first: the path's, written after, win a key both have.
        off = np.setdiff1d(np.arange(1, n), path)
        node_tokens = tokens.astype(np.int64)
        cache.recycle(
            rid,
            node_tokens[off],
            top[0][off],
            top[1][off],
            after=node_tokens[np.asarray(parents, dtype=np.int64)[off]],
        )
        return top[0][path], top[1][path]
    probs = None if verdict.probs is None else verdict.probs[path]
    return top_rows(verdict.scores[path], k, probs)
