"""The verify forward's inputs for one draft tree on top of the KV cache: token ids, explicit
positions (prefix length + depth) and the 4-D tree attention mask.

They are built on the host with the kernels' torch references, on CUDA too: a tree of at
most 33 nodes comes from the host trie and its accepted path goes back to it, so launching
the Triton kernels would add launches and a copy each way (not measured on a GPU yet)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lookahead import kernels


@dataclass
class Tree:
    """One step's tree as tensors (batch of one), with its mask's place in the buffer."""

    tokens: torch.Tensor  # [1, n] int64, host
    parents: torch.Tensor  # [1, n] int32, host
    num_nodes: torch.Tensor  # [1] int32, host
    meta: kernels.TreeMetadata
    mask: torch.Tensor  # [1, 1, n, seq_len + n] bool, or additive in the model's dtype
    seq_len: int  # tokens in the KV cache before the tree
    n: int  # nodes, the root included


class TreeInputs:
    """Builds each step's `Tree`. The 4-D mask lives in one buffer grown geometrically: its
    prefix columns stay True and only the tree block is written each step."""

    def __init__(self, width: int, device, additive_dtype: torch.dtype | None = None):
        self.width = width  # the widest tree, the root included
        self.device = device
        self.additive_dtype = additive_dtype  # eager attention takes an additive mask
        self._mask = torch.ones((1, 1, width, 0), dtype=torch.bool, device=device)

    def build(self, tokens: np.ndarray, parents: np.ndarray, seq_len: int) -> Tree:
        """The tree `tokens` / `parents` (node 0 the root) after `seq_len` cached tokens."""
        n = len(tokens)
        parents_t = torch.from_numpy(np.ascontiguousarray(parents, dtype=np.int32))[None]
        tokens_t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))[None]
        num_nodes = torch.tensor([n], dtype=torch.int32)
        seq_lens = torch.tensor([seq_len], dtype=torch.int64)
        meta = kernels.tree_metadata(parents_t, num_nodes, seq_lens)
        total = seq_len + n
        if self._mask.shape[-1] < total:
            grown = torch.ones((1, 1, self.width, max(2 * total, 256)), dtype=torch.bool)
            self._mask = grown.to(self.device)
        self._mask[0, 0, :n, seq_len:total] = meta.mask[0, :n, :n]
        mask = self._mask[:, :, :n, :total]
        dtype = self.additive_dtype
        if dtype is not None:
            mask = torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill_(
                ~mask, torch.finfo(dtype).min
            )
        return Tree(tokens_t, parents_t, num_nodes, meta, mask, seq_len, n)

    def release(self, tree: Tree) -> None:
        """Give the tree block back to the prefix (all True) once the forward has run."""
        self._mask[0, 0, : tree.n, tree.seq_len : tree.seq_len + tree.n] = True
