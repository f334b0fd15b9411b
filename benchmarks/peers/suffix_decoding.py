"""Snowflake's SuffixDecoding (`arctic-inference`, its compiled suffix tree), fed as vLLM feeds it.

Follows `arctic_inference/vllm/model_runner.py` (`_update_suffix_cache`,
`propose_suffix_draft_token_ids`) and `arctic_inference/vllm/config.py` defaults: one
`SuffixDecodingCache(max_tree_depth=64, max_cached_requests=100000)` kept across requests;
`start_request(prompt)` when a request first returns tokens, `add_active_response(tokens)` with
every step's verified tokens (this also feeds the global tree of responses), `speculate` on the
last 64 tokens with `max_spec_factor=1.0`, `max_spec_offset=0.0`, `min_token_prob=0.1`, and
`max_spec_tokens` = the budget; `stop_request` at the end. `tree=True` sets `use_tree_spec`.
"""

from __future__ import annotations

import numpy as np


class SuffixDecodingDrafter:
    """SuffixDecoding as a chain (vLLM's way) or a tree (`tree=True`)."""

    def __init__(
        self,
        tree: bool = False,
        max_depth: int = 64,
        max_cached_requests: int = 100000,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
    ):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(
            max_tree_depth=max_depth, max_cached_requests=max_cached_requests
        )
        self.tree, self.max_depth = tree, max_depth
        self.kw = dict(
            max_spec_factor=max_spec_factor,
            max_spec_offset=max_spec_offset,
            min_token_prob=min_token_prob,
            use_tree_spec=tree,
        )
        self.name = "SuffixDecoding " + ("tree" if tree else "chain")

    def start_request(self, rid, prompt):
        if rid in self.cache.cached_requests:
            self.cache.evict_cached_response(rid)
        self.cache.start_request(rid, np.ascontiguousarray(prompt, dtype=np.int32))

    def draft(self, rid, context, budget):
        pattern = np.ascontiguousarray(context[-self.max_depth :], dtype=np.int32)
        d = self.cache.speculate(rid, pattern, max_spec_tokens=budget, **self.kw)
        return list(d.token_ids), list(d.parents)

    def extend(self, rid, context, new_tokens):
        self.cache.add_active_response(rid, np.ascontiguousarray(new_tokens, dtype=np.int32))

    def finish_request(self, rid):
        self.cache.stop_request(rid)
