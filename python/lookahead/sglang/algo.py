"""The `LOOKAHEAD` speculative algorithm as SGLang sees it: an NGRAM-shaped `CustomSpecAlgo`.

`is_ngram()` is True and `has_draft_kv()` False, so every NGRAM branch of SGLang's scheduler
applies unchanged (TARGET_VERIFY decode CUDA graphs of width N, the overlap relay, the KV
reserve, NGRAM's verify pass). SGLang 0.5.23's `CustomSpecAlgo` lacks three methods the
scheduler calls on every algorithm (`carries_draft_hidden_states`, `create_future_map`,
`need_topk`); they are defined here with NGRAM's behaviour.

Importing this module imports SGLang; `lookahead.sglang.register` does so lazily.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sglang.srt.arg_groups.overrides import record_of, resolving_view
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from lookahead.sglang.config import (
    ALGORITHM_NAME,
    CONFIG_ENV,
    LookaheadConfigError,
    ServingConfig,
    read_env,
)

__all__ = ["ALGORITHM_NAME", "LookaheadSpecAlgo", "register_algorithm", "unwrap_record"]


logger = logging.getLogger(__name__)


def unwrap_record(server_args: Any) -> Any:
    """The `ServerArgs` record behind the stand-in SGLang hands to a plugin's
    `handle_server_args`.

    SGLang 0.5.23 calls a registered algorithm's `handle_server_args` with a
    `_ForeignDefaults` recorder that turns attribute writes into declarations. NGRAM's own
    handler (`_handle_ngram`) declares through `declare_resolution`, which must get the
    record itself (SGLang's in-tree dispatcher passes the record for this reason), so we
    unwrap it. Anything else (a record, or a plain test object) is returned unchanged.
    """
    try:
        cfg = object.__getattribute__(server_args, "_cfg")
    except AttributeError:
        return server_args
    return record_of(cfg)


class LookaheadSpecAlgo(CustomSpecAlgo):
    """`LOOKAHEAD`: NGRAM's verify path with drafts from `lookahead.LookaheadCache`."""

    def is_ngram(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return False

    def supports_mixed_chunk(self) -> bool:
        # NGRAM's overlap relay skips output_tokens_buf, which mixed chunks read.
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def need_topk(self) -> bool:
        return False

    def get_platform_worker_cls(self) -> type | None:
        # Out-of-tree platforms ship workers for builtin algorithms only; ours is CUDA's.
        return None

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(
            device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    def handle_server_args(self, server_args: Any) -> None:
        """NGRAM's server-argument defaults (`_handle_ngram`), then LOOKAHEAD's checks.

        Raises `LookaheadConfigError` (a `ValueError`) at start-up for DP attention, a
        device other than CUDA or CPU, PD-disaggregated decode, a budget that does not fit
        the CUDA-graph verify width, a start-up corpus file that is missing or not JSONL
        of strings, a `save` folder missing or a `load` file missing, `background_indexing: true`
        with several model ranks, or `max_verify_rows` off the CPU.
        """
        from sglang.srt.arg_groups.speculative_hook import _handle_ngram
        from sglang.srt.runtime_context import attn_dp_enabled_of

        record = unwrap_record(server_args)
        cfg = resolving_view(record)
        if cfg.device not in ("cuda", "cpu"):
            raise LookaheadConfigError(
                f"--speculative-algorithm {ALGORITHM_NAME} needs --device cuda or cpu, got "
                f"--device {cfg.device}"
            )
        if attn_dp_enabled_of(cfg):
            raise LookaheadConfigError(
                f"--speculative-algorithm {ALGORITHM_NAME} does not support DP attention "
                "(neither does SGLang's NGRAM, whose verify path it uses); remove "
                "--attn-dp-size / --enable-dp-attention"
            )
        if getattr(cfg, "disaggregation_mode", "null") == "decode":
            # SGLang 0.5.23 stashes the decode side's first relay without accept tokens for
            # NGRAM-style workers and fails reading them (overlap_utils FutureMap.stash).
            raise LookaheadConfigError(
                f"--speculative-algorithm {ALGORITHM_NAME} does not support "
                "--disaggregation-mode decode (neither does SGLang 0.5.23's NGRAM path it uses)"
            )
        _accept_external_corpus(record)
        _handle_ngram(record)
        if cfg.device == "cpu":
            _choose_cpu_attention(record)
        view = resolving_view(record)
        config = ServingConfig.for_server(view, view, read_env().config_json)
        if cfg.device != "cpu" and config.max_verify_rows is not None:
            raise LookaheadConfigError(
                f"LOOKAHEAD_CONFIG: max_verify_rows applies to --device cpu only (on "
                f"{cfg.device} every step verifies --speculative-num-draft-tokens nodes, the "
                "width its graphs and overlap relay are built for)"
            )
        config.warm.check_paths(CONFIG_ENV, int(getattr(view, "dp_size", 1) or 1))
        logger.info("lookahead: %s resolved to %s", ALGORITHM_NAME, config.as_dict())


def _accept_external_corpus(record: Any) -> None:
    """NGRAM's start-up corpus flag, checked before any scheduler starts (the file's
    format; its token count needs the tokenizer, in the scheduler).
    `--speculative-ngram-external-sam-budget` sizes NGRAM's corpus subtree, which LOOKAHEAD
    does not have (corpus paths are ranked with the rest): NGRAM's defaults refuse a corpus
    without one, so an unset budget is declared 1 for them."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    from lookahead.sglang.corpora import check_corpus_file

    view = resolving_view(record)
    path = view.speculative_ngram_external_corpus_path
    if path is None:
        return
    check_corpus_file(path)
    if view.speculative_ngram_external_sam_budget <= 0:
        declare_resolution(record, "lookahead_corpus", speculative_ngram_external_sam_budget=1)


def _choose_cpu_attention(record: Any) -> None:
    """On CPU, SGLang's `torch_native` attention (its choice where the CPU has no AMX) has
    no verify branch; LOOKAHEAD then uses `cpu_attention`'s tree-masked SDPA instead.
    `intel_amx` (AMX CPUs) verifies with the tree mask itself and is kept."""
    from sglang.srt.arg_groups.overrides import (
        _attention_backend_platform_fallbacks as platform_fallbacks,
    )
    from sglang.srt.arg_groups.overrides import declare_resolution

    from lookahead.sglang.cpu_attention import TREE_SDPA_BACKEND

    view = resolving_view(record)
    backend = platform_fallbacks(view).get("attention_backend", view.attention_backend)
    if backend == "torch_native":
        declare_resolution(record, "lookahead_cpu_attention", attention_backend=TREE_SDPA_BACKEND)
        logger.info(
            "lookahead: %s on CPU verifies with attention backend %s (torch_native has no "
            "tree-mask verify)",
            ALGORITHM_NAME,
            TREE_SDPA_BACKEND,
        )


def _worker_factory(server_args: Any) -> type:
    from lookahead.sglang.worker import LookaheadWorker

    return LookaheadWorker


def register_algorithm() -> LookaheadSpecAlgo:
    """Registers `LOOKAHEAD` with SGLang (once per process) and returns its spec object."""
    from sglang.srt.speculative.spec_registry import get_spec

    existing = get_spec(ALGORITHM_NAME)
    if existing is not None:
        if not isinstance(existing, LookaheadSpecAlgo):
            raise RuntimeError(
                f"speculative algorithm {ALGORITHM_NAME} is already registered by another "
                f"plugin ({existing!r}); uninstall it or set SGLANG_PLUGINS to choose one"
            )
        return existing
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME, supports_overlap=True, spec_class=LookaheadSpecAlgo
    )(_worker_factory)
    spec = get_spec(ALGORITHM_NAME)
    logger.info("lookahead: registered speculative algorithm %s (%r)", ALGORITHM_NAME, spec)
    return spec
