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
# (simulator, B = 16, 120 Spec-Bench traces, a near variant of the drafting rule: k = 4 / 8 /
# 16 give 2.904 / 2.909 / 2.909 tokens per step; BENCHMARKS.md, "Recycled predictions").
RECYCLE_K = 8
# The CLI's `--recycle` values as the engine's `recycle` option.
RECYCLE_MODES = {"off": False, "on": True, "path": "path"}
# Prompt tokens (the last ones) whose rows the prefill computes: the output head over every
# row of a long prompt costs what the rows bring back (simulator, B = 16, 120 traces: rows of
# the last 256 / 512 / all prompt tokens give 2.898 / 2.906 / 2.916 tokens per step).
RECYCLE_PROMPT_ROWS = 512
# Logit entries (rows x vocabulary) one prefill chunk may produce, for a model whose forward
# cannot keep only the last positions' logits: its prompt is prefilled in chunks so their
# logits never take more than 256 MB in fp32.
PREFILL_LOGITS = 1 << 26


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
    p = values.clamp_(0.0, 1.0).cpu().numpy().astype(np.float32)
    return ids, p


def prefill_with_rows(model, kv, prompt_ids: list, k: int, vocab: int, keep_kw: dict):
    """Prefills `prompt_ids` into `kv` and returns `(first, ids, probs)`: the top-`k` rows
    (`top_rows`) after each of `prompt_ids[first:]`, the last `RECYCLE_PROMPT_ROWS` tokens.

    `keep_kw` is `kv.last_logits_only(model)`: where the model takes `logits_to_keep`, one
    forward computes those rows' logits alone (the prefill is the one the engine runs without
    recycling); else the prompt runs in chunks of at most `PREFILL_LOGITS // vocab` tokens,
    each computing its logits."""
    import torch

    dev = next(model.parameters()).device
    first = max(0, len(prompt_ids) - RECYCLE_PROMPT_ROWS)
    if keep_kw:
        x = torch.tensor([prompt_ids], dtype=torch.long, device=dev)
        kw = {"logits_to_keep": len(prompt_ids) - first}
        logits = model(input_ids=x, past_key_values=kv, use_cache=True, **kw).logits[0]
        return (first, *top_rows(logits, k))
    chunk = max(64, PREFILL_LOGITS // max(vocab, 1))
    ids_parts, prob_parts = [], []
    for at in range(0, len(prompt_ids), chunk):
        x = torch.tensor([prompt_ids[at : at + chunk]], dtype=torch.long, device=dev)
        logits = model(input_ids=x, past_key_values=kv, use_cache=True).logits[0]
        if at + len(logits) > first:
            ids, p = top_rows(logits[max(0, first - at) :], k)
            ids_parts.append(ids)
            prob_parts.append(p)
        del logits
    return first, np.concatenate(ids_parts), np.concatenate(prob_parts)
