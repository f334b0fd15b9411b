"""The flattened custom attention mask SGLang's backends take for a tree-verify pass.

For request `b` with `L = seq_lens[b]` tokens in the KV cache, the mask is `W` rows of
`L + W` columns, row-major: row `i` is ones over the prefix and the ancestor-or-self row of
node `i` over the draft. Requests are concatenated, so request `b` starts at
`W * (sum(seq_lens[:b]) + b * W)`. Padding rows (node `i >= num_nodes[b]`) attend to
themselves only: zeros over the prefix and the draft, except the diagonal.

SGLang's NGRAM worker builds this on the host, one request at a time
(`benchmarks/gpu_kernels.py` keeps that loop as a baseline); here it is one launch for the
batch, with each program computing its request's offset from `seq_lens` on the device.
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.kernels._jit import check_launchable, lazy_jit, next_pow2
from lookahead.kernels.tree_mask import tree_metadata_ref

tl: Any = None  # bound to triton.language on the first launch (see _jit.py)


@lazy_jit
def _full_mask_kernel(
    parents_ptr,
    num_nodes_ptr,
    seq_lens_ptr,
    out_ptr,
    total,
    W,
    BLOCK_W: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1)
    n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), W).to(tl.int32)  # clamp, then narrow
    seq_len = tl.maximum(tl.load(seq_lens_ptr + b).to(tl.int64), 0)

    # Offset of request b: sum of the lengths of the requests before it, in BLOCK_B chunks.
    prefix = tl.zeros([BLOCK_B], dtype=tl.int64)
    for start in range(0, b, BLOCK_B):
        ks = start + tl.arange(0, BLOCK_B)
        prefix += tl.load(seq_lens_ptr + ks, mask=ks < b, other=0).to(tl.int64)
    before = tl.sum(prefix, axis=0)
    row_len = seq_len + W
    row_start = W * (before + b.to(tl.int64) * W) + i.to(tl.int64) * row_len

    real = i < n
    ones = tl.full([BLOCK_S], 1, dtype=tl.int8) * real.to(tl.int8)
    for s in range(0, seq_len, BLOCK_S):
        cols = s + tl.arange(0, BLOCK_S)
        dst = row_start + cols
        # dst >= 0 too: bad (negative) lengths before b must not move a store below the output.
        tl.store(out_ptr + dst, ones, mask=(cols < seq_len) & (dst >= 0) & (dst < total))

    # Ancestor-or-self row of node i: climb the parent chain (at most W - 1 steps).
    cols = tl.arange(0, BLOCK_W)
    base = b.to(tl.int64) * W
    row = cols == i
    cur = i
    for _ in range(1, W):
        ok = (cur >= 1) & (cur < n)
        p = tl.load(parents_ptr + base + cur, mask=ok, other=-1)
        cur = tl.where(ok & (p >= 0) & (p < cur), p, -1).to(tl.int32)
        row = row | (cols == cur)
    dst = row_start + seq_len + cols
    tl.store(out_ptr + dst, row.to(tl.int8), mask=(cols < W) & (dst >= 0) & (dst < total))


def build_full_mask_triton(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int | None = None,
) -> torch.Tensor:
    """Triton launcher of `build_full_mask` (inputs already checked).

    The output length `W * (sum(seq_lens) + B * W)` must be known on the host: pass
    `seq_lens_sum` (SGLang keeps it on the host) to avoid a device-to-host sync. Stores are
    bounded by the output length, so a wrong `seq_lens_sum` gives a wrong mask, never a
    write out of bounds.
    """
    check_launchable(parents, num_nodes, seq_lens)
    B, W = parents.shape
    if seq_lens_sum is None:
        seq_lens_sum = int(seq_lens.sum().item())
    out = torch.empty(W * (seq_lens_sum + B * W), dtype=torch.bool, device=parents.device)
    if B == 0:
        return out
    _full_mask_kernel[(B, W)](
        parents.contiguous(),
        num_nodes.contiguous(),
        seq_lens.contiguous(),
        out.view(torch.int8),
        out.numel(),
        W,
        BLOCK_W=next_pow2(W),
        BLOCK_B=min(next_pow2(B), 1024),
        BLOCK_S=1024,
        num_warps=4,
    )
    return out


def build_full_mask_ref(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int | None = None,
) -> torch.Tensor:
    """Torch reference of `build_full_mask`.

    With `M = tree_metadata_ref(...).mask` and `real[b, i] = i < num_nodes[b]`, request `b`
    contributes the row-major `W x (seq_lens[b] + W)` block `[real[b][:, None] * ones, M[b]]`,
    and the blocks of all requests are concatenated in batch order (built here request by
    request, like SGLang's loop). `seq_lens_sum` is accepted for signature parity with the
    launcher and not used.
    """
    W = parents.shape[1]
    tree = tree_metadata_ref(parents, num_nodes, seq_lens).mask
    real = torch.arange(W, device=parents.device)[None, :] < num_nodes.long().clamp(1, W)[:, None]
    blocks = [
        torch.cat((real[b, :, None].expand(W, length), tree[b]), dim=1).reshape(-1)
        for b, length in enumerate(seq_lens.tolist())
    ]
    if not blocks:
        return torch.zeros(0, dtype=torch.bool, device=parents.device)
    return torch.cat(blocks)
