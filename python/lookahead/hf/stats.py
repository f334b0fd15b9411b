"""What a request reports: its statistics (step counts and where the time went) and result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

# `on_tokens(new_ids, text_delta)`: called after every step.
TokenCallback = Callable[[list, str], None]


@dataclass
class GenerationStats:
    """Per-request statistics; times are seconds of wall clock."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # tree forwards after the prefill
    accepted: list = field(default_factory=list)  # accepted draft tokens per step (bonus excluded)
    draft_nodes: list = field(default_factory=list)  # drafted nodes per step (root excluded)
    skipped_drafts: int = 0  # drafts dropped as unlikely to pay (cost-aware choice or gate)
    prefill_s: float = 0.0  # the prompt forward (the cache's start_request is in total_s only)
    draft_s: float = 0.0  # LookaheadCache.draft
    mask_s: float = 0.0  # tree metadata, input tensors, 4-D mask
    forward_s: float = 0.0  # the model forward over the tree
    verify_s: float = 0.0  # logits processing + verify kernel
    kv_s: float = 0.0  # KV fix-up (move accepted rows, crop)
    # The rest of each step besides the caller's `on_tokens`: the sizer learning from the
    # verdict, stop checks, the cache extended with the step's tokens.
    other_s: float = 0.0
    # Of the above, the drafter's own: the cache's draft and extend and the sizer's cut and
    # learning (what llama.cpp's speculators time as their draft and accept calls).
    drafter_s: float = 0.0
    total_s: float = 0.0

    def record_step(self, accepted: int, nodes: int, t: tuple) -> None:
        """Count one step: draft tokens it output, nodes it drafted, and its six clock
        readings (before the draft, the tree inputs, the forward, the verify, the KV fix-up,
        and after)."""
        self.steps += 1
        self.accepted.append(accepted)
        self.draft_nodes.append(nodes)
        self.draft_s += t[1] - t[0]
        self.mask_s += t[2] - t[1]
        self.forward_s += t[3] - t[2]
        self.verify_s += t[4] - t[3]
        self.kv_s += t[5] - t[4]

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step (the bonus token not counted)."""
        return float(np.mean(self.accepted)) if self.accepted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per step (accepted + bonus)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def drafter_us_per_step(self) -> float:
        """The drafter's microseconds per step (`drafter_s`)."""
        return 1e6 * self.drafter_s / self.steps if self.steps else 0.0

    @property
    def host_overhead(self) -> float:
        """The host's time between forwards (draft + mask + verify + KV fix-up + other) as a
        fraction of the forward time."""
        host = self.draft_s + self.mask_s + self.verify_s + self.kv_s + self.other_s
        return host / self.forward_s if self.forward_s else 0.0

    def as_dict(self) -> dict:
        """Plain dict with the derived means included."""
        d = asdict(self)
        d.update(
            mean_accepted=self.mean_accepted,
            tokens_per_step=self.tokens_per_step,
            host_overhead=self.host_overhead,
            drafter_us_per_step=self.drafter_us_per_step,
        )
        return d


@dataclass
class GenerationResult:
    """Generated ids (new tokens only), their text (when a tokenizer is known) and stats."""

    ids: list
    text: str | None
    finish_reason: str  # "eos", "stop_token", "stop_string" or "length"
    stats: GenerationStats
