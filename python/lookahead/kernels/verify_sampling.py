"""Sampling tree verification, exact at any temperature.

Walk from the root; at each visited node draw ONE token from the target's distribution at
that node (inverse CDF with the node's own uniform); if a child carries that token (the
first such child), accept it and continue, else stop and emit the draw as the bonus. Every
emitted token is thus a fresh draw from the target's conditional distribution given the
accepted prefix, which is what plain sampling would produce: the output is exact. Drawing
per path (REST) instead gives a token that appears on several paths several chances, which
biases the output; `tests/kernels/test_sampling_exactness.py` shows the bias is detected.

GPU layout: the draw at node `i` depends only on `probs[b, i]` and `uniforms[b, i]`, never on
the walk, so the draws for all real nodes run in parallel (one program per node, block-wise
over the vocabulary: one pass computing per-block sums, then a cumulative sum inside the one
block where the CDF crosses `u * total`), and the walk is the greedy walk kernel with the
draws as the target's choices. Padding rows are never read.
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.kernels._jit import check_launchable, lazy_jit, next_pow2
from lookahead.kernels._types import VerifyResult
from lookahead.kernels.verify_greedy import tree_walk_ref, tree_walk_triton

tl: Any = None  # bound to triton.language on the first launch (see _jit.py)


@lazy_jit
def _draw_kernel(
    probs_ptr,
    uniforms_ptr,
    num_nodes_ptr,
    draws_ptr,
    W,
    V,
    BLOCK_V: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // W
    i = row % W
    n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), W).to(tl.int32)  # clamp, then narrow
    span = tl.where(i < n, V, 0)  # padding rows: no pass over the vocabulary
    base = row.to(tl.int64) * V
    offs = tl.arange(0, BLOCK_V)
    blocks = tl.arange(0, NUM_BLOCKS)

    # The one full pass: per-block sums (kept in registers), and the last index with
    # positive mass (the draw if rounding pushes the threshold past the total).
    sums = tl.zeros([NUM_BLOCKS], dtype=tl.float32)
    last_pos = tl.full([], -1, dtype=tl.int32)
    for k in range(0, tl.cdiv(span, BLOCK_V)):
        cols = k * BLOCK_V + offs
        p = tl.load(probs_ptr + base + cols, mask=cols < V, other=0.0).to(tl.float32)
        sums = tl.where(blocks == k, tl.sum(p, axis=0), sums)
        last_pos = tl.maximum(last_pos, tl.max(tl.where(p > 0, cols, -1), axis=0))

    # The block where the CDF crosses u * total, then the index inside it: one more block.
    thresh = tl.load(uniforms_ptr + row).to(tl.float32) * tl.sum(sums, axis=0)
    cum = tl.cumsum(sums, axis=0)
    k_hit = tl.min(tl.where(cum > thresh, blocks, NUM_BLOCKS), axis=0)
    hit = k_hit < NUM_BLOCKS
    # The mass before the hit block from the same cumulative sums that chose it: summed
    # apart in another order it can round above the threshold (then every column of the
    # block would pass, a zero-probability one included).
    before = tl.sum(tl.where(blocks == k_hit - 1, cum, 0.0), axis=0)
    cols = k_hit * BLOCK_V + offs
    p = tl.load(probs_ptr + base + cols, mask=cols < tl.where(hit, V, 0), other=0.0)
    p = p.to(tl.float32)
    cdf = before + tl.cumsum(p, axis=0)
    first = tl.min(tl.where((cdf > thresh) & (p > 0) & (cols < V), cols, V), axis=0)
    block_last = tl.max(tl.where(p > 0, cols, -1), axis=0)
    fallback = tl.where(hit & (block_last >= 0), block_last, tl.maximum(last_pos, 0))
    draw = tl.where(first < V, first, fallback)
    tl.store(draws_ptr + row, draw.to(tl.int64))


def sample_nodes_triton(
    probs: torch.Tensor, uniforms: torch.Tensor, num_nodes: torch.Tensor
) -> torch.Tensor:
    """One inverse-CDF draw per real node: int64 [B, W] (padding entries are 0)."""
    check_launchable(probs, uniforms, num_nodes)
    B, W, V = probs.shape
    draws = torch.zeros((B, W), dtype=torch.int64, device=probs.device)
    if B == 0:
        return draws
    block_v = min(4096, max(16, next_pow2(V)))
    _draw_kernel[(B * W,)](
        probs.contiguous(),
        uniforms.contiguous(),
        num_nodes.contiguous(),
        draws,
        W,
        V,
        BLOCK_V=block_v,
        NUM_BLOCKS=next_pow2(max(2, -(-V // block_v))),
        num_warps=8 if V >= 4096 else 2,
    )
    return draws


def verify_sampling_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Triton launcher of `verify_sampling` (inputs already checked): draws, then the walk."""
    draws = sample_nodes_triton(probs, uniforms, num_nodes)
    return tree_walk_triton(tokens, parents, num_nodes, draws)


def inverse_cdf_ref(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw from each row of `rows [N, V]` (non-negative weights) with `u [N]` in [0, 1):
    the first index `k` with `cumsum(rows)[k] > u * sum(rows)`; if float rounding leaves no
    such index, the last index with positive weight (0 for an all-zero row)."""
    cdf = rows.float().cumsum(dim=-1)
    thresh = u.float() * cdf[:, -1]
    k = torch.searchsorted(cdf, thresh[:, None], right=True).squeeze(1)
    V = rows.shape[-1]
    if rows.device.type == "cpu" and not bool((k >= V).any()):
        return k  # the usual case; skip the extra pass over the rows
    last_pos = torch.where(rows > 0, torch.arange(V, device=rows.device), 0).amax(dim=-1)
    return torch.where(k < V, k, last_pos)


def verify_sampling_ref(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Torch reference of `verify_sampling`.

    With `x(n) = inverse_cdf_ref(probs[b, n], uniforms[b, n])`, one draw per visited node:
      path_0 = 0;  path_{k+1} = min{c : parent(c) == path_k, tokens[c] == x(path_k)}
      while that set is non-empty; bonus = x(path_last). Only rows of visited nodes are read.
    """
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return tree_walk_ref(
        tokens,
        parents,
        num_nodes,
        lambda cur: inverse_cdf_ref(probs[rows, cur], uniforms[rows, cur]),
    )
