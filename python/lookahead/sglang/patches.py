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
        return exact_tree_sample(verify_input, batch, logits_output)
    return original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)


# name -> (target, AROUND hook)
PATCHES: dict[str, tuple[str, Callable[..., Any]]] = {
    "lora_compat": (LORA_TARGET, _lora_compat),
    "exact_sampling": (SAMPLE_TARGET, _exact_sampling),
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
