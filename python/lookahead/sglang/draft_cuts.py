"""What each request's draft keeps before the verify: its own limit, and what its grammar allows.

`cut_drafts` runs once per decode step on the batch's `BatchDraft` (NGRAM's padding: every
row `N` wide, unused columns token-0 children of the root), in place, before the width of a
CPU step is chosen, so rows a request cannot use are not paid for:

- a request's `custom_params["lookahead"]` (`lookahead.sglang.request_control`): switched
  off, its tree is the root alone; with a `budget`, its best `budget` nodes (drafts are
  best-first with parents first, so every prefix is a tree);
- a request with a grammar (JSON schema, regex, EBNF) whose matcher is on the host (SGLang's
  xgrammar backend): the nodes its grammar forbids are pruned with their subtrees, walked
  depth-first with the matcher's `accept_token` / `rollback(1)`, as SGLang's own
  `traverse_tree` walks the tree to build the verify's vocabulary mask. That mask still
  applies to every row verified (so nothing here decides an output); a grammar already
  terminated drafts nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from lookahead.sglang.request_control import control_of

__all__ = ["cut_drafts", "grammar_keeps"]

logger = logging.getLogger(__name__)


def _children(parents: np.ndarray, n: int) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        kids[int(parents[i])].append(i)
    return kids


def grammar_keeps(tokens: np.ndarray, parents: np.ndarray, n: int, matcher: Any, vocab: int):
    """The nodes of a tree (`n` nodes, node 0 the root) whose path the grammar accepts, in
    their order; the matcher is left as it was found. None where it keeps every node."""
    if matcher.is_terminated():
        return [0]
    kids = _children(parents, n)
    keep = [0]
    stack: list[tuple[int, int]] = [(0, 0)]  # (node, next child to try); depth = len - 1
    try:
        while stack:
            node, k = stack[-1]
            if k == len(kids[node]):
                stack.pop()
                if node != 0:
                    matcher.rollback(1)
                continue
            stack[-1] = (node, k + 1)
            child = kids[node][k]
            tok = int(tokens[child])
            if 0 <= tok < vocab and not matcher.is_terminated() and matcher.accept_token(tok):
                keep.append(child)
                stack.append((child, 0))
    finally:
        if len(stack) > 1:  # an exception mid-walk: the matcher back where it was found
            matcher.rollback(len(stack) - 1)
    if len(keep) == n:
        return None
    keep.sort()
    return keep


def _compact(bd: Any, row: int, keep: list[int]) -> None:
    """Row `row` holds only the nodes `keep` (sorted, 0 first; parents among them)."""
    n = int(bd.num_nodes[row])
    tokens, parents, scores, matched = (
        bd.tokens[row],
        bd.parents[row],
        bd.scores[row],
        bd.matched[row],
    )
    where = np.full(n, -1, dtype=np.int64)
    where[keep] = np.arange(len(keep))
    idx = np.asarray(keep, dtype=np.int64)
    new_parents = where[parents[idx].astype(np.int64)]
    new_parents[0] = parents[0]
    tokens[: len(keep)] = tokens[idx]
    scores[: len(keep)] = scores[idx]
    matched[: len(keep)] = matched[idx]
    parents[: len(keep)] = new_parents
    _pad(bd, row, len(keep))


def _pad(bd: Any, row: int, n: int) -> None:
    """Columns from `n` on become padding (token 0, a child of the root, score 0)."""
    bd.tokens[row, n:] = 0
    bd.parents[row, n:] = 0
    bd.scores[row, n:] = 0
    bd.matched[row, n:] = 0
    bd.num_nodes[row] = n


def _matcher_of(req: Any) -> tuple[Any, int] | None:
    grammar = getattr(req, "grammar", None)
    matcher = getattr(grammar, "matcher", None)
    if matcher is None or not hasattr(matcher, "rollback"):
        return None  # no grammar, or one whose state is not a host matcher
    return matcher, int(getattr(grammar, "vocab_size", 1 << 31))


def cut_drafts(bd: Any, reqs: Any, width: int) -> int:
    """Applies every request's limit and grammar to its row of `bd`; returns the nodes cut."""
    cut = 0
    for row, req in enumerate(reqs):
        n = int(bd.num_nodes[row])
        if n <= 1:
            continue
        limit = control_of(req, width).limit(n)
        if limit < n:
            _pad(bd, row, limit)
            cut += n - limit
            n = limit
        found = _matcher_of(req) if n > 1 else None
        if found is not None:
            try:
                keep = grammar_keeps(bd.tokens[row], bd.parents[row], n, *found)
            except Exception:  # the row goes unpruned: the verify's mask still applies
                logger.exception(
                    "lookahead: grammar pruning failed for %r", getattr(req, "rid", row)
                )
                keep = None
            if keep is not None:
                _compact(bd, row, keep)
                cut += n - len(keep)
    return cut
