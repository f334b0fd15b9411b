"""`sgl_kernel.speculative` of the test stand-in: NGRAM's tree-mask reconstruction.

See the package docstring for what this replaces and why.
"""

from __future__ import annotations

import torch

from sgl_kernel import placeholder_getattr

__getattr__ = placeholder_getattr("sgl_kernel.speculative")


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM's verify metadata from its `[bs, n, n]` ancestor-or-self mask, with the
    contract written out in `sglang/kernels/ops/speculative/reconstruct_tree.py`: a node's
    position is its depth plus the verified length, its parent the deepest strict ancestor,
    `next_token` its first child, `next_sibling` the next node with the same parent
    (-1 for none, and for the root)."""
    n = draft_token_num
    m = tree_mask.reshape(batch_size, n, n).to(torch.bool)
    lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
    anc = m & lower  # anc[b, i, j]: j is a strict ancestor of i
    col = torch.arange(n)
    depth = anc.sum(-1)
    positions.view(batch_size, n).copy_(depth + verified_seq_len.view(-1, 1).to(depth.dtype))
    retrive_index.view(batch_size, n).copy_(
        torch.arange(batch_size * n, dtype=torch.int64).view(batch_size, n)
    )
    parent = torch.where(anc, col, torch.full_like(col, -1)).amax(-1)  # [bs, n]
    row = col.view(n, 1).expand(n, n)
    # first child of t: smallest k with anc[k, t] (k > t by construction)
    child = torch.where(anc, row, torch.full_like(row, n)).amin(-2)
    retrive_next_token.view(batch_size, n).copy_(torch.where(child < n, child, -1))
    same = (parent.unsqueeze(-1) == parent.unsqueeze(-2)) & (row > row.T)  # [b, k, t]
    sib = torch.where(same, row, torch.full_like(row, n)).amin(-2)
    retrive_next_sibling.view(batch_size, n).copy_(torch.where((parent >= 0) & (sib < n), sib, -1))
