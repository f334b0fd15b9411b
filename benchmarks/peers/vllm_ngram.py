"""vLLM's n-gram proposer, re-implemented (vLLM is not installable here without its CUDA stack).

Follows `vllm/v1/spec_decode/ngram_proposer.py` (`_find_longest_matched_ngram_and_propose_tokens`,
vLLM v0.10-v0.11): KMP over the reversed context finds the longest n-gram, `min_n <= n <= max_n`,
that ends the context and occurs earlier; the earliest such occurrence wins and the (up to) `k`
tokens after it are the draft. No cross-request state: the proposer sees the request's own
context (prompt + output) only. Defaults when neither bound is given
(`vllm/config/speculative.py`): `prompt_lookup_min = prompt_lookup_max = 5`; `k` is
`num_speculative_tokens`, i.e. the budget. Compiled with numba, as vLLM does.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # numba is optional: the same code runs as plain Python, only slower

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)


@njit(cache=True)
def find_longest_matched_ngram(
    origin_tokens: np.ndarray, min_ngram: int, max_ngram: int, max_model_len: int, k: int
) -> np.ndarray:
    """The draft vLLM's `_find_longest_matched_ngram_and_propose_tokens` returns (maybe empty)."""
    total_token = origin_tokens.shape[0]
    if total_token < min_ngram:
        return origin_tokens[:0]
    k = min(k, max_model_len - total_token)
    if k <= 0:
        return origin_tokens[:0]
    tokens = origin_tokens[::-1]
    # lps[i]: longest proper prefix of tokens[:i+1] that is also its suffix, for i < max_ngram.
    lps = np.zeros(max_ngram, dtype=np.int32)
    longest_ngram = 0
    position = 0
    prev_lps = 0
    i = 1
    while i < total_token:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            # `>=`: a later position in the reversed tokens is an earlier one in the original.
            if prev_lps >= longest_ngram:
                longest_ngram = prev_lps
                position = i
            if i < max_ngram:
                lps[i] = prev_lps
            if prev_lps == max_ngram:
                prev_lps = lps[max_ngram - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest_ngram < min_ngram:
        return origin_tokens[:0]
    start_position = total_token - 1 - position + longest_ngram
    k = min(k, total_token - start_position)
    return origin_tokens[start_position : start_position + k]


class VllmNgramDrafter:
    """vLLM's `NgramProposer` for one budget; `min_n = max_n = 5` are vLLM's defaults."""

    def __init__(self, min_n: int = 5, max_n: int = 5, max_model_len: int = 1 << 30):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n, self.max_model_len = min_n, max_n, max_model_len
        self.name = "vLLM ngram" + ("" if (min_n, max_n) == (5, 5) else f" {min_n}-{max_n}")
        # Compile now (vLLM warms up in its constructor too), never inside a timed step.
        find_longest_matched_ngram(np.zeros(16, np.int32), min_n, max_n, max_model_len, 4)

    def start_request(self, rid, prompt):
        pass

    def draft(self, rid, context, budget):
        d = find_longest_matched_ngram(context, self.min_n, self.max_n, self.max_model_len, budget)
        return d.tolist(), list(range(-1, len(d) - 1))

    def extend(self, rid, context, new_tokens):
        pass

    def finish_request(self, rid):
        pass
