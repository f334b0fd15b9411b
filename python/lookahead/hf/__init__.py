"""The HF transformers engine: lookahead decoding for one causal LM (batch size 1).

One file per stage of a step, in the order a step runs them:

- `inputs`: a request's prompt, sampling settings and limits, checked before any forward
- `prefill`: the forward over the prompt
- `proposal`: the cache's draft tree, pruned and cut to what pays (`lookahead.costs`)
- `tree_inputs`: the tree's ids, positions and 4-D attention mask
- `acceptance`: greedy or exact-sampling verification, and what it teaches the calibration
- `kv`: the KV cache kept to the accepted path
- `stopping`: EOS, stop tokens, stop strings, `max_new_tokens`; streamed text
- `recycling`: the target's top predictions handed back to the cache (optional)
- `sampling`: the logits processors (temperature, top-k, top-p, repetition penalty)
- `stats`: what a request reports
- `generator`: `LookaheadGenerator`, the loop over them

Which device runs what: the forward runs on the model's device; the trie, the tree inputs
and the verification run on the host (the kernels' torch references: the tensors are host
tensors, on CUDA too), and only the forward's logits come back per step.
"""

from __future__ import annotations

# Imported on first use: `lookahead.hf.recycling` (the CLI's options) needs no torch.
_FROM = {
    "AUTO_MAX_NODES": "generator",
    "DEEP_ACCEPT": "generator",
    "DEFAULT_DEPTH": "generator",
    "FIXED_BUDGET": "generator",
    "LookaheadGenerator": "generator",
    "generate": "generator",
    "NO_CHAT_TEMPLATE": "inputs",
    "context_length": "inputs",
    "text_problem": "inputs",
    "GenerationResult": "stats",
    "GenerationStats": "stats",
}
__all__ = sorted(_FROM)
_STAGES = (
    "inputs",
    "prefill",
    "proposal",
    "tree_inputs",
    "acceptance",
    "kv",
    "stopping",
    "recycling",
    "sampling",
    "stats",
    "generator",
)


def __getattr__(name: str):
    import importlib

    if name in _FROM:
        return getattr(importlib.import_module(f"lookahead.hf.{_FROM[name]}"), name)
    if name in _STAGES:
        return importlib.import_module(f"lookahead.hf.{name}")
    raise AttributeError(f"module 'lookahead.hf' has no attribute {name!r}")
