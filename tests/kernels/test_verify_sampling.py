"""verify_sampling: Triton kernels == torch reference (probabilities that are multiples of
1/256, so float sums are exact and both sides must agree bit for bit)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_trees import assert_same, dyadic_probs, on_device, tree_batches
from lookahead.kernels import verify_sampling
from lookahead.kernels.verify_sampling import (
    inverse_cdf_ref,
    sample_nodes_triton,
    verify_sampling_ref,
    verify_sampling_triton,
)

triton = pytest.importorskip("triton")
sample_nodes_triton = on_device(sample_nodes_triton)
verify_sampling_triton = on_device(verify_sampling_triton)


@settings(max_examples=50, deadline=None)
@given(
    batch=tree_batches(max_b=4, max_w=17, vocab=3),
    V=st.integers(1, 64),
    seed=st.integers(0, 2**31 - 1),
)
def test_triton_matches_reference(batch, V, seed):
    tokens, parents, num_nodes, _ = batch
    tokens = tokens.clamp(max=V - 1)
    B, W = tokens.shape
    gen = torch.Generator().manual_seed(seed)
    probs = dyadic_probs(gen, B, W, V)
    uniforms = torch.rand(B, W, generator=gen)
    ref = verify_sampling_ref(tokens, parents, num_nodes, probs, uniforms)
    assert_same(
        ref, verify_sampling_triton(tokens, parents, num_nodes, probs, uniforms), "sampling"
    )


@pytest.mark.parametrize(
    ("dtype", "V"),
    [(torch.float32, 5000), (torch.float16, 9000), (torch.bfloat16, 4097), (torch.float32, 1)],
)
def test_draws_match_inverse_cdf_over_several_blocks(dtype, V):
    # V > 4096 spans several vocabulary blocks; dyadic rows are exact in every dtype listed.
    gen = torch.Generator().manual_seed(V)
    B, W = 2, 3
    probs = dyadic_probs(gen, B, W, V, grain=64).to(dtype)
    uniforms = torch.rand(B, W, generator=gen)
    uniforms[0, 0] = 0.0
    uniforms[0, 1] = 1.0 - 2**-24  # the largest float32 below 1: the last positive index
    uniforms[1, 0] = 1.0  # out of range (the dispatcher rejects it): exercises the fallback
    num_nodes = torch.tensor([3, 2], dtype=torch.int32)
    got = sample_nodes_triton(probs, uniforms, num_nodes)
    want = inverse_cdf_ref(probs.reshape(B * W, V), uniforms.reshape(-1)).view(B, W)
    want[1, 2] = 0  # padding node: not drawn
    assert_same(want, got, "draws")
    nz = (probs[0, 1] > 0).nonzero().flatten()
    assert int(got[0, 1]) == int(nz.max())
    assert int(got[1, 0]) == int((probs[1, 0] > 0).nonzero().max())
    assert int(got[0, 0]) == int((probs[0, 0] > 0).nonzero().min())


def test_inverse_cdf_by_hand():
    rows = torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 5)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75])
    assert inverse_cdf_ref(rows, u).tolist() == [0, 0, 2, 2, 3]
    # rounding past the end falls back to the last index with positive mass
    assert inverse_cdf_ref(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([1.0])).tolist() == [1]


def test_by_hand_walk():
    # 0 -> {1: tok 2, 2: tok 3}; 1 -> {3: tok 0}. One-hot rows make the draws certain.
    tokens = torch.tensor([[0, 2, 3, 0]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    num_nodes = torch.tensor([4], dtype=torch.int32)
    probs = torch.zeros(1, 4, 4)
    probs[0, 0, 2] = probs[0, 1, 0] = probs[0, 2, 1] = probs[0, 3, 3] = 1.0
    u = torch.full((1, 4), 0.5)
    for fn in (verify_sampling, verify_sampling_triton):
        res = fn(tokens, parents, num_nodes, probs, u)
        assert res.accepted_nodes.tolist() == [[0, 1, 3, -1]]
        assert res.num_accepted.tolist() == [2] and res.bonus.tolist() == [3]


def test_a_zero_probability_token_is_never_drawn_across_blocks():
    # Block sums that round apart differently: the block's preceding mass must come from the
    # same cumulative sums that chose the block, and only a positive column may be drawn.
    V = 8 * 4096
    probs = torch.zeros(1, 1, V)
    probs[0, 0, 0] = 0.5
    probs[0, 0, 2 * 4096] = probs[0, 0, 3 * 4096] = 2.0**-25
    probs[0, 0, 4 * 4096 + 100] = 0.5 - 2.0**-24  # column 4 * 4096 itself has probability 0
    draw = sample_nodes_triton(probs, torch.tensor([[0.5]]), torch.ones(1, dtype=torch.int32))
    assert probs[0, 0, int(draw[0, 0])] > 0
