"""The plugin's patches to SGLang: few, named, registered through SGLang's `HookRegistry`.

- `lora_compat` (registered by `register()`): SGLang 0.5.23's
  `check_lora_speculative_compatibility` lets LoRA run with speculative decoding only for the
  literal name "NGRAM" (among a few draft-model algorithms). LOOKAHEAD verifies through
  NGRAM's path, whose uniform per-request verify width is what the LoRA segment layout
  needs, so LOOKAHEAD gets NGRAM's answer.
- `exact_sampling` (registered when a LOOKAHEAD worker is built, in the scheduler process,
  so the launcher never imports SGLang's GPU sampling modules): routes the sampling verify
  of LOOKAHEAD batches (`LookaheadVerifyInput`) to `lookahead.kernels.verify_sampling`.
  Every other call, NGRAM's and EAGLE's included, goes to SGLang's `eagle_sample` unchanged.
- `corpus_add`, `corpus_remove`, `corpus_list` (registered by `register()`, used in the
  launcher): SGLang 0.5.23's tokenizer manager serves `/add_external_corpus`,
  `/remove_external_corpus` and `/list_external_corpora` only where the algorithm is the
  literal "NGRAM" (its scheduler already routes them to any NGRAM-shaped worker, LOOKAHEAD's
  included). With LOOKAHEAD they run `lookahead.sglang.corpora`'s `serve_*` instead (the same
  steps: tokenize as NGRAM does, fan out to the schedulers, merge); otherwise SGLang's own.
  (Not a hook on `get_spec`: SGLang's hooks on a module function rewrite the function
  itself, so every module would see the change.)
- `corpus_note` (registered when a LOOKAHEAD worker is built): the reply to an added corpus
  says what SGLang's message cannot, that the corpus was cut at the capacity
  (`CorpusBook.note`).
- `request_control` (registered by `register()`, used in the tokenizer manager): a
  LOOKAHEAD server checks each request's `custom_params["lookahead"]` where SGLang checks its
  other sampling parameters (`SamplingParams.verify`), so a bad one fails that request alone
  with HTTP 400 (`lookahead.sglang.request_control`).
- `save_at_exit` (registered when a LOOKAHEAD worker is built): a scheduler that exits
  gracefully (`release_host_resources`, after SGLang drained the requests on SIGTERM) lets
  the worker save its trie first (`lookahead.sglang.warm`).

Each patch is registered at most once per process; a second request is refused (logged,
nothing registered), so nothing is ever wrapped twice.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["PATCHES", "applied_patches", "register_patch"]

logger = logging.getLogger(__name__)

LORA_TARGET = "sglang.srt.arg_groups.lora_hook.check_lora_speculative_compatibility"
SAMPLE_TARGET = "sglang.srt.speculative.ngram_worker.eagle_sample"
CORPUS_MIXIN = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
CORPUS_NOTE_TARGET = (
    "sglang.srt.speculative.external_corpus_manager.ExternalCorpusManager.check_pending_load"
)
VERIFY_PARAMS_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
EXIT_TARGET = "sglang.srt.managers.scheduler.Scheduler.release_host_resources"

_applied: set[str] = set()


def _lora_compat(original: Callable[..., Any], server_args: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.arg_groups.overrides import resolving_view

    from lookahead.sglang.config import ALGORITHM_NAME

    if resolving_view(server_args).speculative_algorithm == ALGORITHM_NAME:
        return None
    return original(server_args, *args, **kwargs)


def _exact_sampling(
    original: Callable[..., Any],
    verify_input: Any,
    batch: Any,
    logits_output: Any,
    grammar_mask: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    from lookahead.sglang.verify import LookaheadVerifyInput, exact_tree_sample, takes_exact_path

    if (
        isinstance(verify_input, LookaheadVerifyInput)
        and not args
        and takes_exact_path(verify_input, batch, grammar_mask, kwargs)
    ):
        return exact_tree_sample(verify_input, batch, logits_output, grammar_mask)
    return original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)


def _lookahead_serving() -> bool:
    from sglang.srt.runtime_context import get_spec

    from lookahead.sglang.config import ALGORITHM_NAME

    return get_spec().speculative_algorithm == ALGORITHM_NAME


def _endpoint(name: str) -> Callable[..., Any]:
    async def around(original: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any):
        if not _lookahead_serving():
            return await original(manager, *args, **kwargs)
        from lookahead.sglang import corpora

        return await getattr(corpora, name)(manager, *args, **kwargs)

    return around


def _corpus_note(original: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any) -> Any:
    pending, result = manager._pending_load, manager._load_result
    note_of = getattr(manager._worker, "corpus_note", None)
    if pending is not None and not pending[1].is_alive() and result is not None and note_of:
        note = note_of(result.corpus_id) if result.success else None
        if note:
            result.message += note
    return original(manager, *args, **kwargs)


def _request_control(original: Callable[..., Any], params: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(params, *args, **kwargs)
    if getattr(params, "custom_params", None) and _lookahead_serving():
        from lookahead.sglang.request_control import check_sampling_params

        check_sampling_params(params)
    return out


def _save_at_exit(original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    on_exit = getattr(getattr(scheduler, "draft_worker", None), "lookahead_exit", None)
    if on_exit is not None:
        try:
            on_exit()
        except Exception:  # the exit goes on: SGLang's own release must still run
            logger.exception("lookahead: saving at exit failed")
    return original(scheduler, *args, **kwargs)


# name -> (target, AROUND hook)
PATCHES: dict[str, tuple[str, Callable[..., Any]]] = {
    "lora_compat": (LORA_TARGET, _lora_compat),
    "exact_sampling": (SAMPLE_TARGET, _exact_sampling),
    "corpus_add": (f"{CORPUS_MIXIN}.add_external_corpus", _endpoint("serve_add")),
    "corpus_remove": (f"{CORPUS_MIXIN}.remove_external_corpus", _endpoint("serve_remove")),
    "corpus_list": (f"{CORPUS_MIXIN}.list_external_corpora", _endpoint("serve_list")),
    "corpus_note": (CORPUS_NOTE_TARGET, _corpus_note),
    "request_control": (VERIFY_PARAMS_TARGET, _request_control),
    "save_at_exit": (EXIT_TARGET, _save_at_exit),
}


def register_patch(name: str) -> bool:
    """Registers patch `name` with SGLang's `HookRegistry` (applied by its `apply_hooks()`,
    which `load_plugins()` calls). Returns False, registering nothing, if it already was."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if name not in PATCHES:
        raise KeyError(f"unknown lookahead patch {name!r}; known: {sorted(PATCHES)}")
    if name in _applied:
        logger.info("lookahead: patch %s already registered in this process; not again", name)
        return False
    target, hook = PATCHES[name]
    HookRegistry.register(target, hook, HookType.AROUND)
    _applied.add(name)
    logger.info("lookahead: registered patch %s (AROUND %s)", name, target)
    return True


def applied_patches() -> frozenset[str]:
    """Names of the patches registered in this process."""
    return frozenset(_applied)
