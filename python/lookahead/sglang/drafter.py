"""Host-side drafting for SGLang: keeps a `LookaheadCache` in step with the decode batch.

Reads only these fields of SGLang's `Req`: `rid`, `origin_input_ids_unpadded` (the prompt
before multimodal padding, as NGRAM uses), `output_ids`, `extra_key` (SGLang appends the
LoRA id to it) and `sampling_params.custom_params` (a pinned namespace). No SGLang import, so it is usable and testable on its own.

Per decode step, for the whole batch: `sync` starts requests seen for the first time (the
whole prompt is indexed, on the cache's background threads) and streams the verified tokens
that arrived since the last step; `draft` makes one `draft_batch` call that pads every tree
to the verify width N in NGRAM's convention; requests that left the batch are finished.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from lookahead.cache import BatchDraft, LookaheadCache
from lookahead.sglang.config import ServingConfig
from lookahead.sglang.request_control import control_of

__all__ = ["LookaheadDrafter"]

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
# Longest extra_key used as it is in a namespace name (longer ones are hashed).
LONG_KEY = 256


def _ints(seq: Any) -> list:
    """Python ints from a list, an array or a tensor (for `array.extend`)."""
    return seq.tolist() if hasattr(seq, "tolist") else list(seq)


def _ids(seq: Any) -> np.ndarray:
    if isinstance(seq, np.ndarray):
        return seq.astype(np.int64, copy=False)
    if isinstance(seq, array):
        return np.frombuffer(seq, dtype=np.int64) if seq.itemsize == 8 else np.asarray(seq)
    return np.asarray(list(seq), dtype=np.int64)


class LookaheadDrafter:
    """The `LookaheadCache` of one scheduler process and the requests it is tracking."""

    def __init__(self, config: ServingConfig) -> None:
        self.config = config
        self.cache = self._new_cache()
        # rid -> number of context tokens (prompt + outputs) the cache has seen.
        self._ctx_len: dict[Any, int] = {}
        # Requests whose context the cache got wrong: started again from their whole
        # context at the next `sync`.
        self._restart: set = set()
        # Restarted requests' own prompts and namespaces, merged into the shared history when
        # they finish (with `keep_prompt_as_history`), rather than their whole context.
        self._merge_prompt: dict[Any, tuple[np.ndarray, str]] = {}
        # Retracted requests out of the batch until SGLang re-admits them: rid -> Req.
        self._held: dict[Any, Any] = {}

    def _new_cache(self) -> LookaheadCache:
        c = self.config
        return LookaheadCache(
            max_depth=c.max_depth,
            capacity_nodes=c.capacity_nodes,
            own_weight=c.own_weight,
            # "request" shares nothing: each request's own trie (its prompt and outputs) is
            # all it drafts from, and no shared history is kept (one per request would only
            # repeat that text, and its namespace would outlive the request).
            history_weight=0.0 if c.namespace == "request" else c.history_weight,
            keep_prompt_as_history=c.keep_prompt_as_history,
            background_indexing=c.background_indexing is not False,
            index_threads=c.index_threads,
            history_skip=c.history_skip,
            corpus_weight=c.corpora.weight,
            capacity_bytes=c.capacity_bytes,
        )

    def namespace_of(self, req: Any) -> str:
        """The trie namespace of `req`: the one its `custom_params` pin
        (`lookahead.sglang.request_control`), else the configured namespace mode's."""
        mode = self.config.namespace
        if mode == "extra_key":
            pinned = control_of(req, self.config.width).namespace
            if pinned is not None:
                return self.namespace_of_key(pinned)
        if mode == "extra_key" and getattr(req, "extra_key", None):
            return self.namespace_of_key(req.extra_key)
        return DEFAULT_NAMESPACE

    @staticmethod
    def namespace_of_key(extra_key: str) -> str:
        """The namespace of requests with `extra_key` (namespace mode "extra_key"); a key
        longer than `LONG_KEY` characters (or not UTF-8) is named by its SHA-256, so a
        namespace's name stays small whatever a client sends."""
        if len(extra_key) <= LONG_KEY:
            try:
                extra_key.encode("utf-8")
                return f"key:{extra_key}"
            except UnicodeEncodeError:
                pass
        digest = hashlib.sha256(extra_key.encode("utf-8", "surrogatepass")).hexdigest()
        return f"key#{digest}"

    @property
    def live_requests(self) -> frozenset:
        """Request ids the cache is tracking."""
        return frozenset(self._ctx_len)

    def stats(self) -> dict[str, int]:
        """The cache's `stats()`, plus `tracked` (requests followed) and `held` (retracted,
        waiting for re-admission)."""
        return {**self.cache.stats(), "tracked": len(self._ctx_len), "held": len(self._held)}

    def sync(
        self, reqs: Sequence[Any], pending: Sequence[Sequence[int]] | None = None
    ) -> np.ndarray:
        """Brings the cache up to date with `reqs`' contexts before drafting; returns each
        context's last token (the root its tree must have), int64 `[len(reqs)]`.

        `pending[i]`: request i's verified tokens not yet in `output_ids` (SGLang's overlap
        scheduler appends them one step late). A request seen for the first time is started
        with its whole prompt; afterwards only the tokens beyond what the cache has are sent.
        """
        # One extend_batch call for the whole batch: the new tokens one request after another.
        # The new context lengths are recorded only once the cache has the tokens, so a
        # failure anywhere leaves `_ctx_len` as the cache has it (the next sync resends).
        rids: list = []
        lengths: list[int] = []
        flat = array("q")
        totals: dict[Any, int] = {}
        roots = np.empty(len(reqs), dtype=np.int64)
        for i, req in enumerate(reqs):
            if req.rid in totals:
                raise ValueError(f"request {req.rid!r} appears twice in one batch")
            # Lengths first: only a new request's prompt and each step's new tokens are
            # converted, so a step costs the same at 1k and at 100k tokens of context.
            prompt, outputs = req.origin_input_ids_unpadded, req.output_ids
            extra = pending[i] if pending else ()
            n_prompt, n_out = len(prompt), len(outputs)
            total = n_prompt + n_out + len(extra)
            roots[i] = extra[-1] if len(extra) else outputs[-1] if n_out else prompt[-1]
            seen = self._ctx_len.get(req.rid)
            if seen is not None and (seen > total or req.rid in self._restart):
                # The context shrank (a retracted request re-admitted) or was found wrong:
                # start again, the whole context indexed as its own trie's prompt. Its
                # outputs so far are in the shared history already, and nothing is merged
                # there now: at its finish, its own prompt is (if configured).
                ns = self.namespace_of(req)
                self.cache.finish_request(req.rid, keep_prompt=False)
                self._restart.discard(req.rid)
                prompt_ids = _ids(prompt)
                if self.config.keep_prompt_as_history:
                    self._merge_prompt[req.rid] = (prompt_ids, ns)
                context = np.concatenate(
                    [prompt_ids, _ids(outputs[:]), np.asarray(extra, dtype=np.int64)]
                )
                self.cache.start_request(req.rid, context, namespace=ns)
                seen = self._ctx_len[req.rid] = total
            elif seen is None:
                self.cache.start_request(req.rid, _ids(prompt), namespace=self.namespace_of(req))
                seen = self._ctx_len[req.rid] = n_prompt
            if total > seen:
                # seen >= n_prompt here: start_request took the whole prompt.
                start = seen - n_prompt
                before = len(flat)
                if start < n_out:
                    part = outputs[start:]
                    flat.extend(part if isinstance(part, list) else _ints(part))
                if len(extra):
                    flat.extend(_ints(extra[max(0, start - n_out) :]))
                rids.append(req.rid)
                lengths.append(len(flat) - before)
            totals[req.rid] = total
        if rids:
            self.cache.extend_batch(rids, np.frombuffer(flat, dtype=np.int64), lengths)
        self._ctx_len.update(totals)
        return roots

    def draft(self, rids: Sequence[Any], roots: np.ndarray | None = None) -> BatchDraft:
        """One `draft_batch` call for the batch; trees padded to the verify width N.

        Returns the `BatchDraft`: `tokens`, `parents` int32 `[len(rids), N]` (node 0 the
        context's last token), their `scores` and `num_nodes` (the real ones, best-first).
        With `roots` (what `sync` returned), a tree whose root is not its request's last
        verified token is a context the cache got wrong: its root is set right (verification
        then stays exact; only its drafts are off) and the request is started again from its
        whole context at the next `sync`.
        """
        c = self.config
        # Padded in the core the way NGRAM's corpus pads: every tree has exactly N nodes, the
        # unused ones token-0 children of the root. SGLang's verify kernels and CUDA graphs
        # take N rows per request, so our verify input is NGRAM's for the same tree but for
        # the links: `build_verify_tensors` cuts those to padding, which NGRAM would accept
        # wherever the target emits token 0 (lossless, but a draft nobody drafted).
        bd = self.cache.draft_batch(
            rids,
            budget=c.budget,
            multi_branch=c.multi_branch,
            threads=c.draft_threads or None,
            width=c.width,
            pad_parent=0,
        )
        tokens = bd.tokens
        if roots is not None:
            wrong = np.flatnonzero(tokens[:, 0] != roots.astype(np.int32))
            if wrong.size:
                logger.warning(
                    "lookahead: %d request(s) drafted from a context that differs from "
                    "SGLang's (first: %r); their roots are corrected and they restart",
                    wrong.size,
                    rids[int(wrong[0])],
                )
                tokens[wrong, 0] = roots[wrong].astype(np.int32)
                self._restart.update(rids[int(i)] for i in wrong)
        return bd

    def hold(self, rid: Any, req: Any) -> None:
        """Keeps a retracted request live while it waits out of the batch: NGRAM's end-of-step
        erase passes it by, and `release_held` ends it if it finishes before it is back."""
        if rid in self._ctx_len:
            self._held[rid] = req

    def release_held(self, present: set) -> list:
        """Held requests back in the batch (`present`) are tracked as before; returns the held
        ones that finished meanwhile (aborted while waiting), for `finish`."""
        done = []
        for rid, req in list(self._held.items()):
            if rid in present or req.finished():
                del self._held[rid]
                if rid not in present:
                    done.append(rid)
        return done

    def finish(self, rids: Sequence[Any]) -> None:
        """Ends the requests that left the decode batch (unknown ids are ignored)."""
        for rid in rids:
            self._held.pop(rid, None)
            self._restart.discard(rid)
            merge = self._merge_prompt.pop(rid, None)
            if self._ctx_len.pop(rid, None) is None:
                continue
            if merge is None:
                self.cache.finish_request(rid)
            else:  # restarted: its cache prompt is its whole context; merge only its prompt
                self.cache.finish_request(rid, keep_prompt=False)
                self.cache.add_history([merge[0]], namespace=merge[1])

    # NGRAMWorker's names for the same operations (it calls them on `self.ngram_corpus`).
    def erase_match_state(self, rids: Sequence[Any]) -> None:
        """NGRAM's name for `finish`: these requests left the decode batch (retracted ones
        held by `hold` stay)."""
        self.finish([rid for rid in rids if rid not in self._held])

    def synchronize(self) -> None:
        """Nothing to wait for: `draft` waits for a request's own pending prompt index."""

    def reset(self) -> None:
        """Drops every request and all history (SGLang's `clear_cache_pool`); the corpora
        are the operator's and stay."""
        old, self.cache = self.cache, self._new_cache()
        old.move_corpora_to(self.cache)
        self._ctx_len.clear()
        self._restart.clear()
        self._held.clear()
        self._merge_prompt.clear()
