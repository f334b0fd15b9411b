"""Ours: `lookahead.LookaheadCache`, fed as the HF engine feeds it.

One cache for all requests; `start_request(prompt)`, then `extend` with the prefill's token and
with every step's verified tokens, `draft(budget, multi_branch)`, `finish_request`. Prompt
indexing runs in the foreground here (`background_indexing=False`) so its cost is counted at
request start, not hidden in the first draft. Extra keyword arguments go to the constructor, so
the simulator can score the cache's knobs.
"""

from __future__ import annotations


class OursDrafter:
    """Our trie, single-branch (`multi_branch=False`) or multi-branch; with `recycle_k > 0`
    also the target's recycled predictions, which the simulator hands to `extend` as
    `predictions` (the rows of the tokens it verified that step, as the engine does)."""

    def __init__(self, multi_branch: bool = True, label: str = "", **cache_kwargs):
        from lookahead import LookaheadCache

        cache_kwargs.setdefault("background_indexing", False)
        self.cache = LookaheadCache(**cache_kwargs)
        self.multi_branch = multi_branch
        self.recycles = self.cache.config["recycle_k"] > 0
        kind = ("multi" if multi_branch else "single") + (" +recycled" if self.recycles else "")
        self.name = "lookahead " + kind + (f" {label}" if label else "")

    def start_request(self, rid, prompt, predictions=None):
        """`predictions`: the prefill's rows, after each of the last `len(rows)` prompt
        tokens but the last one."""
        self.cache.start_request(rid, prompt)
        if predictions is not None:
            n = len(predictions[0])
            self.cache.recycle(rid, prompt[len(prompt) - 1 - n : -1], *predictions)

    def draft(self, rid, context, budget):
        d = self.cache.draft(rid, budget=budget, multi_branch=self.multi_branch)
        # Node 0 is the root (the last context token): drop it and shift the parents (on
        # lists: numpy's slice, astype and subtract cost more than the draft's own arrays).
        return d.tokens.tolist()[1:], [p - 1 for p in d.parents.tolist()[1:]]

    def extend(self, rid, context, new_tokens, predictions=None):
        if predictions is None:
            self.cache.extend(rid, new_tokens)
        else:
            self.cache.extend(rid, new_tokens, *predictions)

    def finish_request(self, rid):
        self.cache.finish_request(rid)
