"""`LookaheadCache`: the n-gram trie of prompts and outputs that drafts speculative tokens.

A thin wrapper over the Rust core `lookahead._core.Cache`: it validates arguments (so bad
input raises `InvalidInput` with a clear message before reaching Rust) and shapes drafts as
numpy arrays. See docs/interfaces.md for the draft-tree format and rust/README.md for the
design (scoring, eviction, concurrency).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from lookahead import _core
from lookahead.errors import InvalidInput

__all__ = ["BatchDraft", "Draft", "LookaheadCache", "RequestId", "TokenIds"]

RequestId = Union[int, str]
TokenIds = Any  # a sequence of ints or a 1-D numpy integer array

_U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Draft:
    """A draft tree for one request; node 0 is the root (the context's last token).

    `tokens`, `parents` (int32, `parents[0] == -1`, `parents[i] < i`) and `scores` (float32,
    estimated path probability, 1.0 at the root) all have length `num_nodes`.
    """

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    num_nodes: int


@dataclass(frozen=True)
class BatchDraft:
    """Draft trees of B requests padded to width W = budget + 1.

    `tokens`, `parents` int32 [B, W], `scores` float32 [B, W], `num_nodes` int32 [B]. Columns
    `>= num_nodes[b]` hold `tokens = 0`, `parents = -1`, `scores = 0`.
    """

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    num_nodes: np.ndarray

    def row(self, b: int) -> Draft:
        """The draft of request `b` without padding."""
        n = int(self.num_nodes[b])
        return Draft(self.tokens[b, :n], self.parents[b, :n], self.scores[b, :n], n)


def as_token_array(tokens: TokenIds, what: str = "tokens") -> np.ndarray:
    """Validates token ids and returns them as a contiguous 1-D uint32 array.

    Accepts a sequence of Python ints or a 1-D numpy integer array; rejects bools, floats,
    other shapes, negative ids and ids >= 2**32 with `InvalidInput`.
    """
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
            raise InvalidInput(f"{what} must be a sequence of ints or a 1-D integer array")
        if hasattr(tokens, "numpy") and hasattr(tokens, "detach"):  # a torch tensor
            tokens = tokens.detach().cpu().numpy()
            arr = tokens
        else:
            if bool in set(map(type, tokens)):
                raise InvalidInput(f"{what} must be integers, got a bool")
            try:
                arr = np.asarray(tokens)
            except (ValueError, OverflowError) as e:
                raise InvalidInput(f"{what} could not be read as integers: {e}") from None
            if arr.size == 0:
                return np.empty(0, dtype=np.uint32)
            if arr.dtype == object:
                raise InvalidInput(
                    f"{what} must be integers in [0, 2**32), got {_first_bad(tokens)!r}"
                )
    if arr.ndim != 1:
        raise InvalidInput(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.dtype == np.uint32:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind not in "iu":
        raise InvalidInput(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            raise InvalidInput(f"{what} must be >= 0, got {lo}")
        if hi > _U32_MAX:
            raise InvalidInput(f"{what} must be < 2**32, got {hi}")
    return np.ascontiguousarray(arr, dtype=np.uint32)


def _first_bad(tokens: Any) -> Any:
    for t in tokens:
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= t <= _U32_MAX:
            return t
    return tokens


def _check_rid(rid: Any) -> RequestId:
    if isinstance(rid, bool) or not isinstance(rid, (int, str, np.integer)):
        raise InvalidInput(f"request id must be an int or a str, got {type(rid).__name__}")
    return int(rid) if isinstance(rid, np.integer) else rid


def _check_budget(budget: Any) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise InvalidInput(f"budget must be an int, got {type(budget).__name__}")
    if not 1 <= budget <= _core.MAX_BUDGET:
        raise InvalidInput(f"budget must be in [1, {_core.MAX_BUDGET}], got {budget}")
    return int(budget)


def _check_namespace(namespace: Any) -> str:
    if not isinstance(namespace, str):
        raise InvalidInput(f"namespace must be a str, got {type(namespace).__name__}")
    return namespace


class LookaheadCache:
    """An n-gram trie of request prompts and shared outputs that drafts token trees.

    Args:
        max_depth: longest n-gram (window) stored, in tokens (2..64).
        capacity_nodes: hard bound on stored trie nodes, all tries together (28 bytes each,
            plus hash side tables for nodes with more than 8 children).
        prompt_weight: weight of the request's own prompt counts in scoring (>= 0).
        output_weight: weight of the namespace's shared output counts (>= 0).
        keep_prompt_as_history: on finish, merge the prompt's n-grams into shared history.
        background_indexing: `start_request` returns at once and the prompt is indexed on a
            worker thread; only that request's own `draft` waits for it.
        index_threads: background indexing threads (0: min(cores, 4)).

    All methods are thread-safe and release the GIL while the Rust core works.
    """

    def __init__(
        self,
        max_depth: int = 12,
        capacity_nodes: int = 4_000_000,
        prompt_weight: float = 1.0,
        output_weight: float = 1.0,
        keep_prompt_as_history: bool = False,
        background_indexing: bool = True,
        index_threads: int = 0,
        *,
        _core_cache: _core.Cache | None = None,
    ) -> None:
        if _core_cache is not None:
            self._c = _core_cache
            return
        for name, v in (
            ("max_depth", max_depth),
            ("capacity_nodes", capacity_nodes),
            ("index_threads", index_threads),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InvalidInput(f"{name} must be a non-negative int, got {v!r}")
        for name, w in (("prompt_weight", prompt_weight), ("output_weight", output_weight)):
            if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
                raise InvalidInput(f"{name} must be a number, got {w!r}")
        self._c = _core.Cache(
            int(max_depth),
            int(capacity_nodes),
            float(prompt_weight),
            float(output_weight),
            bool(keep_prompt_as_history),
            bool(background_indexing),
            int(index_threads),
        )

    @property
    def config(self) -> dict[str, Any]:
        """The constructor arguments in effect."""
        return dict(self._c.config())

    def start_request(
        self, rid: RequestId, prompt_ids: TokenIds, namespace: str = "default"
    ) -> None:
        """Registers request `rid` and indexes every window of its prompt (non-empty)."""
        prompt = as_token_array(prompt_ids, "prompt_ids")
        if prompt.size == 0:
            raise InvalidInput("prompt_ids must hold at least one token")
        self._c.start_request(_check_rid(rid), prompt, _check_namespace(namespace))

    def extend(self, rid: RequestId, new_token_ids: TokenIds) -> None:
        """Appends verified tokens (accepted + bonus) to `rid`'s context and shared history."""
        self._c.extend(_check_rid(rid), as_token_array(new_token_ids, "new_token_ids"))

    def extend_ndarray(self, rid: RequestId, new_token_ids: np.ndarray) -> None:
        """`extend` for a 1-D uint32 array: skips the Python-side checks and conversion."""
        self._c.extend(rid, new_token_ids)

    def draft(self, rid: RequestId, budget: int = 16, multi_branch: bool = True) -> Draft:
        """Drafts up to `budget` tokens after `rid`'s context: a best-first tree, or one branch."""
        tokens, parents, scores = self._c.draft(
            _check_rid(rid), _check_budget(budget), bool(multi_branch)
        )
        return Draft(tokens, parents, scores, int(tokens.shape[0]))

    def draft_batch(
        self,
        rids: list[RequestId],
        budget: int = 16,
        multi_branch: bool = True,
        threads: int | None = None,
    ) -> BatchDraft:
        """Drafts for many requests at once, padded to `[len(rids), budget + 1]`.

        `threads` (default: min(cores, 8)) splits batches of 32 or more requests over threads
        (at least 16 requests per thread).
        """
        ids = [_check_rid(r) for r in rids]
        if threads is None:
            threads = min(os.cpu_count() or 1, 8)
        tokens, parents, scores, num = self._c.draft_batch(
            ids, _check_budget(budget), bool(multi_branch), int(threads)
        )
        return BatchDraft(tokens, parents, scores, num)

    def finish_request(self, rid: RequestId, keep_prompt: bool | None = None) -> None:
        """Ends `rid`: drops its prompt index (merging it into history if `keep_prompt`)."""
        if keep_prompt is not None and not isinstance(keep_prompt, bool):
            raise InvalidInput(f"keep_prompt must be a bool or None, got {keep_prompt!r}")
        self._c.finish_request(_check_rid(rid), keep_prompt)

    def add_history(self, corpus: list[TokenIds], namespace: str = "default") -> None:
        """Pre-builds `namespace`'s shared history from a corpus of token lists."""
        if isinstance(corpus, np.ndarray) and corpus.ndim == 1:
            raise InvalidInput("corpus must be a list of token lists, got a 1-D array")
        texts = [as_token_array(t, f"corpus[{i}]") for i, t in enumerate(corpus)]
        self._c.add_history(texts, _check_namespace(namespace))

    def stats(self) -> dict[str, int]:
        """nodes, history_nodes, prompt_nodes, capacity_nodes, bytes, live_requests,
        pending_prompts, namespaces, hits, misses, evicted_nodes, truncated_prompts."""
        return dict(self._c.stats())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the shared histories and the configuration to `path` (not live prompts)."""
        self._c.save(os.fspath(path))

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], background_indexing: bool | None = None
    ) -> LookaheadCache:
        """A cache restored from `save`; `background_indexing` overrides the saved setting."""
        return cls(_core_cache=_core.Cache.load(os.fspath(path), background_indexing))

    def check_invariants(self) -> None:
        """Raises `InvariantError` if any trie is broken or the capacity bound is exceeded."""
        self._c.check_invariants()
