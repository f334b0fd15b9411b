"""The HF engine's loop: `LookaheadGenerator.generate` runs one request through the stages
of this package (see its docstring), one tree forward per step: propose a tree from the
shared `LookaheadCache`, build its inputs, run one forward over it on top of the KV cache,
verify, keep the accepted path's KV, end the output where it stops, and hand the emitted
tokens back to the cache. Greedy output equals `model.generate(do_sample=False)`; sampling
keeps the target distribution.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence

import torch

from lookahead import _core
from lookahead.hf.acceptance import Acceptance
from lookahead.hf.inputs import (
    Request,
    as_id_set,
    attention,
    check_bool,
    check_call,
    check_context,
    context_length,
    encode,
    eos_ids,
    sampling_config,
)
from lookahead.hf.kv import (
    check_cache_layers,
    check_model_supports_kv,
    keep_path,
    last_logits_only,
    new_cache,
)
from lookahead.hf.prefill import prefill
from lookahead.hf.proposal import propose
from lookahead.hf.recycling import RECYCLE_K, hand_over
from lookahead.hf.stats import GenerationResult, GenerationStats, TokenCallback
from lookahead.hf.stopping import TextTracker, find_cut
from lookahead.hf.tree_inputs import TreeInputs
from lookahead.sizing import (
    AUTO_MAX_NODES,
    DEEP_ACCEPT,
    FIXED_BUDGET,
    UNSET,
    CostAwareSizer,
    FixedSizer,
    Sizer,
    Step,
    check_budget,
    sizer_from,
)

# The cache a generator builds stores n-grams up to the core's default depth.
DEFAULT_DEPTH = _core.DEFAULTS["max_depth"]
__all__ = ["AUTO_MAX_NODES", "DEEP_ACCEPT", "FIXED_BUDGET", "LookaheadGenerator", "generate"]


# Request ids of every generator in this process: generators may share one cache.
_REQUEST_IDS = itertools.count()


class LookaheadGenerator:
    """Lookahead decoding for one HF causal LM, with a `LookaheadCache` shared across calls.

    Outputs of earlier requests stay in the cache's shared history, so later requests can draft
    from them. How many drafted nodes each step verifies is `sizer`'s call
    (`lookahead.sizing`): by default a `CostAwareSizer`, which verifies the prefix of the
    drafter's best-first tree (up to `AUTO_MAX_NODES` nodes) that maximises expected tokens
    per second on this machine, by what forwards cost here (measured once per model, dtype,
    device, CPU and threads, corrected by every forward this generator runs, and kept on
    disk) and what drafted nodes were worth in this generator's verify results.

    Shorthands instead of `sizer`: `budget`, `max_budget` and `min_draft_score` (any of them
    given, even 0, without `cost_model`) build a `FixedSizer`: `budget` nodes per step
    (`FIXED_BUDGET` if only the others are given), up to `max_budget` after a step that
    accepted `DEEP_ACCEPT` or more (default, and at least, `budget`), a draft whose path
    scores sum below `min_draft_score` (default 0) dropped for the root alone. So
    `budget=16` switches the cost-aware choice off. `cost_model` (a `CostModel`, or "auto")
    builds a `CostAwareSizer` over it, capped at `max_budget` (else `budget`) nodes, with
    `min_draft_score`; `cost_model=None` is the fixed policy with its defaults. `sizer` and
    the shorthands exclude each other. `depth` is the longest stored n-gram (used when
    `cache` is None).

    `recycle` hands the cache the target's top predictions from the forwards it already runs
    (`lookahead.hf.recycling`): True: after each of the prompt's last 512 tokens (the prefill
    then computes their logits) and every node of each verified tree; "path": the prompt and the
    accepted path only (what the acceptance simulator can replay); False: none. A cache
    built here keeps `RECYCLE_K` per key with it; a `cache` given must have been built with
    `recycle_k > 0` for it. None (default): whatever `cache` keeps (off for a cache built
    here).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        cache=None,
        *,
        sizer: Sizer | None = None,
        budget: int | None = None,
        max_budget: int | None = None,
        depth: int = DEFAULT_DEPTH,
        multi_branch: bool = True,
        min_draft_score: float | None = None,
        cost_model=UNSET,
        recycle: bool | str | None = None,
    ):
        check_model_supports_kv(model)
        # `in (None, False, True, "path")` would take 1 and 0.0 as booleans
        if not (recycle is None or isinstance(recycle, bool) or recycle == "path"):
            raise ValueError(f"recycle must be None, False, True or 'path', got {recycle!r}")
        self._prefill_kw = last_logits_only(model)
        attn = attention(model)
        self.sizer = sizer_from(sizer, budget, max_budget, min_draft_score, cost_model)
        self.model = model
        self.tokenizer = tokenizer
        if cache is None:
            from lookahead.cache import LookaheadCache

            cache = LookaheadCache(max_depth=depth, recycle_k=RECYCLE_K if recycle else 0)
        # A stand-in without `config` (tests, a custom drafter) keeps no predictions.
        kept = int(getattr(cache, "config", {}).get("recycle_k", 0))
        if recycle and not kept:
            raise ValueError("recycle needs a cache built with recycle_k > 0")
        # Top predictions handed to the cache per row (0: none), and whether off-path nodes'.
        self._recycle_k = kept if recycle is not False else 0
        self._recycle_tree = recycle is not False and recycle != "path"
        self.cache = cache
        dtype = next(model.parameters()).dtype
        self.multi_branch = check_bool("multi_branch", multi_branch)
        self._additive_mask = attn == "eager"
        self._dtype = dtype
        self._device = next(model.parameters()).device
        # Token ids the model embeds: prompts are checked against it, drafts pruned to it.
        self._vocab = model.get_input_embeddings().weight.shape[0]
        self._context = context_length(model, tokenizer)

    @property
    def cost_model(self):
        """The start-up cost curve the cost-aware sizer corrects (None for another sizer);
        an "auto" one is loaded or measured here, on first use."""
        if not isinstance(self.sizer, CostAwareSizer):
            return None
        self.sizer.start(self.model)
        return self.sizer.cost_model

    def encode(self, prompt, chat: bool = False) -> list:
        """Prompt ids from a string (tokenizer needed; chat template if `chat`) or ids."""
        return encode(self.tokenizer, self._vocab, prompt, chat)

    # -- generation -----------------------------------------------------------------------
    def generate(
        self,
        prompt,
        *,
        max_new_tokens: int = 256,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        eos_token_id=UNSET,
        stop_token_ids: Iterable[int] = (),
        stop_strings: Sequence[str] = (),
        on_tokens: TokenCallback | None = None,
        budget: int | None = None,
        multi_branch: bool | None = None,
        chat: bool = False,
        skip_special_tokens: bool = True,
    ) -> GenerationResult:
        """Generate from one prompt (text or token ids); see the module docstring.

        As HF `generate`: `do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty`
        and `eos_token_id` left unset come from the model's generation config (and then
        default to greedy, 1.0, 0 (off), 1.0, 1.0 and no EOS stop; the sampling ones are read
        only when sampling). EOS and stop token ids end the output after that token; a stop
        string ends it after the token that completes it, even one that began in the prompt
        (as HF `stop_strings`). `on_tokens(new_ids, text_delta)` is called after every step
        (`text_delta` is "" without a tokenizer). `result.text` and the deltas leave out special
        tokens such as the chat template's end marker unless `skip_special_tokens=False`; stop
        strings are matched on the text with them, as HF does. Sampling draws output position i with the
        i-th uniform of a `torch.Generator` seeded with `seed` (an int in [0, 2**64); None: a
        fresh seed, leaving torch's global generator alone), so a seed gives the same output
        whatever the drafts, as plain sampling with that generator would. A prompt longer than
        the model's context (`context_length`) is refused with `InvalidInput` before the
        prefill, as is text with lone surrogates (undecodable bytes); one that fits but may run
        past the context within `max_new_tokens` gets a warning. `budget` given here is a
        fixed draft width for this call (no cost-aware choice).
        """
        stop_strings = check_call(max_new_tokens, stop_strings, seed, on_tokens, self.tokenizer)
        skip_special_tokens = check_bool("skip_special_tokens", skip_special_tokens)
        # A budget given here is a fixed width for this call.
        sizer = self.sizer
        if budget is not None:
            budget = check_budget("budget", budget)
            sizer = FixedSizer(budget, budget, self.sizer.min_score)
        cfg = sampling_config(self.model, do_sample, temperature, top_k, top_p, repetition_penalty)
        ids = self.encode(prompt, chat=chat)
        check_context(self._context, len(ids), max_new_tokens)
        # Measured (on first use) once the request is known good, before the clock starts.
        sizer.start(self.model)
        stops = eos_ids(self.model) if eos_token_id is UNSET else as_id_set(eos_token_id)
        stop_ids = as_id_set(stop_token_ids, "stop_token_ids")
        mb = self.multi_branch if multi_branch is None else check_bool("multi_branch", multi_branch)
        text = (
            TextTracker(self.tokenizer, stop_strings, ids, skip_special_tokens)
            if self.tokenizer is not None
            else None
        )

        rid = f"LookaheadGenerator-{next(_REQUEST_IDS)}"
        stats = GenerationStats(prompt_tokens=len(ids))
        t_start = time.perf_counter()
        self.cache.start_request(rid, ids)
        try:
            request = Request(
                rid, ids, max_new_tokens, cfg, seed, stops, stop_ids, text, on_tokens, mb, stats
            )
            out, reason = self._run(request, sizer)
        finally:
            self.cache.finish_request(rid)
            sizer.finish()
        stats.total_s = time.perf_counter() - t_start
        stats.new_tokens = len(out)
        decoded = text.text(out) if text is not None else None
        return GenerationResult(ids=out, text=decoded, finish_reason=reason, stats=stats)

    @torch.inference_mode()
    def _run(self, req: Request, sizer: Sizer):
        """Prefill, then one step per tree forward until the output ends: propose a tree,
        build its inputs, run the forward, verify, fix the KV cache up, stop or go on."""
        model, dev, stats, perf = self.model, self._device, req.stats, time.perf_counter
        t0 = perf()
        kv = new_cache(model)
        widest = sizer.max_nodes
        check_cache_layers(kv, len(req.ids) + req.max_new + widest + 1)
        seq_len = len(req.ids) - 1
        if self._recycle_k:
            prefill(model, kv, req.ids, self._prefill_kw, (self.cache, req.rid, self._recycle_k))
        else:
            prefill(model, kv, req.ids, self._prefill_kw)
        stats.prefill_s = perf() - t0

        inputs = TreeInputs(widest + 1, dev, self._dtype if self._additive_mask else None)
        acceptance = Acceptance(req.cfg, req.seed, model, req.ids, dev)
        sampled = req.cfg.do_sample
        out: list = []
        root = req.ids[-1]
        last = 0  # what the previous step accepted, as the sizer read it
        between = 0.0  # the last step's host time outside its stages (`GenerationStats.other_s`)
        while True:
            t1 = perf()
            prop = propose(
                self.cache,
                req.rid,
                root,
                budget=min(sizer.budget(last), widest),
                # Draft tokens wanted at most: those still to come, less the bonus token.
                room=req.max_new - len(out) - 1,
                multi_branch=req.multi_branch,
                vocab=self._vocab,
                cut=lambda s, p, m, ctx=seq_len, la=last: sizer.cut(s, p, m, ctx, la, sampled),
            )
            stats.skipped_drafts += prop.skipped
            t2 = perf()
            tree = inputs.build(prop.tokens, prop.parents, seq_len)
            t3 = perf()
            logits = model(
                input_ids=tree.tokens.to(dev),
                position_ids=tree.meta.positions.to(dev),
                attention_mask=tree.mask,
                past_key_values=kv,
                use_cache=True,
            ).logits[0]
            if dev.type == "cuda":  # the forward's GPU time belongs to forward_s, not verify_s
                torch.cuda.synchronize(dev)
            t4 = perf()
            inputs.release(tree)
            verdict = acceptance.verify(logits, tree, len(out))
            rows = None
            if self._recycle_k:
                rows = hand_over(
                    self.cache,
                    req.rid,
                    verdict,
                    prop.tokens,
                    prop.parents,
                    self._recycle_k,
                    self._recycle_tree,
                )
            t5 = perf()
            keep_path(kv, seq_len, verdict.path, tree.n)
            t6 = perf()
            last = sizer.observe(
                Step(
                    rows=tree.n,
                    context_len=seq_len,
                    forward_s=t4 - t3,
                    host_s=(t3 - t1) + (t6 - t4) + between,
                    drafted=prop.drafted,
                    path=verdict.path,
                    emitted=verdict.emitted,
                    sampled=sampled,
                    last=last,
                )
            )
            t7 = perf()

            start = len(out)
            out.extend(verdict.emitted)
            cut, reason = find_cut(out, start, req.eos, req.stop_ids, req.text, req.max_new)
            if cut is not None:
                del out[cut:]
            kept = len(out) - start
            # Draft tokens cut off with the rest were not output: not counted as accepted.
            stats.record_step(min(verdict.accepted, kept), tree.n - 1, (t1, t2, t3, t4, t5, t6))

            caller_s = 0.0  # in `on_tokens`: the caller's time, not the step's
            if req.on_tokens is not None and kept:
                text = req.text
                delta = text.delta(out, final=cut is not None) if text is not None else ""
                tc = perf()
                req.on_tokens(out[start:], delta)
                caller_s = perf() - tc
            te = perf()
            if kept:  # the final tokens too join the request's output (shared history)
                self.cache.extend(req.rid, out[start:], *(r[:kept] for r in rows or ()))
            stats.drafter_s += (t2 - t1) + (t7 - t6) + (perf() - te)
            if cut is not None:
                stats.other_s += perf() - t6 - caller_s
                return out, reason
            root = verdict.emitted[-1]
            acceptance.emitted(verdict.emitted)
            seq_len += len(verdict.path)
            between = perf() - t6 - caller_s
            stats.other_s += between


def generate(model, prompt, tokenizer=None, **kwargs) -> GenerationResult:
    """One-shot lookahead generation (a fresh `LookaheadGenerator`; see its `generate`).

    Generator options (`cache`, `depth`, `sizer`, `budget`, `max_budget`,
    `min_draft_score`, `cost_model`, `recycle`) are taken from `kwargs` too.
    """
    # `budget` too: given to `generate` it would be a fixed width, ignoring `max_budget`.
    opts = (
        "cache",
        "depth",
        "sizer",
        "budget",
        "max_budget",
        "min_draft_score",
        "cost_model",
        "recycle",
    )
    gen_kw = {k: kwargs.pop(k) for k in opts if k in kwargs}
    return LookaheadGenerator(model, tokenizer, **gen_kw).generate(prompt, **kwargs)
