"""tree_metadata: Triton kernel == torch reference; the reference matches hand-computed
values and SGLang's own definition of the traversal arrays."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from kernel_trees import assert_same, on_device, tree_batches
from lookahead.kernels import tree_metadata
from lookahead.kernels.tree_mask import tree_metadata_ref, tree_metadata_triton

triton = pytest.importorskip("triton")
tree_metadata_triton = on_device(tree_metadata_triton)


@settings(max_examples=60, deadline=None)
@given(batch=tree_batches(max_b=4, max_w=17))
def test_triton_matches_reference(batch):
    _, parents, num_nodes, seq_lens = batch
    ref = tree_metadata_ref(parents, num_nodes, seq_lens)
    assert_same(ref, tree_metadata_triton(parents, num_nodes, seq_lens), "tree_metadata")


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_triton_index_dtypes(idx_dtype):
    parents = torch.tensor([[-1, 0, 0, 1, 3, -1], [-1, 0, 1, 2, 3, 4]], dtype=idx_dtype)
    num_nodes = torch.tensor([5, 6], dtype=idx_dtype)
    seq_lens = torch.tensor([7, 0], dtype=idx_dtype)
    ref = tree_metadata_ref(parents, num_nodes, seq_lens)
    assert_same(ref, tree_metadata_triton(parents, num_nodes, seq_lens), "tree_metadata")


def test_reference_by_hand():
    # 0 -> {1, 2}, 1 -> {3, 4}, 4 -> {5}; node 6 is padding.
    parents = torch.tensor([[-1, 0, 0, 1, 1, 4, -1]], dtype=torch.int32)
    meta = tree_metadata(parents, torch.tensor([6], dtype=torch.int32), torch.tensor([10]))
    assert meta.depth.tolist() == [[0, 1, 1, 2, 2, 3, 0]]
    assert meta.positions.tolist() == [[10, 11, 11, 12, 12, 13, 10]]
    assert meta.retrieve_index.tolist() == [[0, 1, 2, 3, 4, 5, -1]]
    assert meta.retrieve_next_token.tolist() == [[1, 3, -1, -1, 5, -1, -1]]
    assert meta.retrieve_next_sibling.tolist() == [[-1, 2, -1, 4, -1, -1, -1]]
    ancestors = [[j for j in range(7) if meta.mask[0, i, j]] for i in range(7)]
    assert ancestors == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 1, 4, 5], [6]]
    assert meta.mask.dtype == torch.bool and meta.positions.dtype == torch.int64
    assert meta.depth.dtype == torch.int32 and meta.retrieve_index.dtype == torch.int32


def _sglang_reconstruct(mask: torch.Tensor, seq_lens: torch.Tensor):
    """SGLang's `reconstruct_indices_from_tree_mask` (sgl-kernel, ngram_utils.cu), restated
    per node from the flattened [B, W, W] tree mask: depth = number of set entries left of
    the diagonal; next token = the first later node whose row has this node set; next
    sibling = the first later node whose nearest ancestor is this node's parent."""
    B, W, _ = mask.shape
    pos = torch.empty(B, W, dtype=torch.int64)
    nxt = torch.full((B, W), -1, dtype=torch.int64)
    sib = torch.full((B, W), -1, dtype=torch.int64)
    for b in range(B):
        for t in range(W):
            anc = [i for i in range(t) if mask[b, t, i]]
            pos[b, t] = len(anc) + int(seq_lens[b])
            parent = anc[-1] if anc else -1
            nxt[b, t] = next((i for i in range(t + 1, W) if mask[b, i, t]), -1)
            if parent != -1:
                for i in range(t + 1, W):
                    if mask[b, i, parent] and not any(mask[b, i, parent + 1 : i]):
                        sib[b, t] = i
                        break
    return pos, nxt, sib


@settings(max_examples=40, deadline=None)
@given(batch=tree_batches(max_b=3, max_w=12))
def test_traversal_arrays_match_sglang_definition(batch):
    _, parents, num_nodes, seq_lens = batch
    B, W = parents.shape
    full = torch.full((B,), W, dtype=torch.int32)  # SGLang's trees are never padded
    fixed = parents.clone()
    for b in range(B):  # fill padding with a chain so that every column is a real node
        for i in range(int(num_nodes[b]), W):
            fixed[b, i] = i - 1 if i > 0 else -1
    meta = tree_metadata_ref(fixed, full, seq_lens)
    pos, nxt, sib = _sglang_reconstruct(meta.mask, seq_lens)
    assert meta.positions.tolist() == pos.tolist()
    assert meta.retrieve_next_token.tolist() == nxt.tolist()
    assert meta.retrieve_next_sibling.tolist() == sib.tolist()
    assert meta.retrieve_index.tolist() == torch.arange(B * W).view(B, W).tolist()


def test_unvalidated_counts_and_parents_read_alike_in_kernel_and_reference():
    # num_nodes 0 means the root alone on both sides; int64 values that would wrap in 32 bits
    # (2**32 + 1 nodes: clamped to W; a parent of 2**32: out of [0, i), so "no parent").
    parents = torch.tensor([[-1, 0, 2**32], [-1, 0, 1]], dtype=torch.int64)
    num_nodes = torch.tensor([3, 0], dtype=torch.int64)
    seq_lens = torch.tensor([4, 5])
    for n in (num_nodes, torch.tensor([2**32 + 1, 0])):
        assert_same(
            tree_metadata_ref(parents, n, seq_lens),
            tree_metadata_triton(parents, n, seq_lens),
            "tree_metadata",
        )
