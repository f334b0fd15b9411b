"""Logits processing for every node of a draft tree, in the order HF `generate` applies it.

Each node `i` of a draft tree predicts the token after the context `verified tokens + path from
the root to i`. Repetition penalty therefore uses, per node, the verified context plus the
node's draft ancestors (and the node itself); temperature, top-k and top-p are per row.
torch is imported by the functions that use it: the settings (`SamplingConfig`) are the llama.cpp
engine's too, which decodes greedily without torch (the `llamacpp` extra does not install it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lookahead.args import is_bool, is_int

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Generation settings that shape the per-node distribution (HF `generate` semantics)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    repetition_penalty: float = 1.0  # 1.0: off

    def __post_init__(self):
        if not is_bool(self.do_sample):
            raise ValueError(f"do_sample must be a bool, got {self.do_sample!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            v = getattr(self, name)
            if is_bool(v) or not isinstance(v, (int, float, np.number)):
                raise ValueError(f"{name} must be a number, got {v!r}")
        if not is_int(self.top_k):
            raise ValueError(f"top_k must be an int, got {self.top_k!r}")
        if not 0 < self.temperature < float("inf"):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise ValueError(
                f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"
            )

    @property
    def needs_processing(self) -> bool:
        """False when greedy decoding can take the raw argmax."""
        return self.do_sample or self.repetition_penalty != 1.0


def apply_repetition_penalty(
    logits: torch.Tensor,
    seen: torch.Tensor,
    tokens: torch.Tensor,
    ancestors: torch.Tensor,
    penalty: float,
) -> torch.Tensor:
    """Penalise, per node, every token of its context (HF `RepetitionPenaltyLogitsProcessor`).

    logits [W, V] float; seen [V] bool: tokens of the verified context (root included);
    tokens [W] int64: draft tokens; ancestors [W, W] bool: ancestor-or-self mask. A penalised
    logit x becomes x / penalty if x > 0, else x * penalty.
    """
    import torch

    w = logits.shape[0]
    present = seen.unsqueeze(0).expand(w, -1).clone()
    # Node 0 is the root, already in `seen`; the others add their path (self included).
    rows, cols = torch.nonzero(ancestors[:, 1:], as_tuple=True)
    present[rows, tokens[cols + 1]] = True
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(present, penalised, logits)


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as HF's warpers (removed entries get -inf)."""
    import torch

    if cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    vocab = logits.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - cfg.top_p)
        remove_sorted[..., -1:] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def node_scores(
    logits: torch.Tensor,
    cfg: SamplingConfig,
    seen: torch.Tensor | None,
    tokens: torch.Tensor,
    ancestors: torch.Tensor | None,
) -> torch.Tensor:
    """Processed fp32 logits [W, V] per node (greedy takes their argmax)."""
    logits = logits.float()
    if cfg.repetition_penalty != 1.0:
        if seen is None or ancestors is None:
            raise ValueError("repetition penalty needs the seen-token set and the ancestor mask")
        logits = apply_repetition_penalty(logits, seen, tokens, ancestors, cfg.repetition_penalty)
    if cfg.do_sample:
        logits = warp(logits, cfg)
    return logits
