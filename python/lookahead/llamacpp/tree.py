"""A draft tree in one llama.cpp forward, and the KV cache after its verdict.

A tree (`tokens`, `parents`, node 0 the root: the last verified token, not yet in the
cache) becomes one batch: node i at position `n_past + depth(i)`, in the sequences of the
branches through it (branch b, sequence b: the path from the root to leaf b), the root in
every branch's. llama.cpp masks a token's attention to the cells of its first sequence at
positions up to its own, so each node sees the context and its own ancestors only: the tree
mask, with no mask of our own (as SpecInfer's tree attention, and llama.cpp's `llama_batch`
documentation of several sequence ids per token).

Sequence 0 always holds the whole verified context; another sequence holds it up to where
`SequenceBook` says, and is brought up to date (one `seq_cp` from sequence 0) only when a
tree has that many branches. After the verdict only the accepted path stays: each branch's
cells past the root go, but the accepted branch's up to its deepest accepted node, which
sequence 0 then copies. A step thus costs about two calls per branch verified, each a pass
over the context's cells, instead of a pass per sequence of the context.
"""

from __future__ import annotations

import numpy as np


def branches(parents) -> tuple[list[int], list[int]]:
    """Each node's depth, and each node's branch list index: the leaves in node order; a
    node belongs to the branches of every leaf below it."""
    n = len(parents)
    depth = [0] * n
    has_child = [False] * n
    for i in range(1, n):
        p = int(parents[i])
        if not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a node's parent must come before it")
        depth[i] = depth[p] + 1
        has_child[p] = True
    leaves = [i for i in range(n) if not has_child[i]]
    return depth, leaves


def tree_batch(tokens, parents, n_past: int, n_seqs: int):
    """(tokens, positions, seqs) of the forward that verifies the tree (the root in every
    branch's sequence), or ValueError if it has more branches than `n_seqs`."""
    if len(tokens) == 1:  # the root alone (most steps): no walk
        return [int(tokens[0])], [n_past], [[0]]
    depth, leaves = branches(parents)
    if len(leaves) > n_seqs:
        raise ValueError(f"a tree of {len(leaves)} branches needs {len(leaves)} sequences, "
                         f"the context has {n_seqs}")  # fmt: skip
    seqs: list[list[int]] = [[] for _ in tokens]
    for b, leaf in enumerate(leaves):
        i = leaf
        while i > 0:
            seqs[i].append(b)
            i = int(parents[i])
    seqs[0] = list(range(len(leaves)))
    for s in seqs[1:]:
        s.sort()
    positions = [n_past + d for d in depth]
    return [int(t) for t in tokens], positions, seqs


def greedy_path(tokens, parents, argmax) -> tuple[list[int], int]:
    """The accepted path (node indices from the root) and the bonus token: from the root,
    the child whose token is the target's argmax at its parent, while there is one (of twin
    children, the first), as `lookahead.kernels.verify_greedy` walks it."""
    if len(tokens) == 1:  # the root alone (most steps): no walk
        return [0], int(argmax[0])
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(int(parents[i]), {}).setdefault(int(tokens[i]), i)
    path = [0]
    while True:
        nxt = children.get(path[-1], {}).get(int(argmax[path[-1]]))
        if nxt is None:
            return path, int(argmax[path[-1]])
        path.append(nxt)


class SequenceBook:
    """How far each KV sequence of `model` holds the verified context (sequence 0: all of
    it), and the fix-ups that keep it so (`ready` before a tree's forward, `keep` after)."""

    def __init__(self, model):
        self.model = model
        self.valid = [0] * model.n_seq_max

    def reset(self, n_past: int) -> None:
        """The context of `n_past` tokens was just fed to sequence 0 alone."""
        self.valid = [0] * self.model.n_seq_max
        self.valid[0] = n_past

    def ready(self, n_branches: int, n_past: int) -> None:
        """Sequences 0..n_branches-1 hold the context of `n_past` tokens."""
        for s in range(1, n_branches):
            if self.valid[s] < n_past:
                self.model.seq_cp(0, s, self.valid[s], n_past)
                self.valid[s] = n_past

    def keep(self, seqs, path: list[int], n_past: int) -> None:
        """After the forward of a tree (`seqs`: its batch's, from `tree_batch`, the root at
        `n_past`): sequence 0 and the accepted branch hold the context, the root and the
        accepted path; every other branch the context and the root."""
        n_branches = len(seqs[0])
        end = n_past + len(path)  # positions n_past .. end-1: the root and the accepted nodes
        b = seqs[path[-1]][0]  # a branch through the deepest accepted node
        m = self.model
        for s in range(n_branches):
            if s != b:
                if n_branches > 1:
                    m.seq_rm(s, n_past + 1, -1)
                self.valid[s] = n_past + 1
        if len(path) < len(seqs):  # else every node was accepted: a chain, nothing past it
            m.seq_rm(b, end, -1)
        self.valid[b] = end
        if b != 0:
            m.seq_cp(b, 0, n_past + 1, end)
            self.valid[0] = end


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """The target's greedy token at each row (ties: the lowest id, as numpy's argmax)."""
    return logits.argmax(axis=1)  # the method: numpy's function wraps it in two more calls
