"""Draft proposal: the cache's best-first tree for this step, pruned to what the model can
embed and the output has room for, then cut to the prefix the sizer says pays for its rows."""

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


def prune(tokens, parents, scores, matched, vocab: int, depth: int):
    """The draft without its nodes whose ids the model does not have (a history shared with
    another vocabulary) or that lie deeper than `depth` below the root, nor their
    descendants; parents renumbered."""
    ids = tokens.view(np.uint32)
    keep, new_index, level = [0], {0: 0}, {0: 0}
    for i in range(1, len(tokens)):
        p = int(parents[i])
        if ids[i] < vocab and p in new_index and level[p] < depth:
            new_index[i], level[i] = len(keep), level[p] + 1
            keep.append(i)
    new_parents = np.array([-1] + [new_index[int(parents[i])] for i in keep[1:]], np.int32)
    return tokens[keep], new_parents, scores[keep], matched[keep]


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
) -> Proposal:
    """This step's tree: up to `budget` drafted nodes, none deeper than `room` (the draft
    tokens the output still has room for). `cut(scores, parents, matched)` of the drafted
    nodes (root excluded) gives how many of them to keep (the sizer's choice, `lookahead.sizing`; 0: the
    root alone; None: all)."""
    if budget <= 0 or room <= 0:  # plain decoding through the same path
        return Proposal(np.array([root], dtype=np.int64), ROOT_PARENTS, None, None, 0)
    d = cache.draft(rid, budget=budget, multi_branch=multi_branch)
    tokens, parents, scores, matched = d.tokens, d.parents, d.scores, d.matched
    if len(tokens) > 1 and (room < budget or int(tokens.view(np.uint32)[1:].max()) >= vocab):
        # Nodes deeper than `room` would be verified for nothing.
        tokens, parents, scores, matched = prune(tokens, parents, scores, matched, vocab, room)
    if len(tokens) <= 1:
        return Proposal(tokens, parents, scores, None, 0)
    # Best-first order: every prefix is a tree, and the likeliest one.
    drafted = (tokens, parents, scores, matched)
    k = len(tokens) - 1 if cut is None else int(cut(scores[1:], parents[1:], matched[1:]))
    tokens, parents, scores = (x[: k + 1] for x in drafted[:3])
    return Proposal(tokens, parents, scores, drafted, int(k == 0))
