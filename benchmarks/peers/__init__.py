"""Drafters the acceptance simulator compares: ours and the peers, behind one small protocol.

Every drafter is driven the way its real integration drives it (see each module's docstring):
`start_request` at request start (after the prefill), `draft` once per verify step, `extend`
with the tokens the step verified (accepted + bonus), `finish_request` at the end. A drafter
returns a tree over the *draft* nodes only: `parents[i] == -1` means a child of the root (the
last verified token); a chain is a tree whose node `i` has parent `i - 1`.

Peer modules import their package lazily, so `import benchmarks.peers` needs none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Drafter(Protocol):
    """What the simulator calls; one instance serves all requests for one draft budget."""

    name: str

    def start_request(self, rid: int, prompt: np.ndarray) -> None:
        """A request starts; `prompt` is int32. Drafters that index prompts do it here."""

    def draft(self, rid: int, context: np.ndarray, budget: int) -> tuple[list[int], list[int]]:
        """`(tokens, parents)` of at most `budget` nodes; `context` = prompt + verified output."""

    def extend(self, rid: int, context: np.ndarray, new_tokens: np.ndarray) -> None:
        """`new_tokens` were verified; `context` is the context before them."""

    def finish_request(self, rid: int) -> None:
        """The request ended."""


def chain(tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """A single-branch draft as a tree."""
    toks = [int(t) for t in tokens]
    return toks, list(range(-1, len(toks) - 1))


def accepted_length(tokens: Sequence[int], parents: Sequence[int], truth: Sequence[int]) -> int:
    """Longest root-to-node path whose tokens equal a prefix of `truth` (greedy verification).

    Raises ValueError on a malformed tree (a parent not before its child).
    """
    children: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        if not -1 <= par < i:
            raise ValueError(f"draft node {i} has parent {par}: parents must come first")
        children.setdefault(int(par), []).append(i)
    # All nodes matching truth[:n]; duplicate siblings (SGLang pads with token-0 leaves) are
    # followed together, so the result is the best any verifier could accept.
    frontier, n = [-1], 0
    while n < len(truth) and frontier:
        want = int(truth[n])
        frontier = [c for f in frontier for c in children.get(f, ()) if int(tokens[c]) == want]
        if frontier:
            n += 1
    return n


def check_tree(name: str, tokens: Sequence[int], parents: Sequence[int], budget: int) -> None:
    """Raise AssertionError if a drafter broke the contract (size or shape)."""
    if len(tokens) != len(parents):
        raise AssertionError(f"{name}: {len(tokens)} tokens but {len(parents)} parents")
    if len(tokens) > budget:
        raise AssertionError(f"{name}: drafted {len(tokens)} nodes > budget {budget}")


def trie_rows(texts, stream, args) -> list[dict]:
    """Peers' host-cost rows for `python -m benchmarks trie --peers` (see `peers/hostcost.py`)."""
    from benchmarks.peers.hostcost import trie_rows as rows

    return rows(texts, stream, args)
