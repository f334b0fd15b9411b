"""HF transformers' prompt lookup decoding (PLD), calling transformers' own generator.

`transformers.generation.candidate_generator.PromptLookupCandidateGenerator` (5.23) needs no
model: `get_candidates(input_ids)` scans the request's own context for the last
`max_matching_ngram_size` .. 1 tokens (longest first, first occurrence left to right) and
proposes the `num_output_tokens` tokens after it, cut at the first eos. HF `generate` builds it
with `num_output_tokens = prompt_lookup_num_tokens` (the docs' example uses 10) and
`max_matching_ngram_size = 2` (its default). No cross-request state.
"""

from __future__ import annotations

import numpy as np


class PldDrafter:
    """PLD with `num_output_tokens` tokens (None: the budget), at most `budget` per step."""

    def __init__(
        self,
        num_output_tokens: int | None = 10,
        max_matching_ngram_size: int = 2,
        eos_token_id: int | None = None,
    ):
        import torch
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        self._torch = torch
        self._cls = PromptLookupCandidateGenerator
        self.num_output_tokens = num_output_tokens
        self.max_matching_ngram_size = max_matching_ngram_size
        self._eos = None if eos_token_id is None else torch.tensor([eos_token_id])
        self._gens: dict[int, object] = {}
        self.name = "PLD" + ("" if num_output_tokens == 10 else " B tokens")

    def _gen(self, budget: int):
        n = budget if self.num_output_tokens is None else self.num_output_tokens
        if n not in self._gens:
            self._gens[n] = self._cls(
                eos_token_id=self._eos,
                num_output_tokens=n,
                max_matching_ngram_size=self.max_matching_ngram_size,
                max_length=1 << 30,
            )
        return self._gens[n]

    def start_request(self, rid, prompt):
        pass

    def draft(self, rid, context, budget):
        # int64 like generate's input_ids; the copy is part of what a caller pays per step.
        ids = self._torch.from_numpy(context.astype(np.int64))[None]
        cand, _ = self._gen(budget).get_candidates(ids)
        d = cand[0, context.shape[0] :][:budget].tolist()
        return d, list(range(-1, len(d) - 1))

    def extend(self, rid, context, new_tokens):
        pass

    def finish_request(self, rid):
        pass
