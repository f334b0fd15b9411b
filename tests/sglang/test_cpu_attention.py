"""The CPU tree-attention backend: each draft node attends to the verified prefix and to its
own ancestors only, as a one-row decode along that node's path would."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lookahead.kernels import tree_metadata
from lookahead.sglang.cpu_attention import tree_verify_attention


def path_attention(q, keys, values, scale):
    """Plain softmax attention of one query row over the given keys (all heads)."""
    w = torch.einsum("hd,khd->hk", q, keys) * scale
    return torch.einsum("hk,khd->hd", torch.softmax(w, dim=-1), values)


@pytest.mark.parametrize("gqa", [False, True])
def test_each_node_sees_the_prefix_and_its_ancestors(gqa):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    bs, width, heads, dim = 3, 6, 4, 8
    kv_heads = 2 if gqa else heads
    parents = np.array(
        [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 0, 0]], dtype=np.int32
    )
    seq_lens = torch.tensor([5, 0, 11])
    pool_rows, pool_len, slots = 4, 32, 200
    req_pool_indices = torch.tensor([2, 0, 3])
    req_to_token = torch.from_numpy(
        rng.permutation(slots)[: pool_rows * pool_len].reshape(pool_rows, pool_len).astype(np.int32)
    )
    k_cache = torch.randn(slots, kv_heads, dim)
    v_cache = torch.randn(slots, kv_heads, dim)
    query = torch.randn(bs * width, heads, dim)
    meta = tree_metadata(
        torch.from_numpy(parents), torch.full((bs,), width, dtype=torch.int32), seq_lens
    )
    scale = dim**-0.5
    out = tree_verify_attention(
        query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
        meta.mask.reshape(-1), width, scale, gqa,
    )  # fmt: skip
    rep = heads // kv_heads
    for b in range(bs):
        row, n = int(req_pool_indices[b]), int(seq_lens[b])
        for i in range(width):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = int(parents[b, j])
            cols = list(range(n)) + [n + j for j in sorted(path)]
            slots_i = req_to_token[row, cols].long()
            keys = k_cache[slots_i].repeat_interleave(rep, dim=1)
            values = v_cache[slots_i].repeat_interleave(rep, dim=1)
            expect = path_attention(query[b * width + i], keys, values, scale)
            torch.testing.assert_close(out[b * width + i], expect, rtol=1e-5, atol=1e-5)


def test_refuses_a_mask_of_another_layout():
    q = torch.zeros(4, 1, 2)
    kv = torch.zeros(8, 1, 2)
    r2t = torch.arange(8, dtype=torch.int32).view(1, 8)
    with pytest.raises(ValueError, match="QLEN layout"):
        tree_verify_attention(
            q, kv, kv, r2t, torch.tensor([0]), torch.tensor([2]),
            torch.ones(4 * (2 + 4), dtype=torch.bool), 4, None, False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="expected 1 x 2"):
        tree_verify_attention(
            q, kv, kv, r2t, torch.tensor([0]), torch.tensor([2]),
            torch.ones(4, dtype=torch.bool), 2, None, False,
        )  # fmt: skip
