"""Tree metadata and lossless tree verification: Triton on CUDA, torch everywhere else.

One dispatch function per operation (contract: docs/interfaces.md, "Kernels"). CUDA tensors
go to the Triton launcher (`<op>_triton`), other tensors to the plain torch reference
(`<op>_ref`). Importing this package imports torch but not triton; triton is imported on the
first CUDA launch, so CPU-only installs without triton work.

Inputs (B trees, padded to width W; docs/interfaces.md, "The draft tree"):
  tokens, parents: int32 or int64 [B, W]; num_nodes, seq_lens: int32 or int64 [B];
  target_tokens: int32 or int64 [B, W]; probs: float32/16, bfloat16 or float64 [B, W, V];
  uniforms: float [B, W] in [0, 1).
Each dispatcher takes `validate`: None (default) checks values on CPU tensors and trusts CUDA
tensors; True forces the checks (one device-to-host sync on CUDA); see `_checks.py`.
"""

from __future__ import annotations

import torch

from lookahead.kernels import _checks
from lookahead.kernels._types import TreeMetadata, VerifyResult
from lookahead.kernels.full_mask import build_full_mask_ref, build_full_mask_triton
from lookahead.kernels.tree_mask import tree_metadata_ref, tree_metadata_triton
from lookahead.kernels.verify_greedy import verify_greedy_ref, verify_greedy_triton
from lookahead.kernels.verify_sampling import verify_sampling_ref, verify_sampling_triton

__all__ = [
    "TreeMetadata",
    "VerifyResult",
    "build_full_mask",
    "build_full_mask_ref",
    "build_full_mask_triton",
    "tree_metadata",
    "tree_metadata_ref",
    "tree_metadata_triton",
    "verify_greedy",
    "verify_greedy_ref",
    "verify_greedy_triton",
    "verify_sampling",
    "verify_sampling_ref",
    "verify_sampling_triton",
]


def tree_metadata(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    validate: bool | None = None,
) -> TreeMetadata:
    """Ancestor-or-self mask [B, W, W] (bool), positions (int64, `seq_lens + depth`; padding
    nodes get depth 0, so position `seq_lens[b]`), depth, and SGLang's traversal arrays."""
    _checks.check_tree(parents, num_nodes, seq_lens=seq_lens, validate=validate)
    if parents.is_cuda:
        return tree_metadata_triton(parents, num_nodes, seq_lens)
    return tree_metadata_ref(parents, num_nodes, seq_lens)


def build_full_mask(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    seq_lens_sum: int | None = None,
    validate: bool | None = None,
) -> torch.Tensor:
    """SGLang's flattened verify mask: per request a row-major `W x (seq_lens[b] + W)` block
    (prefix ones, then the tree mask; padding rows see only themselves), concatenated.

    `seq_lens_sum` (sum of `seq_lens`, as SGLang keeps it on the host) saves a sync on CUDA;
    with `validate` it is checked against `seq_lens`.
    """
    do = _checks.check_tree(parents, num_nodes, seq_lens=seq_lens, validate=validate)
    if seq_lens_sum is not None:
        if int(seq_lens_sum) < 0:
            raise ValueError(f"seq_lens_sum must be >= 0, got {seq_lens_sum}")
        if do and int(seq_lens.sum().item()) != int(seq_lens_sum):
            raise ValueError(
                f"seq_lens_sum={seq_lens_sum} but seq_lens sums to {int(seq_lens.sum().item())}"
            )
    if parents.is_cuda:
        return build_full_mask_triton(parents, num_nodes, seq_lens, seq_lens_sum)
    return build_full_mask_ref(parents, num_nodes, seq_lens, seq_lens_sum)


def verify_greedy(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_tokens: torch.Tensor,
    *,
    validate: bool | None = None,
) -> VerifyResult:
    """Longest root path whose draft tokens equal the target's argmax at the parent
    (`target_tokens [B, W]`); bonus = the target's token at the last accepted node."""
    _checks.check_tree(parents, num_nodes, tokens=tokens, validate=validate)
    _checks.check_target_tokens(target_tokens, parents)
    if parents.is_cuda:
        return verify_greedy_triton(tokens, parents, num_nodes, target_tokens)
    return verify_greedy_ref(tokens, parents, num_nodes, target_tokens)


def verify_sampling(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    probs: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    validate: bool | None = None,
) -> VerifyResult:
    """Exact sampling verification: one inverse-CDF draw from `probs[b, n]` with
    `uniforms[b, n]` at each visited node `n`; accept the first child carrying the draw,
    else stop and emit the draw as the bonus."""
    do = _checks.check_tree(parents, num_nodes, tokens=tokens, validate=validate)
    _checks.check_probs(probs, uniforms, parents, num_nodes, validate=do)
    if parents.is_cuda:
        return verify_sampling_triton(tokens, parents, num_nodes, probs, uniforms)
    return verify_sampling_ref(tokens, parents, num_nodes, probs, uniforms)
