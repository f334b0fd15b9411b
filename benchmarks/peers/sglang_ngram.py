"""SGLang's NGRAM corpus (the C++ trie in the `sglang` wheel), fed as SGLang's worker feeds it.

The corpus is SGLang's own C++ (`sglang/kernels/jit/csrc/ngram_corpus/`), compiled on first use
by SGLang's JIT loader through `apache-tvm-ffi` (about a minute on 2 cores, then cached under
`~/.cache/sglang`), and called through SGLang's wrapper
`sglang.srt.speculative.cpp_ngram.ngram_corpus.NgramCorpus`.

Feeding follows `sglang/srt/speculative/ngram_worker.py` (sglang 0.5.23, non-overlap mode): one
corpus for all requests; per decode step, `batch_get` on the last `max_trie_depth` (18) tokens of
the context with the request's total length (stateful match), and after verification
`batch_put` of that same tail (`_update_ngram_corpus`); the prompt is never inserted (the
worker's FIXME), and `erase_match_state` when the request leaves. Defaults are SGLang's server
arguments: `max_trie_depth=18`, `min_bfs_breadth=1`, `max_bfs_breadth=10`,
`capacity=10_000_000`; `draft_token_num` = budget + 1 (it counts the root). The labelled variant
`insert_prompt=True` also puts the whole prompt at request start.

SGLang's package `__init__` imports its HTTP server stack (aiohttp, ...), which `--no-deps`
leaves out; only the corpus modules are imported here, so the package is entered without
running that `__init__`.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np


def _import_corpus_class():
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("sglang is not installed (see requirements/peers.txt)")
        pkg = types.ModuleType("sglang")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        sys.modules["sglang"] = pkg
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    return NgramCorpus


def mask_to_parents(mask: np.ndarray) -> list[int]:
    """Parents (over all `d` nodes, root = node 0) from SGLang's `d x d` ancestor mask."""
    d = mask.shape[0]
    parents = [-1] * d
    for i in range(1, d):
        anc = np.flatnonzero(mask[i, :i])
        parents[i] = int(anc[-1]) if anc.size else 0
    return parents


class SglangNgramDrafter:
    """SGLang NGRAM corpus for one budget; `match_type` is "BFS" or "PROB"."""

    def __init__(
        self,
        budget: int,
        match_type: str = "BFS",
        insert_prompt: bool = False,
        max_trie_depth: int = 18,
        min_bfs_breadth: int = 1,
        max_bfs_breadth: int = 10,
        capacity: int = 10_000_000,
    ):
        corpus_cls = _import_corpus_class()
        self.corpus = corpus_cls(
            max_trie_depth=max_trie_depth,
            min_bfs_breadth=min_bfs_breadth,
            max_bfs_breadth=max_bfs_breadth,
            draft_token_num=budget + 1,
            match_type=match_type,
            capacity=capacity,
        )
        self.budget, self.depth, self.insert_prompt = budget, max_trie_depth, insert_prompt
        self.name = f"SGLang NGRAM {match_type}" + (" +prompt" if insert_prompt else "")
        self._tails: dict[object, list[int]] = {}

    def start_request(self, rid, prompt):
        if self.insert_prompt:
            self.corpus.batch_put([prompt.tolist()])

    def draft(self, rid, context, budget):
        if budget != self.budget:
            raise ValueError(f"{self.name} was built for budget {self.budget}, asked {budget}")
        tail = self._tails[rid] = context[-self.depth :].tolist()
        self.corpus.synchronize()
        ids, mask = self.corpus.batch_get([str(rid)], [tail], [int(context.shape[0])])
        d = budget + 1
        parents = mask_to_parents(mask.reshape(d, d))
        # Drop the root (node 0); padding nodes (token 0 under the root) are kept: SGLang
        # verifies them like any other node.
        return ids[1:d].tolist(), [p - 1 for p in parents[1:]]

    def extend(self, rid, context, new_tokens):
        # After verification the worker puts the tail it matched on; the prefill puts nothing.
        tail = self._tails.pop(rid, None)
        if tail:
            self.corpus.batch_put([tail])

    def finish_request(self, rid):
        self._tails.pop(rid, None)
        self.corpus.erase_match_state([str(rid)])
        # Untimed: the insert thread must not run on into another drafter's timed turn.
        self.corpus.synchronize()
