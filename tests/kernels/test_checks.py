"""Bad input raises a clear ValueError from every dispatch function."""

from __future__ import annotations

import pytest
import torch
from lookahead.kernels import build_full_mask, tree_metadata, verify_greedy, verify_sampling

I32 = torch.int32


def good(B: int = 2, W: int = 4, V: int = 5):
    tokens = torch.tensor([[0, 1, 2, 3], [0, 4, 0, 0]], dtype=I32)[:B, :W]
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1]], dtype=I32)[:B, :W]
    num_nodes = torch.tensor([4, 2], dtype=I32)[:B]
    seq_lens = torch.tensor([3, 9])[:B]
    target = torch.zeros(B, W, dtype=torch.int64)
    probs = torch.full((B, W, V), 1.0 / V)
    uniforms = torch.full((B, W), 0.5)
    return dict(
        tokens=tokens, parents=parents, num_nodes=num_nodes, seq_lens=seq_lens,
        target=target, probs=probs, uniforms=uniforms,
    )  # fmt: skip


def call_all(d):
    """Run every dispatcher that takes the fields of `d`."""
    tree_metadata(d["parents"], d["num_nodes"], d["seq_lens"])
    build_full_mask(d["parents"], d["num_nodes"], d["seq_lens"])
    verify_greedy(d["tokens"], d["parents"], d["num_nodes"], d["target"])
    verify_sampling(d["tokens"], d["parents"], d["num_nodes"], d["probs"], d["uniforms"])


def test_good_input_passes():
    call_all(good())


def _with(**changes):
    d = good()
    d.update(changes)
    return d


TREE_CASES = [
    ("parents", torch.tensor([[-1, 0, 2, 1], [-1, 0, -1, -1]], dtype=I32), "earlier node"),
    ("parents", torch.tensor([[-1, 0, 0, 3], [-1, 0, -1, -1]], dtype=I32), "earlier node"),
    ("parents", torch.tensor([[-1, 0, -1, 1], [-1, 0, -1, -1]], dtype=I32), "earlier node"),
    ("parents", torch.tensor([[0, 0, 0, 1], [-1, 0, -1, -1]], dtype=I32), "root"),
    ("parents", torch.zeros(2, 4, dtype=torch.float32), "dtype"),
    ("parents", torch.zeros(2, 4, 1, dtype=I32), "dimensions"),
    ("parents", torch.zeros(2, 0, dtype=I32), "W >= 1"),
    ("num_nodes", torch.tensor([0, 2], dtype=I32), r"\[1, W=4\]"),
    ("num_nodes", torch.tensor([5, 2], dtype=I32), r"\[1, W=4\]"),
    ("num_nodes", torch.tensor([4, 2, 1], dtype=I32), "shape"),
    ("num_nodes", [4, 2], "torch.Tensor"),
]


@pytest.mark.parametrize(("field", "value", "message"), TREE_CASES)
def test_bad_tree_rejected_by_every_dispatcher(field, value, message):
    d = _with(**{field: value})
    for fn in (
        lambda: tree_metadata(d["parents"], d["num_nodes"], d["seq_lens"]),
        lambda: build_full_mask(d["parents"], d["num_nodes"], d["seq_lens"]),
        lambda: verify_greedy(d["tokens"], d["parents"], d["num_nodes"], d["target"]),
        lambda: verify_sampling(
            d["tokens"], d["parents"], d["num_nodes"], d["probs"], d["uniforms"]
        ),
    ):
        with pytest.raises(ValueError, match=message):
            fn()


def test_padding_parents_are_not_checked():
    # Columns >= num_nodes are padding: consumers decide by num_nodes, not by pad values.
    call_all(_with(parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 7, 3]], dtype=I32)))


def test_bad_seq_lens():
    d = good()
    for fn in (tree_metadata, build_full_mask):
        with pytest.raises(ValueError, match=">= 0"):
            fn(d["parents"], d["num_nodes"], torch.tensor([3, -1]))
        with pytest.raises(ValueError, match="shape"):
            fn(d["parents"], d["num_nodes"], torch.tensor([3]))
        with pytest.raises(ValueError, match="dtype"):
            fn(d["parents"], d["num_nodes"], torch.tensor([3.0, 1.0]))
    with pytest.raises(ValueError, match="seq_lens_sum"):
        build_full_mask(d["parents"], d["num_nodes"], d["seq_lens"], seq_lens_sum=11)


def test_bad_tokens_and_targets():
    d = good()
    with pytest.raises(ValueError, match="tokens has shape"):
        verify_greedy(d["tokens"][:, :3], d["parents"], d["num_nodes"], d["target"])
    with pytest.raises(ValueError, match="target_tokens has shape"):
        verify_greedy(d["tokens"], d["parents"], d["num_nodes"], d["target"][:1])
    with pytest.raises(ValueError, match="target_tokens must have dtype"):
        verify_greedy(d["tokens"], d["parents"], d["num_nodes"], d["target"].float())
    with pytest.raises(ValueError, match="tokens must have dtype"):
        verify_sampling(
            d["tokens"].float(), d["parents"], d["num_nodes"], d["probs"], d["uniforms"]
        )


def _probs_with(b, i, v, value):
    p = good()["probs"].clone()
    p[b, i, v] = value
    return p


PROB_CASES = [
    (_probs_with(0, 2, 1, float("nan")), "finite"),
    (_probs_with(1, 1, 0, float("inf")), "finite"),
    (_probs_with(0, 0, 3, -0.1), "non-negative"),
    (_probs_with(0, 3, 0, 0.5), "sum to 1"),
    (torch.full((2, 4, 5), 3.0), "not logits"),
    (good()["probs"][:, :3], "shape"),
    (good()["probs"].to(torch.int64), "dtype"),
]


@pytest.mark.parametrize(("probs", "message"), PROB_CASES)
def test_bad_probs(probs, message):
    d = good()
    with pytest.raises(ValueError, match=message):
        verify_sampling(d["tokens"], d["parents"], d["num_nodes"], probs, d["uniforms"])


def test_bad_probs_in_padding_rows_are_ignored():
    d = good()
    probs = _probs_with(1, 3, 0, float("nan"))  # request 1 has 2 nodes: row 3 is padding
    verify_sampling(d["tokens"], d["parents"], d["num_nodes"], probs, d["uniforms"])


@pytest.mark.parametrize("u", [-0.1, 1.0, float("nan")])
def test_bad_uniforms(u):
    d = good()
    uniforms = d["uniforms"].clone()
    uniforms[1, 0] = u
    with pytest.raises(ValueError, match=r"uniforms must be in \[0, 1\)"):
        verify_sampling(d["tokens"], d["parents"], d["num_nodes"], d["probs"], uniforms)


def test_half_precision_rows_get_a_looser_tolerance():
    d = good(V=5)
    probs = d["probs"].to(torch.bfloat16)  # 0.2 rounds to 0.2002 in bfloat16: sum 1.001
    verify_sampling(d["tokens"], d["parents"], d["num_nodes"], probs, d["uniforms"])


def test_validate_false_skips_value_checks_but_not_shapes():
    d = _with(num_nodes=torch.tensor([9, 2], dtype=I32))
    meta = tree_metadata(d["parents"], d["num_nodes"], d["seq_lens"], validate=False)
    assert meta.mask.shape == (2, 4, 4)  # unchecked: every column of request 0 counts as real
    with pytest.raises(ValueError, match="shape"):
        tree_metadata(d["parents"], d["num_nodes"][:1], d["seq_lens"], validate=False)


def test_empty_batch_is_accepted():
    d = good()
    empty = {k: v[:0] for k, v in d.items()}
    call_all(empty)
    res = verify_greedy(empty["tokens"], empty["parents"], empty["num_nodes"], empty["target"])
    assert res.accepted_nodes.shape == (0, 4) and res.bonus.shape == (0,)
