"""A draft tree in one llama.cpp forward, and the KV cache after its verdict.

The verified context sits in every KV sequence 0..S-1. A tree (`tokens`, `parents`, node 0
the root: the last verified token, not yet in the cache) becomes one batch: node i at
position `n_past + depth(i)`, in the sequences of the branches through it (branch b: the
path from the root to leaf b), the root in all S. llama.cpp masks a token's attention to the
cells of its first sequence at positions up to its own, so each node sees the context and
its own ancestors only: the tree mask, with no mask of our own (as SpecInfer's tree
attention, and llama.cpp's `llama_batch` documentation of several sequence ids per token).

After the verdict, only the accepted path stays: its branch's cells past the path go, every
other branch's cells go (`seq_keep`), and the path is copied to every sequence again.
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
    """(tokens, positions, seqs) of the forward that verifies the tree, or ValueError if it
    has more branches than `n_seqs`."""
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
    seqs[0] = list(range(n_seqs))
    for s in seqs[1:]:
        s.sort()
    positions = [n_past + d for d in depth]
    return [int(t) for t in tokens], positions, seqs


def greedy_path(tokens, parents, argmax) -> tuple[list[int], int]:
    """The accepted path (node indices from the root) and the bonus token: from the root,
    the child whose token is the target's argmax at its parent, while there is one (of twin
    children, the first), as `lookahead.kernels.verify_greedy` walks it."""
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(int(parents[i]), {}).setdefault(int(tokens[i]), i)
    path = [0]
    while True:
        nxt = children.get(path[-1], {}).get(int(argmax[path[-1]]))
        if nxt is None:
            return path, int(argmax[path[-1]])
        path.append(nxt)


def keep_path(model, seqs, path: list[int], n_past: int, n_seqs: int) -> None:
    """Leaves in the KV cache the context, the root (at `n_past`) and the accepted path, in
    every sequence; drops the rest of the tree (`seqs`: the batch's, from `tree_batch`)."""
    if len(seqs) == 1:
        return  # the root alone: already in every sequence
    b = seqs[path[-1]][0]  # a branch through the deepest accepted node
    end = n_past + len(path)  # positions n_past .. end-1: the root and the accepted nodes
    model.seq_rm(b, end, -1)
    model.seq_keep(b)
    for s in range(n_seqs):
        if s != b:
            model.seq_cp(b, s, -1, -1)


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """The target's greedy token at each row (ties: the lowest id, as numpy's argmax)."""
    return np.argmax(logits, axis=1)
