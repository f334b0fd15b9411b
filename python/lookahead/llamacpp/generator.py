"""`LlamaCppGenerator`: lookahead decoding of a GGUF model on llama.cpp (batch size 1).

Each step drafts a tree from the shared cache (`lookahead.hf.proposal.propose`: the
request's own trie and the namespace's history, cut by the sizer), verifies all of it in
one `llama_decode` (`lookahead.llamacpp.tree`), judges it greedy or by exact speculative
sampling (`lookahead.llamacpp.verify`), keeps the accepted path in the KV cache and tells
the cache and the sizer what happened; where the output ends (end-of-generation tokens,
stop strings, `max_new_tokens`) and the streamed text are the HF engine's
(`lookahead.hf.stopping`). `plain_generate` is llama.cpp's own decoding, one token per
forward in a context of one sequence, by the same verdict on a root-only tree: the baseline
and the reference for exactness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lookahead.cache import LookaheadCache
from lookahead.hf.proposal import propose
from lookahead.hf.sampling import SamplingConfig
from lookahead.hf.stats import GenerationResult, GenerationStats
from lookahead.hf.stopping import TextTracker, find_cut
from lookahead.llamacpp.model import DEFAULT_SEQS, LlamaCppModel
from lookahead.llamacpp.tree import SequenceBook, branches, tree_batch
from lookahead.llamacpp.verify import Verifier
from lookahead.sizing import UNSET, CostAwareSizer, Sizer, Step, sizer_from


class _EndTokens:
    """The model's end-of-generation tokens as a set `find_cut` can ask."""

    def __init__(self, model: LlamaCppModel):
        self.model = model

    def __contains__(self, token) -> bool:
        return self.model.is_eog(token)


class _Text:
    """The model's detokenizer as the tokenizer `TextTracker` reads."""

    def __init__(self, model: LlamaCppModel):
        self.model = model

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.model.detokenize(ids, special=not skip_special_tokens)


def sampling_config(do_sample=False, temperature=None, top_k=None, top_p=None) -> SamplingConfig:
    """The request's sampling settings (unset: greedy; temperature 1, top-k and top-p off)."""
    return SamplingConfig(
        bool(do_sample),
        1.0 if temperature is None else temperature,
        0 if top_k is None else top_k,
        1.0 if top_p is None else top_p,
    )


def check_request(model: LlamaCppModel, ids: list, max_new_tokens: int) -> None:
    """ValueError unless `ids` and `max_new_tokens` fit `model` (before any forward)."""
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


def plain_generate(
    model: LlamaCppModel,
    ids: list,
    max_new_tokens: int,
    cfg: SamplingConfig | None = None,
    seed: int | None = 0,
    times: dict | None = None,
) -> list:
    """llama.cpp's decoding of `ids` in sequence 0, greedy unless `cfg` samples (with
    `seed`): one token per `llama_decode`, logits for that token only. Returns the new
    tokens (through an end-of-generation one); `times` gets `prefill_s` and `total_s`."""
    check_request(model, ids, max_new_tokens)
    verdict = Verifier(cfg or SamplingConfig(), seed)
    t0 = time.perf_counter()
    model.reset()
    row = model.prefill(list(ids), [0])
    if times is not None:
        times["prefill_s"] = time.perf_counter() - t0
    out: list = []
    pos = len(ids)
    while True:
        out.append(verdict(row[None], [out[-1] if out else 0], [-1], [0], len(out))[1])
        if len(out) >= max_new_tokens or model.is_eog(out[-1]):
            if times is not None:
                times["total_s"] = time.perf_counter() - t0
            return out  # it ends at its first end-of-generation token or at the limit
        row = model.decode([out[-1]], [pos], [[0]], [True], copy=False)[0]
        pos += 1


def _fit_branches(tokens, parents, scores, n_seqs: int):
    """The longest prefix of the best-first tree with at most `n_seqs` branches."""
    k = len(tokens)
    while k > 1 and len(branches(parents[:k])[1]) > n_seqs:
        k -= 1
    return tokens[:k], parents[:k], None if scores is None else scores[:k]


class LlamaCppGenerator:
    """Lookahead decoding for one GGUF model on llama.cpp.

    `model`: a `LlamaCppModel` or a path to a GGUF file (then `n_ctx` and `n_threads` go to
    it); `cache`: a `LookaheadCache` (default: a new one storing n-grams up to `depth`),
    whose history every request of this generator shares under `namespace` (default: the
    GGUF file's name); the sizing as the HF engine reads it (`lookahead.sizing.sizer_from`):
    `sizer`, or the fixed policy's `budget` / `max_budget` / `min_draft_score`, else a
    `CostAwareSizer` whose start-up curve is the one kept for this GGUF file, machine and
    context (`lookahead.costs.load_or_measure`), timed by
    `lookahead.llamacpp.costs.measure_costs` at the first load (about a second) and
    corrected by every later run (`cost_model` gives one instead, kept nowhere); `multi_branch`
    False drafts one chain. The start-up curve is read or measured here, before any request."""

    def __init__(
        self,
        model,
        cache: LookaheadCache | None = None,
        sizer: Sizer | None = None,
        namespace: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        *,
        budget: int | None = None,
        max_budget: int | None = None,
        min_draft_score: float | None = None,
        cost_model=UNSET,
        depth: int | None = None,
        multi_branch: bool = True,
    ):
        if isinstance(model, LlamaCppModel):
            self.model = model
        else:
            self.model = LlamaCppModel(
                model, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=DEFAULT_SEQS
            )
        self.sizer = sizer_from(sizer, budget, max_budget, min_draft_score, cost_model)
        self.sizer.start(self.model)
        if cache is None:
            cache = LookaheadCache() if depth is None else LookaheadCache(max_depth=depth)
        self.cache = cache
        self.multi_branch = bool(multi_branch)
        self.namespace = namespace or self.model.path.name
        self._n = 0

    @property
    def cost_model(self):
        """The start-up cost curve the cost-aware sizer corrects (None for another sizer)."""
        return self.sizer.cost_model if isinstance(self.sizer, CostAwareSizer) else None

    def encode(self, prompt, chat: bool = False) -> list:
        """Prompt ids (`LlamaCppModel.encode`)."""
        return self.model.encode(prompt, chat)

    def generate(
        self,
        prompt,
        max_new_tokens: int = 128,
        on_tokens: Callable[[list, str], None] | None = None,
        *,
        chat: bool = False,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = 0,
        stop_strings: Sequence[str] = (),
    ) -> GenerationResult:
        """Lookahead decoding of `prompt` (text, tokenized with the model's own tokenizer,
        as a chat turn if `chat`; or token ids): greedy, the tokens llama.cpp's own greedy
        decoding gives where its kernels are batch-invariant (`plain_generate`); sampled
        (`do_sample`, with `temperature`, `top_k`, `top_p` as HF reads them, `seed`), the
        distribution of plain sampling, and with a seed the same tokens as
        `plain_generate(..., cfg, seed)` where the kernels are batch-invariant. The output
        ends after an end-of-generation token, or where a stop string completes, or at
        `max_new_tokens`; `on_tokens(new_ids, text_delta)` is called after every step."""
        m = self.model
        cfg = sampling_config(do_sample, temperature, top_k, top_p)
        stops = list(stop_strings)
        if any(not isinstance(x, str) or not x for x in stops):
            raise ValueError("stop_strings must be non-empty strings")
        if stops and not m.has_text:
            raise ValueError(f"{m.path.name} has no tokenizer: stop strings need one")
        ids = m.encode(prompt, chat)
        check_request(m, ids, max_new_tokens)
        text = TextTracker(_Text(m), stops, ids) if m.has_text else None
        verdict = Verifier(cfg, seed)
        st = GenerationStats(prompt_tokens=len(ids))
        self.sizer.start(m)
        t_start = time.perf_counter()
        n_seqs = m.n_seq_max if self.multi_branch else 1
        m.reset()
        book = SequenceBook(m)
        row = m.prefill(ids, [0])
        book.reset(len(ids))
        st.prefill_s = time.perf_counter() - t_start
        out: list = []
        n_past = len(ids)  # tokens in the KV cache; out[-1] is the next root, not in it yet
        self._n += 1
        rid = f"llamacpp-{id(self)}-{self._n}"
        ends = _EndTokens(m)
        self.cache.start_request(rid, ids, namespace=self.namespace)
        try:
            first = verdict(row[None], [ids[-1]], [-1], [0], 0)[1]
            emitted, last, reason = [first], 0, None
            learn_s = 0.0  # the last step's time in the sizer's `observe`
            while True:
                te = time.perf_counter()
                start = len(out)
                out.extend(emitted)
                cut, reason = find_cut(out, start, ends, set(), text, max_new_tokens)
                if cut is not None:
                    del out[cut:]
                new = out[start:]  # added to the context by the draft's call (`propose`)
                st.drafter_s += learn_s
                if cut is not None:  # the final tokens too join the shared history
                    tx = time.perf_counter()
                    self.cache.extend(rid, new)
                    st.drafter_s += time.perf_counter() - tx
                caller_s = 0.0  # in `on_tokens`: the caller's time, not the step's
                if on_tokens and new:
                    delta = text.delta(out, cut is not None) if text else ""
                    tc = time.perf_counter()
                    on_tokens(out[start:], delta)
                    caller_s = time.perf_counter() - tc
                t0 = time.perf_counter()
                emit_s = t0 - te - caller_s
                st.other_s += emit_s
                if cut is not None:
                    break
                # The host's time between the last forward and this one, outside the stages.
                between = learn_s + emit_s
                p = propose(
                    self.cache,
                    rid,
                    out[-1],
                    budget=self.sizer.budget(last),
                    room=max_new_tokens - len(out),
                    multi_branch=self.multi_branch,
                    vocab=m.n_vocab,
                    cut=lambda s, par, mt, n=n_past, la=last: self.sizer.cut(
                        s, par, mt, n, la, cfg.do_sample
                    ),
                    new_tokens=new,
                )
                tokens, parents, _ = _fit_branches(p.tokens, p.parents, p.scores, n_seqs)
                t1 = time.perf_counter()
                st.drafter_s += t1 - t0
                batch = tree_batch(tokens, parents, n_past, m.n_seq_max)
                book.ready(len(batch[2][0]), n_past)
                t2 = time.perf_counter()
                rows = m.decode(*batch, [True] * len(tokens), copy=False)  # read at once
                t3 = time.perf_counter()
                depth = [q - n_past for q in batch[1]]
                path, bonus = verdict(rows, tokens, parents, depth, len(out))
                t4 = time.perf_counter()
                book.keep(batch[2], path, n_past)
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
                        host_s=(t2 - t0) + (t5 - t3) + between,
                        drafted=p.drafted,
                        path=path,
                        emitted=emitted,
                        sampled=cfg.do_sample,
                        last=last,
                    )
                )
                learn_s = time.perf_counter() - t5
                st.other_s += learn_s
        finally:
            self.cache.finish_request(rid)
            self.sizer.finish()
        st.new_tokens = len(out)
        st.total_s = time.perf_counter() - t_start
        shown = text.text(out) if text else None
        return GenerationResult(ids=out, text=shown, finish_reason=reason, stats=st)
