"""Lookahead generation for HF transformers causal LMs (batch size 1).

Per step: draft a token tree from the shared `LookaheadCache`, keep the prefix of its
best-first nodes that pays for its rows on this machine (`lookahead.costs`), run one forward
over the tree on top of the KV cache (explicit positions, 4-D tree attention mask), verify
with the kernels' dispatch functions, keep the accepted path's KV only, emit accepted tokens +
the bonus token. Greedy output equals `model.generate(do_sample=False)`; sampling keeps the
target distribution.
"""

from __future__ import annotations

import itertools
import math
import operator
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from lookahead import kernels
from lookahead.cache import _is_bool, _is_int
from lookahead.costs import (
    AcceptanceCalibration,
    CostModel,
    ForwardCorrection,
    choose_nodes,
    greedy_outcomes,
    load_or_measure,
)
from lookahead.errors import InvalidInput
from lookahead.kv import (
    check_cache_layers,
    check_model_supports_kv,
    keep_path,
    last_logits_only,
    new_cache,
)
from lookahead.recycling import RECYCLE_K, prefill_with_rows, top_rows
from lookahead.sampling import SamplingConfig, node_scores

# The widest draft the cost-aware choice considers (nodes besides the root); the measured
# curve reaches one row further, and its widest row bounds the choice too.
AUTO_MAX_NODES = 32
# The fixed policy's budget when `max_budget` or `min_draft_score` is given without `budget`.
FIXED_BUDGET = 8
# Fixed policy: after a step that accepted at least `DEEP_ACCEPT` draft tokens the next draft
# may use up to `max_budget` nodes (a request that is copying gets the wider tree while it
# lasts). The cost-aware choice needs no such rule: a copying request's drafts score high.
DEEP_ACCEPT = 4
# Uniforms drawn at a time for sampling (a fixed size: the stream depends on the seed only).
UNIFORM_CHUNK = 256
DEFAULT_DEPTH = 12
# The host's time per step (draft, tree inputs, verify, KV fix-up) is followed as a moving
# average with this weight on the newest step: it adds to every choice's forward time.
HOST_EMA = 0.1

TokenCallback = Callable[[list, str], None]

_UNSET = object()


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
    total_s: float = 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step (the bonus token not counted)."""
        return float(np.mean(self.accepted)) if self.accepted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per step (accepted + bonus)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def host_overhead(self) -> float:
        """(draft + mask + verify + KV fix-up) time as a fraction of the forward time."""
        host = self.draft_s + self.mask_s + self.verify_s + self.kv_s
        return host / self.forward_s if self.forward_s else 0.0

    def as_dict(self) -> dict:
        """Plain dict with the derived means included."""
        d = asdict(self)
        d.update(
            mean_accepted=self.mean_accepted,
            tokens_per_step=self.tokens_per_step,
            host_overhead=self.host_overhead,
        )
        return d


@dataclass
class GenerationResult:
    """Generated ids (new tokens only), their text (when a tokenizer is known) and stats."""

    ids: list
    text: str | None
    finish_reason: str  # "eos", "stop_token", "stop_string" or "length"
    stats: GenerationStats


class _TextTracker:
    """Incremental decoding of the generated ids: text deltas and stop-string search."""

    def __init__(
        self,
        tokenizer,
        stop_strings: Sequence[str],
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ):
        self.tok = tokenizer
        self.skip_special = skip_special_tokens
        self.stop = list(stop_strings)  # `generate` refuses empty ones
        self.max_stop = max((len(s) for s in self.stop), default=0)
        self.emitted_text = ""
        # A stop string may begin in the prompt (HF's StopStringCriteria reads the whole
        # sequence): the prompt's last tokens (each decodes to >= 1 character, or nothing)
        # lead the text searched.
        self.lead = list(prompt_ids[-self.max_stop - 8 :]) if self.stop else []

    def decode(self, ids: list) -> str:
        """The text stop strings are searched in: special tokens included, as in HF."""
        return self.tok.decode(ids, skip_special_tokens=False) if ids else ""

    def text(self, ids: list) -> str:
        """The text the caller sees (special tokens dropped unless asked to keep them)."""
        return self.tok.decode(ids, skip_special_tokens=self.skip_special) if ids else ""

    def _ends_a_stop(self, text: str, prev: int) -> bool:
        """Whether a stop string occurs in `text` ending after its first `prev` characters."""
        return any(text.find(s, max(0, prev - len(s) + 1)) != -1 for s in self.stop)

    def stop_cut(self, ids: list, start: int) -> int | None:
        """Smallest k > start such that a stop string ends within the text ids[start:k] add
        (after the prompt and ids[:start]), or None."""
        if not self.stop:
            return None
        lead = self.lead
        prev = len(self.decode(lead + ids[:start]))
        if not self._ends_a_stop(self.decode(lead + ids), prev):
            return None
        for k in range(start + 1, len(ids) + 1):
            if self._ends_a_stop(self.decode(lead + ids[:k]), prev):
                return k
        return len(ids)

    def delta(self, ids: list, final: bool) -> str:
        text = self.text(ids)
        # An incomplete UTF-8 sequence decodes to U+FFFD; wait for the rest unless finished.
        if not final and text.endswith("\ufffd"):
            return ""
        if not text.startswith(self.emitted_text):
            new = text[len(self.emitted_text) :] if len(text) > len(self.emitted_text) else ""
        else:
            new = text[len(self.emitted_text) :]
        self.emitted_text = text
        return new


NO_CHAT_TEMPLATE = "the tokenizer has no chat template; pass chat=False"

# A tokenizer's `model_max_length` when nobody set it (transformers' VERY_LARGE_INTEGER).
_UNSET_MAX_LENGTH = int(1e29)


def text_problem(text: str) -> str | None:
    """What makes `text` unfit for a tokenizer, or None: a lone surrogate, which is what
    Python makes of undecodable bytes in argv or a `surrogateescape` stream (U+DC80-U+DCFF
    for bytes 0x80-0xFF), or of a bad JSON escape; tokenizers fail on it with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        cp = ord(text[e.start])
        if 0xDC80 <= cp <= 0xDCFF:
            return (
                f"is not valid UTF-8: undecodable byte 0x{cp - 0xDC00:02x} at character {e.start}"
            )
        return f"is not valid Unicode: lone surrogate U+{cp:04X} at character {e.start}"
    return None


def context_length(model, tokenizer=None) -> int | None:
    """Positions the model was built for: `max_position_embeddings`, times a RoPE scaling
    factor that is meant to extend it (one given without an `original_max_position_embeddings`
    that differs, as Qwen's YaRN recipe and linear scaling are; Llama 3.1's already counts
    it), else the tokenizer's `model_max_length` if set; None when nothing says."""
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    if _is_int(n) and n > 0:
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) not in (
            None,
            "default",
        ):
            factor = rope.get("factor")
            original = rope.get("original_max_position_embeddings")
            if isinstance(factor, (int, float)) and factor > 1 and original in (None, n):
                n = int(n * factor)
        return int(n)
    m = getattr(tokenizer, "model_max_length", None)
    return int(m) if _is_int(m) and 0 < m < _UNSET_MAX_LENGTH else None


# Request ids of every generator in this process: generators may share one cache.
_REQUEST_IDS = itertools.count()


def _check_budget(name: str, v) -> int:
    """`v` as a draft budget: an int in [0, MAX_BUDGET] (bools and floats refused)."""
    from lookahead._core import MAX_BUDGET

    if not _is_int(v) or not 0 <= v <= MAX_BUDGET:
        raise ValueError(f"{name} must be an int in [0, {MAX_BUDGET}], got {v!r}")
    return int(v)


def _check_bool(name: str, v) -> bool:
    if not _is_bool(v):
        raise ValueError(f"{name} must be a bool, got {v!r}")
    return bool(v)


def _prune(tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray, vocab: int, depth: int):
    """The draft without its nodes whose ids the model does not have (a history shared with
    another vocabulary) or that lie deeper than `depth` below the root, nor their
    descendants; parents renumbered."""
    ids = tokens.view(np.uint32)
    keep, new_index, level = [0], {0: 0}, {0: 0}
    for i in range(1, len(tokens)):
        p = int(parents[i])
        if ids[i] < vocab and p in new_index and level[p] < depth:
            new_index[i], level[i] = len(keep), level[p] + 1
            keep.append(i)
    new_parents = np.array([-1] + [new_index[int(parents[i])] for i in keep[1:]], np.int32)
    return tokens[keep], new_parents, scores[keep]


def _as_id_set(x, name: str = "eos_token_id") -> set:
    """`x` (None, an id or ids) as a set of non-negative int ids."""
    if x is None:
        return set()
    bad = ValueError(f"{name} must be None, an int or ints (>= 0), got {x!r}")
    try:
        items = [x] if _is_int(x) else list(x)
        if any(_is_bool(t) for t in items):
            raise TypeError
        ids = {operator.index(t) for t in items}
    except TypeError:
        raise bad from None
    if any(t < 0 for t in ids):
        raise bad
    return ids


class LookaheadGenerator:
    """Lookahead decoding for one HF causal LM, with a `LookaheadCache` shared across calls.

    Outputs of earlier requests stay in the cache's shared history, so later requests can draft
    from them. By default each step verifies the prefix of the drafter's best-first tree (up
    to `AUTO_MAX_NODES` nodes) that maximises expected tokens per second on this machine: the
    forward's cost by rows comes from `cost_model` ("auto": measured once per model, dtype,
    device, CPU and threads, and kept on disk, `lookahead.costs.load_or_measure`; or a
    `CostModel`), each node's chance of acceptance from its path score through a calibration
    learnt from this generator's own verify results (`calibration[do_sample]`).

    `budget`, `max_budget` and `min_draft_score` are overrides: any of them given (even 0)
    without a `cost_model` selects the fixed policy: `budget` nodes per step (`FIXED_BUDGET`
    if only the others are given), up to `max_budget` after a step that accepted
    `DEEP_ACCEPT` or more tokens (default, and at least, `budget`), and a draft whose path
    scores sum below `min_draft_score` (default 0) is dropped for the root alone. With a
    `cost_model` too, `max_budget` (else `budget`) caps the nodes the cost-aware choice may
    take, and `min_draft_score` still applies. `cost_model=None` is the fixed policy with its
    defaults. A `CostModel` measured to fewer rows than `AUTO_MAX_NODES + 1` caps drafts at
    its widest row less the root. `depth` is the longest stored n-gram (used when `cache` is
    None).

    `recycle` hands the cache the target's top predictions from the forwards it already runs
    (`lookahead.recycling`): True: after each of the prompt's last 512 tokens (the prefill
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
        budget: int | None = None,
        max_budget: int | None = None,
        depth: int = DEFAULT_DEPTH,
        multi_branch: bool = True,
        min_draft_score: float | None = None,
        cost_model=_UNSET,
        recycle: bool | str | None = None,
    ):
        check_model_supports_kv(model)
        if recycle not in (None, False, True, "path"):
            raise ValueError(f"recycle must be None, False, True or 'path', got {recycle!r}")
        self._prefill_kw = last_logits_only(model)
        attn = getattr(model.config, "_attn_implementation", None)
        if attn not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {attn!r} is not supported: load the model with "
                "attn_implementation='sdpa' (default) or 'eager' (they take a custom 4-D mask)"
            )
        overrides = budget is not None or max_budget is not None or min_draft_score is not None
        if cost_model is _UNSET:
            cost_model = None if overrides else "auto"
        if not (cost_model is None or cost_model == "auto" or isinstance(cost_model, CostModel)):
            raise ValueError(
                f"cost_model must be 'auto', a lookahead.costs.CostModel or None, got {cost_model!r}"
            )
        if budget is not None:
            budget = _check_budget("budget", budget)
        if max_budget is not None:
            # Checked here: the core would refuse a bad one only at the first deep acceptance,
            # after tokens went out.
            max_budget = _check_budget("max_budget", max_budget)
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
        self.cost_aware = cost_model is not None
        if self.cost_aware:
            cap = max_budget if max_budget is not None else budget
            self.budget = self.max_budget = AUTO_MAX_NODES if cap is None else cap
        else:
            self.budget = FIXED_BUDGET if budget is None else budget
            self.max_budget = max(self.budget, max_budget or 0)
        self._cost_model = cost_model
        self.calibration = {False: AcceptanceCalibration(), True: AcceptanceCalibration()}
        self._host_s = {False: 0.0, True: 0.0}  # by do_sample: sampling does more per step
        self._correction = ForwardCorrection()
        self.multi_branch = _check_bool("multi_branch", multi_branch)
        if min_draft_score is None:
            min_draft_score = 0.0
        if (
            isinstance(min_draft_score, bool)
            or not isinstance(min_draft_score, (int, float, np.integer, np.floating))
            or not 0 <= min_draft_score < math.inf
        ):
            raise ValueError(
                f"min_draft_score must be a finite number >= 0, got {min_draft_score!r}"
            )
        self.min_draft_score = float(min_draft_score)
        self._additive_mask = attn == "eager"
        self._dtype = dtype
        self._device = next(model.parameters()).device
        # Token ids the model embeds: prompts are checked against it, drafts pruned to it.
        self._vocab = model.get_input_embeddings().weight.shape[0]
        self._context = context_length(model, tokenizer)

    @property
    def cost_model(self) -> CostModel | None:
        """The forward's cost by rows the drafts are sized by (None: the fixed policy); an
        "auto" one is loaded or measured here, on first use."""
        if self._cost_model == "auto":
            self._cost_model = load_or_measure(self.model)
        return self._cost_model

    @property
    def cost_correction(self) -> tuple:
        """Measured over modelled forward time so far (one row, several rows): how far this
        generator's forwards ran from the cost model, which drafts are sized by after it."""
        return tuple(self._correction.scale)

    # -- input handling -------------------------------------------------------------------
    def encode(self, prompt, chat: bool = False) -> list:
        """Prompt ids from a string (tokenizer needed; chat template if `chat`) or ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            if not prompt:
                raise ValueError("the prompt is empty")
            problem = text_problem(prompt)
            if problem:
                raise InvalidInput(f"the prompt {problem}")
            if chat:
                try:
                    ids = self.tokenizer.apply_chat_template(
                        [{"role": "user", "content": prompt}],
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    )
                except ValueError as e:
                    # Some tokenizers template without a `chat_template` attribute: ask, and
                    # name the fix only when the tokenizer says it has none.
                    if "chat template" in str(e).lower() or "chat_template" in str(e):
                        raise ValueError(NO_CHAT_TEMPLATE) from e
                    raise
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
            else:
                ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = self._token_ids(prompt)
        if len(ids) == 0:
            raise ValueError("the prompt is empty (no tokens)")
        return list(ids)

    def _token_ids(self, prompt) -> list:
        """Checked ids from a 1-D (or batch-1 2-D) tensor, array or iterable of ints."""
        if isinstance(prompt, torch.Tensor):
            if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
                raise ValueError(f"token ids must be integers, got dtype {prompt.dtype}")
            a = prompt.detach().cpu().numpy()
        else:
            if not isinstance(prompt, (np.ndarray, Sequence)):
                prompt = list(prompt)  # a generator, map, range-like iterable
            a = np.asarray(prompt)
            if a.dtype == object:  # Python ints beyond int64, or mixed scalar types
                try:
                    a = np.array([operator.index(t) for t in a.ravel()]).reshape(a.shape)
                except (TypeError, OverflowError):
                    raise ValueError("token ids must be integers") from None
        if a.ndim == 2 and a.shape[0] == 1:
            a = a[0]
        if a.ndim == 2:
            raise ValueError(
                f"batch size > 1 is not supported (token ids of shape {a.shape}): pass one prompt"
            )
        if a.ndim != 1:
            raise ValueError(f"token ids must be 1-D, got shape {a.shape}")
        if a.size == 0:
            return []
        if a.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got dtype {a.dtype}")
        vocab = self._vocab
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"token ids must lie in [0, {vocab}) (the model's vocabulary), got {lo if lo < 0 else hi}"
            )
        return a.tolist()

    def _eos_ids(self, eos_token_id) -> set:
        if eos_token_id is not _UNSET:
            return _as_id_set(eos_token_id)
        gc = getattr(self.model, "generation_config", None)
        return _as_id_set(getattr(gc, "eos_token_id", None) if gc is not None else None)

    def _sampling(self, do_sample, temperature, top_k, top_p, repetition_penalty):
        """The `SamplingConfig` of a call: arguments given, else the model's generation
        config (as HF `generate`), else the defaults."""
        gc = getattr(self.model, "generation_config", None)

        def pick(value, name, default):
            if value is None and gc is not None:
                value = getattr(gc, name, None)
            return default if value is None else value

        do_sample = pick(do_sample, "do_sample", False)  # SamplingConfig checks it
        if not do_sample:  # HF ignores the config's warpers when greedy (given ones are checked)
            temperature = 1.0 if temperature is None else temperature
            top_k = 0 if top_k is None else top_k
            top_p = 1.0 if top_p is None else top_p
        else:
            temperature = pick(temperature, "temperature", 1.0)
            top_k = pick(top_k, "top_k", 0)
            top_p = pick(top_p, "top_p", 1.0)
        penalty = pick(repetition_penalty, "repetition_penalty", 1.0)
        return SamplingConfig(do_sample, temperature, top_k, top_p, penalty)

    def _check_context(self, prompt_len: int, max_new: int) -> None:
        """Refuse a prompt longer than the model's context, before the prefill: a learned
        position table has no row for it (an IndexError mid-prefill, a device-side assert on
        CUDA) and rotary positions past the trained range give meaningless output. Output that
        may run past the context is only warned about (as HF `generate` does, but up front):
        it may well stop sooner."""
        ctx = self._context
        if ctx is None:
            return
        if prompt_len > ctx:
            raise InvalidInput(
                f"the prompt has {prompt_len} tokens, more than the model's context of {ctx} "
                "positions (max_position_embeddings); shorten it"
            )
        if prompt_len + max_new > ctx:
            warnings.warn(
                f"the prompt ({prompt_len} tokens) plus max_new_tokens ({max_new}) exceed the "
                f"model's context of {ctx} positions; tokens past it may be degraded",
                stacklevel=3,
            )

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
        eos_token_id=_UNSET,
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
        if not _is_int(max_new_tokens) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if stop_strings is None:
            stop_strings = ()
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if not all(isinstance(x, str) for x in stop_strings):
            raise ValueError(f"stop_strings must be a str or strs, got {stop_strings!r}")
        if any(s == "" for s in stop_strings):
            raise ValueError(
                "stop_strings must not contain an empty string (it would match anywhere)"
            )
        for s in stop_strings:  # decoded text holds no lone surrogates: it would never match
            problem = text_problem(s)
            if problem:
                raise InvalidInput(f"stop string {s!r} {problem}")
        if stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer")
        if seed is not None and not (_is_int(seed) and 0 <= seed < 2**64):
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {seed!r}")
        if on_tokens is not None and not callable(on_tokens):
            raise ValueError(f"on_tokens must be callable or None, got {on_tokens!r}")
        skip_special_tokens = _check_bool("skip_special_tokens", skip_special_tokens)
        # A budget given here is a fixed width for this call.
        fixed_call = budget is not None
        if budget is None:
            budget, max_budget = self.budget, self.max_budget
        else:
            budget = max_budget = _check_budget("budget", budget)
        cfg = self._sampling(do_sample, temperature, top_k, top_p, repetition_penalty)
        ids = self.encode(prompt, chat=chat)
        self._check_context(len(ids), max_new_tokens)
        # Measured (on first use) once the request is known good, before the clock starts.
        costs = None if fixed_call else self.cost_model
        stops = self._eos_ids(eos_token_id)
        stop_ids = _as_id_set(stop_token_ids, "stop_token_ids")
        mb = (
            self.multi_branch if multi_branch is None else _check_bool("multi_branch", multi_branch)
        )
        text = (
            _TextTracker(self.tokenizer, stop_strings, ids, skip_special_tokens)
            if self.tokenizer is not None
            else None
        )

        rid = f"LookaheadGenerator-{next(_REQUEST_IDS)}"
        stats = GenerationStats(prompt_tokens=len(ids))
        t_start = time.perf_counter()
        self.cache.start_request(rid, ids)
        try:
            out, reason = self._run(
                rid,
                ids,
                max_new_tokens,
                cfg,
                seed,
                stops,
                stop_ids,
                text,
                on_tokens,
                (budget, max_budget),
                costs,
                mb,
                stats,
            )
        finally:
            self.cache.finish_request(rid)
        stats.total_s = time.perf_counter() - t_start
        stats.new_tokens = len(out)
        decoded = text.text(out) if text is not None else None
        return GenerationResult(ids=out, text=decoded, finish_reason=reason, stats=stats)

    @torch.inference_mode()
    def _run(
        self,
        rid,
        ids,
        max_new,
        cfg,
        seed,
        eos,
        stop_ids,
        text,
        on_tokens,
        budgets,
        costs,
        mb,
        stats,
    ):
        model, dev = self.model, self._device
        vocab = self._vocab
        perf = time.perf_counter
        t0 = perf()
        kv = new_cache(model)
        base_budget, budget = budgets  # `budget`: the widest a step may draft
        check_cache_layers(kv, len(ids) + max_new + budget + 1)
        seq_len = len(ids) - 1
        recycle_k = self._recycle_k
        if seq_len > 0 and recycle_k:
            # The rows after the prompt's tokens (its last one's comes from the tree forward).
            first, top_ids, top_p = prefill_with_rows(
                model, kv, ids[:-1], recycle_k, self._prefill_kw
            )
            self.cache.recycle(rid, ids[first:-1], top_ids, top_p)
        elif seq_len > 0:
            # The prompt's last token is the first root: its logits come from the tree forward.
            prompt_t = torch.tensor([ids[:-1]], dtype=torch.long, device=dev)
            model(input_ids=prompt_t, past_key_values=kv, use_cache=True, **self._prefill_kw)
        stats.prefill_s = perf() - t0

        seen = None
        if cfg.repetition_penalty != 1.0:
            # One entry per logit: an output head padded past config.vocab_size has more.
            head = model.get_output_embeddings()
            rows = head.weight.shape[0] if head is not None else model.config.vocab_size
            seen = torch.zeros(rows, dtype=torch.bool, device=dev)
            seen[torch.tensor(ids, device=dev)] = True
        gen = None
        if cfg.do_sample:
            gen = torch.Generator(device="cpu")
            if seed is None:
                gen.seed()  # a fresh seed for this generator only, not torch's global one
            else:
                gen.manual_seed(seed)
        # Uniform i serves output position i (the walk visits one node per depth): fixed-size
        # draws make the stream a function of the seed alone, so the output is too.
        ustream = torch.empty(0)
        # The 4-D mask lives in a buffer grown geometrically: prefix columns stay True and only
        # the tree block is written each step.
        mask_buf = torch.ones((1, 1, budget + 1, 0), dtype=torch.bool, device=dev)
        out: list = []
        reason = "length"
        root = ids[-1]
        root_parents = np.array([-1], dtype=np.int32)
        calibration = self.calibration[cfg.do_sample]
        last = 0  # draft tokens the previous step accepted
        while True:
            t1 = perf()
            drafted = None  # the draft before the cost-aware cut, when there was one
            would_accept = None
            modelled = costs.curve(seq_len) if costs is not None else None
            deep = last >= DEEP_ACCEPT
            b = budget if deep or costs is not None else base_budget
            # Draft tokens wanted at most: those still to come, less the bonus token.
            room = max_new - len(out) - 1
            if b > 0 and room > 0:
                d = self.cache.draft(rid, budget=b, multi_branch=mb)
                d_parents, d_tokens, d_scores = d.parents, d.tokens, d.scores
                if len(d_tokens) > 1 and (
                    room < b or int(d_tokens.view(np.uint32)[1:].max()) >= vocab
                ):
                    # Nodes deeper than `room` would be verified for nothing.
                    d_tokens, d_parents, d_scores = _prune(
                        d_tokens, d_parents, d_scores, vocab, room
                    )
                if costs is not None and len(d_tokens) > 1:
                    # Best-first order: every prefix is a tree, and the likeliest one.
                    drafted = (d_tokens, d_parents, d_scores)
                    e = calibration.expected(d_scores[1:], d_parents[1:], last)
                    curve = self._correction.apply(modelled)
                    k = choose_nodes(e, curve, self._host_s[cfg.do_sample])
                    if k == 0:
                        stats.skipped_drafts += 1
                    d_tokens, d_parents, d_scores = (x[: k + 1] for x in drafted)
                if len(d_tokens) > 1 and float(d_scores[1:].sum()) < self.min_draft_score:
                    # Too unlikely to pay for the extra rows: verify the root alone.
                    d_parents, d_tokens = d_parents[:1], d_tokens[:1]
                    stats.skipped_drafts += 1
            else:  # plain decoding through the same path (the trie takes budgets >= 1)
                d_parents, d_tokens = root_parents, np.array([root], dtype=np.int64)
            n = len(d_tokens)
            t2 = perf()
            parents = torch.from_numpy(np.ascontiguousarray(d_parents, dtype=np.int32))[None]
            tokens = torch.from_numpy(np.ascontiguousarray(d_tokens, dtype=np.int64))[None]
            num_nodes = torch.tensor([n], dtype=torch.int32)
            seq_lens = torch.tensor([seq_len], dtype=torch.int64)
            meta = kernels.tree_metadata(parents, num_nodes, seq_lens)
            total = seq_len + n
            if mask_buf.shape[-1] < total:
                grown = torch.ones((1, 1, budget + 1, max(2 * total, 256)), dtype=torch.bool)
                mask_buf = grown.to(dev)
            mask_buf[0, 0, :n, seq_len:total] = meta.mask[0, :n, :n]
            mask = mask_buf[:, :, :n, :total]
            if self._additive_mask:
                mask = torch.zeros(mask.shape, dtype=self._dtype, device=dev).masked_fill_(
                    ~mask, torch.finfo(self._dtype).min
                )
            t3 = perf()
            logits = model(
                input_ids=tokens.to(dev),
                position_ids=meta.positions.to(dev),
                attention_mask=mask,
                past_key_values=kv,
                use_cache=True,
            ).logits[0]
            if dev.type == "cuda":  # the forward's GPU time belongs to forward_s, not verify_s
                torch.cuda.synchronize(dev)
            t4 = perf()
            mask_buf[0, 0, :n, seq_len:total] = True
            if cfg.needs_processing:
                scores = node_scores(logits, cfg, seen, tokens[0], meta.mask[0])
            else:
                scores = logits
            if cfg.do_sample:
                probs = scores.softmax(dim=-1).cpu()
                while ustream.numel() < len(out) + n:
                    ustream = torch.cat([ustream, torch.rand(UNIFORM_CHUNK, generator=gen)])
                uniforms = ustream[len(out) + meta.positions[0, :n].cpu() - seq_len][None]
                res = kernels.verify_sampling(tokens, parents, num_nodes, probs[None], uniforms)
            else:
                target = scores.argmax(dim=-1).cpu()
                res = kernels.verify_greedy(tokens, parents, num_nodes, target[None])
            n_acc = int(res.num_accepted[0])
            path = res.accepted_nodes[0, : n_acc + 1].tolist()
            emitted = tokens[0, path[1:]].tolist() + [int(res.bonus[0])]
            rows = None
            if recycle_k:
                dist = probs if cfg.do_sample else None
                if self._recycle_tree and n > len(path):
                    top = top_rows(scores, recycle_k, dist)
                    # The rejected nodes' rows first: the path's, written after, win a key
                    # both have.
                    off = np.setdiff1d(np.arange(1, n), path)
                    node_tokens = d_tokens.astype(np.int64)
                    self.cache.recycle(
                        rid,
                        node_tokens[off],
                        top[0][off],
                        top[1][off],
                        after=node_tokens[np.asarray(d_parents, dtype=np.int64)[off]],
                    )
                    rows = (top[0][path], top[1][path])
                else:  # the accepted path's rows alone
                    rows = top_rows(scores[path], recycle_k, None if dist is None else dist[path])
            if drafted is not None:  # what each drafted node's score was worth
                if cfg.do_sample:  # an accepted path says nothing of nodes not verified
                    took = np.zeros(n - 1)
                    took[np.asarray(path[1:], dtype=np.int64) - 1] = 1.0
                    calibration.observe(d_scores[1:n], took, last)
                else:
                    all_tokens, all_parents, all_scores = drafted
                    took, known = greedy_outcomes(all_tokens, all_parents, n, path, emitted)
                    calibration.observe(all_scores[1:][known], took[known], last)
                    would_accept = int(took.sum())
            t5 = perf()
            keep_path(kv, seq_len, path, n)
            t6 = perf()
            stats.steps += 1
            stats.accepted.append(n_acc)
            # The next step's regime: in greedy decoding what this draft would have accepted
            # one level past the verified nodes, so that not drafting does not look like
            # failing; when sampling what it did accept (a skipped draft counts as 0).
            last = n_acc if would_accept is None else would_accept
            stats.draft_nodes.append(n - 1)
            stats.draft_s += t2 - t1
            stats.mask_s += t3 - t2
            stats.forward_s += t4 - t3
            stats.verify_s += t5 - t4
            stats.kv_s += t6 - t5
            host = (t3 - t1) + (t6 - t4)
            self._host_s[cfg.do_sample] += HOST_EMA * (host - self._host_s[cfg.do_sample])
            if costs is not None:
                self._correction.observe(n, t4 - t3, modelled)

            start = len(out)
            out.extend(emitted)
            cut = None
            for k in range(start, len(out)):
                tok = out[k]
                if tok in eos or tok in stop_ids:
                    cut, reason = k + 1, ("eos" if tok in eos else "stop_token")
                    break
            if text is not None:
                # A stop string completed before that token ends the output first.
                k = text.stop_cut(out if cut is None else out[: cut - 1], start)
                if k is not None:
                    cut, reason = k, "stop_string"
            if cut is None and len(out) >= max_new:
                cut, reason = max_new, "length"
            elif cut is not None and cut > max_new:
                cut, reason = max_new, "length"
            if cut is not None:
                del out[cut:]
                # Draft tokens cut off with the rest were not output: not counted as accepted.
                stats.accepted[-1] = min(n_acc, len(out) - start)
            if on_tokens is not None and len(out) > start:
                delta = text.delta(out, final=cut is not None) if text is not None else ""
                on_tokens(out[start:], delta)
            if cut is not None:
                # The final tokens still join the request's output (shared history on finish).
                if len(out) > start:
                    kept_rows = () if rows is None else (r[: len(out) - start] for r in rows)
                    self.cache.extend(rid, out[start:], *kept_rows)
                return out, reason
            self.cache.extend(rid, emitted, *(rows or ()))
            root = emitted[-1]
            if seen is not None:
                seen[torch.tensor(emitted, device=dev)] = True
            seq_len += len(path)


def generate(model, prompt, tokenizer=None, **kwargs) -> GenerationResult:
    """One-shot lookahead generation (a fresh `LookaheadGenerator`; see its `generate`).

    Generator options (`cache`, `depth`, `budget`, `max_budget`, `min_draft_score`,
    `cost_model`, `recycle`) are taken from `kwargs` too.
    """
    # `budget` too: given to `generate` it would be a fixed width, ignoring `max_budget`.
    opts = ("cache", "depth", "budget", "max_budget", "min_draft_score", "cost_model", "recycle")
    gen_kw = {k: kwargs.pop(k) for k in opts if k in kwargs}
    return LookaheadGenerator(model, tokenizer, **gen_kw).generate(prompt, **kwargs)
