"""Result types of the kernel dispatch functions (layouts: docs/interfaces.md, "Kernels")."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


class TreeMetadata(NamedTuple):
    """Per-node metadata of a padded batch of draft trees (`B` trees of width `W`)."""

    mask: torch.Tensor  # bool [B, W, W]: mask[b, i, j] = node j is an ancestor of i, or j == i
    positions: torch.Tensor  # int64 [B, W]: seq_lens[b] + depth (padding: seq_lens[b])
    depth: torch.Tensor  # int32 [B, W]: root 0, padding 0
    retrieve_index: torch.Tensor  # int32 [B, W]: b * W + i for real nodes, -1 for padding
    retrieve_next_token: torch.Tensor  # int32 [B, W]: first child (lowest index), -1 if none
    retrieve_next_sibling: torch.Tensor  # int32 [B, W]: next sibling in index order, -1 if none


class VerifyResult(NamedTuple):
    """Outcome of verifying a batch of draft trees against the target model."""

    accepted_nodes: torch.Tensor  # int32 [B, W]: the accepted path, starting with root 0, -1 padded
    num_accepted: torch.Tensor  # int32 [B]: accepted draft tokens (root excluded)
    bonus: torch.Tensor  # int64 [B]: the target's token after the last accepted node
