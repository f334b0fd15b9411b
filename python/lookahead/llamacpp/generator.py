"""`LlamaCppGenerator`: lookahead decoding of a GGUF model on llama.cpp (greedy, batch 1).

Each step drafts a tree from the shared cache (`lookahead.hf.proposal.propose`: the
request's own trie and the namespace's history, cut by the sizer), verifies all of it in
one `llama_decode` (`lookahead.llamacpp.tree`), keeps the accepted path in the KV cache and
tells the cache and the sizer what happened. `plain_generate` is llama.cpp's own greedy
decoding, one token per forward in a context of one sequence: the baseline and the
reference for exactness.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from lookahead.cache import LookaheadCache
from lookahead.hf.proposal import propose
from lookahead.hf.stats import GenerationResult, GenerationStats
from lookahead.llamacpp.model import DEFAULT_SEQS, LlamaCppModel
from lookahead.llamacpp.tree import argmax_rows, branches, greedy_path, keep_path, tree_batch
from lookahead.sizing import CostAwareSizer, Sizer, Step


def _check_request(model: LlamaCppModel, ids: list, max_new_tokens: int) -> None:
    if not ids:
        raise ValueError("the prompt must hold at least one token")
    if (
        not isinstance(max_new_tokens, int)
        or isinstance(max_new_tokens, bool)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    bad = [t for t in ids if not 0 <= int(t) < model.n_vocab]
    if bad:
        raise ValueError(f"token ids must be in [0, {model.n_vocab}), got {bad[0]}")
    need = len(ids) + max_new_tokens + 1
    if need > model.n_ctx:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"context of {model.n_ctx} tokens"
        )


def _finish(model: LlamaCppModel, out: list, max_new: int) -> tuple[list, str]:
    """`out` cut after its first end-of-generation token or at `max_new` tokens."""
    for i, t in enumerate(out[:max_new]):
        if model.is_eog(t):
            return out[: i + 1], "eos"
    return out[:max_new], "length"


def plain_generate(model: LlamaCppModel, ids: list, max_new_tokens: int) -> list:
    """llama.cpp's greedy decoding of `ids` in sequence 0: one token per `llama_decode`,
    logits for that token only. Returns the new tokens (through an end-of-generation one)."""
    _check_request(model, ids, max_new_tokens)
    model.reset()
    logits = model.prefill(list(ids), [0])
    out = [int(np.argmax(logits))]
    pos = len(ids)
    while len(out) < max_new_tokens and not model.is_eog(out[-1]):
        row = model.decode([out[-1]], [pos], [[0]], [True])[0]
        out.append(int(np.argmax(row)))
        pos += 1
    return _finish(model, out, max_new_tokens)[0]


def _fit_branches(tokens, parents, scores, n_seqs: int):
    """The longest prefix of the best-first tree with at most `n_seqs` branches."""
    k = len(tokens)
    while k > 1 and len(branches(parents[:k])[1]) > n_seqs:
        k -= 1
    return tokens[:k], parents[:k], None if scores is None else scores[:k]


class LlamaCppGenerator:
    """Lookahead decoding for one GGUF model on llama.cpp.

    `model`: a `LlamaCppModel` or a path to a GGUF file (then `n_ctx` and `n_threads` go to
    it); `cache`: a `LookaheadCache` (default: a new one), whose history every request of
    this generator shares under `namespace` (default: the GGUF file's name); `sizer`: the
    draft-sizing policy (`lookahead.sizing`; default a `CostAwareSizer` whose start-up curve
    `lookahead.llamacpp.costs.measure_costs` times on this model, about a second)."""

    def __init__(
        self,
        model,
        cache: LookaheadCache | None = None,
        sizer: Sizer | None = None,
        namespace: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
    ):
        if isinstance(model, LlamaCppModel):
            self.model = model
        else:
            self.model = LlamaCppModel(
                model, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=DEFAULT_SEQS
            )
        self.cache = cache if cache is not None else LookaheadCache()
        if sizer is None:
            from lookahead.llamacpp.costs import measure_costs

            sizer = CostAwareSizer(costs=measure_costs(self.model))
        self.sizer = sizer
        self.namespace = namespace or self.model.path.name
        self._n = 0

    def generate(
        self,
        prompt,
        max_new_tokens: int = 128,
        on_tokens: Callable[[list, str], None] | None = None,
    ) -> GenerationResult:
        """Greedy lookahead decoding of `prompt` (text, tokenized with the model's own
        tokenizer and special tokens, or a list of token ids): the tokens llama.cpp's own
        greedy decoding gives where its kernels are batch-invariant (`plain_generate`)."""
        m = self.model
        ids = m.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        _check_request(m, ids, max_new_tokens)
        st = GenerationStats(prompt_tokens=len(ids))
        self.sizer.start(m)
        t_start = time.perf_counter()
        n_seqs = m.n_seq_max
        m.reset()
        logits = m.prefill(ids, list(range(n_seqs)))
        st.prefill_s = time.perf_counter() - t_start
        out = [int(np.argmax(logits))]
        n_past = len(ids)  # tokens in the KV cache; out[-1] is the next root, not in it yet
        self._n += 1
        rid = f"llamacpp-{id(self)}-{self._n}"
        self.cache.start_request(rid, ids, namespace=self.namespace)
        try:
            self.cache.extend(rid, out)
            if on_tokens:
                on_tokens(list(out), m.detokenize(out))
            last = 0
            while len(out) < max_new_tokens and not m.is_eog(out[-1]):
                t0 = time.perf_counter()
                p = propose(
                    self.cache,
                    rid,
                    out[-1],
                    budget=self.sizer.budget(last),
                    room=max_new_tokens - len(out),
                    multi_branch=True,
                    vocab=m.n_vocab,
                    cut=lambda s, par, n=n_past, la=last: self.sizer.cut(s, par, n, la, False),
                )
                tokens, parents, _ = _fit_branches(p.tokens, p.parents, p.scores, n_seqs)
                t1 = time.perf_counter()
                batch = tree_batch(tokens, parents, n_past, n_seqs)
                t2 = time.perf_counter()
                rows = m.decode(*batch, [True] * len(tokens))
                t3 = time.perf_counter()
                path, bonus = greedy_path(tokens, parents, argmax_rows(rows))
                t4 = time.perf_counter()
                keep_path(m, batch[2], path, n_past, n_seqs)
                t5 = time.perf_counter()
                emitted = [int(tokens[i]) for i in path[1:]] + [bonus]
                n_past += len(path)
                st.record_step(len(path) - 1, len(tokens) - 1, (t0, t1, t2, t3, t4, t5))
                st.skipped_drafts += p.skipped
                last = self.sizer.observe(
                    Step(
                        rows=len(tokens),
                        context_len=n_past - len(path),
                        forward_s=t3 - t2,
                        host_s=(t2 - t0) + (t5 - t3),
                        drafted=p.drafted,
                        path=path,
                        emitted=emitted,
                        sampled=False,
                        last=last,
                    )
                )
                # Only the step's tokens are looked at: the output before them ends in none.
                new, _ = _finish(m, emitted, max_new_tokens - len(out))
                out.extend(new)
                self.cache.extend(rid, new)
                if on_tokens and new:
                    on_tokens(new, m.detokenize(new))
        finally:
            self.cache.finish_request(rid)
            self.sizer.finish()
        out, reason = _finish(m, out, max_new_tokens)
        st.new_tokens = len(out)
        st.total_s = time.perf_counter() - t_start
        text = m.detokenize(out) if m.has_text else None
        return GenerationResult(ids=out, text=text, finish_reason=reason, stats=st)
