"""The copy-oracle: the most tokens any drafter that copies seen text could get accepted.

At output position `pos` of a request, the oracle accepts the longest prefix of the true
continuation `output[pos:]` (capped at the budget, and leaving the bonus token) that occurs right
after an occurrence of a suffix of the current context anywhere in the text seen so far: all
earlier requests' prompts and outputs (each output right after its prompt, one document), this
request's prompt, and its verified output `output[:pos]`. Any non-empty suffix's occurrence
contains one of the last token alone, so the search is for `[context[-1]] +
continuation[:L]` inside one seen document, ending before `pos`.

A drafter whose every draft path is one contiguous copy of seen text after a match of at least
one token can never accept more at the same step. A drafter that chains overlapping n-grams
can: on periodic text (a model stuck in a loop) it keeps walking the period past what was ever
seen contiguously. So exceeding the copy-oracle is counted, not an error. The hard check is the
leak check: every accepted token, with the token before it, must form a bigram that occurs in
the seen text (`first_seen`); any n-gram drafter passes it, a drafter that reads the future
does not.
"""

from __future__ import annotations

import numpy as np

# The oracle's name in result tables.
ORACLE = "copy-oracle"


class CopyOracle:
    """Seen documents of one simulator pass, and per-position oracle lengths for the next one."""

    def __init__(self, max_budget: int = 32):
        if max_budget < 1:
            raise ValueError(f"max_budget must be >= 1, got {max_budget}")
        self.max_budget = max_budget
        self._seen = np.full(1 << 16, -1, dtype=np.int64)
        self._n = 0  # documents are separated by one -1 so no match spans two of them
        self._bigrams: set[int] = set()

    def _append(self, tokens: np.ndarray) -> None:
        need = self._n + tokens.shape[0] + 1
        if need > self._seen.shape[0]:
            grown = np.full(max(need, 2 * self._seen.shape[0]), -1, dtype=np.int64)
            grown[: self._n] = self._seen[: self._n]
            self._seen = grown
        self._seen[self._n : self._n + tokens.shape[0]] = tokens
        self._n += tokens.shape[0] + 1

    @staticmethod
    def _bigram_keys(tokens: np.ndarray) -> list[int]:
        t = tokens.astype(np.int64)
        return ((t[:-1] << 32) | t[1:]).tolist()

    def first_seen(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """`F[j]`: the smallest `pos` at which the bigram `(output[j-1], output[j])` is in the
        seen text (0 if earlier requests, the prompt or the bigram from the prompt's last token
        to `output[0]` hold it). Accepting `output[j]` at a step
        at `pos < F[j]` proposes a bigram never seen: a leak. Call before `lengths`."""
        # The prompt's bigrams and the one across the prompt/output boundary: the prefill's
        # token follows the prompt before any draft.
        local = set(self._bigram_keys(np.concatenate([prompt, output[:1]]).astype(np.int64)))
        keys = self._bigram_keys(output.astype(np.int64))
        first = np.zeros(output.shape[0], dtype=np.int64)
        first_idx: dict[int, int] = {}
        for j, key in enumerate(keys, start=1):
            if key in self._bigrams or key in local:
                continue
            k = first_idx.setdefault(key, j)
            first[j] = k + 1  # seen once output[:pos] includes index k
        return first

    def lengths(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """`L[pos]` for `pos` in `[0, len(output))`: the oracle's accepted tokens at `pos`
        (uncapped by any budget below `max_budget`; `L[0]` is unused, position 0 is the
        prefill's token). Then records the request as seen."""
        h = self._n
        text = np.concatenate([self._seen[:h], prompt.astype(np.int64), output.astype(np.int64)])
        base = h + prompt.shape[0]
        out = np.zeros(output.shape[0], dtype=np.int32)
        for pos in range(1, output.shape[0]):
            c = base + pos  # first unseen index; text[:c] is what the drafter has seen
            cap = min(self.max_budget, output.shape[0] - pos - 1)
            if cap <= 0:
                continue
            starts = np.flatnonzero(text[: c - 1] == text[c - 1]) + 1
            length = 0
            while length < cap and starts.size:
                # A match must stay inside the seen text, so starts + length < c.
                starts = starts[
                    (starts + length < c)
                    & (text[np.minimum(starts + length, c - 1)] == text[c + length])
                ]
                if starts.size:
                    length += 1
            out[pos] = length
        # One document: the output follows its prompt (drafters index n-grams across the two).
        doc = np.concatenate([prompt, output]).astype(np.int64)
        self._append(doc)
        self._bigrams.update(self._bigram_keys(doc))
        return out
