"""`LookaheadWorker`: SGLang's `NGRAMWorker` with drafts from `lookahead.LookaheadCache`.

Only drafting changes. Everything after it (the TARGET_VERIFY forward and its CUDA graphs,
greedy verification, KV moves, logprobs, the overlap relay) is NGRAM's, inherited unchanged.

Per decode step (`_prepare_for_speculative_decoding`, on the host before the graph):
1. the verified tokens since the last step (from `output_ids`, plus the overlap scheduler's
   not-yet-appended tokens, read exactly as NGRAM reads them) are streamed into the cache;
   a request seen for the first time is started with its whole prompt;
2. one `draft_batch` call drafts every request's tree, padded to N nodes as NGRAM pads
   (on CPU a step may verify only each tree's best W nodes: W chosen by
   `lookahead.batch_sizing.BatchSizer` from what this server's forwards cost and what its drafts
   were worth, or by the fixed rule `ServingConfig.cpu_verify_width`);
3. one `tree_metadata` and one `build_full_mask` launch build positions, SGLang's
   retrieve arrays and the attention mask for the batch (NGRAM: a tree-mask kernel plus a
   per-request Python loop);
4. requests that left the batch are finished after the verify (NGRAM's departed-rid
   bookkeeping, pointed at our cache).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_worker import (
    USE_FULL_MASK,
    NGRAMWorker,
    _is_cpu,
    assign_extend_cache_locs_func,
    prepare_mamba_track_for_verify,
)

from lookahead.batch_sizing import BatchSizer
from lookahead.cache import BatchDraft
from lookahead.sglang import patches
from lookahead.sglang.config import ServingConfig, read_env
from lookahead.sglang.corpora import CorpusBook
from lookahead.sglang.cpu_attention import TREE_SDPA_BACKEND
from lookahead.sglang.draft_cuts import cut_drafts
from lookahead.sglang.drafter import LookaheadDrafter
from lookahead.sglang.observe import Observer
from lookahead.sglang.overlap import pending_tokens
from lookahead.sglang.verify import (
    LookaheadVerifyInput,
    VerifyTensors,
    build_verify_tensors,
    host_tree,
    pad_to_width,
)
from lookahead.sglang.warm import Saver, warm_start

__all__ = ["LookaheadWorker"]

logger = logging.getLogger(__name__)


def _attention_backend_of(model_runner: Any) -> str | None:
    """The name of the attention backend the target's verify forward runs (SGLang records
    the resolved prefill / decode names on the backend it built); None if they differ."""
    backend = getattr(model_runner, "attn_backend", None)
    names = {
        getattr(backend, "prefill_attention_backend_str", None),
        getattr(backend, "decode_attention_backend_str", None),
    }
    return names.pop() if len(names) == 1 else None


class LookaheadWorker(NGRAMWorker):
    """NGRAM's speculative worker, drafting from a `LookaheadCache`."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any):
        # NGRAMWorker.__init__ is skipped on purpose: it builds SGLang's C++ n-gram corpus,
        # a node pool we do not use.
        BaseSpecWorker.__init__(self)
        spec = get_spec()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.page_size = get_schedule().page_size
        self.max_trie_depth = spec.speculative_ngram_max_trie_depth
        self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
        self.topk = spec.speculative_eagle_topk
        self.speculative_num_steps = spec.speculative_num_steps
        self.adaptive_controller = None
        config = ServingConfig.for_server(spec, server_args, read_env().config_json)
        self._init_lookahead(
            config,
            device=get_device().device,
            enable_overlap=not get_schedule().disable_overlap_schedule,
            attention_backend=None,  # the target's backend is built after this worker
        )
        tokenizer = getattr(target_worker, "tokenizer", None)
        self.saver = warm_start(self.config.warm, self.drafter, target_worker, tokenizer)
        self.corpus_book.load_start_up(tokenizer)
        registered = [patches.register_patch(n) for n in ("corpus_note", "save_at_exit")]
        if config.exact_sampling:
            registered.append(patches.register_patch("exact_sampling"))
        if any(registered):
            from sglang.srt.plugins.hook_registry import HookRegistry

            HookRegistry.apply_hooks()
        logger.info("lookahead: LOOKAHEAD worker ready: %s", config.as_dict())

    def lookahead_exit(self) -> None:
        """At a graceful scheduler exit (patch `save_at_exit`): the last save."""
        if self.saver is not None:
            self.saver.save(self.drafter.cache, "shutdown")

    def _init_lookahead(
        self,
        config: ServingConfig,
        device: Any,
        enable_overlap: bool,
        attention_backend: str | None = TREE_SDPA_BACKEND,
    ) -> None:
        """The LOOKAHEAD state of the worker (everything drafting reads)."""
        self.config = config
        self.device = device
        # Narrower verify steps only where they were proven: CPU, no overlap relay, and the
        # plugin's tree attention (intel_amx sizes its verify by the configured N). None:
        # decided at the first decode step, from the backend the target model runs.
        self._narrow_steps: bool | None = None
        if torch.device(device).type != "cpu" or enable_overlap:
            self._narrow_steps = False
        elif attention_backend is not None:
            self._narrow_steps = attention_backend == TREE_SDPA_BACKEND
        self.observer = Observer(config.stats_interval_s)
        self._drafted = self._cut = 0  # this step's drafted nodes verified; nodes cut
        # The width of narrower CPU steps by cost (None: the fixed rule), and this step's
        # width when fixed before drafting (None: the sizer's to choose after drafting).
        self.sizer = BatchSizer(config.width) if config.sized_by_cost else None
        self._fixed_width: int | None = config.width
        self._prepare_s = 0.0  # this step's drafting and tree inputs, seconds
        self._context = 0  # mean cached tokens of the last sized step
        self.enable_overlap = enable_overlap
        self.draft_token_num = config.width
        self.drafter = LookaheadDrafter(config)
        # NGRAMWorker's verify path reports departed requests and resets through this name.
        self.ngram_corpus = self.drafter
        self.corpus_book = CorpusBook(self.drafter, config.corpora)
        self.saver: Saver | None = None
        self._prev_decode_rids: set = set()
        self._prev_reqs: dict = {}  # rid -> Req of the last decode batch drafted
        self.grammar_tree_host = None
        self.prev_token_ids: list[int] = []
        self.prev_accept_lens: list[int] = []

    # -- drafting ------------------------------------------------------------------------

    def _pending_tokens(self, batch: Any) -> list[list[int]] | None:
        """Verified tokens not yet in `output_ids` (`lookahead.sglang.overlap`)."""
        return pending_tokens(self, batch)

    def _end_departed(self, batch: Any) -> None:
        """Ends the requests that left the decode batch before this step indexes new prompts
        (NGRAM erases them after the verify; until then their own tries would hold
        capacity that new prompts need). A retracted request (`is_retracted`, not finished)
        is held instead: SGLang re-admits it with its `output_ids`, and only what follows
        them streams in then (ending it would count its outputs into the shared history
        again). Held requests that finish while waiting (aborted) are ended here."""
        present = {req.rid for req in batch.reqs}
        gone = []
        for rid in self._prev_decode_rids - present:
            req = self._prev_reqs.get(rid)
            if req is not None and getattr(req, "is_retracted", False) and not req.finished():
                self.drafter.hold(rid, req)
            else:
                gone.append(rid)
        ended = gone + self.drafter.release_held(present)
        self.drafter.finish(ended)
        self._prev_reqs = {req.rid: req for req in batch.reqs}

    def _prepare_draft_tokens(self, batch: Any) -> BatchDraft:
        """Streams new tokens into the cache and drafts the batch: `tokens`, `parents`
        int32 `[bs, N]` (NGRAM's padding; node 0 = each request's last verified token),
        their scores and real node counts."""
        self._end_departed(batch)
        pending = self._pending_tokens(batch)
        roots = self.drafter.sync(batch.reqs, pending)
        draft = self.drafter.draft([req.rid for req in batch.reqs], roots)
        self._cut = cut_drafts(draft, batch.reqs, self.config.width)
        return draft

    def _build_verify_tensors(self, batch: Any) -> tuple[np.ndarray, np.ndarray, VerifyTensors]:
        """Drafts and builds the verify tensors of a decode batch (no SGLang pools touched),
        at this step's width (`self.draft_token_num`, set here when the sizer chooses it):
        the first nodes of each tree, which are its best (drafts are best-first, parents
        before children, so a prefix is a tree)."""
        draft = self._prepare_draft_tokens(batch)
        tokens, parents = draft.tokens, draft.parents
        if batch.seq_lens_cpu is not None:
            seq_lens_sum = int(batch.seq_lens_cpu.sum())
        else:
            seq_lens_sum = int(batch.seq_lens_sum)
        if self._fixed_width is None:
            self.draft_token_num = self._sized_width(batch, draft, seq_lens_sum)
        width = self.draft_token_num
        real = np.minimum(draft.num_nodes, width)
        self._drafted = int(real.sum()) - len(batch.reqs)
        if width < tokens.shape[1]:
            tokens = np.ascontiguousarray(tokens[:, :width])
            parents = np.ascontiguousarray(parents[:, :width])
        vt = build_verify_tensors(
            tokens,
            parents,
            batch.seq_lens,
            seq_lens_sum,
            full_mask=USE_FULL_MASK and not _is_cpu,
            num_nodes=real,
        )
        return tokens, parents, vt

    def _sized_width(self, batch: Any, draft: BatchDraft, seq_lens_sum: int) -> int:
        """The sizer's width for this decode batch, from its drafts and its cached tokens."""
        reqs = batch.reqs
        self._context = seq_lens_sum // max(len(reqs), 1)
        # SGLang makes a greedy request top_k = 1 (temperature 0 included).
        sampled = [getattr(r.sampling_params, "top_k", 1) != 1 for r in reqs]
        return self.sizer.width(
            [r.rid for r in reqs],
            draft.tokens,
            draft.parents,
            draft.scores,
            draft.matched,
            draft.num_nodes,
            self._context,
            sampled,
        )

    def _step_width(self, batch: Any) -> int | None:
        """This step's verify width where it is fixed before drafting: N for anything but a
        decode batch, for batches that return logprobs or hidden states (their rows keep
        NGRAM's layout, N per request), and wherever steps are not narrowed; the fixed rule
        `ServingConfig.cpu_verify_width` where `max_verify_rows` is set or several ranks
        serve; None where the sizer chooses it from the drafts. Only the CPU engine with the
        plugin's attention narrows steps: it runs no graphs, and SGLang turns the overlap
        relay off there for NGRAM-style workers."""
        if self._narrow_steps is None:
            backend = _attention_backend_of(self.model_runner)
            self._narrow_steps = backend == TREE_SDPA_BACKEND
            logger.info(
                "lookahead: attention backend %s: narrower CPU verify steps %s",
                backend,
                ("by cost" if self.sizer is not None else "by rows")
                if self._narrow_steps
                else "off",
            )
        if (
            not self._narrow_steps
            or not batch.forward_mode.is_decode()
            or batch.return_logprob
            or getattr(batch, "return_hidden_states", False)
        ):
            return self.config.width
        if self.sizer is None:
            return self.config.cpu_verify_width(len(batch.reqs))
        return None

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """NGRAM's step at this step's width (its verify reads `draft_token_num`); a
        narrower step's accepted tokens are padded back to NGRAM's N per request, the stride
        the scheduler reads, merges and filters them with. A step the sizer sized tells it
        what its forward cost and what each request emitted."""
        decode = batch.forward_mode.is_decode()
        bs = len(batch.reqs)
        self._fixed_width = self._step_width(batch)
        self.draft_token_num = self._fixed_width or self.config.width
        self._prepare_s = 0.0
        start = time.perf_counter()
        try:
            result = super().forward_batch_generation(batch, *args, **kwargs)
            width = self.draft_token_num
        finally:
            self.draft_token_num = self.config.width
        if decode:
            # Read back only where someone uses it: on CUDA it waits for the verify, which
            # the overlap scheduler would otherwise not wait for here.
            lens = None
            if self.observer.series is not None or self._fixed_width is None:
                lens = result.next_draft_input.accept_lens.tolist()
            self.observer.step(width, bs, self._drafted, lens and sum(lens), self._cut)
            if self._fixed_width is None:
                forward_s = time.perf_counter() - start - self._prepare_s
                ids = result.next_token_ids.view(bs, width).tolist()
                emitted = [row[:n] for row, n in zip(ids, lens)]
                self.sizer.observe(forward_s, self._prepare_s, emitted)
        self._fixed_width = self.config.width
        if width != self.config.width:
            pad_to_width(result, bs, width, self.config.width)
        return result

    def _prepare_for_speculative_decoding(self, batch: Any) -> None:
        if not batch.forward_mode.is_decode():
            return
        started = time.perf_counter()
        bs = len(batch.reqs)
        self.observer.tick(self.drafter, self.sizer, self._context)
        if self.saver is not None:
            self.saver.tick(self.drafter.cache)
        tokens, parents, vt = self._build_verify_tensors(batch)
        self.grammar_tree_host = host_tree(tokens, parents) if batch.has_grammar else None

        if self.draft_token_num == self.config.width:
            # NGRAM's buffers: fixed addresses for the CUDA graphs captured at width N.
            draft_tokens = self.draft_tokens_batch[bs]
            positions = self.positions_batch[bs]
            retrieve_index = self.retrieve_indexes_batch[bs]
            retrieve_next_token = self.retrieve_next_token_batch[bs]
            retrieve_next_sibling = self.retrieve_next_sibling_batch[bs]
            draft_tokens.copy_(vt.draft_tokens)
            positions.copy_(vt.positions)
            retrieve_index.copy_(vt.retrieve_index)
            retrieve_next_token.copy_(vt.retrieve_next_token)
            retrieve_next_sibling.copy_(vt.retrieve_next_sibling)
        else:  # a narrower CPU step: no graph, so the fresh tensors serve as they are
            draft_tokens, positions = vt.draft_tokens, vt.positions
            retrieve_index, retrieve_next_token = vt.retrieve_index, vt.retrieve_next_token
            retrieve_next_sibling = vt.retrieve_next_sibling

        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = draft_tokens
        batch.out_cache_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=batch.seq_lens,
            end_offset=batch.seq_lens + self.draft_token_num,
            batch_size=bs,
            draft_token_num=self.draft_token_num,
            device=self.device,
        )
        prepare_mamba_track_for_verify(batch)
        batch.spec_info = LookaheadVerifyInput(
            draft_token=draft_tokens,
            custom_mask=vt.custom_mask,
            positions=positions,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            draft_token_num=self.draft_token_num,
            tree_tokens=vt.tree_tokens,
            tree_parents=vt.tree_parents,
            tree_num_nodes=vt.num_nodes,
            exact_sampling=self.config.exact_sampling,
        )
        self._prepare_s = time.perf_counter() - started

    def _update_ngram_corpus(self, batch: Any) -> None:
        """Nothing here: the verified tokens reach the cache at the next draft, the first
        moment they are on the host without an extra device sync (NGRAM inserts here the
        tokens it read at draft time, one step late, for the same reason)."""

    # -- external corpora (SGLang's scheduler calls these, as NGRAM's) --------------------

    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        return self.corpus_book.add(corpus_id, token_chunks)

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        """Nothing to commit: `add_external_corpus` published the corpus whole."""

    def corpus_note(self, corpus_id: str) -> str | None:
        return self.corpus_book.note(corpus_id)

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.corpus_book.remove(corpus_id)

    def list_external_corpora(self) -> dict[str, int]:
        return self.corpus_book.listing()
