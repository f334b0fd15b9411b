"""The llama.cpp engine's tree batch, greedy walk and KV fix-up, without llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead import kernels
from lookahead.llamacpp.tree import branches, greedy_path, keep_path, tree_batch

# root 0; 1, 2 under it; 3 under 1; 4, 5 under 3; 6 under 2
PARENTS = [-1, 0, 0, 1, 3, 3, 2]
TOKENS = [10, 11, 12, 13, 14, 15, 16]


def test_each_node_is_in_the_branches_below_it_at_its_depth():
    toks, pos, seqs = tree_batch(TOKENS, PARENTS, n_past=100, n_seqs=5)
    assert toks == TOKENS
    assert pos == [100, 101, 101, 102, 103, 103, 102]
    # leaves in node order: 4, 5, 6 are branches 0, 1, 2
    assert seqs == [[0, 1, 2, 3, 4], [0, 1], [2], [0, 1], [0], [1], [2]]


def test_a_tree_wider_than_the_sequences_is_refused():
    with pytest.raises(ValueError, match="3 branches"):
        tree_batch(TOKENS, PARENTS, 0, n_seqs=2)
    with pytest.raises(ValueError, match="parent"):
        branches([-1, 2, 0])


@st.composite
def trees(draw):
    n = draw(st.integers(1, 20))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = [draw(st.integers(0, 5)) for _ in range(n)]
    argmax = [draw(st.integers(0, 5)) for _ in range(n)]
    return tokens, parents, argmax


@settings(max_examples=300, deadline=None)
@given(trees())
def test_greedy_path_is_the_verify_reference(tree):
    tokens, parents, argmax = tree
    path, bonus = greedy_path(tokens, parents, argmax)
    ref = kernels.verify_greedy(
        torch.tensor([tokens]),
        torch.tensor([parents], dtype=torch.int32),
        torch.tensor([len(tokens)], dtype=torch.int32),
        torch.tensor([argmax]),
    )
    n = int(ref.num_accepted[0])
    assert path == [int(x) for x in ref.accepted_nodes[0][: n + 1]]
    assert bonus == int(ref.bonus[0])


class Recorder:
    def __init__(self):
        self.calls = []

    def seq_rm(self, *a):
        self.calls.append(("rm", *a))

    def seq_keep(self, *a):
        self.calls.append(("keep", *a))

    def seq_cp(self, *a):
        self.calls.append(("cp", *a))


def test_keep_path_keeps_the_accepted_branch_in_every_sequence():
    seqs = tree_batch(TOKENS, PARENTS, 100, 4)[2]
    m = Recorder()
    keep_path(m, seqs, [0, 1, 3], n_past=100, n_seqs=4)
    # node 3's first leaf is 4: branch 0; keep positions < 103 of it, drop the other branches
    assert m.calls == [("rm", 0, 103, -1), ("keep", 0), ("cp", 0, 1, -1, -1),
                       ("cp", 0, 2, -1, -1), ("cp", 0, 3, -1, -1)]  # fmt: skip
    m = Recorder()
    keep_path(m, tree_batch(TOKENS, PARENTS, 7, 3)[2], [0, 2, 6], n_past=7, n_seqs=3)
    assert m.calls[:2] == [("rm", 2, 10, -1), ("keep", 2)]
    m = Recorder()
    keep_path(m, [[0, 1, 2]], [0], n_past=7, n_seqs=3)
    assert m.calls == []


def test_greedy_path_stops_where_the_target_disagrees():
    argmax = np.array([11, 13, 99, 15, 0, 0, 0])
    assert greedy_path(TOKENS, PARENTS, argmax) == ([0, 1, 3, 5], 0)
    assert greedy_path(TOKENS, PARENTS, np.array([12, 0, 16, 0, 0, 0, 7])) == ([0, 2, 6], 7)
    assert greedy_path(TOKENS, PARENTS, np.array([42] * 7)) == ([0], 42)
