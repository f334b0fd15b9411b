"""Draft proposal: the cache's best-first tree for this step, pruned (by the core) to what the
model can embed and the output has room for, then cut to the prefix the sizer says pays for its
rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# The root's parent array: the tree of a step that verifies the last token alone.
ROOT_PARENTS = np.array([-1], dtype=np.int32)


@dataclass
class Proposal:
    """The tree to verify (node 0 the root) and, when it was cut, the tree it was cut from."""

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray | None  # None: no draft (the root alone)
    drafted: tuple | None  # (tokens, parents, scores, matched) before the sizer's cut; None: none
    skipped: int  # 1 when the sizer dropped a draft for the root alone


def propose(
    cache,
    rid: str,
    root: int,
    *,
    budget: int,
    room: int,
    multi_branch: bool,
    vocab: int,
    cut: Callable[[np.ndarray, np.ndarray, np.ndarray], int] | None = None,
    new_tokens: list | None = None,
) -> Proposal:
    """This step's tree: up to `budget` drafted nodes, none deeper than `room` (the draft
    tokens the output still has room for) nor with ids the model lacks (`vocab`: a history
    shared with another vocabulary), both left out by the core with their descendants.
    `cut(scores, parents, matched)` of the drafted nodes (root excluded) gives how many of
    them to keep (the sizer's choice, `lookahead.sizing`; 0: the root alone; None: all).
    `new_tokens`: the last step's tokens, added to `rid`'s context in the same call as the
    draft (`LookaheadCache.step`); None: the caller added them."""
    if budget <= 0 or room <= 0:  # plain decoding through the same path
        if new_tokens is not None:
            cache.extend(rid, new_tokens)
        return Proposal(np.array([root], dtype=np.int64), ROOT_PARENTS, None, None, 0)
    if new_tokens is None:
        d = cache.draft(rid, budget, multi_branch, vocab=vocab, max_depth=room)
    else:
        d = cache.step(rid, new_tokens, budget, multi_branch, vocab=vocab, max_depth=room)
    tokens, parents, scores, matched = d.tokens, d.parents, d.scores, d.matched
    if len(tokens) <= 1:
        return Proposal(tokens, parents, scores, None, 0)
    # Best-first order: every prefix is a tree, and the likeliest one.
    drafted = (tokens, parents, scores, matched)
    k = len(tokens) - 1 if cut is None else int(cut(scores[1:], parents[1:], matched[1:]))
    tokens, parents, scores = (x[: k + 1] for x in drafted[:3])
    return Proposal(tokens, parents, scores, drafted, int(k == 0))
