"""verify_greedy: Triton kernel == torch reference; the reference walks the tree as
specified (maximal agreeing path, first child on duplicate tokens)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_trees import assert_same, on_device, tree_batches
from lookahead.kernels import verify_greedy
from lookahead.kernels.verify_greedy import verify_greedy_ref, verify_greedy_triton

triton = pytest.importorskip("triton")
verify_greedy_triton = on_device(verify_greedy_triton)


@st.composite
def greedy_cases(draw):
    tokens, parents, num_nodes, seq_lens = draw(tree_batches(max_b=4, max_w=17, vocab=3))
    B, W = tokens.shape
    # Targets from the same small alphabet so that long accepted paths are common.
    target = torch.tensor(
        [[draw(st.integers(0, 2)) for _ in range(W)] for _ in range(B)], dtype=torch.int64
    ).reshape(B, W)
    return tokens, parents, num_nodes, target


@settings(max_examples=60, deadline=None)
@given(case=greedy_cases())
def test_triton_matches_reference(case):
    ref = verify_greedy_ref(*case)
    assert_same(ref, verify_greedy_triton(*case), "verify_greedy")


@settings(max_examples=60, deadline=None)
@given(case=greedy_cases())
def test_reference_path_is_maximal_and_agrees(case):
    tokens, parents, num_nodes, target = case
    res = verify_greedy(tokens, parents, num_nodes, target)
    for b in range(tokens.shape[0]):
        n, k = int(num_nodes[b]), int(res.num_accepted[b])
        path = res.accepted_nodes[b, : k + 1].tolist()
        assert path[0] == 0 and all(v == -1 for v in res.accepted_nodes[b, k + 1 :].tolist())
        for prev, node in zip(path, path[1:]):
            assert node < n and int(parents[b, node]) == prev
            assert int(tokens[b, node]) == int(target[b, prev])
            # the first (lowest-index) agreeing child is the one taken
            rivals = [
                c for c in range(1, n) if parents[b, c] == prev and tokens[b, c] == tokens[b, node]
            ]
            assert node == min(rivals)
        last = path[-1]
        kids = [c for c in range(1, n) if int(parents[b, c]) == last]
        assert all(int(tokens[b, c]) != int(target[b, last]) for c in kids)  # maximal
        assert int(res.bonus[b]) == int(target[b, last])


def test_by_hand_duplicate_siblings_and_padding():
    # 0 -> {1: 5, 2: 5 (duplicate), 3: 7}; 2 -> {4: 9}; node 5 is padding with token 5.
    tokens = torch.tensor([[1, 5, 5, 7, 9, 5]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 0, 2, -1]], dtype=torch.int32)
    num_nodes = torch.tensor([5], dtype=torch.int32)
    target = torch.tensor([[5, 8, 9, 0, 4, 5]])
    for fn in (verify_greedy, verify_greedy_triton):
        res = fn(tokens, parents, num_nodes, target)
        # root's choice 5 matches nodes 1 and 2: node 1 (lowest index) is taken, then
        # node 1 has no children: bonus = target[1] = 8. Node 2's subtree is never tried.
        assert res.accepted_nodes.tolist() == [[0, 1, -1, -1, -1, -1]]
        assert res.num_accepted.tolist() == [1] and res.bonus.tolist() == [8]
        assert res.accepted_nodes.dtype == torch.int32 and res.bonus.dtype == torch.int64


def test_full_chain_accepts_everything():
    W = 9
    tokens = torch.arange(W, dtype=torch.int32)[None]
    parents = (torch.arange(W, dtype=torch.int32) - 1)[None]
    target = torch.arange(1, W + 1)[None]  # the target agrees with every draft token
    for fn in (verify_greedy, verify_greedy_triton):
        res = fn(tokens, parents, torch.tensor([W], dtype=torch.int32), target)
        assert res.accepted_nodes.tolist() == [list(range(W))]
        assert res.num_accepted.tolist() == [W - 1] and res.bonus.tolist() == [W]


def test_unvalidated_counts_and_parents_walk_alike_in_kernel_and_reference():
    tokens = torch.tensor([[5, 7, 9], [5, 7, 9]])
    parents = torch.tensor([[-1, 0, 2**32], [-1, 0, 1]], dtype=torch.int64)
    choice = torch.tensor([[7, 9, 3], [7, 9, 3]])
    for n in (torch.tensor([3, 0]), torch.tensor([2**32 + 1, 2**32 + 1])):
        assert_same(
            verify_greedy_ref(tokens, parents, n, choice),
            verify_greedy_triton(tokens, parents, n, choice),
            "verify_greedy",
        )
