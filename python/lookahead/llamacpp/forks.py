"""Why a llama.cpp output differs from plain greedy decoding: a rounding near-tie, or a bug.

`lookahead.forks` for this engine: llama.cpp's CPU kernels may round a row of a W-row
forward differently from a one-row forward (quantized matrix products take another path
with the batch size), so greedy decoding with drafts can pick another token where plain's
top two logits are nearly tied. `rounding_bound` measures how far that moves a competing
logit on this model, threads and CPU; `explain_fork` scores the first differing position
with plain's own one-row forward and calls it a near-tie within the bound.
"""

from __future__ import annotations

import numpy as np

from lookahead.forks import COMPETITOR_GAP, Fork, first_difference


def _one_row(model, ids: list) -> np.ndarray:
    """Logits after `ids` from a one-row forward of its last token (the rest prefilled)."""
    model.reset()
    if len(ids) > 1:
        model.prefill(ids[:-1], [0])
    return model.decode([ids[-1]], [len(ids) - 1], [[0]], [True])[0]


def rounding_bound(plain, tree, ids: list, rows: int = 32) -> float:
    """Twice the largest difference of a competing logit between `plain`'s one-row forwards
    and one forward of `rows` rows on `tree` (the engine's context), over the last `rows`
    positions of `ids` (at least 2 tokens)."""
    if len(ids) < 2:
        raise ValueError("rounding_bound needs at least 2 token ids")
    start = max(1, len(ids) - rows)
    plain.reset()
    one = [plain.prefill(ids[:start], [0])]
    for i in range(start, len(ids)):
        one.append(plain.decode([ids[i]], [i], [[0]], [True])[0])
    tree.reset()
    first = tree.prefill(ids[:start], [0])
    rest = tree.decode(ids[start:], range(start, len(ids)), [[0]] * (len(ids) - start),
                       [True] * (len(ids) - start))  # fmt: skip
    a, b = np.stack(one), np.vstack([first[None], rest])
    plain.reset()
    tree.reset()
    competing = a >= a.max(axis=1, keepdims=True) - COMPETITOR_GAP
    return 2.0 * float(np.abs(a - b)[competing].max())


def explain_fork(plain, prompt_ids: list, plain_ids: list, other_ids: list, bound: float):
    """None if the outputs are equal, else the `Fork` at their first difference, both
    tokens scored by `plain`'s one-row forward over the prompt and the shared tokens."""
    plain_ids, other_ids = list(plain_ids), list(other_ids)
    if plain_ids == other_ids:
        return None
    n = min(len(plain_ids), len(other_ids))
    i = first_difference(plain_ids, other_ids)
    if i == n:  # one is a prefix of the other: it stopped first
        a = plain_ids[i] if i < len(plain_ids) else None
        b = other_ids[i] if i < len(other_ids) else None
        return Fork(i, a, b, float("nan"), bound, False)
    row = _one_row(plain, list(prompt_ids) + plain_ids[:i])
    margin = float(row[plain_ids[i]] - row[other_ids[i]])
    return Fork(i, plain_ids[i], other_ids[i], margin, bound, abs(margin) <= bound)
