"""`LookaheadCache`: the n-gram trie of prompts and outputs that drafts speculative tokens.

A thin wrapper over the Rust core `lookahead._core.Cache`, which checks and converts every
argument itself (bad input raises `InvalidInput` with a clear message before any state
changes) and returns drafts as numpy arrays; the per-step methods (`extend`, `draft`, `step`)
pass their arguments straight through. See docs/interfaces.md for the draft-tree format and
rust/README.md for the design (scoring, eviction, concurrency).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
from typing import Any, Union

import numpy as np

from lookahead import _core
from lookahead.args import core_knobs, is_bool, is_int, predictions, refuse_renamed, rid_list
from lookahead.drafts import BatchDraft, Draft
from lookahead.errors import InvalidInput

__all__ = ["BatchDraft", "Draft", "LookaheadCache", "RequestId", "TokenIds"]

RequestId = Union[int, str]
TokenIds = Any  # a list/tuple of ints, a 1-D numpy integer array or a 1-D torch tensor


# The knobs' defaults, from the core (one source for the wrapper, CLI, SGLang config, docs).
_DEFAULTS = _core.DEFAULTS
# Half the cores, at most 8: a serving process has other work for the rest (prompt indexing,
# its scheduler); on a 2-core machine a second draft thread costs more than it saves
# (`python -m benchmarks.serving_host`, BENCHMARKS.md, "SGLang serving"). Read once: os.cpu_count() costs ~10 µs.
_DRAFT_THREADS = max(1, min((os.cpu_count() or 1) // 2, 8))


class LookaheadCache:
    """An n-gram trie of request prompts and shared outputs that drafts token trees.

    Args:
        max_depth: longest n-gram (window) stored, in tokens (2..64).
        capacity_nodes: hard bound on stored trie nodes, all tries together; memory follows
            it in bytes (`stats()["bytes"]` <= 256 B per capacity node + 8 KiB per namespace
            and live request; about 62 B measured), whatever the number of namespaces. A
            namespace past half of it evicts its own history first; one prompt indexes at
            most a quarter of it (docs/interfaces.md, "Memory").
        own_weight: weight of the request's own counts in scoring (0 to 1e6): its prompt's
            n-grams and those of its outputs so far (the request's own trie; at 0 it is not
            built).
        history_weight: weight of the namespace's shared counts (0 to 1e6): the outputs of all its
            requests (and merged prompts, `add_history` texts); at 0 outputs and kept prompts
            are not counted there (`add_history` still is).
        keep_prompt_as_history: on finish, merge the prompt's n-grams into shared history.
        background_indexing: `start_request` returns at once and the prompt is indexed on a
            worker thread; only that request's own `draft` waits for it.
        index_threads: background indexing threads (0: min(cores, 4); at most 256).
        history_skip: `(lo, hi)`, `1 <= lo <= hi <= 64`: drafts leave the shared history
            out of every draft state whose context (n-gram) is `lo` to `hi` tokens long; the
            request's own trie still answers there, and the history does again for shorter
            and longer contexts (a draft path keeps following it). With the default `(3, 6)`:
            a 3-6-token match in other requests' text is mostly a coincidence whose
            continuation would outrank the request's own; 1-2 tokens give common
            continuations, and 7 and more are repeats (a repeated request still copies its
            earlier answer). `None`: consult it at every length (research/README.md).
        recycle_k: how many of the target's top predictions to keep per key from
            `extend(..., top_ids=, top_probs=)` (0 to 64; 0, the default: none, drafts come
            from the tries only). Drafts offer them as children of the node whose token (after
            its parent's, where that pair has a row) they followed, scored `recycle_weight * p`
            beside the tries' continuations (docs/interfaces.md, "Recycled predictions").
        recycle_slots: keys the recycled-prediction table holds at most, over all namespaces
            (the oldest written goes first; about `recycle_slots * (8 * recycle_k + 75)`
            bytes once full, counted in `stats()["bytes"]`; `save` keeps the settings, not the
            rows: a loaded cache recycles as the saved one did, from an empty table).
        recycle_weight: scale of a recycled prediction's probability in draft scores (above 0,
            at most 1e6).
        corpus_weight: weight of a corpus's draft (`add_corpus`) against the request's own
            draft (from its own text and history together) where both answer (above 0, at
            most 1e6): a path's score is the weighted mean of its scores in each (0 where
            one lacks it), and the best `budget` paths are kept.
        capacity_bytes: a hard bound on `stats()["bytes"]` (0, the default: none; else at
            least 1 MiB), plus 16 KiB per live request and 8 KiB per corpus; kept by the worst case per node and
            per namespace, so a typical stream fills about a quarter of it
            (docs/interfaces.md, "Memory", "A byte budget").

    All methods are thread-safe and release the GIL while the Rust core works.
    """

    def __init__(
        self,
        max_depth: int = _DEFAULTS["max_depth"],
        capacity_nodes: int = _DEFAULTS["capacity_nodes"],
        own_weight: float = _DEFAULTS["own_weight"],
        history_weight: float = _DEFAULTS["history_weight"],
        keep_prompt_as_history: bool = _DEFAULTS["keep_prompt_as_history"],
        background_indexing: bool = _DEFAULTS["background_indexing"],
        index_threads: int = _DEFAULTS["index_threads"],
        history_skip: tuple[int, int] | None = _DEFAULTS["history_skip"],
        recycle_k: int = _DEFAULTS["recycle_k"],
        recycle_slots: int = _DEFAULTS["recycle_slots"],
        recycle_weight: float = _DEFAULTS["recycle_weight"],
        corpus_weight: float = _DEFAULTS["corpus_weight"],
        capacity_bytes: int = _DEFAULTS["capacity_bytes"],
        *,
        _core_cache: _core.Cache | None = None,
        **renamed: Any,
    ) -> None:
        refuse_renamed(renamed, "LookaheadCache")
        if _core_cache is not None:
            self._c = _core_cache
            return
        self._c = _core.Cache(
            *core_knobs(
                max_depth,
                capacity_nodes,
                own_weight,
                history_weight,
                keep_prompt_as_history,
                background_indexing,
                index_threads,
                history_skip,
                recycle_k,
                recycle_slots,
                recycle_weight,
                corpus_weight,
                capacity_bytes,
            )
        )

    @property
    def config(self) -> dict[str, Any]:
        """The constructor arguments in effect."""
        return dict(self._c.config())

    def start_request(
        self, rid: RequestId, prompt_ids: TokenIds, namespace: str = "default"
    ) -> None:
        """Registers request `rid` and indexes every window of its prompt (non-empty)."""
        self._c.start_request(rid, prompt_ids, namespace)

    def extend(
        self,
        rid: RequestId,
        new_token_ids: TokenIds,
        top_ids: Any = None,
        top_probs: Any = None,
    ) -> None:
        """Appends verified tokens (accepted + bonus) to `rid`'s context, its own trie and
        its namespace's shared history.

        `top_ids` / `top_probs` (both or neither; 2-D, one row per new token, `k >= 1` columns,
        numpy arrays or torch tensors): the target's top-k next tokens and their probabilities
        in `[0, 1]` from the distribution that chose each new token (row 0: after the context's
        last token before this call). Kept as recycled predictions where `recycle_k > 0`
        (checked either way).

        Token ids: a list or tuple of ints, a 1-D numpy array of any integer dtype, or a 1-D
        integer torch tensor; ids must lie in `[0, 2**32)` (bools, floats, other shapes and
        out-of-range ids raise `InvalidInput`). More than 262,144 ids are counted in parts,
        with Ctrl-C checked in between: a KeyboardInterrupt leaves the parts before it counted.
        """
        if top_ids is None and top_probs is None:
            self._c.extend(rid, new_token_ids)
            return
        ids, probs = predictions(top_ids, top_probs, new_token_ids)
        self._c.extend_predicted(rid, new_token_ids, ids.ravel(), probs.ravel(), ids.shape[1])

    def recycle(
        self,
        rid: RequestId,
        token_ids: TokenIds,
        top_ids: Any,
        top_probs: Any,
        after: TokenIds | None = None,
    ) -> None:
        """Keeps the target's top-k predictions after each of `token_ids` (row j: the
        distribution that followed `token_ids[j]`; shapes as in `extend`) as recycled
        predictions of `rid`'s namespace, without extending `rid`'s context: for distributions
        computed off the accepted path, such as a prompt's prefill or a draft's rejected
        nodes. `after[j]` is the token before `token_ids[j]` (a draft node's parent); None:
        `token_ids` is a sequence (`token_ids[j - 1]`). A no-op where `recycle_k` is 0."""
        ids, probs = predictions(top_ids, top_probs, token_ids)
        self._c.recycle_after(rid, token_ids, after, ids.ravel(), probs.ravel(), ids.shape[1])

    def extend_batch(
        self, rids: list[RequestId], new_token_ids: TokenIds, lengths: list[int]
    ) -> None:
        """`extend` for many requests in one call: `new_token_ids` holds their new tokens one
        request after another, `lengths[i]` of them request i's (0 allowed).

        Every id is checked before anything changes; a serving loop saves a call and a GIL
        release per request.
        """
        rids = rid_list(rids)
        try:
            lengths = [operator.index(n) for n in lengths]
        except TypeError:
            raise InvalidInput(f"lengths must be non-negative ints, got {lengths!r}") from None
        if any(not 0 <= n < 2**63 for n in lengths):
            raise InvalidInput(f"lengths must be non-negative ints, got {lengths!r}")
        self._c.extend_batch(rids, new_token_ids, lengths)

    def extend_ndarray(self, rid: RequestId, new_token_ids: np.ndarray) -> None:
        """`extend` for a 1-D numpy integer array (any integer dtype, any strides).

        The array is read where it lies, converted and range-checked in one pass while it is
        copied into the core (no intermediate array); `extend` takes the same path for arrays,
        so this name only documents the intent.
        """
        self._c.extend(rid, new_token_ids)

    def draft(
        self,
        rid: RequestId,
        budget: int = 16,
        multi_branch: bool = True,
        *,
        vocab: int | None = None,
        max_depth: int | None = None,
    ) -> Draft:
        """Drafts up to `budget` tokens after `rid`'s context: a best-first tree, or one branch.

        `vocab` (an int in `[1, 2**32]`): nodes whose ids are `vocab` or more are left out,
        with their descendants (a history shared with a model of another vocabulary);
        `max_depth` (an int >= 0): so are nodes more than `max_depth` levels below the root
        (draft tokens the output has no room for). The rest keep their best-first order."""
        return self._c.draft(rid, budget, multi_branch, vocab, max_depth)

    def step(
        self,
        rid: RequestId,
        new_token_ids: TokenIds,
        budget: int = 16,
        multi_branch: bool = True,
        *,
        vocab: int | None = None,
        max_depth: int | None = None,
    ) -> Draft:
        """`extend(rid, new_token_ids)` then `draft(rid, budget, multi_branch, vocab=vocab,
        max_depth=max_depth)` in one call.

        The same result as the two calls, with one call and one GIL release fewer (measured on
        the recorded traces: ~0.4-0.7 µs less per step). Arguments are checked before anything
        changes: a bad budget leaves the context as it was.
        """
        return self._c.step(rid, new_token_ids, budget, multi_branch, vocab, max_depth)

    def draft_batch(
        self,
        rids: list[RequestId],
        budget: int = 16,
        multi_branch: bool = True,
        threads: int | None = None,
        *,
        width: int | None = None,
        pad_parent: int = -1,
    ) -> BatchDraft:
        """Drafts for many requests at once, padded to `[len(rids), width]`.

        `threads` (default: half the cores, at most 8) splits batches of 32 or more requests
        over threads (at least 16 requests per thread). `width` (default `budget + 1`, at least that) and
        `pad_parent` (-1, or 0: padding nodes are token-0 children of the root, SGLang
        NGRAM's convention) shape the output for a fixed verify width.
        """
        rids = rid_list(rids)
        if threads is None:
            threads = _DRAFT_THREADS
        elif not is_int(threads) or threads < 0:
            raise InvalidInput(f"threads must be a non-negative int or None, got {threads!r}")
        if width is not None and (not is_int(width) or width < 1):
            raise InvalidInput(f"width must be a positive int or None, got {width!r}")
        if not isinstance(pad_parent, (int, np.integer)) or isinstance(pad_parent, bool) or pad_parent not in (-1, 0):  # fmt: skip
            raise InvalidInput(f"pad_parent must be -1 or 0, got {pad_parent!r}")
        return BatchDraft(
            *self._c.draft_batch(
                rids,
                budget,
                multi_branch,
                min(int(threads), 1024),
                None if width is None else int(width),
                int(pad_parent),
            )
        )

    def finish_request(self, rid: RequestId, keep_prompt: bool | None = None) -> None:
        """Ends `rid`: drops its prompt index (merging it into history if `keep_prompt`)."""
        if keep_prompt is not None and not is_bool(keep_prompt):
            raise InvalidInput(f"keep_prompt must be a bool or None, got {keep_prompt!r}")
        self._c.finish_request(rid, None if keep_prompt is None else bool(keep_prompt))

    def add_history(self, corpus: list[TokenIds], namespace: str = "default") -> None:
        """Pre-builds `namespace`'s shared history from a corpus of token lists.

        Ctrl-C stops it between parts of 262,144 tokens (what was indexed stays)."""
        if isinstance(corpus, np.ndarray) and corpus.ndim == 1:
            raise InvalidInput("corpus must be a list of token lists, got a 1-D array")
        if isinstance(corpus, (str, bytes)) or not isinstance(corpus, Iterable):
            raise InvalidInput(f"corpus must be a list of token lists, got {type(corpus).__name__}")
        self._c.add_history(list(corpus), namespace)

    def stats(self) -> dict[str, int]:
        """nodes, history_nodes, own_nodes, corpus_nodes, capacity_nodes (under
        `capacity_bytes`, the node capacity it allows), capacity_bytes, bytes, live_requests, pending_prompts, namespaces, corpora, hits, misses, evicted_nodes,
        truncated_prompts, recycled_keys.

        `own_nodes` counts the live requests' own tries: their prompts' n-grams and those
        of their outputs so far."""
        return dict(self._c.stats())

    def add_corpus(
        self, corpus_id: str, documents: list[TokenIds], namespace: str | None = None
    ) -> dict[str, Any]:
        """Builds corpus `corpus_id` from `documents` (token lists; no n-gram spans two) and
        publishes it whole: drafts of `namespace` (None: of every namespace) read it from then
        on, mixed in at `corpus_weight`. Never evicted; corpora together hold at most half of
        `capacity_nodes` (evicting shared history for room, never prompts): past that a
        corpus is cut and says so. One build at a time; Ctrl-C stops it, publishing nothing.
        Returns `{"id", "scope", "tokens", "nodes", "bytes", "cut"}`."""
        if not isinstance(corpus_id, str):
            raise InvalidInput(f"corpus_id must be a str, got {type(corpus_id).__name__}")
        if isinstance(documents, (str, bytes, np.ndarray)) or not isinstance(documents, Iterable):
            raise InvalidInput("documents must be a list of token lists")
        return dict(self._c.add_corpus(corpus_id, list(documents), namespace))

    def remove_corpus(self, corpus_id: str) -> bool:
        """Removes corpus `corpus_id` whole; returns whether it was loaded."""
        if not isinstance(corpus_id, str):
            raise InvalidInput(f"corpus_id must be a str, got {type(corpus_id).__name__}")
        return self._c.remove_corpus(corpus_id)

    def move_corpora_to(self, other: LookaheadCache) -> list[str]:
        """Moves every corpus into `other` (a cache of the same settings replacing this one)
        where its capacity allows; returns the ids moved."""
        return self._c.move_corpora_to(other._c)

    def corpora(self) -> list[dict[str, Any]]:
        """The loaded corpora, oldest first, as `add_corpus` describes them."""
        return [dict(c) for c in self._c.corpora()]

    def save(self, path: str | os.PathLike[str], meta: str | None = None) -> None:
        """Writes the shared histories, the corpora and the configuration to `path` (not
        live prompts, nor recycled predictions, though their settings are kept):
        checksummed, atomic (temporary file, fsync, rename, folder fsync); a symbolic link is
        written through. `meta`: the caller's own text (at most 1 MiB; the SGLang plugin
        keeps its tokenizer's fingerprint there), back as `saved_meta` after `load`.

        Drafts go on while a namespace's history is walked (~0.5 s for 2.8M nodes, 2 cores);
        a step leaves its tokens for the history to a later step (at most 4,096 per request,
        then it waits), `add_history` of that namespace waits, and `finish_request` hands its
        history work to the indexing threads (or waits, without background indexing)."""
        if meta is not None and not isinstance(meta, str):
            raise InvalidInput(f"meta must be a str or None, got {type(meta).__name__}")
        self._c.save(os.fspath(path), meta)

    @property
    def saved_meta(self) -> str | None:
        """The `meta` the loaded file was saved with (None: not loaded, or none given)."""
        return self._c.saved_meta()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        background_indexing: bool | None = None,
        index_threads: int | None = None,
        allow_legacy: bool = False,
    ) -> LookaheadCache:
        """A cache restored from `save`; `background_indexing` overrides the saved setting.

        `index_threads` is not saved (it belongs to the machine, not to the data): `None`
        gives 0, as many threads as the cores allow (at most 4). Files of versions 1 and 2
        (before checksums; most damaged bytes in them load silently, and a crafted one can
        take 35x its size in memory) raise `FileFormatError` unless `allow_legacy` is True: for
        a file one trusts, to be saved again as a checked version 4 file. Only a regular
        file is read (a FIFO or a device raises at once; `save` never replaces one).
        """
        if not is_bool(allow_legacy):
            raise InvalidInput(f"allow_legacy must be a bool, got {allow_legacy!r}")
        if background_indexing is not None and not is_bool(background_indexing):
            raise InvalidInput(
                f"background_indexing must be a bool or None, got {background_indexing!r}"
            )
        if index_threads is not None and not (is_int(index_threads) and 0 <= index_threads < 2**63):
            raise InvalidInput(
                f"index_threads must be a non-negative int or None, got {index_threads!r}"
            )
        bg = None if background_indexing is None else bool(background_indexing)
        threads = None if index_threads is None else int(index_threads)
        return cls(_core_cache=_core.Cache.load(os.fspath(path), bg, threads, bool(allow_legacy)))

    def check_invariants(self) -> None:
        """Raises `InvariantError` if any trie is broken or the capacity bound is exceeded."""
        self._c.check_invariants()
