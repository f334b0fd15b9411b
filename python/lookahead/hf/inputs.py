"""A request's inputs checked before any forward: the prompt (text or ids), the sampling
settings (as HF `generate` reads them), the model's context, and the id sets that stop it."""

from __future__ import annotations

import operator
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lookahead.args import is_bool, is_int
from lookahead.errors import InvalidInput
from lookahead.hf.sampling import SamplingConfig
from lookahead.hf.stats import GenerationStats, TokenCallback
from lookahead.hf.stopping import TextTracker


@dataclass
class Request:
    """One `generate` call's checked inputs."""

    rid: str
    ids: list
    max_new: int
    cfg: SamplingConfig
    seed: int | None
    eos: set
    stop_ids: set
    text: TextTracker | None
    on_tokens: TokenCallback | None
    multi_branch: bool
    stats: GenerationStats


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
    if is_int(n) and n > 0:
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
    return int(m) if is_int(m) and 0 < m < _UNSET_MAX_LENGTH else None


def check_bool(name: str, v) -> bool:
    """`v` as a bool (ints and others refused)."""
    if not is_bool(v):
        raise ValueError(f"{name} must be a bool, got {v!r}")
    return bool(v)


def as_id_set(x, name: str = "eos_token_id") -> set:
    """`x` (None, an id or ids) as a set of non-negative int ids."""
    if x is None:
        return set()
    bad = ValueError(f"{name} must be None, an int or ints (>= 0), got {x!r}")
    try:
        items = [x] if is_int(x) else list(x)
        if any(is_bool(t) for t in items):
            raise TypeError
        ids = {operator.index(t) for t in items}
    except TypeError:
        raise bad from None
    if any(t < 0 for t in ids):
        raise bad
    return ids


def encode(tokenizer, vocab: int, prompt, chat: bool = False) -> list:
    """Prompt ids from a string (tokenizer needed; chat template if `chat`) or ids, each in
    [0, vocab)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
        if not prompt:
            raise ValueError("the prompt is empty")
        problem = text_problem(prompt)
        if problem:
            raise InvalidInput(f"the prompt {problem}")
        if chat:
            try:
                ids = tokenizer.apply_chat_template(
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
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = token_ids(prompt, vocab)
    if len(ids) == 0:
        raise ValueError("the prompt is empty (no tokens)")
    return list(ids)


def token_ids(prompt, vocab: int) -> list:
    """Checked ids from a 1-D (or batch-1 2-D) tensor, array or iterable of ints. (A tensor
    exists only where torch was imported: the llama.cpp engine checks ids without it.)"""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(prompt, torch.Tensor):
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
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"token ids must lie in [0, {vocab}) (the model's vocabulary), got {lo if lo < 0 else hi}"
        )
    return a.tolist()


def sampling_config(model, do_sample, temperature, top_k, top_p, repetition_penalty):
    """The `SamplingConfig` of a call: arguments given, else the model's generation
    config (as HF `generate`), else the defaults."""
    gc = getattr(model, "generation_config", None)

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


def check_context(ctx: int | None, prompt_len: int, max_new: int) -> None:
    """Refuse a prompt longer than the model's context, before the prefill: a learned
    position table has no row for it (an IndexError mid-prefill, a device-side assert on
    CUDA) and rotary positions past the trained range give meaningless output. Output that
    may run past the context is only warned about (as HF `generate` does, but up front):
    it may well stop sooner."""
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


def check_call(max_new_tokens, stop_strings, seed, on_tokens, tokenizer) -> list:
    """Check a `generate` call's own arguments; its stop strings as a list."""
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if stop_strings is None:
        stop_strings = ()
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not all(isinstance(x, str) for x in stop_strings):
        raise ValueError(f"stop_strings must be a str or strs, got {stop_strings!r}")
    if any(s == "" for s in stop_strings):
        raise ValueError("stop_strings must not contain an empty string (it would match anywhere)")
    for s in stop_strings:  # decoded text holds no lone surrogates: it would never match
        problem = text_problem(s)
        if problem:
            raise InvalidInput(f"stop string {s!r} {problem}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer")
    if seed is not None and not (is_int(seed) and 0 <= seed < 2**64):
        raise ValueError(f"seed must be None or an int in [0, 2**64), got {seed!r}")
    if on_tokens is not None and not callable(on_tokens):
        raise ValueError(f"on_tokens must be callable or None, got {on_tokens!r}")
    return list(stop_strings)


def eos_ids(model) -> set:
    """The EOS ids of the model's generation config (none when it has none)."""
    gc = getattr(model, "generation_config", None)
    return as_id_set(getattr(gc, "eos_token_id", None) if gc is not None else None)


def attention(model) -> str:
    """The model's attention implementation, if it takes a custom 4-D mask."""
    attn = getattr(model.config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        raise ValueError(
            f"attention implementation {attn!r} is not supported: load the model with "
            "attn_implementation='sdpa' (default) or 'eager' (they take a custom 4-D mask)"
        )
    return attn
