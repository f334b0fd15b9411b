"""build_full_mask: Triton kernel == torch reference == SGLang's per-request loop."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_trees import assert_same, on_device, tree_batches
from lookahead.kernels import build_full_mask, tree_metadata
from lookahead.kernels.full_mask import build_full_mask_ref, build_full_mask_triton

triton = pytest.importorskip("triton")
build_full_mask_triton = on_device(build_full_mask_triton)

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kernels.py"


def _sglang_loop():
    spec = importlib.util.spec_from_file_location("gpu_kernels_bench", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sglang_full_mask_loop


@settings(max_examples=40, deadline=None)
@given(batch=tree_batches(max_b=4, max_w=17), long_seq=st.booleans())
def test_triton_matches_reference(batch, long_seq):
    _, parents, num_nodes, seq_lens = batch
    if long_seq:  # prefixes longer than one 1024-column block
        seq_lens = seq_lens * 60
    ref = build_full_mask_ref(parents, num_nodes, seq_lens)
    total = int(seq_lens.sum())
    assert_same(ref, build_full_mask_triton(parents, num_nodes, seq_lens, total), "full_mask")
    assert_same(ref, build_full_mask_triton(parents, num_nodes, seq_lens), "full_mask")


@settings(max_examples=30, deadline=None)
@given(batch=tree_batches(max_b=4, max_w=12))
def test_reference_matches_sglang_loop_on_unpadded_trees(batch):
    _, parents, num_nodes, seq_lens = batch
    B, W = parents.shape
    fixed, full = parents.clone(), torch.full((B,), W, dtype=torch.int32)
    for b in range(B):  # SGLang's trees are never padded: turn padding into a chain
        for i in range(int(num_nodes[b]), W):
            fixed[b, i] = i - 1
    if B == 0:
        return
    tree_np = tree_metadata(fixed, full, seq_lens).mask.numpy()
    expected = _sglang_loop()(tree_np, seq_lens.tolist(), "cpu")
    assert_same(expected, build_full_mask(fixed, full, seq_lens), "full_mask")


def test_layout_by_hand():
    # Request 0: root + one child, 2 cached tokens; request 1: root only (padded), 1 token.
    parents = torch.tensor([[-1, 0], [-1, -1]], dtype=torch.int32)
    num_nodes = torch.tensor([2, 1], dtype=torch.int32)
    seq_lens = torch.tensor([2, 1])
    got = build_full_mask(parents, num_nodes, seq_lens, seq_lens_sum=3).int().tolist()
    expected = [1, 1, 1, 0] + [1, 1, 1, 1] + [1, 1, 0] + [0, 0, 1]  # padding row: self only
    assert got == expected
    assert_same(
        build_full_mask_ref(parents, num_nodes, seq_lens),
        build_full_mask_triton(parents, num_nodes, seq_lens, 3),
        "full_mask",
    )


def _guarded_launch(parents, num_nodes, seq_lens, total):
    """The full-mask kernel writing a `total`-entry output that is a view into a buffer with
    guard bytes on both sides; returns whether both guards are still zero."""
    from kernel_trees import DEVICE
    from lookahead.kernels._jit import next_pow2
    from lookahead.kernels.full_mask import _full_mask_kernel

    bs, width = parents.shape
    guarded = torch.zeros(64 + total + 256, dtype=torch.int8, device=DEVICE)
    _full_mask_kernel[(bs, width)](
        parents.to(DEVICE),
        num_nodes.to(DEVICE),
        seq_lens.to(DEVICE),
        guarded[64 : 64 + total],
        total,
        width,
        BLOCK_W=next_pow2(width),
        BLOCK_B=bs,
        BLOCK_S=1024,
        num_warps=4,
    )
    return not guarded[:64].any() and not guarded[64 + total :].any()


def test_wrong_seq_lens_sum_never_writes_out_of_bounds():
    parents = torch.tensor([[-1, 0, 1]], dtype=torch.int32)
    num_nodes = torch.tensor([3], dtype=torch.int32)
    # On an output sized from a wrong seq_lens_sum (10 for 50), no store lands past it.
    assert _guarded_launch(parents, num_nodes, torch.tensor([50]), 3 * (10 + 3))
    out = build_full_mask_triton(parents, num_nodes, torch.tensor([50]), seq_lens_sum=10)
    assert out.numel() == 3 * (10 + 3)  # the launcher sizes it from the hint


def test_negative_seq_lens_never_write_below_the_output():
    # Unvalidated input (the CUDA default): a negative length must not move any store below
    # the output buffer, which is a view into a guarded one here.
    parents = torch.tensor([[-1, 0], [-1, 0]], dtype=torch.int32)
    num_nodes = torch.tensor([2, 2], dtype=torch.int32)
    seq_lens = torch.tensor([-7, 9])
    assert _guarded_launch(parents, num_nodes, seq_lens, 2 * (int(seq_lens.sum()) + 2 * 2))
