"""The llama.cpp engine's tree batch, greedy walk and KV fix-up, without llama.cpp."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead import kernels
from lookahead.llamacpp.tree import SequenceBook, branches, greedy_path, tree_batch

# root 0; 1, 2 under it; 3 under 1; 4, 5 under 3; 6 under 2
PARENTS = [-1, 0, 0, 1, 3, 3, 2]
TOKENS = [10, 11, 12, 13, 14, 15, 16]


def test_each_node_is_in_the_branches_below_it_at_its_depth():
    toks, pos, seqs = tree_batch(TOKENS, PARENTS, n_past=100, n_seqs=5)
    assert toks == TOKENS
    assert pos == [100, 101, 101, 102, 103, 103, 102]
    # leaves in node order: 4, 5, 6 are branches 0, 1, 2
    assert seqs == [[0, 1, 2], [0, 1], [2], [0, 1], [0], [1], [2]]


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
    n_seq_max = 4

    def __init__(self):
        self.calls = []

    def seq_rm(self, *a):
        self.calls.append(("rm", *a))

    def seq_cp(self, *a):
        self.calls.append(("cp", *a))


def test_sequences_are_brought_up_to_date_only_when_a_tree_uses_them():
    m = Recorder()
    book = SequenceBook(m)
    book.reset(100)  # the prompt in sequence 0
    book.ready(3, 100)
    assert m.calls == [("cp", 0, 1, 0, 100), ("cp", 0, 2, 0, 100)]
    seqs = tree_batch(TOKENS, PARENTS, 100, 4)[2]
    assert seqs[0] == [0, 1, 2]  # the root in its branches' sequences only
    m.calls.clear()
    # node 3's first leaf is 4: branch 0 keeps the path; the others keep the root only
    book.keep(seqs, [0, 1, 3], n_past=100)
    assert m.calls == [("rm", 1, 101, -1), ("rm", 2, 101, -1), ("rm", 0, 103, -1)]
    assert book.valid == [103, 101, 101, 0]
    m.calls.clear()
    book.ready(2, 103)  # a narrower tree: sequence 2 stays behind
    assert m.calls == [("cp", 0, 1, 101, 103)] and book.valid == [103, 103, 101, 0]
    m.calls.clear()
    # path 0, 2, 6 ends on branch 2: sequence 0 copies the path from it
    book.keep(tree_batch(TOKENS, PARENTS, 103, 4)[2], [0, 2, 6], n_past=103)
    assert m.calls == [("rm", 0, 104, -1), ("rm", 1, 104, -1), ("rm", 2, 106, -1),
                       ("cp", 2, 0, 104, 106)]  # fmt: skip
    assert book.valid == [106, 104, 106, 0]
    m.calls.clear()
    book.keep([[0]], [0], n_past=106)  # the root alone: nothing to drop
    assert m.calls == [] and book.valid[0] == 107
