"""The draft-tree types the cache returns: one request's `Draft` (node 0 the root, the last
verified token) and a batch's `BatchDraft`, padded per request (docs/interfaces.md)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lookahead import _core

__all__ = ["BatchDraft", "Draft"]

# A native class (`_core.Draft`): made for every draft, it must cost far less than the draft.
Draft = _core.Draft


class BatchDraft(NamedTuple):
    """Draft trees of B requests padded to width W (default `budget + 1`): `tokens`, `parents`
    int32 [B, W], `scores` float32 [B, W], `num_nodes` int32 [B], `matched` uint8 [B, W] (as
    `Draft.matched`). Columns `>= num_nodes[b]` hold 0 and `parents = pad_parent` (-1 by
    default; 0 makes them children of the root, as SGLang's NGRAM pads). A named tuple: made on
    every batch, it costs a fraction of a frozen dataclass."""

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    num_nodes: np.ndarray
    matched: np.ndarray

    def row(self, b: int) -> Draft:
        """The draft of request `b` without padding."""
        n = int(self.num_nodes[b])
        t, p, s, m = (a[b, :n] for a in (self.tokens, self.parents, self.scores, self.matched))
        return Draft(t, p, s, n, m)
