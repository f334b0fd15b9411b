"""Hypothesis strategies and helpers for padded batches of draft trees (kernel tests)."""

from __future__ import annotations

import os

import torch
from hypothesis import strategies as st

SHAPES = ("random", "chain", "star", "empty", "full_chain")


@st.composite
def tree_rows(draw, W: int) -> tuple[list[int], int]:
    """One request's parents row (padded with -1) and its num_nodes."""
    shape = draw(st.sampled_from(SHAPES))
    if shape == "empty":
        n = 1
    elif shape == "full_chain":
        n = W  # maximal depth W - 1
    else:
        n = draw(st.integers(1, W))
    if shape in ("chain", "full_chain"):
        parents = [-1] + list(range(n - 1))
    elif shape == "star":
        parents = [-1] + [0] * (n - 1)
    else:
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    return parents + [-1] * (W - n), n


@st.composite
def tree_batches(draw, max_b: int = 4, max_w: int = 17, vocab: int = 3):
    """(tokens, parents, num_nodes, seq_lens) with small token ids so that matches happen."""
    B = draw(st.integers(0, max_b))
    W = draw(st.integers(1, max_w))
    rows = [draw(tree_rows(W)) for _ in range(B)]
    parents = torch.tensor([r[0] for r in rows], dtype=torch.int32).reshape(B, W)
    num_nodes = torch.tensor([r[1] for r in rows], dtype=torch.int32).reshape(B)
    tokens = torch.tensor(
        [[draw(st.integers(0, vocab - 1)) if i < n else 0 for i in range(W)] for _, n in rows],
        dtype=torch.int32,
    ).reshape(B, W)
    seq_lens = torch.tensor(
        [draw(st.integers(0, 40)) for _ in range(B)], dtype=torch.int64
    ).reshape(B)
    return tokens, parents, num_nodes, seq_lens


def dyadic_probs(gen: torch.Generator, B: int, W: int, V: int, grain: int = 256) -> torch.Tensor:
    """Random rows of multiples of 1/grain summing to exactly 1 (grain a power of two), so
    every partial sum is exact in float32 and Triton's block-wise CDF and torch's cumsum
    agree bit for bit."""
    counts = torch.zeros(B * W, V)
    picks = torch.randint(0, V, (B * W, grain), generator=gen)
    counts.scatter_add_(1, picks, torch.ones(B * W, grain))
    return (counts / grain).reshape(B, W, V)


def assert_same(ref, got, what: str) -> None:
    """Field-by-field equality of two NamedTuples (or tensors), saying where they differ."""
    pairs = zip(ref._fields, ref, got) if hasattr(ref, "_fields") else [(what, ref, got)]
    for name, a, b in pairs:
        assert a.dtype == b.dtype, f"{what}.{name}: dtype {b.dtype}, reference {a.dtype}"
        assert a.shape == b.shape, f"{what}.{name}: shape {b.shape}, reference {a.shape}"
        if not torch.equal(a, b):
            where = (a != b).nonzero()[:5].tolist()
            raise AssertionError(f"{what}.{name} differs from the reference at {where}")


DEVICE = os.environ.get("LOOKAHEAD_KERNEL_DEVICE", "cpu")


def _move(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_move(v, device) for v in x))
    return x


def on_device(fn):
    """`fn` run on the test device (`LOOKAHEAD_KERNEL_DEVICE`, default cpu): tensor
    arguments are moved there and tensor results (or NamedTuples of them) moved back."""

    def run(*args, **kwargs):
        args = [_move(a, DEVICE) for a in args]
        kwargs = {k: _move(v, DEVICE) for k, v in kwargs.items()}
        return _move(fn(*args, **kwargs), "cpu")

    return run
