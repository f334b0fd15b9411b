"""Tree metadata: ancestor-or-self mask, depth, positions and SGLang's traversal arrays.

One program per tree. A node's parent is used only when the node is real (index in
`[1, num_nodes)`) and the parent index lies in `[0, i)`; anything else counts as "no
parent", so bad input can never make the kernel read out of bounds (the dispatcher's
checks reject such input before it gets here; see `_checks.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.kernels._jit import check_launchable, lazy_jit, next_pow2
from lookahead.kernels._types import TreeMetadata

tl: Any = None  # bound to triton.language on the first launch (see _jit.py)


@lazy_jit
def _tree_metadata_kernel(
    parents_ptr,
    num_nodes_ptr,
    seq_lens_ptr,
    mask_ptr,
    positions_ptr,
    depth_ptr,
    ret_index_ptr,
    ret_next_token_ptr,
    ret_next_sibling_ptr,
    W,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.arange(0, BLOCK_W)
    n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), W).to(tl.int32)  # clamp, then narrow
    base = b.to(tl.int64) * W
    real = row < n

    # Range-checked in the stored dtype: an int64 parent must not wrap into [0, i).
    par = tl.load(parents_ptr + base + row, mask=real & (row >= 1), other=-1)
    par = tl.where((par >= 0) & (par < row), par, -1).to(tl.int32)

    # Ancestor-or-self rows: climb from every node at once, one level per step.
    anc = row[:, None] == row[None, :]
    depth = tl.zeros([BLOCK_W], dtype=tl.int32)
    cur = par
    for _ in range(1, W):
        anc = anc | (row[None, :] == cur[:, None])
        depth += (cur >= 0).to(tl.int32)
        nxt = tl.load(parents_ptr + base + cur, mask=cur >= 1, other=-1)
        cur = tl.where((cur >= 1) & (nxt >= 0) & (nxt < cur), nxt, -1).to(tl.int32)

    in_w = row < W
    tile = in_w[:, None] & in_w[None, :]
    mask_offs = base * W + row[:, None] * W + row[None, :]
    tl.store(mask_ptr + mask_offs, anc.to(tl.int8), mask=tile)

    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    tl.store(positions_ptr + base + row, seq_len + depth.to(tl.int64), mask=in_w)
    tl.store(depth_ptr + base + row, depth, mask=in_w)
    ret_index = tl.where(real, (base + row).to(tl.int32), -1)
    tl.store(ret_index_ptr + base + row, ret_index, mask=in_w)

    # child[i, j]: i is a child of j.  First child of j = lowest such i.
    big = BLOCK_W
    is_child = par[:, None] == row[None, :]
    first_child = tl.min(tl.where(is_child, row[:, None], big), axis=0)
    first_child = tl.where(first_child < big, first_child, -1)
    tl.store(ret_next_token_ptr + base + row, first_child, mask=in_w)

    # sib[i, k]: k > i has the same parent as i.  Next sibling of i = lowest such k.
    is_sib = (par[:, None] == par[None, :]) & (par[:, None] >= 0) & (row[None, :] > row[:, None])
    next_sib = tl.min(tl.where(is_sib, row[None, :], big), axis=1)
    next_sib = tl.where(next_sib < big, next_sib, -1)
    tl.store(ret_next_sibling_ptr + base + row, next_sib, mask=in_w)


def tree_metadata_triton(
    parents: torch.Tensor, num_nodes: torch.Tensor, seq_lens: torch.Tensor
) -> TreeMetadata:
    """Triton launcher of `tree_metadata` (inputs already checked; CUDA, or CPU when interpreting)."""
    check_launchable(parents, num_nodes, seq_lens)
    B, W = parents.shape
    dev = parents.device
    out = TreeMetadata(
        mask=torch.empty((B, W, W), dtype=torch.bool, device=dev),
        positions=torch.empty((B, W), dtype=torch.int64, device=dev),
        depth=torch.empty((B, W), dtype=torch.int32, device=dev),
        retrieve_index=torch.empty((B, W), dtype=torch.int32, device=dev),
        retrieve_next_token=torch.empty((B, W), dtype=torch.int32, device=dev),
        retrieve_next_sibling=torch.empty((B, W), dtype=torch.int32, device=dev),
    )
    if B == 0:
        return out
    _tree_metadata_kernel[(B,)](
        parents.contiguous(),
        num_nodes.contiguous(),
        seq_lens.contiguous(),
        out.mask.view(torch.int8),
        out.positions,
        out.depth,
        out.retrieve_index,
        out.retrieve_next_token,
        out.retrieve_next_sibling,
        W,
        BLOCK_W=next_pow2(W),
        num_warps=1 if W <= 16 else 4,
    )
    return out


def tree_metadata_ref(
    parents: torch.Tensor, num_nodes: torch.Tensor, seq_lens: torch.Tensor
) -> TreeMetadata:
    """Torch reference of `tree_metadata`.

    With `real[b, i] = i < num_nodes[b]` and `p(i)` the parent of a real node `i >= 1`:
      mask[b, i, j]   = j == i, or (i real and j is reached from i by following p),
                        the reflexive-transitive closure of the parent relation
      depth[b, i]     = number of strict ancestors of i (0 for the root and for padding)
      positions[b, i] = seq_lens[b] + depth[b, i]
      retrieve_index[b, i]        = b * W + i if real else -1
      retrieve_next_token[b, i]   = min{k : p(k) == i}, or -1
      retrieve_next_sibling[b, i] = min{k > i : p(k) == p(i)}, or -1 (the root has none)
    """
    B, W = parents.shape
    dev = parents.device
    idx = torch.arange(W, device=dev)
    real = idx[None, :] < num_nodes.long().clamp(1, W)[:, None]
    par = parents.long()
    par = torch.where(real & (idx >= 1) & (par >= 0) & (par < idx), par, -1)

    # Pointer doubling: `mask` holds the ancestors at distance < 2^k (and the node itself),
    # `jump` the 2^k-th ancestor; merging the rows of `jump` doubles k. Fixed shape, no
    # BLAS; log2(W) rounds at most, and on CPU it stops once no jump is left.
    is_child = par[:, :, None] == idx  # [b, i, j]: j is the parent of i
    mask = is_child | (idx[:, None] == idx)
    jump = torch.where(par >= 0, par.gather(1, par.clamp(min=0)), -1)
    for _ in range(max(W - 1, 1).bit_length() - 1):
        has = jump >= 0
        if dev.type == "cpu" and not bool(has.any()):
            break
        j = jump.clamp(min=0)
        mask = mask | (mask.gather(1, j[:, :, None].expand(B, W, W)) & has[:, :, None])
        jump = torch.where(has, jump.gather(1, j), -1)
    depth = (mask.sum(-1) - 1).to(torch.int32)

    retrieve_index = torch.where(real, torch.arange(B * W, device=dev).view(B, W), -1)
    first_child = torch.where(is_child, idx[None, :, None], W).amin(dim=1)
    is_sib = (
        (par[:, :, None] == par[:, None, :])
        & (par >= 0)[:, :, None]
        & (idx[None, :] > idx[:, None])
    )
    next_sib = torch.where(is_sib, idx[None, None, :], W).amin(dim=2)
    return TreeMetadata(
        mask=mask,
        positions=seq_lens.long()[:, None] + depth.long(),
        depth=depth,
        retrieve_index=retrieve_index.to(torch.int32),
        retrieve_next_token=torch.where(first_child < W, first_child, -1).to(torch.int32),
        retrieve_next_sibling=torch.where(next_sib < W, next_sib, -1).to(torch.int32),
    )
